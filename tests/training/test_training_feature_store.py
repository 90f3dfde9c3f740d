"""Pooled features on disk (ProbingTrainingArguments.feature_cache_dir, training.feature_store): a second
probe of the same encoder runs no encoder pass and trains / fits exactly as with its own pass; the key
follows the encoder's weights, the token ids and the labels (not the padding, not the batch size); a
damaged file is computed again; the logistic probe on cached features equals the streamed one; and the
settings that cannot use a store are refused before any work."""

from __future__ import annotations

import copy
import os

import numpy as np
import pytest
import torch
from _training_helpers import RowCounter, collator, probe_args, tiny_encoder, tiny_split, tiny_tokenizer

from hf_mlcl.data import MultiLabelCollator
from hf_mlcl.modeling import MLCLForMultiLabelClassification
from hf_mlcl.training import ProbingTrainer
from hf_mlcl.training.features import FeatureStore

N_TRAIN, N_EVAL, N_TEST = 24, 16, 8


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def data():
    return {"train": tiny_split(N_TRAIN), "eval": tiny_split(N_EVAL, 1), "test": tiny_split(N_TEST, 2)}


def _trainer(out, tok, data, probe="linear", store=None, weight_seed=0, head="linear", dropout=0.0, **kw):
    torch.manual_seed(weight_seed)
    enc = tiny_encoder(tok, dropout=0.1, seed=weight_seed)
    torch.manual_seed(1)
    extra = {"chunk_size": 16} if head == "label_attention" else {}
    clf = MLCLForMultiLabelClassification.from_encoder(
        enc, num_labels=4, freeze_encoder=True, head=head, classifier_dropout=dropout, **extra
    )
    counter = RowCounter(clf.backbone)
    args = dict(
        probe=probe,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        max_steps=-1,
        num_train_epochs=2,
        eval_strategy="epoch",
        feature_cache_dir=None if store is None else str(store),
    )
    args.update(kw)
    tr = ProbingTrainer(
        model=clf,
        args=probe_args(out, **args),
        train_dataset=data["train"],
        eval_dataset=data["eval"],
        data_collator=collator(tok),
    )
    return tr, counter


def _head(tr) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.model.classifier.state_dict().items()}


def _files(folder) -> list[str]:
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def test_a_second_probe_of_the_same_encoder_runs_no_encoder_pass(tmp_path, tok, data):
    store = tmp_path / "features"
    # ABALONE's logistic probe first: it encodes train, validation and test once and saves each split
    logistic, rows = _trainer(tmp_path / "logistic", tok, data, probe="logistic", store=store)
    logistic.fit_logistic(data["eval"])
    logistic.predict_scores(data["test"])
    assert rows.rows == N_TRAIN + N_EVAL + N_TEST
    assert len(_files(store)) == 3 and all(f.endswith(".safetensors") for f in _files(store))
    assert logistic.feature_sources == {"train": "encoded", "validation": "encoded", "test": "encoded"}

    # then the SD paper's linear probe on the same encoder: every split comes from the store
    # (classifier dropout on: computing the keys must not move the random streams the masks come from)
    linear, rows = _trainer(tmp_path / "linear", tok, data, store=store, dropout=0.2)
    linear.train()
    scores, _ = linear.predict_scores(data["test"])
    assert rows.rows == 0
    assert len(_files(store)) == 3
    assert set(linear.feature_sources.values()) == {"loaded"}

    # ... and trains exactly the head a run with its own encoder pass trains
    fresh, rows = _trainer(tmp_path / "fresh", tok, data, dropout=0.2)
    fresh.train()
    fresh_scores, _ = fresh.predict_scores(data["test"])
    assert rows.rows == N_TRAIN + N_EVAL + N_TEST
    for k, v in _head(fresh).items():
        assert torch.equal(_head(linear)[k], v), k
    np.testing.assert_array_equal(scores, fresh_scores)
    assert linear.state.global_step == fresh.state.global_step == 2 * N_TRAIN // 4


def test_another_encoder_misses_and_adds_its_own_files(tmp_path, tok, data):
    store = tmp_path / "features"
    first, rows = _trainer(tmp_path / "a", tok, data, store=store)
    first.train()
    assert rows.rows == N_TRAIN + N_EVAL and len(_files(store)) == 2
    other, rows = _trainer(tmp_path / "b", tok, data, store=store, weight_seed=5)
    other.train()
    assert rows.rows == N_TRAIN + N_EVAL  # different weights: encoded again, nothing reused
    assert len(_files(store)) == 4


def _key(tok, dataset, encoder=None, batch_size=8, **collator_kw):
    encoder = encoder if encoder is not None else tiny_encoder(tok, seed=0).backbone
    coll = MultiLabelCollator(tok, 4, **{"max_length": 32, **collator_kw})
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=coll)

    def pairs(batch):
        return (
            batch["labels"].to_dense().nonzero() if batch["labels"].is_sparse else batch["labels"].nonzero()
        )

    return FeatureStore.key(FeatureStore.encoder_digest(encoder), loader, {"pooling": "mean"}, pairs)


