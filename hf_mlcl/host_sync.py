"""Counting the host reads of tensor values (device-to-host synchronisations) made by a block of code.

:class:`HostSyncCounter` counts the calls that make the host wait for an accelerator, on any device, so a CPU
test proves a code path free of them; ``SyncCountingCallback`` counts inside chosen optimizer steps of a
``Trainer``. The counter only observes: a CPU test of the accelerator's branch enters
:func:`hf_mlcl.labels.host_reads.accelerator_path` itself.

Design: docs/design.md, "Counting host reads (hf_mlcl/host_sync.py)".
"""

from __future__ import annotations

import collections
import functools
import os
import sys
from collections.abc import Iterable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# SyncCountingCallback is defined on first access (module __getattr__): transformers is imported then
__all__ = [  # noqa: F822
    "HostSyncCounter",
    "SyncCountingCallback",
    "SYNCING_CALLS",
    "TRANSFORMERS_MASK_PREPARATION",
]

_T = torch.Tensor

# calls that read a value on the host (a synchronisation on an accelerator) whatever their arguments
_VALUE_READS = {
    _T.item: "item",
    _T.__bool__: "__bool__",
    _T.__float__: "__float__",
    _T.__int__: "__int__",
    _T.__index__: "__index__",
    _T.__complex__: "__complex__",
    _T.tolist: "tolist",
    _T.numpy: "numpy",
    _T.__array__: "__array__",
    _T.__contains__: "__contains__",
    _T.cpu: "cpu",
    _T.__repr__: "__repr__",
    _T.__format__: "__format__",
    _T.nonzero: "nonzero",
    torch.nonzero: "nonzero",
    _T.argwhere: "argwhere",
    torch.argwhere: "argwhere",
    _T.masked_select: "masked_select",
    torch.masked_select: "masked_select",
    _T.unique: "unique",
    torch.unique: "unique",
    _T.unique_consecutive: "unique_consecutive",
    torch.unique_consecutive: "unique_consecutive",
    _T.bincount: "bincount",
    torch.bincount: "bincount",
    _T.coalesce: "coalesce",
    _T.to_sparse: "to_sparse",
    _T.to_sparse_coo: "to_sparse_coo",
    _T.to_sparse_csr: "to_sparse_csr",
    torch.equal: "equal",
    _T.equal: "equal",
    torch.allclose: "allclose",
    _T.allclose: "allclose",
    torch.is_nonzero: "is_nonzero",
    _T.is_nonzero: "is_nonzero",
}
_INDEXING = {
    _T.__getitem__: "__getitem__",
    _T.__setitem__: "__setitem__",
    _T.index_put_: "index_put_",
    _T.index_put: "index_put",
    torch.index_put: "index_put",
}
_REPEATS = {_T.repeat_interleave: "repeat_interleave", torch.repeat_interleave: "repeat_interleave"}
_WHERE = {torch.where: "where", _T.where: "where"}
# a tensor made from host data for a device is a host-to-device copy, which the default (blocking) copy
# follows with a stream synchronisation; counted whenever a device is named (it may be an accelerator)
_FROM_HOST = {torch.tensor: "tensor", torch.as_tensor: "as_tensor"}
# a copy to the host named as such (``x.to("cpu")``, ``x.to(device="cpu")``): a blocking device-to-host copy on
# an accelerator. ``x.to(other.device)`` is not counted: on the CPU a test cannot tell where it would go.
_TO = {_T.to: "to"}

# ATen operators that read a value on the host or whose output shape depends on the values
_ATEN = torch.ops.aten
_VALUE_OPS = {
    _ATEN._local_scalar_dense.default: "_local_scalar_dense",  # item(), float(), int(), bool()
    _ATEN.nonzero.default: "nonzero",
    _ATEN.argwhere.default: "argwhere",
    _ATEN.masked_select.default: "masked_select",
    _ATEN._unique2.default: "unique",
    _ATEN.unique_dim.default: "unique",
    _ATEN.unique_consecutive.default: "unique_consecutive",
    _ATEN.bincount.default: "bincount",
    _ATEN._coalesce.default: "coalesce",
    _ATEN.equal.default: "equal",
    _ATEN.is_nonzero.default: "is_nonzero",
}
_INDEX_OPS = {
    _ATEN.index.Tensor,
    _ATEN.index_put.default,
    _ATEN.index_put_.default,
    _ATEN._index_put_impl_.default,
}

