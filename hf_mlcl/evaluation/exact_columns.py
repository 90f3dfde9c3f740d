"""Exact whole-column metrics of the inputs a streamed split keeps (up to ``exact_cells`` rows x labels):
per-label AP / AUC, micro AUC and per-label thresholds, computed from the raw row chunks in label blocks
with the engines of :mod:`hf_mlcl.evaluation.ranking` and :mod:`hf_mlcl.evaluation.thresholds`.

Used by :class:`~hf_mlcl.evaluation.streaming.MultiLabelAccumulator` while :attr:`exact`; above
``exact_cells`` the histograms of :mod:`hf_mlcl.evaluation.score_histograms` take over.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np

from hf_mlcl.evaluation import inputs as _inputs
from hf_mlcl.evaluation.ranking import float32_exact, per_label_ap_auc
from hf_mlcl.evaluation.thresholds import _best_cuts_argsort, _best_cuts_keys

__all__ = ["best_cuts", "column_blocks", "exact_columns"]

Scores = Callable[[np.ndarray], np.ndarray]  # raw predictions -> the scores compared


def column_blocks(
    chunks: Sequence[np.ndarray], scores: Scores, num_labels: int, rows: np.ndarray, cols: np.ndarray
) -> Iterable[tuple[int, int, np.ndarray, np.ndarray]]:
    """(c0, c1, truth (N, c) bool, scores (N, c)) label blocks of the kept raw ``chunks`` (N rows in all,
    positives at (``rows``, ``cols``)), in the label chunks of :func:`per_label_ap_auc` /
    :func:`tune_per_label_thresholds`."""
    n = sum(r.shape[0] for r in chunks)
    step = _inputs.rows_per_chunk(n)
    order = np.argsort(cols, kind="stable")
    starts = np.searchsorted(cols[order], np.arange(0, num_labels + step, step))
    for i, c0 in enumerate(range(0, num_labels, step)):
        c1 = min(num_labels, c0 + step)
        sel = order[starts[i] : starts[i + 1]]
        truth = np.zeros((n, c1 - c0), dtype=bool)
        truth[rows[sel], cols[sel] - c0] = True
        yield c0, c1, truth, scores(np.concatenate([r[:, c0:c1] for r in chunks]))


def exact_columns(
    chunks: Sequence[np.ndarray],
    scores: Scores,
    num_labels: int,
    rows: np.ndarray,
    cols: np.ndarray,
    pscore: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per-label AP / AUC (:func:`per_label_ap_auc`) and micro AUC (as :func:`micro_auc`) of the kept inputs
    (positives at (``rows``, ``cols``) with scores ``pscore``)."""
    ap = np.empty(num_labels)
    auc = np.empty(num_labels)
    for c0, c1, truth, block in column_blocks(chunks, scores, num_labels, rows, cols):
        ap[c0:c1], auc[c0:c1] = per_label_ap_auc(truth, block)
    n_rows = sum(r.shape[0] for r in chunks)
    n_pos, n_neg = pscore.size, n_rows * num_labels - pscore.size
    if n_pos == 0 or n_neg == 0:
        return ap, auc, float("nan")
    twice = 0  # 2 * sum over positives of (#cells < s_p + 0.5 #cells == s_p)
    for r in chunks:
        srt = np.sort(scores(r), axis=None)
        twice += int(np.searchsorted(srt, pscore, side="left").sum(dtype=np.int64))
        twice += int(np.searchsorted(srt, pscore, side="right").sum(dtype=np.int64))
    return ap, auc, (twice - n_pos * n_pos) / 2.0 / (float(n_pos) * float(n_neg))


def best_cuts(
    chunks: Sequence[np.ndarray], scores: Scores, num_labels: int, rows: np.ndarray, cols: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(L,) thresholds maximising each label's F1 on the kept inputs, as
    :func:`~hf_mlcl.evaluation.tune_per_label_thresholds` (cuts between distinct scores), and (L,) the rows
    each predicts."""
    out = np.empty(num_labels, dtype=np.float64)
    predicted = np.empty(num_labels, dtype=np.int64)
    for c0, c1, truth, block in column_blocks(chunks, scores, num_labels, rows, cols):
        if float32_exact(block):
            out[c0:c1], predicted[c0:c1] = _best_cuts_keys(block.astype(np.float32), truth)
        else:
            out[c0:c1], predicted[c0:c1] = _best_cuts_argsort(
                np.ascontiguousarray(block.T), np.ascontiguousarray(truth.T)
            )
    return out, predicted
