"""The data-scale and joint-objective tables of docs/RESULTS.md (``<study>-scale``, ``joint``).

``<study>-scale``: each method's test macro-F1 (mean ± sample standard deviation over the seeds, and n) at each
training size of studies/scale.py, every choice made on validation at that size: BCE's learning rate
(``bce_choice.best_bce_lr``), the joint objective's w (``bce_choice.best_joint_weight``), the two losses
chosen on Reuters' frozen probes (``loss_choice.best_losses``), and at a subset the one of them fine-tuned from
stage 1 (``loss_choice.better_loss``: the better probe on that size's validation; the other reads "other loss
chosen"); the fine-tunes run at BCE's learning rate.
Each method's cell adds its difference to BCE at that size and the seed-spread verdict (yes / no / undecided);
:func:`scale_figure` draws the table. ``joint``: per dataset, size and learning rate, every w's seed-1 validation
macro-F1, the w chosen on it with its seeds' figures (test only once the grid is complete), and BCE beside it.
A cell without a finished run reads "not yet run", one whose choice waits for the rest of its grid "choice
pending".

    python studies/scale_table.py reuters21578     # print its scale table and the joint table
"""

from __future__ import annotations

import glob
import json
import os
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bce_choice  # noqa: E402  (studies/bce_choice.py: the choices made on validation)
import loss_choice  # noqa: E402  (studies/loss_choice.py: the two losses chosen on Reuters)
import scale  # noqa: E402  (studies/scale.py: the sizes and the cells' names)

NOT_RUN = "not yet run"
PENDING = "choice pending"  # a cell chosen on validation whose grid has not run every point yet
NOT_CHOSEN = "other loss chosen"  # a subset's stage 1 + fine-tune runs with the loss better on its validation
BCE = "BCE fine-tune"


def runs_by_cell(results: str, study: str) -> dict[tuple[str, int | None], list[dict]]:
    """Every finished seed of ``study`` by (cell base name, training size; None for the whole split)."""
    out: dict[tuple[str, int | None], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(results, study, "*", "seed*", "metrics.json"))):
        with open(path, encoding="utf-8") as fh:
            out[scale.split_cell(os.path.basename(os.path.dirname(os.path.dirname(path))))].append(
                json.load(fh)
            )
    return out


def summary(runs: list[dict], key: str, missing: str = NOT_RUN) -> str:
    """``key`` over the seeds: the value and n=1, or mean ± sample standard deviation (ddof 1) and n."""
    values = [float(r["metrics"][key]) for r in runs if key in r["metrics"]]
    if not values:
        return missing
    if len(values) == 1:
        return f"{values[0]:.3f} (n=1)"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f} (n={len(values)})"


def seed_delta(runs: list[dict], ref: list[dict], key: str) -> tuple[float, str] | None:
    """(mean difference, verdict) of ``key`` between two groups of seeds; the verdict says whether the
    difference exceeds the seed spread, the sum of the two sample standard deviations (ddof 1), and is
    only given when both groups have at least two seeds."""
    a = [float(r["metrics"][key]) for r in runs if key in r["metrics"]]
    b = [float(r["metrics"][key]) for r in ref if key in r["metrics"]]
    if not a or not b:
        return None
    d = float(np.mean(a) - np.mean(b))
    if min(len(a), len(b)) < 2:
        return d, f"undecided: seeds {len(a)} vs {len(b)}"
    spread = float(np.std(a, ddof=1) + np.std(b, ddof=1))
    return d, (
        f"yes: {abs(d):.3f} > {spread:.3f}" if abs(d) > spread else f"no: {abs(d):.3f} <= {spread:.3f}"
    )


def choice_or_none(choice, study: str, results: str, size: int | None) -> str | None:
    """A choice of ``bce_choice`` at ``size``, None before its cells have finished."""
    try:
        return choice(study, results, size)
    except ValueError:
        return None


