"""The fast paths of the loss engine give the general path's values and gradients (issue 16).

* the fused kernel (:mod:`hf_mlcl.losses.fused`) against autograd through
  ``weighted_contrastive_loss`` (tests/losses/_reference.py) for every ``LossTerms`` loss, in float64,
  in-batch and with keys, with anchors without positives, empty label rows, sparse labels, a lone
  anchor, extreme temperatures and ``normalize=False``;
* msc and ws_mulsupcon (paper variant) against their previous autograd formulas;
* the one-pass scan that turns large dense label matrices into sparse ones (values, gradients and
  every label error of the elementwise check);
* the NaN / inf check of the embeddings, now run on the scalar result of the fused kernel.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from _reference import weighted_contrastive_loss

from hf_mlcl.labels import multihot as M
from hf_mlcl.losses import LossTerms, get_loss
from hf_mlcl.losses.registry import list_contrastive_losses
from hf_mlcl.losses.ws_mulsupcon import _masked_lse, _weighted_logp_sum

TERMS_LOSSES = [
    ("all", {}),
    ("any", {}),
    ("jaccard", {}),
    ("similarity_dissimilarity", {}),
    ("similarity_dissimilarity", {"weight_in_log": True}),
    ("mulsupcon", {}),
]


def _batch(n, n_labels, dim, seed, p=0.35, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, dim, generator=g, dtype=dtype)
    y = (torch.rand(n, n_labels, generator=g) < p).to(dtype)
    return z, y


def _cases():
    """(name, embeddings, labels, keys, key labels) covering the degenerate anchors."""
    z, y = _batch(9, 5, 4, 0)
    y[0] = 0  # empty label set
    y[1] = 0
    y[1, 4] = 1  # label no other row carries -> no positive
    y[3] = y[2]
    zk, yk = _batch(6, 5, 4, 1)
    yk[0] = y[2]
    yield "in-batch", z, y, None, None
    yield "keys", z, y, zk, yk
    yield "no positive", z[:5], torch.eye(5, 5, dtype=z.dtype), None, None
    yield "all empty", z[:4], torch.zeros(4, 5, dtype=z.dtype), None, None
    yield "lone anchor", z[:1], y[2:3], None, None
    yield "lone anchor + keys", z[:1], y[2:3], zk, yk


def _general(loss, z, y, zk, yk, anchors_in_candidates=True):
    """The loss through the general (autograd) engine path, from the same LossTerms."""
    ctx = loss.prepare(z, y, zk, yk, anchors_in_candidates=anchors_in_candidates)
    terms = loss.build_terms(ctx)
    out, _, _ = weighted_contrastive_loss(
        ctx.logits,
        terms.weights,
        ctx.contrast_mask,
        terms.normalizer,
        constant=terms.constant,
        reduction_denominator=terms.reduction_denominator,
        anchor_valid=terms.anchor_valid,
    )
    return out


def _value_and_grads(fn, z, zk):
    z = z.clone().requires_grad_(True)
    zk = None if zk is None else zk.clone().requires_grad_(True)
    out = fn(z, zk)
    grads = torch.autograd.grad(out, [t for t in (z, zk) if t is not None], allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (z, zk))]


@pytest.mark.parametrize("name,kwargs", TERMS_LOSSES)
@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("temperature", [0.01, 0.1, 5.0])
def test_fused_kernel_matches_general_path(name, kwargs, normalize, temperature):
    loss = get_loss(name, temperature=temperature, normalize=normalize, **kwargs)
    for case, z, y, zk, yk in _cases():
        if not normalize:
            z = z * 0.3  # keep s = z.c / tau moderate without normalisation
            zk = None if zk is None else zk * 0.3
        for labels, key_labels in ((y, yk), (y.to_sparse(), None if yk is None else yk.to_sparse())):
            fast, g_fast = _value_and_grads(lambda e, k, a=labels, b=key_labels: loss(e, a, k, b), z, zk)
            slow, g_slow = _value_and_grads(
                lambda e, k, a=labels, b=key_labels: _general(loss, e, a, k, b), z, zk
            )
            torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12, msg=f"{case}: value")
            for gf, gs in zip(g_fast, g_slow):
                torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-12, msg=f"{case}: gradient")


@pytest.mark.parametrize("name,kwargs", TERMS_LOSSES)
def test_fused_kernel_matches_general_path_on_the_keys_only_contrast_set(name, kwargs):
    """anchors_in_candidates=False (MulSupCon's 'keys' set): the keys are the only candidates."""
    loss = get_loss(name, **kwargs)
    for case, z, y, zk, yk in _cases():
        if zk is None:
            continue
        fast, g_fast = _value_and_grads(
            lambda e, k, a=y, b=yk: loss(e, a, k, b, anchors_in_candidates=False), z, zk
        )
        slow, g_slow = _value_and_grads(lambda e, k, a=y, b=yk: _general(loss, e, a, k, b, False), z, zk)
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12, msg=case)
        for gf, gs in zip(g_fast, g_slow):
            torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-12, msg=case)


