"""Embedding-space quality over the most frequent label combinations (Audibert et al. 2024, Sec. 5.3).

Audibert, Gauffre & Amini (2024), "Exploring Contrastive Learning for Long-Tailed Multi-Label Text
Classification" (ECML-PKDD), Sec. 5.3 and App. D: each distinct label set is treated as one class,
only the most represented label combinations are kept (they keep 50%), and the Silhouette score
(Rousseeuw 1987; higher is better) and the Davies-Bouldin index (Davies & Bouldin 1979; lower is
better) are computed on the embeddings of the kept examples.

Embeddings are L2-normalised first (the contrastive losses compare normalised vectors), so cosine and
euclidean distances rank pairs identically; the Silhouette metric is selectable, Davies-Bouldin is
euclidean by definition (centroid distances).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import to_numpy
from hf_mlcl.labels.multihot import binary_array, integer_multihot_rows, multi_hot_array

__all__ = [
    "checked_embeddings_and_labels",
    "embedding_quality",
    "label_combinations",
    "multi_hot_matrix",
    "normalised_embeddings",
    "top_combination_clusters",
]


def multi_hot_matrix(labels: Any, num_rows: int | None = None) -> np.ndarray:
    """(N, L) bool from a multi-hot matrix (numpy / torch / scipy sparse) or a list of label-id lists.

    Python lists of integer lists are label-id lists unless some row repeats a value, which no id list does
    (``[[1, 0, 1], [0, 1, 0]]`` is multi-hot, ``[[0], [1]]`` and ``[[0, 1], [1, 0]]`` are id lists); lists of
    bools or floats are multi-hot.
    """
    if isinstance(labels, (list, tuple)) and (len(labels) == 0 or not np.isscalar(labels[0])):
        try:
            arr = np.asarray(labels)
        except ValueError:
            arr = None
        integer_ids = arr is not None and arr.dtype.kind in "iu" and not integer_multihot_rows(arr)
        if arr is None or arr.dtype == object or (arr.ndim == 2 and arr.size and integer_ids):
            # label-id lists (ragged or not): scatter into a multi-hot matrix in one vectorised step
            return multi_hot_array(labels, hint="; label ids must be non-negative integers")
    y = to_numpy(labels, "labels")
    if y.ndim != 2:
        raise ValueError(
            f"labels must be an (N, L) multi-hot matrix or a list of label-id lists, got shape {y.shape}."
        )
    y = binary_array(y, "; convert label ids to a multi-hot matrix first.")
    if num_rows is not None and y.shape[0] != num_rows:
        raise ValueError(f"labels have {y.shape[0]} rows but embeddings have {num_rows}; they must match.")
    return y


def label_combinations(labels: Any) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Group examples by their exact label set.

    Returns ``(combination_id (N,), counts (C,), combinations)`` where combinations are ordered by
    decreasing frequency (ties: first appearance) and ``combinations[c]`` is the sorted array of label
    indices of combination ``c``. Rows are packed into bytes and uniqued in one vectorised call.
    """
    y = multi_hot_matrix(labels)
    packed = np.ascontiguousarray(np.packbits(y, axis=1))
    keys = packed.view(np.dtype((np.void, packed.shape[1]))).ravel()
    _, first, inverse, counts = np.unique(keys, return_index=True, return_inverse=True, return_counts=True)
    order = np.lexsort((first, -counts))  # most frequent first, then first seen
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    combos = [np.flatnonzero(y[first[c]]) for c in order]
    return rank[inverse.ravel()], counts[order], combos


