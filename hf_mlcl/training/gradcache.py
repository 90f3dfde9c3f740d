"""GradCache: contrastive batches far larger than what fits in accelerator memory.

:func:`gradcache_backward` encodes in chunks without graphs, caches the loss's gradient to the embeddings
and re-encodes each chunk with its graph (same RNG state); :func:`slice_batch` / :func:`split_inputs` slice
batch dicts by rows.

References: Gao et al., "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup"
(RepL4NLP 2021), Sec. 3, eq. 5.
Design: docs/design.md, "GradCache (hf_mlcl/training/gradcache.py)".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

__all__ = ["RandomState", "batch_rows", "gradcache_backward", "slice_batch", "slice_rows", "split_inputs"]


class RandomState:
    """Snapshot of the CPU's and (optionally) one accelerator device's RNG state, replayable as a context.

    The accelerator is ``device``'s type when torch has a device module for it with RNG state (CUDA, XPU, MPS,
    ...: ``torch.get_device_module``), so dropout drawn there is replayed too. ``with state.replay(): ...`` runs
    the body with the generators set to the snapshot and restores the generators' previous states afterwards
    (``torch.random.fork_rng``), so the replay does not perturb the random stream seen by the rest of the step.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.cpu_state = torch.random.get_rng_state()
        self.device_type: str | None = None
        self.device_index: int | None = None
        self.device_state: torch.Tensor | None = None
        module = _rng_module(device.type)
        if module is not None:
            index = device.index
            if index is None:
                index = module.current_device() if hasattr(module, "current_device") else 0
            self.device_type, self.device_index = device.type, index
            self.device_state = module.get_rng_state(index)

    @contextlib.contextmanager
    def replay(self) -> Iterator[None]:
        devices = [] if self.device_type is None else [self.device_index]
        with torch.random.fork_rng(devices=devices, device_type=self.device_type or "cpu"):
            torch.random.set_rng_state(self.cpu_state)
            if self.device_type is not None:
                torch.get_device_module(self.device_type).set_rng_state(self.device_state, self.device_index)
            yield


def _rng_module(device_type: str):
    """torch's module of an accelerator ``device_type`` with RNG state that is available, else None (the CPU)."""
    if device_type in ("cpu", "meta"):
        return None
    try:
        module = torch.get_device_module(device_type)
    except RuntimeError:
        return None
    available = getattr(module, "is_available", lambda: False)()
    return (
        module
        if available and hasattr(module, "get_rng_state") and hasattr(module, "set_rng_state")
        else None
    )


def slice_rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a dense or torch-sparse tensor (sparse: ``index_select``)."""
    if t.layout != torch.strided:
        return t.index_select(0, torch.arange(start, stop, device=t.device))
    return t[start:stop]


def slice_batch(batch: Mapping[str, Any], start: int, stop: int, n: int) -> dict[str, Any]:
    """Rows [start, stop) of every tensor in ``batch`` whose first dim is ``n``; other entries copied."""
    return {
        k: slice_rows(v, start, stop)
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n
        else v
        for k, v in batch.items()
    }


def batch_rows(batch: Mapping[str, Any]) -> int:
    """The batch's row count: that of ``input_ids``, or of its first tensor. ValueError without a tensor."""
    ref = batch.get("input_ids")
    if ref is None:
        ref = next((v for v in batch.values() if isinstance(v, torch.Tensor)), None)
    if ref is None:
        raise ValueError("the batch holds no tensor")
    return int(ref.shape[0])


def split_inputs(inputs: Mapping[str, Any], chunk_size: int) -> list[dict[str, Any]]:
    """Split a batch dict along dim 0 into chunks of ``chunk_size`` rows (:func:`slice_batch`: tensors
    only, sparse ones by ``index_select``; others copied). The row count is :func:`batch_rows`'s."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive; got {chunk_size}")
    if not any(isinstance(v, torch.Tensor) for v in inputs.values()):
        raise ValueError("split_inputs needs at least one tensor in the batch")
    n = batch_rows(inputs)
    return [slice_batch(inputs, start, min(start + chunk_size, n), n) for start in range(0, n, chunk_size)]


def gradcache_backward(
    encode: Callable[[dict[str, Any]], torch.Tensor],
    inputs: Mapping[str, Any] | list[dict[str, Any]],
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    chunk_size: int | None = None,
    *,
    device: torch.device | str | None = None,
    backward_loss: Callable[[torch.Tensor], None] | None = None,
    no_sync: Callable[[], contextlib.AbstractContextManager] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run GradCache's three passes; parameter gradients are *accumulated* into ``.grad``.

    Args:
        encode: maps one chunk (a batch dict) to its embeddings (n_chunk, D) — typically
            ``lambda b: model(**b).embeddings``.
        inputs: the full batch dict (split with ``chunk_size``) or a ready list of chunks.
        loss_fn: maps the concatenated embeddings (N, D) to a scalar loss. It may gather across
            processes, use keys or learnable loss parameters: whatever it differentiates is handled
            by the single backward of pass 2.
        device: where the encoder runs (decides which accelerator's RNG state is captured too: :class:`RandomState`).
        backward_loss: how to backpropagate the loss in pass 2 (default ``loss.backward()``); the
            trainer passes ``accelerator.backward`` so mixed-precision loss scaling applies. Any scale
            applied there (fp16 loss scale, 1/gradient_accumulation_steps) is carried by the cached
            gradients into the parameters.
        no_sync: a context factory (e.g. ``lambda: accelerator.no_sync(model)``) entered for every
            re-encoding backward except the last, so DDP all-reduces the gradients once.

    Returns:
        ``(loss.detach(), embeddings.detach())``.
    """
    chunks = list(inputs) if isinstance(inputs, list) else split_inputs(inputs, chunk_size or 0)
    # Pass 1: graph-free encoding, one RNG snapshot per chunk taken right before it is encoded.
    states: list[RandomState] = []
    reps: list[torch.Tensor] = []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RandomState(device))
            reps.append(encode(chunk))
    embeddings = torch.cat(reps).detach().requires_grad_(True)
    # Pass 2: loss on the full batch, gradient cached at the embeddings.
    loss = loss_fn(embeddings)
    if backward_loss is None:
        loss.backward()
    else:
        backward_loss(loss)
    if embeddings.grad is None:
        raise RuntimeError("the loss does not depend on the embeddings; nothing to backpropagate")
    cached = embeddings.grad.split([r.shape[0] for r in reps])
    # Pass 3: replay each chunk with its RNG state and push the cached gradient into the encoder.
    last = len(chunks) - 1
    for i, (chunk, state, grad) in enumerate(zip(chunks, states, cached)):
        sync_ctx = no_sync() if (no_sync is not None and i < last) else contextlib.nullcontext()
        with sync_ctx, state.replay():
            rep = encode(chunk)
            torch.autograd.backward(rep, grad_tensors=grad.to(rep.dtype))
    return loss.detach(), embeddings.detach()