def test_the_key_follows_weights_tokens_and_labels_not_padding(tok, data):
    split = data["eval"]
    base, rows = _key(tok, split)
    assert rows == N_EVAL and len(base) == 64
    # the same rows padded differently, in other batch sizes: the encoder sees the same tokens
    assert _key(tok, split, batch_size=3)[0] == base
    assert _key(tok, split, pad_to_multiple_of=16)[0] == base
    # what changes the features (or the labels stored with them) changes the key
    changed = tiny_encoder(tok, seed=0).backbone
    with torch.no_grad():
        changed.embeddings.word_embeddings.weight[3, 0] += 1e-3
    assert _key(tok, split, encoder=changed)[0] != base
    assert _key(tok, split, max_length=6)[0] != base  # truncation: other token ids
    relabelled = split.map(lambda row: {"labels": [(row["labels"][0] + 1) % 4]})
    assert _key(tok, relabelled)[0] != base
    assert _key(tok, split.select(range(N_EVAL - 1)))[0] != base
    digest = FeatureStore.encoder_digest(tiny_encoder(tok, seed=0).backbone)
    assert (
        FeatureStore.key(digest, [], {"pooling": "cls"}, None)[0]
        != FeatureStore.key(digest, [], {"pooling": "mean"}, None)[0]
    )
    # the same weight names and values under another architecture or config: another encoder
    same = tiny_encoder(tok, seed=0).backbone
    assert FeatureStore.encoder_digest(same) == digest
    same.config.layer_norm_eps = 1e-3
    assert FeatureStore.encoder_digest(same) != digest
    # left padding moves the position ids: the rows' starts are part of the key
    tok_left = copy.deepcopy(tok)
    tok_left.padding_side = "left"
    assert _key(tok_left, split)[0] != base


def test_a_damaged_file_is_encoded_again_and_replaced(tmp_path, tok, data, caplog):
    store = tmp_path / "features"
    first, _ = _trainer(tmp_path / "a", tok, data, store=store)
    first.train()
    train_file = next(str(store / f) for f in _files(store))
    with open(train_file, "wb") as fh:
        fh.write(b"not a safetensors file")
    second, rows = _trainer(tmp_path / "b", tok, data, store=store)
    with caplog.at_level("WARNING", logger="hf_mlcl.training.features"):
        second.train()
    assert "cannot read" in caplog.text and os.path.basename(train_file) in caplog.text
    assert rows.rows in (N_TRAIN, N_EVAL)  # only the damaged split ran through the encoder
    assert len(_files(store)) == 2  # written back under its key, no temporary file left behind
    third, rows = _trainer(tmp_path / "c", tok, data, store=store)
    third.train()
    assert rows.rows == 0


def test_logistic_probe_on_cached_features_equals_the_streamed_one(tmp_path, tok, data):
    fits = {}
    for cache in (None, False):
        tr, rows = _trainer(tmp_path / str(cache), tok, data, probe="logistic", cache_features=cache)
        assert tr.cache_features is (cache is None)
        tr.fit_logistic(data["eval"])
        fits[cache] = (
            _head(tr),
            tr.logistic_validation_scores[0],
            tr.predict_scores(data["test"])[0],
            rows.rows,
        )
    (h_c, val_c, test_c, rows_c), (h_s, val_s, test_s, rows_s) = fits[None], fits[False]
    for k in h_c:
        assert torch.equal(h_c[k], h_s[k]), k
    np.testing.assert_array_equal(val_c, val_s)
    np.testing.assert_allclose(test_c, test_s, rtol=1e-6, atol=1e-7)
    assert rows_c == rows_s == N_TRAIN + N_EVAL + N_TEST


def test_settings_that_cannot_use_a_store_are_refused(tmp_path, tok, data):
    with pytest.raises(ValueError, match="probe='finetune' trains the encoder"):
        probe_args(tmp_path, probe="finetune", feature_cache_dir=str(tmp_path / "f"))
    with pytest.raises(ValueError, match="cache_features=False turns them off"):
        probe_args(tmp_path, probe="linear", cache_features=False, feature_cache_dir=str(tmp_path / "f"))
    with pytest.raises(ValueError, match="feature_cache_dir cannot apply here: head='label_attention'"):
        _trainer(tmp_path / "la", tok, data, store=tmp_path / "f", head="label_attention")
    (tmp_path / "a_file").write_text("user data")
    with pytest.raises(ValueError, match="is a file, not a folder"):
        _trainer(tmp_path / "x", tok, data, store=tmp_path / "a_file")
    with pytest.raises(ValueError, match="cannot be created"):
        _trainer(tmp_path / "y", tok, data, store=tmp_path / "a_file" / "sub")
    assert (tmp_path / "a_file").read_text() == "user data"
    # drop_last would cut the last rows of every encoding pass
    with pytest.raises(ValueError, match="dataloader_drop_last"):
        _trainer(tmp_path / "z", tok, data, store=tmp_path / "f", dataloader_drop_last=True)


def test_a_file_that_cannot_be_written_is_skipped_with_a_warning(tmp_path, tok, data, caplog, monkeypatch):
    import safetensors.torch

    def full_disk(tensors, filename, metadata=None):
        with open(filename, "wb") as fh:
            fh.write(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    store = tmp_path / "features"
    tr, rows = _trainer(tmp_path / "a", tok, data, store=store)
    with caplog.at_level("WARNING", logger="hf_mlcl.training.features"):
        tr.train()  # the run goes on with its features in memory
    assert caplog.text.count("No space left on device") == 2 and rows.rows == N_TRAIN + N_EVAL
    assert os.listdir(store) == []  # no temporary file left behind


def test_prediction_passes_record_the_split_they_read(tmp_path, tok, data):
    """predict_evaluation of validation then test: each split's features are recorded under its own name (the
    validation pass was recorded as "test", and the test pass then overwrote it)."""
    tr, _ = _trainer(tmp_path / "linear", tok, data)
    tr.predict_evaluation(data["eval"], "validation")
    tr.predict_evaluation(data["test"])
    assert {"validation", "test"} <= set(tr.feature_sources)
