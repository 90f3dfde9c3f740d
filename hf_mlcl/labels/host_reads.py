"""Whether reading a tensor's values on the host is free, and a switch to the accelerator's branch on any device.

Code that may take a value-dependent shortcut where it costs nothing (a CPU tensor) asks
:func:`host_reads_are_free`; :func:`accelerator_path` makes the answer False inside its block, so a CPU run takes
the branch an accelerator takes (what a CPU test counting host reads with :mod:`hf_mlcl.host_sync` wants).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["accelerator_path", "host_reads_are_free"]

_ACCELERATOR_PATH = 0  # > 0 inside accelerator_path()


def host_reads_are_free(tensor: torch.Tensor) -> bool:
    """True when reading ``tensor``'s values on the host costs no synchronisation: a CPU tensor, outside
    :func:`accelerator_path`. Code may take a value-dependent shortcut when this holds."""
    return tensor.device.type == "cpu" and _ACCELERATOR_PATH == 0


@contextmanager
def accelerator_path() -> Iterator[None]:
    """Inside the block every shortcut asking :func:`host_reads_are_free` takes the accelerator's branch, on the
    CPU too (the same results, without the host reads a CPU allows). Blocks nest.

    Example::

        with accelerator_path(), HostSyncCounter() as counter:
            loss = loss_fn(z, labels)
        assert counter.count == 0, counter.report()
    """
    global _ACCELERATOR_PATH
    _ACCELERATOR_PATH += 1
    try:
        yield
    finally:
        _ACCELERATOR_PATH -= 1
