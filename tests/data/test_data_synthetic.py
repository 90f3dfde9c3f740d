"""Synthetic corpus: determinism, Zipf-like label prior, co-occurrence structure, learnability."""

from __future__ import annotations

import numpy as np
import pytest

from hf_mlcl.data import (
    SyntheticCorpusGenerator,
    label_names,
    load_mlc_dataset,
    make_synthetic_corpus,
    train_frequency,
)


def test_determinism_and_schema():
    a = make_synthetic_corpus(num_labels=12, num_train=50, num_validation=10, num_test=10, seed=7)
    b = make_synthetic_corpus(num_labels=12, num_train=50, num_validation=10, num_test=10, seed=7)
    c = make_synthetic_corpus(num_labels=12, num_train=50, num_validation=10, num_test=10, seed=8)
    for s in ("train", "validation", "test"):
        assert a[s]["text"] == b[s]["text"] and a[s]["labels"] == b[s]["labels"]
    assert a["train"]["text"] != c["train"]["text"]
    assert a["train"]["text"] != a["test"]["text"][:10] + a["train"]["text"][10:]
    assert label_names(a) == [f"label_{i:02d}" for i in range(12)]
    via_registry = load_mlc_dataset(
        "synthetic", num_labels=12, num_train=50, num_validation=10, num_test=10, seed=7
    )
    assert via_registry["train"]["text"] == a["train"]["text"]
    assert list(load_mlc_dataset("synthetic", splits=["test"], num_test=5)) == ["test"]


def test_lengths_label_counts_and_validation():
    dd = make_synthetic_corpus(
        num_labels=30, num_train=300, min_words=5, max_words=9, mean_labels=3.0, seed=1
    )
    lengths = np.array([len(t.split()) for t in dd["train"]["text"]])
    assert lengths.min() >= 5 and lengths.max() <= 9
    nlab = np.array([len(y) for y in dd["train"]["labels"]])
    assert nlab.min() >= 1 and 2.5 < nlab.mean() < 3.5
    assert all(len(set(y)) == len(y) and y == sorted(y) for y in dd["train"]["labels"])
    with pytest.raises(ValueError, match="min_words"):
        make_synthetic_corpus(min_words=10, max_words=5)
    with pytest.raises(ValueError, match="num_labels"):
        make_synthetic_corpus(num_labels=0)


def test_label_frequency_is_zipf_like():
    gen = SyntheticCorpusGenerator(num_labels=100, mean_labels=1.0, seed=0)
    label_flat, _, _, _ = gen.generate_ids(20000, np.random.default_rng(0))
    freq = np.sort(np.bincount(label_flat, minlength=100))[::-1]
    ranks = np.arange(1, 101)
    slope = np.polyfit(np.log(ranks[:50]), np.log(freq[:50]), 1)[0]
    assert -1.2 < slope < -0.8  # p ~ rank^-1
    assert freq[0] > 20 * freq[49]
    # the generator's prior itself is exactly Zipf with the requested exponent
    prior = np.sort(SyntheticCorpusGenerator(num_labels=50, zipf_exponent=1.5).label_prior)[::-1]
    np.testing.assert_allclose(prior[0] / prior[9], 10**1.5, rtol=1e-9)


def test_cooccurrence_within_groups():
    gen = SyntheticCorpusGenerator(num_labels=40, num_groups=8, mean_labels=3.0, cooccurrence=0.9, seed=2)
    label_flat, ptr, _, _ = gen.generate_ids(3000, np.random.default_rng(1))
    doc = np.repeat(np.arange(3000), np.diff(ptr))
    y = np.zeros((3000, 40))
    y[doc, label_flat] = 1
    co = y.T @ y
    np.fill_diagonal(co, 0)
    same = gen.group[:, None] == gen.group[None, :]
    np.fill_diagonal(same, False)
    # pairs inside a topic co-occur far more often than pairs across topics
    assert co[same].mean() > 5 * co[~same & ~np.eye(40, dtype=bool)].mean()


def test_linear_probe_good_vs_random_representation():
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import f1_score
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.preprocessing import MultiLabelBinarizer

    dd = make_synthetic_corpus(seed=1)
    mlb = MultiLabelBinarizer(classes=range(20))
    y_tr, y_te = mlb.fit_transform(dd["train"]["labels"]), mlb.transform(dd["test"]["labels"])
    vec = TfidfVectorizer()
    x_tr, x_te = vec.fit_transform(dd["train"]["text"]), vec.transform(dd["test"]["text"])
    probe = OneVsRestClassifier(LogisticRegression(C=10, max_iter=1000))
    good = f1_score(y_te, probe.fit(x_tr, y_tr).predict(x_te), average="micro")
    rng = np.random.default_rng(0)
    r_tr, r_te = rng.normal(size=(len(y_tr), 64)), rng.normal(size=(len(y_te), 64))
    bad = f1_score(y_te, probe.fit(r_tr, y_tr).predict(r_te), average="micro")
    assert good > 0.8, good
    assert bad < 0.3, bad


def test_long_documents_fast_and_sparse_labels():
    import time

    gen = SyntheticCorpusGenerator(
        num_labels=25230, min_words=1000, max_words=2000, mean_labels=16.0, words_per_label=4, seed=0
    )
    t0 = time.perf_counter()
    texts, labels = gen.generate(200, np.random.default_rng(0))
    assert time.perf_counter() - t0 < 5.0
    assert 1000 <= min(len(t.split()) for t in texts) and max(len(t.split()) for t in texts) <= 2000
    assert 13 < np.mean([len(y) for y in labels]) < 19
    from hf_mlcl.data.registry import build_split

    ds = build_split(texts, labels, gen.label_names)
    assert train_frequency(ds).sum() == sum(len(y) for y in labels)


def test_train_frequency_counts_only_the_selected_rows():
    """select()/shuffle() keep the whole table plus an indices mapping; counts must follow the mapping."""
    ds = make_synthetic_corpus(num_labels=6, num_train=50, num_validation=5, num_test=5, seed=0)["train"]
    for sub in (ds.select([3, 10, 20, 40]), ds.shuffle(seed=1).select(range(7)), ds.select(range(5))):
        expected = np.zeros(6, dtype=np.int64)
        for ids in sub["labels"]:
            expected[ids] += 1
        assert np.array_equal(train_frequency(sub, 6), expected)
    assert train_frequency(ds.select([]), 6).tolist() == [0] * 6


def test_arrow_text_assembly_matches_word_join():
    gen = SyntheticCorpusGenerator(num_labels=15, min_words=1, max_words=12, seed=5)
    table = gen.generate_arrow(50, np.random.default_rng(3))
    label_flat, label_ptr, words, word_ptr = gen.generate_ids(50, np.random.default_rng(3))
    expected = [" ".join(gen.vocab[words[word_ptr[i] : word_ptr[i + 1]]]) for i in range(50)]
    assert table.column("text").to_pylist() == expected
    assert table.column("labels").to_pylist() == [
        sorted(label_flat[label_ptr[i] : label_ptr[i + 1]].tolist()) for i in range(50)
    ]
    shards = list(gen.iter_tables("train", 25, shard_size=10))
    assert [len(t) for t in shards] == [10, 10, 5]
