"""ABALONE L_MSC (msc): vectorised loss vs a plain-loop transcription of eqs. (1)-(5)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from hf_mlcl.losses import get_loss
from hf_mlcl.losses.msc import MSCLoss


def random_batch(n=10, k=7, num_labels=6, dim=8, seed=0, keys=True):
    """Labels with repeated sets, empty rows and single-label rows (dense float)."""
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, num_labels, generator=g) < 0.35).float()
    y[0] = 0  # empty row
    y[1] = 0
    y[1, 2] = 1  # single label
    y[2] = y[3]  # repeated set
    z = torch.randn(n, dim, generator=g, dtype=torch.float64)
    if not keys:
        return z, y, None, None
    yk = (torch.rand(k, num_labels, generator=g) < 0.35).float()
    yk[0] = y[3]
    yk[1] = 0
    kz = torch.randn(k, dim, generator=g, dtype=torch.float64)
    return z, y, kz, yk


def msc_reference(z, y, kz, yk, protos, beta, tau, anchors_in_candidates=True, alpha=1.0):
    """Eq. (2)-(5) with plain Python loops (float64); ``alpha`` as the authors' released code: alpha f in
    the sample positives' numerator and in N(i,j) = 1 + alpha sum f (prototype term and denominator as is)."""
    z = F.normalize(z.double(), dim=1)
    c = F.normalize(protos.detach().double(), dim=1)
    # the anchors are candidates of each other (self excluded), or (the "keys" set) only the keys are
    cands = [(a, z[a], set(torch.nonzero(y[a]).flatten().tolist())) for a in range(len(z))]
    cands = cands if anchors_in_candidates else []
    if kz is not None:
        kzn = F.normalize(kz.double(), dim=1)
        cands += [(len(z) + b, kzn[b], set(torch.nonzero(yk[b]).flatten().tolist())) for b in range(len(kz))]
    losses = []
    for i in range(len(z)):
        s_set = set(torch.nonzero(y[i]).flatten().tolist())
        if not s_set:
            continue
        others = [(a, v, t) for (a, v, t) in cands if a != i]
        denom = sum(beta * math.exp(float(z[i] @ v) / tau) for (_, v, _) in others)
        denom += sum(math.exp(float(z[i] @ c[j]) / tau) for j in range(len(c)))
        total = 0.0
        for j in sorted(s_set):
            pos = [(v, t) for (_, v, t) in others if j in t]
            n_ij = 1.0 + sum(alpha / len(s_set | t) for (_, t) in pos)
            inner = sum(
                (alpha / len(s_set | t)) * (float(z[i] @ v) / tau - math.log(denom)) for (v, t) in pos
            )
            inner += float(z[i] @ c[j]) / tau - math.log(denom)
            total += inner / n_ij
        losses.append(-total / len(s_set))
    return sum(losses) / len(losses)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("layout", ["dense", "coo", "csr", "bool"])
@pytest.mark.parametrize("seed", [0, 1])
def test_msc_matches_loop_reference(keys, layout, seed):
    z, y, kz, yk = random_batch(seed=seed, keys=keys)
    loss_fn = MSCLoss(num_labels=y.shape[1], embedding_dim=z.shape[1], beta=0.1).double()
    ref = msc_reference(z, y, kz, yk, loss_fn.prototypes, 0.1, 0.1)

    def conv(t):
        if t is None:
            return None
        return {"dense": t, "coo": t.to_sparse(), "csr": t.to_sparse_csr(), "bool": t.bool()}[layout]

    out = loss_fn(z, conv(y), kz, conv(yk))
    assert out.item() == pytest.approx(ref, rel=1e-5)
    assert loss_fn.components(z, conv(y), kz, conv(yk))["loss"].item() == pytest.approx(ref, rel=1e-5)


def test_msc_float32_matches_reference_and_other_beta():
    z, y, kz, yk = random_batch(seed=3)
    loss_fn = get_loss("msc", num_labels=y.shape[1], embedding_dim=z.shape[1], beta=0.5, temperature=0.2)
    ref = msc_reference(z, y, kz, yk, loss_fn.prototypes, 0.5, 0.2)
    out = loss_fn(z.float(), y, kz.float(), yk)
    assert out.dtype == torch.float32
    assert out.item() == pytest.approx(ref, rel=1e-5)


