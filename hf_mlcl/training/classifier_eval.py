"""`ClassifierEvaluation`: what the trainers that produce a classifier share (the probe and the joint objective):
logits as predictions, the multi-label metrics at the current threshold, and the validation-tuned threshold.

A split is scored in one streamed pass (:meth:`ClassifierEvaluation.predict_evaluation`: Trainer's
``batch_eval_metrics`` loop into a :class:`~hf_mlcl.evaluation.MultiLabelAccumulator`), so no (N, L) array
is held at large label counts; ``compute_metrics`` streams too under ``batch_eval_metrics=True``.

References: threshold tuning, Edin et al. 2023.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from hf_mlcl.evaluation.inputs import rows_per_chunk, sigmoid
from hf_mlcl.evaluation.streaming import EXACT_CELLS, MultiLabelAccumulator
from hf_mlcl.labels.multihot import to_dense_float

logger = logging.getLogger(__name__)

__all__ = ["ClassifierEvaluation"]


class ClassifierEvaluation:
    """A mixin for a ``MultiLabelTrainer`` whose model returns ``logits`` and whose arguments carry
    ``threshold`` / ``fixed_threshold`` (:class:`~hf_mlcl.training.arguments.DecisionThresholdArguments`).

    ``evaluate()`` reports the metrics at threshold 0.5 (or the fixed / tuned threshold once
    :meth:`tune_threshold` ran); :meth:`predict_evaluation` (or :meth:`predict_scores` for dense arrays),
    :meth:`tune_threshold` and :meth:`split_metrics` implement the validation-tuned test protocol.
    ``compute_loss(..., return_outputs=True)`` must return ``(loss, outputs)`` with the outputs' ``logits``.
    Splits of up to ``exact_eval_cells`` rows x labels are scored exactly; above, AUC / label mAP and
    per-label thresholds come from histograms (:mod:`hf_mlcl.evaluation.streaming`).
    """

    threshold: float | np.ndarray
    exact_eval_cells: int = EXACT_CELLS

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

    def new_accumulator(self) -> MultiLabelAccumulator:
        """An empty :class:`MultiLabelAccumulator` of logits that counts at the current threshold."""
        return MultiLabelAccumulator(thresholds=[self.threshold], exact_cells=self.exact_eval_cells)

    def _metrics(self, eval_pred, compute_result: bool | None = None) -> dict[str, float]:
        """``compute_metrics``: the metrics at the current threshold. Under ``batch_eval_metrics=True`` the
        Trainer passes one batch at a time (``compute_result`` on the last), streamed into an accumulator."""
        if compute_result is not None:
            acc = getattr(self, "_batch_metrics", None) or self.new_accumulator()
            acc.add_batch(eval_pred.predictions, eval_pred.label_ids)
            self._batch_metrics = None if compute_result else acc
            return self.split_metrics(acc, None, None) if compute_result else {}
        predictions, labels = np.asarray(eval_pred.predictions), np.asarray(eval_pred.label_ids)
        if predictions.size <= self.exact_eval_cells:
            scores = sigmoid(np.asarray(predictions, dtype=np.float64))
            return self.split_metrics(scores, labels > 0.5, None)
        acc = self.new_accumulator()
        step = rows_per_chunk(predictions.shape[1])
        for r0 in range(0, predictions.shape[0], step):
            acc.add_batch(predictions[r0 : r0 + step], labels[r0 : r0 + step] > 0.5)
        return self.split_metrics(acc, None, None)

    prediction_split = "test"  # the split a prediction pass reads (named in logs and feature records)

    def predict_evaluation(self, dataset: Any, split: str = "test") -> MultiLabelAccumulator:
        """One prediction pass over ``dataset`` (the ``split`` split) streamed into a :class:`MultiLabelAccumulator`
        (counting at the current threshold): Trainer's evaluation loop with ``batch_eval_metrics``, which gathers
        each batch across processes and keeps no (N, L) array. The callbacks see the prediction steps."""
        acc = self.new_accumulator()

        def collect(eval_pred: Any, compute_result: bool = False) -> dict[str, float]:
            acc.add_batch(eval_pred.predictions, eval_pred.label_ids)
            return {}

        args = self.args
        saved = args.batch_eval_metrics, self.compute_metrics
        args.batch_eval_metrics, self.compute_metrics = True, collect
        self.prediction_split = split
        try:
            self.evaluation_loop(
                self.get_test_dataloader(dataset),
                description="Evaluation",
                prediction_loss_only=False,
                metric_key_prefix="predict",
            )
        finally:
            args.batch_eval_metrics, self.compute_metrics = saved
            self.prediction_split = "test"
        return acc

    def evaluation_of_scores(self, scores: np.ndarray, truth: np.ndarray) -> MultiLabelAccumulator:
        """A :class:`MultiLabelAccumulator` of probabilities already at hand (the logistic probe's)."""
        return MultiLabelAccumulator.from_arrays(
            truth, scores, thresholds=[self.threshold], exact_cells=self.exact_eval_cells
        )

    def predict_scores(self, dataset: Any) -> tuple[np.ndarray, np.ndarray]:
        """(probabilities (N, L), multi-hot truth (N, L)) of a dataset with the current model (dense: for
        small splits; :meth:`predict_evaluation` streams)."""
        out = self.predict(dataset, metric_key_prefix="predict")
        return sigmoid(np.asarray(out.predictions, dtype=np.float64)), np.asarray(out.label_ids) > 0.5

    def tune_threshold(self, scores: Any, truth: np.ndarray | None = None) -> float | np.ndarray:
        """Set and return ``self.threshold`` per ``args.threshold`` from validation scores: dense
        ``(scores, truth)`` or a :class:`MultiLabelAccumulator` (``truth=None``)."""
        from hf_mlcl.evaluation.thresholds import tune_global_threshold, tune_per_label_thresholds

        streamed = isinstance(scores, MultiLabelAccumulator)
        if self.args.fixed_threshold is not None:
            self.threshold = float(self.args.fixed_threshold)
        elif str(self.args.threshold) == "global":
            self.threshold = float(
                scores.tune_global_threshold() if streamed else tune_global_threshold(truth, scores)
            )
        else:
            tuned = (
                scores.tune_per_label_thresholds() if streamed else tune_per_label_thresholds(truth, scores)
            )
            self.threshold = np.asarray(tuned, dtype=np.float64)
        return self.threshold

    def split_metrics(self, scores: Any, truth: np.ndarray | None, prefix: str | None) -> dict[str, float]:
        """``compute_multilabel_metrics`` at the current threshold (NaN metrics left out), keys prefixed
        ``<prefix>_`` (none with ``prefix=None``); ``scores`` dense with ``truth``, or a
        :class:`MultiLabelAccumulator` with ``truth=None``."""
        from hf_mlcl.evaluation.metrics import compute_multilabel_metrics

        if isinstance(scores, MultiLabelAccumulator):
            result = scores.compute(self.threshold)
            if not scores.exact:
                logger.info(
                    "%s: %d x %d scores: micro_auc, macro_auc, map_label estimated from histograms, "
                    "exact bounds %s",
                    prefix or "evaluation",
                    scores.num_rows,
                    scores.num_labels,
                    {k: (round(lo, 4), round(hi, 4)) for k, (lo, hi) in scores.bounds().items()},
                )
        else:
            result = compute_multilabel_metrics(truth, scores, threshold=self.threshold)
        head = "" if prefix is None else f"{prefix}_"
        return {f"{head}{k}": float(v) for k, v in result.items() if not np.isnan(v)}
