"""Every registered loss under ``torch.compile``: the compiled module's value and gradients equal eager
mode's, in-batch and with keys, with the input checks off (how training runs after the first batch).

On a CPU the loss's small-step thread switch and the host-free shortcuts stay outside the compiled graphs
(graph breaks); the test asserts the numbers, which must not depend on where the graphs are cut."""

from __future__ import annotations

import pytest
import torch
from test_losses_robustness import batch, make_loss

from hf_mlcl.losses.input_checks import set_input_checks
from hf_mlcl.losses.registry import list_contrastive_losses


def _value_and_grads(fn, z, y, zk=None, yk=None):
    e = z.clone().requires_grad_(True)
    k = None if zk is None else zk.clone().requires_grad_(True)
    out = fn(e, y) if k is None else fn(e, y, k, yk)
    out.backward()
    return out.detach(), e.grad, None if k is None else k.grad


@pytest.mark.slow
@pytest.mark.parametrize("name", list_contrastive_losses())
def test_a_compiled_loss_gives_the_eager_value_and_gradients(name):
    torch._dynamo.reset()
    z, y = batch(16, seed=3)
    zk, yk = batch(8, seed=4)
    loss = make_loss(name)
    set_input_checks(loss, False)
    compiled = torch.compile(loss)
    for args in ((z, y), (z, y, zk, yk)):
        eager = _value_and_grads(loss, *args)
        got = _value_and_grads(compiled, *args)
        for a, b in zip(eager, got, strict=True):
            if a is None:
                assert b is None
            else:
                torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
