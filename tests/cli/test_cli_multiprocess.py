"""`hf-mlcl run` under `accelerate launch --num_processes 2` (gloo on CPU) with the repo's cpu.yaml: both
stages in two real processes, one set of weights that loads, and the logged stage-1 losses equal to a
one-process run on the same global batch; the multi-GPU config on a CPU machine names the missing flag."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from _launches import run_launch

from hf_mlcl.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
TINY_DATA = json.dumps(
    {"num_labels": 6, "num_train": 64, "num_validation": 32, "num_test": 32, "min_words": 8, "max_words": 20}
)
# the tiny recipe's BERT without dropout: 1 and 2 processes draw different dropout masks
BACKBONE = json.dumps(
    {
        "model_type": "bert",
        "vocab_size": 500,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 64,
        "hidden_dropout_prob": 0.0,
        "attention_probs_dropout_prob": 0.0,
    }
)
COMMON = [
    "--dataset_options",
    TINY_DATA,
    "--backbone_config",
    BACKBONE,
    "--max_steps",
    "2",
    "--logging_steps",
    "1",
    "--train_sampling_strategy",
    "sequential",
    "--disable_tqdm",
    "true",
    "--use_cpu",
    "true",
    "--no-plots",
]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(config: str, args: list[str], timeout: int = 400) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        ACCELERATE,
        "launch",
        "--config_file",
        os.path.join(ROOT, "recipes", "accelerate", config),
        "--num_processes",
        "2",
        "--main_process_port",
        str(_port()),
        "-m",
        "hf_mlcl.cli",
        *args,
    ]
    return run_launch(cmd, env=env, timeout=timeout, cwd=ROOT)


def _logged_losses(folder: str) -> list[float]:
    state = json.load(open(os.path.join(folder, "trainer_state.json")))
    return [h["loss"] for h in state["log_history"] if "loss" in h]


@pytest.mark.slow  # keeps the default suite within its 10 minutes (make test-slow)
@pytest.mark.timeout(600)
def test_two_process_run_saves_once_and_matches_one_process(tmp_path):
    two, one = str(tmp_path / "two"), str(tmp_path / "one")
    proc = _launch(
        "cpu.yaml",
        [
            "run",
            RECIPE,
            "--output_dir",
            two,
            "--contrastive.per_device_train_batch_size",
            "16",
            "--probe.per_device_train_batch_size",
            "16",
            *COMMON,
        ],
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr
    # quiet by default: none of the notices the library used to cause, on either process
    for noise in ("find_unused_parameters", "FutureWarning", "PAD/BOS/EOS", "pin_memory", "mtime may not"):
        assert noise not in proc.stderr, (noise, proc.stderr[-3000:])
    # only the main process prints the results table
    assert proc.stdout.count("| two |") == 1, proc.stdout[-2000:]
    enc, clf = os.path.join(two, "encoder"), os.path.join(two, "classifier")
    state = json.load(open(os.path.join(enc, "trainer_state.json")))
    assert state["train_batch_size"] == 16 and state["global_step"] == 2
    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification

    MLCLEncoder.from_pretrained(enc)
    MLCLForMultiLabelClassification.from_pretrained(clf)
    for folder in (enc, clf):
        assert sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")) == ["model.safetensors"]
        assert not [f for f in os.listdir(folder) if f.startswith(".tmp-")]
    # the same global batch (2 x 16 = 32 rows) in one process: the same logged stage-1 losses
    assert main(["run", RECIPE, "--output_dir", one, "--per_device_train_batch_size", "32", *COMMON]) == 0
    two_losses, one_losses = _logged_losses(enc), _logged_losses(os.path.join(one, "encoder"))
    assert len(two_losses) == 2
    assert two_losses == pytest.approx(one_losses, rel=1e-5)


@pytest.mark.slow  # keeps the default suite within its 10 minutes (make test-slow)
@pytest.mark.timeout(300)
def test_multi_gpu_config_on_a_cpu_machine_names_the_missing_flag(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the multi-GPU config is valid here")
    args = [
        "train",
        RECIPE,
        "--output_dir",
        str(tmp_path / "out"),
        "--dataset_options",
        TINY_DATA,
        "--max_steps",
        "1",
    ]
    proc = _launch("multi_gpu.yaml", args, timeout=280)
    assert proc.returncode != 0
    assert "--use_cpu true" in proc.stderr and "without a GPU" in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.count("hf-mlcl train: error:") == 1, proc.stderr[
        -3000:
    ]  # said once, by the main process
    assert not os.path.exists(tmp_path / "out" / "model.safetensors")
