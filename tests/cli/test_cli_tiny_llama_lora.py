"""recipes/demo/tiny_llama_lora.yaml, the CPU smoke test of the LoRA path, run as its header says: the one-liner
that writes the tiny Llama base, then `hf-mlcl run` (with fewer steps); both stages are adapter folders that name
the base and load back."""

from __future__ import annotations

import json
import os
import shlex

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_llama_lora.yaml")


def _documented_commands() -> tuple[str, list[str]]:
    """The recipe header's two commands: the Python code of the one-liner that writes the base, and the
    arguments of `hf-mlcl` (the recipe's path taken from the repository root)."""
    lines = [line[1:].strip() for line in open(RECIPE, encoding="utf-8") if line.startswith("#   .venv/bin/")]
    assert len(lines) == 2, lines
    python, run = (shlex.split(line) for line in lines)
    assert python[:2] == [".venv/bin/python", "-c"] and run[0] == ".venv/bin/hf-mlcl"
    return python[2], [os.path.join(ROOT, a) if a.startswith("recipes/") else a for a in run[1:]]


@pytest.mark.timeout(600)
def test_the_tiny_llama_lora_recipe_runs_as_documented(tmp_path, monkeypatch):
    from hf_mlcl.cli import main
    from hf_mlcl.modeling import MLCLForMultiLabelClassification

    write_base, run = _documented_commands()
    assert run == ["run", RECIPE]
    monkeypatch.chdir(tmp_path)  # both commands name their folders relative to where they start
    exec(compile(write_base, "<recipe header>", "exec"), {})  # noqa: S102 - the documented one-liner, verbatim
    assert main([*run, "--max_steps", "2", "--disable_tqdm", "true", "--no_plots"]) == 0
    out = tmp_path / "outputs" / "tiny_llama_lora"
    for stage in ("encoder", "classifier"):
        adapter = json.load(open(out / stage / "adapter_config.json"))
        # the recipe's relative base, as an absolute path: the folder loads from any working directory
        assert adapter["base_model_name_or_path"] == str(tmp_path / "outputs" / "tiny_llama_base")
        assert (out / stage / "adapter_model.safetensors").is_file()
    model = MLCLForMultiLabelClassification.from_pretrained(str(out / "classifier"))
    assert model.config.num_labels == 10 and model.config.decision_threshold is not None
