"""Regenerate the tables (and the per-label F1 plots) of docs/RESULTS.md from the run outputs.

    python studies/make_tables.py            # rewrites the blocks between <!-- TABLE:x --> markers
    python studies/make_tables.py --print    # only print the tables

Reads studies/results/<dataset>/<loss>_<probe>/seed<S>/metrics.json (written by studies/run.py) and assembles
the tables of full_tables, tail_table, scale_table, variant_tables and gpu_tables; writes docs/RESULTS.md, its
figures, and the results study's cost (cost_tables) at the end of docs/PERFORMANCE.md.

Protocol: docs/study.md, "The tables (studies/make_tables.py)".
"""

from __future__ import annotations

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import encoder_identity  # noqa: E402  (studies/encoder_identity.py: the encoder each cell stood on)
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
import scale_table  # noqa: E402  (studies/scale_table.py: the data-scale and joint-objective tables)
from cost_tables import compute_figure, cost_section  # noqa: E402  (studies/cost_tables.py: the cost)
from full_tables import (  # noqa: E402  (studies/full_tables.py: the full-data studies' own tables)
    comparison_table,
    full_table,
    lr_table,
    summary_table,
)
from gpu_tables import gpu_tables  # noqa: E402  (studies/gpu_tables.py: the study on one GPU)
from study_cells import FULL_STUDIES  # noqa: E402  (studies/study_cells.py: the cells the tables read)
from tail_table import full_f1_plot, tail_table  # noqa: E402  (studies/tail_table.py: the per-label tail)
from variant_tables import papers_table, sampler_table  # noqa: E402  (studies/variant_tables.py)

REPO = paths.REPO
RESULTS_MD = os.path.join(REPO, "docs", "RESULTS.md")
FIGURES = os.path.join(REPO, "docs", "figures")  # the plots RESULTS.md shows
PERFORMANCE_MD = os.path.join(REPO, "docs", "PERFORMANCE.md")  # its last part: the cost of the study's cells


def write_cost_section() -> str:
    """Replace docs/PERFORMANCE.md's results-study part (from ``performance_doc.STUDY_MARK`` on) with
    ``cost_tables.cost_section``, keeping the part benchmarks/performance_doc.py writes."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from performance_doc import STUDY_MARK, split_generated

    with open(PERFORMANCE_MD, encoding="utf-8") as fh:
        own, _ = split_generated(fh.read())
    with open(PERFORMANCE_MD, "w", encoding="utf-8") as fh:
        fh.write(own.rstrip("\n") + "\n\n" + STUDY_MARK + "\n\n" + cost_section())
    return PERFORMANCE_MD


def main(argv: list[str]) -> None:
    tables = {
        "summary": summary_table(),
        "papers-budgets": papers_table(),
        "reuters21578-sampler": sampler_table("reuters21578"),
    }
    tables.update({f"{d}-full": full_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-lr": lr_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-vs-bce": comparison_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-tail": tail_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-scale": scale_table.scale_table(d, paths.RESULTS) for d in FULL_STUDIES})
    tables["joint"] = scale_table.joint_table(list(FULL_STUDIES), paths.RESULTS)
    tables.update(gpu_tables())
    if "--print" in argv:
        for d, t in tables.items():
            print(f"## {d}\n{t}\n")
        print(f"## cost (docs/PERFORMANCE.md)\n{cost_section()}")
        return
    for d in FULL_STUDIES:
        if os.path.isdir(os.path.join(paths.RESULTS, d)):
            print("plot:", full_f1_plot(d, os.path.join(FIGURES, d, "f1_vs_frequency.png")))
    print("plot:", compute_figure(os.path.join(FIGURES, "compute_vs_macro_f1.png")))
    for d in FULL_STUDIES:
        print(
            "plot:",
            scale_table.scale_figure(d, paths.RESULTS, os.path.join(FIGURES, d, "macro_f1_vs_size.png")),
        )
    with open(RESULTS_MD, encoding="utf-8") as fh:
        text = fh.read()
    for d, t in tables.items():
        pattern = re.compile(rf"(<!-- TABLE:{d} -->\n)(?:.*?\n)?(<!-- /TABLE:{d} -->)", re.S)
        text = pattern.sub(lambda m, t=t: m.group(1) + t + "\n" + m.group(2), text)
    with open(RESULTS_MD, "w", encoding="utf-8") as fh:
        fh.write(text)
    print("updated", RESULTS_MD)
    print("updated", write_cost_section())
    print(encoder_identity.report())


if __name__ == "__main__":
    main(sys.argv[1:])
