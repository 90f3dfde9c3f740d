"""The contrast set of a contrastive step: which candidates each anchor is contrasted with.

:data:`CONTRAST_SETS` names the MoCo sets (``"keys"``, ``"queries+queue"``, ``"queries+keys"``), checked and
resolved per loss (its paper's ``default_contrast_set``); :class:`CandidateBuilder` builds a step's
:class:`ContrastStep` (anchors and candidates: in-batch samples, other processes', momentum keys, the queue)
and :func:`max_candidates` bounds what an anchor can see. References: MoCo, He et al. 2020, Sec. 3.2.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from hf_mlcl.labels.multihot import to_dense_bool, to_sparse_bool

from . import distributed as D

__all__ = [
    "CONTRAST_SETS",
    "CandidateBuilder",
    "ContrastStep",
    "check_contrast_set",
    "check_queue_loss",
    "max_candidates",
    "resolve_contrast_set",
    "resolve_queue_warmup",
]

CONTRAST_SETS = ("queries+keys", "keys", "queries+queue")


def check_contrast_set(contrast_set: str | None, queue_size: int) -> None:
    """ValueError for an unknown ``contrast_set`` or one given without a queue (``queue_size == 0``)."""
    if contrast_set is not None and contrast_set not in CONTRAST_SETS:
        raise ValueError(
            f"contrast_set must be one of {CONTRAST_SETS} (or unset: the loss paper's default); "
            f"got {contrast_set!r}"
        )
    if queue_size <= 0 and contrast_set is not None:
        raise ValueError(
            f"contrast_set={contrast_set!r} chooses the MoCo candidates and needs queue_size > 0; without a "
            "queue every loss contrasts the other in-batch samples (leave contrast_set unset)"
        )


def check_queue_loss(loss_fn: Any, queue_size: int) -> None:
    """ValueError for a queue (``queue_size > 0``) with a loss that takes no key embeddings."""
    if queue_size > 0 and not getattr(loss_fn, "supports_keys", False):
        raise ValueError(
            f"queue_size={queue_size} needs a loss that takes key embeddings, but {type(loss_fn).__name__} has "
            "supports_keys=False; set queue_size=0 or choose a loss with keys"
        )


def resolve_contrast_set(loss_fn: Any, contrast_set: str | None, queue_size: int) -> str | None:
    """The step's contrast set: None in batch mode (``queue_size == 0``), else ``contrast_set`` or the
    loss's ``default_contrast_set`` (``"queries+keys"`` for a loss that declares none).

    ValueError for an unknown name, for a set given without a queue, and for ``"keys"`` with a loss
    that cannot drop the anchor-anchor pairs (``supports_keys_only`` not set).
    """
    check_contrast_set(contrast_set, queue_size)
    if queue_size <= 0:
        return None
    chosen = contrast_set or getattr(loss_fn, "default_contrast_set", "queries+keys")
    if chosen not in CONTRAST_SETS:
        raise ValueError(
            f"{type(loss_fn).__name__}.default_contrast_set={chosen!r} is not one of {CONTRAST_SETS}"
        )
    if chosen == "keys" and not getattr(loss_fn, "supports_keys_only", False):
        raise ValueError(
            f"contrast_set='keys' needs a loss that takes the keys as its only candidates (anchors_in_candidates=False, "
            f"supports_keys_only); {type(loss_fn).__name__} does not: choose contrast_set='queries+keys'"
        )
    return chosen


def resolve_queue_warmup(loss_fn: Any, queue_warmup: bool | None) -> bool:
    """``queue_warmup`` or, when None, the loss's ``default_queue_warmup`` (False if it declares none)."""
    if queue_warmup is None:
        return bool(getattr(loss_fn, "default_queue_warmup", False))
    return bool(queue_warmup)


def max_candidates(
    per_device_batch: int,
    world_size: int,
    n_views: int,
    queue_size: int,
    contrast_set: str | None,
    gather: bool = True,
) -> int:
    """The most candidates an anchor can have in one step (an upper bound on its positives).

    B = per-device batch x processes, Q = B with ``gather`` (the queries of every process), else the
    per-device batch; the momentum keys come from every process either way (MoCo's gathered keys). Batch
    mode: n_views * Q - 1; with a queue of K (the anchors are view 1, the keys view 2 when ``n_views == 2``):
    ``"keys"`` B + K, ``"queries+queue"`` Q - 1 + K, ``"queries+keys"`` Q - 1 + B + K.
    """
    b = per_device_batch * world_size
    q = b if gather else per_device_batch
    if contrast_set is None:
        return n_views * q - 1
    return {"keys": b, "queries+queue": q - 1, "queries+keys": q - 1 + b}[contrast_set] + queue_size


