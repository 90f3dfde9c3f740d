"""The built wheel is complete: a non-editable install renders model cards without the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.slow  # keeps the default suite within its 10 minutes (make test-slow)
def test_wheel_ships_model_card_templates_and_renders_cards_outside_the_repo(tmp_path):
    # build from a copy of the sources, so the build leaves nothing (build/, egg-info) in the checkout
    src = tmp_path / "src"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("hf_mlcl", "model_cards"):
        shutil.copytree(os.path.join(REPO, name), src / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(os.path.join(REPO, name), src / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(wheels),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheels.glob("hf_mlcl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for kind in ("encoder", "classifier"):
        assert f"hf_mlcl/model_cards/{kind}.md" in names, kind  # package data, read with importlib.resources
    assert "hf_mlcl/modeling/modeling_mlcl.py" in names
    assert any(n.startswith("hf_mlcl/evaluation/multilabel_metric/") for n in names)

    # install the wheel alone into a fresh environment; dependencies come from this one's site-packages
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", str(wheel)],
        check=True,
        capture_output=True,
    )
    deps = [p for p in sys.path if p.endswith("site-packages")]
    script = (
        "import hf_mlcl.hub.model_card as m\n"
        "assert m.__file__.startswith(%r), m.__file__\n"
        "from hf_mlcl.hub.model_card import CardData, render_model_card\n"
        "card = render_model_card(CardData(kind='classifier', loss='sd', label_names=['a', 'b'], num_labels=2))\n"
        "from importlib import resources\n"
        "print(resources.files(m.TEMPLATE_PACKAGE))\n"
        "print(str(card))\n"
    ) % str(venv)
    out = subprocess.run(
        [str(py), "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(deps)},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    template_dir, card = out.split("\n", 1)
    assert template_dir.startswith(str(venv)) and template_dir.endswith(
        os.path.join("hf_mlcl", "model_cards")
    )
    assert card.startswith("---\n") and "pipeline_tag: text-classification" in card and "hf_mlcl" in card


def test_pyproject_lists_every_package_of_the_source_tree():
    """pyproject.toml lists the packages by hand (to map model_cards/ to hf_mlcl.model_cards): a new
    subpackage missing from the list would be left out of the wheel."""
    import tomllib

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {"hf_mlcl.model_cards"}
    for root, _dirs, files in os.walk(os.path.join(REPO, "hf_mlcl")):
        if "__init__.py" in files:
            found.add(os.path.relpath(root, REPO).replace(os.sep, "."))
    assert listed == found
