"""Vectorised losses vs slow plain-Python references written from the papers' equations.

References (loops over anchors / candidates / labels, float64 Python math):
* all / any: SD-loss paper eq. (1)/(2) positive sets, eq. (3) per-anchor loss;
* similarity_dissimilarity: SD-loss paper eq. (13)-(15) (both readings of eq. 13);
* jaccard: ABALONE paper (Audibert et al.) Section 3.1, L_Base with N(i);
* mulsupcon: Zhang & Wu / SD-loss paper eq. (5)-(6), averaged over (anchor, label) pairs (LOSSES.md).
Anchors without positives (and (anchor, label) pairs without positives) are skipped (LOSSES.md).
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from hf_mlcl.losses import get_loss


def _sets(y: torch.Tensor) -> list[frozenset[int]]:
    return [frozenset(int(j) for j in torch.nonzero(row).flatten().tolist()) for row in y]


def reference_loss(
    name,
    z,
    y,
    zk=None,
    yk=None,
    temperature=0.1,
    normalize=True,
    weight_in_log=False,
    anchors_in_candidates=True,
    mulsupcon_normalizer="pairs",
):
    """Plain-loop reference of docs/losses.md / the papers' equations.

    ``anchors_in_candidates=False``: the contrast set of every anchor is the keys alone (the ``"keys"``
    MoCo set); ``mulsupcon_normalizer="labels"``: MulSupCon eq. (7), divide by sum_i abs(y_i)."""
    anchors = [[float(v) for v in row] for row in z]
    keys = [] if zk is None else [[float(v) for v in row] for row in zk]
    if normalize:
        anchors = [[v / max(math.sqrt(sum(u * u for u in r)), 1e-12) for v in r] for r in anchors]
        keys = [[v / max(math.sqrt(sum(u * u for u in r)), 1e-12) for v in r] for r in keys]
    S_all = _sets(y)
    key_sets = [] if yk is None else _sets(yk)
    T_all = (S_all if anchors_in_candidates else []) + key_sets
    cands = (anchors if anchors_in_candidates else []) + keys
    n = len(anchors)
    total, count = 0.0, 0
    pair_total, pair_count = 0.0, 0
    for i in range(n):
        S = S_all[i]
        # A(i) = I \ {i} + keys (keys never excluded), or the keys alone
        A = [a for a in range(len(cands)) if a != i or not anchors_in_candidates]
        if not A:
            continue
        s = {a: sum(p * q for p, q in zip(anchors[i], cands[a])) / temperature for a in A}
        m = max(s.values())
        log_denom = m + math.log(sum(math.exp(s[a] - m) for a in A))
        logp = {a: s[a] - log_denom for a in A}
        if name == "mulsupcon":
            for lab in sorted(S):
                P_l = [a for a in A if lab in T_all[a]]
                if P_l:
                    pair_total += -sum(logp[a] for a in P_l) / len(P_l)
                    pair_count += 1
            continue
        if name == "all":
            P = [a for a in A if S and T_all[a] == S]
            w = {a: 1.0 for a in P}
            norm = len(P)
        elif name == "any":
            P = [a for a in A if S & T_all[a]]
            w = {a: 1.0 for a in P}
            norm = len(P)
        elif name == "similarity_dissimilarity":
            P = [a for a in A if S & T_all[a]]
            w = {}
            for a in P:
                T = T_all[a]
                ks = len(S & T) / len(S)  # eq. (14)
                kd = 1.0 / (1.0 + len(T - (S & T)))  # eq. (15)
                w[a] = ks * kd
            norm = len(P)
        elif name == "jaccard":
            P = [a for a in A if S & T_all[a]]
            w = {a: len(S & T_all[a]) / len(S | T_all[a]) for a in P}
            norm = sum(w.values())
        else:  # pragma: no cover
            raise KeyError(name)
        if not P:
            continue
        if name == "similarity_dissimilarity" and weight_in_log:
            li = -sum(math.log(w[a]) + logp[a] for a in P) / norm  # eq. (13) literally
        else:
            li = -sum(w[a] * logp[a] for a in P) / norm
        total += li
        count += 1
    if name == "mulsupcon":
        if mulsupcon_normalizer == "labels":  # eq. (7): every (anchor, label) pair counts
            pair_count = sum(len(S) for S in S_all)
        return pair_total / pair_count if pair_count else 0.0
    return total / count if count else 0.0


def random_batch(n: int, n_labels: int, seed: int, dim: int = 6):
    """Multi-hot labels with repeated label sets, empty rows and single-label rows."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    protos = [frozenset(rng.sample(range(n_labels), rng.randint(1, 3))) for _ in range(3)]
    y = torch.zeros(n, n_labels)
    for i in range(n):
        kind = rng.random()
        if kind < 0.15:
            continue  # empty label set
        if kind < 0.35:
            labs = {rng.randrange(n_labels)}  # single label
        elif kind < 0.7:
            labs = set(rng.choice(protos))  # repeated label set
        else:
            labs = set(rng.sample(range(n_labels), rng.randint(1, n_labels)))
        for j in labs:
            y[i, j] = 1
    z = torch.randn(n, dim, generator=g)
    if n > 3:
        z[1] = z[0]  # duplicate embedding
    return z, y