def test_msc_prototypes_receive_gradients_and_are_normalised():
    z, y, kz, yk = random_batch(seed=4)
    loss_fn = MSCLoss(num_labels=y.shape[1], embedding_dim=z.shape[1])
    assert loss_fn.temperature == 0.1 and loss_fn.beta == 0.1
    zz = z.float().requires_grad_(True)
    loss = loss_fn(zz, y.to_sparse(), kz.float(), yk.to_sparse())
    loss.backward()
    g = loss_fn.prototypes.grad
    assert g is not None and torch.isfinite(g).all() and g.abs().sum() > 0
    assert torch.isfinite(zz.grad).all() and zz.grad.abs().sum() > 0
    # scaling a prototype does not change the loss (L2-normalised before use)
    with torch.no_grad():
        before = loss_fn(z.float(), y).item()
        loss_fn.prototypes[2].mul_(7.0)
        after = loss_fn(z.float(), y).item()
    assert after == pytest.approx(before, rel=1e-5)
    assert "prototypes" in loss_fn.state_dict()
    assert sum(p.numel() for p in loss_fn.parameters()) == y.shape[1] * z.shape[1]


def test_msc_degenerate_batches_never_nan():
    loss_fn = MSCLoss(num_labels=4, embedding_dim=3)
    z = torch.randn(5, 3, requires_grad=True)
    # all empty label sets -> zero still connected to the graph
    out = loss_fn(z, torch.zeros(5, 4))
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(z.grad).all()
    # a single anchor, no keys: the contrast set is only the prototypes
    z1 = torch.randn(1, 3, requires_grad=True)
    y1 = torch.tensor([[0.0, 1.0, 1.0, 0.0]])
    out = loss_fn(z1, y1)
    out.backward()
    assert torch.isfinite(out) and torch.isfinite(z1.grad).all()
    ref = msc_reference(z1.detach().double(), y1, None, None, loss_fn.prototypes, 0.1, 0.1)
    assert out.item() == pytest.approx(ref, rel=1e-5)


def test_msc_bad_sizes_raise():
    loss_fn = MSCLoss(num_labels=4, embedding_dim=3)
    with pytest.raises(ValueError, match="num_labels"):
        loss_fn(torch.randn(4, 3), torch.ones(4, 5))
    with pytest.raises(ValueError, match="embedding_dim"):
        loss_fn(torch.randn(4, 6), torch.ones(4, 4))
    with pytest.raises(ValueError, match="num_labels"):
        MSCLoss(num_labels=0, embedding_dim=3)
    with pytest.raises(ValueError, match="beta"):
        MSCLoss(num_labels=3, embedding_dim=3, beta=0.0)


def _authors_alpha_reference(z, y, kz, yk, protos, alpha, beta, tau):
    """A transcription of how the authors' released msc code builds its weights for one anchor set
    (an (N, M, L) tensor, kept in the test only): per shared label c, alpha / |S u T| for every pair
    including the anchor itself, the normaliser summed over the candidates and corrected by
    1 - alpha / |S| (removes the anchor's own entry, adds the prototype's 1), the anchor's own column
    masked out of both the weights and the denominator; then / |S| and the mean over anchors with a label."""
    zn = F.normalize(z.double(), dim=1)
    c = F.normalize(protos.detach().double(), dim=1)
    yq = y.double()
    cand_z = zn if kz is None else torch.cat([zn, F.normalize(kz.double(), dim=1)])
    cand_y = yq if yk is None else torch.cat([yq, yk.double()])
    n, m, L = len(zn), len(cand_z), y.shape[1]
    union = (yq[:, None, :] + cand_y[None, :, :]).clamp_max(1).sum(-1).clamp_min(1)  # (N, M)
    per_label = yq[:, None, :] * cand_y[None, :, :] / union[..., None] * alpha  # (N, M, L)
    norm = per_label.sum(1) + (1 - alpha / yq.sum(1, keepdim=True).clamp_min(1)) * yq  # (N, L)
    w_samples = (per_label / (norm[:, None, :] + (norm[:, None, :] == 0))).sum(-1)  # (N, M)
    w_protos = yq / (norm + (norm == 0))
    w = torch.cat([w_samples, w_protos], dim=1)
    keep = torch.ones(n, m + L, dtype=torch.float64)
    keep[torch.arange(n), torch.arange(n)] = 0
    w = w * keep
    logits = torch.cat([zn @ cand_z.T, zn @ c.T], dim=1) / tau
    d = (
        torch.cat([torch.full((m,), beta, dtype=torch.float64), torch.ones(L, dtype=torch.float64)])[None, :]
        * keep
    )
    logp = logits - torch.log((d * logits.exp()).sum(1, keepdim=True))
    per_anchor = -(w * logp).sum(1) / yq.sum(1).clamp_min(1)
    has = yq.sum(1) > 0
    return float(per_anchor[has].mean())


