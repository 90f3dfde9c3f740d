"""Metric inputs: label and score matrices turned into checked numpy arrays, logits into probabilities.

Every metric and threshold function of :mod:`hf_mlcl.evaluation` takes its inputs through these
checks, so a bad input fails with one message naming the fix (shape, 0/1 values, NaN scores, ...).
``y_true`` may be numpy, torch (dense or sparse) or scipy sparse; float16 / bfloat16 scores become
float32, integer scores float64. Big matrices are processed in row chunks of about
``CHUNK_CELLS`` cells (:func:`rows_per_chunk`) to bound temporary memory.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = [
    "CHUNK_CELLS",
    "apply_threshold",
    "check_ks",
    "check_pair",
    "check_score",
    "check_true",
    "mean_or_nan",
    "predictions_to_scores",
    "rows_per_chunk",
    "safe_div",
    "sigmoid",
    "threshold_array",
    "to_numpy",
]

CHUNK_CELLS = 1 << 22  # cells per processing chunk (bounds temporary memory to a few hundred MB)


def to_numpy(x: Any, name: str) -> np.ndarray:
    if hasattr(x, "detach") and hasattr(x, "cpu"):  # torch tensor (dense or sparse)
        x = x.detach().cpu()
        if str(x.layout) != "torch.strided":  # any sparse layout: COO, CSR, CSC, BSR, BSC
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


def check_true(y_true: Any, name: str = "y_true") -> np.ndarray:
    y = to_numpy(y_true, name)
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


def check_score(y_score: Any, shape: tuple[int, int] | None, name: str = "y_score") -> np.ndarray:
    s = to_numpy(y_score, name)
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


def check_pair(y_true: Any, y_score: Any) -> tuple[np.ndarray, np.ndarray]:
    yt = check_true(y_true)
    return yt, check_score(y_score, yt.shape)


def threshold_array(threshold: Any, num_labels: int, dtype: np.dtype) -> np.ndarray:
    t = to_numpy(threshold, "threshold").astype(np.float64)
    if t.ndim == 0:
        pass
    elif t.shape != (num_labels,):
        raise ValueError(
            f"threshold must be a float or an array of shape ({num_labels},) (one per label), got shape {t.shape}."
        )
    if not np.all(np.isfinite(t)):
        raise ValueError("threshold contains NaN or infinite values.")
    return t.astype(dtype)


def check_ks(ks: Iterable[int]) -> list[int]:
    ks = list(ks)
    for k in ks:
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
            raise ValueError(f"ks must be positive integers (e.g. (1, 5, 8, 15)), got {ks!r}.")
    return [int(k) for k in ks]


def rows_per_chunk(width: int) -> int:
    return max(1, CHUNK_CELLS // max(1, width))


def safe_div(num: Any, den: Any, zero_division: float) -> np.ndarray:
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.full(np.broadcast(num, den).shape, float(zero_division), dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def mean_or_nan(x: np.ndarray) -> float:
    return float(np.mean(x)) if x.size else float("nan")


def sigmoid(x: Any) -> np.ndarray:
    """Numerically stable logistic function ``1 / (1 + exp(-x))`` (float32 stays float32)."""
    x = to_numpy(x, "x")
    if not np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float64)
    e = np.exp(-np.abs(x))  # exp(-x) for x >= 0, exp(x) below: never overflows
    den = 1.0 + e
    out = np.divide(e, den)  # e / (1 + e) for x < 0
    np.divide(1.0, den, out=out, where=x >= 0)  # 1 / (1 + e) for x >= 0
    return out


def predictions_to_scores(predictions: Any, from_logits: bool = True) -> np.ndarray:
    """Turn ``EvalPrediction.predictions`` (logits, or a tuple whose first item is the logits) into
    an (N, L) probability matrix; ``from_logits=False`` keeps values as they are.

    The float dtype is kept (integers / float16 become float32). float32 scores take the faster
    sort-free paths of the ranking metrics and per-label tuning; float64 is exact too, only slower. float32
    rounds the sigmoid of a logit above about 16.6 to 1, and of one below about -87 to a subnormal or 0, which
    would tie those cells in every ranking metric: logits that reach either end are turned into float64
    probabilities (distinct up to logits of about 36 and down to about -745).
    """
    if isinstance(predictions, (tuple, list)) and len(predictions) > 0 and not np.isscalar(predictions[0]):
        first = predictions[0]
        # a tuple of model outputs (logits, hidden, ...) vs. a plain nested list of scores
        if to_numpy(first, "predictions").ndim == 2:
            predictions = first
    scores = to_numpy(predictions, "predictions")
    if not np.issubdtype(scores.dtype, np.floating) or scores.dtype == np.float16:
        scores = scores.astype(np.float32)
    if not from_logits:
        return scores
    probabilities = sigmoid(scores)
    if probabilities.dtype == np.float32 and (
        (probabilities == 1).any() or (probabilities < np.finfo(np.float32).tiny).any()
    ):
        probabilities = sigmoid(scores.astype(np.float64))
    return probabilities


def apply_threshold(y_score: Any, threshold: Any = 0.5) -> np.ndarray:
    """Boolean predictions ``y_score >= threshold``; threshold a float or an (L,) per-label array."""
    s = check_score(y_score, None)
    return s >= threshold_array(threshold, s.shape[1], s.dtype)
