"""No loss forward or backward reads a tensor value on the host once its input checks are off (what a GPU
training step needs: no device-to-host synchronisation), on the accelerator path (hf_mlcl.host_sync
simulates it on CPU tensors); the result is the same as with the checks and as on the CPU path; the
components are detached 0-d tensors; the checks themselves still raise, on the first call through
FirstCallChecks."""

from __future__ import annotations

import pytest
import torch
from test_losses_robustness import batch, make_loss

from hf_mlcl.host_sync import HostSyncCounter
from hf_mlcl.labels.host_reads import accelerator_path
from hf_mlcl.losses.input_checks import FirstCallChecks, set_input_checks
from hf_mlcl.losses.registry import list_contrastive_losses

L = 6
# every registered loss with its defaults (ws_mulsupcon with training-label statistics, hbl on mulsupcon
# with k_min=1 so that its gate opens), plus the options that take other code paths
VARIANTS = [(name, {}) for name in list_contrastive_losses()] + [
    ("hbl", {"base": "msc"}),
    ("hbl", {"base": "ws_mulsupcon"}),
    ("hbl", {"lambda_scaling": "eq7"}),
    ("hbl", {"k_min": 128}),  # no gate can open
    ("ws_mulsupcon", {"authors_code": True}),
    ("ws_mulsupcon", {"class_weights": False}),
    ("sd", {"weight_in_log": True}),
    ("mulsupcon", {"normalizer": "labels"}),
]
MODES = ["batch", "keys", "keys-only"]


def _run(loss, mode, z, y, zk, yk):
    """(loss value, input gradients and parameter gradients) of one forward + backward, and the loss's
    components."""
    loss.zero_grad()
    e, k = z.clone().requires_grad_(True), zk.clone().requires_grad_(True)
    if mode == "batch":
        comps = loss.components(e, y)
    elif mode == "keys":
        comps = loss.components(e, y, k, yk)
    else:
        comps = loss.components(e, y, k, yk, anchors_in_candidates=False)
    out = comps["loss"]
    out.backward()
    params = [p.grad.clone() for p in loss.parameters() if p.grad is not None]
    return (out.detach(), e.grad, k.grad, params), comps


def _same(a, b):
    for x, y in zip(a, b, strict=True):
        if isinstance(x, list):
            _same(x, y)
        elif x is None or y is None:
            assert x is None and y is None
        else:
            assert torch.equal(x, y)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(
    "name,kwargs", VARIANTS, ids=[f"{n}-{'-'.join(map(str, k.values())) or 'default'}" for n, k in VARIANTS]
)
def test_forward_and_backward_read_nothing_on_the_host(name, kwargs, mode):
    z, y = batch(12, L, seed=1)
    zk, yk = batch(6, L, seed=2)
    loss = make_loss(name, **kwargs)
    checked, _ = _run(loss, mode, z, y, zk, yk)  # the input checks on (default): the CPU path
    set_input_checks(loss, False)
    with accelerator_path(), HostSyncCounter() as counter:
        unchecked, comps = _run(loss, mode, z, y, zk, yk)
    assert counter.count == 0, counter.report()
    _same(checked, unchecked)  # bit for bit: the checks and the CPU shortcuts change nothing
    assert comps["loss"].item() == checked[0].item()
    for key, value in comps.items():  # the loss keeps its graph, the parts are detached
        assert (
            isinstance(value, torch.Tensor) and value.dim() == 0 and value.requires_grad == (key == "loss")
        ), key


@pytest.mark.parametrize("name", ["mulsupcon", "any", "jaccard", "sd"])
def test_a_wide_dense_label_space_reads_nothing_on_the_host(name):
    """Past COMPACT_MIN_LABELS columns the CPU drops the label columns no anchor carries before the pair
    product; the accelerator's path multiplies them all instead of reading which are used: the same loss."""
    from hf_mlcl.labels.multihot import COMPACT_MIN_LABELS

    width = COMPACT_MIN_LABELS + 76
    z, y = batch(12, width, seed=3)
    loss = make_loss(name)
    expected = loss(z, y)
    set_input_checks(loss, False)
    with accelerator_path(), HostSyncCounter() as counter:
        got = loss(z, y)
    assert counter.count == 0, counter.report()
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-7)


def test_the_input_checks_are_the_host_reads_and_still_raise():
    z, y = batch(8, L)
    loss = make_loss("sd")
    with accelerator_path(), HostSyncCounter() as counter:
        loss(z, y)
    sites = {site.rsplit(" ", 1)[-1] for _, site in counter.events}
    assert counter.count and sites <= {"(as_multihot)", "(components_on)"}, counter.report()
    bad = y.clone()
    bad[2, 1] = 2.0
    with pytest.raises(ValueError, match="binary"):
        loss(z, bad)
    nan = z.clone()
    nan[3, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loss(nan, y)
    set_input_checks(loss, False)
    assert not torch.isfinite(loss(nan, y))  # unchecked: the NaN reaches the value


def test_set_input_checks_reaches_a_wrapped_base_loss():
    hbl = make_loss("hbl", base="sd")
    set_input_checks(hbl, False)
    assert hbl.check_inputs is False and hbl.base.check_inputs is False


def test_first_call_checks_validate_the_first_batch_only():
    z, y = batch(8, L)
    bad = y.clone()
    bad[2, 1] = 2.0
    loss = make_loss("any")
    checks = FirstCallChecks(loss)
    assert checks.pending and not loss.check_inputs
    with pytest.raises(ValueError, match="binary"), checks():
        loss(z, bad)
    assert checks.pending and not loss.check_inputs  # a failed first batch is checked again next time
    with checks():
        first = loss(z, y)
    assert not checks.pending and not loss.check_inputs
    with accelerator_path(), HostSyncCounter() as counter, checks():
        again = loss(z, y)
    assert counter.count == 0 and torch.equal(first, again)
