"""PNG plots: per-label F1 against training frequency (long-tail view) and a 2-D embedding projection.

Figures are drawn with matplotlib's object API on an Agg canvas (``matplotlib.figure.Figure`` +
``FigureCanvasAgg``), so no GUI backend is needed, pyplot's global state is untouched, and plotting
works on headless training nodes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation.embedding import (
    checked_embeddings_and_labels,
    multi_hot_matrix,
    top_combination_clusters,
)
from hf_mlcl.evaluation.inputs import to_numpy

__all__ = ["f1_by_frequency_bin", "plot_embedding_projection", "plot_f1_vs_frequency"]


def _new_figure(figsize: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | os.PathLike, dpi: int) -> str:
    path = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", bbox_inches="tight")
    return path


def _per_label_series(
    f1: np.ndarray | Mapping[str, np.ndarray], train_frequency: np.ndarray
) -> tuple[np.ndarray, dict[Any, np.ndarray]]:
    """(L,) float64 training counts and ``{name: (L,) F1}`` (name None for a single array), checked."""
    freq = to_numpy(train_frequency, "train_frequency")
    if freq.ndim == 2:
        freq = multi_hot_matrix(freq).sum(axis=0)
    freq = freq.astype(np.float64).ravel()
    series = dict(f1) if isinstance(f1, Mapping) else {None: f1}
    if not series:
        raise ValueError("f1 is an empty mapping; pass at least one (L,) array of per-label F1.")
    series = {k: to_numpy(v, "f1").astype(np.float64).ravel() for k, v in series.items()}
    for name, v in series.items():
        if v.shape != freq.shape:
            raise ValueError(
                f"f1{'' if name is None else f'[{name!r}]'} has {v.size} labels but train_frequency has "
                f"{freq.size}; both must be per-label arrays of the same length."
            )
    return freq, series


def f1_by_frequency_bin(
    f1: np.ndarray | Mapping[str, np.ndarray], train_frequency: np.ndarray, n_bins: int = 8
) -> list[dict[str, Any]]:
    """Mean per-label F1 in log-spaced bins of training frequency: the binned line of
    :func:`plot_f1_vs_frequency`, as numbers.

    Args:
        f1: (L,) per-label F1, or ``{method name: (L,) F1}``.
        train_frequency: (L,) training examples per label, or the (N, L) training multi-hot matrix.
        n_bins: number of log-spaced bins between the rarest and the most frequent label seen in training.

    Returns one dict per non-empty bin, rarest first: ``low`` / ``high`` (the bin's edges in training
    examples; a label with count c is in the bin with low <= c < high, the last bin includes its high),
    ``n_labels``, and ``mean_f1`` (``{name: mean F1 of the bin's labels}``; name None for a single
    array). Labels never seen in training are in no bin.
    """
    return _binned_means(*_per_label_series(f1, train_frequency), n_bins)


def _binned_means(freq: np.ndarray, series: dict[Any, np.ndarray], n_bins: int) -> list[dict[str, Any]]:
    """:func:`f1_by_frequency_bin` on inputs already checked by :func:`_per_label_series`."""
    if n_bins < 1:
        raise ValueError("n_bins must be >= 1.")
    seen = freq > 0
    if not seen.any():
        return []
    lo, hi = freq[seen].min(), freq[seen].max()
    edges = np.geomspace(lo, hi * (1 + 1e-9), n_bins + 1) if hi > lo else np.array([lo, lo * (1 + 1e-9)])
    which = np.clip(np.digitize(freq[seen], edges) - 1, 0, edges.size - 2)
    n_in_bin = np.bincount(which, minlength=edges.size - 1)
    means = {
        name: np.bincount(which, weights=v[seen], minlength=edges.size - 1) for name, v in series.items()
    }
    return [
        {
            "low": float(edges[b]),
            "high": float(edges[b + 1]),
            "n_labels": int(n_in_bin[b]),
            "mean_f1": {name: float(sums[b] / n_in_bin[b]) for name, sums in means.items()},
        }
        for b in range(edges.size - 1)
        if n_in_bin[b]
    ]


def plot_f1_vs_frequency(
    f1: np.ndarray | Mapping[str, np.ndarray],
    train_frequency: np.ndarray,
    path: str | os.PathLike,
    title: str | None = None,
    n_bins: int = 8,
    figsize: tuple[float, float] = (7.0, 4.5),
    dpi: int = 120,
    alpha: float = 0.35,
    xlabel: str = "label frequency in training data (log scale)",
    ylabel: str = "per-label F1",
) -> str:
    """Long-tail view: scatter of per-label F1 against training frequency (log x), plus binned means.

    Args:
        f1: (L,) per-label F1 (see :func:`hf_mlcl.evaluation.per_label_f1`), or a mapping
            ``{method name: (L,) F1}`` to overlay several methods (one colour each, with a legend).
        train_frequency: (L,) number of training examples per label, or the (N, L) training multi-hot
            matrix (column sums are taken).
        path: output PNG path (folders are created).
        n_bins: number of log-spaced frequency bins for the mean-F1 line.

    Labels never seen in training cannot sit on a log axis; they are left out and counted in a note.
    Returns the path written.
    """
    freq, series = _per_label_series(f1, train_frequency)
    bins = _binned_means(freq, series, n_bins)  # empty when no label was seen in training
    seen = freq > 0
    fig = _new_figure(figsize)
    ax = fig.add_subplot(1, 1, 1)
    ax.set_xscale("log")
    colors = [f"C{i % 10}" for i in range(len(series))]
    centres = [np.sqrt(b["low"] * b["high"]) for b in bins]
    for (name, v), color in zip(series.items() if bins else (), colors):
        ax.scatter(
            freq[seen],
            v[seen],
            s=10,
            alpha=alpha,
            color=color,
            edgecolors="none",
            label=None if name is None else str(name),
        )
        ax.plot(
            centres,
            [b["mean_f1"][name] for b in bins],
            "-o",
            color=color,
            lw=2,
            ms=4,
            label="binned mean" if name is None else f"{name} (binned mean)",
        )
    unseen = int((~seen).sum())
    if unseen:
        ax.text(
            0.01,
            0.98,
            f"{unseen} label(s) unseen in training not shown",
            transform=ax.transAxes,
            va="top",
            ha="left",
            fontsize=8,
            color="0.3",
        )
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    ax.set_title(title or "Per-label F1 vs. training frequency")
    # below the axes: inside them, the legend of several methods hides the long tail's points
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=8, frameon=False)
    return _save(fig, path, dpi)


def _combination_name(combo: np.ndarray, label_names: Sequence[str] | None, max_chars: int = 40) -> str:
    if combo.size == 0:
        return "(no label)"
    names = [str(label_names[i]) if label_names is not None else str(i) for i in combo]
    text = " + ".join(names)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def plot_embedding_projection(
    embeddings: Any,
    labels: Any,
    path: str | os.PathLike,
    top_k_combinations: int = 8,
    label_names: Sequence[str] | None = None,
    method: str = "pca",
    title: str | None = None,
    max_points: int | None = 5000,
    show_other: bool = True,
    include_empty: bool = False,
    random_state: int = 0,
    figsize: tuple[float, float] = (7.0, 6.0),
    dpi: int = 120,
) -> str:
    """2-D projection (PCA, or t-SNE with ``method="tsne"``) of L2-normalised embeddings, coloured by
    the ``top_k_combinations`` most frequent exact label sets (Audibert et al. 2024, Sec. 5.3); other
    examples are drawn small and grey when ``show_other``. Returns the path written.
    """
    if method not in ("pca", "tsne"):
        raise ValueError(f"method must be 'pca' or 'tsne', got {method!r}.")
    x, y = checked_embeddings_and_labels(embeddings, labels)
    if label_names is not None and len(label_names) < y.shape[1]:
        raise ValueError(f"label_names has {len(label_names)} names but labels have {y.shape[1]} columns.")
    mask, cid, combos, counts = top_combination_clusters(y, top_k_combinations, include_empty)
    group = np.full(x.shape[0], -1, dtype=np.int64)
    group[mask] = cid
    rng = np.random.default_rng(random_state)
    idx = np.arange(x.shape[0]) if show_other else np.flatnonzero(mask)
    if max_points is not None and idx.size > max_points:
        idx = np.sort(rng.choice(idx, max_points, replace=False))
    if idx.size < 3:
        raise ValueError(f"need at least 3 examples to project, got {idx.size}.")
    x, group = x[idx], group[idx]
    if method == "pca":
        from sklearn.decomposition import PCA

        n_comp = min(2, x.shape[1], x.shape[0])
        xy = PCA(n_components=n_comp, random_state=random_state).fit_transform(x)
        if n_comp < 2:
            xy = np.column_stack([xy, np.zeros(xy.shape[0])])
        axis_names = ("PC 1", "PC 2")
    else:
        from sklearn.manifold import TSNE

        perplexity = float(min(30.0, max(2.0, (x.shape[0] - 1) / 3.0)))
        xy = TSNE(n_components=2, init="pca", perplexity=perplexity, random_state=random_state).fit_transform(
            x
        )
        axis_names = ("t-SNE 1", "t-SNE 2")

    fig = _new_figure(figsize)
    ax = fig.add_subplot(1, 1, 1)
    other = group < 0
    if other.any():
        ax.scatter(xy[other, 0], xy[other, 1], s=4, color="0.8", alpha=0.5, edgecolors="none", label="other")
    cmap_colors = [f"C{i % 10}" for i in range(len(combos))] if len(combos) <= 10 else None
    if cmap_colors is None:
        from matplotlib import colormaps

        cmap = colormaps["tab20"]
        cmap_colors = [cmap(i % 20) for i in range(len(combos))]
    for c, (combo, count) in enumerate(zip(combos, counts)):
        sel = group == c
        if sel.any():
            ax.scatter(
                xy[sel, 0],
                xy[sel, 1],
                s=12,
                color=cmap_colors[c],
                alpha=0.8,
                edgecolors="none",
                label=f"{_combination_name(combo, label_names)} (n={int(count)})",
            )
    ax.set_xlabel(axis_names[0])
    ax.set_ylabel(axis_names[1])
    ax.set_title(title or f"Embeddings ({method.upper()}), top-{len(combos)} label combinations")
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=7, markerscale=1.5, frameon=False)
    return _save(fig, path, dpi)
