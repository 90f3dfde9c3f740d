"""The MoCo queue (:class:`EmbeddingQueue`): a ring buffer of past key embeddings and their labels, kept as
a bool matrix or as label-index rows, with the state a checkpoint saves. References: MoCo, He et al. 2020,
Sec. 3.2.
"""

from __future__ import annotations

from typing import Any

import torch

from hf_mlcl.labels.multihot import nonzero_pairs

__all__ = ["CPU_SPARSE_LABELS", "EmbeddingQueue"]

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
                f"the queue holds labels of width {self.num_labels}: labels must be (B, {self.num_labels}) "
                f"with B={embeddings.shape[0]}; got {tuple(labels.shape)}"
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
