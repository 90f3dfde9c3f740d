"""Multi-label classification scores (counts and rankings) of one split, vectorised in numpy.

:func:`compute_multilabel_metrics` (micro / macro F1, P@k, R@k, AUC, AP, ...), :func:`per_label_scores` and
:func:`per_label_f1`, with one set of conventions for thresholds, 0/0 and undefined scores.

References: CAML, Mullenbach et al. 2018; PLM-ICD, Huang et al. 2022.
Design: docs/design.md, "Metric conventions (hf_mlcl/evaluation/metrics.py)".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import (
    check_ks,
    check_pair,
    check_true,
    mean_or_nan,
    rows_per_chunk,
    safe_div,
    threshold_array,
)
from hf_mlcl.evaluation.ranking import micro_auc, per_example_ap, per_label_ap_auc, ranked_hits

__all__ = [
    "DEFAULT_KS",
    "METRIC_KEYS",
    "compute_multilabel_metrics",
    "metric_keys",
    "per_label_f1",
    "per_label_scores",
]

DEFAULT_KS: tuple[int, ...] = (1, 5, 8, 15)


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


def per_label_scores(y_true: Any, y_pred: Any, zero_division: float = 0.0) -> dict[str, np.ndarray]:
    """Per-label precision, recall, F1 and support (sklearn ``average=None`` semantics).

    F1_l = 2 TP_l / (2 TP_l + FP_l + FN_l), the harmonic mean of P_l and R_l when defined.
    """
    yt = check_true(y_true)
    yp = check_true(y_pred, "y_pred")
    if yp.shape != yt.shape:
        raise ValueError(f"y_true has shape {yt.shape} but y_pred has shape {yp.shape}; they must match.")
    tp = np.count_nonzero(yt & yp, axis=0)
    n_pred = np.count_nonzero(yp, axis=0)
    n_true = np.count_nonzero(yt, axis=0)
    return {
        "precision": safe_div(tp, n_pred, zero_division),
        "recall": safe_div(tp, n_true, zero_division),
        "f1": safe_div(2 * tp, n_pred + n_true, zero_division),
        "support": n_true,
    }


def per_label_f1(y_true: Any, y_pred: Any, zero_division: float = 0.0) -> np.ndarray:
    """(L,) per-label F1 = 2TP / (2TP + FP + FN); 0/0 (never positive, never predicted) -> zero_division.

    ``y_pred`` is the binary prediction matrix (use :func:`apply_threshold` on scores).
    """
    return per_label_scores(y_true, y_pred, zero_division)["f1"]


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
    yt, ys = check_pair(y_true, y_score)
    ks = check_ks(ks)
    n, num_labels = yt.shape
    thr = threshold_array(threshold, num_labels, ys.dtype)

    tp_l = np.zeros(num_labels, dtype=np.int64)
    pred_l = np.zeros(num_labels, dtype=np.int64)
    tp_e = np.empty(n, dtype=np.int64)
    pred_e = np.empty(n, dtype=np.int64)
    step = rows_per_chunk(num_labels)
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
    out["micro_precision"] = float(safe_div(tp, n_pred, zd))
    out["micro_recall"] = float(safe_div(tp, n_true, zd))
    out["micro_f1"] = float(safe_div(2 * tp, n_pred + n_true, zd))
    p_l = safe_div(tp_l, pred_l, zd)
    r_l = safe_div(tp_l, true_l, zd)
    f1_l = safe_div(2 * tp_l, pred_l + true_l, zd)
    mp, mr = float(p_l.mean()), float(r_l.mean())
    out["macro_precision"] = mp
    out["macro_recall"] = mr
    out["macro_f1"] = float(f1_l.mean())
    # P_M = R_M = 0 is a wrong classifier (F = 0 as in sklearn), not a 0/0 to fill with zero_division
    out["macro_f1_harmonic"] = 0.0 if mp + mr == 0 else float(safe_div(2 * mp * mr, mp + mr, zd))

    ap_l, auc_l = per_label_ap_auc(yt, ys)
    out["micro_auc"] = micro_auc(yt, ys)
    out["macro_auc"] = mean_or_nan(auc_l[~np.isnan(auc_l)])

    hits, hits_at_r = ranked_hits(yt, ys, max(ks, default=1))
    for k in ks:
        kk = min(k, num_labels)
        out[f"p@{k}"] = float(np.mean(hits[:, kk - 1] / kk))
    for k in ks:
        kk = min(k, num_labels)
        out[f"r@{k}"] = float(np.mean(safe_div(hits[:, kk - 1], true_e, zd)))

    out["map_label"] = mean_or_nan(ap_l[~np.isnan(ap_l)])
    ap_e = per_example_ap(yt, ys)
    out["map_example"] = float(np.mean(np.where(np.isnan(ap_e), zd, ap_e)))

    fp_fn = (pred_e - tp_e) + (true_e - tp_e)
    out["hamming_loss"] = float(fp_fn.sum() / (n * num_labels))
    out["example_f1"] = float(np.mean(safe_div(2 * tp_e, pred_e + true_e, zd)))
    out["subset_accuracy"] = float(np.mean(fp_fn == 0))
    out["r_precision"] = float(np.mean(safe_div(hits_at_r, true_e, zd)))
    return {k: out[k] for k in metric_keys(ks)}
