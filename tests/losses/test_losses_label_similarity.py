"""``label_similarity`` of the weighted SupCon family (``jaccard`` / L_Base, ``sd``) against plain loops:
the four set similarities, a callable on the label matrices and an (L, L) label-similarity matrix (soft
cosine, soft positives through related labels); dense and sparse labels, with and without keys."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hf_mlcl.losses import get_loss
from hf_mlcl.losses.label_similarity import resolve_label_similarity, set_similarity, soft_cosine

L = 7


def _sets(y):
    return [set(torch.nonzero(r).flatten().tolist()) for r in y]


def set_weight(kind, s, t):
    """One pair's similarity, from Python sets."""
    inter = len(s & t)
    if not inter:
        return 0.0
    return {
        "jaccard": inter / len(s | t),
        "dice": 2 * inter / (len(s) + len(t)),
        "overlap": inter / min(len(s), len(t)),
        "cosine": inter / math.sqrt(len(s) * len(t)),
    }[kind]


def soft_cosine_loop(a, s, t):
    """y_S^T A y_T / sqrt(y_S^T A y_S * y_T^T A y_T), one pair, summing over label pairs."""

    def quad(u, v):
        return sum(float(a[i, j]) for i in u for j in v)

    den = math.sqrt(quad(s, s) * quad(t, t))
    return quad(s, t) / den if den > 0 else 0.0


def loss_loop(z, y, kz, yk, weight, normaliser, tau):
    """Weighted SupCon with plain loops: -sum_p W_ip log p_ip / norm_i, mean over anchors with a positive;
    candidates = other anchors + keys."""
    zn = F.normalize(z.double(), dim=1)
    cands = [(a, zn[a], s) for a, s in enumerate(_sets(y))]
    if kz is not None:
        kn = F.normalize(kz.double(), dim=1)
        cands += [(len(zn) + b, kn[b], t) for b, t in enumerate(_sets(yk))]
    out = []
    for i, s in enumerate(_sets(y)):
        others = [(v, t) for (a, v, t) in cands if a != i]
        lse = math.log(sum(math.exp(float(zn[i] @ v) / tau) for v, _ in others))
        ws = [weight(s, t) for _, t in others]
        if not any(w > 0 for w in ws):
            continue
        num = sum(w * (float(zn[i] @ v) / tau - lse) for w, (v, _) in zip(ws, others) if w > 0)
        norm = sum(ws) if normaliser == "sum" else sum(1 for w in ws if w > 0)
        out.append(-num / norm)
    return sum(out) / len(out)


def batch(seed, n=9, k=5, keys=True):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, L, generator=g) < 0.3).float()
    y[:, 6] = 0
    y[0] = 0  # no label
    y[1] = 0
    y[1, 6] = 1  # label 6 on this row only: positives through related labels alone
    y[2] = y[3]
    y[4, 0] = 1  # label 0, related to 6 in related_matrix()
    z = torch.randn(n, 8, generator=g, dtype=torch.float64)
    if not keys:
        return z, y, None, None
    yk = (torch.rand(k, L, generator=g) < 0.3).float()
    yk[:, 6] = 0
    return z, y, torch.randn(k, 8, generator=g, dtype=torch.float64), yk


