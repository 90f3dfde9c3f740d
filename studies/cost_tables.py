"""The cost of the results study's cells: docs/PERFORMANCE.md's last part and the compute figure's data.

``cost_section``: the wall seconds the cells recorded per kind of work, on the CPU and on the GPU (median,
min-max, n); ``compute_points`` / ``compute_figure``: test macro-F1 against training seconds, per run and
per method (drawn by studies/compute_figure.py).
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
from run_seconds import features_loaded, train_seconds, whole_epochs  # noqa: E402  (studies/run_seconds.py)
from study_cells import (  # noqa: E402  (studies/study_cells.py: the cells and the names of the rows)
    BASELINES,
    CONTRASTIVE,
    CPU_DEVICE,
    FULL_STUDIES,
    GPU_DIR,
    chosen_lr,
    full_runs,
    load,
    load_tree,
    long_bce_runs,
    results_root,
)


def compute_points(study: str) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[list]]]:
    """The compute figure's data for one study: {method: [(training seconds, test macro-F1) per run]} (probes
    that loaded their features are left out: their seconds hold no encoder pass) and {method: [per run,
    [(cumulative training seconds, test macro-F1) per epoch]]} for runs scored after each epoch
    (``run.py --test-each-epoch``)."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    groups: dict[str, list[dict]] = {
        "BCE fine-tune, up to 5 epochs": full_runs(plain, tagged, lr, "bce", "finetune"),
        "BCE fine-tune, up to 20 epochs": long_bce_runs(study, tagged, lr),
    }
    groups["frozen MiniLM + probe"] = plain.get(("pretrained", "logistic"), []) + plain.get(
        ("pretrained", "linear"), []
    )
    for probe in ("logistic", "linear", "finetune"):
        groups[f"stage 1 + {probe.replace('finetune', 'fine-tune')}"] = [
            r for loss in CONTRASTIVE for r in full_runs(plain, tagged, lr, loss, probe)
        ]
    groups.update(
        {
            label.split(":")[0].replace(" 1-2 grams", ""): plain.get(key, [])
            for key, label in BASELINES.items()
        }
    )
    points = {
        m: [
            (train_seconds(r)[0], float(r["metrics"]["test_macro_f1"]))
            for r in rs
            if train_seconds(r)[0] and not features_loaded(r)
        ]
        for m, rs in groups.items()
    }
    curves: dict[str, list[list]] = {}
    for (loss, _probe), rs in tagged.items():
        for r in rs:
            if loss == "bce" and r.get("epoch_test"):
                cum = np.cumsum((r.get("epochs") or {}).get("epoch_s") or [])
                run = [
                    (float(cum[int(round(e["epoch"])) - 1]), e["test_macro_f1"])
                    for e in r["epoch_test"]
                    if 0 < int(round(e["epoch"])) <= len(cum)
                ]
                curves.setdefault("BCE fine-tune, test after each epoch", []).append(run)
    return {m: p for m, p in points.items() if p}, curves


def compute_figure(out: str) -> str | None:
    """The compute figure (docs/figures/compute_vs_macro_f1.png) from the CPU cells of both studies, written at
    ``out``; None before either study has a cell."""
    from compute_figure import plot_compute

    data = {s: compute_points(s) for s in FULL_STUDIES if os.path.isdir(os.path.join(paths.RESULTS, s))}
    if not data:
        return None
    return plot_compute(
        {s: p for s, (p, _) in data.items()},
        {s: c for s, (_, c) in data.items()},
        out,
        CPU_DEVICE,
    )


def _spread(values: list[float]) -> str:
    """median (min-max; n) of seconds, or "—"."""
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    rng = f"{lo:,.0f}-{hi:,.0f}; " if len(values) > 1 else ""
    return f"{np.median(values):,.0f} ({rng}{len(values)})"