def test_fused_kernel_float32_matches_float64():
    z, y = _batch(64, 10, 128, 3, p=0.1, dtype=torch.float32)
    for name, kwargs in TERMS_LOSSES:
        loss = get_loss(name, **kwargs)
        v32, (g32,) = _value_and_grads(lambda e, k, fn=loss: fn(e, y), z, None)
        v64, (g64,) = _value_and_grads(lambda e, k, fn=loss: fn(e, y.double()), z.double(), None)
        torch.testing.assert_close(v32.double(), v64, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(g32.double(), g64, rtol=1e-4, atol=1e-6)


def test_weights_on_the_diagonal_are_ignored_like_the_general_path():
    """A custom loss may hand the engine weights with the anchor's own column set: it is outside
    the contrast set in both paths (and the loss's cached relations are not modified)."""

    class SelfWeighted(type(get_loss("jaccard"))):
        def build_terms(self, ctx):
            w = ctx.jaccard  # 1 on the diagonal for non-empty rows
            return LossTerms(weights=w, normalizer=w.sum(dim=1))

    loss = SelfWeighted()
    for case, z, y, zk, yk in _cases():
        fast, g_fast = _value_and_grads(lambda e, k, a=y, b=yk: loss(e, a, k, b), z, zk)
        slow, g_slow = _value_and_grads(lambda e, k, a=y, b=yk: _general(loss, e, a, k, b), z, zk)
        torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12, msg=case)
        for gf, gs in zip(g_fast, g_slow):
            torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-12, msg=case)


def _msc_reference(loss, z, y, zk, yk):
    """ABALONE L_MSC as computed before the fused kernel (autograd through every step)."""
    from hf_mlcl.labels.statistics import PairLabelView

    ctx = loss.prepare(z, y, zk, yk)
    dtype = ctx.dtype
    protos = loss.normalized_prototypes(dtype)
    with torch.no_grad():
        view = PairLabelView(ctx.anchor_labels, ctx.candidate_labels)
        sizes = ctx.anchor_sizes
        positive = (ctx.inter > 0) & ctx.contrast_mask
        f = torch.where(positive, 1.0 / ctx.union.clamp_min(1), torch.zeros((), dtype=dtype))
        r = view.on_pairs(1.0 / (1.0 + view.collect(f)))  # 0 at grid cells off the anchors' labels
        w = f * view.spread(r)
        valid = sizes > 0
    s = ctx.logits
    sp = ctx.anchors @ protos.T / ctx.temperature
    has_any = ctx.contrast_mask.any(dim=1)
    masked = s.masked_fill(~ctx.contrast_mask, float("-inf")).masked_fill(~has_any[:, None], 0.0)
    lse_s = torch.where(has_any, torch.logsumexp(masked, dim=1), torch.tensor(float("-inf"), dtype=dtype))
    lse = torch.logaddexp(lse_s + math.log(loss.beta), torch.logsumexp(sp, dim=1))
    n = ctx.num_anchors
    proto_term = torch.zeros(n, dtype=dtype).index_add(0, view.rows, r * sp[view.rows, view.cols])
    weight_sum = w.sum(dim=1) + torch.zeros(n, dtype=dtype).index_add(0, view.rows, r)
    per_anchor = -((w * s).sum(dim=1) + proto_term - weight_sum * lse) / sizes.clamp_min(1)
    per_anchor = torch.where(valid, per_anchor, torch.zeros_like(per_anchor))
    return per_anchor.sum() / valid.sum().clamp_min(1) + 0.0 * sp.sum()


