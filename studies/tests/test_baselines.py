"""The study's baselines (studies/baseline_tfidf.py, studies/baseline_setfit.py): choices on validation only,
the protocol's threshold and test scoring, SetFit's multi-label pair rule, and the cells' metrics.json."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import sys

import numpy as np
import pytest

STUDIES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, STUDIES)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(STUDIES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


WORDS = {0: ["grain", "wheat", "corn"], 1: ["oil", "crude", "barrel"], 2: ["gold", "silver", "mine"]}
FILLER = "the a market price said week company shares year report".split()


def _split(n: int, rng: random.Random) -> dict:
    """Texts whose words name their labels (one or two of three), with filler words."""
    texts, labels = [], []
    for _ in range(n):
        labs = sorted(rng.sample(range(3), rng.choice([1, 1, 2])))
        words = [rng.choice(WORDS[label]) for label in labs for _ in range(2)] + rng.sample(FILLER, 4)
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(labs)
    return {"text": texts, "labels": labels}


@pytest.fixture()
def tiny_study(monkeypatch, tmp_path):
    """cell_io.study_data returns three small splits; results go to tmp_path."""
    from datasets import Dataset, DatasetDict

    cell_io = _module("cell_io")
    rng = random.Random(0)
    ds = DatasetDict(
        {s: Dataset.from_dict(_split(n, rng)) for s, n in (("train", 120), ("validation", 40), ("test", 40))}
    )
    data_args = type("D", (), {"data_dir": "tiny", "max_length": 32})()

    def study_data(study, overrides=None):
        return ds, ["grain", "oil", "gold"], data_args

    monkeypatch.setattr(cell_io, "study_data", study_data)
    monkeypatch.setattr(cell_io.paths, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(cell_io.paths, "RUNS", str(tmp_path / "runs"))
    monkeypatch.setitem(sys.modules, "cell_io", cell_io)  # the baselines import this patched module
    return cell_io, ds


def test_scored_metrics_tunes_the_threshold_on_validation_and_scores_test_with_it():
    cell_io = _module("cell_io")
    val_true = np.array([[1, 0], [0, 1], [1, 1], [0, 0]], dtype=bool)
    val = np.array([[0.8, 0.1], [0.2, 0.7], [0.75, 0.72], [0.3, 0.2]])
    test_true = np.array([[1, 0], [0, 1]], dtype=bool)
    test = np.array([[0.65, 0.1], [0.1, 0.65]])  # above 0.5 but below the validation threshold
    m = cell_io.scored_metrics(val_true, val, test_true, test)
    assert 0.3 < m["threshold"] <= 0.7 and m["validation_micro_f1"] == 1.0
    m_low = cell_io.scored_metrics(val_true, val, test_true, test * 1.2)
    assert m_low["threshold"] == m["threshold"]  # test scores never move the threshold
    assert m["test_micro_f1"] == (1.0 if m["threshold"] <= 0.65 else 0.0)
    assert {"test_macro_f1", "test_p@1", "validation_macro_f1"} <= set(m)


def test_tfidf_chooses_c_on_validation_and_writes_the_cell(tiny_study):
    cell_io, ds = tiny_study
    tfidf = _module("baseline_tfidf")
    for model in ("logreg", "svm"):
        result = tfidf.run_cell("reuters21578", model, 1, ["--data_dir", "tiny"])
        m = result["metrics"]
        # word features name the labels: a linear model separates them
        assert m["test_macro_f1"] > 0.9 and m["test_p@1"] > 0.9, (model, m)
        by_c = result["baseline"]["validation_macro_f1_by_c"]
        assert result["baseline"]["c"] == min(float(c) for c, v in by_c.items() if v == max(by_c.values()))
        saved = json.loads(
            open(os.path.join(cell_io.cell_dir("reuters21578", f"tfidf_{model}", 1), "metrics.json")).read()
        )
        assert (saved["loss"], saved["probe"], saved["seed"]) == ("tfidf", model, 1) and saved["wall_s"][
            "probe_s"
        ] >= 0
        assert saved["process_cpu_s"] > 0
        per_label = json.loads(
            open(
                os.path.join(cell_io.cell_dir("reuters21578", f"tfidf_{model}", 1), "per_label_f1.json")
            ).read()
        )
        assert per_label["label_names"] == ["grain", "oil", "gold"] and min(per_label["test_f1"]) > 0.8
        assert sum(per_label["train_count"]) == sum(
            len(x) for x in ds["train"]["labels"]
        )  # the tail plot's x axis
    assert tfidf.run_cell("reuters21578", "svm", 1, []) == {}  # a finished cell is skipped


def test_tfidf_choice_of_c_never_reads_test():
    tfidf = _module("baseline_tfidf")
    from sklearn.feature_extraction.text import TfidfVectorizer

    rng = random.Random(1)
    train, val = _split(80, rng), _split(30, rng)
    cell_io = _module("cell_io")
    vec = TfidfVectorizer(**tfidf.VECTORIZER)
    x_train, x_val = vec.fit_transform(train["text"]), vec.transform(val["text"])
    y_train, y_val = cell_io.multi_hot(train["labels"], 3), cell_io.multi_hot(val["labels"], 3)
    c, clf, by_c, fit_s = tfidf.choose_c(
        "svm", 1, x_train, y_train, x_val, y_val, start=(0.01, 1.0), limits=(1e-3, 10.0)
    )
    assert {"0.01", "1.0"} <= set(by_c) and str(c) in by_c and fit_s > 0
    assert (
        by_c[str(c)] == max(by_c.values())
        and tfidf.next_c({float(k): v for k, v in by_c.items()}, (1e-3, 10.0)) is None
    )
    scores = tfidf.label_scores(clf, x_val)
    assert scores.shape == (30, 3) and np.all((scores > 0) & (scores < 1))  # margins through a sigmoid
    # the logistic model's primal solver draws no random numbers: another seed gives the same scores
    lr = [
        tfidf.label_scores(tfidf.classifier("logreg", 1.0, seed).fit(x_train, y_train), x_val)
        for seed in (1, 2)
    ]
    assert np.allclose(
        *lr, rtol=0, atol=1e-12
    )  # (a liblinear fit can differ in its last bit after another one)
    again = tfidf.classifier("svm", c, 1).fit(x_train, y_train)  # the SVM's order of texts: fixed by the seed
    assert np.allclose(tfidf.label_scores(again, x_val), scores, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="--model must be one of logreg, svm"):
        tfidf.classifier("knn", 1.0, 1)


def test_the_c_grid_grows_past_a_best_edge_until_the_best_is_inside():
    tfidf = _module("baseline_tfidf")
    assert tfidf.next_c({1.0: 0.2, 10.0: 0.3, 100.0: 0.4}) == 1000.0
    assert tfidf.next_c({1.0: 0.5, 10.0: 0.3, 100.0: 0.1}) == 0.1
    assert tfidf.next_c({1.0: 0.2, 10.0: 0.5, 100.0: 0.4}) is None
    assert tfidf.next_c({1.0: 0.2, 10.0: 0.3}, limits=(0.1, 10.0)) is None  # at the limit
    assert tfidf.next_c({1.0: 0.3, 10.0: 0.3, 100.0: 0.1}) == 0.1  # a tie goes to the smaller C


def test_any_overlap_pairs_follow_setfits_multilabel_rule():
    setfit = _module("baseline_setfit")
    rng = np.random.default_rng(0)
    labels = rng.random((50, 6)) < 0.2
    labels[np.arange(50), rng.integers(6, size=50)] = True  # every text has a label
    i, j, target = setfit.any_overlap_pairs(labels, 101, np.random.default_rng(1))
    assert len(i) == len(j) == len(target) == 101 and np.all(i != j)
    assert np.array_equal(target, (labels[i] & labels[j]).any(axis=1).astype(float))  # shared label <=> 1.0
    assert target.sum() == 50 and np.array_equal(target[:100:2], np.ones(50)) and target[1::2].sum() == 0
    again = setfit.any_overlap_pairs(labels, 101, np.random.default_rng(1))
    assert all(np.array_equal(a, b) for a, b in zip((i, j, target), again))  # the seed fixes the pairs
    single = np.eye(4, dtype=bool)  # no two texts share a label: no positive pair exists
    with pytest.raises(ValueError, match="too few pairs of one kind"):
        setfit.any_overlap_pairs(single, 4, np.random.default_rng(0), chunk=64, max_draws=640)


def test_setfit_cell_trains_the_pairs_then_the_head(tiny_study, tmp_path, bert_tiny_st):
    cell_io, _ = tiny_study
    setfit = _module("baseline_setfit")
    result = setfit.run_cell("goemotions_full", 1, [], model_path=bert_tiny_st, steps=3)
    assert result["baseline"]["pairs"] == 3 * setfit.PAIRS_PER_STEP and result["baseline"]["setfit"]
    m = result["metrics"]
    assert 0.0 <= m["test_macro_f1"] <= 1.0 and 0.01 <= m["threshold"] <= 0.99
    # seconds to 0.1 s: the tiny head's fit can take less than that on a quiet machine
    assert result["wall_s"]["stage1_s"] > 0 and result["wall_s"]["probe_s"] >= 0
    assert os.path.isfile(
        os.path.join(cell_io.cell_dir("goemotions_full", "setfit_logistic", 1), "metrics.json")
    )


@pytest.fixture()
def bert_tiny_st(tmp_path):
    """A tiny sentence-transformers model folder (BERT from a config, a tokenizer trained on the fly)."""
    from sentence_transformers import SentenceTransformer, models
    from transformers import BertConfig, BertModel

    from hf_mlcl.data.tokenizer import train_tokenizer

    rng = random.Random(0)
    tok = train_tokenizer(_split(200, rng)["text"], vocab_size=120, style="bert")
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
    )
    hf = tmp_path / "bert"
    BertModel(cfg).save_pretrained(hf)
    tok.save_pretrained(hf)
    word = models.Transformer(str(hf), max_seq_length=32)
    st = SentenceTransformer(modules=[word, models.Pooling(word.get_word_embedding_dimension(), "mean")])
    st.save(str(tmp_path / "st"))
    return str(tmp_path / "st")


def test_epoch_test_scores_validation_and_test_after_each_epoch(tmp_path):
    """epoch_scores.EpochTestCallback: every epoch end appends the protocol's numbers for the current model,
    leaves the model in training mode, and a redone epoch replaces its record."""
    from types import SimpleNamespace

    import torch
    from datasets import Dataset

    from hf_mlcl.data.tokenizer import train_tokenizer

    epoch_scores = _module("epoch_scores")
    rng = random.Random(0)
    val, test = Dataset.from_dict(_split(30, rng)), Dataset.from_dict(_split(20, rng))
    tok = train_tokenizer(list(val["text"]) + list(test["text"]), vocab_size=80, style="bert")

    class Constant(torch.nn.Module):  # ranks label 0 first for every text, whatever the input
        def __init__(self):
            super().__init__()
            self.bias = torch.nn.Parameter(torch.tensor([2.0, -2.0, 0.0]))

        def forward(self, input_ids=None, attention_mask=None, **kw):
            return SimpleNamespace(logits=self.bias.expand(input_ids.shape[0], 3))

    model = Constant().train()
    path = tmp_path / "epoch_test.jsonl"
    cb = epoch_scores.EpochTestCallback(val, test, 3, 32, str(path), batch_size=7)
    for epoch in (1.0, 2.0, 2.0):
        cb.on_epoch_end(
            None,
            SimpleNamespace(epoch=epoch, global_step=int(epoch * 10), is_world_process_zero=True),
            None,
            model=model,
            processing_class=tok,
        )
    assert model.training
    records = epoch_scores.read_epoch_tests(str(path))
    assert [r["epoch"] for r in records] == [1.0, 2.0] and len(path.read_text().splitlines()) == 3
    has_label0 = np.mean([0 in labels for labels in test["labels"]])
    assert records[0]["test_p@1"] == pytest.approx(has_label0)  # sigmoid of the logits, ranked per text
    assert set(epoch_scores.KEYS) <= set(records[0])
