"""What every runner of the study shares: a study's data as its recipe loads it, the validation-then-test
scoring of a cell, and the cell's ``metrics.json`` (``studies/results/<study>/<cell>/seed<S>/``).

The study's protocol (docs/RESULTS.md): one global decision threshold is tuned on validation (grid
0.01-0.99, micro-F1; Edin et al. 2023, Sec. 4) and applied to test, which is scored once per run and never
used to choose anything.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the study's files live)


def git_commit() -> str | None:
    """The repository commit a cell ran with: ``$MLCL_GIT_COMMIT`` where set (a copy of the working tree on
    another machine, whose ``.git`` may not be that tree's), else ``git rev-parse HEAD``; None outside git."""
    if os.environ.get("MLCL_GIT_COMMIT"):
        return os.environ["MLCL_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "-C", paths.REPO, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


def device() -> str:
    """What a cell ran on: the CUDA device's name, or "cpu"."""
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"


def write_json(path: str, data) -> None:
    """``data`` as indented JSON at ``path`` (folders created)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True, default=float)
        fh.write("\n")


def cell_dir(study: str, cell: str, seed: int, results: str | None = None) -> str:
    """``<results>/<study>/<cell>/seed<seed>``: where a cell's metrics.json lives."""
    return os.path.join(results or paths.RESULTS, study, cell, f"seed{seed}")


def metrics_path(study: str, cell: str, seed: int, results: str | None = None) -> str:
    """A cell's ``metrics.json`` (in :func:`cell_dir`)."""
    return os.path.join(cell_dir(study, cell, seed, results), "metrics.json")


def validation_macro_f1(path: str) -> float:
    """The validation macro-F1 a cell's ``metrics.json`` records (what every choice of the study reads)."""
    with open(path, encoding="utf-8") as fh:
        return float(json.load(fh)["metrics"]["validation_macro_f1"])


def recipe_path(study: str, name: str) -> str:
    """``studies/recipes/<study>/<name>.yaml``."""
    return os.path.join(paths.STUDIES, "recipes", study, f"{name}.yaml")


def study_data(study: str, overrides: list[str] | None = None):
    """``(DatasetDict, label names, DataArguments)`` of a study, loaded exactly as its recipes load it (the
    frozen-encoder recipe ``pretrained.yaml``: same dataset, splits and ``max_length`` as every cell);
    ``overrides`` are recipe overrides such as ``["--data_dir", "path/to/reuters21578"]``."""
    from hf_mlcl.recipes import load_recipe, parse_stage, split_overrides
    from hf_mlcl.training.stages import load_run_data

    cwd = os.getcwd()
    os.chdir(paths.REPO)  # data_dir in the recipes is relative to the repository root
    try:
        recipe = load_recipe(recipe_path(study, "pretrained"))
        _, data_args, _ = parse_stage(
            recipe,
            "probe",
            split_overrides(list(overrides or []), ["probe"]),
            output_dir=os.path.join(paths.RUNS, study, "unused"),
        )
        data = load_run_data(data_args)
        ds, names = data.dataset, data.label_names
    finally:
        os.chdir(cwd)
    return ds, names, data_args


def multi_hot(label_lists, num_labels: int) -> np.ndarray:
    """(N, L) bool multi-hot matrix of label-id lists."""
    from hf_mlcl.labels.multihot import label_coordinates

    rows, cols, _ = label_coordinates(label_lists, num_labels)
    out = np.zeros((len(label_lists), num_labels), dtype=bool)
    out[rows, cols] = True
    return out


def scored_metrics(
    val_true: np.ndarray, val_scores: np.ndarray, test_true: np.ndarray, test_scores: np.ndarray
) -> dict[str, float]:
    """The protocol's numbers of one cell: the global threshold tuned on validation for micro-F1
    (``tune_global_threshold``), then every metric of validation and of test at that threshold, keyed
    ``validation_<metric>`` / ``test_<metric>`` as the trained cells' metrics.json are, plus ``threshold``."""
    from hf_mlcl.evaluation.metrics import compute_multilabel_metrics
    from hf_mlcl.evaluation.thresholds import tune_global_threshold

    thr = tune_global_threshold(val_true, val_scores)
    out: dict[str, float] = {"threshold": thr}
    for prefix, truth, scores in (("validation", val_true, val_scores), ("test", test_true, test_scores)):
        m = compute_multilabel_metrics(truth, scores, threshold=thr)
        out.update({f"{prefix}_{k}": float(v) for k, v in m.items() if not np.isnan(v)})
    return out


def per_label_record(names, test_true: np.ndarray, test_scores: np.ndarray, threshold, train_count) -> dict:
    """What ``per_label_f1.json`` holds (the tail plot and table read it): each label's test F1 at the tuned
    ``threshold`` (a float or per-label array), with its number of training and test texts."""
    from hf_mlcl.evaluation import per_label_f1

    f1 = per_label_f1(test_true, test_scores >= np.asarray(threshold, dtype=np.float64))
    return {
        "label_names": list(names),
        "test_f1": [float(x) for x in f1],
        "train_count": np.asarray(train_count).astype(int).tolist(),
        "test_count": np.asarray(test_true).sum(0).astype(int).tolist(),
    }


RERUN_HELP = "rerun a finished cell that has no per_label_f1.json (it ran before those files were written)"


def finished(out_dir: str, force: bool, without_per_label: bool = False) -> bool:
    """Whether the cell in ``out_dir`` is done: its metrics.json exists, ``force`` is off, and with
    ``without_per_label`` its per_label_f1.json exists too (a cell run before those files is run again)."""
    if force or not os.path.isfile(os.path.join(out_dir, "metrics.json")):
        return False
    return not without_per_label or os.path.isfile(os.path.join(out_dir, "per_label_f1.json"))


RUN_RECORDS = ("timeline.jsonl", "epoch_test.jsonl")  # appended per epoch by studies/run.py's callbacks


def drop_finished_run_files(folder: str, out_dir: str) -> list[str]:
    """Before a finished cell in ``out_dir`` runs again (``--force``, ``--rerun-without-per-label``): delete what
    its finished run left in ``folder`` (older than its metrics.json): the ``checkpoint-*`` folders, so the rerun
    trains anew instead of resuming from that run's last checkpoint, and the per-epoch records
    (:data:`RUN_RECORDS`), which the rerun would append to. A rerun's own files (newer) stay for its resume.
    Returns the paths deleted."""
    import shutil

    done = os.path.join(out_dir, "metrics.json")
    if not os.path.isfile(done) or not os.path.isdir(folder):
        return []
    finished_at = os.path.getmtime(done)
    stale = [
        os.path.join(folder, name)
        for name in sorted(os.listdir(folder))
        if (name.startswith("checkpoint-") or name in RUN_RECORDS)
        and os.path.getmtime(os.path.join(folder, name)) < finished_at
    ]
    for path in stale:
        if os.path.isdir(path):
            shutil.rmtree(path)
        else:
            os.remove(path)
    return stale


def skip_finished(study: str, cell: str, seed: int, force: bool, without_per_label: bool = False) -> bool:
    """True (and a SKIP line) when the cell is :func:`finished`."""
    out_dir = cell_dir(study, cell, seed)
    if not finished(out_dir, force, without_per_label):
        return False
    print(f"SKIP {study} {cell} seed{seed}: {out_dir}/metrics.json exists (--force reruns)", flush=True)
    return True


def labelled_data(study: str, overrides: list[str]):
    """:func:`study_data` plus the (N, L) multi-hot labels of each split: ``(ds, names, data_args, y)``."""
    ds, names, data_args = study_data(study, overrides)
    y = {s: multi_hot(ds[s]["labels"], len(names)) for s in ("train", "validation", "test")}
    return ds, names, data_args, y


def write_baseline(
    study: str,
    loss: str,
    probe: str,
    seed: int,
    overrides: list[str],
    data,
    test_scores: np.ndarray,
    metrics: dict,
    settings: dict,
    wall_s: dict,
    train_size: int | None = None,
) -> dict:
    """Write a baseline cell (``<loss>_<probe>``, ``-n<N>`` on a training subset of N rows, studies/scale.py):
    its per_label_f1.json and its metrics.json, in the trained cells' layout (``data``: :func:`labelled_data`'s
    tuple; ``settings``: what the baseline chose and used; ``wall_s``: its seconds, ``probe_s`` (+ ``stage1_s``)
    being what the tables count as training)."""
    from scale import cell_name

    ds, names, data_args, y = data
    cell = cell_name(f"{loss}_{probe}", train_size)
    out = cell_dir(study, cell, seed)
    result = {
        "dataset": study,
        "loss": loss,
        "probe": probe,
        "seed": seed,
        "tag": None,
        "train_size": train_size,  # None: the whole training split
        "overrides": overrides,
        "git_commit": git_commit(),
        "device": device(),
        "baseline": settings,
        "data": {
            "data_dir": data_args.data_dir,
            "subset_seed": getattr(data_args, "subset_seed", None),
            **{s: len(ds[s]) for s in ("train", "validation", "test")},
        },
        "metrics": metrics,
        "wall_s": wall_s,
        "process_cpu_s": round(time.process_time(), 1),
    }  # all threads, the whole process: load-independent
    write_json(
        os.path.join(out, "per_label_f1.json"),
        per_label_record(names, y["test"], test_scores, metrics["threshold"], y["train"].sum(0)),
    )
    write_json(os.path.join(out, "metrics.json"), result)
    print(
        f"RESULT {study} {cell} seed{seed}: test micro-F1 {metrics['test_micro_f1']:.4f} macro-F1 "
        f"{metrics['test_macro_f1']:.4f}, {sum(wall_s.get(k, 0.0) for k in ('stage1_s', 'probe_s')):.0f} s",
        flush=True,
    )
    return result


def baseline_parser(doc: str):
    """The command line every baseline script shares: the study, ``--seed``, ``--train-size``, ``--force``; the
    rest are recipe overrides (``--data_dir ...``)."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("study", choices=("reuters21578", "goemotions_full"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="train on this many rows of the training split, the seeded subset every method shares "
        "(studies/scale.py; cell <cell>-n<N>); default: all",
    )
    ap.add_argument("--force", action="store_true", help="rerun a finished cell")
    ap.add_argument("--rerun-without-per-label", action="store_true", help=RERUN_HELP)
    return ap
