"""Full values of parameters that DeepSpeed ZeRO-3 or FSDP shard across processes.

:func:`full_parameters` gives the full tensors of named parameters (and writes changes back to the shards);
:func:`readable_state`, :func:`is_main_process`, :func:`wait_for_everyone` and :func:`loading_whole_models`
serve saves and loads; :func:`built_once` builds something on the main process and sends it to the others.
Every process enters them together. Design: docs/design.md, "Sharded parameters (hf_mlcl/modeling/sharded.py)".
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import nn

__all__ = [
    "built_once",
    "full_parameters",
    "is_main_process",
    "is_zero3_parameter",
    "loading_whole_models",
    "readable_state",
    "sharding_kind",
    "unwrap_engine",
    "unwrap_model",
    "wait_for_everyone",
]


def is_zero3_parameter(param: torch.Tensor) -> bool:
    """True for a parameter partitioned by DeepSpeed ZeRO-3 (it carries a ``ds_id``)."""
    return hasattr(param, "ds_id")


def _is_dtensor(param: torch.Tensor) -> bool:
    return type(param).__name__ == "DTensor" or type(getattr(param, "data", None)).__name__ == "DTensor"


def _is_fsdp1(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FullyShardedDataParallel

    return isinstance(model, FullyShardedDataParallel)


def unwrap_engine(model: nn.Module) -> nn.Module:
    """The model inside DDP / DataParallel / DeepSpeedEngine wrappers and ``torch.compile``'s module (an FSDP1
    root is kept: its parameters can only be unsharded through it)."""
    while True:
        if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)) or (
            type(model).__name__ == "DeepSpeedEngine" and hasattr(model, "module")
        ):
            model = model.module
        elif type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
            model = model._orig_mod  # torch.compile (TrainingArguments.torch_compile)
        else:
            return model


def unwrap_model(model: nn.Module) -> nn.Module:
    """The model inside every training wrapper, an FSDP1 root included."""
    model = unwrap_engine(model)
    return model.module if _is_fsdp1(model) else model


def is_main_process(accelerator: Any = None) -> bool:
    """The accelerator's main process, or rank 0 of the process group (True without one)."""
    import torch.distributed as dist

    if accelerator is not None:
        return bool(accelerator.is_main_process)
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0


