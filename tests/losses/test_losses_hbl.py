"""HBL (Chen et al.): vectorised regulariser vs a plain-loop transcription of eqs. (3)-(7)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import hf_mlcl.losses.hbl as hbl_module
from hf_mlcl.labels import relations as R
from hf_mlcl.losses import get_loss
from hf_mlcl.losses.hbl import HBLLoss, hbl_median_thresholds, hbl_soft_positives

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def random_batch(n=14, k=20, num_labels=5, dim=6, seed=0, keys=True):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, num_labels, generator=g) < 0.4).float()
    y[0] = 0  # empty
    y[1] = 0
    y[1, 0] = 1  # single label
    y[2] = y[3]  # repeated
    z = torch.randn(n, dim, generator=g, dtype=torch.float64)
    if not keys:
        return z, y, None, None
    yk = (torch.rand(k, num_labels, generator=g) < 0.4).float()
    yk[0] = y[3]
    kz = torch.randn(k, dim, generator=g, dtype=torch.float64)
    return z, y, kz, yk


def hbl_reference(z, y, kz, yk, gamma, m_rel, m_abs, k_min, anchors_in_candidates=True):
    """mean_i L_HBL_i with loops and numpy.median (eqs. 3-6)."""
    z = F.normalize(z.double(), dim=1)
    # the anchors are candidates of each other (self excluded), or (the "keys" set) only the keys are
    cands = [(a, z[a], set(torch.nonzero(y[a]).flatten().tolist())) for a in range(len(z))]
    cands = cands if anchors_in_candidates else []
    if kz is not None:
        kzn = F.normalize(kz.double(), dim=1)
        cands += [(len(z) + b, kzn[b], set(torch.nonzero(yk[b]).flatten().tolist())) for b in range(len(kz))]
    total = 0.0
    for i in range(len(z)):
        s_set = set(torch.nonzero(y[i]).flatten().tolist())
        pos, neg = [], []
        for a, v, t in cands:
            if a == i:
                continue
            sim = float(z[i] @ v)
            if s_set & t:
                pos.append((len(s_set & t) / len(s_set | t), sim))
            else:
                neg.append(sim)
        if len(pos) < k_min or not pos:
            continue
        theta = float(np.median([j for j, _ in pos]))
        soft = [s for j, s in pos if j >= theta]
        hard = [s for j, s in pos if j < theta]
        if not soft or not hard:
            continue
        l_rel = max(0.0, max(hard) - min(soft) + m_rel)
        l_abs = max(0.0, max(neg) - min(hard) + m_abs) if neg else 0.0
        total += l_rel + gamma * l_abs
    return total / len(z)


def test_median_thresholds_numpy_semantics_even_and_odd():
    g = torch.Generator().manual_seed(0)
    jac = torch.randint(0, 6, (30, 11), generator=g).double() / 5
    pos = torch.rand(30, 11, generator=g) < 0.5
    pos[0] = False
    pos[1] = False
    pos[1, :4] = True  # even count
    theta, n_pos = hbl_median_thresholds(jac, pos)
    for i in range(30):
        vals = jac[i][pos[i]].numpy()
        if len(vals) == 0:
            assert theta[i] == float("inf")
        else:
            assert theta[i].item() == pytest.approx(float(np.median(vals)), abs=1e-12)
    # even count, the two middle values differ -> their mean (not the lower / upper median)
    jac2 = torch.tensor([[0.25, 1.0, 0.5, 1.0, 0.9]])
    pos2 = torch.tensor([[True, True, True, True, False]])
    theta2, _ = hbl_median_thresholds(jac2, pos2)
    assert theta2.item() == pytest.approx(0.75)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_median_thresholds_selection_equals_sorted_middle_values(dtype):
    """The kthvalue selection returns exactly the sorted positives' middle values (mean of the two
    for an even count): many ties, rows with no / one / all positives, widths 1 to 40."""
    g = torch.Generator().manual_seed(3)
    for width in (1, 2, 3, 7, 16, 40):
        for density in (0.0, 0.1, 0.5, 0.9, 1.0):
            jac = (torch.randint(0, 4, (25, width), generator=g).to(dtype) / 3).to(dtype)
            pos = torch.rand(25, width, generator=g) < density
            pos[0] = True
            pos[1] = False
            theta, n_pos = hbl_median_thresholds(jac, pos)
            assert theta.dtype == dtype
            for i in range(25):
                vals = jac[i][pos[i]].sort().values
                n = len(vals)
                assert int(n_pos[i]) == n
                if n == 0:
                    assert theta[i] == float("inf")
                else:
                    assert theta[i] == (vals[(n - 1) // 2] + vals[n // 2]) / 2, (width, density, i)


def _label_counts(n, m, num_labels, density, g, dtype):
    """inter, sizes and positives of random multi-hot rows (many ties, empty rows, self columns)."""
    ya = (torch.rand(n, num_labels, generator=g) < density).to(dtype)
    yc = torch.cat([ya, (torch.rand(m - n, num_labels, generator=g) < density).to(dtype)])
    ya[0] = 0  # an anchor without labels: no positive
    inter = ya @ yc.T
    positive = inter > 0
    positive.diagonal().fill_(False)  # the anchor's own column is outside the contrast set
    return inter, (ya.sum(dim=1), yc.sum(dim=1)), positive


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape", [(3, 40, 4), (12, 60, 6), (25, 300, 9)])
@pytest.mark.parametrize("density", [0.15, 0.5, 0.9])
def test_fraction_histogram_equals_the_selection(dtype, shape, density):
    """The exact-fraction histogram gives bit-identical theta, abs(P) and soft sets to the kthvalue
    selection over the Jaccard matrix (which test_median_thresholds_* checks against numpy)."""
    n, m, num_labels = shape
    g = torch.Generator().manual_seed(n * 100 + int(density * 10))
    inter, sizes, positive = _label_counts(n, m, num_labels, density, g, dtype)
    counted = hbl_module._counted_soft_positives(inter, *sizes, positive)
    assert counted is not None  # these label sets are small enough for the histogram
    jac = R.jaccard(*sizes, inter)
    theta, n_pos = hbl_median_thresholds(jac, positive)
    soft = positive & (jac >= theta[:, None])
    assert counted[1].dtype == dtype
    assert torch.equal(counted[1], theta) and torch.equal(counted[2], n_pos)
    assert torch.equal(counted[0], soft)
    assert bool((n_pos == 0).any())  # the row without labels is covered
    # the public entry point takes the same route and agrees with the Jaccard-only call
    for got in (
        hbl_soft_positives(positive, inter=inter, label_sizes=sizes),
        hbl_soft_positives(positive, jac),
    ):
        assert torch.equal(got[0], soft) and torch.equal(got[1], theta)


def test_fraction_histogram_declined_for_large_label_sets():
    """A histogram larger than four times the row width falls back to the selection (same result)."""
    g = torch.Generator().manual_seed(5)
    inter, sizes, positive = _label_counts(6, 20, 40, 0.6, g, torch.float32)
    assert (int(sizes[0].max()) + int(sizes[1].max())) ** 2 > 4 * 20
    assert hbl_module._counted_soft_positives(inter, *sizes, positive) is None
    soft, theta, _ = hbl_soft_positives(positive, inter=inter, label_sizes=sizes)
    jac = R.jaccard(*sizes, inter)
    assert torch.equal(theta, hbl_median_thresholds(jac, positive)[0])
    assert torch.equal(soft, positive & (jac >= theta[:, None]))
    with pytest.raises(ValueError, match="needs jaccard"):
        hbl_soft_positives(positive)


@pytest.mark.parametrize("keys", [False, True])
def test_hbl_loss_same_with_and_without_fraction_histogram(monkeypatch, keys):
    """The loss and its gradient are bit-identical whichever route splits soft / hard positives."""
    z, y, kz, yk = random_batch(n=24, k=60, num_labels=5, seed=4, keys=keys)
    loss_fn = get_loss("hbl", base="mulsupcon", lambda_=0.5, k_min=3)
    used = []
    counted = hbl_module._counted_soft_positives

    def spy(*args):
        out = counted(*args)
        used.append(out is not None)
        return out

    def run():
        zz = z.clone().requires_grad_(True)
        comps = loss_fn.components(zz, y, kz, yk)
        comps["loss"].backward()
        return comps["loss"].detach(), zz.grad, comps["hbl"]

    monkeypatch.setattr(hbl_module, "_counted_soft_positives", spy)
    with_hist = run()
    monkeypatch.setattr(hbl_module, "_counted_soft_positives", lambda *args: None)
    without = run()
    assert used == [True]
    assert with_hist[2] > 0  # the structural term is active
    assert torch.equal(with_hist[0], without[0]) and torch.equal(with_hist[1], without[1])


@pytest.mark.parametrize("keys", [False, True])
def test_hbl_reads_the_intersections_mulsupcon_computed(monkeypatch, keys):
    """With sparse labels the MulSupCon base hands its by-product intersections to the shared context:
    no separate intersection product, and the loss and gradient are the same bits as without sharing."""
    z, y, kz, yk = random_batch(n=20, k=30, num_labels=6, seed=7, keys=keys)
    ys, yks = y.to_sparse(), None if yk is None else yk.to_sparse()
    loss_fn = get_loss("hbl", base="mulsupcon", lambda_=0.5, k_min=3)
    calls = []
    separate = R.intersections

    def counted(*args):
        calls.append(1)
        return separate(*args)

    monkeypatch.setattr(R, "intersections", counted)

    def run():
        zz = z.clone().requires_grad_(True)
        comps = loss_fn.components(zz, ys, kz, yks)
        comps["loss"].backward()
        return comps["loss"].detach(), zz.grad, comps["hbl"]

    shared = run()
    assert calls == []  # the intersections came with the base's weights
    monkeypatch.setattr(hbl_module.ContrastContext, "provide_intersections", lambda self, inter: None)
    alone = run()
    assert len(calls) == 1  # without sharing the context computes them itself
    assert shared[2] > 0
    assert torch.equal(shared[0], alone[0]) and torch.equal(shared[1], alone[1])


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("layout", ["dense", "coo", "csr"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_hbl_matches_loop_reference(keys, layout, seed):
    z, y, kz, yk = random_batch(seed=seed, keys=keys)
    conv = {"dense": lambda t: t, "coo": lambda t: t.to_sparse(), "csr": lambda t: t.to_sparse_csr()}[layout]
    loss_fn = get_loss("hbl", base="mulsupcon", lambda_=0.5, gamma=0.8, m_rel=0.1, m_abs=0.3, k_min=3)
    base_fn = get_loss("mulsupcon")
    comps = loss_fn.components(z, conv(y), kz, None if yk is None else conv(yk))
    out = comps["loss"]
    base = base_fn(z, y, kz, yk).item()
    ref = hbl_reference(z, y, kz, yk, 0.8, 0.1, 0.3, 3)
    assert ref > 0
    assert comps["hbl"] == pytest.approx(ref, rel=1e-5)
    assert comps["base"] == pytest.approx(base, rel=1e-9)
    assert out.item() == pytest.approx(base + 0.5 * ref, rel=1e-5)
    assert set(comps) >= {"loss", "base", "hbl"}


def test_hbl_gradients_match_autograd_through_max_min():
    """The gathered-pair gradient equals differentiating the masked max / min directly."""
    z, y, kz, yk = random_batch(seed=7)
    z1 = z.clone().requires_grad_(True)
    loss_fn = HBLLoss(base="any", lambda_=1.0, k_min=2)
    loss_fn(z1, y, kz, yk).backward()
    z2 = z.clone().requires_grad_(True)
    base = get_loss("any")(z2, y, kz, yk)
    # direct (non-vectorised) HBL with autograd through torch max / min
    zn = F.normalize(z2, dim=1)
    cn = torch.cat([zn, F.normalize(kz, dim=1)])
    yc = torch.cat([y, yk])
    total = 0.0
    for i in range(len(z)):
        inter = (y[i][None] * yc).sum(1)
        union = ((y[i][None] + yc) > 0).sum(1)
        mask = torch.ones(len(yc), dtype=torch.bool)
        mask[i] = False
        pos = (inter > 0) & mask
        neg = (inter == 0) & mask
        if pos.sum() < 2:
            continue
        jac = inter / union.clamp_min(1)
        theta = float(np.median(jac[pos].numpy()))
        soft = pos & (jac >= theta)
        hard = pos & (jac < theta)
        if not soft.any() or not hard.any():
            continue
        sim = cn @ zn[i]
        l_rel = torch.relu(sim[hard].max() - sim[soft].min() + 0.1)
        l_abs = torch.relu(sim[neg].max() - sim[hard].min() + 0.3) if neg.any() else 0.0
        total = total + l_rel + 0.8 * l_abs
    (base + total / len(z)).backward()
    assert torch.allclose(z1.grad, z2.grad, atol=1e-10)


def test_hbl_gate_closed_equals_base_exactly():
    z, y, kz, yk = random_batch(seed=3)
    for base in ("mulsupcon", "any", "jaccard"):
        loss_fn = get_loss("hbl", base=base)  # k_min = 128 > number of positives
        comps = loss_fn.components(z, y, kz, yk)
        out = comps["loss"]
        ref = get_loss(base)(z, y, kz, yk)
        assert comps["hbl"] == 0.0
        assert torch.equal(out, ref)


@pytest.mark.parametrize("keys", [True, False])
def test_a_contrast_set_smaller_than_k_min_skips_the_term_on_the_accelerator_path(monkeypatch, keys):
    """The gate counts positives among the contrast set, so a set of fewer than k_min members (N - 1 + K,
    from the shapes) closes every gate: on the accelerator path too (no value is read there), the
    structural term is not computed and the loss is the base's; from k_min members on it is computed."""
    from hf_mlcl.host_sync import HostSyncCounter
    from hf_mlcl.labels.host_reads import accelerator_path
    from hf_mlcl.losses.input_checks import set_input_checks

    z, y, kz, yk = random_batch(seed=3, keys=keys)
    size = len(z) - 1 + (len(kz) if keys else 0)
    called = []
    real = hbl_module.hbl_per_anchor
    monkeypatch.setattr(hbl_module, "hbl_per_anchor", lambda *a, **k: called.append(1) or real(*a, **k))
    loss = get_loss("hbl", k_min=size + 1)
    set_input_checks(loss, False)  # as after the first batch: the checks are the only other host reads
    with accelerator_path(), HostSyncCounter() as counter:  # the host-read shortcut is off
        comps = loss.components(z, y, kz, yk)
    assert counter.count == 0 and called == []
    assert comps["hbl"] == 0.0 and comps["gate_open"] == 0.0
    assert torch.equal(comps["loss"], get_loss("mulsupcon")(z, y, kz, yk))
    with accelerator_path(), HostSyncCounter():
        get_loss("hbl", k_min=size).components(z, y, kz, yk)
    assert called == [1]


