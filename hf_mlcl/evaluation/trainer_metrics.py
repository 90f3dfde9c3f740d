"""The ``compute_metrics`` adapter: multi-label metrics for ``transformers.Trainer`` evaluation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import check_ks, predictions_to_scores, to_numpy
from hf_mlcl.evaluation.metrics import DEFAULT_KS, compute_multilabel_metrics
from hf_mlcl.evaluation.streaming import MultiLabelAccumulator

__all__ = ["make_compute_metrics"]


def make_compute_metrics(
    threshold: float | np.ndarray = 0.5, ks: Sequence[int] = DEFAULT_KS, from_logits: bool = True
) -> Callable[..., dict[str, float]]:
    """A ``compute_metrics`` callable for ``transformers.Trainer`` (takes an ``EvalPrediction``).

    Logits go through :func:`sigmoid` (``from_logits=True``); NaN metrics are dropped so the Trainer's
    logging never sees them. With ``TrainingArguments(batch_eval_metrics=True)`` the Trainer calls it
    once a batch with ``compute_result``: the batches stream into a
    :class:`~hf_mlcl.evaluation.MultiLabelAccumulator` (float32 scores for float32 logits) and the metrics
    come with the last one, without the (N, L) predictions ever held. Streamed float32 probabilities of logits
    above about 16.6 round to 1 and tie in the ranking metrics; the whole split in one call switches to float64
    then (:func:`~hf_mlcl.evaluation.predictions_to_scores`), as the final evaluation of a classifier does.
    """
    ks = tuple(check_ks(ks))
    state: dict[str, Any] = {}

    def _split(eval_pred: Any) -> tuple[Any, Any]:
        if hasattr(eval_pred, "predictions"):
            return eval_pred.predictions, eval_pred.label_ids
        return eval_pred

    def compute_metrics(eval_pred: Any, compute_result: bool | None = None) -> dict[str, float]:
        predictions, labels = _split(eval_pred)
        if compute_result is None:
            scores = predictions_to_scores(predictions, from_logits=from_logits)
            labels = to_numpy(labels, "label_ids")
            result = compute_multilabel_metrics(labels > 0.5, scores, threshold=threshold, ks=ks)
        else:
            if isinstance(predictions, (tuple, list)):
                predictions = predictions[0]
            predictions = to_numpy(predictions, "predictions")
            dtype = np.float64 if predictions.dtype == np.float64 else np.float32  # as predictions_to_scores
            acc = state.pop("acc", None) or MultiLabelAccumulator(
                thresholds=[threshold], ks=ks, from_logits=from_logits, score_dtype=dtype
            )
            acc.add_batch(predictions, to_numpy(labels, "label_ids") > 0.5)
            if not compute_result:
                state["acc"] = acc
                return {}
            result = acc.compute(threshold)
        return {k: v for k, v in result.items() if not np.isnan(v)}

    return compute_metrics