def related_matrix(seed=0):
    """Symmetric, non-negative, unit diagonal; label 6 related to label 0 (a sibling in a hierarchy)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(L, L, generator=g, dtype=torch.float64) * (torch.rand(L, L, generator=g) < 0.3)
    a = (a + a.T) / 2
    a[6, 0] = a[0, 6] = 0.5
    a.fill_diagonal_(1.0)
    return a


LOSSES = {"jaccard": ("jaccard", "sum"), "sd": ("sd", "count")}


@pytest.mark.parametrize("kind", ["jaccard", "dice", "overlap", "cosine"])
@pytest.mark.parametrize("loss", ["jaccard", "sd"])
@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("keys", [False, True])
def test_set_similarities_match_the_loop(kind, loss, layout, keys):
    z, y, kz, yk = batch(1, keys=keys)
    conv = (lambda t: t) if layout == "dense" else (lambda t: None if t is None else t.to_sparse())
    fn = get_loss(loss, temperature=0.1, label_similarity=kind)
    got = fn(z, conv(y), kz, conv(yk)).item()
    ref = loss_loop(z, y, kz, yk, lambda s, t: set_weight(kind, s, t), LOSSES[loss][1], 0.1)
    assert got == pytest.approx(ref, rel=1e-10)


def test_defaults_are_the_papers_weights():
    z, y, kz, yk = batch(2)
    for loss, default, paper in (("jaccard", "jaccard", "jaccard"), ("sd", "sd", None)):
        plain = get_loss(loss)(z, y, kz, yk)
        assert get_loss(loss).label_similarity == default
        if paper is not None:
            assert get_loss(loss, label_similarity=paper)(z, y, kz, yk).item() == plain.item()
    # sd's own K^s K^d is not one of the set similarities: a different value
    assert get_loss("sd", label_similarity="jaccard")(z, y).item() != pytest.approx(
        get_loss("sd")(z, y).item()
    )


@pytest.mark.parametrize("loss", ["jaccard", "sd"])
@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_label_similarity_matrix_gives_soft_positives(loss, layout):
    z, y, kz, yk = batch(3)
    a = related_matrix()
    conv = (lambda t: t) if layout == "dense" else (lambda t: t.to_sparse())
    fn = get_loss(loss, temperature=0.1, label_similarity=a)
    zz = z.clone().requires_grad_()
    got = fn(zz, conv(y), kz, conv(yk))
    ref = loss_loop(z, y, kz, yk, lambda s, t: soft_cosine_loop(a, s, t), LOSSES[loss][1], 0.1)
    assert got.item() == pytest.approx(ref, rel=1e-10)
    got.backward()
    assert (
        torch.isfinite(zz.grad).all() and zz.grad[1].abs().sum() > 0
    )  # row 1 learns from related labels only
    # row 1 (label 6 alone) shares no label with anyone, so it is no anchor without the matrix
    assert not any(6 in t for t in _sets(y)[2:] + _sets(yk))
    w = soft_cosine(y[1:2], y, a)
    assert (w[0, 2:] > 0).any() and set_weight("cosine", {6}, {0}) == 0.0


def test_identity_matrix_is_cosine_and_a_file_path_works(tmp_path):
    z, y, kz, yk = batch(4)
    eye = get_loss("jaccard", label_similarity=torch.eye(L, dtype=torch.float64))(z, y, kz, yk).item()
    assert eye == pytest.approx(
        get_loss("jaccard", label_similarity="cosine")(z, y, kz, yk).item(), rel=1e-12
    )
    a = related_matrix(1)
    np.save(tmp_path / "labels.npy", a.numpy())
    from safetensors.torch import save_file

    save_file({"similarity": a}, str(tmp_path / "labels.safetensors"))
    want = get_loss("sd", label_similarity=a)(z, y).item()
    for name in ("labels.npy", "labels.safetensors"):
        assert get_loss("sd", label_similarity=str(tmp_path / name))(z, y).item() == pytest.approx(
            want, rel=1e-12
        )


@pytest.mark.parametrize("layout", ["dense", "sparse"])
def test_callable_on_the_label_matrices_matches_the_loop(layout):
    """A user's vectorised similarity, here the shared-label count squared over |S| |T| (0 for empty sets)."""

    def overlap_squared(s, t):
        s = (s.to_dense() if s.is_sparse else s).double()  # the loss holds float32 labels
        t = (t.to_dense() if t.is_sparse else t).double()
        inter = s @ t.T
        return inter**2 / (s.sum(1, keepdim=True) * t.sum(1)[None, :]).clamp_min(1)

    z, y, kz, yk = batch(5)
    conv = (lambda t: t) if layout == "dense" else (lambda t: t.to_sparse())
    for loss in ("jaccard", "sd"):
        got = get_loss(loss, temperature=0.1, label_similarity=overlap_squared)(
            z, conv(y), kz, conv(yk)
        ).item()
        ref = loss_loop(
            z, y, kz, yk, lambda s, t: len(s & t) ** 2 / max(len(s) * len(t), 1), LOSSES[loss][1], 0.1
        )
        assert got == pytest.approx(ref, rel=1e-10)


def test_set_similarity_vectorised_equals_pairs():
    y = (torch.rand(12, L, generator=torch.Generator().manual_seed(6)) < 0.4).float()
    inter, sizes = y @ y.T, y.sum(1)
    for kind in ("jaccard", "dice", "overlap", "cosine"):
        w = set_similarity(kind, inter, sizes, sizes)
        want = torch.tensor([[set_weight(kind, s, t) for t in _sets(y)] for s in _sets(y)])
        torch.testing.assert_close(w, want)


def test_bad_choices_name_the_problem():
    with pytest.raises(ValueError, match="label_similarity must be one of"):
        get_loss("jaccard", label_similarity="tanimoto")
    with pytest.raises(ValueError, match="must be square"):
        resolve_label_similarity(torch.ones(3, 4))
    with pytest.raises(ValueError, match="symmetric"):
        resolve_label_similarity(torch.tensor([[1.0, 0.2], [0.0, 1.0]]))
    with pytest.raises(ValueError, match="non-negative"):
        resolve_label_similarity(torch.tensor([[1.0, -0.2], [-0.2, 1.0]]))
    with pytest.raises(ValueError, match="unit diagonal"):
        resolve_label_similarity(torch.tensor([[0.5, 0.2], [0.2, 1.0]]))
    with pytest.raises(ValueError, match="does not exist"):
        resolve_label_similarity("missing.npy")
    z, y, _, _ = batch(7, keys=False)
    with pytest.raises(ValueError, match="7 columns"):
        get_loss("sd", label_similarity=torch.eye(3))(z, y)
    with pytest.raises(ValueError, match=r"\(N, M\)"):
        get_loss("sd", label_similarity=lambda s, t: s @ s.T[:, :2])(z, y)
    with pytest.raises(ValueError, match="negative or non-finite"):
        get_loss("jaccard", label_similarity=lambda s, t: -(s @ t.T))(z, y)


