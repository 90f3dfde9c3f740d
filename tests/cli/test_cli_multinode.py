"""`hf-mlcl run` launched as two nodes of one process each on 127.0.0.1 (two `accelerate launch` commands,
--num_machines 2, --machine_rank 0 / 1, gloo), see _two_nodes.py.

* A shared output folder: every file is written once (an inotify count of the completed writes), by the
  global main process (node 1's files would carry its umask), except each process's own RNG state; the
  checkpoints are complete; the stage-1 losses equal one process on the same global batch.
* (slow) One node fails (its data file is missing): both nodes end, and the main node names the cause.
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
from _launches import run_launch
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
projection_dim: 16
max_length: 32
contrastive:
  loss: similarity_dissimilarity
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
# keep_checkpoints: these tests look into stage 1's checkpoints (who wrote them, complete on which node) after
# the run, which drops them once a stage has finished unless asked to keep them
COMMON = [
    "--use_cpu",
    "true",
    "--disable_tqdm",
    "true",
    "--report_to",
    "none",
    "--keep_checkpoints",
    "true",
    "--no_plots",
]
MODEL_FILES = {
    "config.json",
    "configuration_mlcl.py",
    "modeling_mlcl.py",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "training_args.bin",
}
STAGE_FILES = MODEL_FILES | {
    "README.md",
    "card_data.json",
    "metrics.json",
    "trainer_state.json",
    "run_settings.json",
}
# stage 1's encoder, a sentence-transformers folder (hf_mlcl.modeling.native)
ENCODER_FILES = (STAGE_FILES - {"configuration_mlcl.py", "modeling_mlcl.py", "training_args.bin"}) | {
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "mlcl_config.json",
    "1_Pooling/config.json",
    "2_Dense/config.json",
    "2_Dense/model.safetensors",
    "3_Dense/config.json",
    "3_Dense/model.safetensors",
}
# the classifier, a linear head on pooled states: a sentence-transformers folder whose Dense module is the head
CLASSIFIER_FILES = (ENCODER_FILES - {"3_Dense/config.json", "3_Dense/model.safetensors"}) | {
    "thresholds.json"
}
CHECKPOINT_FILES = MODEL_FILES | {
    "trainer_state.json",
    "optimizer.pt",
    "scheduler.pt",
    "mlcl_trainer_state.safetensors",
    "rng_state_0.pth",
    "rng_state_1.pth",
    "checksums.json",
    "run_settings.json",
}
NODE_TIMEOUT = 240  # seconds for both nodes of one launch; a run takes about 40 s on two busy cores


def _write_data(folder: str, n: int = 80) -> None:
    """A CSV of ``n`` rows (text, labels joined by ';') with no validation file: the run carves one."""
    from hf_mlcl.data import make_synthetic_corpus

    ds = make_synthetic_corpus(
        num_labels=6, num_train=n, num_validation=8, num_test=8, min_words=8, max_words=20
    )
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
    files |= {f"out/encoder/{f}" for f in ENCODER_FILES} | {f"out/classifier/{f}" for f in CLASSIFIER_FILES}
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
    nodes = launch_two_nodes(
        ["run", "recipe.yaml", "--output_dir", "out", *COMMON],
        (shared, shared),
        NODE_TIMEOUT,
        str(tmp_path / "logs"),
    )
    writes = watch.stop()
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    assert not watch.overflow
    # the main node prints the results once; node 1 prints nothing of its own
    assert nodes[0].stdout.count("| out |") == 1 and "| out |" not in nodes[1].stdout, nodes[0].stdout[-2000:]
    found = {os.path.relpath(p, shared) for p in writes}
    assert found == _with_feature_names(_expected_run_files(), found)
    written = {
        os.path.relpath(p, shared): n
        for p, n in writes.items()
        if not p.endswith(("data.csv", "recipe.yaml"))
    }
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
    assert (
        main(
            [
                "train",
                os.path.join(shared, "recipe.yaml"),
                "--dataset",
                os.path.join(shared, "data.csv"),
                "--output_dir",
                one,
                "--per_device_train_batch_size",
                "16",
                "--save_strategy",
                "no",
                *COMMON[:-1],
            ]
        )
        == 0
    )
    two_losses = _logged_losses(os.path.join(shared, "out", "encoder"))
    assert len(two_losses) == 2
    assert two_losses == pytest.approx(_logged_losses(one), rel=1e-5)


def _assert_both_stop_naming(nodes, cause: str) -> None:
    """Both nodes ended (none killed at the deadline) with an error status; node 1 printed ``cause`` and the
    main node printed it too, naming the process that failed."""
    assert all(n.returncode not in (None, 0) for n in nodes), describe(nodes)
    assert f"hf-mlcl run: error: {cause}" in nodes[1].stderr, describe(nodes)
    assert f"hf-mlcl run: error: process 1 (machine_rank 1) failed: {cause}" in nodes[0].stderr, describe(
        nodes
    )


@pytest.mark.slow  # the fast version: tests/training/test_training_launch_failures.py
@pytest.mark.timeout(600)
def test_a_data_file_missing_on_one_node_stops_both_naming_it(tmp_path):
    main_node = _workspace(tmp_path, "node0")
    other = str(tmp_path / "node1")
    os.makedirs(other)
    with open(os.path.join(other, "recipe.yaml"), "w", encoding="utf-8") as fh:
        fh.write(RECIPE)  # the same recipe, but this node has no data.csv
    nodes = launch_two_nodes(
        ["run", "recipe.yaml", "--output_dir", "out", *COMMON],
        (main_node, other),
        NODE_TIMEOUT,
        str(tmp_path / "logs"),
    )
    _assert_both_stop_naming(nodes, "data file 'data.csv' does not exist")
    assert abs(nodes[0].seconds - nodes[1].seconds) < 30, describe(nodes)  # the main node did not wait it out
    assert not os.path.exists(os.path.join(main_node, "out", "encoder", "model.safetensors"))


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_recipe_missing_on_one_node_stops_both_before_the_process_group_forms(tmp_path):
    """Node 1 fails before it joins the process group: without the launch's failure key the main node
    would wait in init_process_group for its 30-minute timeout."""
    main_node = _workspace(tmp_path, "node0")
    other = str(tmp_path / "node1")
    _write_data(other)  # the data, but no recipe
    nodes = launch_two_nodes(
        ["run", "recipe.yaml", "--output_dir", "out", *COMMON],
        (main_node, other),
        NODE_TIMEOUT,
        str(tmp_path / "logs"),
    )
    _assert_both_stop_naming(nodes, f"recipe file not found: {os.path.join(other, 'recipe.yaml')}")
    assert abs(nodes[0].seconds - nodes[1].seconds) < 30, describe(nodes)


def _interrupt_stage_1(out: str, incomplete_step: int | None) -> None:
    """Leave ``out`` as a run killed in stage 1 leaves it: stage 1's checkpoints but not its final files, no
    stage 2; with ``incomplete_step`` that checkpoint's save was cut short (its ``.saving`` marker)."""
    import shutil

    encoder = os.path.join(out, "encoder")
    for name in os.listdir(encoder):  # the encoder's files and its sentence-transformers module folders
        path = os.path.join(encoder, name)
        if not name.startswith("checkpoint-"):
            shutil.rmtree(path) if os.path.isdir(path) else os.remove(path)
    shutil.rmtree(os.path.join(out, "classifier"))
    if os.path.exists(os.path.join(out, "results.json")):
        os.remove(os.path.join(out, "results.json"))
    if incomplete_step is not None:
        with open(os.path.join(encoder, f"checkpoint-{incomplete_step}", SAVING_MARKER), "w") as fh:
            fh.write("interrupted\n")


