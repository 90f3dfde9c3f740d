"""Any hf_mlcl contrastive loss in a plain ``transformers.Trainer``, through its ``compute_loss_func`` hook::

    from transformers import Trainer, TrainingArguments
    from hf_mlcl import MLCLEncoder
    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.integrations.trainer import ContrastiveLossFunc

    trainer = Trainer(
        model=MLCLEncoder.from_backbone("FacebookAI/roberta-base"),       # or any model with pooled embeddings
        args=TrainingArguments("out", remove_unused_columns=False),       # the collator reads `text`
        train_dataset=ds["train"], data_collator=MultiLabelCollator(tokenizer, num_labels),
        compute_loss_func=ContrastiveLossFunc("sd", num_labels=num_labels),
    )

``Trainer`` pops ``labels`` from the batch, runs the model and calls ``compute_loss_func(outputs, labels,
num_items_in_batch=...)``. :class:`ContrastiveLossFunc` reads the embeddings from the output
(``embeddings`` of an ``MLCLEncoderOutput``, else ``sentence_embedding``, ``pooler_output`` or
``pooled``; or the key you name), turns the labels (multi-hot or -1-padded id lists) into a multi-hot
matrix and returns the loss of :func:`hf_mlcl.losses.get_loss` — the papers' equations, see
docs/losses.md — with every process's candidates when ``gather_across_devices``
(:class:`hf_mlcl.training.memory.CandidateBuilder` in batch mode, as ``ContrastiveTrainer``). The
label values and the embeddings' finiteness are checked on the first batch; later batches read nothing
on the host (:mod:`hf_mlcl.integrations._batches`), so with ``TrainingArguments(logging_nan_inf_filter=False)``
(Trainer's filter reads every step's loss on the host) a step makes no device-to-host synchronisation
outside the model.

Gradient accumulation: with a ``compute_loss_func`` Trainer does *not* divide the loss by the
accumulation steps (it expects a loss normalised by ``num_items_in_batch``). A contrastive loss is a
mean over the micro-batch's anchors, so the function scales it by this micro-batch's share of the
counted label entries, ``B * L / num_items_in_batch`` (Trainer counts ``labels != -100`` over the
accumulated micro-batches, and over processes when ``average_tokens_across_devices``, then multiplies
by the process count): 1 / accumulation steps for equal micro-batches, as ``ContrastiveTrainer`` does.
Use dense labels (``MultiLabelCollator``'s default) so Trainer can count them.

The queue (``queue_size``): a MoCo-style queue of the last K keys joins the candidates in each loss paper's
contrast set (``contrast_set`` / ``queue_warmup`` as ``ContrastiveTrainingArguments``; ``docs/losses.md``)::

    ContrastiveLossFunc("msc", num_labels=L, embedding_dim=D, queue_size=4096)

``compute_loss_func`` sees the model's outputs only, not the model or its inputs, so it cannot run a
momentum encoder: the keys are the batch's own embeddings without gradient — the online encoder's, in
the same forward pass (a cross-batch memory of past embeddings, Wang et al., CVPR 2020; a momentum of 0
in MoCo's terms). That is ``ContrastiveTrainer`` with ``momentum=0`` on a model without dropout (its key
encoder runs in eval mode); for the momentum encoder of the papers use ``ContrastiveTrainer`` or the
sentence-transformers loss. The queue is used and filled in training (the loss computed with gradient);
evaluation contrasts in-batch. It is not saved in Trainer's checkpoints: a resumed run starts with an
empty queue.

Losses with learnable parameters (``msc``'s prototypes) need those parameters in the optimizer: pass
``optimizers=(torch.optim.AdamW([*model.parameters(), *loss_func.parameters()]), None)``, or use
``hf_mlcl.ContrastiveTrainer``, which also adds MoCo queues, two-view training and GradCache. Under
several processes their gradients are averaged over the processes (Trainer's DDP / FSDP / DeepSpeed
wrapper owns the model only), so every process keeps the same parameters.
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
