"""The scripts of benchmarks/, studies/ and examples/ open with a short docstring (what the script holds and how
to run it); how a measurement or a study cell works is told in docs/, and each reference to a docs heading
resolves."""

from __future__ import annotations

import ast
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(
    os.path.relpath(p, ROOT)
    for pattern in ("benchmarks/**/*.py", "studies/*.py", "examples/**/*.py")
    for p in glob.glob(os.path.join(ROOT, pattern), recursive=True)
)
MAX_LINES = 15
# a reference to a docs section: docs/<file>.md, "<heading>"
REFERENCE = re.compile(r'docs/(\w+)\.md,\s+"([^"]+)"')


def _docstring(path: str) -> str | None:
    full = os.path.join(ROOT, path)
    return ast.get_docstring(ast.parse(open(full, encoding="utf-8").read(), full), clean=False)


def _headings(doc: str) -> set[str]:
    text = open(os.path.join(ROOT, "docs", f"{doc}.md"), encoding="utf-8").read()
    return {" ".join(h.split()) for h in re.findall(r"^#{1,4} (.+)$", text, flags=re.M)}


def test_the_scripts_are_found():
    assert len(SCRIPTS) >= 40, SCRIPTS  # benchmarks, their measurements, the study's scripts, the examples


@pytest.mark.parametrize("path", [p for p in SCRIPTS if not p.endswith("__init__.py")])
def test_script_opens_with_a_short_docstring(path):
    doc = _docstring(path)
    assert doc and len(doc.split("\n", 1)[0].strip()) >= 10, f"{path}: first line should name what it holds"
    lines = len(doc.splitlines())
    assert lines <= MAX_LINES, (
        f"{path}: a {lines}-line module docstring; how it works belongs in docs/ (docs/benchmarks.md, docs/study.md)"
    )


def test_every_docs_reference_of_a_script_or_module_names_a_heading():
    """`docs/<file>.md, "<heading>"` in a script or a module of hf_mlcl points at a heading of that file."""
    sources = SCRIPTS + [
        os.path.relpath(p, ROOT)
        for p in glob.glob(os.path.join(ROOT, "hf_mlcl", "**", "*.py"), recursive=True)
    ]
    cited = {
        (path, doc, " ".join(name.split()))
        for path in sources
        for doc, name in REFERENCE.findall(open(os.path.join(ROOT, path), encoding="utf-8").read())
    }
    docs = {doc for _, doc, _ in cited}
    assert {"design", "benchmarks", "study"} <= docs, docs  # the forms this test reads are in use
    headings = {
        doc: _headings(doc) for doc in docs if os.path.exists(os.path.join(ROOT, "docs", f"{doc}.md"))
    }
    missing = sorted((path, doc, name) for path, doc, name in cited if name not in headings.get(doc, set()))
    assert not missing, missing
