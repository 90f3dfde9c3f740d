"""Similarity-Dissimilarity loss: Theorems 1-5 as property tests, eq. 13 readings, SupCon agreement.

(b) single-label ALL / ANY (and SD, whose K^s K^d = 1 there, eq. 17) == pytorch-metric-learning
    SupConLoss (cosine similarity, same temperature, mean over anchors with a positive);
(c) SD with ``weight_in_log=True`` (eq. 13 literally) has exactly ANY's gradient and a different value;
(d) Theorems 1-5 of the SD paper (Section 2.6, Appendix B) on the weights the loss really uses,
    i.e. ``similarity_dissimilarity_weights`` fed by the vectorised relations (dense and sparse).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_mlcl.labels import relations as R
from hf_mlcl.losses import get_loss, similarity_dissimilarity_weights

N_LABELS = 8
label_sets = st.frozensets(st.integers(0, N_LABELS - 1), max_size=N_LABELS)
nonempty_sets = st.frozensets(st.integers(0, N_LABELS - 1), min_size=1, max_size=N_LABELS)


def _multihot(sets) -> torch.Tensor:
    y = torch.zeros(len(sets), N_LABELS)
    for i, s in enumerate(sets):
        for j in s:
            y[i, j] = 1
    return y


def sd_factor(S: frozenset, T: frozenset, sparse: bool = False) -> float:
    """K^s K^d of the pair (S, T) computed the way the loss computes it (relations + weights)."""
    ya, yc = _multihot([S]), _multihot([T])
    if sparse:
        ya, yc = ya.to_sparse(), yc.to_sparse()
    inter = R.intersections(ya, yc)
    return float(similarity_dissimilarity_weights(inter, R.label_sizes(ya), R.label_sizes(yc))[0, 0])


def relation(S: frozenset, T: frozenset) -> int:
    """Relation R1..R5 of eqs. (8)-(12)."""
    if not S & T:
        return 1
    if S == T:
        return 2
    if S > T:
        return 4
    if S < T:
        return 5
    return 3


SETTINGS = settings(max_examples=100, deadline=None, derandomize=True)


@SETTINGS
@given(S=nonempty_sets, T=label_sets, sparse=st.booleans())
def test_theorems_1_2_3_bounds_per_relation(S, T, sparse):
    k = sd_factor(S, T, sparse)
    m = relation(S, T)
    if m == 1:
        assert k == 0.0  # Theorem 1, eq. (19)
    elif m == 2:
        assert k == pytest.approx(1.0, abs=1e-7)  # Theorem 2, eq. (20)
    else:
        assert 0.0 < k < 1.0  # Theorem 3, eq. (21)
    assert 0.0 <= k <= 1.0  # eq. (18)
    # closed form of eq. (14)-(15)
    if S & T:
        assert k == pytest.approx(len(S & T) / len(S) / (1 + len(T - S)), rel=1e-6)


@SETTINGS
@given(S=nonempty_sets, T3=nonempty_sets, T4=nonempty_sets)
def test_theorem_4_subset_dominates_partial_overlap(S, T3, T4):
    """p3 in R3, p4 in R4 with abs(T3) == abs(T4)  =>  K4 > K3 (eq. 22-23)."""
    if relation(S, T3) != 3 or relation(S, T4) != 4 or len(T3) != len(T4):
        return
    assert sd_factor(S, T4) > sd_factor(S, T3)


@SETTINGS
@given(
    S=st.frozensets(st.integers(0, 3), min_size=1, max_size=3),
    t_size=st.integers(1, 3),
    extra=st.integers(1, 4),
)
def test_theorem_4_constructive(S, t_size, extra):
    """Constructed R3/R4 pairs of equal size (the random strategy above rarely hits them)."""
    T4 = frozenset(sorted(S)[: min(t_size, len(S) - 1)])
    if not T4:
        return
    shared = sorted(S)[: max(len(T4) - 1, 1)]
    if len(shared) >= len(S):
        return
    T3 = frozenset(shared) | frozenset(range(4, 4 + len(T4) - len(shared)))
    if relation(S, T3) != 3 or len(T3) != len(T4):
        return
    assert sd_factor(S, T4) > sd_factor(S, T3)


@SETTINGS
@given(S=nonempty_sets, T3=nonempty_sets, T5=nonempty_sets)
def test_theorem_5_superset_dominates_partial_overlap(S, T3, T5):
    """p3 in R3, p5 in R5 with abs(T5 minus S) <= abs(T3 minus S)  =>  K5 > K3 (eq. 24-25)."""
    if relation(S, T3) != 3 or relation(S, T5) != 5 or len(T5 - S) > len(T3 - S):
        return
    assert sd_factor(S, T5) > sd_factor(S, T3)


@SETTINGS
@given(S=st.frozensets(st.integers(0, 3), min_size=1, max_size=3), d3=st.integers(1, 4), d5=st.integers(1, 4))
def test_theorem_5_constructive(S, d3, d5):
    if d5 > d3 or len(S) < 2:
        return
    T3 = frozenset(sorted(S)[:1]) | frozenset(range(4, 4 + d3))
    T5 = S | frozenset(range(4, 4 + d5))
    assert relation(S, T3) == 3 and relation(S, T5) == 5
    assert sd_factor(S, T5) > sd_factor(S, T3)


def test_paper_case_analysis_section_2_5():
    """Figure 1 example: K^s K^d = {0, 1, 1/9, 2/3, 1/3} for R1..R5."""
    S = frozenset({0, 1, 2})
    cases = {
        1: frozenset({3, 4, 5}),
        2: frozenset({0, 1, 2}),
        3: frozenset({0, 3, 4}),
        4: frozenset({0, 1}),
        5: frozenset({0, 1, 2, 3, 4}),
    }
    expected = {1: 0.0, 2: 1.0, 3: 1 / 9, 4: 2 / 3, 5: 1 / 3}
    for m, T in cases.items():
        assert relation(S, T) == m
        assert sd_factor(S, T) == pytest.approx(expected[m], rel=1e-6)


# --------------------------------------------------------------------------- eq. 13 readings
def _multilabel_batch(seed: int = 0, n: int = 10):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, 6, generator=g)
    y = (torch.rand(n, 5, generator=g) < 0.4).float()
    y[0] = 0
    y[2] = y[1]
    return z, y


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_keys", [False, True])
def test_weight_in_log_has_any_gradient_and_different_value(seed, with_keys):
    z, y = _multilabel_batch(seed)
    zk = yk = None
    if with_keys:
        zk, yk = _multilabel_batch(seed + 10, n=5)
    grads, values = {}, {}
    for key, fn in {"any": get_loss("any"), "sd_log": get_loss("sd", weight_in_log=True)}.items():
        e = z.double().clone().requires_grad_(True)
        k = None if zk is None else zk.double().clone().requires_grad_(True)
        out = fn(e, y, k, yk)
        out.backward()
        grads[key] = (e.grad, None if k is None else k.grad)
        values[key] = out.item()
    torch.testing.assert_close(grads["any"][0], grads["sd_log"][0], rtol=1e-12, atol=1e-12)
    if with_keys:
        torch.testing.assert_close(grads["any"][1], grads["sd_log"][1], rtol=1e-12, atol=1e-12)
    # log(K^s K^d) <= 0 with some factor < 1 in a multi-label batch: the value is strictly larger
    assert values["sd_log"] > values["any"] + 1e-3
    # and the default reading (factor multiplies the log) is a genuinely different loss
    assert get_loss("sd")(z, y).item() != pytest.approx(values["any"], rel=1e-3)


def test_sd_reduces_to_supcon_when_all_relations_are_r2():
    """Eq. (17): with only R1/R2 relations (K^s K^d in {0, 1}) SD == ALL == ANY."""
    z, _ = _multilabel_batch(3, n=9)
    y = torch.tensor(
        [[1, 1, 0], [1, 1, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1], [1, 1, 0], [0, 0, 0], [0, 0, 1], [1, 1, 0]]
    )
    a, b = get_loss("all")(z, y), get_loss("any")(z, y)
    c, d = get_loss("sd")(z, y), get_loss("sd", weight_in_log=True)(z, y)
    for v in (b, c, d):
        assert v.item() == pytest.approx(a.item(), rel=1e-6)


# --------------------------------------------------------------------------- (b) pml SupCon
@pytest.mark.parametrize("temperature", [0.07, 0.1, 0.5])
@pytest.mark.parametrize("name", ["all", "any", "similarity_dissimilarity", "jaccard", "mulsupcon"])
def test_single_label_equals_pml_supcon(name, temperature):
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
    g = torch.Generator().manual_seed(int(temperature * 100))
    n, n_classes = 16, 4
    z = torch.randn(n, 8, generator=g)
    cls = torch.randint(0, n_classes, (n,), generator=g)
    cls[-1] = n_classes  # a class with one member: anchor without positives (not counted by either)
    y = torch.nn.functional.one_hot(cls, n_classes + 1).float()
    want = pml_losses.SupConLoss(temperature=temperature)(z, cls)
    got = get_loss(name, temperature=temperature)(z, y)
    # jaccard / mulsupcon also reduce to SupCon in the single-label case (J = 1; one pair per anchor)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    # gradients agree too
    e1, e2 = z.clone().requires_grad_(True), z.clone().requires_grad_(True)
    pml_losses.SupConLoss(temperature=temperature)(e1, cls).backward()
    get_loss(name, temperature=temperature)(e2, y).backward()
    torch.testing.assert_close(e2.grad, e1.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", ["all", "any"])
def test_a_batch_without_negatives_keeps_the_supcon_value_where_pml_returns_zero(name):
    """The documented choice (docs/losses.md, ``all``'s docstring): one class only -> every candidate is a
    positive; hf_mlcl gives SupContrast's LSE_i - mean_p s_ip (>= log(N - 1)) and its gradient,
    pytorch-metric-learning 0; one row of another class and they agree again."""
    pml_losses = pytest.importorskip("pytorch_metric_learning.losses")
    g = torch.Generator().manual_seed(5)
    n, tau = 6, 0.1
    z = torch.randn(n, 8, generator=g, dtype=torch.float64)
    cls = torch.zeros(n, dtype=torch.long)
    y = torch.ones(n, 1, dtype=torch.float64)
    zn = torch.nn.functional.normalize(z, dim=1)
    s = zn @ zn.T / tau
    ref = []
    for i in range(n):  # SupCon eq. 2, every other sample a positive
        others = [a for a in range(n) if a != i]
        lse = torch.logsumexp(s[i, others], 0)
        ref.append(float(lse - s[i, others].mean()))
    zz = z.clone().requires_grad_()
    got = get_loss(name, temperature=tau)(zz, y)
    assert got.item() == pytest.approx(sum(ref) / n, rel=1e-12)
    assert got.item() >= torch.log(torch.tensor(n - 1.0)).item()
    got.backward()
    assert zz.grad.abs().max() > 0
    assert pml_losses.SupConLoss(temperature=tau)(z, cls).item() == 0.0
    cls2 = cls.clone()
    cls2[-1] = 1  # one negative pair: both libraries compute the formula
    y2 = torch.nn.functional.one_hot(cls2, 2).double()
    assert get_loss(name, temperature=tau)(z, y2).item() == pytest.approx(
        pml_losses.SupConLoss(temperature=tau)(z, cls2).item(), rel=1e-9
    )
    import os

    import hf_mlcl.losses.all_ as all_module

    with open(
        os.path.join(os.path.dirname(__file__), "..", "..", "docs", "losses.md"), encoding="utf-8"
    ) as f:
        docs = " ".join(f.read().split())
    for text in (docs, " ".join(all_module.__doc__.split())):  # the choice is written where users look
        assert "no negative pair" in text and "returns 0" in text and ">= log abs(P(i))" in text


@pytest.mark.parametrize("sparse", [False, True])
def test_theorems_exhaustive_over_five_labels(sparse):
    """All (S, T, T') over a 5-label universe, weights from ONE vectorised call (dense or sparse)."""
    universe = 5
    subsets = [frozenset(j for j in range(universe) if mask >> j & 1) for mask in range(1 << universe)]
    y = torch.tensor([[1.0 if j in s else 0.0 for j in range(universe)] for s in subsets])
    ya, yc = (y.to_sparse(), y.to_sparse()) if sparse else (y, y)
    k = similarity_dissimilarity_weights(
        R.intersections(ya, yc), R.label_sizes(ya), R.label_sizes(yc)
    ).tolist()
    checked = {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, "t4": 0, "t5": 0}
    for a, S in enumerate(subsets):
        if not S:
            continue
        rel = [relation(S, T) for T in subsets]
        for c, m in enumerate(rel):
            checked[m] += 1
            if m == 1:
                assert k[a][c] == 0.0
            elif m == 2:
                assert k[a][c] == pytest.approx(1.0, abs=1e-7)
            else:
                assert 0.0 < k[a][c] < 1.0
        for c3, T3 in enumerate(subsets):
            if rel[c3] != 3:
                continue
            for c2, T2 in enumerate(subsets):
                if rel[c2] == 4 and len(T2) == len(T3):
                    assert k[a][c2] > k[a][c3]  # Theorem 4
                    checked["t4"] += 1
                if rel[c2] == 5 and len(T2 - S) <= len(T3 - S):
                    assert k[a][c2] > k[a][c3]  # Theorem 5
                    checked["t5"] += 1
    assert all(v > 0 for v in checked.values()), checked