#: The names of the intercepted calls (see the module docstring for when each one synchronises).
SYNCING_CALLS = tuple(
    sorted(
        {
            *_VALUE_READS.values(),
            *_INDEXING.values(),
            *_REPEATS.values(),
            *_FROM_HOST.values(),
            *_TO.values(),
            "where (one argument)",
        }
    )
)

#: Where transformers prepares a backbone's attention mask (``masking_utils.py``): given a 2-D padding
#: mask it checks ``padding_mask.all()`` on the host, to run the attention without a mask when nothing
#: is padded (transformers 5, e.g. SDPA and eager attention of BERT-style encoders): one host read per
#: backbone forward, made by transformers, not by hf_mlcl. MLCLEncoder avoids it for BERT, RoBERTa and
#: XLM-RoBERTa under SDPA by handing over the mask prepared (``MLCLPreTrainedModel._backbone_mask``), and
#: MultiLabelCollator for every backbone by leaving the mask out of a batch without padding.
TRANSFORMERS_MASK_PREPARATION = os.path.join("transformers", "masking_utils.py")


def _has_bool_index(index: Any) -> bool:
    items = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in items)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.abspath(__file__)


def _call_site() -> str:
    """``path:line (function)`` of the first frame outside torch's own Python package and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_TORCH_DIR) and os.path.abspath(path) != _HERE:
            return f"{path}:{frame.f_lineno} ({frame.f_code.co_name})"
        frame = frame.f_back
    return "<torch>"


class _OperatorCounter(TorchDispatchMode):
    """The ATen layer of :class:`HostSyncCounter`: records a value-reading operator unless the Python call
    that led to it was recorded already (``counter.recording``)."""

    def __init__(self, counter: HostSyncCounter) -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(
        self, func: Any, types: Iterable[type], args: tuple = (), kwargs: dict | None = None
    ):
        kwargs = kwargs or {}
        if not self.counter.recording:
            name = _VALUE_OPS.get(func)
            if name is None and func in _INDEX_OPS:
                index = args[1] if len(args) > 1 else kwargs.get("indices")
                name = "index (bool mask)" if _has_bool_index(index) else None
            if name is None and func is _ATEN.repeat_interleave.Tensor and kwargs.get("output_size") is None:
                name = "repeat_interleave (tensor repeats)"
            if name is not None:
                self.counter.events.append(("aten." + name, _call_site()))
        return func(*args, **kwargs)


class HostSyncCounter(TorchFunctionMode):
    """Counts the calls that read tensor values on the host while it is active (a context manager); it
    changes nothing of what the code runs (``hf_mlcl.labels.host_reads.accelerator_path`` takes the
    accelerator's branch on the CPU).

    Attributes:
        count: number of syncing calls seen.
        events: ``(call name, call site)`` of each, in order; :meth:`report` summarises them.
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []
        self.recording = False  # inside a Python call counted already: its operators are not counted again
        self._operators = _OperatorCounter(self)

    @property
    def count(self) -> int:
        return len(self.events)

    def sites(self) -> collections.Counter:
        """How many syncing calls each ``(call name, call site)`` made."""
        return collections.Counter(self.events)

    def report(self, events: list[tuple[str, str]] | None = None) -> str:
        """One line per call site of ``events`` (default: all), most frequent first ('' for none)."""
        counts = collections.Counter(self.events if events is None else events)
        return "\n".join(f"{n} x {name} at {site}" for (name, site), n in counts.most_common())

    def events_outside(self, *path_parts: str) -> list[tuple[str, str]]:
        """The events whose call site's path contains none of ``path_parts`` (e.g.
        :data:`TRANSFORMERS_MASK_PREPARATION`, to look past the backbone's own host read)."""
        return [e for e in self.events if not any(part in e[1] for part in path_parts)]

    def __enter__(self) -> HostSyncCounter:
        super().__enter__()
        self._operators.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            self._operators.__exit__(*exc)
        finally:
            super().__exit__(*exc)

    def _syncing_call(self, func: Any, args: tuple, kwargs: dict) -> str | None:
        name = _VALUE_READS.get(func)
        if name is not None:
            return name
        name = _INDEXING.get(func)
        if name is not None:
            index = args[1] if len(args) > 1 else kwargs.get("indices")
            return name + " (bool mask)" if _has_bool_index(index) else None
        name = _REPEATS.get(func)
        if name is not None:
            repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
            if (
                isinstance(repeats, torch.Tensor)
                and repeats.numel() > 1
                and kwargs.get("output_size") is None
            ):
                return name + " (tensor repeats)"
            return None
        if func in _WHERE and len(args) + len(kwargs) == 1:
            return "where (one argument)"
        name = _TO.get(func)
        if name is not None:
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            host = isinstance(target, str) and target.split(":")[0] == "cpu"
            # to(device, dtype, non_blocking, copy): non_blocking by keyword or fourth positionally
            waits = not kwargs.get("non_blocking", len(args) > 3 and bool(args[3]))
            return name + " (the host)" if host and waits else None
        name = _FROM_HOST.get(func)
        if name is not None and kwargs.get("device") is not None:
            data = args[0] if args else kwargs.get("data")
            return None if isinstance(data, torch.Tensor) else name + " (host data to a device)"
        return None

    def __torch_function__(
        self, func: Any, types: Iterable[type], args: tuple = (), kwargs: dict | None = None
    ):
        kwargs = kwargs or {}
        name = self._syncing_call(func, args, kwargs)
        if name is None or self.recording:
            return func(*args, **kwargs)
        self.events.append((name, _call_site()))
        self.recording = True
        try:
            return func(*args, **kwargs)
        finally:
            self.recording = False


@functools.lru_cache(maxsize=1)
def _sync_counting_callback() -> type:
    """Defines :class:`SyncCountingCallback` on first use (transformers is imported only then)."""
    from transformers import TrainerCallback

    class SyncCountingCallback(TrainerCallback):
        """A ``transformers.TrainerCallback`` counting syncing calls inside chosen optimizer steps.

        Args:
            steps: the 1-based optimizer steps to count (``state.global_step + 1`` at ``on_step_begin``);
                None counts every step.

        Attributes:
            counts: ``{step: number of syncing calls}``; ``counters`` the :class:`HostSyncCounter` of each.

        Use it as a context manager around ``trainer.train()``: a step that raises never reaches
        ``on_step_end``, and leaving the block disarms the counter.
        """

        def __init__(self, steps: Iterable[int] | None = None) -> None:
            self.steps = None if steps is None else {int(s) for s in steps}
            self.counters: dict[int, HostSyncCounter] = {}
            self._active: HostSyncCounter | None = None

        @property
        def counts(self) -> dict[int, int]:
            return {step: c.count for step, c in self.counters.items()}

        def report(self) -> str:
            return "\n".join(
                f"step {s}: {c.count} syncing calls\n{c.report()}" for s, c in self.counters.items()
            )

        def on_step_begin(self, args, state, control, **kwargs):
            step = state.global_step + 1
            if self._active is None and (self.steps is None or step in self.steps):
                counter = HostSyncCounter()
                self.counters[step] = counter
                self._active = counter.__enter__()
            return control

        def on_step_end(self, args, state, control, **kwargs):
            self.disarm()
            return control

        def disarm(self) -> None:
            """Stop counting (no-op when no counter is active)."""
            if self._active is not None:
                active, self._active = self._active, None
                active.__exit__(None, None, None)

        def __enter__(self) -> SyncCountingCallback:
            return self

        def __exit__(self, *exc: Any) -> None:
            self.disarm()

    SyncCountingCallback.__module__ = __name__
    SyncCountingCallback.__qualname__ = "SyncCountingCallback"
    return SyncCountingCallback


def __getattr__(name: str) -> Any:
    if name == "SyncCountingCallback":
        return _sync_counting_callback()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