@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_msc_fused_matches_previous_formula(beta):
    for temperature in (0.01, 0.1):
        loss = get_loss("msc", num_labels=5, embedding_dim=4, beta=beta, temperature=temperature).double()
        for case, z, y, zk, yk in _cases():
            for labels in (y, y.to_sparse()):
                outs = []
                for fn in (loss, lambda *a, m=loss: _msc_reference(m, *a)):
                    loss.zero_grad()
                    e = z.clone().requires_grad_(True)
                    k = None if zk is None else zk.clone().requires_grad_(True)
                    out = fn(e, labels, k, yk)
                    out.backward()
                    grads = [e.grad, None if k is None else k.grad, loss.prototypes.grad.clone()]
                    outs.append((out.detach(), grads))
                (v1, g1), (v2, g2) = outs
                torch.testing.assert_close(v1, v2, rtol=1e-10, atol=1e-12, msg=case)
                for a, b in zip(g1, g2):
                    if a is not None:
                        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12, msg=case)


def _ws_reference(loss, z, y, zk, yk, anchors_in_candidates=True):
    """ws-MulSupCon (paper variant) as computed before the fused kernel, with its components."""
    from hf_mlcl.labels.statistics import PairLabelView

    ctx = loss.prepare(z, y, zk, yk, anchors_in_candidates=anchors_in_candidates)
    own = 1.0 if anchors_in_candidates else 0.0
    dtype, contrast = ctx.dtype, ctx.contrast_mask
    with torch.no_grad():
        size_a, size_c = ctx.anchor_sizes, ctx.candidate_sizes
        single_a, multi_a, healthy_a = size_a == 1, size_a >= 2, size_a == 0
        single_c, multi_c, healthy_c = size_c == 1, size_c >= 2, size_c == 0
        view = PairLabelView(ctx.anchor_labels, ctx.candidate_labels)
        rows, cols = view.rows, view.cols
        single_pair = single_a[rows]
        cw = loss._class_weights(cols, single_pair, ctx.anchor_labels.shape[1], dtype)
        n_s = view.candidate_counts(single_c.to(dtype)) - own * single_pair.to(dtype)
        n_m = view.candidate_counts(multi_c.to(dtype)) - own * multi_a[rows].to(dtype)
        zero = torch.zeros((), dtype=dtype)
        q_s = torch.where(n_s > 0, cw / n_s.clamp_min(1), zero)
        q_m = torch.where(n_m > 0, cw / n_m.clamp_min(1), zero)
        iou = ctx.jaccard * contrast
        w_s = iou * single_c[None, :] * view.spread(q_s)
        w_m = iou * multi_c[None, :] * view.spread(q_m)
        healthy_pos = contrast & healthy_c[None, :]
        n_h = healthy_pos.sum(dim=1).to(dtype)
        valid_h = healthy_a & (n_h > 0)
        w_h = torch.where(valid_h[:, None] & healthy_pos, 1.0 / n_h.clamp_min(1)[:, None], zero)
        num_h = valid_h.sum().to(dtype)
    s = ctx.logits
    lse = _masked_lse(s, contrast)
    per_anchor = -_weighted_logp_sum(w_s + w_m, s, lse)
    ok = (n_s + n_m) > 0

    def div(total, count):
        return total / count if float(count) > 0 else ctx.zero()

    l_ws = div(torch.where(single_a, per_anchor, zero).sum(), (ok & single_a[rows]).sum().to(dtype))
    l_wm = div(torch.where(multi_a, per_anchor, zero).sum(), (ok & multi_a[rows]).sum().to(dtype))
    l_h = div(-_weighted_logp_sum(w_h, s, lse).sum(), num_h)
    return (1 - loss.lambda_) * (l_ws + l_wm) + loss.lambda_ * l_h, {"ws": l_ws, "wm": l_wm, "h": l_h}


