"""`ProbingTrainer`: stage 2, a multi-label head on a (frozen or fine-tuned) encoder.

:class:`ProbingTrainer` trains the head (``probe="linear"`` on cached frozen features, ``"finetune"``, or
``"logistic"``: per-label logistic regressions folded into the head), tunes the decision threshold on
validation and reports the test metrics.

References: Khosla et al. 2020; ABALONE (Audibert et al.); threshold tuning, Edin et al. 2023.
Design: docs/design.md, "Probing stage (hf_mlcl/training/probing.py)".
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from hf_mlcl.evaluation.inputs import sigmoid
from hf_mlcl.labels.statistics import resolve_num_labels
from hf_mlcl.losses.registry import supervised_loss

from .arguments import ProbingTrainingArguments
from .base import MultiLabelTrainer
from .classifier_eval import ClassifierEvaluation
from .features import FeatureStore, FrozenFeatures, PooledFeatureCollator, PooledFeatureDataset

logger = logging.getLogger(__name__)

__all__ = ["ProbingTrainer"]


class ProbingTrainer(ClassifierEvaluation, MultiLabelTrainer):
    """A `transformers.Trainer` for the probing / fine-tuning stage (see module docstring).

    Args: those of :class:`~hf_mlcl.training.base.MultiLabelTrainer`, with
        model: an ``MLCLForMultiLabelClassification`` (``from_encoder(..., freeze_encoder=probe ==
            "linear")``); its forward returns ``logits``.
        args: ``ProbingTrainingArguments`` (probe, loss, loss_kwargs, threshold, ...).
        loss_fn: a ready supervised loss (default ``get_loss(args.loss, **args.loss_kwargs)``).

    Evaluation and the threshold protocol are :class:`~hf_mlcl.training.classifier_eval.ClassifierEvaluation`'s;
    :meth:`fit_logistic` is the ``logistic`` probe.

    With ``probe="linear"`` or ``"logistic"`` and ``args.cache_features`` not False, ``self.cache_features``
    is True when the run allows it (linear head; no FSDP / DeepSpeed; no length-grouped sampling; no token
    counting): the train / eval / test dataloaders then batch :meth:`cached_features` (the frozen encoder's
    pooled features, computed once per dataset and process; under DDP every process holds all rows and
    Trainer's dataloader shards them like the texts), the model runs ``forward(pooled_features=...)`` and
    the logistic probe fits on the same features. ``cache_features=True`` that cannot apply is a
    ValueError here; left unset, the run falls back to the texts with an info message. With
    ``args.feature_cache_dir`` the cached features are also saved to / loaded from that folder
    (:class:`~hf_mlcl.training.features.FeatureStore`), so a later probe of the same encoder on the
    same tokenised data runs no encoder pass at all; ``feature_sources`` says which splits were encoded
    and which loaded.
    """

    args_class = ProbingTrainingArguments
    args_hint = "ProbingTrainingArguments(output_dir=..., probe=...)"
    model_hint = "MLCLForMultiLabelClassification.from_encoder(...)"

    def stage_setup(self, model, args, train_dataset, data_collator, processing_class, loss_fn, num_labels):
        """The probing loss (bce / focal / asymmetric / zlpr), the label count and a one-view collator; the encoder
        must be frozen for the linear probe and trainable for a fine-tune."""
        self.num_labels = resolve_num_labels(train_dataset, num_labels, self.label_column, model=model)
        self.loss_fn = supervised_loss(args.loss, args.loss_kwargs, loss_fn)
        freeze = getattr(getattr(model, "config", None), "freeze_encoder", None)
        if args.probe == "linear" and freeze is False:
            raise ValueError("probe='linear' needs a frozen encoder: from_encoder(..., freeze_encoder=True)")
        if args.probe == "finetune" and freeze is True:
            raise ValueError("probe='finetune' trains the encoder: from_encoder(..., freeze_encoder=False)")
        self.start_threshold(args)
        return self.collator_for(data_collator, processing_class, self.num_labels, n_views=1)

    def after_setup(self) -> None:
        """The frozen-feature service (the cache needs the prepared accelerator to know the engine)."""
        args = self.args
        self._feature_collator = PooledFeatureCollator(_labels_to_tensor(self.data_collator, self.num_labels))
        self.cache_features = self._caches_features(args)
        self.features = FrozenFeatures(
            self,
            FeatureStore(args.feature_cache_dir)
            if (self.cache_features and args.feature_cache_dir is not None)
            else None,
        )
        self.logistic_validation_scores: tuple[np.ndarray, np.ndarray] | None = None

    def _caches_features(self, args: ProbingTrainingArguments) -> bool:
        """Whether the frozen-encoder probe trains on cached features (class docstring); ValueError when
        ``cache_features=True`` or ``feature_cache_dir`` asks for it and it cannot apply."""
        if args.probe not in ("linear", "logistic") or args.cache_features is False:
            return False
        why = FrozenFeatures.blocker(self)
        if why is None:
            return True
        if args.cache_features or args.feature_cache_dir is not None:
            asked = "cache_features=True" if args.cache_features else "feature_cache_dir"
            raise ValueError(
                f"{asked} cannot apply here: {why}; leave cache_features and feature_cache_dir unset (the "
                "probe then encodes the texts every epoch) or set cache_features to false"
            )
        logger.info(
            f"{args.probe} probe without cached features (the texts are encoded as they are read): {why}"
        )
        return False

    @property
    def feature_sources(self) -> dict[str, str]:
        """Split name -> ``"encoded"`` / ``"loaded"`` (``feature_cache_dir``) of the cached features."""
        return self.features.sources

    # ------------------------------------------------------------------ loss
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """``loss_fn(logits, labels)`` of one micro-batch (Trainer divides by the accumulation steps)."""
        model_inputs, labels = self.split_labels(inputs)
        outputs = model(**model_inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
        loss = self.loss_fn(logits, labels)
        return (loss, outputs) if return_outputs else loss

    # ------------------------------------------------------------------ frozen pooled features
    def cached_features(self, dataset: Any, name: str = "dataset") -> PooledFeatureDataset | None:
        """The :class:`~hf_mlcl.training.features.PooledFeatureDataset` of ``dataset``
        (:class:`~hf_mlcl.training.features.FrozenFeatures`), or None when this trainer does not cache
        (``self.cache_features``) or ``dataset`` is not map-style."""
        if not self.cache_features or dataset is None:
            return None
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
            if self.args.cache_features:
                raise ValueError(
                    f"cache_features=True needs a map-style {name} dataset (with len()); got "
                    f"{type(dataset).__name__}: leave cache_features unset or set it to false"
                )
            logger.info(
                f"{name}: an iterable dataset is encoded every epoch (features are cached for map-style ones)"
            )
            return None
        return self.features.of(dataset, name)

    def pooled_features(self, dataset: Any, name: str = "dataset") -> tuple[np.ndarray, np.ndarray]:
        """Frozen pooled representations (the head's input) and multi-hot labels of a whole dataset: the
        :meth:`cached_features` when this trainer caches, else one encoder pass."""
        features = self.cached_features(dataset, name)
        if features is None:
            features = PooledFeatureDataset.from_batches(self.features.batches(dataset))
        return features.features.numpy(), features.multi_hot(self.num_labels)

    def text_test_dataloader(self, dataset: Any):
        """Trainer's test dataloader over the texts of ``dataset`` (never the cached features)."""
        return super().get_test_dataloader(dataset)

    @contextmanager
    def _serving_features(self, train: PooledFeatureDataset | None = None) -> Iterator[None]:
        """While Trainer's public ``get_*_dataloader`` builds a loader: the feature collator (and, for
        training, the cached train features) in place of the text ones, so the sampler, batch size,
        sharding across processes and workers are Trainer's own."""
        text_collator, text_train = self.data_collator, self.train_dataset
        self.data_collator = self._feature_collator
        if train is not None:
            self.train_dataset = train
        try:
            yield
        finally:
            self.data_collator, self.train_dataset = text_collator, text_train

    def get_train_dataloader(self):
        """The texts, or their cached pooled features (``cache_features``), batched as Trainer would."""
        features = self.cached_features(self.train_dataset, "train")
        if features is None:
            return super().get_train_dataloader()
        with self._serving_features(train=features):
            return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None):
        """As ``Trainer.get_eval_dataloader`` (a name of a dict of eval datasets, a dataset, or None), over
        cached features when ``cache_features``."""
        if not self.cache_features:
            return super().get_eval_dataloader(eval_dataset)
        name = eval_dataset if isinstance(eval_dataset, str) else None
        dataset = self.eval_dataset[eval_dataset] if name is not None else eval_dataset
        dataset = self.eval_dataset if dataset is None else dataset
        features = self.cached_features(dataset, "eval" if name is None else f"eval {name}")
        if features is None:
            return super().get_eval_dataloader(eval_dataset)
        with self._serving_features():
            return super().get_eval_dataloader(features)

    def get_test_dataloader(self, test_dataset: Any):
        """As ``Trainer.get_test_dataloader``, over cached features when ``cache_features``."""
        features = self.cached_features(test_dataset, self.prediction_split)
        if features is None:
            return super().get_test_dataloader(test_dataset)
        with self._serving_features():
            return super().get_test_dataloader(features)

    # ------------------------------------------------------------------ logistic probe
    def fit_logistic(self, validation_dataset: Any | None = None) -> dict[str, Any]:
        """The ``logistic`` probe: per-label logistic regressions on the frozen features
        (:func:`hf_mlcl.evaluation.logistic.fit_logistic_probe`).

        The fitted (standardisation-folded) weights are copied into the model's linear head, so
        ``predict`` / ``save_model`` then behave as for the trained probes. Returns fit statistics.
        With a validation split, ``self.logistic_validation_scores`` holds its (probabilities, truth)
        from the cached features, so the threshold can be tuned without encoding it again.
        """
        from hf_mlcl.evaluation.logistic import fit_logistic_probe

        model = self.accelerator.unwrap_model(self.model)
        if getattr(model.config, "head", "linear") != "linear":
            raise ValueError("the logistic probe needs head='linear'")
        x_tr, y_tr = self.pooled_features(self.train_dataset, "train")
        x_va = y_va = None
        self.logistic_validation_scores = None  # never left over from an earlier fit
        if validation_dataset is not None:
            x_va, y_va = self.pooled_features(validation_dataset, "validation")
        w, b, chosen = fit_logistic_probe(
            x_tr,
            y_tr,
            x_va,
            y_va,
            c_grid=self.args.logistic_c_grid_values,
            max_iter=self.args.logistic_max_iter,
        )
        head = model.classifier
        with torch.no_grad():
            head.weight.copy_(torch.as_tensor(w, dtype=head.weight.dtype))
            head.bias.copy_(torch.as_tensor(b, dtype=head.bias.dtype))
            if x_va is not None:  # the fitted head on the cached features = what predict() would return
                feats = torch.as_tensor(x_va, dtype=head.weight.dtype, device=head.weight.device)
                logits = head(feats).float().cpu().numpy()
                self.logistic_validation_scores = (sigmoid(logits.astype(np.float64)), y_va)
        return {"logistic_num_train": int(x_tr.shape[0]), "logistic_median_C": float(np.nanmedian(chosen))}


def _labels_to_tensor(data_collator: Any, num_labels: int):
    """How the text collator turns label-id lists into the label tensor (``MultiLabelCollator.labels_to_tensor``),
    so the cached features carry the same labels; a dense multi-hot for other collators."""
    labels_to_tensor = getattr(data_collator, "labels_to_tensor", None)
    if labels_to_tensor is not None:
        return labels_to_tensor
    from hf_mlcl.labels.multihot import multi_hot_tensor

    return lambda lists: multi_hot_tensor(lists, num_labels)
