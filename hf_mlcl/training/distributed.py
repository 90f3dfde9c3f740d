"""Cross-process gathering for contrastive losses under data parallelism (DDP / FSDP via accelerate).

Candidates are gathered from every process with gradient (:class:`_AllGatherWithGrad`), labels and MoCo keys
without; batches of unequal size are padded and trimmed. Outside an initialised process group every function
is the identity. Design: docs/design.md, "Gathering across processes (hf_mlcl/training/distributed.py)".
"""

from __future__ import annotations

import gc
import inspect
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hf_mlcl.labels.multihot import to_dense_bool

__all__ = [
    "is_distributed",
    "world_size",
    "rank",
    "all_gather_with_grad",
    "all_gather_no_grad",
    "gather_candidates",
    "all_reduce_mean_",
    "mean_over_processes",
    "barrier",
    "all_gather_object",
    "shutdown",
]


def is_distributed() -> bool:
    """True inside an initialised ``torch.distributed`` process group with more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    return dist.get_rank() if is_distributed() else 0


def _gather_sizes(n: int, device: torch.device) -> list[int]:
    size = torch.tensor([n], device=device, dtype=torch.long)
    sizes = [torch.zeros_like(size) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, size)
    return [int(s.item()) for s in sizes]


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    pad = [0, 0] * (tensor.dim() - 1) + [0, rows - tensor.shape[0]]
    return F.pad(tensor, pad)


class _AllGatherWithGrad(torch.autograd.Function):
    """``all_gather`` whose backward sums every rank's gradient for this rank's rows (a reduce-scatter with
    SUM): what ``torch.distributed.nn.functional.all_gather`` computes, which torch 2.13 deprecates (with a
    FutureWarning at every run) in favour of a private module. Public collectives only: NCCL / XCCL
    reduce-scatter; backends without reduce-scatter (gloo) all-reduce the stacked gradients and keep this
    rank's slice (the embeddings are small, B x D per rank)."""

    @staticmethod
    def forward(ctx, tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:  # noqa: D102
        parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, tensor)
        return tuple(parts)

    @staticmethod
    def backward(ctx, *grads: torch.Tensor) -> torch.Tensor:  # noqa: D102
        grads = tuple(g.contiguous() for g in grads)
        if dist.get_backend() in ("nccl", "xccl"):
            out = torch.empty_like(grads[0])
            dist.reduce_scatter(out, list(grads), op=dist.ReduceOp.SUM)
            return out
        total = torch.stack(grads)
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total[dist.get_rank()]


def all_gather_with_grad(tensor: torch.Tensor, sizes: list[int] | None = None) -> list[torch.Tensor]:
    """All-gather ``tensor`` (N_r, ...) from every rank, differentiable; returns the per-rank list.

    The backward sums the incoming gradients (reduce-scatter, :class:`_AllGatherWithGrad`), so
    ``loss.backward()`` on every rank delivers to rank r the gradient of the sum of all ranks' losses with
    respect to its own rows. ``sizes`` (the rows of each rank) may be given to skip the size exchange;
    uneven sizes are padded and trimmed.
    """
    if not is_distributed():
        return [tensor]
    if sizes is None:
        sizes = _gather_sizes(tensor.shape[0], tensor.device)
    rows = max(sizes)
    parts = _AllGatherWithGrad.apply(_pad_rows(tensor.contiguous(), rows))
    return [part[:n] for part, n in zip(parts, sizes)]


def all_gather_no_grad(tensor: torch.Tensor, sizes: list[int] | None = None) -> list[torch.Tensor]:
    """Plain (non-differentiable) all-gather of a dense tensor; bool tensors travel as uint8 (gloo)."""
    if not is_distributed():
        return [tensor.detach()]
    if sizes is None:
        sizes = _gather_sizes(tensor.shape[0], tensor.device)
    rows = max(sizes)
    is_bool = tensor.dtype == torch.bool
    send = _pad_rows(tensor.detach().to(torch.uint8) if is_bool else tensor.detach(), rows).contiguous()
    parts = [torch.empty_like(send) for _ in sizes]
    dist.all_gather(parts, send)
    return [(p[:n].bool() if is_bool else p[:n]) for p, n in zip(parts, sizes)]