def _same_tensors(a: str, b: str) -> bool:
    """Two safetensors files hold the same tensors (their headers may list them in another order)."""
    import torch
    from safetensors.torch import load_file

    ta, tb = load_file(a), load_file(b)
    return ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_with_node_local_folders_each_hold_the_run_and_resume_together(tmp_path):
    """save_on_each_node: each node's main process writes its own folder (the same relative path on both
    nodes); each holds the whole run, with the same weights and the same frozen-feature files (keyed by the
    encoder's weights, the token ids and labels: the same tokenizer trained on the fly and the same carved
    validation split on both nodes). Resume: node 1's newest checkpoint is half-written, so both nodes
    resume from the newest checkpoint complete on both and end with the uninterrupted run's losses."""
    folders = (_workspace(tmp_path, "node0"), _workspace(tmp_path, "node1"))
    watches = [WriteWatch(f) for f in folders]
    args = ["run", "recipe.yaml", "--output_dir", "out", "--save_on_each_node", "true", *COMMON]
    nodes = launch_two_nodes(args, folders, NODE_TIMEOUT, str(tmp_path / "logs"))
    writes = [w.stop() for w in watches]
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    found = [{os.path.relpath(p, f) for p in w} for f, w in zip(folders, writes)]
    expected = _with_feature_names(_expected_run_files(), found[0])
    rng = {f"out/encoder/checkpoint-{s}/rng_state_{r}.pth" for s in (1, 2) for r in (0, 1)}
    assert found[0] == expected - {f for f in rng if f.endswith("_1.pth")}
    # the run's results table is the main node's: node 1 holds what it needs to resume, not results.json
    assert found[1] == expected - {f for f in rng if f.endswith("_0.pth")} - {"out/results.json"}
    for folder, counts in zip(folders, writes):
        again = {
            os.path.relpath(p, folder): n
            for p, n in counts.items()
            if n != 1 and not p.endswith((".csv", ".yaml"))
        }
        assert again == {}, f"written more than once (or never) in {folder}"
    for name in sorted(found[1]):  # the same weights and frozen features on both nodes
        if name.endswith(".safetensors"):
            assert _same_tensors(os.path.join(folders[0], name), os.path.join(folders[1], name)), name
    losses = _logged_losses(os.path.join(folders[0], "out", "encoder"))
    assert len(losses) == 2 and _logged_losses(os.path.join(folders[1], "out", "encoder")) == losses

    # both nodes killed in stage 1, node 1 in the middle of saving checkpoint-2
    _interrupt_stage_1(os.path.join(folders[0], "out"), None)
    _interrupt_stage_1(os.path.join(folders[1], "out"), 2)
    nodes = launch_two_nodes(
        [*args, "--resume_from_checkpoint", "true"], folders, NODE_TIMEOUT, str(tmp_path / "logs2")
    )
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    for folder in folders:
        encoder = os.path.join(folder, "out", "encoder")
        assert is_complete_checkpoint(os.path.join(encoder, "checkpoint-2"))
        # resumed at step 1 on both nodes: step 2 trained again, the same losses as the uninterrupted run
        assert _logged_losses(encoder) == pytest.approx(losses, rel=1e-5)
        assert os.path.isfile(os.path.join(folder, "out", "classifier", "2_Dense", "model.safetensors"))
    assert "newest complete on every node" in nodes[0].stderr + nodes[0].stdout, describe(nodes)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_nodes_resume_in_a_shared_folder_and_match_one_node_of_two_processes(tmp_path):
    """A shared folder: a run killed in the save of checkpoint-2 resumes from checkpoint-1 on both nodes and
    ends with the uninterrupted losses, which equal one node of two processes on the same global batch."""
    from _two_nodes import ACCELERATE, CPU_CONFIG, free_port

    shared = _workspace(tmp_path, "shared")
    args = ["run", "recipe.yaml", "--output_dir", "out", *COMMON]
    nodes = launch_two_nodes(args, (shared, shared), NODE_TIMEOUT, str(tmp_path / "logs"))
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    encoder = os.path.join(shared, "out", "encoder")
    losses = _logged_losses(encoder)
    _interrupt_stage_1(os.path.join(shared, "out"), 2)
    nodes = launch_two_nodes(
        [*args, "--resume_from_checkpoint", "true"], (shared, shared), NODE_TIMEOUT, str(tmp_path / "logs2")
    )
    assert [n.returncode for n in nodes] == [0, 0], describe(nodes)
    assert is_complete_checkpoint(os.path.join(encoder, "checkpoint-2"))
    assert _logged_losses(encoder) == pytest.approx(losses, rel=1e-5)
    assert os.path.isfile(os.path.join(shared, "out", "classifier", "2_Dense", "model.safetensors"))
    # one node, two processes (the cpu.yaml launch the README shows)
    one_node = run_launch(
        [
            ACCELERATE,
            "launch",
            "--config_file",
            CPU_CONFIG,
            "--num_processes",
            "2",
            "--main_process_port",
            str(free_port()),
            "-m",
            "hf_mlcl.cli",
            "train",
            "recipe.yaml",
            "--output_dir",
            "one_node",
            "--save_strategy",
            "no",
            *COMMON[:-1],
        ],
        cwd=str(shared),
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=NODE_TIMEOUT,
    )
    assert one_node.returncode == 0, one_node.stderr[-3000:]
    assert _logged_losses(os.path.join(shared, "one_node")) == pytest.approx(losses, rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_accelerate_launch_cpu_on_two_machines_stops_instead_of_training_twice(tmp_path):
    """`accelerate launch --cpu` starts each machine's process alone (no torchrun, no process group): without
    the check both would train their own model into the shared folder and exit 0."""
    shared = _workspace(tmp_path, "shared")
    nodes = launch_two_nodes(
        ["run", "recipe.yaml", "--output_dir", "out", *COMMON],
        (shared, shared),
        NODE_TIMEOUT,
        str(tmp_path / "logs"),
        launch_flags=("--cpu",),
    )
    assert all(n.returncode not in (None, 0) for n in nodes), describe(nodes)
    for node in nodes:
        assert "accelerate launch started this process on its own" in node.stderr, describe(nodes)
    assert not os.path.exists(os.path.join(shared, "out"))
