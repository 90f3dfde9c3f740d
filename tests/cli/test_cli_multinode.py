"""`hf-mlcl run` launched as two nodes of one process each on 127.0.0.1 (two `accelerate launch` commands,
--num_machines 2, --machine_rank 0 / 1, gloo), see _two_nodes.py.

* A shared output folder: every file is written once (an inotify count of the completed writes), by the
  global main process (node 1's files would carry its umask), except each process's own RNG state; the
  checkpoints are complete; the stage-1 losses equal one process on the same global batch.
* One node fails (its data file is missing): both nodes end, and the main node names the cause.
* (slow) Node-local output folders (`save_on_each_node: true`): each node holds the whole run, the same
  frozen features (so the same tokenizer, carved validation split and encoder) and resumes from the newest
  checkpoint complete on both nodes; resume in a shared folder; the losses equal one node of two
  processes; a node that fails before the process group forms leaves no node hanging.
"""

from __future__ import annotations

import csv
import json
import os

import pytest
from _two_nodes import NODE_UMASKS, describe, launch_two_nodes
from _write_watch import WriteWatch

from hf_mlcl.training.checkpoints import SAVING_MARKER, is_complete_checkpoint

RECIPE = """\
dataset: data.csv
text_column: text
label_column: labels
validation_fraction: 0.2
split_seed: 42
backbone_config: {model_type: bert, vocab_size: 500, hidden_size: 32, num_hidden_layers: 2, num_attention_heads: 4,
                  intermediate_size: 64, max_position_embeddings: 64, hidden_dropout_prob: 0.0,
                  attention_probs_dropout_prob: 0.0}
pooling: mean
max_length: 32
contrastive:
  loss: similarity_dissimilarity
  projection_dim: 16
  learning_rate: 1.0e-3
  max_steps: 2
  per_device_train_batch_size: 8
  train_sampling_strategy: sequential
  save_strategy: steps
  save_steps: 1
  logging_steps: 1
probe:
  probe: linear
  loss: bce
  learning_rate: 1.0e-2
  max_steps: 2
  per_device_train_batch_size: 8
  save_strategy: "no"
  logging_steps: 1
  feature_cache_dir: features
"""
# what every launch adds on the command line (the CPU flag, quiet logs)
COMMON = ["--use_cpu", "true", "--disable_tqdm", "true", "--report_to", "none", "--no_plots"]
MODEL_FILES = {"config.json", "configuration_mlcl.py", "modeling_mlcl.py", "model.safetensors", "tokenizer.json",
               "tokenizer_config.json", "training_args.bin"}  # fmt: skip
STAGE_FILES = MODEL_FILES | {"README.md", "card_data.json", "metrics.json", "trainer_state.json"}
CHECKPOINT_FILES = MODEL_FILES | {"trainer_state.json", "optimizer.pt", "scheduler.pt", "mlcl_trainer_state.safetensors",
                                  "rng_state_0.pth", "rng_state_1.pth"}  # fmt: skip
NODE_TIMEOUT = 240  # seconds for both nodes of one launch; a run takes about 40 s on two busy cores


def _write_data(folder: str, n: int = 80) -> None:
    """A CSV of ``n`` rows (text, labels joined by ';') with no validation file: the run carves one."""
    from hf_mlcl.data import make_synthetic_corpus

    ds = make_synthetic_corpus(num_labels=6, num_train=n, num_validation=8, num_test=8, min_words=8, max_words=20)
    names = ds["train"].features["labels"].feature.names
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "data.csv"), "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "labels"])
        for row in ds["train"]:
            writer.writerow([row["text"], ";".join(names[i] for i in row["labels"])])


def _workspace(tmp_path, name: str) -> str:
    folder = str(tmp_path / name)
    _write_data(folder)
    with open(os.path.join(folder, "recipe.yaml"), "w", encoding="utf-8") as fh:
        fh.write(RECIPE)
    return folder