def cost_rows(study: str) -> list[tuple[str, list[float]]]:
    """(what, seconds of every cell that measured it) in the current results tree: epochs of the fine-tunes,
    of stage 1 (once per encoder) and of the linear probe on cached features, validation passes, the logistic
    probe's whole run, and the baselines' training."""
    runs = [r for cells in (load(study), load(study, tagged=True)) for rs in cells.values() for r in rs]
    ft = [r for r in runs if r["probe"] == "finetune"]
    stage1 = {
        (r["loss"], r["seed"]): (r.get("stage1") or {}).get("epochs") or {} for r in runs if r.get("stage1")
    }
    logistic = [r for r in runs if r["probe"] == "logistic" and r["loss"] not in ("setfit",)]
    by = {key: [r for r in runs if (r["loss"], r["probe"]) == key] for key in BASELINES}
    return [
        (
            "fine-tune (BCE, MiniLM + linear head), one epoch",
            whole_epochs([r.get("epochs") or {} for r in ft]),
        ),
        (
            "fine-tune, one validation pass",
            [
                e["eval_s"]
                for r in ft
                for e in (r.get("epochs") or {}).get("evaluations") or []
                if e.get("eval_s")
            ],
        ),
        ("stage 1 (contrastive, batch 64), one epoch", whole_epochs(list(stage1.values()))),
        (
            "linear probe on cached features, one epoch",
            whole_epochs([r.get("epochs") or {} for r in runs if r["probe"] == "linear"]),
        ),
        (
            "logistic probe, whole: encoding train + validation + test, then the fits",
            [
                r["wall_s"]["probe_s"]
                for r in logistic
                if not features_loaded(r) and r["wall_s"].get("probe_s")
            ],
        ),
        (
            "logistic probe on stored features, whole: the fits",
            [r["wall_s"]["probe_s"] for r in logistic if features_loaded(r) and r["wall_s"].get("probe_s")],
        ),
        (
            "TF-IDF + logistic regression, features and the C grid",
            [r["wall_s"]["probe_s"] for r in by[("tfidf", "logreg")]],
        ),
        (
            "TF-IDF + linear SVM, features and the C grid",
            [r["wall_s"]["probe_s"] for r in by[("tfidf", "svm")]],
        ),
        ("SetFit, pair training", [r["wall_s"]["stage1_s"] for r in by[("setfit", "logistic")]]),
        (
            "SetFit, head (encoding the training set, then the fits)",
            [r["wall_s"]["probe_s"] for r in by[("setfit", "logistic")]],
        ),
    ]


def cost_section() -> str:
    """docs/PERFORMANCE.md's part on the results study: the seconds its cells recorded, on the CPU and on the
    GPU, per kind of work."""
    root = os.path.join(paths.RESULTS, GPU_DIR)
    gpu_devices = (
        sorted({r.get("device", "?") for d in FULL_STUDIES for rs in load_tree(root, d).values() for r in rs})
        if os.path.isdir(root)
        else []
    )
    gpu_name = ", ".join(gpu_devices) or "GPU"
    lines = [
        "## Training cost of the results study",
        "",
        "Wall seconds the cells of docs/RESULTS.md recorded (`studies/results/`), per kind of work: median "
        "(min-max; number of measurements). Written by `python studies/make_tables.py`. "
        f"**CPU**: {CPU_DEVICE}, torch CPU build; each cell ran with one thread beside a second cell or with "
        "two threads alone, on cores shared with other processes, so the spread is mostly contention. "
        f"**GPU**: {gpu_name} in bf16 (`studies/run_gpu.sh`); most GPU cells ran several at a time on the "
        "one device, so their times include that sharing. MiniLM: all-MiniLM-L6-v2 (22.7 M parameters); "
        "Reuters-21578: 6,993 training documents at 128 tokens, fine-tune batch 32 (219 steps per epoch); "
        "GoEmotions: 43,410 comments at 64 tokens (1,357 steps). —: not measured on that device.",
        "",
    ]
    for study in FULL_STUDIES:
        cpu = cost_rows(study)
        if os.path.isdir(os.path.join(root, study)):
            with results_root(root):
                gpu = dict(cost_rows(study))
        else:
            gpu = {}
        lines += [f"### {study}", "", f"| work | s, {CPU_DEVICE} | s, {gpu_name} (bf16) |", "|---|---|---|"]
        lines += [f"| {what} | {_spread(v)} | {_spread(gpu.get(what, []))} |" for what, v in cpu]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
