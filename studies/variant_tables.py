"""The stage-1 variants' tables of docs/RESULTS.md: other batches (``<study>-sampler``), the papers' budgets.

``<study>-sampler``: stage 1 with positive-ensured batches (``run.py --batch-sampler positives``) against the
same cell with random batches, seed 1. ``papers-budgets``: each loss's stage-1 budget from its paper
(``paper_budgets.py``) and the test macro-F1 of its logistic probe at that budget (``run_gpu.sh papers``).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
from study_cells import (  # noqa: E402  (studies/study_cells.py: the cells and the names of the rows)
    CONTRASTIVE,
    FULL_STUDIES,
    NAMES,
    NOT_RUN,
    load,
    load_tree,
    metric,
)

PAPERS_DIR = "gpu_papers"  # run_gpu.sh papers: every loss at its paper's stage-1 budget


def _sampler_cell(old: list[dict], new: list[dict], key: str) -> str:
    """``random → positives (difference)`` of one metric of seed 1."""
    if not old:
        return "—"
    v0 = old[0]["metrics"][key]
    if not new:
        return f"{v0:.3f} → {NOT_RUN}"
    v1 = new[0]["metrics"][key]
    return f"{v0:.3f} → {v1:.3f} ({v1 - v0:+.3f})"


def sampler_table(study: str) -> str:
    """Stage 1 with positive-ensured batches (``run.py --batch-sampler positives``) against the same cell with
    random batches, seed 1: test macro-F1 of both frozen probes and validation macro-F1 of the logistic one."""
    plain, positives = load(study), load(study, batch_sampler="positives")
    rows = [
        "| stage 1 | logistic probe: test macro-F1, random → positives | linear probe: test macro-F1, random → "
        "positives | logistic probe: validation macro-F1 | logistic probe: test micro-F1 |",
        "|---|---|---|---|---|",
    ]
    for loss in CONTRASTIVE:
        cells = {
            p: (
                [r for r in plain.get((loss, p), []) if r["seed"] == 1],
                [r for r in positives.get((loss, p), []) if r["seed"] == 1],
            )
            for p in ("logistic", "linear")
        }
        if cells["logistic"][0] or cells["linear"][0]:
            rows.append(
                f"| {NAMES.get(loss, loss)} | {_sampler_cell(*cells['logistic'], 'test_macro_f1')} | "
                f"{_sampler_cell(*cells['linear'], 'test_macro_f1')} | "
                f"{_sampler_cell(*cells['logistic'], 'validation_macro_f1')} | "
                f"{_sampler_cell(*cells['logistic'], 'test_micro_f1')} |"
            )
    return "\n".join(rows)


def papers_table() -> str:
    """Each loss's stage-1 budget from its paper (``paper_budgets.py``) and, per study, the test macro-F1 of its
    logistic probe at that budget (``run_gpu.sh papers``), "not yet run" until the cell exists."""
    import paper_budgets

    root = os.path.join(paths.RESULTS, PAPERS_DIR)
    done = {d: load_tree(root, d) if os.path.isdir(os.path.join(root, d)) else {} for d in FULL_STUDIES}
    rows = paper_budgets.table().splitlines()
    rows[0] += "".join(f" {d}: stage 1 + logistic probe, test macro-F1 |" for d in FULL_STUDIES)
    rows[1] += "---|" * len(FULL_STUDIES)
    for i, loss in enumerate(paper_budgets.BUDGETS, start=2):
        rows[i] += "".join(
            f" {metric(done[d][(loss, 'logistic')], 'test_macro_f1') if (loss, 'logistic') in done[d] else NOT_RUN} |"
            for d in FULL_STUDIES
        )
    return "\n".join(rows)
