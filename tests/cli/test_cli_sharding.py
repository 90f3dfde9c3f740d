"""`hf-mlcl` under the sharding launch configs on a CPU machine, as the recipes document them.

* recipes/accelerate/deepspeed_zero3.yaml with the Llama + LoRA msc recipe (tiny base and data): both stages run
  in two ZeRO-3 processes over gloo; the encoder and the classifier are adapter folders, and the classifier
  reloaded from disk scores the test split exactly as the trained one did.
* the same launch of the unchanged recipe stops at once, before loading the 8B model, naming the GradCache fix;
* recipes/accelerate/fsdp_llama_lora.yaml stops at once (accelerate would train plain DDP on CPU instead)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import torch
from _launches import run_launch
from _tiny_llama import save_tiny_llama
from safetensors.torch import load_file

from hf_mlcl.modeling import MLCLEncoder

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "aapd", "llama-3.1-8b-lora", "msc.yaml")
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
TINY_DATA = json.dumps(
    {"num_labels": 6, "num_train": 64, "num_validation": 32, "num_test": 32, "min_words": 8, "max_words": 20}
)
CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: FSDP applies here")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    config: str, processes: int, args: list[str], accelerate_args: tuple[str, ...] = (), timeout: int = 200
):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        ACCELERATE,
        "launch",
        "--config_file",
        os.path.join(ROOT, "recipes", "accelerate", config),
        "--num_processes",
        str(processes),
        "--main_process_port",
        str(_port()),
        *accelerate_args,
        "-m",
        "hf_mlcl.cli",
        *args,
    ]
    return run_launch(cmd, env=env, timeout=timeout, cwd=ROOT)


def _error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if ": error: " in line]
    assert lines, proc.stderr[-3000:]
    return lines[0]


# make test-slow: ZeRO-3 + LoRA training and reloading stay in the default suite (tests/training)
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_llama_lora_msc_recipe_runs_both_stages_under_zero3(tmp_path, llama_tokenizer):
    base = tmp_path / "base"
    save_tiny_llama(base, llama_tokenizer)
    out = tmp_path / "run"
    args = [
        "run",
        RECIPE,
        "--output_dir",
        str(out),
        "--model_name_or_path",
        str(base),
        "--dataset",
        "synthetic",
        "--dataset_options",
        TINY_DATA,
        "--max_length",
        "16",
        "--lora_r",
        "4",
        "--lora_alpha",
        "8",
        "--bf16",
        "false",
        "--ddp_backend",
        "gloo",
        "--max_steps",
        "2",
        "--logging_steps",
        "1",
        "--save_strategy",
        "no",
        "--disable_tqdm",
        "true",
        "--contrastive.gradcache_chunk_size",
        "0",
        "--contrastive.activation_checkpointing",
        "false",
        "--contrastive.queue_size",
        "16",
        "--contrastive.per_device_train_batch_size",
        "8",
        "--projection_dim",
        "8",
        "--probe.per_device_train_batch_size",
        "8",
        "--probe.eval_strategy",
        "no",
        "--probe.load_best_model_at_end",
        "false",
    ]
    proc = _launch("deepspeed_zero3.yaml", 2, args, ("--mixed_precision", "no"))
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr
    encoder, classifier = out / "encoder", out / "classifier"
    for folder, weights in (
        (encoder, "3_Dense/model.safetensors"),
        (classifier, "2_Dense/model.safetensors"),
    ):
        files = set(os.listdir(folder))
        assert {
            "adapter_config.json",
            "adapter_model.safetensors",
            weights.split("/")[0],
            "metrics.json",
        } <= files
        assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
            base
        )
    state = json.loads((encoder / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and state["train_batch_size"] == 8
    assert "modules.json" in os.listdir(encoder) and "model.safetensors" not in os.listdir(encoder)
    assert MLCLEncoder.from_pretrained(encoder).config.projection_dim == 8
    heads = load_file(
        classifier / "2_Dense" / "model.safetensors"
    )  # the head as a sentence-transformers Dense
    assert sorted(heads) == ["linear.bias", "linear.weight"] and heads["linear.weight"].shape == (6, 64)
    assert "model.safetensors" not in os.listdir(classifier)
    # the trained (sharded) classifier's test metrics and those of the folder reloaded on one process
    live = json.loads((classifier / "metrics.json").read_text())
    reloaded = json.loads((classifier / "eval_test.json").read_text())
    for key in ("test_micro_auc", "test_map_example", "test_micro_f1"):
        assert reloaded[key] == pytest.approx(live[key], abs=1e-6), key


@pytest.mark.slow  # keeps the default suite within its 10 minutes (make test-slow)
@pytest.mark.timeout(120)
def test_zero3_launch_of_the_llama_recipe_names_the_gradcache_fix(tmp_path):
    """The unchanged recipe (gradcache_chunk_size 8, meta-llama/Llama-3.1-8B): one line naming the fix, before any
    model is loaded (the Hub is offline here, so a load would fail otherwise)."""
    out = tmp_path / "out"
    proc = _launch(
        "deepspeed_zero3.yaml",
        1,
        ["train", RECIPE, "--output_dir", str(out), "--bf16", "false"],
        ("--mixed_precision", "no"),
    )
    assert proc.returncode != 0
    line = _error_line(proc)
    assert "DeepSpeed" in line and "--contrastive.gradcache_chunk_size 0" in line, line
    assert not out.exists()


@CPU_ONLY
@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "extra",
    [
        pytest.param(["--bf16", "false"], marks=pytest.mark.slow),
        pytest.param(["--use_cpu", "true"], marks=pytest.mark.slow),
    ],
    ids=["no-gpu", "use_cpu"],
)  # both in make test-slow, which keeps the default suite within its 10 minutes
def test_fsdp_launch_on_a_cpu_machine_stops_instead_of_training_ddp(tmp_path, extra):
    out = tmp_path / "out"
    proc = _launch("fsdp_llama_lora.yaml", 1, ["train", RECIPE, "--output_dir", str(out), *extra])
    assert proc.returncode != 0
    line = _error_line(proc)
    assert "asks for FSDP (ACCELERATE_USE_FSDP=true)" in line and "plain DDP" in line, line
    assert ("use_cpu=True" in line) == ("--use_cpu" in extra)
    assert not out.exists()
