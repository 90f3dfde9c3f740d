"""The host-read counter (hf_mlcl.host_sync): which calls it counts and where, what it leaves alone; it only
observes, and the accelerator path is a switch of the library's own (hf_mlcl.labels.host_reads)."""

from __future__ import annotations

import torch

from hf_mlcl.host_sync import HostSyncCounter, SyncCountingCallback
from hf_mlcl.labels.host_reads import accelerator_path, host_reads_are_free


def _count(fn) -> HostSyncCounter:
    with HostSyncCounter() as counter:
        fn()
    return counter


def test_every_kind_of_host_read_is_counted_with_its_call_site():
    x = torch.tensor([0.5, -1.0, 2.0])
    mask = x > 0
    reads = {
        "__float__": lambda: float(x.sum()),
        "item": lambda: x.sum().item(),
        "__bool__": lambda: bool(mask.any()),
        "__int__": lambda: int(mask.sum()),
        "tolist": lambda: x.tolist(),
        "numpy": lambda: x.numpy(),
        "__contains__": lambda: 2.0 in x,
        "cpu": lambda: x.cpu(),
        "to (the host)": lambda: x.to("cpu"),
        "nonzero": lambda: mask.nonzero(),
        "unique": lambda: torch.unique(x),
        "bincount": lambda: torch.bincount(mask.long(), minlength=2),
        "__getitem__ (bool mask)": lambda: x[mask],
        "__setitem__ (bool mask)": lambda: x.clone().__setitem__(mask, 0.0),
        "where (one argument)": lambda: torch.where(mask),
        "repeat_interleave (tensor repeats)": lambda: x.repeat_interleave(torch.tensor([1, 2, 1])),
        "tensor (host data to a device)": lambda: torch.tensor(1.0, device=x.device),
        "__repr__": lambda: repr(x),
    }
    for name, fn in reads.items():
        counter = _count(fn)
        assert [e[0] for e in counter.events] == [name], (name, counter.events)
        assert __file__ in counter.events[0][1], counter.events  # the site is this file, not torch


def test_device_side_work_is_not_counted():
    x, idx = torch.randn(4, 3), torch.tensor([2, 0])

    def work():
        y = torch.where(x > 0, x, 0.0) @ x.T
        y = y[idx] + x[1:, :2].sum() * torch.full((), 2.0)  # integer / slice indexing, fills
        y.masked_fill_(y > 1, 0.0)
        torch.repeat_interleave(x, 2, dim=0)
        x.new_zeros(3).index_add_(0, idx, x[:2, 0])
        x.to(torch.float64).to(x.device).to("cpu", non_blocking=True)  # dtype, a device object, no wait
        x.to("cpu", torch.float64, True)  # non_blocking positionally
        return y.mean(dim=1).softmax(dim=0)

    counter = _count(work)
    assert counter.count == 0, counter.report()


def test_the_counter_only_observes_and_the_accelerator_path_is_its_own_switch():
    t = torch.zeros(2)
    assert host_reads_are_free(t)
    with HostSyncCounter():
        assert host_reads_are_free(t)  # counting changes no branch
    with accelerator_path():
        assert not host_reads_are_free(t)
        with accelerator_path():
            assert not host_reads_are_free(t)
        assert not host_reads_are_free(t)  # blocks nest
    assert host_reads_are_free(t)
    try:
        with accelerator_path():
            raise RuntimeError
    except RuntimeError:
        pass
    assert host_reads_are_free(t)  # left on an error too


def test_report_and_filter_by_site():
    with HostSyncCounter() as counter:
        for _ in range(3):
            float(torch.ones(()))
        torch.ones(2).tolist()
    assert counter.count == 4
    lines = counter.report().splitlines()
    assert lines[0].startswith("3 x __float__ at ") and lines[1].startswith("1 x tolist at ")
    assert counter.events_outside("test_host_sync.py") == []
    assert len(counter.events_outside("elsewhere.py")) == 4


def test_callback_counts_only_the_chosen_steps_and_disarms_on_exit():
    from transformers import TrainerCallback, TrainerControl, TrainerState

    callback = SyncCountingCallback(steps=[2])
    assert isinstance(callback, TrainerCallback)
    state, control = TrainerState(), TrainerControl()
    for step in (1, 2, 3):
        state.global_step = step - 1
        callback.on_step_begin(None, state, control)
        float(torch.ones(()))
        callback.on_step_end(None, state, control)
    assert callback.counts == {2: 1}
    assert "step 2: 1 syncing calls" in callback.report()
    fresh = SyncCountingCallback()
    with fresh:
        fresh.on_step_begin(None, state, control)  # a step that raises never reaches on_step_end
        assert torch._C._is_torch_function_mode_enabled()
    assert not torch._C._is_torch_function_mode_enabled()  # leaving the block disarmed it


def test_reads_in_a_backward_pass_are_counted_at_the_operator_level():
    """The backward runs outside the Python-call layer; the ATen layer sees its reads (once each)."""

    class ReadsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            float(grad.sum())
            return grad[grad > 0].sum() + grad * 2

    x = torch.randn(3, requires_grad=True)
    with HostSyncCounter() as counter:
        ReadsInBackward.apply(x).sum().backward()
    assert [name for name, _ in counter.events] == ["aten._local_scalar_dense", "aten.index (bool mask)"]
    assert all("(backward)" in site for _, site in counter.events)
    with HostSyncCounter() as counter:
        float(x.detach().sum())  # a counted Python call: its operator is not counted again
    assert [name for name, _ in counter.events] == ["__float__"]
