"""The figures under docs/figures and the Markdown that shows them (every image a doc links exists, every
figure the scripts write is shown by some doc), and docs/RESULTS.md's length and order."""

from __future__ import annotations

import glob
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOCS = os.path.join(ROOT, "docs")
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+\.png)\)")


def _linked_images() -> dict[str, str]:
    """{image path relative to docs/: the Markdown file that links it} over docs/*.md and README.md."""
    out = {}
    for md in [*glob.glob(os.path.join(DOCS, "*.md")), os.path.join(ROOT, "README.md")]:
        with open(md, encoding="utf-8") as fh:
            for target in IMAGE.findall(fh.read()):
                path = os.path.normpath(os.path.join(os.path.dirname(md), target))
                out[os.path.relpath(path, DOCS)] = os.path.relpath(md, ROOT)
    return out


def test_every_linked_image_exists():
    missing = [
        f"{md}: {img}" for img, md in _linked_images().items() if not os.path.isfile(os.path.join(DOCS, img))
    ]
    assert not missing, missing


def test_every_figure_is_shown_by_a_doc():
    figures = {
        os.path.relpath(p, DOCS)
        for p in glob.glob(os.path.join(DOCS, "figures", "**", "*.png"), recursive=True)
    }
    assert figures, "docs/figures holds no figure"
    unshown = sorted(figures - set(_linked_images()))
    assert not unshown, f"figures no doc shows: {unshown}"


def test_results_doc_keeps_its_length_and_its_findings_first():
    """docs/RESULTS.md stays within 350 lines, with the findings right after the summary table."""
    with open(os.path.join(DOCS, "RESULTS.md"), encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert len(lines) <= 350, f"docs/RESULTS.md has {len(lines)} lines (at most 350)"
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[:2] == ["## Summary", "## Findings"], headings
