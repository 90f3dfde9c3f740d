"""`ProbingTrainer`: stage 2, a multi-label head on a (frozen or fine-tuned) encoder.

Protocol (Khosla et al. 2020; the SD-loss and ABALONE papers): drop the projection head of the
contrastive encoder, put a linear multi-label head on the pooled representation and

* ``probe="linear"``: freeze the encoder (it also stays in eval mode: no dropout) and train the head.
  Its outputs then never change, so by default (``cache_features``) every train / eval text is encoded
  once and the head is trained and evaluated on the cached pooled features through the usual Trainer
  loop (optimizer, scheduler, accumulation, evaluation, early stopping, checkpoints; the features are
  recomputed on resume, never saved) — the same head and metrics as encoding every epoch, at the cost
  of one encoder pass per dataset. The ``label_attention`` head needs token states and is never cached;
* ``probe="finetune"``: train encoder and head together (also the plain BCE baseline on a raw
  backbone, without any contrastive stage);
* ``probe="logistic"``: cache the frozen pooled embeddings once and fit scikit-learn logistic
  regressions, one per label (Audibert et al., ABALONE, App. "Details evaluating representation
  space": one logistic regression per label, the regularisation chosen per label for F1 on
  validation). The fitted weights are folded into the linear head, so the saved classifier is the
  same Hub-loadable model as for the other probes.

The head is trained with ``get_loss(args.loss, **args.loss_kwargs)`` (bce / focal / asymmetric / zlpr),
fully computed in ``compute_loss`` (``accepts_loss_kwargs = False`` on the model and
``loss_is_scaled_for_ga = False`` here: the per-micro-batch mean is divided by the accumulation
steps by Trainer, so accumulation averages micro-batch gradients — exact for these per-sample losses
when micro-batches have equal size). The decision threshold is tuned on validation (``global``: one
threshold maximising micro-F1, Edin et al. 2023; ``per_label``; or a fixed float) and the test metrics
of ``hf_mlcl.evaluation.compute_multilabel_metrics`` are reported with it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn as nn
from transformers import Trainer

from hf_mlcl.evaluation.inputs import sigmoid
from hf_mlcl.losses.relations import nonzero_pairs

from ._common import (
    check_label_column,
    labels_to_dense_float,
    pop_labels,
    resolve_num_labels,
)
from .arguments import ProbingTrainingArguments
from .checkpoints import CompleteCheckpointsMixin
from .feature_cache import PooledFeatureCollator, PooledFeatureDataset
from .feature_store import FeatureStore
from .sharding import EngineCheckCallback, check_engine_applied, clear_previous_deepspeed_state

logger = logging.getLogger(__name__)

__all__ = ["ProbingTrainer", "fit_logistic_probe"]


def _fit_one_label(
    x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray | None, cs: Sequence[float], max_iter: int
):
    from sklearn.linear_model import LogisticRegression

    pos = int(y.sum())
    if pos == 0 or pos == len(y):  # constant label: a bias-only model predicting the constant
        return np.zeros(x.shape[1]), (-12.0 if pos == 0 else 12.0), float("nan")
    best = None
    for c in cs:
        clf = LogisticRegression(C=float(c), max_iter=max_iter)
        clf.fit(x, y)
        if yv is None or len(cs) == 1:
            f1 = 0.0
        else:
            pred = clf.decision_function(xv) >= 0
            tp = int((pred & yv).sum())
            f1 = 2 * tp / max(int(pred.sum()) + int(yv.sum()), 1)
        if best is None or f1 > best[0]:
            best = (f1, clf.coef_[0].copy(), float(clf.intercept_[0]), float(c))
    return best[1], best[2], best[3]


def fit_logistic_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
    c_grid: Sequence[float] = (1.0, 0.1, 0.01),
    max_iter: int = 1000,
    n_jobs: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-label L2 logistic regressions on standardised features (Audibert et al., ABALONE protocol).

    Every label gets its own ``sklearn.linear_model.LogisticRegression``; with validation data the
    inverse regularisation C is chosen per label from ``c_grid`` for the label's F1 at 0.5.
    Standardisation is folded into the returned weights, so ``sigmoid(x @ W.T + b)`` applies to the raw
    features. Constant labels get zero weights and a saturated bias. Returns ``(W (L, D), b (L,),
    chosen_C (L,))``.
    """
    from joblib import Parallel, delayed

    x_train = np.asarray(x_train, dtype=np.float64)
    y_train = np.asarray(y_train) > 0.5
    mean = x_train.mean(0)
    std = x_train.std(0)
    std[std < 1e-12] = 1.0
    xs = (x_train - mean) / std
    xv = None if x_val is None else (np.asarray(x_val, dtype=np.float64) - mean) / std
    yv = None if y_val is None else np.asarray(y_val) > 0.5
    fits = Parallel(n_jobs=n_jobs)(
        delayed(_fit_one_label)(
            xs, y_train[:, j], xv, None if yv is None else yv[:, j], tuple(c_grid), max_iter
        )
        for j in range(y_train.shape[1])
    )
    w_std = np.stack([f[0] for f in fits])
    b_std = np.array([f[1] for f in fits])
    chosen = np.array([f[2] for f in fits])
    w = w_std / std[None, :]
    b = b_std - w @ mean
    return w, b, chosen


