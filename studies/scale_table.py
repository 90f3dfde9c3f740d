"""The data-scale and joint-objective tables of docs/RESULTS.md (``<study>-scale``, ``<study>-joint``).

``<study>-scale``: each method's test macro-F1 (mean ± sample standard deviation over the seeds, and n) at each
training size of studies/scale.py, every choice made on validation at that size: BCE's learning rate
(``bce_choice.best_bce_lr``), the joint objective's w (``bce_choice.best_joint_weight``), the two losses
chosen on Reuters' frozen probes (``loss_choice.best_losses``); the fine-tunes run at BCE's learning rate.
``<study>-joint``: every joint cell (w, learning rate, size) beside BCE at the same learning rate and size; the
test columns of the w chosen on validation only.
A cell without a finished run reads "not yet run".

    python studies/scale_table.py reuters21578     # print both tables
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


def runs_by_cell(results: str, study: str) -> dict[tuple[str, int | None], list[dict]]:
    """Every finished seed of ``study`` by (cell base name, training size; None for the whole split)."""
    out: dict[tuple[str, int | None], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(results, study, "*", "seed*", "metrics.json"))):
        with open(path, encoding="utf-8") as fh:
            out[scale.split_cell(os.path.basename(os.path.dirname(os.path.dirname(path))))].append(
                json.load(fh)
            )
    return out


def summary(runs: list[dict], key: str) -> str:
    """``key`` over the seeds: the value and n=1, or mean ± sample standard deviation (ddof 1) and n."""
    values = [float(r["metrics"][key]) for r in runs if key in r["metrics"]]
    if not values:
        return NOT_RUN
    if len(values) == 1:
        return f"{values[0]:.3f} (n=1)"
    return f"{np.mean(values):.3f} ± {np.std(values, ddof=1):.3f} (n={len(values)})"


def _chosen(choice, study: str, results: str, size: int | None) -> str | None:
    """A choice of ``bce_choice`` at ``size``, None before its cells have finished."""
    try:
        return choice(study, results, size)
    except ValueError:
        return None


def method_cells(study: str, results: str, size: int | None) -> list[tuple[str, str | None]]:
    """(row name, cell base name or None when its choice cannot be made yet) of each method at ``size``."""
    lr = _chosen(bce_choice.best_bce_lr, study, results, size)
    w = _chosen(bce_choice.best_joint_weight, study, results, size)
    try:
        losses = loss_choice.best_losses("reuters21578", 2, results)
    except ValueError:
        losses = []
    rows: list[tuple[str, str | None]] = [
        ("TF-IDF + logistic regression", "tfidf_logreg"),
        ("BCE fine-tune", f"bce_finetune-lr{lr}" if lr else None),
        ("joint: (1 - w) BCE + w jaccard", f"joint_finetune-w{w}-lr{lr}" if lr and w else None),
    ]
    for loss in losses:
        rows.append((f"{loss} + logistic probe", f"{loss}_logistic"))
        rows.append((f"{loss} + fine-tune", f"{loss}_finetune-lr{lr}" if lr else None))
    rows.append(("SetFit", "setfit_logistic"))
    return rows


def scale_table(study: str, results: str) -> str:
    """Test macro-F1 by method and training size (see the module docstring)."""
    cells = runs_by_cell(results, study)
    sizes: list[int | None] = [*scale.SIZES[study], None]
    head = " | ".join(f"{n:,} training texts" if n else f"all ({scale.FULL_TRAIN[study]:,})" for n in sizes)
    rows = [f"| method | {head} |", "|---|" + "---|" * len(sizes)]
    per_size = [dict(method_cells(study, results, n)) for n in sizes]
    for name in per_size[-1]:
        values = [
            summary(cells.get((chosen[name], n), []), "test_macro_f1") if chosen.get(name) else NOT_RUN
            for chosen, n in zip(per_size, sizes)
        ]
        rows.append(f"| {name} | {' | '.join(values)} |")
    return "\n".join(rows)


def joint_table(study: str, results: str) -> str:
    """Every joint cell beside BCE at its learning rate and size: validation and test macro-F1, test micro-F1."""
    cells = runs_by_cell(results, study)
    rows = [
        "| training rows | w | lr | validation macro-F1 | test macro-F1 | test micro-F1 "
        "| BCE, same lr: validation macro-F1 | BCE: test macro-F1 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    joint = sorted(
        (k for k in cells if k[0].startswith("joint_finetune-w")), key=lambda k: (k[1] or 1 << 30, k[0])
    )
    for base, size in joint:
        w, lr = base.removeprefix("joint_finetune-w").split("-lr")
        runs, bce = cells[(base, size)], cells.get((f"bce_finetune-lr{lr}", size), [])
        chosen = _chosen(bce_choice.best_joint_weight, study, results, size) == w
        test = [summary(runs, k) if chosen else "(w not chosen)" for k in ("test_macro_f1", "test_micro_f1")]
        rows.append(
            f"| {size or 'all'} | {w} | {lr} | {summary(runs, 'validation_macro_f1')} | {test[0]} | {test[1]} "
            f"| {summary(bce, 'validation_macro_f1')} | {summary(bce, 'test_macro_f1')} |"
        )
    if len(rows) == 2:
        rows.append(f"| {NOT_RUN} | | | | | | | |")
    return "\n".join(rows)


if __name__ == "__main__":
    for name in sys.argv[1:] or list(scale.SIZES):
        print(f"## {name}-scale\n{scale_table(name, bce_choice.RESULTS)}\n")
        print(f"## {name}-joint\n{joint_table(name, bce_choice.RESULTS)}\n")