NAMES = ["all", "any", "similarity_dissimilarity", "jaccard", "mulsupcon"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("with_keys", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_matches_loop_reference(name, sparse, with_keys, seed):
    n_labels = 5
    z, y = random_batch(10, n_labels, seed)
    zk = yk = None
    if with_keys:
        zk, yk = random_batch(7, n_labels, seed + 100)
        zk[0] = z[3] + 0.01  # an anchor's own momentum key: a positive of it
        yk[0] = y[3]
    tau = [0.07, 0.1, 0.5][seed]
    loss_fn = get_loss(name, temperature=tau)
    y_in = y.to_sparse() if sparse else y
    yk_in = None if yk is None else (yk.to_sparse_csr() if sparse else yk.bool())
    got = loss_fn(z, y_in, zk, yk_in)
    want = reference_loss(name, z, y, zk, yk, temperature=tau)
    assert want != 0.0
    assert got.item() == pytest.approx(want, rel=1e-5, abs=1e-7)
    assert loss_fn.components(z, y_in, zk, yk_in)["loss"].item() == pytest.approx(got.item())
    # float64 path: tight agreement
    got64 = loss_fn(z.double(), y_in, None if zk is None else zk.double(), yk_in)
    assert got64.dtype == torch.float64
    assert got64.item() == pytest.approx(want, rel=1e-10)


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("with_keys", [False, True])
def test_sd_weight_in_log_matches_reference(seed, with_keys):
    z, y = random_batch(9, 4, seed)
    zk = yk = None
    if with_keys:
        zk, yk = random_batch(5, 4, seed + 7)
    got = get_loss("sd", weight_in_log=True)(z, y, zk, yk)
    want = reference_loss("similarity_dissimilarity", z, y, zk, yk, temperature=0.07, weight_in_log=True)
    assert got.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_normalize_false_matches_reference(name):
    z, y = random_batch(8, 4, 5)
    z = z * 0.3
    got = get_loss(name, temperature=0.2, normalize=False)(z, y)
    want = reference_loss(name, z, y, temperature=0.2, normalize=False)
    assert got.item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("name", NAMES)
def test_larger_sparse_batch_matches_dense(name):
    z, y = random_batch(40, 30, 11, dim=16)
    zk, yk = random_batch(25, 30, 12, dim=16)
    fn = get_loss(name)
    dense = fn(z, y, zk, yk)
    sparse = fn(z, y.to_sparse(), zk, yk.to_sparse())
    mixed = fn(z, y.bool(), zk, yk.to_sparse_csr())
    assert sparse.item() == pytest.approx(dense.item(), rel=1e-6)
    assert mixed.item() == pytest.approx(dense.item(), rel=1e-6)


def test_known_values_hand_computed():
    """Two anchors, orthogonal embeddings, tau = 1: every logit is 0 or 1 — checked by hand."""
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    y = torch.tensor([[1, 1], [1, 0], [1, 1]])
    # anchor 0: candidates 1 (s=0), 2 (s=1): log-denominator = log(1 + e)
    lse = math.log(1 + math.e)
    lp01, lp02 = 0 - lse, 1 - lse
    # anchor 1: candidates 0 (s=0), 2 (s=0): logp = -log 2 for both
    lp1 = -math.log(2)
    # anchor 2: candidates 0 (s=1), 1 (s=0): same as anchor 0 mirrored
    l_all = (-lp02 + (-lp02)) / 2  # anchors 0 and 2 are positives of each other; anchor 1 has none
    got = get_loss("all", temperature=1.0)(z, y).item()
    assert got == pytest.approx(l_all, rel=1e-6)
    l_any = (-(lp01 + lp02) / 2 + -(lp1 + lp1) / 2 + -(lp02 + lp01) / 2) / 3
    assert get_loss("any", temperature=1.0)(z, y).item() == pytest.approx(l_any, rel=1e-6)
    # sd: anchor 0 (S={0,1}): cand 1 T={0}: Ks=1/2, Kd=1 ; cand 2: 1. anchor 1 (S={0}): cands T={0,1}: Ks=1, Kd=1/2
    l_sd = (-(0.5 * lp01 + lp02) / 2 + -(0.5 * lp1 + 0.5 * lp1) / 2 + -(lp02 + 0.5 * lp01) / 2) / 3
    assert get_loss("sd", temperature=1.0)(z, y).item() == pytest.approx(l_sd, rel=1e-6)
    # jaccard: J(0,1) = 1/2, J(0,2) = 1
    l_j = (-(0.5 * lp01 + lp02) / 1.5 + -(0.5 * lp1 + 0.5 * lp1) / 1.0 + -(lp02 + 0.5 * lp01) / 1.5) / 3
    assert get_loss("jaccard", temperature=1.0)(z, y).item() == pytest.approx(l_j, rel=1e-6)
    # mulsupcon pairs: (0, l0): P={1,2}; (0, l1): P={2}; (1, l0): P={0,2}; (2, l0): P={0,1}; (2, l1): P={0}
    pairs = [-(lp01 + lp02) / 2, -lp02, -(lp1 + lp1) / 2, -(lp02 + lp01) / 2, -lp02]
    assert get_loss("mulsupcon", temperature=1.0)(z, y).item() == pytest.approx(sum(pairs) / 5, rel=1e-6)
