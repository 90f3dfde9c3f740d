"""Multi-label classification metrics and decision-threshold tuning, vectorised in numpy.

Every metric here is computed from whole-matrix operations (column / row reductions, one sort per
chunk of labels or examples); nothing loops over labels or examples in Python, so MIMIC-IV sized
problems (25k labels x thousands of documents) run in seconds. Big matrices are processed in chunks
of about four million cells to bound memory.

Inputs
------
``y_true``: (N, L) multi-hot {0, 1} (bool / int / float; numpy, torch, or scipy sparse).
``y_score``: (N, L) real scores, normally probabilities (use :func:`sigmoid` on logits). float32
scores stay float32 (half the memory of float64).

Conventions (documented once, used everywhere)
----------------------------------------------
* A label is predicted when ``score >= threshold`` (the threshold is cast to the score dtype first,
  so a tuned threshold reproduces exactly the predictions it was tuned on).
* 0/0 follows scikit-learn's ``zero_division`` (default 0.0): precision of a label never predicted,
  recall of a label never positive, F1 of a label with no positive and no prediction, the F1 of an
  example with neither true nor predicted labels, and R@k / R-precision / per-example AP of an
  example without true labels are all ``zero_division``. Macro averages run over ALL labels (like
  sklearn ``average="macro"`` and CAML), so labels never positive in the split pull macro scores
  down unless ``zero_division=1``.
* Score-ranking metrics that are undefined for a label are skipped (not zero): per-label AUC needs a
  positive and a negative, per-label AP needs a positive. ``macro_auc`` / ``map_label`` average the
  labels that remain (NaN when none remain); ``micro_auc`` is NaN when the whole matrix is one class.
* P@k divides by ``min(k, L)`` (CAML's ``len(topk)``); R@k divides by the number of true labels
  (Mullenbach et al. 2018, CAML; Huang et al. 2022, PLM-ICD). Ties in the top-k are broken
  arbitrarily (as with CAML's argsort).
* ``macro_f1`` is the mean of per-label F1 (sklearn ``average="macro"``); ``macro_f1_harmonic`` is the
  harmonic mean of macro-precision and macro-recall, the definition of CAML (Mullenbach et al. 2018)
  and PLM-ICD (Huang et al. 2022). The two differ, often by several points on long-tailed data.

Threshold tuning
----------------
:func:`tune_global_threshold` scans thresholds 0.01..0.99 and keeps the one maximising micro-F1 on
validation data (Edin et al. 2023, "Automated medical coding on MIMIC-III and MIMIC-IV: a critical
review and replicability study", Sec. 4). :func:`tune_per_label_thresholds` picks, for every label,
the cut of its validation scores maximising that label's F1, from sorted cumulative counts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

__all__ = [
    "DEFAULT_KS",
    "METRIC_KEYS",
    "apply_threshold",
    "compute_multilabel_metrics",
    "make_compute_metrics",
    "metric_keys",
    "per_label_f1",
    "per_label_scores",
    "predictions_to_scores",
    "sigmoid",
    "threshold_grid",
    "tune_and_evaluate",
    "tune_global_threshold",
    "tune_per_label_thresholds",
]

DEFAULT_KS: tuple[int, ...] = (1, 5, 8, 15)
_CHUNK_CELLS = 1 << 22  # cells per processing chunk (bounds temporary memory to a few hundred MB)


def metric_keys(ks: Iterable[int] = DEFAULT_KS) -> list[str]:
    """Names of the keys returned by :func:`compute_multilabel_metrics` for the given ``ks``."""
    keys = [
        "micro_precision",
        "micro_recall",
        "micro_f1",
        "macro_precision",
        "macro_recall",
        "macro_f1",
        "macro_f1_harmonic",
        "micro_auc",
        "macro_auc",
    ]
    ks = list(ks)
    keys += [f"p@{k}" for k in ks] + [f"r@{k}" for k in ks]
    keys += ["map_label", "map_example", "hamming_loss", "example_f1", "subset_accuracy", "r_precision"]
    return keys


METRIC_KEYS: tuple[str, ...] = tuple(metric_keys())


# --------------------------------------------------------------------------------------------------
# input handling
# --------------------------------------------------------------------------------------------------
def _to_numpy(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor (dense or sparse)
        x = x.detach().cpu()
        if getattr(x, "is_sparse", False) or str(getattr(x, "layout", "")).endswith(
            ("sparse_coo", "sparse_csr")
        ):
            x = x.to_dense()
        if str(x.dtype) == "torch.bfloat16":
            x = x.float()
        return x.numpy()
    if hasattr(x, "toarray"):  # scipy sparse
        return np.asarray(x.toarray())
    try:
        return np.asarray(x)
    except ValueError as exc:  # ragged lists
        raise ValueError(
            f"{name} could not be turned into a 2-D array ({exc}); pass a rectangular (N, L) matrix, "
            "e.g. a multi-hot matrix rather than lists of label ids."
        ) from None


def _check_true(y_true: Any, name: str = "y_true") -> np.ndarray:
    y = _to_numpy(y_true, name)
    if y.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D (num_examples, num_labels) multi-hot matrix, got shape {y.shape}; "
            "for a single example pass y[None, :]."
        )
    if y.shape[0] == 0 or y.shape[1] == 0:
        raise ValueError(
            f"{name} is empty (shape {y.shape}); metrics need at least one example and one label."
        )
    if y.dtype == bool:
        return y
    if not np.all((y == 0) | (y == 1)):
        raise ValueError(
            f"{name} must contain only 0 and 1 (multi-hot); found other values. "
            "Binarise it first (e.g. y_true > 0) or convert label-id lists to a multi-hot matrix."
        )
    return y.astype(bool)


def _check_score(y_score: Any, shape: tuple[int, int] | None, name: str = "y_score") -> np.ndarray:
    s = _to_numpy(y_score, name)
    if s.ndim != 2:
        raise ValueError(
            f"{name} must be a 2-D (num_examples, num_labels) score matrix, got shape {s.shape}; "
            "for a single example pass s[None, :]."
        )
    if shape is not None and s.shape != shape:
        raise ValueError(f"y_true has shape {shape} but {name} has shape {s.shape}; they must match.")
    if s.dtype == np.float16:
        s = s.astype(np.float32)
    elif not np.issubdtype(s.dtype, np.floating):
        s = s.astype(np.float64)
    if not np.all(np.isfinite(s)):
        raise ValueError(f"{name} contains NaN or infinite values; check the model outputs.")
    return s


def _check_pair(y_true: Any, y_score: Any) -> tuple[np.ndarray, np.ndarray]:
    yt = _check_true(y_true)
    return yt, _check_score(y_score, yt.shape)


def _threshold_array(threshold: Any, num_labels: int, dtype: np.dtype) -> np.ndarray:
    t = _to_numpy(threshold, "threshold").astype(np.float64)
    if t.ndim == 0:
        pass
    elif t.shape != (num_labels,):
        raise ValueError(
            f"threshold must be a float or an array of shape ({num_labels},) (one per label), got shape {t.shape}."
        )
    if not np.all(np.isfinite(t)):
        raise ValueError("threshold contains NaN or infinite values.")
    return t.astype(dtype)


def _check_ks(ks: Iterable[int]) -> list[int]:
    ks = list(ks)
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"ks must be positive integers (e.g. (1, 5, 8, 15)), got {ks!r}.")
    return [int(k) for k in ks]


def _rows_per_chunk(width: int) -> int:
    return max(1, _CHUNK_CELLS // max(1, width))


def _safe_div(num: Any, den: Any, zero_division: float) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, float(zero_division), dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def _mean_or_nan(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else float("nan")


# --------------------------------------------------------------------------------------------------
# small public helpers
# --------------------------------------------------------------------------------------------------
def sigmoid(x: Any) -> np.ndarray:
    """Numerically stable logistic function ``1 / (1 + exp(-x))`` (float32 stays float32)."""
    x = _to_numpy(x, "x")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    out = np.empty_like(x)
    pos = x >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-x[pos]))
    ex = np.exp(x[~pos])
    out[~pos] = ex / (1.0 + ex)
    return out


def predictions_to_scores(predictions: Any, from_logits: bool = True) -> np.ndarray:
    """Turn ``EvalPrediction.predictions`` (logits, or a tuple whose first item is the logits) into
    an (N, L) probability matrix; ``from_logits=False`` keeps values as they are.

    The float dtype is kept (integers / float16 become float32). float32 scores take the faster
    sort-free paths of the ranking metrics and per-label tuning; float64 is exact too, only slower.
    """
    if isinstance(predictions, (tuple, list)) and len(predictions) > 0 and not np.isscalar(predictions[0]):
        first = predictions[0]
        # a tuple of model outputs (logits, hidden, ...) vs. a plain nested list of scores
        if _to_numpy(first, "predictions").ndim == 2:
            predictions = first
    scores = _to_numpy(predictions, "predictions")
    if not np.issubdtype(scores.dtype, np.floating) or scores.dtype == np.float16:
        scores = scores.astype(np.float32)
    return sigmoid(scores) if from_logits else scores


def apply_threshold(y_score: Any, threshold: Any = 0.5) -> np.ndarray:
    """Boolean predictions ``y_score >= threshold``; threshold a float or an (L,) per-label array."""
    s = _check_score(y_score, None)
    return s >= _threshold_array(threshold, s.shape[1], s.dtype)


def threshold_grid() -> np.ndarray:
    """The global-threshold grid 0.01, 0.02, ..., 0.99 (Edin et al. 2023)."""
    return np.round(np.arange(1, 100, dtype=np.float64) / 100.0, 2)


# --------------------------------------------------------------------------------------------------
# count-based metrics
# --------------------------------------------------------------------------------------------------
def per_label_scores(y_true: Any, y_pred: Any, zero_division: float = 0.0) -> dict[str, np.ndarray]:
    """Per-label precision, recall, F1 and support (sklearn ``average=None`` semantics).

    F1_l = 2 TP_l / (2 TP_l + FP_l + FN_l), the harmonic mean of P_l and R_l when defined.
    """
    yt = _check_true(y_true)
    yp = _check_true(y_pred, "y_pred")
    if yp.shape != yt.shape:
        raise ValueError(f"y_true has shape {yt.shape} but y_pred has shape {yp.shape}; they must match.")
    tp = np.count_nonzero(yt & yp, axis=0)
    n_pred = np.count_nonzero(yp, axis=0)
    n_true = np.count_nonzero(yt, axis=0)
    return {
        "precision": _safe_div(tp, n_pred, zero_division),
        "recall": _safe_div(tp, n_true, zero_division),
        "f1": _safe_div(2 * tp, n_pred + n_true, zero_division),
        "support": n_true,
    }


def per_label_f1(y_true: Any, y_pred: Any, zero_division: float = 0.0) -> np.ndarray:
    """(L,) per-label F1 = 2TP / (2TP + FP + FN); 0/0 (never positive, never predicted) -> zero_division.

    ``y_pred`` is the binary prediction matrix (use :func:`apply_threshold` on scores).
    """
    return per_label_scores(y_true, y_pred, zero_division)["f1"]


# --------------------------------------------------------------------------------------------------
# ranking metrics
# --------------------------------------------------------------------------------------------------
def _rowwise_ap_auc(scores: np.ndarray, truth: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def _monotone_u32(s: np.ndarray) -> np.ndarray:
    """Map float32 values to uint32 keys with the same order (IEEE-754 sign/magnitude trick)."""
    bits = (s.astype(np.float32, copy=False) + np.float32(0.0)).view(np.uint32)  # -0.0 becomes +0.0
    return np.where(bits >= np.uint32(0x80000000), ~bits, bits | np.uint32(0x80000000))


def _grouped_ap_auc(
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
    key = _monotone_u32(scores).astype(np.uint64)
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


def _float32_exact(ys: np.ndarray) -> bool:
    return ys.dtype == np.float32 or bool(np.array_equal(ys.astype(np.float32), ys))


def _per_label_ap_auc(yt: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    n, num_labels = ys.shape
    step = _rows_per_chunk(n)
    fast = _float32_exact(ys)
    ap = np.empty(num_labels)
    auc = np.empty(num_labels)
    for c0 in range(0, num_labels, step):  # chunks of labels, not a per-label loop
        c1 = min(num_labels, c0 + step)
        if fast:
            ap[c0:c1], auc[c0:c1] = _grouped_ap_auc(ys[:, c0:c1], yt[:, c0:c1], groups_are_rows=False)
        else:
            ap[c0:c1], auc[c0:c1] = _rowwise_ap_auc(
                np.ascontiguousarray(ys[:, c0:c1].T), np.ascontiguousarray(yt[:, c0:c1].T)
            )
    return ap, auc


def _per_example_ap(yt: np.ndarray, ys: np.ndarray) -> np.ndarray:
    n, num_labels = ys.shape
    step = _rows_per_chunk(num_labels)
    fast = _float32_exact(ys)
    ap = np.empty(n)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        if fast:
            ap[r0:r1], _ = _grouped_ap_auc(ys[r0:r1], yt[r0:r1], groups_are_rows=True)
        else:
            ap[r0:r1], _ = _rowwise_ap_auc(ys[r0:r1], yt[r0:r1])
    return ap


def _micro_auc(yt: np.ndarray, ys: np.ndarray) -> float:
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
    step = _rows_per_chunk(ys.shape[1])
    for r0 in range(0, ys.shape[0], step):
        chunk = np.sort(ys[r0 : r0 + step], axis=None)
        left = np.searchsorted(chunk, pos, side="left")
        right = np.searchsorted(chunk, pos, side="right")
        twice += int(left.sum(dtype=np.int64) + right.sum(dtype=np.int64))
    return (twice - n_pos * n_pos) / 2.0 / (float(n_pos) * float(n_neg))


def _ranked_hits(yt: np.ndarray, ys: np.ndarray, depth: int) -> np.ndarray:
    """(N, depth) cumulative count of true labels among each example's ``depth`` top-scored labels."""
    n, num_labels = ys.shape
    depth = min(depth, num_labels)
    out = np.empty((n, depth), dtype=np.int64)
    step = _rows_per_chunk(num_labels)
    for r0 in range(0, n, step):
        s = ys[r0 : r0 + step]
        neg = -s
        if depth < num_labels:
            cand = np.argpartition(neg, depth - 1, axis=1)[:, :depth]
        else:
            cand = np.broadcast_to(np.arange(num_labels), s.shape)
        order = np.argsort(np.take_along_axis(neg, cand, axis=1), axis=1, kind="stable")
        top = np.take_along_axis(cand, order, axis=1)
        out[r0 : r0 + step] = np.cumsum(np.take_along_axis(yt[r0 : r0 + step], top, axis=1), axis=1)
    return out


