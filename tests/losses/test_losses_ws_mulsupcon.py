"""ws-MulSupCon: vectorised loss vs plain-loop transcriptions of eqs. (2)-(9) and of the authors' code."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from hf_mlcl.labels.statistics import ws_class_weights
from hf_mlcl.losses import get_loss
from hf_mlcl.losses.ws_mulsupcon import WSMulSupConLoss

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")


def random_batch(n=12, k=9, num_labels=5, dim=6, seed=0, keys=True):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, num_labels, generator=g) < 0.3).float()
    y[0] = 0  # healthy
    y[1] = 0  # healthy
    y[2] = 0
    y[2, 1] = 1  # single
    y[3] = y[2]  # repeated single
    y[4] = 0
    y[4, [1, 3]] = 1  # multi
    y[5] = y[4]  # repeated multi
    z = torch.randn(n, dim, generator=g, dtype=torch.float64)
    if not keys:
        return z, y, None, None
    yk = (torch.rand(k, num_labels, generator=g) < 0.3).float()
    yk[0] = 0
    yk[1] = y[4]
    yk[2] = 0
    yk[2, 3] = 1
    kz = torch.randn(k, dim, generator=g, dtype=torch.float64)
    return z, y, kz, yk


def _prepare(z, y, kz, yk, anchors_in_candidates=True):
    z = F.normalize(z.double(), dim=1)
    # the anchors are candidates of each other (self excluded), or (the "keys" set) only the keys are
    cands = [(a, z[a], set(torch.nonzero(y[a]).flatten().tolist())) for a in range(len(z))]
    cands = cands if anchors_in_candidates else []
    if kz is not None:
        kzn = F.normalize(kz.double(), dim=1)
        cands += [(len(z) + b, kzn[b], set(torch.nonzero(yk[b]).flatten().tolist())) for b in range(len(kz))]
    return z, cands


def ws_paper_reference(z, y, kz, yk, dbar, cbar, lam, tau, anchors_in_candidates=True):
    """Eqs. (6)-(9) with loops: one softmax over the whole contrast set."""
    z, cands = _prepare(z, y, kz, yk, anchors_in_candidates)
    ws_total, ws_pairs, wm_total, wm_pairs, h_total, h_count = 0.0, 0, 0.0, 0, 0.0, 0
    for i in range(len(z)):
        s_set = set(torch.nonzero(y[i]).flatten().tolist())
        others = [(v, t) for (a, v, t) in cands if a != i]
        lse = math.log(sum(math.exp(float(z[i] @ v) / tau) for (v, _) in others))

        def logp(v, i=i, lse=lse):
            return float(z[i] @ v) / tau - lse

        if not s_set:
            pos = [v for (v, t) in others if not t]
            if pos:
                h_total += -sum(logp(v) for v in pos) / len(pos)
                h_count += 1
            continue
        for j in sorted(s_set):
            w_j = dbar[j] if len(s_set) == 1 else cbar[j]
            p_s = [(v, t) for (v, t) in others if len(t) == 1 and j in t]
            p_m = [(v, t) for (v, t) in others if len(t) >= 2 and j in t]
            if not p_s and not p_m:
                continue
            term = 0.0
            for group in (p_s, p_m):
                if group:
                    term += -sum(w_j * len(s_set & t) / len(s_set | t) * logp(v) for (v, t) in group) / len(
                        group
                    )
            if len(s_set) == 1:
                ws_total += term
                ws_pairs += 1
            else:
                wm_total += term
                wm_pairs += 1
    l_ws = ws_total / ws_pairs if ws_pairs else 0.0
    l_wm = wm_total / wm_pairs if wm_pairs else 0.0
    l_h = h_total / h_count if h_count else 0.0
    return (1 - lam) * (l_ws + l_wm) + lam * l_h


def ws_authors_reference(z, y, kz, yk, single_w, mul_w, lam, tau):
    """The authors' code path (generate_output_MulSupCon_iwash + WeightedSupCon_sm_IoU_s) with loops."""
    z, cands = _prepare(z, y, kz, yk)
    rows = {"s2s": [], "s2m": [], "m2s": [], "m2m": []}
    h_rows = []
    for i in range(len(z)):
        s_set = set(torch.nonzero(y[i]).flatten().tolist())
        others = [(v, t) for (a, v, t) in cands if a != i]
        ref_single = [(v, t) for (v, t) in others if len(t) <= 1]
        ref_multi = [(v, t) for (v, t) in others if len(t) > 1] + [(v, t) for (v, t) in others if len(t) == 0]

        def log_softmax(v, group, i=i):
            return float(z[i] @ v) / tau - math.log(sum(math.exp(float(z[i] @ u) / tau) for (u, _) in group))

        if not s_set:
            pos = [v for (v, t) in others if not t]
            if pos:
                h_rows.append(-sum(log_softmax(v, others) for v in pos) / len(pos))
            continue
        tag = "s" if len(s_set) == 1 else "m"
        for j in sorted(s_set):
            w_j = single_w[j] if tag == "s" else mul_w[j]
            for ref_tag, group in (("s", ref_single), ("m", ref_multi)):
                pos = [(v, t) for (v, t) in group if j in t]
                if not pos:
                    continue  # rows without positives are dropped by the authors' code
                val = -sum(
                    log_softmax(v, group) * (len(s_set & t) / len(s_set | t)) * w_j for (v, t) in pos
                ) / len(pos)
                rows[f"{tag}2{ref_tag}"].append(val)
    disease = sum(sum(r) / len(r) for r in rows.values() if r)
    if h_rows:
        return (1 - lam) * disease + lam * sum(h_rows) / len(h_rows)
    return disease


