"""Intra-op threads of a small CPU loss step: one thread when forking costs more than the work.

A contrastive step on a small in-batch batch (N = 64, D = 128) is a handful of (N, N) products and
exponentials. On CPU every one of them forks the intra-op thread pool, and with a 64 x 128 x 64
product the fork / join costs more than the arithmetic (measured on the 2-core CI machine, with
``OMP_WAIT_POLICY=PASSIVE``: 35 us on 2 threads, 16 us on 1; ``benchmarks/loss_speed.py`` times the
whole step). :func:`small_step_threads` runs the loss's forward (and the fused kernel's backward) on
one intra-op thread below :data:`SMALL_WORK` multiply-adds of the similarity product and restores
the caller's thread count on exit, also on error. GPU tensors, single-threaded processes and larger
steps are untouched. ``torch.set_num_threads`` is process-wide: another Python thread running torch
ops during a small loss step runs them on one thread for those microseconds (a slowdown, never a
different result).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["SMALL_WORK", "small_step_threads"]

# N * M * D of the similarity product below which one thread is faster (2**21: N = M = 128, D = 128;
# on 2 cores the crossover measured between 2**21 and 2**23 depending on the machine's load)
SMALL_WORK = 2**21


@contextmanager
def small_step_threads(anchors: Tensor, candidates: Tensor | int | None = None) -> Iterator[None]:
    """One intra-op thread inside the block when ``anchors`` (N, D) is on CPU and N * M * D is small.

    Args:
        anchors: the (N, D) anchor embeddings (device and sizes decide; anything else: no change).
        candidates: M, the columns of the similarity matrix, as an int; or the (K, D) key embeddings
            (M = N + K); None: in-batch only (M = N).
    """
    # accelerator tensors return before asking for the thread count (a call torch.compile cannot trace)
    if not isinstance(anchors, Tensor) or anchors.dim() != 2 or anchors.device.type != "cpu":
        yield
        return
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    n, dim = anchors.shape
    if isinstance(candidates, Tensor):
        m = n + (candidates.shape[0] if candidates.dim() == 2 else 0)
    else:
        m = n if candidates is None else int(candidates)
    if n * max(m, 1) * dim > SMALL_WORK:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
