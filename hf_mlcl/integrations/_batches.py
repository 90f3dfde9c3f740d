"""One batch of an integration: labels to multi-hot and the loss, with the value checks on the first batch.

:class:`BatchLoss` is what both integrations share: the labels as a multi-hot matrix, this step's candidates
(with the optional MoCo queue) and the loss parameters' gradients averaged over processes.

Design: docs/design.md, "Integration batches (hf_mlcl/integrations/_batches.py)".
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from hf_mlcl.labels.multihot import labels_to_multihot, resolve_label_format
from hf_mlcl.losses.input_checks import FirstCallChecks
from hf_mlcl.losses.registry import build_contrastive_loss
from hf_mlcl.training import distributed as D
from hf_mlcl.training.memory import (
    CandidateBuilder,
    EmbeddingQueue,
    MomentumContrast,
    check_contrast_set,
    check_queue_loss,
    resolve_contrast_set,
    resolve_queue_warmup,
)

__all__ = ["BatchLoss", "contrastive_batch_loss"]


class BatchLoss:
    """``loss_fn`` on one batch of embeddings and labels, checking the first batch's values only.

    Args:
        loss_fn: a contrastive loss (its ``check_inputs`` is managed here).
        num_labels: size of the label space (or None: the multi-hot width).
        label_format: ``"auto"``, ``"multi_hot"`` or ``"ids"``.
        gather_across_devices: contrast with every process's candidates.
        queue_size: K keys kept across batches (0: in-batch candidates only).
        contrast_set: with a queue, ``"keys"``, ``"queries+queue"`` or ``"queries+keys"`` (None: the loss
            paper's, ``docs/losses.md``).
        queue_warmup: leave the queue out until it has been filled once (None: the loss paper's).

    ValueError (one line) for a negative ``queue_size``, a contrast set without a queue or that the loss
    cannot take, and a queue with a loss that takes no keys.
    """

    def __init__(
        self,
        loss_fn: nn.Module,
        num_labels: int | None,
        label_format: str,
        gather_across_devices: bool,
        queue_size: int = 0,
        contrast_set: str | None = None,
        queue_warmup: bool | None = None,
    ) -> None:
        if queue_size < 0:
            raise ValueError(f"queue_size must be >= 0 (0 = in-batch candidates only); got {queue_size}")
        check_contrast_set(contrast_set, queue_size)
        check_queue_loss(loss_fn, queue_size)
        self.loss_fn = loss_fn
        self.num_labels = num_labels
        self.label_format = label_format
        self.gather = bool(gather_across_devices)
        self.queue_size = int(queue_size)
        self.contrast_set = resolve_contrast_set(loss_fn, contrast_set, queue_size)
        self.queue_warmup = resolve_queue_warmup(loss_fn, queue_warmup)
        self.memory: MomentumContrast | None = None  # queue + contrast set, from the first training batch
        self.checks = FirstCallChecks(loss_fn)
        self.candidates = CandidateBuilder(
            None, gather=self.gather, supports_keys=getattr(loss_fn, "supports_keys", False)
        )
        self._formats: dict[tuple, str] = {}
        self.average_parameter_grads = (
            True  # GradCache turns it off for its inner gradient (averaged once, later)
        )
        for parameter in loss_fn.parameters():
            if parameter.requires_grad:
                parameter.register_hook(self._mean_over_processes)

    def set_label_statistics(self, train_labels: Tensor) -> None:
        """Hand the training set's labels (N, L) multi-hot, or label ids in this loss's format) to a loss whose
        weights come from them (``ws_mulsupcon``'s class weights); ValueError for a loss that takes none."""
        if not hasattr(self.loss_fn, "set_label_statistics"):
            raise ValueError(f"{type(self.loss_fn).__name__} takes no training-set label statistics")
        # resolved on its own: the training matrix must not decide the format the batches are read in
        fmt = resolve_label_format(train_labels, self.num_labels, self.label_format)
        self.loss_fn.set_label_statistics(labels_to_multihot(train_labels, self.num_labels, fmt))

    def _mean_over_processes(self, grad: Tensor) -> Tensor:
        return D.mean_over_processes(grad) if self.average_parameter_grads else grad

    def multi_hot(self, labels: Tensor, check_values: bool = True) -> Tensor:
        """The batch's labels as a (B, L) float32 multi-hot matrix; ``"auto"`` is resolved once per label
        dtype and width (:func:`~hf_mlcl.labels.multihot.resolve_label_format`)."""
        if not isinstance(labels, Tensor) or labels.dim() != 2:  # the ValueError naming the problem
            return labels_to_multihot(labels, self.num_labels, self.label_format)
        return labels_to_multihot(labels, self.num_labels, self.format_of(labels), check_values=check_values)

    def format_of(self, labels: Tensor) -> str:
        """``"multi_hot"`` or ``"ids"`` for a (B, ·) label batch, resolved once per dtype, layout and width."""
        key = (labels.dtype, labels.layout, labels.shape[1])
        fmt = self._formats.get(key)
        if fmt is None:
            fmt = self._formats[key] = resolve_label_format(labels, self.num_labels, self.label_format)
        return fmt

    @property
    def queue(self) -> EmbeddingQueue | None:
        """The queue (None in batch mode and before the first training batch)."""
        return None if self.memory is None else self.memory.queue

    def _build_memory(self, embeddings: Tensor, labels: Tensor) -> MomentumContrast:
        """The queue (K, D) on the embeddings' device in a :class:`MomentumContrast` with the loss paper's
        contrast set; the integration computes the keys (no key encoder in the piece)."""
        num_labels = self.num_labels or labels.shape[1]
        queue = EmbeddingQueue(self.queue_size, embeddings.shape[1], num_labels, device=embeddings.device)
        return MomentumContrast(
            self.loss_fn, None, queue, self.contrast_set, self.queue_warmup, gather=self.gather
        )

    def __call__(
        self, embeddings: Tensor, labels: Tensor, keys: Callable[[], Tensor] | None = None
    ) -> Tensor:
        """The loss of ``embeddings`` (B, D) with ``labels``; with a queue in training, ``keys()`` gives the
        batch's key embeddings (default: ``embeddings`` without gradient)."""
        with self.checks():
            y = self.multi_hot(labels.to(embeddings.device), check_values=self.checks.pending)
            if self.queue_size == 0 or not torch.is_grad_enabled():  # in-batch candidates (evaluation too)
                return self.candidates.step(embeddings, y).loss(self.loss_fn)
            if self.memory is None:
                self.memory = self._build_memory(embeddings, y)
            with torch.no_grad():
                raw = keys() if keys is not None else embeddings.detach()
            return self.memory(embeddings, y, self.memory.gather_keys(raw, y))  # the loss, then the enqueue


def contrastive_batch_loss(
    loss: str,
    loss_kwargs: dict,
    temperature: float | None,
    embedding_dim: int | None,
    num_labels: int | None,
    label_format: str,
    gather_across_devices: bool,
    queue_size: int,
    contrast_set: str | None,
    queue_warmup: bool | None,
) -> BatchLoss:
    """The :class:`BatchLoss` of an integration's contrastive loss ``loss`` (its ``loss_kwargs`` and the run's
    ``temperature``, ``num_labels`` and ``embedding_dim``: :func:`~hf_mlcl.losses.registry.build_contrastive_loss`),
    the other arguments as :class:`BatchLoss`'s."""
    loss_fn = build_contrastive_loss(
        loss, loss_kwargs, temperature=temperature, num_labels=num_labels, embedding_dim=embedding_dim
    )
    return BatchLoss(
        loss_fn, num_labels, label_format, gather_across_devices, queue_size, contrast_set, queue_warmup
    )
