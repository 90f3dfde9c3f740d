"""The ``compute_metrics`` adapter: multi-label metrics for ``transformers.Trainer`` evaluation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import check_ks, predictions_to_scores, to_numpy
from hf_mlcl.evaluation.metrics import DEFAULT_KS, compute_multilabel_metrics

__all__ = ["make_compute_metrics"]


def make_compute_metrics(
    threshold: float | np.ndarray = 0.5, ks: Sequence[int] = DEFAULT_KS, from_logits: bool = True
) -> Callable[[Any], dict[str, float]]:
    """A ``compute_metrics`` callable for ``transformers.Trainer`` (takes an ``EvalPrediction``).

    Logits go through :func:`sigmoid` (``from_logits=True``); NaN metrics are dropped so the Trainer's
    logging never sees them.
    """
    ks = tuple(check_ks(ks))

    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        if hasattr(eval_pred, "predictions"):
            predictions, labels = eval_pred.predictions, eval_pred.label_ids
        else:
            predictions, labels = eval_pred
        scores = predictions_to_scores(predictions, from_logits=from_logits)
        labels = to_numpy(labels, "label_ids")
        result = compute_multilabel_metrics(labels > 0.5, scores, threshold=threshold, ks=ks)
        return {k: v for k, v in result.items() if not np.isnan(v)}

    return compute_metrics
