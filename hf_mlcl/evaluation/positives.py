"""The positives of a batch streamed into :class:`~hf_mlcl.evaluation.streaming.MultiLabelAccumulator`:
their (row, label) coordinates from any truth format (dense or sparse multi-hot, label-id lists), and the
counts that rank a positive's score within its row or its group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import check_true

__all__ = ["count_below", "expected_in_top", "ge_within", "reference_positives", "tied_counts"]


def reference_positives(references: Any, rows: int, num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, label) of every positive of a batch, sorted by row then label, from a dense multi-hot
    matrix (numpy / torch), a sparse one (torch, scipy) or a list of label-id lists (one per row). A list of
    equal rows is read by the rule of :func:`~hf_mlcl.labels.multihot.resolve_label_format` (float or bool
    rows, or 0/1 integer rows ``num_labels`` wide, are multi-hot)."""
    if isinstance(references, (list, tuple)) and _multi_hot_rows(references, num_labels):
        references = np.asarray(references)
    if isinstance(references, (list, tuple)):
        ids = [np.asarray(r, dtype=np.int64).ravel() for r in references]
        if len(ids) != rows:
            raise ValueError(f"{len(ids)} label-id lists for {rows} prediction rows.")
        cols = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if cols.size and (cols.min() < 0 or cols.max() >= num_labels):
            raise ValueError(f"label ids must lie in [0, {num_labels}), got {cols.min()}..{cols.max()}.")
        row = np.repeat(np.arange(rows, dtype=np.int64), [r.size for r in ids])
        key = np.unique(row * num_labels + cols)
        return key // num_labels, key % num_labels
    if hasattr(references, "tocsr"):  # scipy sparse
        m = references.tocsr()
        m.sum_duplicates()
        m.eliminate_zeros()
        if m.shape != (rows, num_labels):
            raise ValueError(f"references have shape {m.shape}, predictions ({rows}, {num_labels}).")
        if m.nnz and not np.all(m.data == 1):
            raise ValueError("references must contain only 0 and 1 (multi-hot).")
        return np.repeat(np.arange(rows, dtype=np.int64), np.diff(m.indptr)), m.indices.astype(np.int64)
    y = check_true(references, "references")
    if y.shape != (rows, num_labels):
        raise ValueError(f"references have shape {y.shape}, predictions ({rows}, {num_labels}).")
    r, c = np.nonzero(y)
    return r.astype(np.int64), c.astype(np.int64)


def _multi_hot_rows(rows: list | tuple, num_labels: int) -> bool:
    """True when a list of label rows is a multi-hot matrix (the library's rule for a label batch)."""
    import torch

    from hf_mlcl.labels.multihot import resolve_label_format

    try:
        matrix = np.asarray(rows)
    except ValueError:  # ragged: label-id lists
        return False
    if matrix.ndim != 2 or matrix.dtype == object or not matrix.size:
        return False
    return resolve_label_format(torch.as_tensor(matrix), num_labels) == "multi_hot"


def count_below(sorted_rows: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each (row, value): number of entries of ``sorted_rows[row]`` (ascending) below ``value``."""
    width = sorted_rows.shape[1]
    lo = np.zeros(rows.size, dtype=np.int64)
    hi = np.full(rows.size, width, dtype=np.int64)
    for _ in range(max(1, int(width).bit_length() + 1)):  # vectorised bisection, every query at once
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) // 2
        below = active & (sorted_rows[rows, np.minimum(mid, width - 1)] < values)
        lo = np.where(below, mid + 1, lo)
        hi = np.where(active & ~below, mid, hi)
    return lo


def tied_counts(
    sorted_rows: np.ndarray, rows: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each (row, value) of ``sorted_rows`` (ascending): the entries of the row above ``value``, and those
    equal to it (the value itself included when it is an entry)."""
    above = np.nextafter(values, np.array(np.inf, dtype=values.dtype))  # the next representable score
    n_lt = count_below(sorted_rows, rows, values)
    n_le = count_below(sorted_rows, rows, above)
    return sorted_rows.shape[1] - n_le, n_le - n_lt


def expected_in_top(n_above: np.ndarray, n_tied: np.ndarray, depth: Any) -> np.ndarray:
    """The chance that a label with ``n_above`` labels scored above it and ``n_tied`` scored as it (itself
    included) is among the ``depth`` top-scored labels when tied labels come in random order:
    ``clip((depth - n_above) / n_tied, 0, 1)``, 1 or 0 without a tie (broadcasts)."""
    return np.clip((np.asarray(depth) - n_above) / n_tied, 0.0, 1.0)


def ge_within(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each item: number of items of its group with a value >= its value (ties included)."""
    if groups.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    new_value = new_group | np.r_[True, v[1:] != v[:-1]]
    start = np.maximum.accumulate(np.where(new_value, np.arange(g.size), 0))
    end = np.r_[np.flatnonzero(new_group)[1:], g.size]  # one past each group's last item
    group_end = end[np.cumsum(new_group) - 1]
    out = np.empty(g.size, dtype=np.int64)
    out[order] = group_end - start
    return out
