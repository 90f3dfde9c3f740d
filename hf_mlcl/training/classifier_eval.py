"""`ClassifierEvaluation`: what the trainers that produce a classifier share (the probe and the joint objective):
logits as predictions, the multi-label metrics at the current threshold, and the validation-tuned threshold.

References: threshold tuning, Edin et al. 2023.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hf_mlcl.evaluation.inputs import sigmoid
from hf_mlcl.labels.multihot import to_dense_float

__all__ = ["ClassifierEvaluation"]


class ClassifierEvaluation:
    """A mixin for a ``MultiLabelTrainer`` whose model returns ``logits`` and whose arguments carry
    ``threshold`` / ``fixed_threshold`` (:class:`~hf_mlcl.training.arguments.DecisionThresholdArguments`).

    ``evaluate()`` reports the metrics at threshold 0.5 (or the fixed / tuned threshold once
    :meth:`tune_threshold` ran); :meth:`predict_scores`, :meth:`tune_threshold` and :meth:`split_metrics`
    implement the validation-tuned test protocol. ``compute_loss(..., return_outputs=True)`` must return
    ``(loss, outputs)`` with the outputs' ``logits``.
    """

    threshold: float | np.ndarray

    def start_threshold(self, args: Any) -> None:
        """The threshold before tuning: the fixed one of ``args``, else 0.5."""
        fixed = args.fixed_threshold
        self.threshold = fixed if fixed is not None else 0.5

    def default_metrics(self) -> Any:
        return self._metrics

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """The loss, the logits (float) and the dense labels of one evaluation batch."""
        inputs = self._prepare_inputs(inputs)
        _, labels = self.split_labels(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
        if prediction_loss_only:
            return loss.detach(), None, None
        return loss.detach(), logits.detach().float(), to_dense_float(labels)

    def _metrics(self, eval_pred) -> dict[str, float]:
        scores = sigmoid(np.asarray(eval_pred.predictions, dtype=np.float64))
        return self.split_metrics(scores, np.asarray(eval_pred.label_ids) > 0.5, None)

    def predict_scores(self, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities (N, L), multi-hot truth (N, L)) of a dataset with the current model."""
        out = self.predict(dataset, metric_key_prefix="predict")
        return sigmoid(np.asarray(out.predictions, dtype=np.float64)), np.asarray(out.label_ids) > 0.5

    def tune_threshold(self, scores: np.ndarray, truth: np.ndarray) -> float | np.ndarray:
        """Set and return ``self.threshold`` per ``args.threshold`` from validation scores."""
        from hf_mlcl.evaluation.thresholds import tune_global_threshold, tune_per_label_thresholds

        if self.args.fixed_threshold is not None:
            self.threshold = float(self.args.fixed_threshold)
        elif str(self.args.threshold) == "global":
            self.threshold = float(tune_global_threshold(truth, scores))
        else:
            self.threshold = np.asarray(tune_per_label_thresholds(truth, scores), dtype=np.float64)
        return self.threshold

    def split_metrics(self, scores: np.ndarray, truth: np.ndarray, prefix: str | None) -> dict[str, float]:
        """``compute_multilabel_metrics`` at the current threshold (NaN metrics left out), keys prefixed
        ``<prefix>_`` (none with ``prefix=None``)."""
        from hf_mlcl.evaluation.metrics import compute_multilabel_metrics

        result = compute_multilabel_metrics(truth, scores, threshold=self.threshold)
        head = "" if prefix is None else f"{prefix}_"
        return {f"{head}{k}": float(v) for k, v in result.items() if not np.isnan(v)}