def _multisupcon_loop(z, y, zk, yk, threshold, temperature):
    """pytorch-metric-learning's multi-label SupCon written out: for anchor i, -(1/|P(i)|) sum_{p in P(i)} J_ip
    log(exp(s_ip) / sum_{a != i} exp(s_ia)), P(i) the candidates whose Jaccard similarity exceeds the threshold,
    s the cosine similarities over the temperature; the mean over anchors with a positive."""
    cand_z = z if zk is None else torch.cat([z, zk])
    cand_y = y if yk is None else torch.cat([y, yk])
    zn, cn = F.normalize(z, dim=1), F.normalize(cand_z, dim=1)
    per_anchor = []
    for i in range(len(z)):
        others = [a for a in range(len(cand_z)) if a != i]
        s = {a: float(zn[i] @ cn[a]) / temperature for a in others}
        log_denominator = math.log(sum(math.exp(v) for v in s.values()))
        anchor = {j for j in range(y.shape[1]) if y[i, j] > 0}
        total, count = 0.0, 0
        for p in others:
            cand = {j for j in range(y.shape[1]) if cand_y[p, j] > 0}
            union = anchor | cand
            jaccard = len(anchor & cand) / len(union) if union else 0.0
            if jaccard > threshold:
                total += jaccard * (s[p] - log_denominator)
                count += 1
        if count:
            per_anchor.append(-total / count)
    return sum(per_anchor) / len(per_anchor)


@pytest.mark.parametrize("layout", ["dense", "sparse"])
@pytest.mark.parametrize("keys", [False, True])
def test_thresholded_jaccard_positives_are_the_peers_multi_label_supcon(layout, keys):
    """sd with label_similarity='jaccard' and label_similarity_threshold=0.3 equals the formula of
    pytorch-metric-learning's multi-label SupCon (positives above the threshold, weighted by their Jaccard
    similarity, divided by their number) to 1e-9 in float64, in batch mode and with queue keys."""
    g = torch.Generator().manual_seed(7)
    for trial in range(3):
        z = torch.randn(10, 6, generator=g, dtype=torch.float64)
        y = (torch.rand(10, 7, generator=g) < 0.35).double()
        y[0] = 0  # an empty label row
        zk = torch.randn(5, 6, generator=g, dtype=torch.float64) if keys else None
        yk = (torch.rand(5, 7, generator=g) < 0.35).double() if keys else None
        want = _multisupcon_loop(z, y, zk, yk, 0.3, 0.1)
        loss = get_loss("sd", label_similarity="jaccard", label_similarity_threshold=0.3, temperature=0.1)
        labels = y.to_sparse() if layout == "sparse" else y
        key_labels = None if yk is None else (yk.to_sparse() if layout == "sparse" else yk)
        got = loss(z, labels, zk, key_labels)
        assert abs(float(got) - want) <= 1e-9, (trial, float(got), want)
    assert "jaccard > 0.3" in repr(loss)


def test_a_threshold_drops_the_positives_at_or_below_it():
    y = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    z = torch.randn(4, 5, dtype=torch.float64)
    ctx = get_loss("jaccard").prepare(z, y)
    for threshold, want in (
        (None, [[0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]),
        (0.5, [[0, 0, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]),
    ):
        loss = get_loss("jaccard", label_similarity_threshold=threshold)
        w, positive = loss.label_weights(ctx)
        assert positive.tolist() == [[bool(v) for v in row] for row in want]
        assert torch.equal(w > 0, positive)  # J(0, 1) = 0.5 is not above 0.5: no weight either
    with pytest.raises(ValueError, match="label_similarity_threshold must be a finite number >= 0"):
        get_loss("jaccard", label_similarity_threshold=-0.1)


@pytest.mark.parametrize("threshold", [1.0, 5.0, True, float("nan"), "high"])
@pytest.mark.parametrize(
    "name, options", [("jaccard", {}), ("sd", {"label_similarity": "jaccard"}), ("sd", {})]
)
def test_a_threshold_that_leaves_no_positive_under_a_named_similarity_is_refused(name, options, threshold):
    """A named similarity's weights lie in [0, 1]: a threshold of 1 or more (or a bool) would make the loss 0."""
    with pytest.raises(ValueError, match=r"must be a finite number >= 0 and < 1 for label_similarity="):
        get_loss(name, label_similarity_threshold=threshold, **options)


def test_a_threshold_above_1_is_kept_for_a_similarity_of_the_users_own():
    loss = get_loss("jaccard", label_similarity=lambda s, t: 2.0 * (s @ t.T), label_similarity_threshold=1.5)
    assert loss.label_similarity_threshold == 1.5
