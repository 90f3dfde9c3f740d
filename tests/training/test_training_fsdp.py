"""FSDP with recipes/accelerate/fsdp_llama_lora.yaml's settings, on CPU: 2 gloo processes from `accelerate launch`.

accelerate applies FSDP to GPU processes only, so the worker (``_fsdp_worker.py``, launched with
recipes/accelerate/cpu.yaml) turns the processes' accelerator state into FSDP through a test-only Trainer
subclass, with the FSDP plugin that `accelerate launch --config_file recipes/accelerate/fsdp_llama_lora.yaml` gives
its processes; the wrapping, training steps, momentum adapter and saves are the library's and accelerate's code.
On a tiny Llama + LoRA (adapters and heads fp32): stage 1 sd with the recipe's GradCache and activation
checkpointing, msc with prototypes, momentum adapter and queue, sd on a bf16-stored backbone (what FSDP1 could not
wrap on the GPU: "Must flatten tensors with uniform dtype"), the same under bf16 mixed precision, and the LoRA BCE
fine-tune on the bf16 backbone. Each run's logged losses, gradient norms and outputs equal a plain one-process
run on the same global batches; the adapter folder written by ``save_lora_model`` from the sharded model holds
the plain run's adapter and reloads with ``from_pretrained`` onto the base saved on disk to its outputs; the
frozen backbone keeps its bf16 storage. Not covered here (GPU only): NCCL, GPU kernels and device placement,
memory and speed at the 8B scale, and transformers' FSDP-aware loading (it reads ``ACCELERATE_USE_FSDP``, which a
launch with cpu.yaml does not set; accelerate's ``cpu_ram_efficient_loading`` itself runs: the model is sharded on
the meta device and rank 0's weights are broadcast).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _fsdp_worker import CASES, outputs, run
from _launches import run_launch
from _training_helpers import save_tiny_llama_with_heads
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "_fsdp_worker.py")
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
LAUNCH_TIMEOUT = 180


def _launch(root, cases) -> subprocess.CompletedProcess:
    """`accelerate launch --config_file recipes/accelerate/cpu.yaml --num_processes 2 _fsdp_worker.py ROOT CASES`."""
    # PET_STANDALONE: torchrun binds its rendezvous store to a free port of the kernel's choosing (cpu.yaml's fixed
    # default port would race with a concurrent launch)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "PET_STANDALONE": "1",
        "PYTHONPATH": os.pathsep.join([HERE, ROOT]),
    }
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [
        ACCELERATE,
        "launch",
        "--config_file",
        os.path.join(ROOT, "recipes", "accelerate", "cpu.yaml"),
        "--num_processes",
        "2",
        WORKER,
        str(root),
        *cases,
    ]
    try:
        return run_launch(cmd, env=env, cwd=ROOT, timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the FSDP launch ran past {LAUNCH_TIMEOUT} s")


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """A tiny Llama base, its tokenizer, a projection head and a classifier head saved once; every case trained
    under FSDP in one launch."""
    root = tmp_path_factory.mktemp("fsdp")
    save_tiny_llama_with_heads(root)
    proc = _launch(root, list(CASES))
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "terminate called" not in proc.stderr
    return root


# (losses / grad norms rel, outputs and adapter atol). fp32 backbones: the runs agree to fp32 round-off. A backbone
# stored in bf16 computes in bf16: two processes of 4 rows sum the fp32 gradients in another order than one
# process of 8, and a difference of one fp32 ulp flips a bf16 rounding in the next step's activations, so from the
# second optimizer step on the two runs agree to bf16 resolution (2^-8 relative), not to fp32's; which roundings
# flip depends on the CPU's kernels. The bf16 mixed-precision run also rounds differently under FSDP2's bf16
# parameter casts and bf16 gradient reduction than under the plain run's autocast.
FP32 = (1e-6, 1e-5)
BF16_STORAGE = (4e-3, 1e-2)  # half of a bf16 ulp relative; one ulp of the outputs' magnitude (|x| < 2)
BF16_AMP = (1e-2, 5e-2)
# Under bf16 mixed precision FSDP2 casts the parameters to bf16 and computes in bf16 throughout, where the plain
# run's autocast keeps fp32 weights and fp32 norms / softmax, so the outputs of the two trained models differ by a
# few bf16 ulps per element: measured 1.3-2.3 % of each output row's norm on an AVX-512 CPU (autocast itself moves
# the plain run's outputs by 0.7-0.9 %); element-wise tolerances fit to one CPU's roundings fail on another.
BF16_AMP_ROWS = 5e-2


def tolerance(case: str) -> tuple[float, float]:
    """(rel, atol) of the comparison with the plain run, by the case's precision."""
    kw = CASES[case]
    return BF16_AMP if kw.get("bf16") else BF16_STORAGE if kw.get("bf16_backbone") else FP32