# --------------------------------------------------------------------------------------------------
# the main entry point
# --------------------------------------------------------------------------------------------------
def compute_multilabel_metrics(
    y_true: Any,
    y_score: Any,
    threshold: float | np.ndarray = 0.5,
    ks: Sequence[int] = DEFAULT_KS,
    zero_division: float = 0.0,
) -> dict[str, float]:
    """All multi-label metrics of one split, as plain floats.

    Args:
        y_true: (N, L) multi-hot ground truth.
        y_score: (N, L) scores (probabilities); predictions are ``y_score >= threshold``.
        threshold: a float or an (L,) array of per-label thresholds (see :func:`tune_global_threshold`,
            :func:`tune_per_label_thresholds`).
        ks: cut-offs for P@k / R@k.
        zero_division: value of every 0/0 (see the module docstring).

    Returns: a dict with keys ``micro_precision micro_recall micro_f1 macro_precision macro_recall
    macro_f1 macro_f1_harmonic micro_auc macro_auc p@k r@k (each k) map_label map_example hamming_loss
    example_f1 subset_accuracy r_precision`` (see :func:`metric_keys`).

    Definitions: micro/macro P, R, F1 as in sklearn (Tsoumakas et al. 2010); ``macro_f1_harmonic`` =
    2 P_M R_M / (P_M + R_M) (Mullenbach et al. 2018, CAML; Huang et al. 2022, PLM-ICD); AUC = ROC area;
    P@k = |top_k ∩ Y| / min(k, L), R@k = |top_k ∩ Y| / |Y| (CAML); ``map_label`` = mean over labels of
    average precision, ``map_example`` = mean over examples of AP of its label ranking;
    Hamming loss = (FP + FN) / (N L); example F1 = mean_i 2|Ŷ_i ∩ Y_i| / (|Ŷ_i| + |Y_i|); subset
    accuracy = fraction with Ŷ_i = Y_i; R-precision = mean_i |top_{|Y_i|} ∩ Y_i| / |Y_i|.
    """
    yt, ys = _check_pair(y_true, y_score)
    ks = _check_ks(ks)
    n, num_labels = yt.shape
    thr = _threshold_array(threshold, num_labels, ys.dtype)

    tp_l = np.zeros(num_labels, dtype=np.int64)
    pred_l = np.zeros(num_labels, dtype=np.int64)
    tp_e = np.empty(n, dtype=np.int64)
    pred_e = np.empty(n, dtype=np.int64)
    step = _rows_per_chunk(num_labels)
    for r0 in range(0, n, step):  # row chunks bound the (N, L) boolean temporaries
        yp = ys[r0 : r0 + step] >= thr
        tp_cell = yt[r0 : r0 + step] & yp
        tp_l += np.count_nonzero(tp_cell, axis=0)
        pred_l += np.count_nonzero(yp, axis=0)
        tp_e[r0 : r0 + step] = np.count_nonzero(tp_cell, axis=1)
        pred_e[r0 : r0 + step] = np.count_nonzero(yp, axis=1)
    del yp, tp_cell
    true_l = np.count_nonzero(yt, axis=0)
    true_e = np.count_nonzero(yt, axis=1)
    tp, n_pred, n_true = int(tp_l.sum()), int(pred_l.sum()), int(true_l.sum())
    zd = zero_division

    out: dict[str, float] = {}
    out["micro_precision"] = float(_safe_div(tp, n_pred, zd))
    out["micro_recall"] = float(_safe_div(tp, n_true, zd))
    out["micro_f1"] = float(_safe_div(2 * tp, n_pred + n_true, zd))
    p_l = _safe_div(tp_l, pred_l, zd)
    r_l = _safe_div(tp_l, true_l, zd)
    f1_l = _safe_div(2 * tp_l, pred_l + true_l, zd)
    mp, mr = float(p_l.mean()), float(r_l.mean())
    out["macro_precision"] = mp
    out["macro_recall"] = mr
    out["macro_f1"] = float(f1_l.mean())
    out["macro_f1_harmonic"] = float(_safe_div(2 * mp * mr, mp + mr, zd))

    ap_l, auc_l = _per_label_ap_auc(yt, ys)
    out["micro_auc"] = _micro_auc(yt, ys)
    out["macro_auc"] = _mean_or_nan(auc_l[~np.isnan(auc_l)])

    depth = max(max(ks, default=1), int(true_e.max()))
    hits = _ranked_hits(yt, ys, depth)
    for k in ks:
        kk = min(k, num_labels)
        out[f"p@{k}"] = float(np.mean(hits[:, kk - 1] / kk))
    for k in ks:
        kk = min(k, num_labels)
        out[f"r@{k}"] = float(np.mean(_safe_div(hits[:, kk - 1], true_e, zd)))

    out["map_label"] = _mean_or_nan(ap_l[~np.isnan(ap_l)])
    ap_e = _per_example_ap(yt, ys)
    out["map_example"] = float(np.mean(np.where(np.isnan(ap_e), zd, ap_e)))

    fp_fn = (pred_e - tp_e) + (true_e - tp_e)
    out["hamming_loss"] = float(fp_fn.sum() / (n * num_labels))
    out["example_f1"] = float(np.mean(_safe_div(2 * tp_e, pred_e + true_e, zd)))
    out["subset_accuracy"] = float(np.mean(fp_fn == 0))
    hits_at_r = np.take_along_axis(hits, np.maximum(true_e - 1, 0)[:, None], axis=1)[:, 0]
    out["r_precision"] = float(np.mean(_safe_div(np.where(true_e > 0, hits_at_r, 0), true_e, zd)))
    return {k: out[k] for k in metric_keys(ks)}


