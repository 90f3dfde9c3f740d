"""Regenerate the tables (and the per-label F1 plots) of docs/RESULTS.md from the run outputs.

    python docs/results/make_tables.py            # rewrites the blocks between <!-- TABLE:x --> markers
    python docs/results/make_tables.py --print    # only print the tables

Reads docs/results/<dataset>/<loss>_<probe>/seed<S>/metrics.json (written by docs/results/run.py).
Cells with 3 seeds show mean ± sample standard deviation (ddof = 1); others show the value and n.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from collections import defaultdict

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS_MD = os.path.join(os.path.dirname(HERE), "RESULTS.md")
ORDER = ["bce", "pretrained", "all", "any", "mulsupcon", "sd", "jaccard", "msc", "ws_mulsupcon", "hbl"]
NAMES = {
    "bce": "BCE fine-tuning (no stage 1)",
    "pretrained": "none: pretrained MiniLM, frozen",
    "hbl": "mulsupcon + hbl",
    "sd": "sd (similarity-dissimilarity)",
}
CONTRASTIVE = [x for x in ORDER if x not in ("bce", "pretrained")]


def load(dataset: str) -> dict[tuple[str, str], list[dict]]:
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(HERE, dataset, "*", "seed*", "metrics.json"))):
        with open(path, encoding="utf-8") as fh:
            r = json.load(fh)
        cells[(r["loss"], r["probe"])].append(r)
    return cells


def _fmt(values: list[float]) -> str:
    if not values:
        return "—"
    if len(values) == 1:
        return f"{values[0]:.3f} (n=1)"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f} (n={len(values)})"


def summary(cells, loss: str, probe: str, key: str) -> list[float]:
    return [float(r["metrics"][key]) for r in cells.get((loss, probe), []) if key in r["metrics"]]


def table(dataset: str) -> str:
    cells = load(dataset)
    head = (
        "| stage 1 loss | probe: micro-F1 | probe: macro-F1 | fine-tune: micro-F1 | fine-tune: macro-F1 "
        "| stage 1 s | probe s | fine-tune s | seeds |\n|---|---|---|---|---|---|---|---|---|"
    )
    rows = [head]
    for loss in ORDER:
        lp, ft = cells.get((loss, "logistic"), []), cells.get((loss, "finetune"), [])
        if not lp and not ft:
            continue

        def wall(rs, key):
            v = [r["wall_s"].get(key) for r in rs if r["wall_s"].get(key) is not None]
            return f"{np.mean(v):.0f}" if v else "—"

        seeds = sorted({r["seed"] for r in lp + ft})
        rows.append(
            f"| {NAMES.get(loss, loss)} | {_fmt(summary(cells, loss, 'logistic', 'test_micro_f1'))} "
            f"| {_fmt(summary(cells, loss, 'logistic', 'test_macro_f1'))} "
            f"| {_fmt(summary(cells, loss, 'finetune', 'test_micro_f1'))} "
            f"| {_fmt(summary(cells, loss, 'finetune', 'test_macro_f1'))} "
            f"| {wall(lp + ft, 'stage1_s')} | {wall(lp, 'probe_s')} | {wall(ft, 'probe_s')} "
            f"| {','.join(map(str, seeds))} |"
        )
    return "\n".join(rows)


def best_contrastive(dataset: str) -> tuple[str, str] | None:
    """(loss, probe) of the contrastive cell with the highest mean test macro-F1."""
    cells = load(dataset)
    scored = [
        (np.mean(summary(cells, loss, probe, "test_macro_f1")), loss, probe)
        for (loss, probe) in cells
        if loss in CONTRASTIVE and summary(cells, loss, probe, "test_macro_f1")
    ]
    return max(scored)[1:] if scored else None


def f1_plot(dataset: str) -> str | None:
    """Per-label test F1 against training frequency: BCE fine-tuning vs the best contrastive cell (seed 1)."""
    from hf_mlcl.evaluation import plot_f1_vs_frequency

    best = best_contrastive(dataset)
    bce = os.path.join(HERE, dataset, "bce_finetune", "seed1", "per_label_f1.json")
    if best is None or not os.path.isfile(bce):
        return None
    other = os.path.join(HERE, dataset, f"{best[0]}_{best[1]}", "seed1", "per_label_f1.json")
    with open(bce, encoding="utf-8") as fh:
        a = json.load(fh)
    with open(other, encoding="utf-8") as fh:
        b = json.load(fh)
    out = os.path.join(HERE, dataset, "plots", "f1_vs_frequency.png")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    plot_f1_vs_frequency(
        {"BCE fine-tuning": np.asarray(a["test_f1"]), f"{best[0]} + {best[1]}": np.asarray(b["test_f1"])},
        np.asarray(a["train_count"]),
        out,
        title=f"{dataset}: per-label test F1 vs training-subset frequency (seed 1)",
    )
    return out


def main(argv: list[str]) -> None:
    datasets = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)))
    tables = {d: table(d) for d in datasets}
    if "--print" in argv:
        for d, t in tables.items():
            print(f"## {d}\n{t}\n")
        return
    for d in datasets:
        print("plot:", f1_plot(d))
    with open(RESULTS_MD, encoding="utf-8") as fh:
        text = fh.read()
    for d, t in tables.items():
        pattern = re.compile(rf"(<!-- TABLE:{d} -->\n)(?:.*?\n)?(<!-- /TABLE:{d} -->)", re.S)
        text = pattern.sub(lambda m, t=t: m.group(1) + t + "\n" + m.group(2), text)
    with open(RESULTS_MD, "w", encoding="utf-8") as fh:
        fh.write(text)
    print("updated", RESULTS_MD)


if __name__ == "__main__":
    main(sys.argv[1:])