@dataclass
class ContrastStep:
    """What one step hands to the loss: local anchors, the extra candidates (keys) and whether the
    anchors are candidates of each other (False for the ``"keys"`` set)."""

    anchors: Tensor
    anchor_labels: Tensor
    keys: Tensor | None = None
    key_labels: Tensor | None = None
    anchors_in_candidates: bool = True

    def components(self, loss_fn: Any) -> dict[str, Tensor]:
        """``loss_fn.components(anchors, labels[, keys, key_labels][, anchors_in_candidates=False])``: the loss
        and its parts (:meth:`hf_mlcl.losses.core.ContrastiveLoss.components`); ``{"loss": loss_fn(...)}``
        for a loss without parts."""
        args = (
            (self.anchors, self.anchor_labels)
            if self.keys is None
            else (self.anchors, self.anchor_labels, self.keys, self.key_labels)
        )
        extra = {} if self.anchors_in_candidates else {"anchors_in_candidates": False}
        parts = getattr(loss_fn, "components", None)
        return parts(*args, **extra) if callable(parts) else {"loss": loss_fn(*args, **extra)}

    def loss(self, loss_fn: Any) -> Tensor:
        """The scalar loss of :meth:`components`."""
        return self.components(loss_fn)["loss"]


def _cat(
    parts: list[tuple[Tensor, Tensor] | None], dtype: torch.dtype
) -> tuple[Tensor | None, Tensor | None]:
    parts = [p for p in parts if p is not None and p[0].shape[0] > 0]
    if not parts:
        return None, None
    emb = torch.cat([e.to(dtype) for e, _ in parts])
    labels = [lab for _, lab in parts]
    if all(lab.layout == torch.strided for lab in labels):
        return emb, torch.cat([to_dense_bool(lab).to(emb.device) for lab in labels])
    # a queue that keeps label rows (a wide label space) stays sparse: the loss then never reads a
    # dense (K, L) matrix (:class:`EmbeddingQueue`)
    return emb, torch.cat([to_sparse_bool(lab).to(emb.device) for lab in labels]).coalesce()


class CandidateBuilder:
    """Builds a step's :class:`ContrastStep` from the online embeddings, the momentum keys and the queue.

    Args:
        contrast_set: None (batch mode) or one of :data:`CONTRAST_SETS` (:func:`resolve_contrast_set`).
        queue: the ``EmbeddingQueue`` (None in batch mode).
        queue_warmup: leave the queue out until it has been filled once.
        gather: gather the other processes' embeddings as candidates (``gather_across_devices``).
        supports_keys: False for a loss that takes no keys: under data parallelism the gathered
            global batch is then the anchor set on every rank (same loss everywhere; the gather's
            sum-backward hands rank r ``W dL/dz_r`` and DDP's 1/W average restores ``dL/dtheta``).
    """

    def __init__(
        self,
        contrast_set: str | None,
        queue: Any = None,
        queue_warmup: bool = False,
        gather: bool = True,
        supports_keys: bool = True,
    ) -> None:
        check_contrast_set(contrast_set, 0 if queue is None else 1)  # the one check, the one wording
        self.contrast_set = contrast_set
        self.queue = queue
        self.queue_warmup = bool(queue_warmup)
        self.gather = bool(gather)
        self.supports_keys = bool(supports_keys)

    @staticmethod
    @torch.no_grad()
    def gather_keys(keys: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """The momentum keys of every process (no gradient, rank order) with dense bool labels."""
        keys, labels = keys.detach(), to_dense_bool(labels)
        if D.is_distributed():
            keys = torch.cat(D.all_gather_no_grad(keys))
            labels = torch.cat(D.all_gather_no_grad(labels))
        return keys, labels

    def queue_part(self) -> tuple[Tensor, Tensor] | None:
        """The queue's keys and labels if they join this step (not empty; filled once under warm-up)."""
        q = self.queue
        if q is None or len(q) == 0 or (self.queue_warmup and len(q) < q.size):
            return None
        return q.embeddings, q.labels

    def step(
        self,
        embeddings: Tensor,
        labels: Tensor,
        batch_keys: tuple[Tensor, Tensor] | None = None,
    ) -> ContrastStep:
        """Anchors and candidates for local online ``embeddings`` / ``labels``.

        ``batch_keys``: the gathered momentum keys of this step (:meth:`gather_keys`), or None in batch
        mode and at evaluation (then the contrast set is the in-batch one whatever ``contrast_set``).
        """
        mode = self.contrast_set if batch_keys is not None else None
        dtype = embeddings.dtype
        if mode == "keys":
            keys, key_labels = _cat([batch_keys, self.queue_part()], dtype)
            return ContrastStep(embeddings, labels, keys, key_labels, anchors_in_candidates=False)
        others = None
        if self.gather and D.is_distributed():
            if not self.supports_keys:
                embeddings = torch.cat(D.all_gather_with_grad(embeddings))
                labels = torch.cat(D.all_gather_no_grad(to_dense_bool(labels)))
            else:
                others = D.gather_candidates(embeddings, labels)
        extra = [others]
        if mode == "queries+keys":
            extra += [batch_keys, self.queue_part()]
        elif mode == "queries+queue":
            extra += [self.queue_part()]
        keys, key_labels = _cat(extra, dtype)
        return ContrastStep(embeddings, labels, keys, key_labels)

    def enqueue(self, batch_keys: tuple[Tensor, Tensor] | None) -> None:
        """Add this step's gathered keys to the queue (after the loss: they were not in it yet)."""
        if batch_keys is not None and self.queue is not None:
            self.queue.enqueue(*batch_keys)