def test_hbl_gate_requires_soft_and_hard():
    # every positive has the same Jaccard -> hard set empty -> gate closed even with k_min = 1
    y = torch.tensor([[1.0, 0.0]] * 4 + [[0.0, 1.0]] * 2)
    z = torch.randn(6, 4, dtype=torch.float64)
    loss_fn = get_loss("hbl", base="any", k_min=1, lambda_=1.0)
    assert loss_fn.components(z, y)["hbl"] == 0.0


def test_hbl_defaults_wrapping_and_statistics():
    loss_fn = get_loss("hbl")
    assert (loss_fn.lambda_, loss_fn.gamma, loss_fn.m_rel, loss_fn.m_abs, loss_fn.k_min) == (
        0.01,
        0.8,
        0.1,
        0.3,
        128,
    )
    assert type(loss_fn.base).__name__ == "MulSupConLoss"
    assert loss_fn.requires_label_statistics is False
    # msc base: sizes forwarded, prototypes are parameters of the wrapper
    wrapped = get_loss("hbl", base="msc", num_labels=5, embedding_dim=6, temperature=0.2, k_min=2)
    assert wrapped.base.temperature == 0.2 and wrapped.base.num_labels == 5
    assert any(name.endswith("prototypes") for name, _ in wrapped.named_parameters())
    z, y, kz, yk = random_batch(seed=2)
    out = wrapped(z.float().requires_grad_(True), y, kz.float(), yk)
    out.backward()
    assert wrapped.base.prototypes.grad is not None
    # ws base: statistics are forwarded
    ws = get_loss("hbl", base="ws_mulsupcon", base_kwargs={"lambda_": 0.5}, k_min=2)
    assert ws.requires_label_statistics is True
    with pytest.raises(ValueError, match="set_label_statistics"):
        ws(z, y)
    ws.set_label_statistics(y)
    assert torch.isfinite(ws(z, y, kz, yk))
    with pytest.raises(ValueError, match="wrap itself"):
        get_loss("hbl", base="hbl")
    with pytest.raises(ValueError, match="unknown loss"):
        get_loss("hbl", base="nope")
    with pytest.raises(ValueError, match="k_min"):
        get_loss("hbl", k_min=-1)


def test_hbl_never_nan_degenerate():
    loss_fn = get_loss("hbl", base="mulsupcon", k_min=0, lambda_=1.0)
    z = torch.randn(3, 4, requires_grad=True)
    for y in (torch.zeros(3, 5), torch.ones(3, 5)):
        out = loss_fn(z, y)
        (g,) = torch.autograd.grad(out, z)
        assert torch.isfinite(out) and torch.isfinite(g).all()


def test_a_base_module_keeps_its_settings_and_a_different_one_is_an_error():
    """HBL computes with its base's temperature and normalisation: given a module, a different value is refused
    (it was ignored), the same or none is fine."""
    from hf_mlcl.losses import MulSupConLoss

    base = MulSupConLoss(normalize=False)
    assert HBLLoss(base=base).normalize is False and HBLLoss(base=base, temperature=base.temperature)
    with pytest.raises(
        ValueError, match=r"temperature=0.5 \(the base has 0.1\), normalize=True \(the base has False\)"
    ):
        HBLLoss(base=base, temperature=0.5, normalize=True)
    assert HBLLoss(base="mulsupcon", normalize=False).base.normalize is False  # a name: built with them