def method_cells(study: str, results: str, size: int | None) -> list[tuple[str, str | None]]:
    """(row name, cell base name, None while its choice is pending, or ``NOT_CHOSEN``) of each method at
    ``size``: a choice is made once every point of its grid has run on validation (``bce_choice.bce_grid_done``,
    ``bce_choice.joint_grid_done``); at a subset only the loss whose probe is better there is fine-tuned."""
    lr = (
        choice_or_none(bce_choice.best_bce_lr, study, results, size)
        if bce_choice.bce_grid_done(study, results, size)
        else None
    )
    w = None
    if lr and bce_choice.joint_grid_done(study, results, size, lr):
        w = choice_or_none(bce_choice.best_joint_weight, study, results, size)
    try:
        losses = loss_choice.best_losses("reuters21578", 2, results)
    except ValueError:
        losses = []
    rows: list[tuple[str, str | None]] = [
        ("TF-IDF + logistic regression", "tfidf_logreg"),
        (BCE, f"bce_finetune-lr{lr}" if lr else None),
        ("joint: (1 - w) BCE + w jaccard", f"joint_finetune-w{w}-lr{lr}" if lr and w else None),
    ]
    tuned = None  # at a subset, the one loss fine-tuned from stage 1 (loss_choice.better_loss); None: pending
    if size is not None and losses:
        try:
            tuned = loss_choice.better_loss(study, size, losses, results)
        except ValueError:
            pass
    for loss in losses:
        rows.append((f"{loss} + logistic probe", f"{loss}_logistic"))
        if size is not None and tuned is not None and loss != tuned:
            rows.append((f"{loss} + fine-tune", NOT_CHOSEN))
        else:
            ready = lr and (size is None or tuned is not None)
            rows.append((f"{loss} + fine-tune", f"{loss}_finetune-lr{lr}" if ready else None))
    rows.append(("SetFit", "setfit_logistic"))
    return rows


def scale_runs(study: str, results: str) -> tuple[list[int | None], dict[str, list[list[dict] | None]]]:
    """(the sizes, smallest first, None for the whole split; each method's finished seeds at each size, None
    while its choice there is pending, ``NOT_CHOSEN`` where it does not run)."""
    cells = runs_by_cell(results, study)
    sizes: list[int | None] = [*scale.SIZES[study], None]
    per_size = [dict(method_cells(study, results, n)) for n in sizes]
    runs = {
        name: [
            NOT_CHOSEN
            if chosen[name] == NOT_CHOSEN
            else cells.get((chosen[name], n), [])
            if chosen[name]
            else None
            for chosen, n in zip(per_size, sizes)
        ]
        for name in per_size[-1]
    }
    return sizes, runs


def _size_head(study: str, sizes: list[int | None]) -> str:
    return " | ".join(f"{n:,} training texts" if n else f"all ({scale.FULL_TRAIN[study]:,})" for n in sizes)


def _verdict(delta: tuple[float, str] | None) -> str:
    """``+0.186 yes`` / ``-0.014 no`` / ``+0.066 undecided`` (:func:`seed_delta`), empty without a difference."""
    return f", {delta[0]:+.3f} {delta[1].split(':')[0]}" if delta else ""


def scale_table(study: str, results: str) -> str:
    """Test macro-F1 by method and training size, each method's difference to BCE at the same size with the
    seed-spread verdict (see the module docstring)."""
    sizes, runs = scale_runs(study, results)
    rows = [f"| method | {_size_head(study, sizes)} |", "|---|" + "---|" * len(sizes)]
    for name, by_size in runs.items():
        cells = [
            PENDING
            if r is None
            else NOT_CHOSEN
            if r == NOT_CHOSEN
            else summary(r, "test_macro_f1")
            + ("" if name == BCE or ref is None else _verdict(seed_delta(r, ref, "test_macro_f1")))
            for r, ref in zip(by_size, runs[BCE])
        ]
        rows.append(f"| {name} | {' | '.join(cells)} |")
    return "\n".join(rows)