def _files(folder: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs}


def _logged_losses(stage_folder: str) -> list[float]:
    with open(os.path.join(stage_folder, "trainer_state.json"), encoding="utf-8") as fh:
        return [h["loss"] for h in json.load(fh)["log_history"] if "loss" in h]


def _expected_run_files(features: int = 2) -> set[str]:
    files = {"data.csv", "recipe.yaml", "out/results.json"}
    files |= {f"out/encoder/{f}" for f in STAGE_FILES} | {f"out/classifier/{f}" for f in STAGE_FILES | {"thresholds.json"}}
    files |= {f"out/encoder/checkpoint-{s}/{f}" for s in (1, 2) for f in CHECKPOINT_FILES}
    return files | {f"features/{i}" for i in range(features)}  # feature files are named by their key


def _with_feature_names(expected: set[str], found: set[str]) -> set[str]:
    """``expected`` with its placeholder feature names replaced by the feature files found (keys)."""
    keys = sorted(f for f in found if f.startswith("features/") and f.endswith(".safetensors"))
    placeholders = sorted(f for f in expected if f.startswith("features/"))
    return (expected - set(placeholders)) | set(keys if len(keys) == len(placeholders) else placeholders)


@pytest.mark.timeout(600)
def test_two_nodes_write_a_shared_folder_once_and_match_one_process(tmp_path):
    shared = _workspace(tmp_path, "shared")
    try:
        watch = WriteWatch(shared)
    except OSError as err:  # not Linux
        pytest.skip(f"inotify is not available here: {err}")
    nodes = launch_two_nodes(["run", "recipe.yaml", "--output_dir", "out", *COMMON], (shared, shared),
                             NODE_TIMEOUT, str(tmp_path / "logs"))  # fmt: skip
    writes = watch.stop()
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    assert not watch.overflow
    # the main node prints the results once; node 1 prints nothing of its own
    assert nodes[0].stdout.count("| out |") == 1 and "| out |" not in nodes[1].stdout, nodes[0].stdout[-2000:]
    found = {os.path.relpath(p, shared) for p in writes}
    assert found == _with_feature_names(_expected_run_files(), found)
    written = {os.path.relpath(p, shared): n for p, n in writes.items() if not p.endswith(("data.csv", "recipe.yaml"))}
    assert {f: n for f, n in written.items() if n != 1} == {}, "written more than once (or never)"
    # every file but rank 1's own RNG state comes from node 0 (node 1's umask would leave it group-writable)
    node1_mode = 0o666 & ~NODE_UMASKS[1]
    by_node1 = sorted(f for f in written if os.stat(os.path.join(shared, f)).st_mode & 0o777 == node1_mode)
    assert by_node1 == [f"out/encoder/checkpoint-{s}/rng_state_1.pth" for s in (1, 2)]
    for step in (1, 2):
        folder = os.path.join(shared, "out", "encoder", f"checkpoint-{step}")
        assert is_complete_checkpoint(folder) and not os.path.exists(os.path.join(folder, SAVING_MARKER))
        with open(os.path.join(folder, "trainer_state.json"), encoding="utf-8") as fh:
            state = json.load(fh)
        assert state["global_step"] == step and state["train_batch_size"] == 8
    # one process on the same global batch (2 nodes x 8 rows): the same logged stage-1 losses
    from hf_mlcl.cli import main

    one = str(tmp_path / "one")
    assert main(["train", os.path.join(shared, "recipe.yaml"), "--dataset", os.path.join(shared, "data.csv"),
                 "--output_dir", one, "--per_device_train_batch_size", "16", "--save_strategy", "no",
                 *COMMON[:-1]]) == 0  # fmt: skip
    two_losses = _logged_losses(os.path.join(shared, "out", "encoder"))
    assert len(two_losses) == 2
    assert two_losses == pytest.approx(_logged_losses(one), rel=1e-5)