def test_ws_mulsupcon_fused_matches_previous_formula():
    g = torch.Generator().manual_seed(5)
    train = (torch.rand(40, 5, generator=g) < 0.3).double()
    for class_weights in (True, False):
        loss = get_loss("ws_mulsupcon", class_weights=class_weights).double()
        if class_weights:
            loss.set_label_statistics(train)
        for (case, z, y, zk, yk), aic in [(c, True) for c in _cases()] + [
            (c, False) for c in _cases() if c[3] is not None
        ]:
            fast, g_fast = _value_and_grads(
                lambda e, k, fn=loss, a=y, b=yk, f=aic: fn(e, a, k, b, anchors_in_candidates=f), z, zk
            )
            comps = loss.components(z, y, zk, yk, anchors_in_candidates=aic)
            slow, g_slow = _value_and_grads(
                lambda e, k, fn=loss, a=y, b=yk, f=aic: _ws_reference(fn, e, a, k, b, f)[0], z, zk
            )
            torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12, msg=case)
            for gf, gs in zip(g_fast, g_slow):
                torch.testing.assert_close(gf, gs, rtol=1e-9, atol=1e-12, msg=case)
            _, parts = _ws_reference(loss, z, y, zk, yk, aic)
            for key, value in parts.items():
                assert comps[key] == pytest.approx(float(value), rel=1e-9, abs=1e-12), (case, key)


# ------------------------------------------------------------------ dense labels, large label space
def _large_dense(n, n_labels, seed, per_row=4):
    g = torch.Generator().manual_seed(seed)
    y = torch.zeros(n, n_labels)
    cols = torch.randint(0, n_labels, (n, per_row), generator=g)
    y.scatter_(1, cols, 1.0)
    y[0] = 0
    return y


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.float16, torch.bool, torch.uint8, torch.int64]
)
def test_large_dense_labels_are_scanned_to_sparse_exactly(dtype):
    y = _large_dense(300, 4001, 0)  # 1.2M entries, L > 1024: scanned
    # a run of labels: several set elements per 8-byte word, across a 256-byte block boundary (flat
    # index 3 * 4001 + 285 = 48 * 256) whatever the element size
    y[3, 270:300] = 1
    y = y.to(dtype)
    out = M.as_multihot(y, allow_sparse=True)
    assert M.is_sparse(out) and out.is_coalesced()
    torch.testing.assert_close(out.to_dense(), y.float())
    sliced = y[:, 1:]  # not contiguous
    torch.testing.assert_close(M.as_multihot(sliced, allow_sparse=True).to_dense(), sliced.float())
    assert not M.is_sparse(M.as_multihot(y))  # only on request (the contrastive losses ask)


def test_large_dense_labels_keep_every_label_error():
    y = _large_dense(300, 4001, 1)
    y[7, 9] = -0.0  # a zero with its sign bit set is a 0 label
    torch.testing.assert_close(M.as_multihot(y, allow_sparse=True).to_dense(), y.abs())
    for bad, match in (
        (2.0, "binary"),
        (0.5, "binary"),
        (-1.0, "binary"),
        (float("inf"), "binary"),
        (float("nan"), "NaN"),
    ):
        for where in ((100, 4000), (299, 4000), (0, 0)):  # incl. the last entry (tail of the byte scan)
            yb = y.clone()
            yb[where] = bad
            with pytest.raises(ValueError, match=match):
                M.as_multihot(yb, allow_sparse=True)
            with pytest.raises(ValueError, match=match):
                get_loss("any")(torch.randn(300, 8), yb)