@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("keys", [False, True])
def test_msc_alpha_matches_the_loop_and_the_authors_weights(alpha, keys):
    """alpha scales f in the sample positives' weights and in N(i,j): the plain loop, the authors' tensor
    construction and the vectorised loss agree (values and prototype gradients); alpha 1 is the paper's
    loss, alpha 0 attracts to the prototypes alone (the value depends on no positive sample's similarity)."""
    z, y, kz, yk = random_batch(seed=3, keys=keys)
    loss_fn = MSCLoss(num_labels=y.shape[1], embedding_dim=z.shape[1], alpha=alpha).double()
    ref = msc_reference(z, y, kz, yk, loss_fn.prototypes, 0.1, 0.1, alpha=alpha)
    authors = _authors_alpha_reference(z, y, kz, yk, loss_fn.prototypes, alpha, 0.1, 0.1)
    assert ref == pytest.approx(authors, rel=1e-10)
    zz = z.clone().requires_grad_()
    out = loss_fn(zz, y, kz, yk)
    assert out.item() == pytest.approx(ref, rel=1e-9)
    out.backward()
    protos = loss_fn.prototypes.detach().clone().requires_grad_()
    zr = z.clone().requires_grad_()

    def torch_reference():  # the loop's formula with autograd (float64) for the gradients
        zn, c = F.normalize(zr, dim=1), F.normalize(protos, dim=1)
        cand = zn if kz is None else torch.cat([zn, F.normalize(kz, dim=1)])
        cy = y if yk is None else torch.cat([y, yk])
        total, count = 0.0, 0
        for i in range(len(zn)):
            s_set = set(torch.nonzero(y[i]).flatten().tolist())
            if not s_set:
                continue
            others = [a for a in range(len(cand)) if a != i]
            sims = cand[others] @ zn[i] / 0.1
            lse = torch.logsumexp(torch.cat([sims + math.log(0.1), c @ zn[i] / 0.1]), 0)
            row = 0.0
            for j in sorted(s_set):
                pos = [(k, a) for k, a in enumerate(others) if cy[a, j] > 0]
                f = [alpha / len(s_set | set(torch.nonzero(cy[a]).flatten().tolist())) for _, a in pos]
                n_ij = 1.0 + sum(f)
                inner = sum(fk * (sims[k] - lse) for fk, (k, _) in zip(f, pos)) + (c[j] @ zn[i] / 0.1 - lse)
                row = row + inner / n_ij
            total, count = total - row / len(s_set), count + 1
        return total / count

    torch_reference().backward()
    torch.testing.assert_close(zz.grad, zr.grad, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(loss_fn.prototypes.grad, protos.grad, rtol=1e-9, atol=1e-12)
    if alpha == 0.0:  # prototype-only attraction: -1/|S| sum_j log p(c_j), samples in the denominator only
        with torch.no_grad():
            zn, c = F.normalize(z, dim=1), F.normalize(loss_fn.prototypes, dim=1)
            cand = zn if kz is None else torch.cat([zn, F.normalize(kz, dim=1)])
            sims = zn @ cand.T / 0.1
            sims[torch.arange(len(zn)), torch.arange(len(zn))] = -math.inf
            lse = torch.logaddexp(
                torch.logsumexp(sims, 1) + math.log(0.1), torch.logsumexp(zn @ c.T / 0.1, 1)
            )
            per = -((zn @ c.T / 0.1 - lse[:, None]) * y).sum(1) / y.sum(1).clamp_min(1)
        assert out.item() == pytest.approx(float(per[y.sum(1) > 0].mean()), rel=1e-9)


def test_msc_alpha_default_is_the_paper_and_bad_values_fail():
    assert MSCLoss(num_labels=3, embedding_dim=4).alpha == 1.0
    for bad in (-0.1, 1.5, True, "0"):
        with pytest.raises(ValueError, match="0 <= alpha <= 1"):
            MSCLoss(num_labels=3, embedding_dim=4, alpha=bad)