class ProbingTrainer(CompleteCheckpointsMixin, Trainer):
    """A `transformers.Trainer` for the probing / fine-tuning stage (see module docstring).

    Args:
        model: an ``MLCLForMultiLabelClassification`` (``from_encoder(..., freeze_encoder=probe ==
            "linear")``); its forward returns ``logits``.
        args: ``ProbingTrainingArguments`` (probe, loss, loss_kwargs, threshold, ...).
        loss_fn: a ready supervised loss (default ``get_loss(args.loss, **args.loss_kwargs)``).
        num_labels / label_column: as for ``ContrastiveTrainer``.

    ``evaluate()`` reports the metrics at threshold 0.5 (or the fixed / tuned threshold once
    :meth:`tune_threshold` ran); :meth:`tune_threshold` and :meth:`split_metrics` implement the
    validation-tuned test protocol; :meth:`fit_logistic` is the ``logistic`` probe.

    With ``probe="linear"`` or ``"logistic"`` and ``args.cache_features`` not False, ``self.cache_features``
    is True when the run allows it (linear head; no FSDP / DeepSpeed; no length-grouped sampling; no token
    counting): the train / eval / test dataloaders then batch :meth:`cached_features` (the frozen encoder's
    pooled features, computed once per dataset and process; under DDP every process holds all rows and
    Trainer's dataloader shards them like the texts), the model runs ``forward(pooled_features=...)`` and
    the logistic probe fits on the same features. ``cache_features=True`` that cannot apply is a
    ValueError here; left unset, the run falls back to the texts with an info message. With
    ``args.feature_cache_dir`` the cached features are also saved to / loaded from that folder
    (:class:`~hf_mlcl.training.feature_store.FeatureStore`), so a later probe of the same encoder on the
    same tokenised data runs no encoder pass at all.
    """

    loss_is_scaled_for_ga = False

    def __init__(
        self,
        model: nn.Module | None = None,
        args: ProbingTrainingArguments | None = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        loss_fn: nn.Module | None = None,
        num_labels: int | None = None,
        label_column: str = "labels",
        compute_metrics: Any = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(args, ProbingTrainingArguments):
            raise ValueError(
                f"ProbingTrainer needs ProbingTrainingArguments(output_dir=..., probe=...), got {type(args).__name__}"
            )
        if model is None:
            raise ValueError(
                "ProbingTrainer needs a model (MLCLForMultiLabelClassification.from_encoder(...))"
            )
        check_label_column(train_dataset, label_column, "train")
        check_label_column(eval_dataset, label_column, "eval")
        if getattr(model, "accepts_loss_kwargs", False):
            raise ValueError(f"{type(model).__name__}.accepts_loss_kwargs must be False (transformers#47688)")
        n_labels = resolve_num_labels(train_dataset, num_labels, label_column, model=model)
        if loss_fn is None:
            from hf_mlcl.losses import get_loss

            try:
                loss_fn = get_loss(args.loss, **args.loss_kwargs)
            except TypeError as err:
                raise ValueError(
                    f"cannot build probing loss {args.loss!r} with {sorted(args.loss_kwargs)}: {err}"
                ) from err
        if getattr(loss_fn, "is_contrastive", False):
            raise ValueError(
                f"{type(loss_fn).__name__} is a contrastive loss; probing trains logits with bce / focal / asymmetric / zlpr"
            )
        freeze = getattr(getattr(model, "config", None), "freeze_encoder", None)
        if args.probe == "linear" and freeze is False:
            raise ValueError("probe='linear' needs a frozen encoder: from_encoder(..., freeze_encoder=True)")
        if args.probe == "finetune" and freeze is True:
            raise ValueError("probe='finetune' trains the encoder: from_encoder(..., freeze_encoder=False)")
        if data_collator is None:
            if processing_class is None:
                raise ValueError("pass data_collator=MultiLabelCollator(...) or processing_class=<tokenizer>")
            from hf_mlcl.data import MultiLabelCollator

            data_collator = MultiLabelCollator(processing_class, n_labels)
        if getattr(data_collator, "n_views", 1) != 1:
            raise ValueError("probing uses one view per text: build the collator with n_views=1")
        self.loss_fn = loss_fn
        self.num_labels = n_labels
        self.label_column = label_column
        self.threshold: float | np.ndarray = args.fixed_threshold if args.fixed_threshold is not None else 0.5
        clear_previous_deepspeed_state(args)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_metrics=compute_metrics,
            **kwargs,
        )
        if compute_metrics is None:
            self.compute_metrics = self._metrics
        check_engine_applied(self)
        self.add_callback(EngineCheckCallback(self))
        self.loss_fn.to(self.args.device)
        self._feature_cache: dict[int, tuple[Any, nn.Module, PooledFeatureDataset]] = {}
        labels_to_tensor = getattr(data_collator, "labels_to_tensor", None)
        if labels_to_tensor is None:
            from hf_mlcl.data.multihot import multi_hot_tensor

            def labels_to_tensor(lists):
                return multi_hot_tensor(lists, n_labels)

        self._feature_collator = PooledFeatureCollator(labels_to_tensor)
        self.cache_features = False
        self._feature_store: FeatureStore | None = None
        self._encoder_digest: tuple[nn.Module, str] | None = None
        self.feature_sources: dict[str, str] = {}  # split name -> "encoded" / "loaded" (feature_cache_dir)
        if args.probe in ("linear", "logistic") and args.cache_features is not False:
            why = self._feature_cache_blocker()
            if why is None:
                self.cache_features = True
            elif args.cache_features or args.feature_cache_dir is not None:
                asked = "cache_features=True" if args.cache_features else "feature_cache_dir"
                raise ValueError(
                    f"{asked} cannot apply here: {why}; leave cache_features and feature_cache_dir unset (the "
                    "probe then encodes the texts every epoch) or set cache_features to false"
                )
            else:
                logger.info(
                    f"{args.probe} probe without cached features (the texts are encoded as they are read): {why}"
                )
        if self.cache_features and args.feature_cache_dir is not None:
            self._feature_store = FeatureStore(args.feature_cache_dir)

    # ------------------------------------------------------------------ loss
    def _split(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        return pop_labels(inputs, self.label_column)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """``loss_fn(logits, labels)`` of one micro-batch (Trainer divides by the accumulation steps)."""
        model_inputs, labels = self._split(inputs)
        outputs = model(**model_inputs)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
        loss = self.loss_fn(logits, labels)
        return (loss, outputs) if return_outputs else loss

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        inputs = self._prepare_inputs(inputs)
        _, labels = self._split(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, outputs = self.compute_loss(model, inputs, return_outputs=True)
        logits = outputs["logits"] if isinstance(outputs, dict) else outputs.logits
        if prediction_loss_only:
            return loss.detach(), None, None
        return loss.detach(), logits.detach().float(), labels_to_dense_float(labels)

    def _metrics(self, eval_pred) -> dict[str, float]:
        from hf_mlcl.evaluation.metrics import compute_multilabel_metrics

        scores = sigmoid(np.asarray(eval_pred.predictions, dtype=np.float64))
        result = compute_multilabel_metrics(
            np.asarray(eval_pred.label_ids) > 0.5, scores, threshold=self.threshold
        )
        return {k: v for k, v in result.items() if not np.isnan(v)}

    # ------------------------------------------------------------------ threshold protocol
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

    def split_metrics(self, scores: np.ndarray, truth: np.ndarray, prefix: str) -> dict[str, float]:
        from hf_mlcl.evaluation.metrics import compute_multilabel_metrics

        result = compute_multilabel_metrics(truth, scores, threshold=self.threshold)
        return {f"{prefix}_{k}": float(v) for k, v in result.items() if not np.isnan(v)}

    # ------------------------------------------------------------------ frozen pooled features
    def _pooled_batches(
        self, dataset: Any, desc: str = "Encoding"
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``(pooled (b, H) float32, multi-hot (b, L) bool)`` of every batch of ``dataset``, in dataset order,
        from the text dataloader, in eval mode without gradient. Under several processes every process
        gets every row (``gather_for_metrics`` drops the duplicated tail samples). The pass leaves the
        random-number streams as they were (``fork_rng``: iterating a DataLoader draws a seed), so a run
        with cached features draws the same dropout masks as one without."""
        from tqdm.auto import tqdm

        from hf_mlcl.modeling.modeling_mlcl import pool_states

        model = self.accelerator.unwrap_model(self.model)
        was_training = model.training
        model.eval()
        bar = None
        try:
            with torch.random.fork_rng(devices=[]):
                loader = super().get_test_dataloader(dataset)  # the texts, never the cache
                bar = tqdm(
                    loader, desc=desc, disable=self.args.disable_tqdm or not self.is_local_process_zero()
                )
                for batch in bar:
                    batch = self._prepare_inputs(batch)
                    model_inputs, y = self._split(batch)
                    with torch.no_grad(), self.compute_loss_context_manager():
                        states, mask, segment = model.encode_tokens(
                            model_inputs["input_ids"],
                            model_inputs.get("attention_mask"),
                            model_inputs.get("token_type_ids"),
                        )
                        pooled = pool_states(states, mask, model.config.pooling, segment)
                    pooled, y = self.accelerator.gather_for_metrics(
                        (pooled.float().contiguous(), labels_to_dense_float(y))
                    )
                    yield pooled.cpu(), y.cpu() > 0.5
        finally:
            if bar is not None:
                bar.close()
            model.train(was_training)

    def pooled_features(self, dataset: Any, name: str = "dataset") -> tuple[np.ndarray, np.ndarray]:
        """Frozen pooled representations (the head's input) and multi-hot labels of a whole dataset: the
        :meth:`cached_features` when this trainer caches, else one encoder pass."""
        cached = self.cached_features(dataset, name)
        if cached is not None:
            return cached.features.numpy(), cached.multi_hot(self.num_labels)
        feats, labels = [], []
        for pooled, y in self._pooled_batches(dataset):
            feats.append(pooled.numpy())
            labels.append(y.numpy())
        return np.concatenate(feats), np.concatenate(labels)

    # ------------------------------------------------------------------ cached linear probe
    def _feature_cache_blocker(self) -> str | None:
        """Why this run cannot train the linear head on cached features, or None when it can."""
        model = self.accelerator.unwrap_model(self.model)
        args = self.args
        if getattr(model.config, "head", "linear") != "linear" or not hasattr(model, "logits_from_pooled"):
            return (
                f"head={getattr(model.config, 'head', None)!r} reads token states, not a pooled vector "
                "(only head='linear' can be trained on cached features)"
            )
        if self.is_fsdp_enabled or self.is_deepspeed_enabled:
            return "FSDP / DeepSpeed shard the encoder's weights across processes"
        if args.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
            return (
                f"train_sampling_strategy={args.train_sampling_strategy!r} orders the batches by text length"
            )
        if "inputs" in (args.include_for_metrics or []):
            return "include_for_metrics=['inputs'] hands the token ids to compute_metrics"
        if args.include_num_input_tokens_seen not in ("no", False, None):
            return "include_num_input_tokens_seen counts the tokens of every training batch"
        if args.dataloader_drop_last:
            return "dataloader_drop_last would drop the last rows of every split's encoding pass"
        return None

    def cached_features(self, dataset: Any, name: str = "dataset") -> PooledFeatureDataset | None:
        """The :class:`~hf_mlcl.training.feature_cache.PooledFeatureDataset` of ``dataset``: computed by the
        frozen encoder on first use, then reused for as long as this trainer lives (the encoder is frozen
        and in eval mode, so its outputs never change; features are not written to checkpoints and a
        resumed run computes them again). None when this trainer does not cache (``self.cache_features``)."""
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
        backbone = self.accelerator.unwrap_model(self.model).backbone
        entry = self._feature_cache.get(id(dataset))
        if entry is not None and entry[0] is dataset and entry[1] is backbone:
            return entry[2]
        features = self._encoded_or_stored(dataset, name)
        self._feature_cache[id(dataset)] = (dataset, backbone, features)
        return features

    def _encoded_or_stored(self, dataset: Any, name: str) -> PooledFeatureDataset:
        """One encoder pass over ``dataset``, or, with ``feature_cache_dir``, the features a run with the same
        encoder and tokenised rows saved there (:class:`~hf_mlcl.training.feature_store.FeatureStore`)."""
        start = time.perf_counter()
        store = self._feature_store
        if store is not None:
            key, rows = self._feature_key(dataset)
            stored = store.load(key, rows)
            # every process must take the same branch: the encoder pass gathers across processes
            if self._on_every_process(stored is not None):
                logger.info(f"{self.args.probe} probe: loaded the {name} features from {store.path(key)}")
                self.feature_sources[name] = "loaded"
                return stored
        features = PooledFeatureDataset.from_batches(self._pooled_batches(dataset, f"Encoding {name} features"))
        logger.info(
            f"{self.args.probe} probe: cached the frozen features of {len(features)} {name} rows "
            f"in {time.perf_counter() - start:.1f} s"
        )
        self.feature_sources[name] = "encoded"
        # one writer per copy of the store: the global main process (shared storage), or each node's main
        # process with save_on_each_node (node-local storage), never one per node into a shared folder
        if store is not None and self.args.should_save:
            saved = store.save(key, features)
            if saved is not None:
                logger.info(f"{self.args.probe} probe: saved the {name} features to {saved}")
        return features

    def _feature_key(self, dataset: Any) -> tuple[str, int]:
        """:meth:`FeatureStore.key` of ``dataset`` as this trainer would encode it: the collator over the rows in
        order (not sharded across processes, so every process and world size gets the same key)."""
        model = self.accelerator.unwrap_model(self.model)
        cached = self._encoder_digest
        if cached is None or cached[0] is not model.backbone:  # the frozen weights are hashed once per trainer
            cached = self._encoder_digest = (model.backbone, FeatureStore.encoder_digest(model.backbone))
        config = model.config
        settings = {"pooling": config.pooling, "segmented": getattr(config, "segmented", None),
                    "chunk_size": getattr(config, "chunk_size", None), "bf16": bool(self.args.bf16),
                    "fp16": bool(self.args.fp16)}  # fmt: skip

        def label_pairs(batch: dict[str, Any]) -> torch.Tensor:
            return torch.stack(nonzero_pairs(self._split(batch)[1]), dim=1)  # dense or sparse, never densified

        # iterating a DataLoader draws a seed from the global generator: keep the run's random streams as
        # they are, so dropout masks do not depend on whether a store is used
        with torch.random.fork_rng(devices=[]):
            loader = torch.utils.data.DataLoader(
                dataset, batch_size=self.args.per_device_eval_batch_size, shuffle=False, collate_fn=self.data_collator
            )
            return FeatureStore.key(cached[1], loader, settings, label_pairs)

    def _on_every_process(self, flag: bool) -> bool:
        """True when ``flag`` holds on every process (``flag`` itself with one process)."""
        if self.accelerator.num_processes == 1:
            return flag
        flags = self.accelerator.gather(torch.tensor([int(flag)], device=self.args.device))
        return bool(flags.min().item())

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
        features = self.cached_features(test_dataset, "test")
        if features is None:
            return super().get_test_dataloader(test_dataset)
        with self._serving_features():
            return super().get_test_dataloader(features)

    # ------------------------------------------------------------------ logistic probe
    def fit_logistic(self, validation_dataset: Any | None = None) -> dict[str, Any]:
        """The ``logistic`` probe: per-label scikit-learn logistic regressions on cached embeddings.

        The fitted (standardisation-folded) weights are copied into the model's linear head, so
        ``predict`` / ``save_model`` then behave as for the trained probes. Returns fit statistics.
        With a validation split, ``self.logistic_validation_scores`` holds its (probabilities, truth)
        from the cached features, so the threshold can be tuned without encoding it again.
        """
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
