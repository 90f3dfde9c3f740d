"""MultiLabelAccumulator (a split streamed in row chunks) against the dense metrics and tuning it replaces:
equal within 1e-12 (thresholds identical) while exact, exact counts and bounded estimates above exact_cells,
and the Trainer paths (compute_metrics under batch_eval_metrics, ClassifierEvaluation.predict_evaluation)."""

from __future__ import annotations

import importlib.util
import math
import os

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import hf_mlcl.evaluation.inputs as inp
from hf_mlcl.evaluation import (
    MultiLabelAccumulator,
    compute_multilabel_metrics,
    make_compute_metrics,
    per_label_f1,
    sigmoid,
    tune_global_threshold,
    tune_per_label_thresholds,
)
from hf_mlcl.evaluation.streaming import HISTOGRAM_KEYS


def _split(n=61, num_labels=13, seed=0, decimals=None):
    """Logits (float32) and truth with a label never positive, rows without labels and a row with all."""
    rng = np.random.default_rng(seed)
    y = rng.random((n, num_labels)) < 0.2
    y[:, 3] = False
    y[[5, 17]] = False
    y[9] = True
    z = (rng.standard_normal((n, num_labels)) + 1.5 * y).astype(np.float32)
    if decimals is not None:
        z = np.round(z, decimals)
    return y, z


def _same(a: dict, b: dict, skip=()) -> None:
    assert a.keys() == b.keys()
    bad = {
        k: (a[k], b[k])
        for k in a
        if not k.startswith(skip)
        and not (math.isclose(a[k], b[k], rel_tol=0, abs_tol=1e-12) or a[k] == b[k])
        and not (math.isnan(a[k]) and math.isnan(b[k]))
    }
    assert not bad, bad


def _stream(z, y, batch, **kw):
    acc = MultiLabelAccumulator(y.shape[1], **kw)
    for r0 in range(0, len(z), batch):
        acc.add_batch(z[r0 : r0 + batch], y[r0 : r0 + batch].astype(np.float32))
    return acc


