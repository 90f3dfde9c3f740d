"""DeepSpeed ZeRO-3 on CPU (DeepSpeed's CPU accelerator, gloo), launched as documented: `accelerate launch
--config_file recipes/accelerate/deepspeed_zero3.yaml` (no use_cpu: accelerate drops DeepSpeed with it).

msc on a tiny Llama + LoRA, with everything that sits outside a plain model: learnable label prototypes (trained
by their own optimizer beside the engine's), the momentum encoder (a second LoRA adapter of the sharded model)
and the queue. With one process and with two, the logged losses, prototypes, momentum state, queue and trained
embeddings equal a plain one-process run on the same global batches; the adapter that save_lora_model writes
from the partitioned parameters reloads to the embeddings the trained model gave before the save."""

from __future__ import annotations

import os
import socket
import sys

import pytest
import torch
from _launches import run_launch
from _training_helpers import save_tiny_llama_with_heads
from _zero3_worker import embed, outputs, run, run_bce
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from hf_mlcl.modeling import MLCLEncoder

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "_zero3_worker.py")
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny Llama base (the adapter's base model), its tokenizer and a projection head, saved once; and the
    plain one-process reference run (8-row batches) of the worker."""
    root = tmp_path_factory.mktemp("zero3")
    save_tiny_llama_with_heads(root)
    return root, run(str(root), "plain", per_device=8)


def _launch(root, processes: int, mode: str = "msc") -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, ROOT])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        ACCELERATE,
        "launch",
        "--config_file",
        os.path.join(ROOT, "recipes", "accelerate", "deepspeed_zero3.yaml"),
        "--num_processes",
        str(processes),
        "--mixed_precision",
        "no",
        "--main_process_port",
        str(_port()),
        WORKER,
        str(root),
        mode,
        f"zero3-{processes}",
        str(8 // processes),
    ]
    proc = run_launch(cmd, env=env, timeout=200, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "terminate called" not in proc.stderr
    return torch.load(root / f"zero3-{processes}.pt", weights_only=False)  # written by the main process


@pytest.mark.timeout(240)
# one process: the GPU suite's tiny ZeRO-3 cells (tests/test_gpu_suite.py) launch it in the default suite too
@pytest.mark.parametrize("processes", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_msc_under_zero3_matches_the_plain_run_and_its_adapter_reloads(setup, processes):
    root, plain = setup
    got = _launch(root, processes)
    assert got["world"] == processes and got["engine"] == "DeepSpeedEngine"
    assert len(got["losses"]) == len(plain["losses"]) == 3
    assert got["losses"] == pytest.approx(plain["losses"], rel=1e-6)
    # the prototypes train outside the engine: same AdamW update with the engine's learning rate schedule
    assert not torch.allclose(plain["prototypes"], plain["initial_prototypes"], atol=1e-3)
    torch.testing.assert_close(got["prototypes"], plain["prototypes"], rtol=1e-5, atol=1e-6)
    assert got["momentum"].keys() == plain["momentum"].keys()
    for name, value in plain["momentum"].items():
        torch.testing.assert_close(got["momentum"][name], value, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["queue"], plain["queue"], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got["embeddings"], plain["embeddings"], rtol=1e-4, atol=1e-5)

    tok = AutoTokenizer.from_pretrained(root / "base")
    folder = root / f"adapter-zero3-{processes}"
    assert {"adapter_config.json", "adapter_model.safetensors", "model.safetensors"} <= set(
        os.listdir(folder)
    )
    adapter = load_file(folder / "adapter_model.safetensors")
    plain_adapter = load_file(root / "adapter-plain" / "adapter_model.safetensors")
    assert adapter.keys() == plain_adapter.keys() and adapter  # full tensors gathered, not empty partitions
    for key, value in plain_adapter.items():
        torch.testing.assert_close(adapter[key], value, rtol=1e-3, atol=1e-4)  # Adam magnifies round-off
    for loaded in (
        MLCLEncoder.from_pretrained(folder),
        AutoModel.from_pretrained(folder, trust_remote_code=True),
    ):
        torch.testing.assert_close(embed(loaded, tok), got["embeddings"], rtol=1e-5, atol=1e-5)
    untrained = MLCLEncoder.from_backbone(str(root / "base"), pooling="last_token", projection_dim=8)
    untrained.projection_head.load_state_dict(load_file(root / "head.safetensors"))
    assert not torch.allclose(
        embed(untrained, tok), got["embeddings"], atol=1e-3
    )  # training changed the model


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_lora_bce_finetune_under_zero3_matches_the_plain_run_and_its_adapter_reloads(setup):
    """The Llama bce.yaml recipe's stage: a classifier with LoRA adapters + its head, fine-tuned with BCE on two
    ZeRO-3 processes, trains what one plain process trains, and its adapter folder reloads to the same logits."""
    from transformers import AutoModelForSequenceClassification

    from hf_mlcl.modeling import MLCLForMultiLabelClassification

    root, _ = setup
    plain = run_bce(str(root), "plain", per_device=8)
    got = _launch(root, 2, mode="bce")
    assert got["world"] == 2 and got["engine"] == "DeepSpeedEngine"
    assert got["trainable"] == plain["trainable"]
    assert all("lora_" in n or ".classifier.modules_to_save." in n for n in got["trainable"])
    assert got["losses"] == pytest.approx(plain["losses"], rel=1e-5)
    torch.testing.assert_close(got["logits"], plain["logits"], rtol=1e-4, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(root / "base")
    folder = root / "bce-adapter-zero3-2"
    assert sorted(load_file(folder / "model.safetensors")) == ["classifier.bias", "classifier.weight"]
    adapter = load_file(folder / "adapter_model.safetensors")
    assert any(
        t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k
    )  # the adapters trained (B starts at 0)
    for loaded in (
        MLCLForMultiLabelClassification.from_pretrained(folder),
        AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True),
    ):
        torch.testing.assert_close(outputs(loaded, tok, "logits"), got["logits"], rtol=1e-5, atol=1e-5)


# make test-slow: ZeRO-3 training, saving and reloading stay in the default suite above
@pytest.mark.slow
@pytest.mark.timeout(240)
def test_zero3_resume_restores_prototypes_momentum_and_queue(setup):
    """A two-process ZeRO-3 run resumed from its step-2 checkpoint (the engine's checkpoint plus
    mlcl_trainer_state: prototypes and their optimizer, momentum masters, queue) ends where the uninterrupted
    run ends."""
    root, _ = setup
    got = _launch(root, 2, mode="resume")
    full, resumed = got["full"], got["resumed"]
    assert full["world"] == 2 and len(full["losses"]) == len(resumed["losses"]) == 3
    assert resumed["losses"][-1] == pytest.approx(full["losses"][-1], rel=1e-6)
    for key in ("prototypes", "queue", "embeddings"):
        torch.testing.assert_close(resumed[key], full[key], rtol=1e-6, atol=1e-7)
    for name, value in full["momentum"].items():
        torch.testing.assert_close(resumed["momentum"][name], value, rtol=1e-6, atol=1e-7)