def _accelerator_path(fn):
    """``fn()`` on the accelerator path (hf_mlcl.host_sync simulates it on CPU tensors) and its host reads."""
    from hf_mlcl.host_sync import HostSyncCounter
    from hf_mlcl.labels.host_reads import accelerator_path

    with accelerator_path(), HostSyncCounter() as counter:
        out = fn()
    return out, counter


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool, torch.int64])
def test_the_scan_finds_the_same_labels_on_both_paths(dtype):
    y = _large_dense(300, 4001, 5)
    y[3, 270:300] = 1
    if dtype.is_floating_point:
        y[7, 9] = -0.0  # a zero label on both paths
    y = y.to(dtype)
    cpu = M.as_multihot(y, allow_sparse=True)
    acc, counter = _accelerator_path(lambda: M.as_multihot(y, allow_sparse=True))
    assert M.is_sparse(acc) and acc.is_coalesced() and torch.equal(acc.indices(), cpu.indices())
    assert torch.equal(acc.values(), cpu.values())
    # one nonzero (its count) and, unless the labels are bool, the check of the found values
    assert counter.count == (1 if dtype == torch.bool else 2), counter.report()
    unchecked, counter = _accelerator_path(lambda: M.as_multihot(y, allow_sparse=True, check_values=False))
    assert torch.equal(unchecked.indices(), cpu.indices()) and counter.count == 1, counter.report()
    for bad, match in ((2.0, "binary"), (float("nan"), "NaN")):
        if dtype.is_floating_point:
            yb = y.clone()
            yb[299, 4000] = bad
            with pytest.raises(ValueError, match=match):
                _accelerator_path(lambda yb=yb: M.as_multihot(yb, allow_sparse=True))


def test_sparse_labels_are_checked_in_one_host_read():
    y = _large_dense(300, 4001, 6).to_sparse()
    out, counter = _accelerator_path(lambda: M.as_multihot(y, allow_sparse=True))
    assert torch.equal(out.to_dense(), y.to_dense()) and counter.count == 1, counter.report()
    # explicit zeros are dropped (reads follow only then), a non-binary value still raises
    with_zero = torch.sparse_coo_tensor(
        y.indices(), y.values().index_fill(0, torch.tensor([0, 5]), 0.0), y.shape
    )
    out, counter = _accelerator_path(lambda: M.as_multihot(with_zero, allow_sparse=True))
    assert out._nnz() == y._nnz() - 2 and torch.equal(out.to_dense(), with_zero.to_dense())
    bad = torch.sparse_coo_tensor(y.indices(), y.values().index_fill(0, torch.tensor([3]), 2.0), y.shape)
    with pytest.raises(ValueError, match="binary"):
        _accelerator_path(lambda: M.as_multihot(bad, allow_sparse=True))


@pytest.mark.parametrize("name", list_contrastive_losses())
def test_dense_labels_cost_the_host_reads_of_sparse_ones_in_a_large_label_space(name):
    """With keys in a label space wide enough to go sparse, a dense label matrix costs the host reads of a
    sparse one, whatever the loss: one per matrix (the count of its non-zeros; for sparse labels the search
    for explicit zeros). With the input checks on, dense labels read the values found once more per matrix
    (sparse labels fold the check into their one read)."""
    from hf_mlcl.losses.input_checks import set_input_checks

    n_labels = 2048
    y, yk = _large_dense(520, n_labels, 7), _large_dense(600, n_labels, 8)  # both scanned
    g = torch.Generator().manual_seed(7)
    z, zk = torch.randn(520, 16, generator=g), torch.randn(600, 16, generator=g)
    kwargs = {"num_labels": n_labels, "embedding_dim": 16} if name == "msc" else {}
    loss = get_loss(name, **kwargs)
    if getattr(loss, "requires_label_statistics", False):
        loss.set_label_statistics(y)
    reads = {}
    for checks in (True, False):
        set_input_checks(loss, checks)
        for layout, (a, b) in {"dense": (y, yk), "sparse": (y.to_sparse(), yk.to_sparse())}.items():
            value, counter = _accelerator_path(
                lambda a=a, b=b: loss(z.clone().requires_grad_(True), a, zk, b)
            )
            reads[checks, layout] = counter.count
            value.backward()
    # one per label matrix (its explicit zeros), two in the sparse label product (the anchors' labels, the
    # candidate entries kept), for msc two more (its per-label pairs: the anchors' labels, the entries kept)
    assert reads[False, "sparse"] == (6 if name == "msc" else 4), reads
    assert reads[False, "dense"] == reads[False, "sparse"], reads
    assert reads[True, "dense"] == reads[True, "sparse"] + 2, reads  # one value check per matrix
    assert reads[True, "sparse"] == reads[False, "sparse"] + 1, reads  # the finite check of the result


def test_dense_but_not_sparse_large_matrix_stays_dense():
    g = torch.Generator().manual_seed(2)
    y = (torch.rand(300, 4000, generator=g) < 0.2).float()
    assert not M.is_sparse(M.as_multihot(y, allow_sparse=True))


