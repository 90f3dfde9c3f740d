"""The cached linear probe (ProbingTrainer, cache_features) against the text path: the same head after
training (classifier dropout, gradient accumulation, early stopping + best model), the same evaluation
metrics and scores, one encoder pass per dataset, resume from a checkpoint, and the label-attention
head (falls back by default, an error when caching is asked for explicitly)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from _training_helpers import RowCounter, collator, probe_args, tiny_encoder, tiny_split, tiny_tokenizer
from transformers import EarlyStoppingCallback

from hf_mlcl.data import MultiLabelCollator
from hf_mlcl.modeling import MLCLForMultiLabelClassification
from hf_mlcl.training import ProbingTrainer, ProbingTrainingArguments

N_TRAIN, N_EVAL = 24, 16


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def data():
    return {"train": tiny_split(N_TRAIN), "eval": tiny_split(N_EVAL, 1), "test": tiny_split(8, 2)}


def _classifier(tok, head: str = "linear", dropout: float = 0.0) -> MLCLForMultiLabelClassification:
    # backbone dropout 0.1: the frozen encoder must run in eval mode in both paths, or they differ
    enc = tiny_encoder(tok, dropout=0.1, seed=0)
    torch.manual_seed(1)
    extra = {"chunk_size": 16} if head == "label_attention" else {}
    return MLCLForMultiLabelClassification.from_encoder(
        enc, num_labels=4, freeze_encoder=True, head=head, classifier_dropout=dropout, **extra
    )


def _trainer(tmp_path, tok, data, cache, head="linear", dropout=0.0, callbacks=None, **kw):
    clf = _classifier(tok, head, dropout)
    counter = RowCounter(clf.backbone)
    coll = (
        MultiLabelCollator(tok, 4, max_length=32, pad_to_multiple_of=16)
        if head == "label_attention"
        else collator(tok)
    )
    defaults = dict(
        probe="linear",
        cache_features=cache,
        per_device_train_batch_size=4,
        learning_rate=5e-2,
        max_steps=-1,
        num_train_epochs=3,
        eval_strategy="epoch",
    )
    defaults.update(kw)
    tr = ProbingTrainer(
        model=clf,
        args=probe_args(tmp_path, **defaults),
        train_dataset=data["train"],
        eval_dataset=data["eval"],
        data_collator=coll,
        callbacks=callbacks,
    )
    return tr, counter


def _head(tr) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in tr.model.classifier.state_dict().items()}


def _evals(tr) -> list[dict]:
    return [h for h in tr.state.log_history if "eval_loss" in h]


CONFIGS = {
    # classifier dropout draws a mask per micro-batch; 2 micro-batches per optimizer step; evaluations
    # between steps (each iterates a DataLoader, which draws a seed from the global generator)
    "dropout_accumulation": dict(
        dropout=0.3, gradient_accumulation_steps=2, eval_strategy="steps", eval_steps=2
    ),
    # the best checkpoint (by eval_loss) is reloaded at the end; training may stop early
    "early_stopping_best": dict(
        dropout=0.2,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="steps",
        save_steps=2,
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        num_train_epochs=6,
        learning_rate=0.3,
        early_stopping=1,
    ),
}


@pytest.fixture(scope="module")
def pairs(tmp_path_factory, tok, data):
    """``pairs(name)``: {cache: (trainer, row counter, initial head)} of CONFIGS[name], trained once per module."""
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            root = tmp_path_factory.mktemp(name)
            done[name] = {}
            for cache in (True, False):
                kw = dict(CONFIGS[name])
                patience = kw.pop("early_stopping", None)
                cbs = [EarlyStoppingCallback(early_stopping_patience=patience)] if patience else None
                tr, counter = _trainer(root / f"cache-{cache}", tok, data, cache, callbacks=cbs, **kw)
                assert tr.cache_features is cache
                init = _head(tr)
                tr.train()
                done[name][cache] = (tr, counter, init)
        return done[name]

    return get


@pytest.mark.parametrize("name", list(CONFIGS))
def test_cached_probe_trains_the_same_head_as_the_text_path(pairs, name):
    runs = pairs(name)
    (cached, c_rows, c_init), (texts, t_rows, t_init) = runs[True], runs[False]
    assert all(torch.equal(c_init[k], t_init[k]) for k in c_init)
    head_c, head_t = _head(cached), _head(texts)
    assert any(not torch.allclose(head_c[k], c_init[k], atol=1e-3) for k in head_c)  # the head did train
    for k in head_c:
        torch.testing.assert_close(head_c[k], head_t[k], rtol=1e-5, atol=1e-6)
    assert cached.state.global_step == texts.state.global_step
    assert c_rows.training_calls == t_rows.training_calls == 0  # the frozen encoder never ran with dropout
    losses = [[h["loss"] for h in tr.state.log_history if "loss" in h] for tr in (cached, texts)]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)
    if name == "early_stopping_best":
        assert texts.state.best_model_checkpoint is not None
        assert os.path.basename(cached.state.best_model_checkpoint) == os.path.basename(
            texts.state.best_model_checkpoint
        )
        assert texts.state.global_step < 6 * N_TRAIN // 4  # stopped early, so the callback was exercised


def test_cached_evaluation_and_scores_equal_the_text_path(pairs, data):
    runs = pairs("dropout_accumulation")
    cached, texts = runs[True][0], runs[False][0]
    ev_c, ev_t = _evals(cached), _evals(texts)
    assert len(ev_c) == len(ev_t) >= 3
    for a, b in zip(ev_c, ev_t):
        for key in ("eval_loss", "eval_micro_f1", "eval_macro_f1", "eval_p@1"):
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
    # the post-training protocol of train_probe: scores on validation and test, tuned threshold
    for split in ("eval", "test"):
        sc, truth_c = cached.predict_scores(data[split])
        st, truth_t = texts.predict_scores(data[split])
        np.testing.assert_allclose(sc, st, rtol=1e-5, atol=1e-6)
        assert np.array_equal(truth_c, truth_t) and sc.shape == (len(data[split]), 4)
    assert cached.tune_threshold(sc, truth_c) == pytest.approx(texts.tune_threshold(st, truth_t))
    m_c, m_t = cached.evaluate(), texts.evaluate()
    assert m_c["eval_micro_f1"] == pytest.approx(m_t["eval_micro_f1"]) and m_c["eval_loss"] == pytest.approx(
        m_t["eval_loss"], rel=1e-5
    )


def test_encoder_runs_once_per_dataset_with_cached_features(tmp_path, tok, data):
    cached, c_rows = _trainer(tmp_path / "c", tok, data, cache=None)  # None (default): cache where possible
    cached.train()  # 3 epochs, an evaluation after each
    assert len(_evals(cached)) == 3
    assert c_rows.rows == N_TRAIN + N_EVAL
    cached.predict_scores(data["eval"])  # the same dataset object: no new encoding
    cached.evaluate()
    assert c_rows.rows == N_TRAIN + N_EVAL
    cached.predict_scores(data["test"])  # a new dataset: encoded once
    cached.predict_scores(data["test"])
    assert c_rows.rows == N_TRAIN + N_EVAL + len(data["test"])
    texts, t_rows = _trainer(tmp_path / "t", tok, data, cache=False)
    texts.train()
    assert t_rows.rows == 3 * N_TRAIN + 3 * N_EVAL  # the count the cache saves


def test_resume_from_checkpoint_with_cached_features(tmp_path, tok, data):
    kw = dict(dropout=0.2, num_train_epochs=2, save_strategy="steps", save_steps=4)  # 6 steps per epoch
    full, _ = _trainer(tmp_path / "full", tok, data, cache=True, **kw)
    full.train()
    ckpt = tmp_path / "full" / "checkpoint-4"
    assert ckpt.is_dir() and full.state.global_step == 12
    # features are never written to checkpoints
    assert not any("feature" in name for name in os.listdir(ckpt))
    resumed, rows = _trainer(tmp_path / "resumed", tok, data, cache=True, **kw)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert rows.rows == N_TRAIN + N_EVAL  # computed again in the resumed process
    assert resumed.state.global_step == 12
    for k, v in _head(full).items():
        torch.testing.assert_close(_head(resumed)[k], v, rtol=1e-5, atol=1e-6)
    # the saved model is the whole classifier (encoder + trained head), scored from texts as before
    resumed.save_model(str(tmp_path / "saved"))
    loaded = MLCLForMultiLabelClassification.from_pretrained(str(tmp_path / "saved")).eval()
    batch = collator(tok)([data["test"][i] for i in range(len(data["test"]))])
    with torch.no_grad():
        logits = loaded(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    scores, _ = resumed.predict_scores(data["test"])
    np.testing.assert_allclose(torch.sigmoid(logits).numpy(), scores, rtol=1e-5, atol=1e-6)


def test_label_attention_head_falls_back_or_refuses_caching(tmp_path, tok, data):
    tr, rows = _trainer(tmp_path / "auto", tok, data, cache=None, head="label_attention", num_train_epochs=2)
    assert tr.cache_features is False
    tr.train()
    assert rows.rows == 2 * N_TRAIN + 2 * N_EVAL  # the texts, every epoch
    with pytest.raises(ValueError, match="cache_features=True cannot apply.*label_attention"):
        _trainer(tmp_path / "forced", tok, data, cache=True, head="label_attention")
    with pytest.raises(ValueError, match="it classifies no pooled features"):
        tr.model.logits_from_pooled(torch.zeros(2, 32))
    with pytest.raises(ValueError, match="probe='finetune' trains it"):
        ProbingTrainingArguments(output_dir=str(tmp_path), probe="finetune", cache_features=True)
    with pytest.raises(ValueError, match="cache_features=True cannot apply.*group_by_length"):
        _trainer(tmp_path / "grouped", tok, data, cache=True, train_sampling_strategy="group_by_length")


class _FormatSpy(MultiLabelCollator):
    """A collator that records the label layout of every batch it builds."""

    seen: list[str]

    def __call__(self, examples):
        batch = super().__call__(examples)
        labels = batch["labels"]
        self.seen.append("sparse" if labels.is_sparse else "ids" if labels.dtype == torch.int64 else "dense")
        return batch


def _truth(split) -> np.ndarray:
    truth = np.zeros((len(split), 4), dtype=bool)
    for i, ids in enumerate(split["labels"]):
        truth[i, ids] = True
    return truth


def test_encoding_pass_hands_labels_over_as_ids_and_keeps_the_collator(tmp_path, tok, data):
    """The features pass never builds (b, L) label rows (at large label counts those per-batch matrices
    fragment the heap: ``python benchmarks/eval_memory.py --trainer``): its batches carry -1-padded ids, which,
    unlike a sparse tensor, accelerate can slice and gather; the trainer's collator is left as it was."""
    tr, _ = _trainer(tmp_path, tok, data, cache=True)
    spy = _FormatSpy(tok, 4, max_length=32)
    spy.seen = []
    tr.data_collator = spy
    features = tr.cached_features(data["eval"], "eval")
    assert spy.seen and set(spy.seen) == {"ids"}
    assert tr.data_collator is spy and spy.label_format == "dense"
    np.testing.assert_array_equal(features.multi_hot(4), _truth(data["eval"]))
    spy.seen = []
    tr.evaluate()  # the cached rows' batches: dense labels for the loss, from the feature collator
    assert spy.seen == []


