"""Frozen pooled features held in memory: the dataset and collator a cached linear probe trains on.

A linear probe (Khosla et al. 2020, Sec. 4: the encoder frozen, a linear layer trained on its
representation) never changes the encoder's outputs, and the frozen encoder runs in eval mode (no
dropout), so every text's pooled representation is the same in every epoch. ``ProbingTrainer`` with
``cache_features`` computes them once per dataset and hands Trainer a :class:`PooledFeatureDataset`
instead of the texts; :class:`PooledFeatureCollator` batches its rows as ``{"pooled_features": (B, H),
"labels": multi-hot (B, L)}``, which ``MLCLForMultiLabelClassification.forward(pooled_features=...)``
turns into logits through the same dropout + linear head as the text path. Labels are kept as id lists
(CSR arrays), so a large label space (MIMIC-IV: 25,230 codes) never becomes a documents x labels matrix.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["POOLED_KEY", "PooledFeatureCollator", "PooledFeatureDataset"]

POOLED_KEY = "pooled_features"  # the keyword of MLCLForMultiLabelClassification.forward
_LABEL_IDS = "label_ids"


class PooledFeatureDataset(torch.utils.data.Dataset):
    """Map-style dataset of pooled features (N, H) and each row's label ids (CSR: ``indptr``, ``indices``).

    Row ``i`` is ``{"pooled_features": features[i], "label_ids": indices[indptr[i]:indptr[i + 1]]}``.
    """

    def __init__(self, features: torch.Tensor, indptr: np.ndarray, indices: np.ndarray) -> None:
        if features.dim() != 2 or len(indptr) != features.shape[0] + 1:
            raise ValueError(
                f"features must be (N, H) with N + 1 row pointers; got {tuple(features.shape)} and {len(indptr)}"
            )
        self.features = features
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)

    @classmethod
    def from_batches(cls, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> PooledFeatureDataset:
        """Collect ``(pooled (b, H), multi-hot (b, L))`` batches, in dataset order, into one dataset."""
        feats: list[torch.Tensor] = []
        counts: list[np.ndarray] = []
        indices: list[np.ndarray] = []
        for pooled, multi_hot in batches:
            rows, cols = (multi_hot > 0.5).nonzero(as_tuple=True)  # row-major: sorted by row
            feats.append(pooled.detach().float().cpu())
            counts.append(torch.bincount(rows, minlength=multi_hot.shape[0]).cpu().numpy())
            indices.append(cols.cpu().numpy())
        if not feats:
            raise ValueError("cannot cache the features of an empty dataset")
        indptr = np.concatenate([[0], np.cumsum(np.concatenate(counts))])
        return cls(torch.cat(feats), indptr, np.concatenate(indices))

    def multi_hot(self, num_labels: int) -> np.ndarray:
        """The rows' labels as an (N, num_labels) bool matrix."""
        out = np.zeros((len(self), num_labels), dtype=bool)
        out[np.repeat(np.arange(len(self)), np.diff(self.indptr)), self.indices] = True
        return out

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {POOLED_KEY: self.features[i], _LABEL_IDS: self.indices[self.indptr[i] : self.indptr[i + 1]]}


class PooledFeatureCollator:
    """Stack :class:`PooledFeatureDataset` rows; ``labels_to_tensor`` (the text collator's, e.g.
    ``MultiLabelCollator.labels_to_tensor``) builds the multi-hot labels, so both paths hand the loss
    the same label tensor (dense or sparse)."""

    def __init__(self, labels_to_tensor: Callable[[Sequence[Sequence[int]]], torch.Tensor]) -> None:
        self.labels_to_tensor = labels_to_tensor

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {
            POOLED_KEY: torch.stack([r[POOLED_KEY] for r in rows]),
            "labels": self.labels_to_tensor([r[_LABEL_IDS] for r in rows]),
        }
