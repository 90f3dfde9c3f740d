"""Score-ranking engines: average precision, ROC AUC and top-k hits of (N, L) score matrices, vectorised.

Two exact engines compute AP / AUC with sklearn's tie handling: :func:`grouped_ap_auc` (float32-exact
scores: one value sort of packed 64-bit keys plus searchsorted, no argsort) and :func:`rowwise_ap_auc`
(any float dtype: one argsort per row). :func:`per_label_ap_auc` / :func:`per_example_ap` pick the
engine and run it over chunks of labels / examples; :func:`micro_auc` pools all cells;
:func:`ranked_hits` counts true labels among each example's top-scored labels (P@k, R@k,
R-precision). Used by :func:`hf_mlcl.evaluation.metrics.compute_multilabel_metrics`; the packed keys
(:func:`monotone_u32` / :func:`decode_u32`) are shared with :mod:`hf_mlcl.evaluation.thresholds`.
"""

from __future__ import annotations

import numpy as np

from hf_mlcl.evaluation.inputs import rows_per_chunk
from hf_mlcl.evaluation.positives import expected_in_top, tied_counts

__all__ = [
    "decode_u32",
    "float32_exact",
    "grouped_ap_auc",
    "micro_auc",
    "monotone_u32",
    "per_example_ap",
    "per_label_ap_auc",
    "ranked_hits",
    "rowwise_ap_auc",
]