def gather_candidates(
    embeddings: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Embeddings and labels of the *other* ranks' samples, to append to the local contrast set.

    Returns ``(other_embeddings (M, D) with gradient, other_labels (M, L) dense bool)``, where M is
    the number of samples held by all the other ranks, or ``(None, None)`` in a single process.
    Local anchors contrasted against ``local batch (self excluded) + other ranks' samples`` see
    exactly the candidates they would see in one process holding the concatenated global batch.
    """
    if not is_distributed():
        return None, None
    sizes = _gather_sizes(embeddings.shape[0], embeddings.device)
    me = dist.get_rank()
    emb_parts = all_gather_with_grad(embeddings, sizes)
    lab_parts = all_gather_no_grad(to_dense_bool(labels), sizes)
    others = [i for i in range(len(sizes)) if i != me]
    return torch.cat([emb_parts[i] for i in others]), torch.cat([lab_parts[i] for i in others])


def all_reduce_mean_(tensors: list[torch.Tensor]) -> None:
    """In-place mean over ranks (for gradients of parameters that DDP does not own, e.g. loss prototypes)."""
    if not is_distributed():
        return
    ws = dist.get_world_size()
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(ws)


def broadcast_from_first_(tensors: list[torch.Tensor]) -> None:
    """In place: every rank's ``tensors`` become rank 0's (no-op outside a multi-process group)."""
    if not is_distributed():
        return
    for t in tensors:
        dist.broadcast(t, src=0)


def mean_over_processes(grad: torch.Tensor) -> torch.Tensor:
    """A gradient hook (``parameter.register_hook``): ``grad`` averaged over the processes.

    For parameters that no DDP / FSDP / DeepSpeed wrapper owns, such as a loss's prototypes trained through
    ``SentenceTransformerTrainer`` or ``Trainer(compute_loss_func=...)``, whose wrappers hold the model only:
    without it each process would step its own copy of them with its own batch's gradient, and the copies
    would drift apart. The mean is the rule the wrappers apply to the model's gradients. Every process must
    backpropagate into the parameter at every step (the hook is a collective), as a loss that uses it on
    every batch does. Identity outside a multi-process group.
    """
    if not is_distributed():
        return grad
    grad = grad.clone()
    all_reduce_mean_([grad])
    return grad


def barrier() -> None:
    """Wait until every rank gets here (no-op outside a multi-process group)."""
    if is_distributed():
        dist.barrier()


def all_gather_object(obj: object) -> list:
    """Every rank's ``obj`` (picklable), in rank order; ``[obj]`` outside a multi-process group. For small
    host-side facts the ranks must agree on before they act (which checkpoints a node's folder holds)."""
    if not is_distributed():
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def shutdown() -> None:
    """End a multi-process run cleanly: a barrier, ``destroy_process_group``, then a garbage collection.

    A process that leaves the interpreter with its gloo process group still alive aborts now and then
    with "terminate called without an active exception" (SIGABRT): the group's communication threads
    (``pt_gloo_runloop``, ``gloo_tcp_loop``) are still running when the C++ static destructors run. The
    barrier keeps any rank from tearing its group down while a peer still talks to it.
    ``destroy_process_group`` only drops torch.distributed's own references: the group, and with it its
    threads, lives on while anything else holds it, and a finished ``Trainer`` does: its
    ``DistributedDataParallel`` wrapper keeps the group, and a trainer caught in a reference cycle (a
    callback that points back at it, say) is freed only by the cycle collector, at the latest during
    interpreter shutdown, where the race is. ``gc.collect()`` frees such trainers here, so the group's
    destructor joins its threads while the interpreter is whole. A trainer still referenced by a live
    variable keeps the group alive; call this after the code that used it has returned.

    DeepSpeed (when installed) holds groups too: ``deepspeed.comm`` binds the world group as a default
    argument (:func:`_release_deepspeed_group_defaults`), a DeepSpeed engine is never freed by itself and
    its partitioned parameters hold the groups (:func:`_destroy_deepspeed_engines`: the engines are
    unusable afterwards), and after a DeepSpeed run ``deepspeed.utils.groups`` caches its own groups, which
    ``deepspeed.comm.destroy_process_group`` drops when it tears the groups down. After an FSDP2 run,
    torch's DTensor caches keep the device mesh and with it the groups (:func:`_release_dtensor_caches`).
    Call it once, at the very end of a program that initialised a process group. Safe to call always.
    """
    if dist.is_available() and dist.is_initialized():
        if dist.get_world_size() > 1:
            dist.barrier()
        _release_dtensor_caches()
        _release_deepspeed_group_defaults()
        _destroy_deepspeed_engines()
        ds_comm = sys.modules.get("deepspeed.comm.comm")
        backend = getattr(ds_comm, "cdb", None)
        if backend is not None and backend.is_initialized():
            ds_comm.destroy_process_group()  # a DeepSpeed run: also drops DeepSpeed's cached groups
        else:
            dist.destroy_process_group()
        gc.collect()


# torch's DTensor caches whose entries hold a DeviceMesh (torch 2.13): (module, object path, method)
_DTENSOR_CACHES: tuple[tuple[str, str, str], ...] = (
    ("torch.distributed.tensor._redistribute", "", "clear_redistribute_planner_cache"),
    ("torch.distributed.tensor._redistribute", "_gen_transform_infos", "cache_clear"),
    ("torch.distributed.tensor._collective_utils", "MeshTopoInfo.build_from_mesh", "cache_clear"),
)


def _release_dtensor_caches() -> None:
    """Empty torch's DTensor caches, which keep the device mesh of an FSDP2 run and through it its process groups.

    FSDP2 (``fully_shard``) holds parameters as ``DTensor``; the DTensor operations it runs (``full_tensor``,
    ``distribute_tensor``, gradient clipping) fill caches keyed by their sharding specs, which point at the
    ``DeviceMesh``, which holds the gloo / NCCL groups and their threads: the sharding propagation cache (C++,
    ``torch._C._clear_DTensor_sharding_propagator_cache``), the redistribute planner cache and two
    ``functools.lru_cache`` functions. They are private torch APIs (torch 2.13): each one is looked up and skipped
    when absent (then the groups may outlive ``destroy_process_group`` as before). Nothing is imported: without
    ``torch.distributed.tensor`` loaded this does nothing.
    """
    if "torch.distributed.tensor" not in sys.modules:
        return
    clear = getattr(torch._C, "_clear_DTensor_sharding_propagator_cache", None)
    if clear is not None:
        clear()
    for module_name, path, method in _DTENSOR_CACHES:
        obj = sys.modules.get(module_name)
        for attr in path.split(".") if path else ():
            obj = getattr(obj, attr, None)
        fn = getattr(obj, method, None)
        if callable(fn):
            fn()


def _release_deepspeed_group_defaults() -> None:
    """Drop the world group that ``deepspeed.comm.torch`` binds as a default argument.

    ``TorchBackend.barrier`` and ``monitored_barrier`` (deepspeed 0.19) take
    ``group=torch.distributed.GroupMember.WORLD`` as their default, evaluated when the module is imported.
    accelerate imports deepspeed whenever it is installed (``extract_model_from_parallel``, called by every
    ``Trainer``), after the process group exists, so that default is the live world group, and it keeps the
    group and its gloo threads (``gloo_tcp_loop``, ``pt_gloo_runloop``) alive after
    ``destroy_process_group``. Both functions read ``None`` as the world group, so ``None`` is the same
    default without the reference. Nothing is imported: without deepspeed loaded this does nothing.
    """
    backend = getattr(sys.modules.get("deepspeed.comm.torch"), "TorchBackend", None)
    for name in ("barrier", "monitored_barrier"):
        method = getattr(backend, name, None)
        if method is None:
            continue
        fn = inspect.unwrap(method)
        defaults = fn.__defaults__
        if defaults and isinstance(defaults[0], dist.ProcessGroup):
            fn.__defaults__ = (None, *defaults[1:])


def _destroy_deepspeed_engines() -> None:
    """Make finished DeepSpeed engines collectable (their partitioned parameters hold the process groups).

    A ``DeepSpeedEngine`` outlives every reference to it (deepspeed 0.19): ZeRO-3's
    ``PartitionedParameterCoordinator.__params_to_release`` is a class-level ``functools.lru_cache``
    whose keys are ``(coordinator, module, ...)``, and ZeRO-3 keeps the root module it wrapped on a
    module-level stack (``deepspeed.runtime.zero.parameter_offload.FWD_MODULE_STACK``); through them the
    engine, the model and its partitioned parameters, which hold the groups, stay reachable forever.
    Every engine is destroyed (``DeepSpeedEngine.destroy()``: its hooks removed), the cache cleared and
    the stack emptied, so the next garbage collection frees them. For the very end of a run: the engines
    are unusable after it. Nothing is imported: without deepspeed loaded this does nothing.
    """
    engine_cls = getattr(sys.modules.get("deepspeed"), "DeepSpeedEngine", None)
    if engine_cls is None:
        return
    for obj in gc.get_objects():
        if issubclass(
            type(obj), engine_cls
        ):  # type(), not isinstance: no deprecated module attribute is touched
            obj.destroy()
    offload = sys.modules.get("deepspeed.runtime.zero.parameter_offload")
    if offload is not None:
        offload.FWD_MODULE_STACK.clear()
    coordinator = getattr(
        sys.modules.get("deepspeed.runtime.zero.partitioned_param_coordinator"),
        "PartitionedParameterCoordinator",
        None,
    )
    for attr in vars(coordinator).values() if coordinator is not None else ():
        _clear_lru_caches(attr)


def _clear_lru_caches(fn: object, depth: int = 3) -> None:
    """``cache_clear()`` on the ``functools.lru_cache`` wrappers in ``fn`` or in the closures of its
    decorators (deepspeed's ``instrument_w_nvtx`` wraps without ``functools.wraps``)."""
    if hasattr(fn, "cache_clear"):
        fn.cache_clear()
        return
    if depth == 0:
        return
    inner = getattr(fn, "__wrapped__", None)
    if inner is not None:
        _clear_lru_caches(inner, depth - 1)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(content):
            _clear_lru_caches(content, depth - 1)
