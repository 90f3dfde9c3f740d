"""The GPU study's tables of docs/RESULTS.md: the study run on one GPU in bf16 (``run_gpu.sh``, ``gpu_bf16``).

``gpu-<study>-full``, ``-lr`` and ``-vs-bce``: the full-data tables read from that tree, with its own choices on
its own validation numbers; ``gpu-summary``: test macro-F1 of the rows both devices ran, side by side.
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
from bce_choice import LONG_BUDGET as LONG_BCE  # noqa: E402  (the studies with a longer-budget BCE run)
from full_tables import comparison_table, full_table, lr_table  # noqa: E402  (studies/full_tables.py)
from study_cells import (  # noqa: E402  (studies/study_cells.py: the cells and the names of the rows)
    CONTRASTIVE,
    FULL_PROBES,
    FULL_STUDIES,
    GPU_DIR,
    ORDER,
    chosen_lr,
    full_runs,
    load,
    long_bce_runs,
    metric,
    results_root,
)


def _row_runs(study: str) -> dict[tuple[str, str], list[dict]]:
    """Every full-table row's runs by (loss, probe) in the current results tree (fine-tunes at the tree's own
    chosen learning rate; ``("bce", "finetune-long")`` the longer-budget BCE run)."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    rows = {
        (loss, probe): full_runs(plain, tagged, lr, loss, probe)
        for loss in ORDER
        for probe in ("logistic", "linear", "finetune")
    }
    rows[("bce", "finetune-long")] = long_bce_runs(study, tagged, lr)
    return {k: v for k, v in rows.items() if v}


def _lr_of(runs: list[dict]) -> str:
    """The fine-tuning learning rate of a row's cells, from their tags (``lr2e-4``, ``long-lr2e-4``)."""
    return "/".join(sorted({str(r.get("tag") or "").rpartition("lr")[2] for r in runs}))


def _loss_range(runs_by_loss: dict[str, list[dict]]) -> str:
    """min-max over losses of each loss's mean test macro-F1, and how many losses."""
    means = [
        np.mean([float(r["metrics"]["test_macro_f1"]) for r in rs]) for rs in runs_by_loss.values() if rs
    ]
    if not means:
        return "—"
    return (
        f"{min(means):.3f}-{max(means):.3f} ({len(means)} losses)"
        if len(means) > 1
        else f"{means[0]:.3f} (1 loss)"
    )


def gpu_summary_table(gpu_root: str) -> str:
    """Test macro-F1 of the CPU study (fp32) and of the same cells on one GPU (bf16, ``gpu_root``): the BCE rows
    over their seeds, the stage-1 rows as the range over the losses both devices ran."""
    rows = ["| dataset | rows | test macro-F1, CPU fp32 | test macro-F1, GPU bf16 |", "|---|---|---|---|"]
    for study in FULL_STUDIES:
        cpu = _row_runs(study)
        with results_root(gpu_root):
            gpu = _row_runs(study)
        for key, budget in (
            (("bce", "finetune"), "up to 5 epochs"),
            (("bce", "finetune-long"), LONG_BCE.get(study)),
        ):
            if key in cpu and key in gpu:
                label = f"BCE fine-tune, lr {_lr_of(cpu[key])} / {_lr_of(gpu[key])} (CPU / GPU), {budget}"
                rows.append(
                    f"| {study} | {label} | {metric(cpu[key], 'test_macro_f1')} "
                    f"| {metric(gpu[key], 'test_macro_f1')} |"
                )
        for probe in ("logistic", "linear", "finetune"):
            both = [loss for loss in CONTRASTIVE if (loss, probe) in cpu and (loss, probe) in gpu]
            if both:
                rows.append(
                    f"| {study} | stage 1 + {FULL_PROBES[probe]}, per loss (mean over its seeds) "
                    f"| {_loss_range({lo: cpu[(lo, probe)] for lo in both})} "
                    f"| {_loss_range({lo: gpu[(lo, probe)] for lo in both})} |"
                )
    return "\n".join(rows) if len(rows) > 2 else "No row has run on a GPU yet."


def gpu_tables() -> dict[str, str]:
    """The tables of the GPU study (``studies/results/gpu_bf16``), none where that tree is absent."""
    root = os.path.join(paths.RESULTS, GPU_DIR)
    if not os.path.isdir(root):
        return {}
    tables = {"gpu-summary": gpu_summary_table(root)}
    with results_root(root):
        for d in FULL_STUDIES:
            tables.update(
                {
                    f"gpu-{d}-full": full_table(d),
                    f"gpu-{d}-lr": lr_table(d),
                    f"gpu-{d}-vs-bce": comparison_table(d),
                }
            )
    return tables