def _layout(t, layout):
    if t is None:
        return None
    return {"dense": t, "coo": t.to_sparse(), "csr": t.to_sparse_csr(), "bool": t.bool()}[layout]


TRAIN = torch.tensor(
    [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 1, 1, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0],
        [1, 0, 1, 0, 0],
        [0, 0, 0, 0, 1],
    ],
    dtype=torch.float32,
)


def test_class_weight_helper_hand_computed():
    single_w, multi_w = ws_class_weights(TRAIN)
    # d = [3, 2, 2, 2, 1], D = 10 -> (D - d) / D
    assert torch.allclose(single_w, torch.tensor([0.7, 0.8, 0.8, 0.8, 0.9]))
    # multi cases: rows 1 ({0,1}), 2 ({1,2,3}), 5 ({0,2})
    # M = [2, 2, 2, 1, 0]; C = [1+1, 1+2, 2+1, 2, 0] -> M/C = [1, 2/3, 2/3, 1/2], label 4 -> 1 (never multi)
    assert torch.allclose(multi_w, torch.tensor([1.0, 2 / 3, 2 / 3, 0.5, 1.0]))
    a_single, a_multi = ws_class_weights(TRAIN.to_sparse_csr(), authors_code=True)
    assert torch.allclose(a_single, single_w)
    # authors: m = [2, 2, 2, 1, 0], M = 7 -> (M - m) / M
    assert torch.allclose(a_multi, torch.tensor([5 / 7, 5 / 7, 5 / 7, 6 / 7, 1.0]))
    # sparse COO / bool input gives the same numbers
    s2, m2 = ws_class_weights(TRAIN.bool().to_sparse())
    assert torch.allclose(s2, single_w) and torch.allclose(m2, multi_w)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("layout", ["dense", "coo", "csr", "bool"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ws_paper_matches_loop_reference(keys, layout, seed):
    z, y, kz, yk = random_batch(seed=seed, keys=keys)
    loss_fn = WSMulSupConLoss()
    loss_fn.set_label_statistics(_layout(TRAIN, layout))
    dbar, cbar = ws_class_weights(TRAIN)
    ref = ws_paper_reference(z, y, kz, yk, dbar.tolist(), cbar.tolist(), 0.7, 0.1)
    out = loss_fn(z, _layout(y, layout), kz, _layout(yk, layout))
    assert out.item() == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("keys", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ws_authors_code_matches_loop_reference_and_differs(keys, seed):
    z, y, kz, yk = random_batch(seed=seed, keys=keys)
    loss_fn = get_loss("ws_mulsupcon", authors_code=True, lambda_=0.75)
    loss_fn.set_label_statistics(TRAIN)
    sw, mw = ws_class_weights(TRAIN, authors_code=True)
    ref = ws_authors_reference(z, y, kz, yk, sw.tolist(), mw.tolist(), 0.75, 0.1)
    comps = loss_fn.components(z, y.to_sparse(), kz, None if yk is None else yk.to_sparse())
    out = comps["loss"]
    assert out.item() == pytest.approx(ref, rel=1e-5)
    assert {"loss", "ws", "wm", "h", "s2s", "s2m", "m2s", "m2m"} <= set(comps)
    paper = get_loss("ws_mulsupcon", lambda_=0.75)
    paper.set_label_statistics(TRAIN)
    assert abs(paper(z, y, kz, yk).item() - out.item()) > 1e-3


def test_ws_no_healthy_anchor_and_float32():
    z, y, kz, yk = random_batch(seed=5)
    keep = y.sum(1) > 0
    z, y = z[keep], y[keep]
    loss_fn = WSMulSupConLoss(lambda_=0.3, temperature=0.2)
    loss_fn.set_label_statistics(TRAIN)
    dbar, cbar = ws_class_weights(TRAIN)
    ref = ws_paper_reference(z, y, kz, yk, dbar.tolist(), cbar.tolist(), 0.3, 0.2)
    comps = loss_fn.components(z.float(), y, kz.float(), yk)
    out = comps["loss"]
    assert out.dtype == torch.float32 and out.item() == pytest.approx(ref, rel=1e-5)
    assert comps["h"] == 0.0


def test_ws_requires_statistics_and_unweighted_variant():
    z, y, kz, yk = random_batch(seed=1)
    loss_fn = WSMulSupConLoss()
    assert loss_fn.requires_label_statistics is True and WSMulSupConLoss.requires_label_statistics is True
    with pytest.raises(ValueError, match="set_label_statistics"):
        loss_fn(z, y)
    loss_fn.set_label_statistics(torch.ones(3, 7))
    with pytest.raises(ValueError, match="7 labels"):
        loss_fn(z, y)
    plain = WSMulSupConLoss(class_weights=False)
    assert plain.requires_label_statistics is False
    ones = [1.0] * y.shape[1]
    ref = ws_paper_reference(z, y, kz, yk, ones, ones, 0.7, 0.1)
    assert plain(z, y, kz, yk).item() == pytest.approx(ref, rel=1e-5)


def test_ws_gradients_finite_and_degenerate_batches():
    loss_fn = WSMulSupConLoss(class_weights=False)
    z = torch.randn(4, 3, requires_grad=True)
    for y in (torch.zeros(4, 5), torch.eye(4, 5), torch.ones(4, 5)):
        out = loss_fn(z, y)
        assert torch.isfinite(out)
        (g,) = torch.autograd.grad(out, z)
        assert torch.isfinite(g).all()
    # one anchor, nothing to contrast with -> connected zero
    z1 = torch.randn(1, 3, requires_grad=True)
    out = loss_fn(z1, torch.tensor([[1.0, 0, 0, 0, 0]]))
    assert out.item() == 0.0
    out.backward()
    assert torch.isfinite(z1.grad).all()


@pytest.mark.parametrize("sparse", [False, True])
def test_spread_by_candidate_equals_two_spreads_exactly(sparse):
    """The one-product spread (sparse (M, 2U) candidate matrix) is bitwise the two-spread formula."""
    from hf_mlcl.labels import multihot as M
    from hf_mlcl.labels import relations as R
    from hf_mlcl.labels.statistics import PairLabelView

    g = torch.Generator().manual_seed(5)
    ya = (torch.rand(9, 30, generator=g) < 0.2).double()
    yc = (torch.rand(14, 30, generator=g) < 0.2).double()
    yc[3] = 0  # a candidate without labels
    conv = (lambda t: M.as_multihot(t.to_sparse())) if sparse else M.as_multihot
    view = PairLabelView(conv(ya), conv(yc))
    qa = torch.rand(view.rows.numel(), generator=g, dtype=torch.float64)
    qb = torch.rand(view.rows.numel(), generator=g, dtype=torch.float64)
    use_b = R.label_sizes(conv(yc)) >= 2
    expected = torch.where(use_b[None, :], view.spread(qb), view.spread(qa))
    assert torch.equal(view.spread_by_candidate(qa, qb, use_b), expected)
    # the same product also yields the exact label intersections abs(S_i & T_a)
    spread, inter = view.spread_by_candidate_and_intersections(qa, qb, use_b)
    assert torch.equal(spread, expected)
    assert torch.equal(inter, R.intersections(conv(ya), conv(yc)).to(inter.dtype))
    assert torch.equal(inter, ya @ yc.T)


@pytest.mark.parametrize("keys", [False, True])
def test_ws_sparse_labels_match_dense_labels_float64(keys):
    """ws_mulsupcon (paper mode) on sparse labels (one-product spread) equals the dense-label path in
    value and gradient, float64."""
    g = torch.Generator().manual_seed(11)
    z = torch.randn(10, 6, generator=g, dtype=torch.float64)
    y = (torch.rand(10, 8, generator=g) < 0.3).double()
    y[0], y[1] = 0, 0
    y[2] = 0
    y[2, 1] = 1
    kz = torch.randn(7, 6, generator=g, dtype=torch.float64) if keys else None
    yk = (torch.rand(7, 8, generator=g) < 0.3).double() if keys else None
    loss = get_loss("ws_mulsupcon")
    loss.set_label_statistics(torch.cat([y, yk]) if keys else y)
    out = []
    for conv in (lambda t: t, lambda t: t.to_sparse()):
        zz = z.clone().requires_grad_(True)
        value = loss(zz, conv(y), kz, None if yk is None else conv(yk))
        value.backward()
        out.append((value.detach(), zz.grad))
    torch.testing.assert_close(out[1][0], out[0][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-12, atol=1e-12)