@pytest.mark.timeout(LAUNCH_TIMEOUT + 120)
@pytest.mark.parametrize("case", list(CASES))
def test_fsdp_run_matches_one_process_and_its_adapter_reloads(fsdp_runs, case):
    root = fsdp_runs
    got = torch.load(root / f"fsdp-{case}.pt", weights_only=False)
    plain = run(str(root), case, per_device=8, fsdp=False)
    assert got["world"] == 2 and plain["world"] == 1
    assert (
        got["wrapper"] == "FSDPPeftModel" and plain["wrapper"] == "PeftModel"
    )  # fully_shard on the PeftModel
    bf16_amp = CASES[case].get("bf16", False)
    assert got["mixed_precision"] == plain["mixed_precision"] == ("bf16" if bf16_amp else "no")

    # what trains, and the storage dtypes the engine holds: the frozen backbone stays bf16 where it was cast
    assert got["trainable"] == plain["trainable"]
    assert got["trainable"] and all(
        "lora_" in n or ".modules_to_save.default." in n for n in got["trainable"]
    )
    assert all(got["dtypes"][n] == torch.float32 for n in got["trainable"])
    frozen_base = [
        n for n in got["dtypes"] if ".base_layer." in n or n.endswith(("embed_tokens.weight", "norm.weight"))
    ]
    assert frozen_base and {got["dtypes"][n] for n in frozen_base} == (
        {torch.bfloat16} if CASES[case].get("bf16_backbone") else {torch.float32}
    )
    # beside the plain run's parameters, msc's momentum adapter (the plain run's key encoder is a separate copy)
    assert {n: d for n, d in got["dtypes"].items() if n in plain["dtypes"]} == plain["dtypes"]
    assert all(".momentum." in n for n in set(got["dtypes"]) - set(plain["dtypes"]))
    assert (set(got["dtypes"]) != set(plain["dtypes"])) == ("queue_size" in CASES[case])

    rel, atol = tolerance(case)
    assert len(got["losses"]) == len(plain["losses"]) == 3
    assert got["losses"] == pytest.approx(plain["losses"], rel=rel)
    assert got["grad_norms"] == pytest.approx(plain["grad_norms"], rel=max(rel, 2e-6))
    if CASES[case].get("bf16"):  # row-wise relative distance: see BF16_AMP_ROWS
        distance = (got["outputs"] - plain["outputs"]).norm(dim=-1) / plain["outputs"].norm(dim=-1)
        assert distance.max() < BF16_AMP_ROWS, distance
    else:
        torch.testing.assert_close(got["outputs"], plain["outputs"], rtol=rel, atol=atol)
    if "momentum" in plain:  # msc: the momentum adapter's EMA, the queue and the prototypes
        assert got["momentum"].keys() == plain["momentum"].keys()
        for name, value in plain["momentum"].items():
            torch.testing.assert_close(got["momentum"][name], value, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["queue"], plain["queue"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got["prototypes"], plain["prototypes"], rtol=1e-6, atol=1e-7)

    # save_lora_model from the sharded model: the plain run's adapter, trained (B starts at 0), heads only beside it
    folder = root / f"adapter-fsdp-{case}"
    adapter = load_file(folder / "adapter_model.safetensors")
    plain_adapter = load_file(root / f"adapter-plain-{case}" / "adapter_model.safetensors")
    assert adapter.keys() == plain_adapter.keys() and adapter
    assert all(t.dtype == torch.float32 for t in adapter.values())
    assert any(t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k)
    for key, value in plain_adapter.items():
        torch.testing.assert_close(
            adapter[key], value, rtol=1e-3, atol=max(atol, 1e-4)
        )  # Adam magnifies round-off
    bce = CASES[case].get("bce", False)
    heads = {"classifier"} if bce else {"projection_head"}
    assert {key.split(".")[0] for key in load_file(folder / "model.safetensors")} == heads

    # reloaded onto the base (stored fp32) in the dtype it trained in: exactly the trained model's outputs, a bf16
    # backbone's too; under bf16 mixed precision FSDP2 computed in bf16 throughout, the reload autocasts nothing
    tok = AutoTokenizer.from_pretrained(root / "base")
    cls, auto, field = (
        (MLCLForMultiLabelClassification, AutoModelForSequenceClassification, "logits")
        if bce
        else (MLCLEncoder, AutoModel, "embeddings")
    )
    reloaded = outputs(cls.from_pretrained(folder), tok, field)
    torch.testing.assert_close(
        outputs(auto.from_pretrained(folder, trust_remote_code=True), tok, field), reloaded
    )
    print(
        f"{case}: reload against the trained outputs, max abs {(reloaded - got['outputs']).abs().max():.2e}"
    )
    torch.testing.assert_close(reloaded, got["outputs"], rtol=0, atol=5e-2 if CASES[case].get("bf16") else 0)
    plain_reloaded = outputs(cls.from_pretrained(root / f"adapter-plain-{case}"), tok, field)
    torch.testing.assert_close(reloaded, plain_reloaded, rtol=rel, atol=atol)

    # merge=True from the sharded model: plain weights (no LoRA or PEFT wrapper keys), merged into the base as
    # stored (fp32 keeps the whole update): the adapter's outputs on that base
    merged = root / f"merged-fsdp-{case}"
    keys = load_file(merged / "model.safetensors").keys()
    assert not [k for k in keys if "lora_" in k or "base_layer" in k or "modules_to_save" in k]
    on_stored_base = outputs(cls.from_pretrained(folder, dtype="auto"), tok, field)
    torch.testing.assert_close(
        outputs(cls.from_pretrained(merged), tok, field), on_stored_base, rtol=1e-5, atol=1e-5
    )
