"""MoCo contrast sets: each loss's paper default, built by hf_mlcl.training.memory from online queries,
the current momentum keys and a queue, against the plain-loop references of the papers' equations.

Reference contrast sets (docs/losses.md): ``keys`` — candidates = [current keys ; queue], no query-query
pair (MulSupCon code, ws-MulSupCon eq. 1, HBL); ``queries+queue`` — other queries + queue of previous
batches (ABALONE sec. 3); ``queries+keys`` — other queries + current keys + queue.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_losses_hbl import hbl_reference
from test_losses_msc import msc_reference
from test_losses_reference import random_batch, reference_loss
from test_losses_ws_mulsupcon import TRAIN, ws_paper_reference

from hf_mlcl.labels.statistics import ws_class_weights
from hf_mlcl.losses import get_loss, get_loss_class
from hf_mlcl.training.memory import (
    CONTRAST_SETS,
    CandidateBuilder,
    EmbeddingQueue,
    max_candidates,
    resolve_contrast_set,
    resolve_queue_warmup,
)

PAPER_SETS = {
    "all": "keys",
    "any": "keys",
    "similarity_dissimilarity": "keys",
    "jaccard": "keys",
    "mulsupcon": "keys",
    "ws_mulsupcon": "keys",
    "hbl": "keys",
    "msc": "queries+queue",
}
N_LABELS, DIM = 5, 6


def test_paper_defaults_and_warmup():
    for name, want in PAPER_SETS.items():
        cls = get_loss_class(name)
        assert cls.default_contrast_set == want, name
        assert cls.default_queue_warmup is (name != "msc"), (
            name
        )  # MulSupCon code family waits for a full queue
    loss = get_loss("mulsupcon")
    assert resolve_contrast_set(loss, None, 0) is None  # batch mode
    assert resolve_contrast_set(loss, None, 16) == "keys"
    assert resolve_contrast_set(loss, "queries+keys", 16) == "queries+keys"
    assert resolve_queue_warmup(loss, None) and not resolve_queue_warmup(loss, False)
    with pytest.raises(ValueError, match="needs queue_size > 0"):
        resolve_contrast_set(loss, "keys", 0)
    with pytest.raises(ValueError, match="must be one of"):
        resolve_contrast_set(loss, "queue", 16)

    class NoFlag(torch.nn.Module):
        def forward(self, z, y, k=None, yk=None):
            return z.sum()

    with pytest.raises(ValueError, match="anchors_in_candidates"):
        resolve_contrast_set(NoFlag(), "keys", 16)


def moco_step(seed: int, n: int = 8, queued: int = 12, queue_size: int = 12):
    """Queries z (N), their momentum keys k (own key = z + noise, same labels) and a queue of earlier keys."""
    z, y = random_batch(n, N_LABELS, seed)
    z = z.double()
    g = torch.Generator().manual_seed(seed + 1)
    k = z + 0.05 * torch.randn(z.shape, generator=g, dtype=torch.float64)
    zq, yq = random_batch(queued, N_LABELS, seed + 50)
    queue = EmbeddingQueue(queue_size, DIM, N_LABELS, dtype=torch.float64)
    queue.enqueue(zq.double(), yq)
    return z, y, k, zq.double(), yq, queue


def reference_candidates(contrast_set, z, y, k, zq, yq):
    """(keys, key labels, anchors_in_candidates) of the reference for ``contrast_set``."""
    if contrast_set == "queries+queue":
        return zq, yq, True
    return torch.cat([k, zq]), torch.cat([y, yq]), contrast_set == "queries+keys"


def built_loss(loss_fn, contrast_set, z, y, k, queue, warmup=False):
    builder = CandidateBuilder(contrast_set, queue=queue, queue_warmup=warmup)
    step = builder.step(z, y, batch_keys=CandidateBuilder.gather_keys(k, y))
    return step, step.loss(loss_fn)


@pytest.mark.parametrize("name", ["all", "any", "similarity_dissimilarity", "jaccard", "mulsupcon"])
@pytest.mark.parametrize("contrast_set", CONTRAST_SETS)
@pytest.mark.parametrize("seed", [0, 1])
def test_supcon_family_matches_reference_with_keys_and_queue(name, contrast_set, seed):
    z, y, k, zq, yq, queue = moco_step(seed)
    loss_fn = get_loss(name, temperature=0.2)
    step, got = built_loss(loss_fn, contrast_set, z, y, k, queue)
    keys, key_labels, aic = reference_candidates(contrast_set, z, y, k, zq, yq)
    want = reference_loss(name, z, y, keys, key_labels, temperature=0.2, anchors_in_candidates=aic)
    assert step.anchors_in_candidates is aic
    assert got.item() == pytest.approx(want, rel=1e-9)
    if contrast_set == PAPER_SETS[name]:  # the default differs from the other sets on this batch
        others = [
            built_loss(loss_fn, s, z, y, k, queue)[1].item() for s in CONTRAST_SETS if s != contrast_set
        ]
        assert all(abs(o - got.item()) > 1e-6 for o in others)


@pytest.mark.parametrize("name", ["mulsupcon", "any", "hbl"])
@pytest.mark.parametrize("contrast_set", CONTRAST_SETS)
def test_queue_of_label_rows_gives_sparse_keys_and_the_same_loss(name, contrast_set):
    """A queue that keeps label rows (label_format="sparse", the CPU default for wide label spaces) hands
    the loss sparse key labels, never a dense (K, L) matrix, and the loss is the same as with a bool queue."""
    z, y, k, zq, yq, bool_queue = moco_step(3)
    rows_queue = EmbeddingQueue(12, DIM, N_LABELS, dtype=torch.float64, label_format="sparse")
    rows_queue.enqueue(zq, yq.float().to_sparse())
    kwargs = {"k_min": 2} if name == "hbl" else {}
    loss_fn = get_loss(name, temperature=0.2, **kwargs)
    step, got = built_loss(loss_fn, contrast_set, z, y, k, rows_queue)
    dense_step, want = built_loss(loss_fn, contrast_set, z, y, k, bool_queue)
    assert step.key_labels.is_sparse and step.key_labels.dtype == torch.bool
    assert not dense_step.key_labels.is_sparse
    assert torch.equal(step.key_labels.to_dense(), dense_step.key_labels)
    assert got.item() == pytest.approx(want.item(), rel=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_msc_default_queries_plus_queue_matches_reference(seed):
    z, y, k, zq, yq, queue = moco_step(seed)
    loss_fn = get_loss("msc", num_labels=N_LABELS, embedding_dim=DIM).double()
    contrast_set = resolve_contrast_set(loss_fn, None, queue.size)
    assert contrast_set == "queries+queue"
    step, got = built_loss(loss_fn, contrast_set, z, y, k, queue)
    assert step.keys.shape[0] == queue.size  # the current keys are not candidates
    want = msc_reference(z, y, zq, yq, loss_fn.prototypes, 0.1, 0.1)
    assert got.item() == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_ws_mulsupcon_default_keys_matches_reference(seed):
    z, y, k, zq, yq, queue = moco_step(seed)
    loss_fn = get_loss("ws_mulsupcon")
    loss_fn.set_label_statistics(TRAIN)
    dbar, cbar = ws_class_weights(TRAIN)
    step, got = built_loss(loss_fn, resolve_contrast_set(loss_fn, None, queue.size), z, y, k, queue)
    assert not step.anchors_in_candidates and step.keys.shape[0] == z.shape[0] + queue.size
    keys, key_labels, _ = reference_candidates("keys", z, y, k, zq, yq)
    want = ws_paper_reference(z, y, keys, key_labels, dbar.tolist(), cbar.tolist(), 0.7, 0.1, False)
    assert got.item() == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize("seed", [0, 1])
def test_hbl_default_keys_matches_reference(seed):
    z, y, k, zq, yq, queue = moco_step(seed)
    loss_fn = get_loss("hbl", k_min=3, lambda_=0.5)
    step, got = built_loss(loss_fn, resolve_contrast_set(loss_fn, None, queue.size), z, y, k, queue)
    keys, key_labels, _ = reference_candidates("keys", z, y, k, zq, yq)
    base = reference_loss("mulsupcon", z, y, keys, key_labels, temperature=0.1, anchors_in_candidates=False)
    hbl = hbl_reference(z, y, keys, key_labels, 0.8, 0.1, 0.3, 3, anchors_in_candidates=False)
    assert hbl > 0 and step.components(loss_fn)["gate_open"] > 0
    assert got.item() == pytest.approx(base + 0.5 * hbl, rel=1e-9)


def test_queue_warmup_waits_for_a_full_queue():
    z, y, k, zq, yq, queue = moco_step(0, queued=6, queue_size=12)  # half-filled queue
    loss_fn = get_loss("mulsupcon")
    step, got = built_loss(loss_fn, "keys", z, y, k, queue, warmup=True)
    assert step.keys.shape[0] == z.shape[0]  # only the current keys
    want = reference_loss("mulsupcon", z, y, k, y, anchors_in_candidates=False)
    assert got.item() == pytest.approx(want, rel=1e-9)
    step, _ = built_loss(loss_fn, "keys", z, y, k, queue, warmup=False)
    assert step.keys.shape[0] == z.shape[0] + 6
    queue.enqueue(zq, yq)  # now full: the queue joins under warm-up too
    step, _ = built_loss(loss_fn, "keys", z, y, k, queue, warmup=True)
    assert step.keys.shape[0] == z.shape[0] + 12


def test_evaluation_and_batch_mode_are_in_batch():
    z, y, k, zq, yq, queue = moco_step(0)
    step = CandidateBuilder("keys", queue=queue).step(z, y, batch_keys=None)  # eval: no keys
    assert step.keys is None and step.anchors_in_candidates
    step = CandidateBuilder(None).step(z, y)
    assert step.keys is None


def test_max_candidates():
    assert max_candidates(32, 2, 1, 0, None) == 63
    assert max_candidates(32, 1, 2, 0, None) == 63
    assert max_candidates(32, 2, 1, 100, "keys") == 164
    assert max_candidates(32, 2, 1, 100, "queries+queue") == 163
    assert max_candidates(32, 2, 1, 100, "queries+keys") == 227
    # the queries of this process alone, the keys of both (they are gathered whatever the option)
    assert max_candidates(32, 2, 1, 0, None, gather=False) == 31
    assert max_candidates(32, 2, 1, 100, "keys", gather=False) == 164
    assert max_candidates(32, 2, 1, 100, "queries+keys", gather=False) == 195


@pytest.mark.parametrize("seed", [0, 1])
def test_mulsupcon_normalizers(seed):
    """'labels' = eq. 7 (sum_i |y_i|), 'pairs' = official code; equal when every pair has a positive (keys)."""
    z, y = random_batch(10, N_LABELS, seed)
    y[0] = 0
    y[0, N_LABELS - 1] = 1  # make sure some label may lack an in-batch positive
    pairs, labels = get_loss("mulsupcon"), get_loss("mulsupcon", normalizer="labels")
    want = reference_loss("mulsupcon", z, y, mulsupcon_normalizer="labels")
    assert labels(z, y).item() == pytest.approx(want, rel=1e-6)
    assert pairs(z, y).item() == pytest.approx(reference_loss("mulsupcon", z, y), rel=1e-6)
    k = z + 0.01
    a = pairs(z, y, k, y, anchors_in_candidates=False).item()
    b = labels(z, y, k, y, anchors_in_candidates=False).item()
    assert a == pytest.approx(b, rel=1e-6)
    with pytest.raises(ValueError, match="normalizer"):
        get_loss("mulsupcon", normalizer="anchors")


def test_mulsupcon_normalizers_differ_in_batch_mode():
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([[1, 0, 1], [1, 0, 0], [1, 0, 0], [0, 1, 0]])  # labels 2 and 1 have no other carrier
    p = get_loss("mulsupcon")(z, y).item()
    lab = get_loss("mulsupcon", normalizer="labels")(z, y).item()
    assert lab == pytest.approx(p * 3 / 5, rel=1e-6)  # 3 pairs with a positive out of sum |y| = 5


@pytest.mark.parametrize("seed", [0, 1])
def test_hbl_eq7_scaling(seed):
    """'eq7': base + lambda (N / P) L_HBL, i.e. eq. 7 (1/N sum_i (L_Con_i + lambda L_HBL_i), L_Con_i summed
    over the anchor's labels) multiplied by N / P (eq. 7 = the value times P / N)."""
    z, y, k, zq, yq, queue = moco_step(seed)
    keys, key_labels = torch.cat([k, zq]), torch.cat([y, yq])
    lam = 0.5
    base_scaled = get_loss("hbl", k_min=3, lambda_=lam)
    eq7 = get_loss("hbl", k_min=3, lambda_=lam, lambda_scaling="eq7")
    got_base = base_scaled(z, y, keys, key_labels, anchors_in_candidates=False).item()
    got = eq7(z, y, keys, key_labels, anchors_in_candidates=False).item()
    base = reference_loss("mulsupcon", z, y, keys, key_labels, anchors_in_candidates=False)
    hbl = hbl_reference(z, y, keys, key_labels, 0.8, 0.1, 0.3, 3, anchors_in_candidates=False)
    n = z.shape[0]
    key_sets = [set(torch.nonzero(r).flatten().tolist()) for r in key_labels]
    pairs = sum(
        1 for r in y for lab in torch.nonzero(r).flatten().tolist() if any(lab in t for t in key_sets)
    )
    assert got_base == pytest.approx(base + lam * hbl, rel=1e-9)
    assert got == pytest.approx(base + lam * n / pairs * hbl, rel=1e-9)
    literal = base * pairs / n + lam * hbl  # eq. (7) with sum_l over the anchor's labels
    assert got * pairs / n == pytest.approx(literal, rel=1e-9)
    assert not math.isclose(got, got_base)
    any_based = get_loss("hbl", base="any", k_min=3, lambda_scaling="eq7")  # per-anchor base: no rescaling
    assert any_based(z, y, keys, key_labels).item() == pytest.approx(
        get_loss("hbl", base="any", k_min=3)(z, y, keys, key_labels).item(), rel=1e-12
    )
    with pytest.raises(ValueError, match="lambda_scaling"):
        get_loss("hbl", lambda_scaling="paper")


def test_hbl_eq7_words_state_the_computed_factor():
    """The docstring and docs/losses.md name the factor test_hbl_eq7_scaling measures (value = eq. 7 x N / P),
    and nowhere the inverse or an undirected "up to" factor."""
    import os
    import re

    import hf_mlcl.losses.hbl as hbl_module

    docs = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "losses.md")
    with open(docs, encoding="utf-8") as f:
        texts = {"hbl.py": hbl_module.__doc__, "docs/losses.md": f.read()}
    for where, text in texts.items():
        flat = " ".join(text.split())
        assert re.search(r"eq\. \(?7\)? multiplied by N / P", flat), where
        assert re.search(r"eq\. \(?7\)? = returned value (\*|x) P / N", flat), where
        assert not re.search(
            r"multiplied by (the per-batch constant )?P / N|up to the per-batch factor", flat
        ), where


@pytest.mark.parametrize("beta", [1.0, 1.5])
def test_msc_rejects_beta_of_one_or_more(beta):
    with pytest.raises(ValueError, match="0 < beta < 1"):
        get_loss("msc", num_labels=3, embedding_dim=4, beta=beta)
