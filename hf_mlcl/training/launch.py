"""The launch: what ``accelerate launch`` (torchrun) asked for, whether the run got it, and one failing
process stopping every process of it.

:func:`launch_problem`, :func:`check_engine_applied` and :class:`EngineCheckCallback` check the DeepSpeed /
FSDP engine; :class:`LaunchFailures` stops every process of a launch when one fails, naming it.

Design: docs/design.md, "Launch checks (hf_mlcl/training/launch.py)".
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from typing import Any

from transformers import TrainerCallback

__all__ = [
    "EngineCheckCallback",
    "LaunchFailures",
    "PEER_FAILURE_EXIT",
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
    source = (
        "args.deepspeed"
        if engine == "deepspeed" and getattr(args, "deepspeed", None)
        else (
            "args.fsdp"
            if engine == "fsdp" and getattr(args, "fsdp", None)
            else f"ACCELERATE_USE_{engine.upper()}=true"
        )
    )
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
            "--ddp_backend gloo)"
            if engine == "deepspeed"
            else "on CPU launch recipes/accelerate/deepspeed_zero3.yaml, or recipes/accelerate/cpu.yaml for DDP"
        )
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
    dtypes = sorted(
        {str(p.dtype).replace("torch.", "") for p in trainer.model.parameters() if p.is_floating_point()}
    )
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


# ----------------------------------------------------------------------------------------------------
# a failing process stops every process of the launch
# ----------------------------------------------------------------------------------------------------
PEER_FAILURE_EXIT = 2  # the exit status of a process stopped because a peer failed (hf-mlcl's error status)
_KEY = "hf_mlcl/failed"


class LaunchFailures:
    """See the module docstring. ``prog`` prefixes the printed error (``"hf-mlcl run"``);
    ``poll_seconds``: how often the watcher reads the store; ``grace_seconds``: how long it lets this
    process end by itself (its own error path) before ending it."""

    def __init__(self, prog: str, poll_seconds: float = 0.5, grace_seconds: float = 2.0) -> None:
        env = os.environ
        self.prog = prog
        self.poll_seconds, self.grace_seconds = poll_seconds, grace_seconds
        self.rank, self.local_rank = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
        self.machine = env.get("GROUP_RANK")  # torchrun's node rank (accelerate's --machine_rank)
        self._address = (env.get("MASTER_ADDR"), int(env.get("MASTER_PORT", "0") or 0))
        self.enabled = (
            int(env.get("WORLD_SIZE", "1") or 1) > 1
            and env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            and bool(self._address[0])
            and self._address[1] > 0
        )
        # one key per (re)start of the workers: a restarted launch does not see the last attempt's failure
        self._key = f"{_KEY}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _store(self, timeout_seconds: float) -> Any:
        from torch.distributed import TCPStore

        host, port = self._address
        return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_seconds))

    def start(self) -> LaunchFailures:
        """Start watching for a peer's failure (a daemon thread); returns self."""
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="hf_mlcl-launch-failures", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching: this process ends by itself (success, or its own error)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_seconds + 5)

    def _watch(self) -> None:
        try:
            store = self._store(60)
        except Exception:  # no store to watch: the launch goes on as torchrun alone runs it
            return
        while not self._stop.wait(self.poll_seconds):
            try:
                if not store.check([self._key]):
                    continue
                message = store.get(self._key).decode()
            except Exception:  # the store is gone: the main node's launcher has ended
                return
            if self._stop.wait(self.grace_seconds):
                return  # this process reached its own end meanwhile
            if self.local_rank == 0:
                print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
            os._exit(PEER_FAILURE_EXIT)

    def announce(self, error: str) -> None:
        """Tell every process of the launch that this one fails with ``error`` (one line), and stop watching.
        The first failure of the launch is kept."""
        self.stop()
        if not self.enabled:
            return
        where = f"process {self.rank}" + (
            f" (machine_rank {self.machine})" if self.machine is not None else ""
        )
        try:
            self._store(10).compare_set(self._key, "", f"{where} failed: {error}")
        except Exception:  # the store is gone: nobody is left to tell
            pass

    def peer_failure(self) -> str | None:
        """The failure a peer announced, or None (none yet, or not in a torchrun launch)."""
        if not self.enabled:
            return None
        try:
            store = self._store(10)
            return store.get(self._key).decode() if store.check([self._key]) else None
        except Exception:
            return None
