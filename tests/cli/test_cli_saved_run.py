"""What a user does with a finished run's folders: copy the card's "How to use" code and run it as it stands
(no trust_remote_code prompt, the model found where the card says), and `hf-mlcl evaluate` the classifier
from another working directory (the card's relative data path resolved locally, never put into the Hub
metadata)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import pytest

from hf_mlcl.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
TOPICS = {
    "sports": "goal match team score",
    "politics": "vote law party senate",
    "science": "atom cell gene lab",
}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """`hf-mlcl run` in a folder of its own on a CSV named by a relative path, as a user starts it."""
    import random

    home = tmp_path_factory.mktemp("project")
    rng = random.Random(0)
    with open(home / "my_data.csv", "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "labels"])
        for _ in range(72):
            labs = rng.sample(sorted(TOPICS), rng.randint(1, 2))
            w.writerow([" ".join(" ".join(rng.sample(TOPICS[t].split(), 3)) for t in labs), ";".join(labs)])
    before = os.getcwd()
    os.chdir(home)
    try:
        rc = main(
            [
                "run",
                RECIPE,
                "--dataset",
                "my_data.csv",
                "--output_dir",
                "out",
                "--max_steps",
                "2",
                "--disable_tqdm",
                "true",
                "--no_plots",
            ]
        )
    finally:
        os.chdir(before)
    assert rc == 0
    return home


def _how_to_use(readme: str) -> list[str]:
    section = readme.split("## How to use", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


def test_the_cards_how_to_use_code_runs_verbatim_without_a_prompt(finished_run, tmp_path):
    """Both cards' blocks, verbatim, in one fresh interpreter with the Hub off and no terminal to answer
    transformers' "Do you wish to run the custom code? [y/N]" (it then fails instead of waiting)."""
    blocks = []
    for stage in ("classifier", "encoder"):
        found = _how_to_use((finished_run / "out" / stage / "README.md").read_text(encoding="utf-8"))
        assert found and f'"out/{stage}"' in found[0]  # the model's folder, as the run named it
        blocks += found
    assert "hf-mlcl-" not in "".join(blocks)  # no made-up name in place of the folder
    assert "SentenceTransformer(" in blocks[-1] and "trust_remote_code" not in blocks[-1]  # a native encoder
    script = "\n\n".join(blocks) + "\nprint('HOW-TO-USE-RAN', labels, embeddings.shape)\n"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=finished_run,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    assert proc.returncode == 0 and "HOW-TO-USE-RAN" in proc.stdout, proc.stderr[-3000:]


def test_evaluate_from_another_directory_finds_the_runs_own_data(finished_run, tmp_path, monkeypatch, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    checkpoint = os.path.relpath(finished_run / "out" / "classifier", elsewhere)
    assert main(["evaluate", checkpoint, "--split", "validation", "--no_plots"]) == 0
    saved = json.load(open(finished_run / "out" / "classifier" / "eval_validation.json"))
    metrics = json.load(open(finished_run / "out" / "classifier" / "metrics.json"))
    assert saved["validation_micro_f1"] == pytest.approx(metrics["validation_micro_f1"], abs=1e-6)
    card = json.load(open(finished_run / "out" / "classifier" / "card_data.json"))
    assert card["dataset"] == "my_data.csv" and card["local_data"] == {"dataset": "../../my_data.csv"}
    meta = (finished_run / "out" / "classifier" / "README.md").read_text(encoding="utf-8").split("---", 2)[1]
    assert (
        "name: my_data.csv" in meta and "../" not in meta and str(finished_run) not in meta
    )  # the file's name only


def test_evaluate_on_the_same_labels_in_another_order_says_so(finished_run, tmp_path, capsys, monkeypatch):
    names = tmp_path / "names.txt"
    names.write_text("\n".join(sorted(TOPICS, reverse=True)) + "\n", encoding="utf-8")
    monkeypatch.chdir(finished_run)
    options = json.dumps({"label_names": str(names)})
    argv = ["evaluate", "out/classifier", "--dataset", "my_data.csv", "--dataset_options", options]
    assert main([*argv, "--split", "validation", "--no_plots", "--output_dir", str(tmp_path / "e")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "has the checkpoint's 3 labels in another order" in err[0], err
    assert "label 0 is 'politics' in the checkpoint, 'sports' in the data" in err[0]
