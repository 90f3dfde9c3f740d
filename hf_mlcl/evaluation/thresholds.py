"""Decision-threshold tuning on validation scores: one global threshold or one per label.

:func:`tune_global_threshold` scans thresholds 0.01..0.99 and keeps the one maximising micro-F1 on
validation data (Edin et al. 2023, "Automated medical coding on MIMIC-III and MIMIC-IV: a critical
review and replicability study", Sec. 4). :func:`tune_per_label_thresholds` picks, for every label,
the cut of its validation scores maximising that label's F1, from sorted cumulative counts.
:func:`tune_and_evaluate` tunes on validation and scores the test split with the result.
A label is predicted when ``score >= threshold`` (see :mod:`hf_mlcl.evaluation.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import check_pair, rows_per_chunk, safe_div
from hf_mlcl.evaluation.metrics import DEFAULT_KS, compute_multilabel_metrics
from hf_mlcl.evaluation.ranking import decode_u32, float32_exact, monotone_u32

__all__ = ["threshold_grid", "tune_and_evaluate", "tune_global_threshold", "tune_per_label_thresholds"]


def threshold_grid() -> np.ndarray:
    """The global-threshold grid 0.01, 0.02, ..., 0.99 (Edin et al. 2023)."""
    return np.round(np.arange(1, 100, dtype=np.float64) / 100.0, 2)


def tune_global_threshold(
    y_true: Any, y_score: Any, grid: Sequence[float] | np.ndarray | None = None
) -> float:
    """One threshold for all labels, chosen on the grid 0.01..0.99 to maximise micro-F1.

    Edin et al. (2023), "Automated Medical Coding on MIMIC-III and MIMIC-IV: A Critical Review and
    Replicability Study" (SIGIR), Sec. 4: the decision boundary is tuned on the validation set for
    micro-F1 and applied to the test set. Counts of positives / predictions above every grid value come
    from one histogram of the scores (searchsorted + bincount), not one pass per threshold.
    Ties go to the smallest threshold. Returns a Python float (a grid value).
    """
    yt, ys = check_pair(y_true, y_score)
    g64 = threshold_grid() if grid is None else np.asarray(grid, dtype=np.float64).ravel()
    if g64.size == 0 or not np.all(np.isfinite(g64)) or np.any(np.diff(g64) <= 0):
        raise ValueError("grid must be a non-empty, strictly increasing sequence of finite thresholds.")
    g = g64.astype(ys.dtype)
    size = g.size + 1

    def _count_ge(values: np.ndarray) -> np.ndarray:
        # bin b = number of grid values <= v; v >= g[k]  <=>  b > k
        hist = np.bincount(np.searchsorted(g, values, side="right"), minlength=size)
        return np.cumsum(hist[::-1])[::-1][1:]

    tp = _count_ge(ys[yt])
    pred = np.zeros(g.size, dtype=np.int64)
    step = rows_per_chunk(ys.shape[1])
    for r0 in range(0, ys.shape[0], step):
        pred += _count_ge(ys[r0 : r0 + step].ravel())
    f1 = safe_div(2 * tp, pred + int(yt.sum()), 0.0)
    return float(g64[int(np.argmax(f1))])


def _midpoint_threshold(hi: np.ndarray, lo: np.ndarray, has_lower: np.ndarray) -> np.ndarray:
    """Threshold between the last predicted score ``hi`` and the first rejected one ``lo`` (same dtype)."""
    mid = (hi / 2 + lo / 2).astype(hi.dtype)
    return np.where(~has_lower | (mid <= lo), hi, mid)


def _best_cuts_argsort(scores: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row best-F1 threshold from an argsort of each row (any float dtype), and the entries it predicts."""
    n = scores.shape[1]
    order = np.argsort(-scores, axis=1, kind="stable")
    s = np.take_along_axis(scores, order, axis=1)
    tp = np.cumsum(np.take_along_axis(truth, order, axis=1), axis=1)
    del order
    rank = np.arange(1, n + 1, dtype=np.int64)
    f1 = 2.0 * tp / (rank[None, :] + tp[:, -1:])
    valid = np.empty_like(f1, dtype=bool)
    valid[:, :-1] = s[:, :-1] != s[:, 1:]  # only cut between distinct scores
    valid[:, -1] = True
    best = np.argmax(np.where(valid, f1, -1.0), axis=1)  # first max = fewest predictions
    rows = np.arange(scores.shape[0])
    return _midpoint_threshold(s[rows, best], s[rows, np.minimum(best + 1, n - 1)], best < n - 1), best + 1


