"""Cross-batch memory for contrastive losses: any loss wrapped with a momentum key encoder, the MoCo queue
and the loss paper's contrast set (:class:`MomentumContrast`).

The queue is :class:`~hf_mlcl.training.embedding_queue.EmbeddingQueue`; the contrast set of a step
(:class:`CandidateBuilder`, :class:`ContrastStep`) is built in :mod:`hf_mlcl.training.contrast_sets`; both
are importable from here too.

References: MoCo, He et al. 2020, Sec. 3.2.
Design: docs/design.md, "Queue and contrast set (hf_mlcl/training/contrast_sets.py, embedding_queue.py, memory.py)".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from .contrast_sets import (
    CONTRAST_SETS,
    CandidateBuilder,
    ContrastStep,
    check_contrast_set,
    check_queue_loss,
    max_candidates,
    resolve_contrast_set,
    resolve_queue_warmup,
)
from .embedding_queue import CPU_SPARSE_LABELS, EmbeddingQueue
from .momentum import MOCO_MOMENTUM

__all__ = [
    "CONTRAST_SETS",
    "CPU_SPARSE_LABELS",
    "CandidateBuilder",
    "ContrastStep",
    "EmbeddingQueue",
    "MomentumContrast",
    "check_contrast_set",
    "check_queue_loss",
    "max_candidates",
    "output_embeddings",
    "resolve_contrast_set",
    "resolve_queue_warmup",
]


def output_embeddings(outputs: Any) -> Tensor:
    """The embeddings of an encoder's output: the tensor itself, ``outputs["embeddings"]`` or
    ``outputs.embeddings`` (``MLCLEncoderOutput``); ValueError naming the output type otherwise."""
    if isinstance(outputs, Tensor):
        return outputs
    if isinstance(outputs, dict) and "embeddings" in outputs:
        return outputs["embeddings"]
    emb = getattr(outputs, "embeddings", None)
    if emb is None:
        raise ValueError(f"the model output {type(outputs).__name__} has no `embeddings`; use an MLCLEncoder")
    return emb


class MomentumContrast:
    """Any hf_mlcl contrastive loss with MoCo memory: momentum keys, a queue of past keys and the loss paper's
    contrast set, as one piece (pytorch-metric-learning's ``CrossBatchMemory`` wraps a loss the same way).

    Args:
        loss: a contrastive loss with keys (``supports_keys``); its ``default_contrast_set`` and
            ``default_queue_warmup`` give the paper's set (``docs/losses.md``).
        key_encoder: the momentum encoder (:class:`~hf_mlcl.training.momentum.MomentumEncoder` of the
            online model, or :func:`~hf_mlcl.training.momentum.build_key_encoder`): called like the
            model, ``update(online)`` once per optimizer step. None: the caller computes the keys
            (e.g. the embeddings without gradient) and hands them to :meth:`gather_keys`.
        queue: the :class:`EmbeddingQueue` (K keys, their labels).
        contrast_set: ``"keys"``, ``"queries+queue"`` or ``"queries+keys"`` (None: the loss's).
        queue_warmup: leave the queue out until it has been filled once (None: the loss's).
        gather: under data parallelism, the other processes' queries are candidates too (gathered with
            gradient). The momentum keys are gathered from every process either way (without gradient, as
            MoCo's), so every process keeps the same queue.

    Example (one process; under DDP the same calls gather the keys, so every process keeps one queue)::

        moco = MomentumContrast.build(get_loss("mulsupcon"), encoder, queue_size=4096, num_labels=L)
        for batch, labels in loader:                      # labels: (B, L) multi-hot
            keys = moco.keys(batch, labels)               # the key encoder, no gradient
            loss = moco(encoder(**batch).embeddings, labels, keys)   # loss on the contrast set, then enqueue
            loss.backward(); optimizer.step(); optimizer.zero_grad()
            moco.update(encoder)                          # EMA of the key encoder, once per optimizer step

    :meth:`components` returns the loss's parts (and does not enqueue); :meth:`enqueue` adds a step's keys
    after its loss. :meth:`state_dict` / :meth:`load_state_dict` hold the key encoder and the queue (the
    ``momentum_encoder`` and ``queue`` entries of ``ContrastiveTrainer``'s checkpoint state).
    """

    def __init__(
        self,
        loss: nn.Module,
        key_encoder: Any,
        queue: EmbeddingQueue,
        contrast_set: str | None = None,
        queue_warmup: bool | None = None,
        gather: bool = True,
    ) -> None:
        check_queue_loss(loss, queue.size)
        self.loss = loss
        self.key_encoder = key_encoder
        self.queue = queue
        self.candidates = CandidateBuilder(
            resolve_contrast_set(loss, contrast_set, queue.size),
            queue=queue,
            queue_warmup=resolve_queue_warmup(loss, queue_warmup),
            gather=gather,
            supports_keys=True,
        )

    @classmethod
    def build(
        cls,
        loss: nn.Module,
        encoder: nn.Module,
        queue_size: int,
        num_labels: int,
        embedding_dim: int | None = None,
        momentum: float = MOCO_MOMENTUM,
        device: torch.device | str | None = None,
        **kwargs: Any,
    ) -> MomentumContrast:
        """A :class:`~hf_mlcl.training.momentum.MomentumEncoder` of ``encoder`` and a new queue of ``queue_size``
        keys (``embedding_dim``: default the encoder config's ``projection_dim``) on ``device`` (default: the
        encoder's); ``kwargs`` as the constructor's."""
        from .momentum import MomentumEncoder

        dim = embedding_dim or int(encoder.config.projection_dim)
        device = device if device is not None else next(encoder.parameters()).device
        queue = EmbeddingQueue(queue_size, dim, num_labels, device=device)
        return cls(loss, MomentumEncoder(encoder, momentum=momentum), queue, **kwargs)

    @property
    def contrast_set(self) -> str:
        return self.candidates.contrast_set

    def keys(
        self,
        inputs: dict[str, Any],
        labels: Tensor,
        embeddings_of: Callable[[Any], Tensor] = output_embeddings,
    ) -> tuple[Tensor, Tensor]:
        """This step's momentum keys of every process and their labels (no gradient): the key encoder on the
        model ``inputs``, its embeddings read by ``embeddings_of``."""
        if self.key_encoder is None:
            raise ValueError(
                "this MomentumContrast has no key encoder: compute the keys and call gather_keys(keys, labels)"
            )
        with torch.no_grad():
            keys = embeddings_of(self.key_encoder(**inputs))
        return self.gather_keys(keys, labels)

    def gather_keys(self, keys: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """Keys computed by the caller (B, D), and their labels, gathered from every process without
        gradient: what :meth:`components` and :meth:`__call__` take."""
        return self.candidates.gather_keys(keys, labels)

    def components(
        self, embeddings: Tensor, labels: Tensor, keys: tuple[Tensor, Tensor] | None
    ) -> dict[str, Tensor]:
        """The loss and its parts for local anchors ``embeddings`` against this step's candidates (``keys``
        from :meth:`keys`; None at evaluation: the in-batch contrast set). Does not enqueue."""
        return self.candidates.step(embeddings, labels, keys).components(self.loss)

    def enqueue(self, keys: tuple[Tensor, Tensor] | None) -> None:
        """Add a step's keys to the queue (after its loss: they were not in it yet)."""
        self.candidates.enqueue(keys)

    def __call__(self, embeddings: Tensor, labels: Tensor, keys: tuple[Tensor, Tensor]) -> Tensor:
        """The loss of :meth:`components`, then :meth:`enqueue` of ``keys``."""
        loss = self.components(embeddings, labels, keys)["loss"]
        self.enqueue(keys)
        return loss

    def update(self, online: nn.Module | None = None) -> None:
        """EMA step of the key encoder towards ``online`` (once per optimizer step; nothing without one)."""
        if self.key_encoder is not None:
            self.key_encoder.update(online)

    def to(self, device: torch.device | str) -> MomentumContrast:
        if self.key_encoder is not None:
            self.key_encoder.to(device)
        self.queue.to(device)
        return self

    def _parts(self) -> tuple[tuple[str, Any], ...]:
        held = (("momentum_encoder", self.key_encoder), ("queue", self.queue))
        return tuple((key, obj) for key, obj in held if obj is not None)

    def state_dict(self) -> dict[str, Any]:
        """``{"momentum_encoder": ..., "queue": ...}`` (the queue alone without a key encoder)."""
        return {key: obj.state_dict() for key, obj in self._parts()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore both; ValueError when ``state`` lacks one (a checkpoint written without a queue)."""
        for key, obj in self._parts():
            if key not in state:
                raise ValueError(f"the checkpoint has no {key} state but this run uses one (queue_size > 0)")
            obj.load_state_dict(state[key])