def top_combination_clusters(
    labels: Any, top_k_combinations: int | float = 10, include_empty: bool = False
) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], np.ndarray]:
    """Keep the examples whose exact label set is among the most frequent combinations.

    ``top_k_combinations``: an int (number of combinations) or a float in (0, 1] (fraction of the
    distinct combinations, Audibert et al. keep 0.5). The empty label set counts as a combination only
    with ``include_empty=True``. Returns ``(mask (N,), cluster_id (n_kept,), combinations, counts)``
    with cluster ids 0..K-1 in decreasing frequency.
    """
    cid, counts, combos = label_combinations(labels)
    keep = np.array([c.size > 0 or include_empty for c in combos], dtype=bool)
    fraction = isinstance(top_k_combinations, (float, np.floating)) and (
        float(top_k_combinations) <= 1.0 or not float(top_k_combinations).is_integer()
    )  # a float in (0, 1] is a share (1.0: every combination); a whole float above 1 a count
    if fraction:
        if not 0.0 < top_k_combinations <= 1.0:
            raise ValueError("a fractional top_k_combinations must lie in (0, 1], e.g. 0.5 for half of them.")
        k = max(1, int(round(float(top_k_combinations) * int(keep.sum()))))
    else:
        k = int(top_k_combinations)
        if k < 1:
            raise ValueError(
                f"top_k_combinations must be >= 1 (or a fraction in (0, 1]), got {top_k_combinations}."
            )
    allowed = np.flatnonzero(keep)[:k]
    new_id = np.full(len(combos), -1, dtype=np.int64)
    new_id[allowed] = np.arange(allowed.size)
    mapped = new_id[cid]
    mask = mapped >= 0
    return mask, mapped[mask], [combos[c] for c in allowed], counts[allowed]


def normalised_embeddings(embeddings: Any) -> np.ndarray:
    """(N, D) float64 embeddings scaled to unit L2 norm; ValueError for a wrong rank or NaN / inf values."""
    x = to_numpy(embeddings, "embeddings")
    if x.ndim != 2:
        raise ValueError(f"embeddings must be a 2-D (N, D) array, got shape {x.shape}.")
    x = x.astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("embeddings contain NaN or infinite values.")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norms, 1e-12)


def checked_embeddings_and_labels(embeddings: Any, labels: Any) -> tuple[np.ndarray, np.ndarray]:
    """(L2-normalised (N, D) float64 embeddings, (N, L) bool labels); ValueError when the rows differ."""
    x = normalised_embeddings(embeddings)
    y = multi_hot_matrix(labels, num_rows=x.shape[0])
    if y.shape[0] != x.shape[0]:
        raise ValueError(f"labels have {y.shape[0]} rows but embeddings have {x.shape[0]}; they must match.")
    return x, y


def embedding_quality(
    embeddings: Any,
    labels: Any,
    top_k_combinations: int | float = 10,
    metric: str = "cosine",
    include_empty: bool = False,
    max_samples: int | None = 10000,
    random_state: int = 0,
) -> dict[str, float]:
    """Silhouette (higher = better) and Davies-Bouldin (lower = better) of L2-normalised embeddings,
    with one cluster per frequent label combination (Audibert et al. 2024, Sec. 5.3, Table 4).

    Args:
        embeddings: (N, D) array / tensor.
        labels: (N, L) multi-hot or a list of label-id lists.
        top_k_combinations: how many of the most frequent label sets to keep (int), or a fraction.
        metric: "cosine" or "euclidean" distance for the Silhouette score.
        max_samples: random subsample of the kept examples (Silhouette is O(n^2)); None keeps all.

    Returns ``{"silhouette": float, "davies_bouldin": float}``.
    """
    from sklearn.metrics import davies_bouldin_score, silhouette_score

    if metric not in ("cosine", "euclidean"):
        raise ValueError(f"metric must be 'cosine' or 'euclidean', got {metric!r}.")
    x, y = checked_embeddings_and_labels(embeddings, labels)
    mask, cid, combos, _ = top_combination_clusters(y, top_k_combinations, include_empty)
    x = x[mask]
    if max_samples is not None and x.shape[0] > max_samples:
        idx = np.sort(np.random.default_rng(random_state).choice(x.shape[0], max_samples, replace=False))
        x, cid = x[idx], cid[idx]
    n_clusters = np.unique(cid).size
    if n_clusters < 2 or x.shape[0] <= n_clusters:
        raise ValueError(
            f"need at least 2 label combinations and more examples than combinations, got {n_clusters} "
            f"combination(s) over {x.shape[0]} example(s); increase top_k_combinations or pass more examples."
        )
    return {
        "silhouette": float(silhouette_score(x, cid, metric=metric)),
        "davies_bouldin": float(davies_bouldin_score(x, cid)),
    }
