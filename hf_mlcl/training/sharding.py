"""Which parameter-sharding engine a run asked for (DeepSpeed, FSDP), and checks that it got it.

accelerate can train something other than what the launch asked for, with exit status 0:

* with ``use_cpu=True`` in the TrainingArguments it applies neither DeepSpeed nor FSDP (plain DDP);
* it applies FSDP only to GPU processes (``AcceleratorState`` switches to FSDP from the GPU-type
  distributed types only), so an FSDP launch on a machine without GPU trains plain DDP.

:func:`launch_problem` names such a launch from the arguments and the environment alone (the CLI calls it
before loading anything, :func:`hf_mlcl.training.checkpoints.check_launch`); :func:`check_engine_applied`
compares the request with what the trainer's accelerator set up (both trainers call it when built), and
:class:`EngineCheckCallback` checks the prepared model when training starts. DeepSpeed runs on CPU (its
CPU accelerator over gloo): one process as is, several with ``ddp_backend: gloo`` (accelerate picks no
backend for DeepSpeed on a machine without GPU and would count one process).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

__all__ = [
    "EngineCheckCallback",
    "check_engine_applied",
    "clear_previous_deepspeed_state",
    "fsdp_dtype_problem",
    "launch_problem",
    "requested_engine",
    "shards_parameters",
]


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "false").strip().lower() in ("1", "true", "yes")


def requested_engine(args: Any) -> str | None:
    """``"deepspeed"`` or ``"fsdp"`` when the launch asks for one (``accelerate launch`` with a DeepSpeed /
    FSDP config sets ``ACCELERATE_USE_DEEPSPEED`` / ``ACCELERATE_USE_FSDP``; or ``args.deepspeed`` /
    ``args.fsdp``), else None."""
    if getattr(args, "deepspeed", None) or _env_flag("ACCELERATE_USE_DEEPSPEED"):
        return "deepspeed"
    if getattr(args, "fsdp", None) or _env_flag("ACCELERATE_USE_FSDP"):
        return "fsdp"
    return None


def _cause(engine: str, args: Any) -> str:
    source = "args.deepspeed" if engine == "deepspeed" and getattr(args, "deepspeed", None) else (
        "args.fsdp" if engine == "fsdp" and getattr(args, "fsdp", None) else
        f"ACCELERATE_USE_{engine.upper()}=true"
    )  # fmt: skip
    return f"the launch asks for {'DeepSpeed' if engine == 'deepspeed' else 'FSDP'} ({source})"


def launch_problem(args: Any, cuda_available: bool | None = None) -> str | None:
    """Why this launch would not train with the engine it asks for, as one line naming the fix; or None.

    Reads ``args`` (TrainingArguments or any object with ``use_cpu`` / ``ddp_backend`` /
    ``gradcache_chunk_size``), ``WORLD_SIZE`` and the environment flags of :func:`requested_engine`.
    """
    import torch

    engine = requested_engine(args)
    if engine is None:
        return None
    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    cause = _cause(engine, args)
    if getattr(args, "use_cpu", False):
        fix = (
            "remove --use_cpu true (DeepSpeed runs on CPU by itself; several CPU processes also need "
            "--ddp_backend gloo)" if engine == "deepspeed" else
            "on CPU launch recipes/accelerate/deepspeed_zero3.yaml, or recipes/accelerate/cpu.yaml for DDP"
        )  # fmt: skip
        return f"{cause} but use_cpu=True makes accelerate drop it and train plain DDP: {fix}"
    if engine == "fsdp" and not cuda:
        return (
            f"{cause} but this machine has no GPU and accelerate applies FSDP to GPU processes only (it would "
            "train plain DDP): on CPU launch recipes/accelerate/deepspeed_zero3.yaml (ZeRO-3 over gloo), or "
            "recipes/accelerate/cpu.yaml with --use_cpu true for DDP"
        )
    if engine == "deepspeed" and not cuda and world > 1 and getattr(args, "ddp_backend", None) != "gloo":
        return (
            f"{cause} with {world} processes on a machine without GPU: add --ddp_backend gloo (accelerate "
            "picks no backend for DeepSpeed on CPU and would count one process)"
        )
    if engine == "deepspeed" and getattr(args, "gradcache_chunk_size", 0) > 0:
        return (
            f"{cause} but gradcache_chunk_size={args.gradcache_chunk_size}: DeepSpeed reduces the gradients "
            "and steps the optimizer inside every backward, and GradCache runs one backward per chunk; pass "
            "--contrastive.gradcache_chunk_size 0 (the per-device batch is then the contrast set) or launch "
            "with recipes/accelerate/fsdp_llama_lora.yaml"
        )
    return None


def clear_previous_deepspeed_state(args: Any) -> None:
    """Let a second trainer of the same process run under DeepSpeed (stage 2 after stage 1 in ``hf-mlcl run``).

    accelerate keeps one ``AcceleratorState`` per process and refuses a second ``Accelerator`` that brings its
    own DeepSpeed plugin (every ``Trainer`` does) while the first one's state is set. The shared state is
    cleared (the process group stays), as ``TrainingArguments`` itself does when it sets up its devices; the
    finished trainer keeps its own engine.
    """
    if requested_engine(args) != "deepspeed":
        return
    from accelerate.state import AcceleratorState
    from accelerate.utils import DistributedType

    if AcceleratorState._shared_state and AcceleratorState().distributed_type == DistributedType.DEEPSPEED:
        AcceleratorState._reset_state(reset_partial_state=False)


def shards_parameters(trainer: Any) -> bool:
    """True when the trainer's accelerator set up DeepSpeed or FSDP (the engine then owns the model's
    parameters and the optimizer: our extra parameters and the momentum encoder are handled apart)."""
    return bool(getattr(trainer, "is_deepspeed_enabled", False) or getattr(trainer, "is_fsdp_enabled", False))


def fsdp_dtype_problem(trainer: Any) -> str | None:
    """Why FSDP1 cannot wrap the trainer's model, as one line naming the fix; or None.

    FSDP1 flattens the parameters of each wrapped unit into one flat parameter, which needs one dtype
    (``ValueError: Must flatten tensors with uniform dtype``, raised when training starts). A LoRA model
    whose backbone is bf16 (``apply_lora(bf16=True)``) keeps its adapters and heads in fp32: with the wrap
    policies of accelerate and PEFT (transformer layers, trainable LoRA leaves) the root unit holds the bf16
    embeddings and norm with the fp32 frozen copies of the heads (``modules_to_save``), and a second adapter's
    frozen fp32 LoRA matrices share the bf16 decoder layers' units. FSDP2 shards every parameter on its own
    and only needs the trainable ones to share a dtype. Reads the trainer's model and its accelerator's FSDP
    plugin; None when FSDP is off, is FSDP2, or the model holds one floating dtype.
    """
    if not getattr(trainer, "is_fsdp_enabled", False):
        return None
    plugin = getattr(trainer.accelerator.state, "fsdp_plugin", None)
    if getattr(plugin, "fsdp_version", 1) != 1:
        return None
    dtypes = sorted({str(p.dtype).replace("torch.", "") for p in trainer.model.parameters() if p.is_floating_point()})
    if len(dtypes) < 2:
        return None
    return (
        f"FSDP1 (fsdp_version: 1) flattens each wrapped unit's parameters into one tensor of one dtype, but the model "
        f"holds {' and '.join(dtypes)} parameters (a bf16 backbone with fp32 LoRA adapters and heads): launch with "
        "fsdp_version: 2 (recipes/accelerate/fsdp_llama_lora.yaml), which shards each parameter on its own"
    )


def check_engine_applied(trainer: Any) -> None:
    """ValueError (one line, naming the cause) when the launch asks for DeepSpeed / FSDP but the trainer's
    accelerator did not set it up, the launch cannot run as asked (:func:`launch_problem`), or FSDP1 cannot
    wrap the model (:func:`fsdp_dtype_problem`)."""
    problem = launch_problem(trainer.args) or fsdp_dtype_problem(trainer)
    if problem:
        raise ValueError(problem)
    engine = requested_engine(trainer.args)
    applied = {"deepspeed": trainer.is_deepspeed_enabled, "fsdp": trainer.is_fsdp_enabled}
    if engine is not None and not applied[engine]:
        raise ValueError(
            f"{_cause(engine, trainer.args)} but accelerate set up "
            f"{trainer.accelerator.distributed_type.value}: check the accelerate config and launch command "
            "(hf_mlcl refuses to train something other than what was asked)"
        )


def _prepared_engine(model: Any) -> str | None:
    from torch.distributed.fsdp import FullyShardedDataParallel

    if type(model).__name__ == "DeepSpeedEngine":
        return "deepspeed"
    if isinstance(model, FullyShardedDataParallel):
        return "fsdp"
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return None
    modules = model.modules() if hasattr(model, "modules") else ()
    return "fsdp" if any(isinstance(m, FSDPModule) for m in modules) else None


class EngineCheckCallback(TrainerCallback):
    """At the start of training: the prepared model is wrapped by the engine the launch asked for."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        engine = requested_engine(args)
        got = _prepared_engine(self.trainer.model_wrapped)
        if engine is not None and got != engine:
            raise ValueError(
                f"{_cause(engine, args)} but the prepared model is a {type(self.trainer.model_wrapped).__name__}: "
                "check the accelerate config and launch command (hf_mlcl refuses to train something other "
                "than what was asked)"
            )
        return control