def _best_cuts_keys(scores: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-column best-F1 threshold for float32-exact scores, without argsort, and the rows it predicts (0 for
    a column without a positive).

    The optimal cut always predicts "score >= s_p" for some positive p (adding negatives only lowers
    F1), whose F1 is 2 pos_ge / (n_ge + P) with the counts of :func:`grouped_ap_auc`. The best
    positive of each label is found with one lexsort of the positives (F1 desc, then fewer predictions);
    the next lower score of the label is the sorted key just before p's block.
    """
    n, c = scores.shape
    key = monotone_u32(scores).astype(np.uint64) | (np.arange(c, dtype=np.uint64)[None, :] << np.uint64(32))
    pos = key[truth]
    out = np.zeros(c, dtype=scores.dtype)
    predicted = np.zeros(c, dtype=np.int64)
    if pos.size == 0:
        return out, predicted
    pg = (pos >> np.uint64(32)).astype(np.int64)
    key = np.sort(key, axis=None)
    n_pos = np.bincount(pg, minlength=c)
    ge_idx = np.searchsorted(key, pos, side="left")
    n_ge = (pg + 1) * n - ge_idx
    pos_ge = np.cumsum(n_pos)[pg] - np.searchsorted(np.sort(pos), pos, side="left")
    f1 = 2.0 * pos_ge / (n_ge + n_pos[pg])
    order = np.lexsort((n_ge, -f1, pg))
    first = order[np.r_[True, pg[order][1:] != pg[order][:-1]]]  # best positive of each label
    g = pg[first]
    has_lower = n_ge[first] < n
    low_mask = np.uint64(0xFFFFFFFF)
    hi = decode_u32((pos[first] & low_mask).astype(np.uint32))
    lo = decode_u32((key[np.maximum(ge_idx[first] - 1, 0)] & low_mask).astype(np.uint32))
    out[g] = _midpoint_threshold(hi, lo, has_lower)
    predicted[g] = n_ge[first]
    return out, predicted


def tune_per_label_thresholds(
    y_true: Any, y_score: Any, default: float | None = None, min_threshold: float = 0.01
) -> np.ndarray:
    """(L,) thresholds, each maximising its label's F1 on validation data.

    For every label, with tp_k the cumulative positives among its k top scores, F1 of predicting the
    top k is 2 tp_k / (k + P) (sorted cumulative counts; chunks of labels at a time, float32 scores via
    packed sort keys + searchsorted, other dtypes via argsort). Only cuts between distinct scores are
    allowed (tied scores are predicted together). The threshold is the midpoint between the last
    predicted and the first rejected score (the lowest score when all are predicted), so
    ``score >= threshold`` reproduces the optimal cut. Ties in F1 go to the cut with fewer predictions.
    Labels without any positive in the validation data (F1 is 0 whatever the threshold) get
    ``default``; ``default=None`` uses :func:`tune_global_threshold`. So does a label whose best cut lies
    below ``min_threshold`` (default 0.01, the global grid's lowest value) and predicts it for more than half of
    the validation texts: a rare label whose few positives score near 0 would be predicted for nearly every
    text to catch them (a label whose positives score low but apart from its negatives keeps its cut).
    """
    check_min_threshold(min_threshold)
    yt, ys = check_pair(y_true, y_score)
    n, num_labels = ys.shape
    out = np.empty(num_labels, dtype=np.float64)
    predicted = np.empty(num_labels, dtype=np.int64)
    no_positive = ~yt.any(axis=0)
    fast = float32_exact(ys)
    step = rows_per_chunk(n)
    for c0 in range(0, num_labels, step):  # chunks of labels
        c1 = min(num_labels, c0 + step)
        if fast:
            out[c0:c1], predicted[c0:c1] = _best_cuts_keys(ys[:, c0:c1].astype(np.float32), yt[:, c0:c1])
        else:
            out[c0:c1], predicted[c0:c1] = _best_cuts_argsort(
                np.ascontiguousarray(ys[:, c0:c1].T), np.ascontiguousarray(yt[:, c0:c1].T)
            )
    untuned = no_positive | below_floor(out, predicted, n, min_threshold)
    return fill_untuned(out, untuned, lambda: tune_global_threshold(yt, ys), default)


def check_min_threshold(min_threshold: float) -> None:
    """ValueError unless ``min_threshold`` lies in [0, 1) (checked before any cut is computed)."""
    if not np.isfinite(min_threshold) or not 0.0 <= min_threshold < 1.0:
        raise ValueError(f"min_threshold must lie in [0, 1); got {min_threshold}")


def below_floor(thresholds: np.ndarray, predicted: np.ndarray, rows: int, min_threshold: float) -> np.ndarray:
    """The labels whose best cut lies below ``min_threshold`` and predicts them for more than half of ``rows``."""
    return (thresholds < min_threshold) & (2 * predicted > rows)


def fill_untuned(
    thresholds: np.ndarray, untuned: np.ndarray, global_threshold: Any, default: float | None
) -> np.ndarray:
    """``thresholds`` with ``default`` (None: ``global_threshold()``, computed only when needed) for the
    ``untuned`` labels."""
    if untuned.any():
        thresholds[untuned] = global_threshold() if default is None else float(default)
    return thresholds


def tune_and_evaluate(
    val_true: Any,
    val_score: Any,
    test_true: Any,
    test_score: Any,
    strategy: str = "global",
    ks: Sequence[int] = DEFAULT_KS,
    zero_division: float = 0.0,
) -> tuple[dict[str, float], float | np.ndarray]:
    """Tune thresholds on validation (``strategy`` "global" or "per_label"), apply them to test.

    Returns ``(test_metrics, threshold)``.
    """
    if strategy == "global":
        thr: float | np.ndarray = tune_global_threshold(val_true, val_score)
    elif strategy == "per_label":
        thr = tune_per_label_thresholds(val_true, val_score)
    else:
        raise ValueError(f"strategy must be 'global' or 'per_label', got {strategy!r}.")
    return compute_multilabel_metrics(test_true, test_score, thr, ks, zero_division), thr
