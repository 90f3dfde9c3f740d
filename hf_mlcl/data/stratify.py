"""Iterative stratification of a multi-label dataset into folds (Sechidis, Tsoumakas & Vlahavas,
"On the Stratification of Multi-Label Data", ECML-PKDD 2011, Algorithm 1).

Random splits lose rare labels: a label on 20 of 40,000 training rows has a fair chance of reaching a
10 % validation split with none or one example, so its validation F1 is noise and threshold tuning
ignores it. Iterative stratification fills the folds label by label, rarest first: with desired fold
sizes c_j = r_j |D| and per-label demands c_j^l = r_j |D^l|, it repeatedly takes the label l with the
fewest remaining rows and gives each of its rows to the fold that still wants most of l (ties: the fold
that wants most rows overall, then at random), decrementing that fold's demand for every label of the
row. Rows without labels fill the remaining fold sizes at random.

Vectorised where it matters: inside the block of one label only c^l and c are read, so the greedy
choice runs on scalars for that block's rows, and the demands of all the other labels are updated once
per block from the rows' label lists (``np.add.at``); the labels' remaining counts are kept as an array
(one ``argmin`` per label). Work O(nnz + L^2 + n), a fraction of a second on GoEmotions' 43k rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["SPLIT_STRATEGIES", "check_split_strategy", "iterative_stratification", "stratified_carve"]

# how a missing split is carved from train: a seeded random share, or iterative stratification
SPLIT_STRATEGIES = ("random", "stratified")


def check_split_strategy(strategy: str) -> None:
    """ValueError (one line) unless ``strategy`` is one of ``SPLIT_STRATEGIES``."""
    if strategy not in SPLIT_STRATEGIES:
        raise ValueError(f"split_strategy must be one of {SPLIT_STRATEGIES}; got {strategy!r}")


def _label_lists(rows: Sequence[Sequence[int]], num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices): the rows' label ids as CSR, each row's ids sorted and unique."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    flat = np.fromiter((int(i) for r in rows for i in r), dtype=np.int64, count=int(lengths.sum()))
    if flat.size and (flat.min() < 0 or flat.max() >= num_labels):
        raise ValueError(
            f"label ids must lie in [0, {num_labels}); got {int(flat.min())} .. {int(flat.max())}"
        )
    pairs = np.unique(np.repeat(np.arange(len(rows), dtype=np.int64), lengths) * num_labels + flat)
    indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.bincount(pairs // num_labels, minlength=len(rows)), out=indptr[1:])
    return indptr, pairs % num_labels


def _labels_of(indptr: np.ndarray, indices: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position in ``rows``, label id) of every label of the given rows, without a pass over all rows."""
    starts = indptr[rows]
    lengths = indptr[rows + 1] - starts
    owner = np.repeat(np.arange(rows.size), lengths)
    offset = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    return owner, indices[starts[owner] + offset]


def iterative_stratification(
    label_rows: Sequence[Sequence[int]],
    proportions: Sequence[float],
    seed: int,
    num_labels: int | None = None,
) -> np.ndarray:
    """The fold (0 .. k-1) of every row, by Sechidis et al.'s iterative stratification (module docstring).

    Args:
        label_rows: the label ids of each row (e.g. a split's ``labels`` column).
        proportions: desired share of each fold (positive, summing to 1).
        seed: seed of the random tie-breaks and of the order of each label's rows.
        num_labels: size of the label space (default: the largest id + 1).
    """
    r = np.asarray(proportions, dtype=np.float64)
    if r.ndim != 1 or r.size < 2 or np.any(r <= 0) or not np.isclose(r.sum(), 1.0):
        raise ValueError(f"proportions must be >= 2 positive shares summing to 1; got {list(proportions)}")
    n, k = len(label_rows), r.size
    if num_labels is None:
        num_labels = 1 + max((int(i) for row in label_rows for i in row), default=-1)
    num_labels = max(num_labels, 1)
    indptr, indices = _label_lists(label_rows, num_labels)
    row_of = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    by_label = np.argsort(indices, kind="stable")  # CSC: the rows carrying each label, in row order
    col_rows = row_of[by_label]
    col_ptr = np.zeros(num_labels + 1, dtype=np.int64)
    np.cumsum(np.bincount(indices, minlength=num_labels), out=col_ptr[1:])

    rng = np.random.default_rng(seed)
    remaining = np.diff(col_ptr)  # unassigned rows carrying each label, |D^l|
    demand = r[:, None] * remaining[None, :].astype(np.float64)  # c_j^l
    left = (r * n).tolist()  # c_j
    fold = np.full(n, -1, dtype=np.int64)
    while (remaining > 0).any():
        counts = np.where(remaining > 0, remaining, np.iinfo(np.int64).max)
        rarest = np.flatnonzero(counts == counts.min())
        label = int(rarest[rng.integers(rarest.size)])
        rows = col_rows[col_ptr[label] : col_ptr[label + 1]]
        rows = rows[fold[rows] < 0]
        rows = rows[rng.permutation(rows.size)]
        want = demand[:, label].tolist()
        ties = rng.random((rows.size, k)).tolist()  # random order among folds equal on both demands
        chosen = np.empty(rows.size, dtype=np.int64)
        for t in range(rows.size):  # only c^l and c are read inside one label's block
            tie = ties[t]
            best = max(range(k), key=lambda j: (want[j], left[j], tie[j]))
            chosen[t] = best
            want[best] -= 1.0
            left[best] -= 1.0
        fold[rows] = chosen
        owner, labels = _labels_of(indptr, indices, rows)  # every label of the block's rows, at once
        np.add.at(demand, (chosen[owner], labels), -1.0)
        np.subtract.at(remaining, labels, 1)
    free = np.flatnonzero(fold < 0)  # rows without labels: fill the folds that still want rows
    if free.size:
        counts = [0] * k
        for _ in range(free.size):
            j = max(range(k), key=lambda j: left[j])
            counts[j] += 1
            left[j] -= 1.0
        fold[free[rng.permutation(free.size)]] = np.repeat(np.arange(k), counts)
    return fold


def stratified_carve(
    label_rows: Sequence[Sequence[int]], fraction: float, seed: int, num_labels: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Sorted row positions ``(kept, carved)``: a ``fraction`` of the rows carved by iterative stratification
    (two folds, proportions ``1 - fraction`` and ``fraction``), as :func:`hf_mlcl.data.registry.carve_validation`
    returns them for the random carve."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"fraction must lie in (0, 1); got {fraction}")
    fold = iterative_stratification(label_rows, (1.0 - fraction, fraction), seed, num_labels)
    return np.flatnonzero(fold == 0), np.flatnonzero(fold == 1)
