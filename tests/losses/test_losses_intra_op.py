"""Small CPU loss steps run on one intra-op thread; the caller's thread count always comes back."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hf_mlcl.losses import get_loss, intra_op
from hf_mlcl.losses.intra_op import SMALL_WORK, small_step_threads


@pytest.fixture
def two_threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_small_cpu_step_runs_on_one_thread_and_restores(two_threads):
    z = torch.randn(64, 128)
    with small_step_threads(z):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="boom"):
        with small_step_threads(z, torch.randn(16, 128)):
            assert torch.get_num_threads() == 1
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


def test_large_steps_and_non_tensors_keep_the_thread_count(two_threads):
    n = 256
    dim = SMALL_WORK // (n * n) + 1  # N * N * D just above the threshold
    with small_step_threads(torch.randn(n, dim)):
        assert torch.get_num_threads() == 2
    with small_step_threads(torch.randn(8, 4), SMALL_WORK):  # M given as an int
        assert torch.get_num_threads() == 2
    with small_step_threads(torch.randn(64, 16), torch.randn(SMALL_WORK // (64 * 16), 16)):  # keys count
        assert torch.get_num_threads() == 2
    with small_step_threads("not a tensor"):  # bad input: the loss raises its own error later
        assert torch.get_num_threads() == 2


def test_accelerator_tensors_never_ask_for_the_thread_count(monkeypatch):
    """Not on a CPU: the block runs unchanged without torch.get_num_threads (a call torch.compile cannot
    trace, so a compiled loss on a GPU would break its graph there)."""

    def untraceable():
        raise AssertionError("torch.get_num_threads called for a tensor that is not on the CPU")

    monkeypatch.setattr(intra_op.torch, "get_num_threads", untraceable)
    with small_step_threads(torch.empty(8, 4, device="meta"), torch.empty(8, 4, device="meta")):
        pass


@pytest.mark.parametrize("name", ["all", "mulsupcon", "ws_mulsupcon", "hbl"])
def test_loss_forward_and_backward_of_a_small_step_use_one_thread(name, two_threads, monkeypatch):
    """The loss's forward and the fused backward run inside the one-thread block; the values equal
    those of the same step on two threads."""
    seen = []
    real = intra_op.small_step_threads.__wrapped__

    def recording(*args, **kwargs):
        gen = real(*args, **kwargs)
        value = next(gen)
        seen.append(torch.get_num_threads())
        try:
            yield value
        finally:
            gen.close()

    g = torch.Generator().manual_seed(0)
    z = torch.randn(32, 16, generator=g)
    y = (torch.rand(32, 6, generator=g) < 0.4).float()
    loss = get_loss(name, **({"k_min": 2} if name == "hbl" else {}))
    if getattr(loss, "requires_label_statistics", False):
        loss.set_label_statistics(y)
    with monkeypatch.context() as m:  # the reference: every step on the caller's two threads
        m.setattr(intra_op, "SMALL_WORK", -1)
        zz = z.clone().requires_grad_(True)
        want = loss(zz, y)
        want.backward()
        want_grad = zz.grad.clone()

    patched = contextlib.contextmanager(recording)
    for module in ("hf_mlcl.losses.core", "hf_mlcl.losses.fused"):  # hbl steps through core's forward
        monkeypatch.setattr(f"{module}.small_step_threads", patched)
    zz = z.clone().requires_grad_(True)
    got = loss(zz, y)
    got.backward()
    assert len(seen) >= 2 and set(seen) == {1}  # forward and backward blocks, each on one thread
    assert torch.get_num_threads() == 2
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(zz.grad, want_grad, rtol=1e-5, atol=1e-7)
