"""Any hf_mlcl contrastive loss in a plain ``transformers.Trainer``, through its ``compute_loss_func`` hook.

:class:`ContrastiveLossFunc` reads the embeddings from the model's output, turns the labels into a multi-hot
matrix and returns the loss (scaled for gradient accumulation), optionally with a queue of past embeddings;
:class:`JointLossFunc` adds a supervised loss on the output's logits: the joint objective of ``JointTrainer``.

References: cross-batch memory, Wang et al., CVPR 2020.
Design: docs/design.md, "Losses in a plain Trainer (hf_mlcl/integrations/trainer.py)".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from hf_mlcl.labels.multihot import LABEL_INPUT_FORMATS, labels_to_multihot
from hf_mlcl.losses.registry import resolve_loss_name

from ._batches import contrastive_batch_loss

logger = logging.getLogger(__name__)

__all__ = ["ContrastiveLossFunc", "EMBEDDING_KEYS", "JointLossFunc"]

EMBEDDING_KEYS = ("embeddings", "sentence_embedding", "pooler_output", "pooled")


class ContrastiveLossFunc:
    """``compute_loss_func`` for ``transformers.Trainer`` computing an hf_mlcl contrastive loss.

    Args:
        loss: a contrastive loss name (``"sd"``, ``"mulsupcon"``, ``"msc"``, ``"jaccard"``, ``"all"``,
            ``"any"``, ``"ws_mulsupcon"``, ``"hbl"``); ``**loss_kwargs`` are its keywords.
        num_labels: size of the label space (needed for id-list labels and ``msc``).
        label_format: ``"auto"``, ``"multi_hot"`` or ``"ids"`` (see
            :func:`hf_mlcl.labels.multihot.labels_to_multihot`).
        embeddings_key: the output field holding the embeddings (default: the first of
            ``EMBEDDING_KEYS`` present).
        embedding_dim: width of the embeddings, for losses with per-label parameters (``msc``).
        gather_across_devices: contrast each process's anchors with all processes' candidates.
        temperature: tau (default: the loss paper's value).
        queue_size: K past keys among the candidates (0: in-batch only); the keys are the embeddings
            without gradient (the queue in docs/design.md's section on a plain Trainer).
        contrast_set: with a queue, ``"keys"``, ``"queries+queue"`` or ``"queries+keys"`` (None: the
            loss paper's).
        queue_warmup: leave the queue out until it has been filled once (None: the loss paper's).
    """

    def __init__(
        self,
        loss: str = "sd",
        *,
        num_labels: int | None = None,
        label_format: str = "auto",
        embeddings_key: str | None = None,
        embedding_dim: int | None = None,
        gather_across_devices: bool = True,
        temperature: float | None = None,
        queue_size: int = 0,
        contrast_set: str | None = None,
        queue_warmup: bool | None = None,
        **loss_kwargs: Any,
    ) -> None:
        if label_format not in LABEL_INPUT_FORMATS:
            raise ValueError(f"label_format must be one of {LABEL_INPUT_FORMATS}; got {label_format!r}")
        self.loss_name = resolve_loss_name(loss)
        self.num_labels = num_labels
        self.label_format = label_format
        self.embeddings_key = embeddings_key
        self.gather_across_devices = bool(gather_across_devices)
        self._batch_loss = contrastive_batch_loss(
            loss,
            loss_kwargs,
            temperature,
            embedding_dim,
            num_labels,
            label_format,
            self.gather_across_devices,
            queue_size,
            contrast_set,
            queue_warmup,
        )
        self.loss_fn = self._batch_loss.loss_fn
        self._counts_checked = False
        if any(True for _ in self.loss_fn.parameters()):
            logger.warning(
                "loss %r has learnable parameters: add ContrastiveLossFunc.parameters() to the optimizer "
                "(Trainer(optimizers=...)) or they stay at their initial values",
                self.loss_name,
            )

    def set_label_statistics(self, train_labels: Tensor) -> None:
        """The training set's labels for a loss weighted by them (``ws_mulsupcon``): call it once before training
        (:meth:`~hf_mlcl.integrations._batches.BatchLoss.set_label_statistics`)."""
        self._batch_loss.set_label_statistics(train_labels)

    @property
    def queue(self):
        """The :class:`~hf_mlcl.training.memory.EmbeddingQueue` (None in batch mode and before the first
        training batch)."""
        return self._batch_loss.queue

    def parameters(self):
        """The loss's learnable parameters (e.g. ``msc`` prototypes), for the optimizer."""
        return self.loss_fn.parameters()

    def embeddings(self, outputs: Any) -> Tensor:
        """The (B, D) embeddings of a model output (a ModelOutput, a dict, or a tensor)."""
        if isinstance(outputs, Tensor):
            return outputs
        keys = (self.embeddings_key,) if self.embeddings_key else EMBEDDING_KEYS
        for key in keys:
            value = outputs.get(key) if isinstance(outputs, Mapping) else getattr(outputs, key, None)
            if value is not None:
                return value
        have = list(outputs.keys()) if isinstance(outputs, Mapping) else type(outputs).__name__
        raise ValueError(
            f"the model output has none of {list(keys)} (it has {have}); use an MLCLEncoder, a model that "
            "returns pooled embeddings, or name the field with ContrastiveLossFunc(embeddings_key=...)"
        )

    def __call__(self, outputs: Any, labels: Tensor | None, num_items_in_batch: Any = None) -> Tensor:
        if labels is None:
            raise ValueError(
                "compute_loss_func got no labels: the batch needs a `labels` entry (MultiLabelCollator builds "
                "it from the dataset's `labels` column; keep it with remove_unused_columns=False)"
            )
        emb = self.embeddings(outputs)
        if emb.dim() != 2:
            raise ValueError(
                f"embeddings must be (batch, dim); got shape {tuple(emb.shape)} — a token-level output? "
                "pool it first or name a pooled field with embeddings_key="
            )
        self.loss_fn.to(emb.device)
        loss = self._batch_loss(emb, labels)
        # Trainer's accumulation contract: docs/design.md's section on a plain Trainer
        if num_items_in_batch is not None:
            counted = torch.as_tensor(num_items_in_batch, dtype=loss.dtype, device=loss.device).reshape(-1)[0]
            if not self._counts_checked:  # the first step only: one host read
                self._counts_checked = True
                self._check_counted_rows(labels, counted)
            loss = loss * (labels.shape[0] * labels.shape[1]) / counted.clamp_min(1)
        return loss

    def _check_counted_rows(self, labels: Tensor, counted: Tensor) -> None:
        """ValueError when Trainer counts this step's label entries over several micro-batches or processes
        (gradient accumulation, DDP) and the labels are -1-padded ids: their width changes from batch to batch, so
        the count would weigh each micro-batch by its widest row, not by its rows. Dense multi-hot rows (one
        entry per label) count alike in every batch."""
        if labels.layout == torch.strided and self._batch_loss.format_of(labels) == "ids":
            if float(counted) != labels.numel():
                raise ValueError(
                    "label ids padded with -1 under gradient accumulation or several processes: Trainer's "
                    "num_items_in_batch would weigh each micro-batch by its padded width; collate dense multi-hot "
                    "labels (MultiLabelCollator(label_format='dense'), the default)"
                )

    def __repr__(self) -> str:
        return f"ContrastiveLossFunc(loss={self.loss_name!r}, {self.loss_fn.extra_repr()})"


class JointLossFunc:
    """``compute_loss_func`` for ``transformers.Trainer``: ``(1 - w) * supervised + w * contrastive`` of a classifier
    whose output has ``logits`` and pooled ``embeddings`` (``MLCLForMultiLabelClassification``), as
    :class:`~hf_mlcl.training.JointTrainer` trains it (Gunel et al. 2021, eq. 1).

    Args:
        loss: the contrastive loss name; ``**loss_kwargs`` and the keywords of :class:`ContrastiveLossFunc`
            (``num_labels``, ``label_format``, ``embeddings_key``, ``temperature``, ``queue_size`` ...) configure it.
        contrastive_weight: w in [0, 1].
        supervised_loss: ``"bce"``, ``"focal"``, ``"asymmetric"`` or ``"zlpr"``, with ``supervised_loss_kwargs``.

    Raises:
        ValueError: w outside [0, 1], a supervised ``loss`` or a contrastive ``supervised_loss``, or what
            :class:`ContrastiveLossFunc` raises.

    Example:
        >>> trainer = Trainer(model=classifier, args=args, train_dataset=ds, data_collator=collator,
        ...                   compute_loss_func=JointLossFunc("jaccard", contrastive_weight=0.5, num_labels=28))
    """

    def __init__(
        self,
        loss: str = "sd",
        *,
        contrastive_weight: float = 0.5,
        supervised_loss: str = "bce",
        supervised_loss_kwargs: Mapping[str, Any] | None = None,
        **contrastive_kwargs: Any,
    ) -> None:
        from hf_mlcl.losses.registry import check_joint_losses
        from hf_mlcl.losses.registry import supervised_loss as build_supervised_loss

        supervised_loss = check_joint_losses(loss, supervised_loss)
        if not 0.0 <= float(contrastive_weight) <= 1.0:
            raise ValueError(f"contrastive_weight must lie in [0, 1]; got {contrastive_weight}")
        self.contrastive_weight = float(contrastive_weight)
        self.contrastive = ContrastiveLossFunc(loss, **contrastive_kwargs)
        self.supervised_fn = build_supervised_loss(
            supervised_loss, supervised_loss_kwargs, role="supervised_loss"
        )

    def parameters(self):
        """The contrastive loss's learnable parameters (e.g. ``msc`` prototypes), for the optimizer."""
        return self.contrastive.parameters()

    def __call__(self, outputs: Any, labels: Tensor | None, num_items_in_batch: Any = None) -> Tensor:
        contrastive = self.contrastive(outputs, labels, num_items_in_batch)
        logits = outputs["logits"] if isinstance(outputs, Mapping) else outputs.logits
        multi_hot = labels_to_multihot(
            labels, self.contrastive.num_labels or logits.shape[-1], self.contrastive.label_format
        )
        supervised = self.supervised_fn(logits, multi_hot.to(logits.device))
        if num_items_in_batch is not None:  # the accumulation contract, as the contrastive part's
            counted = torch.as_tensor(num_items_in_batch, dtype=supervised.dtype, device=supervised.device)
            supervised = (
                supervised * (labels.shape[0] * labels.shape[1]) / counted.reshape(-1)[0].clamp_min(1)
            )
        w = self.contrastive_weight
        return (1.0 - w) * supervised + w * contrastive

    def __repr__(self) -> str:
        return (
            f"JointLossFunc(w={self.contrastive_weight}, supervised={type(self.supervised_fn).__name__}, "
            f"contrastive={self.contrastive!r})"
        )
