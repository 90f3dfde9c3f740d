"""What a new user copies from README and docs/usage.md works where they run it: the install from the
repository, `hf auth login`, the data folders of the grid recipes, and default output folders that git ignores."""

from __future__ import annotations

import glob
import os
import re

import pytest

from hf_mlcl.recipes import load_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
USER_FILES = [
    "README.md",
    "docs/usage.md",
    "pyproject.toml",
    *glob.glob("recipes/**/*.yaml", root_dir=ROOT, recursive=True),
    *glob.glob("hf_mlcl/**/*.py", root_dir=ROOT, recursive=True),
    *glob.glob("examples/*.py", root_dir=ROOT),
    *glob.glob("benchmarks/*.py", root_dir=ROOT),
]


def _read(rel: str) -> str:
    with open(os.path.join(ROOT, rel), encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize(
    ("stale", "why"),
    [
        ("huggingface-cli login", "the installed command is `hf auth login`"),
        ("pip install hf_mlcl[", 'hf_mlcl is installed from the repository: pip install -e ".[extra]"'),
        ("pip install 'hf_mlcl[", "hf_mlcl is installed from the repository: pip install -e '.[extra]'"),
    ],
)
def test_no_command_that_fails_verbatim(stale, why):
    found = [rel for rel in USER_FILES if stale in _read(rel)]
    assert not found, f"{stale!r} in {found}: {why}"


def test_the_grid_recipes_read_data_where_readme_puts_it():
    readme = _read("README.md")
    folders = set()
    for rel in glob.glob("recipes/*/*/*.yaml", root_dir=ROOT):
        if rel.startswith(("recipes/cpu/", "recipes/base/")):
            continue
        data_dir = load_recipe(os.path.join(ROOT, rel)).get("data_dir")
        assert data_dir and re.fullmatch(r"data/\w+", data_dir), (rel, data_dir)
        folders.add(data_dir)
    assert len(folders) == 6
    for folder in sorted(folders):
        assert f"`{folder}`" in readme, folder
    assert "mkdir -p data && ln -s" in readme and "--data_dir DIR" in readme


def test_default_output_folders_are_gitignored():
    """The folders the documented commands write by default: the demo's and inspect's defaults, README's
    GoEmotions demo and Python API, every recipe's `outputs/` and the grid's `data/`."""
    from hf_mlcl.cli import build_parser

    ignored = {
        line.strip().strip("/")
        for line in _read(".gitignore").splitlines()
        if line.strip() and not line.startswith("#")
    }
    sub = build_parser()._subparsers._group_actions[0].choices  # noqa: SLF001 - the sub-command parsers
    defaults = {os.path.normpath(sub[name].get_default("output_dir")) for name in ("demo", "inspect")}
    readme = _read("README.md")
    assert "--output_dir demo_goemotions" in readme and '"out/encoder"' in readme
    for folder in {*defaults, "demo_goemotions", "out", "outputs", "data"}:
        assert folder in ignored, folder