def rowwise_ap_auc(scores: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Average precision and ROC AUC of every row (scores vs. binary truth), ties handled like sklearn.

    Each row is sorted once by decreasing score; tp/fp cumulative counts are read at the end of every
    group of tied scores. AP = sum_groups (dTP / P) * precision (sklearn's step-wise AP); AUC is the
    trapezoidal area under the ROC curve through the same points (= sklearn roc_auc_score). Rows with
    no positive get AP = NaN; rows without a positive or a negative get AUC = NaN.
    """
    r, m = scores.shape
    order = np.argsort(-scores, axis=1, kind="stable")
    s = np.take_along_axis(scores, order, axis=1)
    y = np.take_along_axis(truth, order, axis=1)
    del order
    tp = np.cumsum(y, axis=1, dtype=np.int64)
    rank = np.arange(1, m + 1, dtype=np.int64)
    fp = rank[None, :] - tp
    end = np.empty((r, m), dtype=bool)
    end[:, :-1] = s[:, :-1] != s[:, 1:]
    end[:, -1] = True
    del s

    def _previous_at_group_end(c: np.ndarray) -> np.ndarray:
        at_end = np.where(end, c, 0)
        prev = np.zeros_like(c)
        prev[:, 1:] = np.maximum.accumulate(at_end[:, :-1], axis=1)  # counts are non-decreasing
        return prev

    tp_prev = _previous_at_group_end(tp)
    fp_prev = _previous_at_group_end(fp)
    dtp = np.where(end, tp - tp_prev, 0)
    dfp = np.where(end, fp - fp_prev, 0)
    n_pos = tp[:, -1].astype(np.float64)
    n_neg = m - n_pos
    ap_sum = (dtp * (tp / rank[None, :])).sum(axis=1)
    auc_sum = (dfp * (tp_prev + tp)).sum(axis=1) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        ap = np.where(n_pos > 0, ap_sum / n_pos, np.nan)
        auc = np.where((n_pos > 0) & (n_neg > 0), auc_sum / (n_pos * n_neg), np.nan)
    return ap, auc


def monotone_u32(s: np.ndarray) -> np.ndarray:
    """Map float32 values to uint32 keys with the same order (IEEE-754 sign/magnitude trick)."""
    bits = (s.astype(np.float32, copy=False) + np.float32(0.0)).view(np.uint32)  # -0.0 becomes +0.0
    return np.where(bits >= np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000))


def decode_u32(k: np.ndarray) -> np.ndarray:
    """Inverse of :func:`monotone_u32`."""
    bits = np.where(k >= np.uint32(0x80000000), k ^ np.uint32(0x80000000), ~k).astype(np.uint32)
    return bits.view(np.float32)


def grouped_ap_auc(
    scores: np.ndarray, truth: np.ndarray, groups_are_rows: bool
) -> tuple[np.ndarray, np.ndarray]:
    """AP and ROC AUC of every row (``groups_are_rows``) or column of float32-exact scores, without argsort.

    Each cell gets the 64-bit key (group << 32 | order-preserving 32-bit score key); one value sort of
    the keys puts every group in ascending score order, and the (few) positives are located with
    searchsorted, giving for each positive p: n_ge = #members with score >= s_p, n_gt = #members with
    score > s_p and pos_ge = #positives with score >= s_p. Then (ties exactly as in sklearn)
        AP  = (1/P) sum_p pos_ge / n_ge                                  (step-wise AP)
        AUC = [sum_p (#< s_p + 0.5 #== s_p) - P^2 / 2] / (P * Nn)         (Mann-Whitney U)
    where #< s_p = M - n_ge and #== s_p = n_ge - n_gt; the P^2/2 removes the positive-positive pairs.
    """
    r, c = scores.shape
    n_groups, m = (r, c) if groups_are_rows else (c, r)
    key = monotone_u32(scores).astype(np.uint64)
    gid = np.arange(n_groups, dtype=np.uint64)
    key |= (gid[:, None] if groups_are_rows else gid[None, :]) << np.uint64(32)
    pos = key[truth]
    pg = (pos >> np.uint64(32)).astype(np.int64)
    key = np.sort(key, axis=None)
    n_pos = np.bincount(pg, minlength=n_groups)
    end = (pg + 1) * m
    n_ge = end - np.searchsorted(key, pos, side="left")
    n_gt = end - np.searchsorted(key, pos, side="right")
    del key
    pos_ge = np.cumsum(n_pos)[pg] - np.searchsorted(np.sort(pos), pos, side="left")
    ap_sum = np.bincount(pg, weights=pos_ge / n_ge, minlength=n_groups)
    twice = np.bincount(pg, weights=(2 * m - n_ge - n_gt).astype(np.float64), minlength=n_groups)
    n_pos = n_pos.astype(np.float64)
    n_neg = m - n_pos
    with np.errstate(divide="ignore", invalid="ignore"):
        ap = np.where(n_pos > 0, ap_sum / n_pos, np.nan)
        auc = np.where((n_pos > 0) & (n_neg > 0), (twice - n_pos * n_pos) / 2.0 / (n_pos * n_neg), np.nan)
    return ap, auc


def float32_exact(ys: np.ndarray) -> bool:
    return ys.dtype == np.float32 or bool(np.array_equal(ys.astype(np.float32), ys))


def per_label_ap_auc(yt: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, num_labels = ys.shape
    step = rows_per_chunk(n)
    fast = float32_exact(ys)
    ap = np.empty(num_labels)
    auc = np.empty(num_labels)
    for c0 in range(0, num_labels, step):  # chunks of labels, not a per-label loop
        c1 = min(num_labels, c0 + step)
        if fast:
            ap[c0:c1], auc[c0:c1] = grouped_ap_auc(ys[:, c0:c1], yt[:, c0:c1], groups_are_rows=False)
        else:
            ap[c0:c1], auc[c0:c1] = rowwise_ap_auc(
                np.ascontiguousarray(ys[:, c0:c1].T), np.ascontiguousarray(yt[:, c0:c1].T)
            )
    return ap, auc


def per_example_ap(yt: np.ndarray, ys: np.ndarray) -> np.ndarray:
    n, num_labels = ys.shape
    step = rows_per_chunk(num_labels)
    fast = float32_exact(ys)
    ap = np.empty(n)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        if fast:
            ap[r0:r1], _ = grouped_ap_auc(ys[r0:r1], yt[r0:r1], groups_are_rows=True)
        else:
            ap[r0:r1], _ = rowwise_ap_auc(ys[r0:r1], yt[r0:r1])
    return ap


def micro_auc(yt: np.ndarray, ys: np.ndarray) -> float:
    """AUC of all N*L cells pooled (= sklearn ``roc_auc_score(y.ravel(), s.ravel())``), chunked.

    Mann-Whitney form: AUC = [sum_{pos p} (#neg < s_p + 0.5 #neg == s_p)] / (P * Nn). Each chunk of
    cells is sorted and the (few) positive scores are located in it with searchsorted; summing over
    all cells instead of the negatives adds exactly P^2 / 2 (every positive pair counted once, every
    self pair a half), which is subtracted at the end.
    """
    pos = ys[yt]
    n_pos = pos.size
    n_neg = yt.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    twice = 0  # 2 * sum over positives of (#cells < s_p + 0.5 #cells == s_p), exact in int64
    step = rows_per_chunk(ys.shape[1])
    for r0 in range(0, ys.shape[0], step):
        chunk = np.sort(ys[r0 : r0 + step], axis=None)
        left = np.searchsorted(chunk, pos, side="left")
        right = np.searchsorted(chunk, pos, side="right")
        twice += int(left.sum(dtype=np.int64) + right.sum(dtype=np.int64))
    return (twice - n_pos * n_pos) / 2.0 / (float(n_pos) * float(n_neg))


def ranked_hits(yt: np.ndarray, ys: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
    """The count of true labels among each example's d top-scored labels: ``(N, depth)`` float for d = 1 ..
    depth (P@k, R@k), and ``(N,)`` float for d = the example's own number of true labels (R-precision; 0 for
    an example without one). A true label tied with others across the cut counts with its chance of being above
    it when tied labels come in random order (:func:`~hf_mlcl.evaluation.positives.expected_in_top`): the count
    depends on no order among tied labels, is the plain count without ties, and equals
    :class:`~hf_mlcl.evaluation.MultiLabelAccumulator`'s. Memory O(N depth + positives depth) per chunk, whatever
    the largest label set."""
    n, num_labels = ys.shape
    depth = min(depth, num_labels)
    out = np.zeros((n, depth), dtype=np.float64)
    at_own = np.zeros(n, dtype=np.float64)
    cut = np.arange(1, depth + 1)
    step = rows_per_chunk(num_labels)
    for r0 in range(0, n, step):
        s = ys[r0 : r0 + step]
        rows, cols = np.nonzero(yt[r0 : r0 + step])  # row-major: each row's positives together
        if rows.size == 0:
            continue
        above, tied = tied_counts(np.sort(s, axis=1), rows, s[rows, cols])
        first = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
        chance = expected_in_top(above[:, None], tied[:, None], cut[None, :])  # (positives, depth)
        out[r0 + rows[first]] = np.add.reduceat(chance, first, axis=0)
        own = np.diff(np.r_[first, rows.size])  # each row's number of true labels
        at_own[r0 + rows[first]] = np.add.reduceat(expected_in_top(above, tied, np.repeat(own, own)), first)
    return out, at_own