def wait_for_everyone() -> None:
    """A barrier over the process group (nothing without one)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


T = TypeVar("T")


def built_once(build: Callable[[], T]) -> T:
    """``build()`` run by the global main process alone, its result (pickled) sent to every other process;
    ``build()`` itself outside a multi-process group. For data preparation every process needs, built once
    for the whole launch whatever the storage of the nodes (the tokenizer trained on the fly). Every
    process calls it."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return build()
    box = [build() if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _fsdp2_modules(model: nn.Module) -> list[nn.Module]:
    """The modules of ``model`` that FSDP2's ``fully_shard`` made ``FSDPModule`` s ([] without FSDP2)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # torch without FSDP2
        return []
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


def sharding_kind(model: nn.Module) -> str | None:
    """``"zero3"``, ``"fsdp1"``, ``"fsdp2"`` or None (the parameters are whole on every process)."""
    model = unwrap_engine(model)
    if _is_fsdp1(model):
        return "fsdp1"
    if _fsdp2_modules(model):  # also while FSDP2 holds some units unsharded (plain tensors) after a forward
        return "fsdp2"
    for param in model.parameters():
        if is_zero3_parameter(param):
            return "zero3"
        if _is_dtensor(param):
            return "fsdp2"
    return None


def _select(named: Iterator[tuple[str, torch.Tensor]], names: Collection[str]) -> dict[str, torch.Tensor]:
    wanted = set(names)
    found = {name: param for name, param in named if name in wanted}
    missing = wanted - set(found)
    if missing:
        raise ValueError(f"the model has no parameters {sorted(missing)[:3]} ({len(missing)} missing)")
    return found


@contextmanager
def full_parameters(
    model: nn.Module, names: Collection[str], writeback: bool = False
) -> Iterator[dict[str, torch.Tensor]]:
    """Yield ``{name: full tensor}`` for the parameters ``names`` (their names in the unwrapped model).

    ``model`` is the model as prepared for training (a DeepSpeedEngine, an FSDP root, DDP, or the model
    itself). With ``writeback=True`` in-place changes to the yielded tensors reach the model (ZeRO-3:
    broadcast from rank 0, so every rank must make the same change; FSDP: each rank keeps its shard of
    the new values); without it, changes may be lost. Every process must call this together.
    """
    kind = sharding_kind(model)
    inner = unwrap_engine(model)
    with torch.no_grad():
        if kind == "fsdp1":
            from torch.distributed.fsdp import FullyShardedDataParallel

            with FullyShardedDataParallel.summon_full_params(inner, recurse=True, writeback=writeback):
                yield {name: p.data for name, p in _select(inner.named_parameters(), names).items()}
            return
        if kind == "fsdp2":
            # the sharded DTensors are the parameters' values: a unit left unsharded by a forward (the root keeps
            # its parameters gathered until the backward) registers plain tensors that a reshard would drop
            for module in _fsdp2_modules(inner):
                module.reshard()
        params = _select(inner.named_parameters(), names)
        if kind == "zero3":
            import deepspeed

            ordered = list(params.values())
            with deepspeed.zero.GatheredParameters(ordered, modifier_rank=0 if writeback else None):
                yield {name: param.data for name, param in params.items()}
            return
        if kind == "fsdp2":
            full = {name: (p.data.full_tensor() if _is_dtensor(p) else p.data) for name, p in params.items()}
            yield full
            if writeback:
                from torch.distributed.tensor import distribute_tensor

                for name, param in params.items():
                    if _is_dtensor(param):  # every rank holds the full value: no communication
                        local = distribute_tensor(
                            full[name], param.device_mesh, param.placements, src_data_rank=None
                        )
                        param.data.to_local().copy_(local.to_local())
            return
        yield {name: param.data for name, param in params.items()}


@contextmanager
def readable_state(
    model: nn.Module, names: Collection[str], accelerator: Any = None
) -> Iterator[Mapping[str, torch.Tensor] | None]:
    """Make the parameters ``names`` readable for a save, on every process together.

    Yields None when the live (unwrapped) model can be read: plain / DDP / ZeRO-1/2 models as they are,
    ZeRO-3 with ``names`` gathered for the duration (:func:`full_parameters`). Under FSDP2 yields a state
    dict of the parameters ``names`` gathered whole (``DTensor.full_tensor``, on every process: a LoRA
    adapter, never the frozen base) and the model's unsharded entries (buffers). Under FSDP1 yields the full
    state dict that ``accelerator.get_state_dict`` gathers (complete on the main process; FSDP1 can only
    unshard whole units).
    """
    kind = sharding_kind(model)
    if kind == "fsdp1":
        if accelerator is None:
            raise ValueError(
                "under FSDP1 the full state dict is gathered through the accelerator: pass "
                "accelerator=trainer.accelerator"
            )
        yield accelerator.get_state_dict(model)
        return
    if kind == "fsdp2":
        with full_parameters(model, names) as full:
            live = unwrap_engine(
                model
            ).state_dict()  # sharded DTensors (FSDP2's save hook), buffers as they are
            state = {key: value for key, value in live.items() if not _is_dtensor(value)}
            state.update(full)
            yield state
        return
    if kind == "zero3" and hasattr(model, "empty_partition_cache"):
        # Release every gathered parameter first, waiting for the all-gathers still in flight: ZeRO-3's
        # prefetch can leave some in flight after an evaluation forward, and re-partitioning a parameter
        # in flight fails ("Cannot partition a param in flight", seen on a GPU; its collectives are
        # asynchronous there).
        model.empty_partition_cache()
    with full_parameters(model, names):
        yield None


@contextmanager
def loading_whole_models() -> Iterator[None]:
    """Models built or loaded inside are whole, not ZeRO-3 partitioned: for loads on ONE process of a
    DeepSpeed run (scoring a saved classifier, merging a saved adapter on the main process).

    While the run's ``TrainingArguments`` ask for ZeRO-3, transformers builds every model under
    ``deepspeed.zero.Init`` (``transformers.integrations.deepspeed.is_deepspeed_zero3_enabled``), which
    partitions it across the processes and communicates: a load on one process then waits forever for
    the others. The ZeRO-3 configuration is unset for the duration and restored after. Nothing happens
    outside a ZeRO-3 run.
    """
    ds = sys.modules.get("transformers.integrations.deepspeed")
    ref = getattr(ds, "_hf_deepspeed_config_weak_ref", None)
    config = ref() if ref is not None else None
    if config is None:
        yield
        return
    ds.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        ds.set_hf_deepspeed_config(config)
