"""The three scripts in examples/ run on a tiny CSV with a tiny random BERT (their --tiny flag)."""

from __future__ import annotations

import csv
import json
import os
import random
import runpy

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOPICS = {
    "sports": "goal match team score win",
    "politics": "vote law party senate bill",
    "science": "atom cell gene lab data",
}


@pytest.fixture
def tiny_csv(tmp_path):
    rng = random.Random(0)
    path = tmp_path / "my_data.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "labels"])
        for _ in range(64):
            labs = rng.sample(sorted(TOPICS), rng.randint(1, 2))
            w.writerow([" ".join(" ".join(rng.sample(TOPICS[t].split(), 3)) for t in labs), ";".join(labs)])
    return str(path)


def _main(name):
    return runpy.run_path(os.path.join(ROOT, "examples", name), run_name="example")["main"]


def test_own_csv_example(tiny_csv, tmp_path, capsys):
    out = _main("own_csv.py")([tiny_csv, "--tiny", "--max-steps", "2", "--output-dir", str(tmp_path / "run")])
    assert "validation_micro_f1" in out["probe"] and not any(k.startswith("test_") for k in out["probe"])
    printed = capsys.readouterr().out
    assert "carved from train (6 of 64 rows" in printed
    cfg = json.load(open(tmp_path / "run" / "classifier" / "mlcl_config.json"))
    assert sorted(cfg["id2label"].values()) == ["politics", "science", "sports"]


@pytest.mark.parametrize("cached", [False, True])
def test_sentence_transformers_example(tiny_csv, tmp_path, capsys, cached):
    pytest.importorskip("sentence_transformers")
    argv = [
        tiny_csv,
        "--tiny",
        "--loss",
        "mulsupcon",
        "--max-steps",
        "2",
        "--batch-size",
        "16",
        "--output-dir",
        str(tmp_path / "st"),
    ] + (["--cached"] if cached else [])
    _main("sentence_transformers_training.py")(argv)
    assert "trained 2 steps" in capsys.readouterr().out
    card = open(tmp_path / "st" / "final" / "README.md", encoding="utf-8").read()
    assert (
        "zhang2024mulsupcon" in card
        and ("CachedMultiLabelContrastiveLoss" if cached else "MultiLabelContrastiveLoss") in card
    )


def test_trainer_compute_loss_func_example(tiny_csv, tmp_path, capsys):
    trainer = _main("trainer_compute_loss_func.py")(
        [tiny_csv, "--tiny", "--max-steps", "2", "--output-dir", str(tmp_path / "enc")]
    )
    assert trainer.state.global_step == 2
    assert "trained 2 steps with sd" in capsys.readouterr().out
    from hf_mlcl.modeling import MLCLEncoder

    assert MLCLEncoder.from_pretrained(str(tmp_path / "enc")).config.projection_dim == 32