@pytest.mark.parametrize("name", list_contrastive_losses())
def test_dense_and_sparse_labels_give_the_same_loss_in_a_large_label_space(name):
    n_labels = 2048
    y = _large_dense(520, n_labels, 3)  # 1.06M entries: the dense input is scanned to sparse
    y[5] = y[4]
    yk = _large_dense(40, n_labels, 4)
    yk[0] = y[4]
    g = torch.Generator().manual_seed(4)
    z, zk = (
        torch.randn(520, 16, generator=g, dtype=torch.float64),
        torch.randn(40, 16, generator=g, dtype=torch.float64),
    )
    kwargs = {"num_labels": n_labels, "embedding_dim": 16} if name == "msc" else {}
    if name == "hbl":
        kwargs["k_min"] = 1
    loss = get_loss(name, **kwargs).double()
    if getattr(loss, "requires_label_statistics", False):
        loss.set_label_statistics(y)
    for keys in (False, True):
        args = (zk, yk) if keys else (None, None)
        key_labels = args[1]
        sparse_keys = None if key_labels is None else key_labels.to_sparse()
        dense, g_dense = _value_and_grads(lambda e, k, b=key_labels: loss(e, y, k, b), z, args[0])
        sparse, g_sparse = _value_and_grads(
            lambda e, k, b=sparse_keys: loss(e, y.to_sparse(), k, b), z, args[0]
        )
        torch.testing.assert_close(dense, sparse, rtol=1e-10, atol=1e-12)
        for a, b in zip(g_dense, g_sparse):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


# ------------------------------------------------------------------ NaN / inf embeddings
@pytest.mark.parametrize("name", list_contrastive_losses())
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_embeddings_and_keys_raise_for_every_loss(name, bad):
    kwargs = {"num_labels": 5, "embedding_dim": 4} if name == "msc" else {}
    for normalize in (True, False):
        loss = get_loss(name, normalize=normalize, **kwargs)
        if getattr(loss, "requires_label_statistics", False):
            loss.set_label_statistics(torch.eye(5))
        for _case, z, y, zk, yk in _cases():
            z, y = z.float(), y.float()
            zk, yk = (None, None) if zk is None else (zk.float(), yk.float())
            for row in {0, z.shape[0] - 1}:
                zb = z.clone()
                zb[row, 1] = bad
                with pytest.raises(ValueError, match="embeddings contain NaN or inf"):
                    loss(zb, y, zk, yk)
            if zk is not None:
                kb = zk.clone()
                kb[-1, 0] = bad
                with pytest.raises(ValueError, match="key_embeddings contain NaN or inf"):
                    loss(z, y, kb, yk)