# --------------------------------------------------------------------------------------------------
# threshold tuning
# --------------------------------------------------------------------------------------------------
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
    yt, ys = _check_pair(y_true, y_score)
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
    step = _rows_per_chunk(ys.shape[1])
    for r0 in range(0, ys.shape[0], step):
        pred += _count_ge(ys[r0 : r0 + step].ravel())
    f1 = _safe_div(2 * tp, pred + int(yt.sum()), 0.0)
    return float(g64[int(np.argmax(f1))])


def _midpoint_threshold(hi: np.ndarray, lo: np.ndarray, has_lower: np.ndarray) -> np.ndarray:
    """Threshold between the last predicted score ``hi`` and the first rejected one ``lo`` (same dtype)."""
    mid = (hi / 2 + lo / 2).astype(hi.dtype)
    return np.where(~has_lower | (mid <= lo), hi, mid)


def _best_cuts_argsort(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per-row best-F1 threshold from an argsort of each row (any float dtype)."""
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
    return _midpoint_threshold(s[rows, best], s[rows, np.minimum(best + 1, n - 1)], best < n - 1)


def _best_cuts_keys(scores: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per-column best-F1 threshold for float32-exact scores, without argsort.

    The optimal cut always predicts "score >= s_p" for some positive p (adding negatives only lowers
    F1), whose F1 is 2 pos_ge / (n_ge + P) with the counts of :func:`_grouped_ap_auc`. The best
    positive of each label is found with one lexsort of the positives (F1 desc, then fewer predictions);
    the next lower score of the label is the sorted key just before p's block.
    """
    n, c = scores.shape
    key = _monotone_u32(scores).astype(np.uint64) | (np.arange(c, dtype=np.uint64)[None, :] << np.uint64(32))
    pos = key[truth]
    out = np.zeros(c, dtype=scores.dtype)
    if pos.size == 0:
        return out
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
    hi = _decode_u32((pos[first] & low_mask).astype(np.uint32))
    lo = _decode_u32((key[np.maximum(ge_idx[first] - 1, 0)] & low_mask).astype(np.uint32))
    out[g] = _midpoint_threshold(hi, lo, has_lower)
    return out


def _decode_u32(k: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_monotone_u32`."""
    bits = np.where(k >= np.uint32(0x80000000), k ^ np.uint32(0x80000000), ~k).astype(np.uint32)
    return bits.view(np.float32)


def tune_per_label_thresholds(y_true: Any, y_score: Any, default: float | None = None) -> np.ndarray:
    """(L,) thresholds, each maximising its label's F1 on validation data.

    For every label, with tp_k the cumulative positives among its k top scores, F1 of predicting the
    top k is 2 tp_k / (k + P) (sorted cumulative counts; chunks of labels at a time, float32 scores via
    packed sort keys + searchsorted, other dtypes via argsort). Only cuts between distinct scores are
    allowed (tied scores are predicted together). The threshold is the midpoint between the last
    predicted and the first rejected score (the lowest score when all are predicted), so
    ``score >= threshold`` reproduces the optimal cut. Ties in F1 go to the cut with fewer predictions.
    Labels without any positive in the validation data (F1 is 0 whatever the threshold) get
    ``default``; ``default=None`` uses :func:`tune_global_threshold`.
    """
    yt, ys = _check_pair(y_true, y_score)
    n, num_labels = ys.shape
    out = np.empty(num_labels, dtype=np.float64)
    no_positive = ~yt.any(axis=0)
    fast = _float32_exact(ys)
    step = _rows_per_chunk(n)
    for c0 in range(0, num_labels, step):  # chunks of labels
        c1 = min(num_labels, c0 + step)
        if fast:
            out[c0:c1] = _best_cuts_keys(ys[:, c0:c1].astype(np.float32), yt[:, c0:c1])
        else:
            out[c0:c1] = _best_cuts_argsort(
                np.ascontiguousarray(ys[:, c0:c1].T), np.ascontiguousarray(yt[:, c0:c1].T)
            )
    if no_positive.any():
        fill = tune_global_threshold(yt, ys) if default is None else float(default)
        out[no_positive] = fill
    return out


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


def make_compute_metrics(
    threshold: float | np.ndarray = 0.5, ks: Sequence[int] = DEFAULT_KS, from_logits: bool = True
) -> Callable[[Any], dict[str, float]]:
    """A ``compute_metrics`` callable for ``transformers.Trainer`` (takes an ``EvalPrediction``).

    Logits go through :func:`sigmoid` (``from_logits=True``); NaN metrics are dropped so the Trainer's
    logging never sees them.
    """
    ks = tuple(_check_ks(ks))

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        if hasattr(eval_pred, "predictions"):
            predictions, labels = eval_pred.predictions, eval_pred.label_ids
        else:
            predictions, labels = eval_pred
        scores = predictions_to_scores(predictions, from_logits=from_logits)
        labels = _to_numpy(labels, "label_ids")
        result = compute_multilabel_metrics(labels > 0.5, scores, threshold=threshold, ks=ks)
        return {k: v for k, v in result.items() if not np.isnan(v)}

    return compute_metrics
