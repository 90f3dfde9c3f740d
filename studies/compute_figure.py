"""The compute figure of docs/RESULTS.md: test macro-F1 against training seconds, one panel per study.

``points`` come from ``cost_tables.compute_points``: one (seconds, test macro-F1) per run, grouped by method;
a method whose runs carry per-epoch test scores (``run.py --test-each-epoch``) is drawn as a line per run.
"""

from __future__ import annotations

import os

MARKERS = "osD^v<>PXh*"


def plot_compute(
    points: dict[str, dict[str, list[tuple[float, float]]]],
    curves: dict[str, dict[str, list]],
    path: str,
    device: str,
) -> str:
    """``points[study][method]`` = [(seconds, macro-F1), ...]; ``curves[study][method]`` = a list of runs, each
    [(cumulative seconds, macro-F1) per epoch]. Writes a PNG at ``path`` (folders created), returns it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    studies = list(points)
    fig = Figure(figsize=(6.0 * len(studies), 4.6))
    FigureCanvasAgg(fig)
    methods = sorted({m for s in studies for m in (*points[s], *curves.get(s, {}))})
    style = {m: (MARKERS[i % len(MARKERS)], f"C{i % 10}") for i, m in enumerate(methods)}
    for k, study in enumerate(studies, 1):
        ax = fig.add_subplot(1, len(studies), k)
        ax.set_xscale("log")
        for method, runs in curves.get(study, {}).items():
            marker, colour = style[method]
            for i, run in enumerate(runs):
                xs, ys = zip(*run)
                ax.plot(
                    xs, ys, "-", marker=marker, ms=3, color=colour, lw=1, label=method if i == 0 else None
                )
        for method, pts in points[study].items():
            marker, colour = style[method]
            xs, ys = zip(*pts)
            ax.scatter(xs, ys, marker=marker, color=colour, s=28, alpha=0.8, label=method)
        ax.set_title(study)
        ax.set_xlabel(f"training seconds, {device} (log scale)")
        ax.set_ylabel("test macro-F1")
        ax.grid(True, which="both", alpha=0.3)
    handles, labels = [], []
    for ax in fig.axes:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, bbox_to_anchor=(0.5, -0.02))
    fig.subplots_adjust(bottom=0.32, wspace=0.25)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110, format="png")
    return path