def test_pooled_features_of_an_iterable_dataset_and_of_unlabelled_rows(tmp_path, tok, data):
    """An iterable dataset goes through accelerate's batch dispatcher, which slices every batch tensor; rows
    without labels give batches of no label at all (ids padded to one column)."""
    tr, _ = _trainer(tmp_path, tok, data, cache=False)
    x_map, y_map = tr.pooled_features(data["eval"])
    x_it, y_it = tr.pooled_features(data["eval"].to_iterable_dataset())
    np.testing.assert_allclose(x_it, x_map, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(y_it, y_map)
    np.testing.assert_array_equal(y_map, _truth(data["eval"]))
    empty = data["eval"].map(lambda _: {"labels": []})
    x_empty, y_empty = tr.pooled_features(empty)
    np.testing.assert_allclose(x_empty, x_map, rtol=1e-6, atol=1e-6)
    assert y_empty.shape == (N_EVAL, 4) and not y_empty.any()


def test_the_feature_pass_runs_in_the_mixed_precision_of_the_forward(tmp_path, tok, data):
    """Under bf16 the cached features are the pooled output of the model's own forward under the trainer's
    autocast (the text path's), not a float32 pass: accelerate's autocast wraps the forward only."""
    tr, _ = _trainer(tmp_path, tok, data, cache=True, bf16=True)
    assert tr.accelerator.mixed_precision == "bf16"
    got, _ = tr.pooled_features(data["eval"])
    model = tr.accelerator.unwrap_model(tr.model).eval()
    batch = tr._prepare_inputs(collator(tok)([data["eval"][i] for i in range(N_EVAL)]))
    batch.pop("labels")
    with torch.no_grad(), tr.accelerator.autocast():
        want = model(**batch).embeddings.float()
    with torch.no_grad():
        full = model(**batch).embeddings.float()
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-6)
    assert not np.allclose(got, full.numpy(), rtol=0, atol=1e-6)  # bf16 differs from a float32 pass