def scale_figure(study: str, results: str, out: str) -> str | None:
    """Test macro-F1 against training size, one line per method (mean over the seeds, error bars one sample
    standard deviation; an open marker: one seed), written to ``out``; None while no method has a finished
    size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes, runs = scale_runs(study, results)
    x = [n or scale.FULL_TRAIN[study] for n in sizes]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    markers = "osD^v<>ph*"
    drawn = 0
    for i, (name, by_size) in enumerate(runs.items()):
        # each method a little apart along x (3 % a step), so that equal values stay visible
        shift = 1.03 ** (i - (len(runs) - 1) / 2)
        points = [
            (
                xi * shift,
                [float(r["metrics"]["test_macro_f1"]) for r in rs if "test_macro_f1" in r["metrics"]],
            )
            for xi, rs in zip(x, by_size)
            if isinstance(rs, list) and rs
        ]
        points = [(xi, v) for xi, v in points if v]
        if not points:
            continue
        marker = markers[i % len(markers)]
        means = [float(np.mean(v)) for _, v in points]
        line = ax.plot([p[0] for p in points], means, marker=marker, markerfacecolor="white", label=name)[0]
        for xi, v in points:  # a filled marker with its error bar for 2+ seeds, an open one for a single seed
            err = float(np.std(v, ddof=1)) if len(v) > 1 else None
            ax.errorbar(
                [xi],
                [float(np.mean(v))],
                yerr=None if err is None else [err],
                marker=marker,
                color=line.get_color(),
                markerfacecolor=line.get_color() if err is not None else "white",
                capsize=3,
            )
        drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xscale("log")
    ax.set_xlim(min(x) / 1.4, max(x) * 1.4)
    ax.set_xticks(x, [f"{v:,}" for v in x])
    ax.minorticks_off()
    ax.set_xlabel("training texts")
    ax.set_ylabel("test macro-F1")
    ax.set_title(f"{study}: test macro-F1 by training size (mean ± sd; open: one seed)", fontsize=10)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    os.makedirs(os.path.dirname(out), exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _grid_cell(by_w: dict[str, list[dict]]) -> str:
    """``0.01: 0.358 · 0.05: 0.362 · 0.2: 0.255``: each w's seed-1 validation macro-F1, the figures the choice
    reads (``bce_choice.best_joint_weight``)."""
    parts = []
    for w in sorted(by_w, key=float):
        seed1 = [r for r in by_w[w] if r.get("seed") == 1 and "validation_macro_f1" in r["metrics"]]
        if seed1:
            parts.append(f"{w}: {float(seed1[0]['metrics']['validation_macro_f1']):.3f}")
    return " · ".join(parts)


def joint_table(studies: list[str], results: str) -> str:
    """One row per dataset, size and learning rate of the joint cells: every w's validation macro-F1, the w chosen
    on validation with its validation, test macro- and micro-F1 over its seeds (read once the grid is complete),
    and BCE at the same learning rate and size."""
    rows = [
        "| dataset | training rows | lr | seed 1: validation macro-F1 per w | chosen w | validation macro-F1 | test macro-F1 "
        "| test micro-F1 | BCE, same lr: validation macro-F1 | BCE: test macro-F1 |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for study in studies:
        cells = runs_by_cell(results, study)
        grids: dict[tuple[int | None, str], dict[str, list[dict]]] = defaultdict(dict)
        for base, size in cells:
            if base.startswith("joint_finetune-w"):
                w, lr = base.removeprefix("joint_finetune-w").split("-lr")
                grids[size, lr][w] = cells[(base, size)]
        for size, lr in sorted(grids, key=lambda k: (k[0] or 1 << 30, float(k[1]))):
            by_w, bce = grids[size, lr], cells.get((f"bce_finetune-lr{lr}", size), [])
            w = None
            if bce_choice.joint_grid_done(study, results, size, lr):
                w = bce_choice.best_joint_weight(study, results, size, lr)  # this row's own grid
            chosen = (
                [w, *(summary(by_w[w], k) for k in ("validation_macro_f1", "test_macro_f1", "test_micro_f1"))]
                if w in by_w
                else [PENDING, "", "", ""]  # test is read for the chosen w only, once every w has run
            )
            rows.append(
                f"| {study} | {size or 'all'} | {lr} | {_grid_cell(by_w)} | {' | '.join(chosen)} "
                f"| {summary(bce, 'validation_macro_f1')} | {summary(bce, 'test_macro_f1')} |"
            )
    if len(rows) == 2:
        rows.append(f"| {NOT_RUN} | | | | | | | | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(scale.SIZES):
        print(f"## {name}-scale\n{scale_table(name, bce_choice.RESULTS)}\n")
    print(f"## joint\n{joint_table(sys.argv[1:] or list(scale.SIZES), bce_choice.RESULTS)}")
