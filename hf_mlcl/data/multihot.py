"""Multi-hot label matrices from label-id lists: the one vectorised scatter every caller uses.

Datasets store labels as id lists (``Sequence(ClassLabel)``); the collator (per batch), the trainers
(training-set label statistics) and the embedding-quality metrics (label combinations) turn them
into (N, L) multi-hot matrices through :func:`label_coordinates` — one ``np.repeat`` for the rows and
one concatenation for the columns, never a per-example Python loop over labels.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

__all__ = ["label_coordinates", "multi_hot_tensor"]


def label_coordinates(
    label_lists: Sequence[Sequence[int]], num_labels: int | None = None, hint: str = ""
) -> tuple[np.ndarray, np.ndarray, int]:
    """(rows, cols, num_labels) of the ones of the multi-hot matrix of ``label_lists``.

    ``num_labels=None`` infers ``max id + 1`` (at least 1). ValueError naming the first id outside
    ``[0, num_labels)``, followed by ``hint`` (how the caller fixes it).
    """
    arrays = [np.asarray(x, dtype=np.int64).reshape(-1) for x in label_lists]
    lengths = np.fromiter((len(x) for x in arrays), dtype=np.int64, count=len(arrays))
    cols = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    if num_labels is None:
        num_labels = int(cols.max()) + 1 if cols.size else 1
    if cols.size and (cols.min() < 0 or cols.max() >= num_labels):
        bad = cols[(cols < 0) | (cols >= num_labels)]
        raise ValueError(f"label id {int(bad[0])} is outside [0, num_labels={num_labels}){hint}")
    rows = np.repeat(np.arange(len(arrays)), lengths)
    return rows, cols, int(num_labels)


def multi_hot_tensor(
    label_lists: Sequence[Sequence[int]], num_labels: int, sparse: bool = False, hint: str = ""
) -> torch.Tensor:
    """Id lists -> float32 (N, L) multi-hot: dense, or a coalesced ``torch.sparse_coo_tensor``."""
    rows, cols, num_labels = label_coordinates(label_lists, num_labels, hint)
    rows_t, cols_t = torch.from_numpy(rows), torch.from_numpy(cols)
    shape = (len(label_lists), num_labels)
    if sparse:
        idx = torch.stack([rows_t, cols_t])
        return torch.sparse_coo_tensor(idx, torch.ones(idx.shape[1]), shape, check_invariants=False).coalesce()
    out = torch.zeros(shape, dtype=torch.float32)
    out[rows_t, cols_t] = 1.0
    return out