def test_plain_supcon_peer_of_the_benchmark_matches_all_on_single_labels():
    """The benchmark's ten-line SupCon peer computes the same loss as ``all`` on one-hot rows."""
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "loss_speed.py"
    spec = importlib.util.spec_from_file_location("loss_speed", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    g = torch.Generator().manual_seed(0)
    z = torch.randn(32, 8, generator=g)
    classes = torch.randint(0, 5, (32,), generator=g)
    want = get_loss("all")(z, F.one_hot(classes, 5).float())
    torch.testing.assert_close(mod.plain_supcon(z, classes), want, rtol=1e-5, atol=1e-6)
    y = (torch.rand(32, 6, generator=g) < 0.3).float()
    torch.testing.assert_close(
        mod.plain_supcon(z, y, single=False), get_loss("any")(z, y), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("keys", [False, True])
def test_kept_scores_order_candidates_like_the_similarities(keys):
    """keep_scores: the (N, M) scores are cos / tau shifted by a per-row constant, -inf at (i, i)."""
    from hf_mlcl.losses.fused import fused_contrastive_loss

    g = torch.Generator().manual_seed(3)
    z = torch.randn(6, 5, generator=g, dtype=torch.float64)
    k = torch.randn(4, 5, generator=g, dtype=torch.float64) if keys else None
    m = 6 + (4 if keys else 0)
    w = torch.rand(6, m, generator=g, dtype=torch.float64)
    w[range(6), range(6)] = 0
    coef = torch.full((6,), 1 / 6, dtype=torch.float64)
    loss, _, scores = fused_contrastive_loss(z, k, w, coef, 0.1, normalize=True, keep_scores=True)
    plain, _ = fused_contrastive_loss(z, k, w, coef, 0.1, normalize=True)
    assert loss.item() == plain.item()
    cands = z if k is None else torch.cat([z, k])
    cos = F.normalize(z, dim=-1) @ F.normalize(cands, dim=-1).T / 0.1
    assert torch.isneginf(scores.diagonal()).all()
    off = ~torch.eye(6, m, dtype=torch.bool)
    shift = (scores - cos)[off].view(6, m - 1)
    torch.testing.assert_close(shift, shift[:, :1].expand_as(shift))  # one constant per row
    assert not scores.requires_grad


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("all", {}),
        ("any", {}),
        ("jaccard", {}),
        ("similarity_dissimilarity", {}),
        ("similarity_dissimilarity", {"weight_in_log": True}),
        ("mulsupcon", {}),
    ],
)
def test_terms_that_skip_the_diagonal_check_have_a_zero_diagonal(name, kwargs):
    """LossTerms.zero_diagonal is a promise the engine relies on: check it, and the given weight sums."""
    g = torch.Generator().manual_seed(5)
    y = (torch.rand(12, 4, generator=g) < 0.5).float()
    y[0] = y[1]  # an exact duplicate set, so ALL has positives
    loss = get_loss(name, **kwargs)
    ctx = loss.prepare(torch.randn(12, 6, generator=g), y)
    terms = loss.build_terms(ctx)
    assert terms.zero_diagonal
    assert (terms.weights.diagonal() == 0).all()
    if terms.weight_sums is not None:
        torch.testing.assert_close(terms.weight_sums, terms.weights.sum(dim=1))


@pytest.mark.slow  # keeps the default suite within its 10 minutes (make test-slow)
def test_loss_speed_benchmark_quick_run_prints_every_table_with_equal_values():
    """benchmarks/loss_speed.py --quick runs end to end: the small-step table with wall ratios, the dense vs
    sparse table with its read floor, the MIMIC-scale table, and the Python-loop versions give the same
    values as the engine (each check the script prints must hold)."""
    import os
    import pathlib
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [
            sys.executable,
            str(root / "benchmarks" / "loss_speed.py"),
            "--quick",
            "--no-memory",
            "--queue-formats",
            "20:2,300:3",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=root,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "wall single" in out and "after read" in out and "floor+protos" in out and "queue keys" in out
    assert "bool dense (N, L)" in out
    # the queue-format table: one row per label-space size, with the format "auto" picks there
    rows = [line.split() for line in out.splitlines() if line.strip().startswith(("20 ", "300 "))]
    assert [(r[0], r[-1]) for r in rows] == [("20", "bool"), ("300", "sparse")], rows
    assert "VALUES DIFFER" not in out  # dense (float32 or bool) and sparse labels give the same loss
    loops = [line for line in out.splitlines() if "(loop)" in line]
    assert len(loops) == 3 and all(" True (" in line for line in loops), loops


@pytest.mark.parametrize("keys, anchors_in_candidates", [(False, True), (True, True), (True, False)])
def test_raw_candidates_follow_the_candidates_rule_unnormalised(keys, anchors_in_candidates):
    """ContrastContext.raw_candidates: the rows of ``candidates`` before normalisation, in the same order."""
    z, y = _batch(7, 5, 4, 0)
    zk, yk = _batch(5, 5, 4, 1) if keys else (None, None)
    loss = get_loss("mulsupcon")  # normalize=True
    ctx = loss.prepare(z, y, zk, yk, anchors_in_candidates=anchors_in_candidates)
    expected = zk if not anchors_in_candidates else (torch.cat([z, zk]) if keys else z)
    assert torch.equal(ctx.raw_candidates, expected)
    assert torch.allclose(F.normalize(ctx.raw_candidates, dim=-1), ctx.candidates, atol=1e-12)
    assert not torch.allclose(ctx.raw_candidates, ctx.candidates)  # the inputs are not unit-norm
