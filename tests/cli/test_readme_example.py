"""The README's Python API block runs verbatim (tiny sizes by design) and its commands name real things."""

from __future__ import annotations

import os
import re
import runpy

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
README = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()


def _blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README, flags=re.S)


def test_readme_python_block_runs(tmp_path, monkeypatch, capsys):
    block = _blocks("python")[
        0
    ]  # the Python API block (the later ones: tests/cli/test_readme_use_your_model.py)
    script = tmp_path / "readme_example.py"
    script.write_text(block)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")
    printed = capsys.readouterr().out
    assert "'label': 'label_" in printed and "'score':" in printed
    assert (tmp_path / "out" / "classifier" / "config.json").is_file()


def test_readme_commands_point_at_existing_recipes_and_configs():
    paths = set(re.findall(r"(recipes/[\w./-]+\.yaml)", README))
    assert len(paths) >= 8
    missing = [p for p in paths if not os.path.isfile(os.path.join(ROOT, p))]
    assert not missing, missing
    assert "make demo" in README and "make test" in README and "docs/RESULTS.md" in README


def test_readme_bare_commands_come_after_activating_the_venv():
    """A new user copies a block into a fresh shell: bare `hf-mlcl` / `accelerate` only resolve once
    `.venv` is active, so every block that uses them activates it first (or calls `.venv/bin/...`)."""
    blocks = _blocks("bash")
    checked = 0
    for block in blocks:
        lines = [line.strip() for line in block.splitlines() if line.strip()]
        bare = [i for i, line in enumerate(lines) if re.match(r"(hf-mlcl|accelerate)\s", line)]
        if not bare:
            continue
        checked += 1
        activate = [i for i, line in enumerate(lines) if line.startswith("source .venv/bin/activate")]
        assert activate and activate[0] < bare[0], block
    assert checked >= 2
    assert ".venv/bin/hf-mlcl" in README and ".venv/bin/accelerate" in README
