"""The Python blocks of docs/usage.md's options section run as they are (offline, tiny sizes)."""

from __future__ import annotations

import os
import re
import runpy

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SECTION = "## Loss, model and data options (with examples)"


def _blocks() -> list[str]:
    text = open(os.path.join(ROOT, "docs", "usage.md"), encoding="utf-8").read()
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    return re.findall(r"```python\n(.*?)```", text[start : end if end > 0 else None], flags=re.S)


def test_the_section_has_its_examples():
    assert len(_blocks()) == 7


@pytest.mark.parametrize("index", range(7))
def test_usage_example_runs(index, tmp_path, monkeypatch, capsys):
    script = tmp_path / f"usage_example_{index}.py"
    script.write_text(_blocks()[index])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr().out
    expected = [
        "soft positives",
        "zlpr",
        "[[[0, 1], [0], [0], [1]], [[1, 2], [1], [2], [2]]]",
        "test ",
        "same embeddings: True",
        "label_format='bool', filled=32",
        "{'train': 3, 'validation': 1}",
    ][index]
    assert expected in out, out
