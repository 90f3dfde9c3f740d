"""Threshold tuning: global grid (Edin et al. 2023) and exact per-label cuts, vs. brute force."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import metrics as skm

import hf_mlcl.evaluation.inputs as inp
import hf_mlcl.evaluation.thresholds as th
from hf_mlcl.evaluation import (
    compute_multilabel_metrics,
    per_label_f1,
    threshold_grid,
    tune_and_evaluate,
    tune_global_threshold,
    tune_per_label_thresholds,
)


def _f1(y, pred):
    """F1 = 2TP / (2TP + FP + FN) with 0/0 = 0 (checked against sklearn in test_eval_metrics)."""
    tp = np.sum(y & pred)
    den = np.sum(y) + np.sum(pred)
    return 2 * tp / den if den else 0.0


def _val(n=80, num_labels=9, seed=0, decimals=None):
    rng = np.random.default_rng(seed)
    y = rng.random((n, num_labels)) < 0.25
    y[:, 4] = False  # never positive in validation
    s = np.clip(rng.normal(0.35 + 0.3 * y, 0.2), 0, 1)
    if decimals is not None:
        s = np.round(s, decimals)
    return y, s.astype(np.float32)


def test_grid_is_001_to_099():
    g = threshold_grid()
    assert g.size == 99 and g[0] == 0.01 and g[-1] == 0.99
    np.testing.assert_allclose(np.diff(g), 0.01)


@pytest.mark.parametrize("decimals", [None, 2])
def test_global_threshold_is_brute_force_argmax(decimals):
    y, s = _val(decimals=decimals)  # decimals=2 puts scores exactly on grid values (>= boundary)
    assert _f1(y, s >= 0.5) == pytest.approx(skm.f1_score(y, s >= 0.5, average="micro"))
    best = tune_global_threshold(y, s)
    f1s = [_f1(y, s >= np.float32(t)) for t in threshold_grid()]
    assert best == pytest.approx(threshold_grid()[int(np.argmax(f1s))])
    assert isinstance(best, float)
    got = compute_multilabel_metrics(y, s, threshold=best)["micro_f1"]
    assert got == pytest.approx(max(f1s))
    assert got >= compute_multilabel_metrics(y, s, threshold=0.5)["micro_f1"]


def test_global_threshold_chunked_and_custom_grid(monkeypatch):
    y, s = _val(seed=3)
    ref = tune_global_threshold(y, s)
    monkeypatch.setattr(inp, "CHUNK_CELLS", 17)
    assert tune_global_threshold(y, s) == ref
    assert tune_global_threshold(y, s, grid=[0.2, 0.4, 0.6]) in (0.2, 0.4, 0.6)
    with pytest.raises(ValueError, match="increasing"):
        tune_global_threshold(y, s, grid=[0.5, 0.2])


@pytest.mark.parametrize("decimals", [None, 1])
def test_per_label_thresholds_reach_the_best_f1_of_each_label(decimals):
    y, s = _val(seed=1, decimals=decimals)  # decimals=1 -> many ties
    thr = tune_per_label_thresholds(y, s)
    assert thr.shape == (y.shape[1],) and thr.dtype == np.float64
    got = per_label_f1(y, s >= thr.astype(s.dtype))
    for j in range(y.shape[1]):  # brute force over every distinct cut, label by label
        if not y[:, j].any():
            continue
        cands = np.unique(s[:, j])
        best = max(_f1(y[:, j], s[:, j] >= c) for c in cands)
        assert got[j] == pytest.approx(best), j
    # the label without validation positives falls back to the tuned global threshold
    assert thr[4] == tune_global_threshold(y, s)
    assert tune_per_label_thresholds(y, s, default=0.77)[4] == 0.77


def test_per_label_threshold_is_a_midpoint_between_scores():
    y = np.array([[1], [1], [0], [0]])
    s = np.array([[0.9], [0.7], [0.3], [0.1]], dtype=np.float64)
    assert tune_per_label_thresholds(y, s)[0] == pytest.approx(0.5)
    # every example positive -> predict all: threshold = lowest score
    assert tune_per_label_thresholds(np.ones((3, 1)), np.array([[0.2], [0.6], [0.4]]))[0] == pytest.approx(
        0.2
    )


def test_per_label_chunking_equal(monkeypatch):
    y, s = _val(seed=2, decimals=1)
    ref = tune_per_label_thresholds(y, s)
    monkeypatch.setattr(inp, "CHUNK_CELLS", 100)
    np.testing.assert_array_equal(tune_per_label_thresholds(y, s), ref)


def test_tune_on_validation_apply_to_test():
    yv, sv = _val(seed=4)
    yt, st_ = _val(seed=5)
    m_glob, t_glob = tune_and_evaluate(yv, sv, yt, st_, strategy="global")
    assert m_glob == compute_multilabel_metrics(yt, st_, threshold=t_glob)
    m_lab, t_lab = tune_and_evaluate(yv, sv, yt, st_, strategy="per_label")
    assert t_lab.shape == (yv.shape[1],)
    assert m_lab["micro_f1"] == pytest.approx(
        compute_multilabel_metrics(yt, st_, threshold=t_lab)["micro_f1"]
    )
    # on the validation data itself, per-label tuning is at least as good in macro-F1 as one threshold
    assert (
        compute_multilabel_metrics(yv, sv, threshold=tune_per_label_thresholds(yv, sv))["macro_f1"]
        >= compute_multilabel_metrics(yv, sv, threshold=tune_global_threshold(yv, sv))["macro_f1"]
    )
    with pytest.raises(ValueError, match="strategy"):
        tune_and_evaluate(yv, sv, yt, st_, strategy="best")


@pytest.mark.parametrize("seed", range(4))
def test_sort_free_cuts_equal_argsort_cuts(seed):
    """float32 scores take the packed-key path, other dtypes the argsort path: same thresholds."""
    rng = np.random.default_rng(seed)
    y = rng.random((31, 13)) < rng.uniform(0.05, 0.7)
    s = rng.normal(size=(31, 13)).astype(np.float32)
    if seed % 2:
        s = (np.round(s * 2) / 2).astype(np.float32)  # ties, zeros, negative scores
    fast, fast_predicted = th._best_cuts_keys(s, y)
    slow, slow_predicted = th._best_cuts_argsort(np.ascontiguousarray(s.T), np.ascontiguousarray(y.T))
    has = y.any(axis=0)
    np.testing.assert_array_equal(fast[has], slow[has])
    np.testing.assert_array_equal(fast_predicted[has], slow_predicted[has])
    np.testing.assert_array_equal(fast_predicted[has], (s >= fast.astype(s.dtype)).sum(axis=0)[has])


def test_a_label_whose_best_cut_lies_below_the_floor_takes_the_global_threshold():
    """A rare label whose one validation positive scores 1e-6 among negatives at 0.3: its best F1 cut predicts it
    for every text (F1 2/41); it takes the global threshold instead, one-shot and streamed. A label whose
    positives score low but above its negatives keeps its cut."""
    from hf_mlcl.evaluation import MultiLabelAccumulator

    rng = np.random.default_rng(0)
    y = rng.random((40, 3)) < 0.3
    s = np.where(y, 0.6 + 0.3 * rng.random((40, 3)), 0.4 * rng.random((40, 3)))
    y[:, 2], s[:, 2] = False, 0.3
    y[7, 2], s[7, 2] = True, 1e-6
    exact = tune_per_label_thresholds(y, s, min_threshold=0.0)
    assert exact[2] <= 1e-6 and (s[:, 2] >= exact[2]).all()  # the exact F1 optimum: every text
    thr = tune_per_label_thresholds(y, s)
    assert thr[2] == tune_global_threshold(y, s) and (s[:, 2] >= thr[2]).sum() == 0
    assert thr[:2] == pytest.approx(exact[:2])  # the others keep their best cut
    low = np.where(y[:, 0], 0.006 + 0.003 * rng.random(40), 0.004 * rng.random(40))  # apart, all under 0.01
    separable = tune_per_label_thresholds(y[:, :1], low[:, None])
    assert 0.004 < separable[0] < 0.01 and per_label_f1(y[:, :1], low[:, None] >= separable)[0] == 1.0
    assert tune_per_label_thresholds(y, s, default=0.5)[2] == 0.5
    acc = MultiLabelAccumulator(from_logits=False)
    acc.add_batch(s, y)
    assert acc.tune_per_label_thresholds() == pytest.approx(thr)
    with pytest.raises(ValueError, match="min_threshold must lie in"):
        tune_per_label_thresholds(y, s, min_threshold=1.5)
    # checked before any score is read: a bad floor is named even beside inputs that would fail later
    with pytest.raises(ValueError, match="min_threshold must lie in"):
        tune_per_label_thresholds(y[:3], s, min_threshold=float("nan"))
    with pytest.raises(ValueError, match="min_threshold must lie in"):
        MultiLabelAccumulator(from_logits=False).tune_per_label_thresholds(min_threshold=-0.1)
