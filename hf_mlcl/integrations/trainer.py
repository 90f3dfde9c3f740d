"""Any hf_mlcl contrastive loss in a plain ``transformers.Trainer``, through its ``compute_loss_func`` hook.

:class:`ContrastiveLossFunc` reads the embeddings from the model's output, turns the labels into a multi-hot
matrix and returns the loss (scaled for gradient accumulation), optionally with a queue of past embeddings.

References: cross-batch memory, Wang et al., CVPR 2020.
Design: docs/design.md, "Losses in a plain Trainer (hf_mlcl/integrations/trainer.py)".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

from hf_mlcl.labels.multihot import LABEL_INPUT_FORMATS
from hf_mlcl.losses.registry import build_contrastive_loss, resolve_loss_name

from ._batches import BatchLoss

logger = logging.getLogger(__name__)

__all__ = ["ContrastiveLossFunc", "EMBEDDING_KEYS"]

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
            without gradient (module docstring).
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
        self.loss_fn = build_contrastive_loss(
            loss, loss_kwargs, temperature=temperature, num_labels=num_labels, embedding_dim=embedding_dim
        )
        self._batch_loss = BatchLoss(
            self.loss_fn,
            num_labels,
            label_format,
            self.gather_across_devices,
            queue_size,
            contrast_set,
            queue_warmup,
        )
        if any(True for _ in self.loss_fn.parameters()):
            logger.warning(
                "loss %r has learnable parameters: add ContrastiveLossFunc.parameters() to the optimizer "
                "(Trainer(optimizers=...)) or they stay at their initial values",
                self.loss_name,
            )

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
        if num_items_in_batch is not None:  # see the module docstring: Trainer's accumulation contract
            counted = torch.as_tensor(num_items_in_batch, dtype=loss.dtype, device=loss.device).reshape(-1)[0]
            loss = loss * (labels.shape[0] * labels.shape[1]) / counted.clamp_min(1)
        return loss

    def __repr__(self) -> str:
        return f"ContrastiveLossFunc(loss={self.loss_name!r}, {self.loss_fn.extra_repr()})"
