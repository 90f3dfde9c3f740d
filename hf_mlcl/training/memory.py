"""Cross-batch memory for contrastive losses: the MoCo queue, the contrast set of a step, and both wrapped
around any loss with a momentum key encoder (:class:`MomentumContrast`).

:class:`EmbeddingQueue` keeps past keys and their labels; :class:`CandidateBuilder` builds a step's
:class:`ContrastStep` (anchors and candidates) in the loss paper's ``contrast_set``.

References: MoCo, He et al. 2020, Sec. 3.2.
Design: docs/design.md, "Queue and contrast set (hf_mlcl/training/memory.py)".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from hf_mlcl.labels.multihot import nonzero_pairs, to_dense_bool, to_sparse_bool

from . import distributed as D

__all__ = [
    "CONTRAST_SETS",
    "CandidateBuilder",
    "ContrastStep",
    "EmbeddingQueue",
    "MomentumContrast",
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
    per_device_batch: int, world_size: int, n_views: int, queue_size: int, contrast_set: str | None
) -> int:
    """The most candidates an anchor can have in one step (an upper bound on its positives).

    B = per-device batch x processes. Batch mode: n_views * B - 1; with a queue of K (the anchors
    are view 1, the keys view 2 when ``n_views == 2``): ``"keys"`` B + K, ``"queries+queue"`` B - 1 + K,
    ``"queries+keys"`` 2B - 1 + K.
    """
    b = per_device_batch * world_size
    if contrast_set is None:
        return n_views * b - 1
    return {"keys": b, "queries+queue": b - 1, "queries+keys": 2 * b - 1}[contrast_set] + queue_size


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


# on CPU, label spaces wider than this are queued as label rows ("auto"; EmbeddingQueue docstring)
CPU_SPARSE_LABELS = 256


class EmbeddingQueue:
    """Ring buffer of the last K key embeddings (K, D) and their labels (MoCo queue, He et al. 2020).

    Labels are kept as a (K, L) bool matrix (``label_format="bool"``) or as padded label-index rows
    (``"sparse"``; ``.labels`` then returns a torch sparse COO (n, L) bool tensor). ``"auto"`` picks
    sparse when K * L > 2**27 (128 MB), and on a CPU queue also when L > 256: the loss reads the
    queue's labels every step, and on CPU a (K, L) bool matrix costs more than the label rows from
    about 200 labels on (``benchmarks/loss_speed.py --queue-formats``, K = 4,096, mulsupcon / any, step
    time with the bool matrix over step time with the rows: 0.80-0.97 at L = 28-160, 1.03-1.07 at
    256, 1.29-1.33 at 512, 1.45-1.76 at 1,000-25,230). A state saved with the other format is adopted
    by an ``"auto"`` queue on :meth:`load_state_dict`.

    Host reads: :meth:`enqueue` and the queue's tensors read no value on the host with ``"bool"``
    labels (the pointer and fill count are Python integers); ``"sparse"`` labels need data-dependent
    shapes (the label rows' non-zeros), read at each enqueue and each ``labels`` access.
    """

    def __init__(
        self,
        size: int,
        dim: int,
        num_labels: int,
        label_format: str = "auto",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if size <= 0 or dim <= 0 or num_labels <= 0:
            raise ValueError(
                f"size, dim and num_labels must be positive; got size={size}, dim={dim}, num_labels={num_labels}"
            )
        self._auto_format = label_format == "auto"
        if label_format == "auto":
            on_cpu = torch.device(device if device is not None else "cpu").type == "cpu"
            dense = size * num_labels <= 2**27 and not (on_cpu and num_labels > CPU_SPARSE_LABELS)
            label_format = "bool" if dense else "sparse"
        if label_format not in ("bool", "sparse"):
            raise ValueError(f"label_format must be 'auto', 'bool' or 'sparse'; got {label_format!r}")
        self.size, self.dim, self.num_labels, self.label_format = (
            int(size),
            int(dim),
            int(num_labels),
            label_format,
        )
        self._emb = torch.zeros(self.size, self.dim, dtype=dtype, device=device)
        if label_format == "bool":
            self._lab = torch.zeros(self.size, self.num_labels, dtype=torch.bool, device=device)
        else:
            self._lab = torch.full((self.size, 1), -1, dtype=torch.int32, device=device)
        self.ptr = 0
        self.n_filled = 0

    def __len__(self) -> int:
        return self.n_filled

    @property
    def device(self) -> torch.device:
        return self._emb.device

    def to(self, device: torch.device | str) -> EmbeddingQueue:
        self._emb = self._emb.to(device)
        self._lab = self._lab.to(device)
        return self

    # ------------------------------------------------------------------------------------------------
    def _label_indices(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, L) dense or sparse multi-hot -> (B, M) int32 label ids padded with -1 (vectorised)."""
        batch = labels.shape[0]
        rows, cols = nonzero_pairs(labels)  # row-major: each row's ids in ascending order
        counts = torch.bincount(rows, minlength=batch)
        width = max(1, int(counts.max()) if counts.numel() else 1)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(rows.numel(), device=rows.device) - starts[rows]
        out = torch.full((batch, width), -1, dtype=torch.int32, device=self.device)
        out[rows.to(self.device), slot.to(self.device)] = cols.to(self.device, torch.int32)
        return out

    @torch.no_grad()
    def enqueue(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        """Write a batch at the pointer, wrapping around (oldest entries are overwritten)."""
        if embeddings.dim() != 2 or embeddings.shape[1] != self.dim:
            raise ValueError(f"embeddings must be (B, {self.dim}); got {tuple(embeddings.shape)}")
        if labels.dim() != 2 or labels.shape[0] != embeddings.shape[0] or labels.shape[1] != self.num_labels:
            raise ValueError(
                f"labels must be (B, {self.num_labels}) with B={embeddings.shape[0]}; got {tuple(labels.shape)}"
            )
        batch = embeddings.shape[0]
        if batch == 0:
            return
        embeddings = embeddings.detach()
        if labels.layout not in (torch.strided, torch.sparse_coo):
            labels = labels.to_sparse_coo()  # CSR / BSR -> COO (row selection below needs it)
        if batch > self.size:  # only the newest K rows survive
            newest = torch.arange(batch - self.size, batch, device=labels.device)
            embeddings, labels = embeddings[-self.size :], labels.index_select(0, newest)
            self.ptr = (self.ptr + batch - self.size) % self.size
            batch = self.size
        index = (self.ptr + torch.arange(batch, device=self.device)) % self.size
        self._emb[index] = embeddings.to(self._emb.device, self._emb.dtype)
        if self.label_format == "bool":
            dense = labels.to_dense() if labels.layout != torch.strided else labels
            self._lab[index] = dense.to(self.device) != 0
        else:
            rows = self._label_indices(labels)
            if rows.shape[1] > self._lab.shape[1]:
                grown = torch.full((self.size, rows.shape[1]), -1, dtype=torch.int32, device=self.device)
                grown[:, : self._lab.shape[1]] = self._lab
                self._lab = grown
            elif rows.shape[1] < self._lab.shape[1]:
                pad = torch.full(
                    (batch, self._lab.shape[1] - rows.shape[1]), -1, dtype=torch.int32, device=self.device
                )
                rows = torch.cat([rows, pad], dim=1)
            self._lab[index] = rows
        self.ptr = (self.ptr + batch) % self.size
        self.n_filled = min(self.n_filled + batch, self.size)

    # ------------------------------------------------------------------------------------------------
    @property
    def embeddings(self) -> torch.Tensor:
        """(n_filled, D) queued embeddings (slot order)."""
        return self._emb[: self.n_filled]

    @property
    def labels(self) -> torch.Tensor:
        """(n_filled, L) labels: a bool tensor, or a sparse COO bool tensor for ``label_format="sparse"``."""
        if self.label_format == "bool":
            return self._lab[: self.n_filled]
        rows = self._lab[: self.n_filled]
        r, c = (rows >= 0).nonzero(as_tuple=True)
        indices = torch.stack([r, rows[r, c].long()])
        values = torch.ones(indices.shape[1], dtype=torch.bool, device=self.device)
        return torch.sparse_coo_tensor(
            indices, values, (self.n_filled, self.num_labels), check_invariants=False
        ).coalesce()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume with the same queue contents and pointer."""
        return {
            "size": self.size,
            "dim": self.dim,
            "num_labels": self.num_labels,
            "label_format": self.label_format,
            "ptr": self.ptr,
            "n_filled": self.n_filled,
            "embeddings": self._emb.detach().cpu().clone(),
            "labels": self._lab.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("size", "dim", "num_labels"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"queue state has {key}={state[key]} but this queue has {getattr(self, key)}; "
                    "build the queue with the saved sizes"
                )
        if state["label_format"] != self.label_format:
            if not self._auto_format:
                raise ValueError(
                    f"queue state stores labels as {state['label_format']!r}, this queue as "
                    f"{self.label_format!r}; build it with label_format='auto' or {state['label_format']!r}"
                )
            self.label_format = state["label_format"]  # "auto": resume in the format the state was saved in
        self._emb = state["embeddings"].to(self.device, self._emb.dtype).clone()
        self._lab = state["labels"].to(self.device).clone()
        self.ptr = int(state["ptr"])
        self.n_filled = int(state["n_filled"])

    def memory_bytes(self) -> int:
        """Bytes held by the queue tensors."""
        return self._emb.numel() * self._emb.element_size() + self._lab.numel() * self._lab.element_size()

    def __repr__(self) -> str:
        return (
            f"EmbeddingQueue(size={self.size}, dim={self.dim}, num_labels={self.num_labels}, "
            f"label_format={self.label_format!r}, filled={self.n_filled}, ptr={self.ptr}, "
            f"MB={self.memory_bytes() / 2**20:.1f})"
        )


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
        gather: under data parallelism, every process's samples are candidates (keys gathered without
            gradient, other processes' queries with gradient).

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
        momentum: float = 0.999,
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