@pytest.mark.parametrize("chunk_rows", [1, 7, 10_000])
@pytest.mark.parametrize("batch", [1, 5, 64])
def test_streamed_logits_equal_dense(monkeypatch, chunk_rows, batch):
    y, z = _split()
    monkeypatch.setattr(inp, "CHUNK_CELLS", chunk_rows * y.shape[1])
    s = sigmoid(z.astype(np.float64))  # ClassifierEvaluation's probabilities
    fixed = np.linspace(0.2, 0.8, y.shape[1])
    acc = _stream(z, y, batch, thresholds=[0.37, fixed])
    assert acc.exact and acc.num_rows == len(y)
    g = acc.tune_global_threshold()
    assert g == tune_global_threshold(y, s)
    per_label = acc.tune_per_label_thresholds()
    assert np.array_equal(per_label, tune_per_label_thresholds(y, s))
    for thr in (
        0.5,
        0.37,
        0.123,
        g,
        per_label,
        fixed,
    ):  # 0.123 and per_label: not counted, from the kept inputs
        _same(acc.compute(thr), compute_multilabel_metrics(y, s, threshold=thr))
        assert np.array_equal(acc.per_label_f1(thr), per_label_f1(y, s >= thr))
    scores, truth = acc.dense()
    assert np.array_equal(scores, s) and np.array_equal(truth, y)
    lo, hi = acc.bounds()["macro_auc"]
    assert lo == hi == acc.compute()["macro_auc"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_streamed_scores_equal_dense_with_ties(dtype):
    """Probabilities as given (from_logits=False), rounded to 2 decimals: ties everywhere, on grid values too."""
    y, z = _split(n=40, num_labels=9, seed=1)
    s = np.round(sigmoid(z.astype(np.float64)), 2).astype(dtype)
    acc = MultiLabelAccumulator.from_arrays(y, s)
    g = acc.tune_global_threshold()
    assert g == tune_global_threshold(y, s)
    per_label = acc.tune_per_label_thresholds()
    assert np.array_equal(per_label, tune_per_label_thresholds(y, s))
    for thr in (0.5, g, per_label):
        _same(acc.compute(thr), compute_multilabel_metrics(y, s, threshold=thr))  # ties: the same rule


def test_reference_formats_agree():
    y, z = _split(n=20, num_labels=7, seed=2)
    formats = [
        y,
        torch.from_numpy(y.astype(np.float32)),
        torch.from_numpy(y.astype(np.float32)).to_sparse(),
        *(  # every torch sparse layout
            torch.from_numpy(y.astype(np.float32)).to_sparse(layout=layout)
            for layout in (torch.sparse_csr, torch.sparse_csc)
        ),
        torch.from_numpy(y.astype(np.float32)).to_sparse_bsr((1, 1)),
        sp.csr_matrix(y.astype(np.int8)),
        [np.flatnonzero(row).tolist() for row in y],
        y.astype(np.float32).tolist(),  # multi-hot rows as Python lists: floats, bools, 0/1 ints L wide
        y.tolist(),
        y.astype(np.int64).tolist(),
    ]
    results = []
    for ref in formats:
        acc = MultiLabelAccumulator(7)
        acc.add_batch(torch.from_numpy(z), ref)
        results.append(acc.compute(0.5))
    for r in results[1:]:
        _same(r, results[0])
    with pytest.raises(ValueError, match="label ids must lie"):
        MultiLabelAccumulator(7).add_batch(z[:2], [[0], [7]])
    with pytest.raises(ValueError, match="only 0 and 1"):
        MultiLabelAccumulator(7).add_batch(z[:2], np.full((2, 7), 2.0))
    with pytest.raises(ValueError, match="NaN"):
        MultiLabelAccumulator(7).add_batch(np.full((1, 7), np.nan), y[:1])
    with pytest.raises(ValueError, match="no rows"):
        MultiLabelAccumulator(7).compute()


def test_above_exact_cells_counts_stay_exact_and_estimates_are_bounded():
    y, z = _split(n=300, num_labels=11, seed=3)
    s = sigmoid(z.astype(np.float64))
    fixed = np.full(11, 0.42)
    acc = _stream(z, y, 32, thresholds=[fixed], exact_cells=100)
    assert not acc.exact
    g = acc.tune_global_threshold()
    assert g == tune_global_threshold(y, s)  # the grid is counted: exact in any size
    dense = compute_multilabel_metrics(y, s, threshold=g)
    got = acc.compute(g)
    _same(got, dense, skip=HISTOGRAM_KEYS)
    _same(acc.compute(fixed), compute_multilabel_metrics(y, s, threshold=fixed), skip=HISTOGRAM_KEYS)
    for key, (lo, hi) in acc.bounds().items():
        assert lo - 1e-12 <= dense[key] <= hi + 1e-12 and lo - 1e-12 <= got[key] <= hi + 1e-12
        assert abs(got[key] - dense[key]) < 0.01
    per_label = acc.tune_per_label_thresholds()  # histogram edges: label counts exact, rows unknown
    assert np.all(np.isin(per_label[y.any(0)], acc.edges))
    at_edges = acc.compute(per_label)
    _same(
        at_edges,
        compute_multilabel_metrics(y, s, threshold=per_label),
        skip=HISTOGRAM_KEYS + ("example_f1", "subset"),
    )
    assert math.isnan(at_edges["example_f1"]) and math.isnan(at_edges["subset_accuracy"])
    assert np.array_equal(acc.per_label_f1(per_label), per_label_f1(y, s >= per_label))
    best = [max(per_label_f1(y[:, [j]], s[:, [j]] >= e)[0] for e in acc.edges) for j in range(11)]
    assert np.allclose(acc.per_label_f1(per_label)[y.any(0)], np.array(best)[y.any(0)])
    with pytest.raises(ValueError, match="was not counted"):
        acc.compute(0.123)
    with pytest.raises(ValueError, match="exceed exact_cells"):
        acc.dense()


def test_histogram_mode_does_not_depend_on_batching():
    y, z = _split(n=120, num_labels=9, seed=4)
    a = _stream(z, y, 7, exact_cells=50).compute(0.3)
    b = _stream(z, y, 120, exact_cells=50).compute(0.3)
    assert a == b


def test_compute_metrics_batch_eval_mode_equals_whole_split():
    from transformers import EvalPrediction

    y, z = _split(n=30, num_labels=6, seed=5)
    fn = make_compute_metrics(threshold=0.4)
    whole = fn(EvalPrediction(predictions=z, label_ids=y.astype(np.float32)))
    for r0 in range(0, 30, 8):
        part = fn(
            EvalPrediction(
                predictions=torch.from_numpy(z[r0 : r0 + 8]), label_ids=torch.from_numpy(y[r0 : r0 + 8])
            ),
            compute_result=r0 + 8 >= 30,
        )
    _same(part, whole)
    assert fn(EvalPrediction(predictions=z, label_ids=y.astype(np.float32))) == whole  # no state left over


def _helpers():
    path = os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training", "_training_helpers.py"
    )
    spec = importlib.util.spec_from_file_location("_training_helpers_streaming", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("strategy", ["global", "per_label"])
def test_trainer_streamed_evaluation_equals_predict_scores(tmp_path, strategy):
    """ClassifierEvaluation: predict_evaluation (batch_eval_metrics loop) = predict_scores + dense metrics,
    and compute_metrics under batch_eval_metrics = the whole-split one."""
    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.training import ProbingTrainer

    h = _helpers()
    tok = h.tiny_tokenizer()
    clf = MLCLForMultiLabelClassification.from_encoder(h.tiny_encoder(tok), num_labels=4, freeze_encoder=True)
    kw = dict(
        model=clf,
        train_dataset=h.tiny_split(16),
        eval_dataset=h.tiny_split(21, 1),
        data_collator=h.collator(tok),
    )
    tr = ProbingTrainer(
        args=h.probe_args(tmp_path / "a", probe="linear", threshold=strategy, per_device_eval_batch_size=4),
        **kw,
    )
    val, test = h.tiny_split(21, 1), h.tiny_split(13, 2)
    scores, truth = tr.predict_scores(val)
    acc = tr.predict_evaluation(val)
    assert not tr.args.batch_eval_metrics and tr.compute_metrics == tr._metrics  # restored
    dense_scores, dense_truth = acc.dense()
    assert np.array_equal(dense_scores, scores) and np.array_equal(dense_truth, truth)
    threshold = tr.tune_threshold(scores, truth)
    assert np.array_equal(tr.tune_threshold(acc), threshold)
    _same(tr.split_metrics(acc, None, "validation"), tr.split_metrics(scores, truth, "validation"))
    test_acc = tr.predict_evaluation(test)
    _same(tr.split_metrics(test_acc, None, "test"), tr.split_metrics(*tr.predict_scores(test), "test"))
    whole = tr.evaluate()
    batched = ProbingTrainer(
        args=h.probe_args(
            tmp_path / "b", probe="linear", batch_eval_metrics=True, per_device_eval_batch_size=4
        ),
        **kw,
    )
    batched.threshold = tr.threshold
    _same(
        batched.evaluate(),
        whole,
        skip=("eval_runtime", "eval_samples_per_second", "eval_steps_per_second", "eval_model_prep"),
    )


def test_rows_added_after_compute_count():
    y, z = _split(n=30, num_labels=5, seed=6)
    s = sigmoid(z.astype(np.float64))
    acc = MultiLabelAccumulator(5)
    acc.add_batch(z[:10], y[:10])
    _same(acc.compute(), compute_multilabel_metrics(y[:10], s[:10]))
    acc.add_batch(z[10:], y[10:])
    _same(acc.compute(), compute_multilabel_metrics(y, s))


def test_rows_of_a_wider_dtype_after_narrower_ones_keep_their_precision(monkeypatch):
    """The chunk buffer takes the first batch's dtype; a float64 batch after float32 ones is not rounded."""
    y, z = _split()
    monkeypatch.setattr(inp, "CHUNK_CELLS", 7 * y.shape[1])
    half = len(y) // 2
    z32 = z[:half].astype(np.float32)
    acc = MultiLabelAccumulator(y.shape[1])
    acc.add_batch(z32, y[:half].astype(np.float32))
    acc.add_batch(z[half:].astype(np.float64), y[half:].astype(np.float32))
    scores, truth = acc.dense()
    want = sigmoid(np.concatenate([z32.astype(np.float64), z[half:].astype(np.float64)]))
    assert np.array_equal(scores, want) and np.array_equal(truth, y)
