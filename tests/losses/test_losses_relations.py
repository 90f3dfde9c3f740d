"""Label-relation statistics (hf_mlcl.labels.relations) vs set-based loops, dense and sparse, plus the
engine's masking / no-positive policy (hf_mlcl.losses.core)."""

from __future__ import annotations

import pytest
import torch
from _reference import masked_log_softmax, weighted_contrastive_loss

from hf_mlcl.labels import multihot as M
from hf_mlcl.labels import relations as R


def _labels(n, n_labels, seed, p=0.35):
    g = torch.Generator().manual_seed(seed)
    y = (torch.rand(n, n_labels, generator=g) < p).float()
    y[0] = 0
    return y


def _sets(y):
    return [set(torch.nonzero(r).flatten().tolist()) for r in y]


LAYOUTS = {
    "float": lambda y: y,
    "bool": lambda y: y.bool(),
    "int": lambda y: y.long(),
    "coo": lambda y: y.to_sparse(),
    "csr": lambda y: y.to_sparse_csr(),
    "coo_bool": lambda y: y.bool().to_sparse(),
}


@pytest.mark.parametrize("layout_a", list(LAYOUTS))
@pytest.mark.parametrize("layout_c", ["float", "coo", "csr"])
def test_pair_statistics_match_set_loops(layout_a, layout_c):
    ya_d, yc_d = _labels(7, 9, 0), _labels(11, 9, 1)
    ya = M.as_multihot(LAYOUTS[layout_a](ya_d))
    yc = M.as_multihot(LAYOUTS[layout_c](yc_d))
    assert M.is_sparse(ya) == layout_a.startswith(("coo", "csr"))
    inter = R.intersections(ya, yc)
    sa, sc = R.label_sizes(ya), R.label_sizes(yc)
    union, eq, jac = R.unions(sa, sc, inter), R.equality(sa, sc, inter), R.jaccard(sa, sc, inter)
    A, C = _sets(ya_d), _sets(yc_d)
    for i, S in enumerate(A):
        assert sa[i].item() == len(S)
        for a, T in enumerate(C):
            assert inter[i, a].item() == len(S & T)
            assert union[i, a].item() == len(S | T)
            assert bool(eq[i, a]) == (S == T)
            assert jac[i, a].item() == pytest.approx(len(S & T) / len(S | T) if S | T else 0.0)
    torch.testing.assert_close(R.label_counts(yc), yc_d.sum(0))


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("with_keys", [False, True])
def test_mulsupcon_inverse_count_weights_match_loop(sparse, with_keys):
    y = _labels(8, 6, 3, p=0.4)
    yk = _labels(5, 6, 4, p=0.4) if with_keys else None
    ya = M.as_multihot(y.to_sparse() if sparse else y)
    yc = R.cat_labels(ya, None if yk is None else M.as_multihot(yk.to_sparse() if sparse else yk))
    counts = R.candidate_label_counts(ya, yc, anchors_in_candidates=True)
    assert M.is_sparse(counts) == sparse  # sparse stays sparse
    w, pairs = R.inverse_count_weights(ya, yc, anchors_in_candidates=True)
    A = _sets(y)
    C = A + ([] if yk is None else _sets(yk))
    for i, S in enumerate(A):
        others = [a for a in range(len(C)) if a != i]
        n_l = {lab: sum(1 for a in others if lab in C[a]) for lab in S}
        dense_counts = counts.to_dense() if sparse else counts
        for lab in range(6):
            assert dense_counts[i, lab].item() == (n_l.get(lab, 0))
        assert pairs[i].item() == sum(1 for v in n_l.values() if v > 0)
        for a in others:
            want = sum(1.0 / n_l[lab] for lab in S & C[a] if n_l[lab] > 0)
            assert w[i, a].item() == pytest.approx(want, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("sparse", [False, True])
def test_inverse_count_weights_with_intersections_share_the_product(sparse):
    """with_intersections: the same W bit for bit, plus exact abs(S & T) counts (one product when sparse)."""
    y, yk = _labels(9, 7, 3, p=0.4), _labels(6, 7, 4, p=0.4)
    ya = M.as_multihot(y.to_sparse() if sparse else y)
    yc = R.cat_labels(ya, M.as_multihot(yk.to_sparse() if sparse else yk))
    for dtype in (torch.float32, torch.float64):
        w, pairs = R.inverse_count_weights(ya, yc, anchors_in_candidates=True, dtype=dtype)
        w2, pairs2, inter = R.inverse_count_weights(
            ya, yc, anchors_in_candidates=True, dtype=dtype, with_intersections=True
        )
        assert torch.equal(w2, w) and torch.equal(pairs2, pairs) and inter.dtype == dtype
        assert torch.equal(inter, (y.double() @ torch.cat([y, yk]).double().T).to(dtype))


def test_as_multihot_validation_messages():
    with pytest.raises(ValueError, match="2-D"):
        M.as_multihot(torch.ones(3))
    with pytest.raises(ValueError, match="binary"):
        M.as_multihot(torch.tensor([[0, 3]]))
    with pytest.raises(ValueError, match="NaN"):
        M.as_multihot(torch.tensor([[0.0, float("nan")]]))
    with pytest.raises(ValueError, match="torch.Tensor"):
        M.as_multihot([[0, 1]])
    # duplicate COO entries summing to 2 are not a multi-hot matrix
    dup = torch.sparse_coo_tensor(
        torch.tensor([[0, 0], [1, 1]]), torch.tensor([1.0, 1.0]), (1, 3), check_invariants=False
    )
    with pytest.raises(ValueError, match="binary"):
        M.as_multihot(dup)
    # explicit zeros in a sparse matrix are dropped
    z = torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 2]]), torch.tensor([1.0, 0.0]), (1, 3))
    assert M.as_multihot(z)._nnz() == 1
    with pytest.raises(ValueError, match="label width"):
        R.intersections(M.as_multihot(torch.ones(2, 3)), M.as_multihot(torch.ones(2, 4)))


def test_engine_masked_rows_and_weights():
    logits = torch.tensor([[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]], requires_grad=True)
    mask = torch.tensor([[False, True, True], [False, False, False]])
    logp = masked_log_softmax(logits, mask)
    lse = torch.logsumexp(torch.tensor([2.0, 3.0]), 0)
    torch.testing.assert_close(logp[0], torch.stack([torch.tensor(0.0), 2 - lse, 3 - lse]))
    assert (logp[1] == 0).all()  # empty contrast set: zeros, not NaN
    # denominator weights: log d added inside the logsumexp only
    logd = torch.log(torch.tensor([[1.0, 0.5, 2.0], [1.0, 1.0, 1.0]]))
    logp_d = masked_log_softmax(logits, mask, logd)
    lse_d = torch.log(0.5 * torch.exp(torch.tensor(2.0)) + 2 * torch.exp(torch.tensor(3.0)))
    assert logp_d[0, 2].item() == pytest.approx(3 - lse_d.item(), rel=1e-6)
    # weighted reduction: anchor 1 has no contrast set -> skipped; no valid anchor -> connected zero
    w = torch.tensor([[0.0, 1.0, 3.0], [1.0, 1.0, 1.0]])
    loss, per_anchor, valid = weighted_contrastive_loss(logits, w, mask, w.sum(1))
    assert valid.tolist() == [True, False]
    assert loss.item() == pytest.approx(-((2 - lse) + 3 * (3 - lse)).item() / 4, rel=1e-6)
    zero, _, valid0 = weighted_contrastive_loss(logits, torch.zeros_like(w), mask, torch.zeros(2))
    assert zero.item() == 0.0 and not valid0.any()
    zero.backward()
    assert logits.grad is not None and (logits.grad == 0).all()


def test_engine_memory_is_pairwise_not_per_label():
    """A 25k-label sparse batch runs: nothing of size N x M x L is ever materialised."""
    from hf_mlcl.losses import get_loss

    n, k, n_labels = 64, 256, 25_000
    g = torch.Generator().manual_seed(0)
    idx_rows = torch.arange(n).repeat_interleave(4)
    idx_cols = torch.randint(0, 50, (n * 4,), generator=g)
    y = torch.sparse_coo_tensor(
        torch.stack([idx_rows, idx_cols]), torch.ones(n * 4), (n, n_labels)
    ).coalesce()
    y = torch.sparse_coo_tensor(y.indices(), torch.ones_like(y.values()), (n, n_labels))
    yk_rows = torch.arange(k).repeat_interleave(3)
    yk_cols = torch.randint(0, 50, (k * 3,), generator=g)
    yk = torch.sparse_coo_tensor(torch.stack([yk_rows, yk_cols]), torch.ones(k * 3), (k, n_labels)).coalesce()
    yk = torch.sparse_coo_tensor(yk.indices(), torch.ones_like(yk.values()), (k, n_labels))
    z, zk = torch.randn(n, 32, generator=g), torch.randn(k, 32, generator=g)
    for name in ["any", "sd", "jaccard", "mulsupcon", "all"]:
        out = get_loss(name)(z, y, zk, yk)
        assert torch.isfinite(out)
    # dense labels over > 1024 labels take the column-compacted product: same numbers
    yd, ykd = y.to_dense(), yk.to_dense()
    for name in ["any", "mulsupcon", "jaccard"]:
        fn = get_loss(name)
        assert fn(z, yd, zk, ykd).item() == pytest.approx(fn(z, y, zk, yk).item(), rel=1e-6)
    inter = R.intersections(M.as_multihot(yd), M.as_multihot(ykd))
    torch.testing.assert_close(inter, R.intersections(M.as_multihot(y), M.as_multihot(yk)))


@pytest.mark.parametrize(
    "n, m, n_labels, p",
    [(7, 11, 40, 0.2), (5, 9, 3000, 0.003), (0, 4, 6, 0.5), (4, 0, 6, 0.5), (3, 5, 8, 0.0)],
)
def test_sparse_sparse_product_matches_dense_float64(n, m, n_labels, p):
    """a @ b^T of two sparse matrices (scattered a^T, b re-indexed to a's columns, one sparse @ dense
    product) equals the dense float64 product: 0/1 counts exactly, weighted entries (the MulSupCon
    1/n_l reciprocals) to float64 rounding, also when b carries labels a lacks or a is empty."""
    g = torch.Generator().manual_seed(n * 100 + m)
    a = (torch.rand(n, n_labels, generator=g) < p).double()
    b = (torch.rand(m, n_labels, generator=g) < p).double()
    if m:
        b[0, : n_labels // 2] = 1.0  # labels no anchor carries are dropped from b, not mis-indexed
    expected = a @ b.T
    out = R.intersections(M.as_multihot(a.to_sparse()), M.as_multihot(b.to_sparse()))
    assert out.shape == (n, m)
    assert torch.equal(out, expected.float())
    w = a * torch.rand(n, n_labels, generator=g, dtype=torch.float64)  # weighted anchor rows
    got = R._matmul_t(w.to_sparse(), b.to_sparse())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, w @ b.T, rtol=1e-15, atol=1e-15)


def test_csr_of_ones_equals_coalesced_coo_conversion():
    """The one-sort CSR builder gives exactly what coalesce() + to_sparse_csr() give (row order, sorted
    columns within rows), for unsorted input pairs."""
    from hf_mlcl.labels.statistics import _csr_of_ones

    g = torch.Generator().manual_seed(0)
    flat = torch.randperm(40 * 30, generator=g)[:200]  # unique positions in random order
    rows, cols = flat // 30, flat % 30
    got = _csr_of_ones(rows, cols, (40, 30), torch.float64)
    want = (
        torch.sparse_coo_tensor(torch.stack([rows, cols]), torch.ones(200, dtype=torch.float64), (40, 30))
        .coalesce()
        .to_sparse_csr()
    )
    assert torch.equal(got.crow_indices(), want.crow_indices())
    assert torch.equal(got.col_indices(), want.col_indices())
    assert torch.equal(got.to_dense(), want.to_dense())


def test_cat_labels_of_sparse_matrices_is_coalesced_and_exact():
    """cat_labels builds the stacked COO without a second coalesce: it must still be sorted and exact."""
    a = M.as_multihot(torch.tensor([[0, 1, 1], [1, 0, 0]]).to_sparse(), allow_sparse=True)
    b = M.as_multihot(torch.tensor([[1, 0, 1], [0, 0, 0], [0, 1, 0]]).to_sparse(), allow_sparse=True)
    both = R.cat_labels(a, b)
    assert both.is_coalesced()
    assert torch.equal(both.to_dense(), torch.cat([a.to_dense(), b.to_dense()]))
    resorted = torch.sparse_coo_tensor(both.indices(), both.values(), both.shape).coalesce()  # a real sort
    assert torch.equal(both.indices(), resorted.indices())
    mixed = R.cat_labels(M.as_multihot(torch.tensor([[1.0, 0, 0]])), b)  # dense + sparse
    assert torch.equal(mixed.to_dense(), torch.cat([torch.tensor([[1.0, 0, 0]]), b.to_dense()]))


@pytest.mark.parametrize("sparse", [False, True])
def test_multihot_to_ids_is_the_inverse_of_ids_to_multihot(sparse):
    y = torch.zeros(5, 7)
    y[0, [1, 4, 6]] = 1  # three labels, a row with none (1), one (2), all seven (3), one (4)
    y[2, 5] = 1
    y[3] = 1
    y[4, 0] = 1
    ids = M.multihot_to_ids(y.to_sparse() if sparse else y)
    assert ids.dtype == torch.int64 and ids.shape == (5, 7)
    assert ids[0].tolist() == [1, 4, 6, -1, -1, -1, -1] and ids[1].tolist() == [-1] * 7
    assert ids[3].tolist() == list(range(7))
    assert torch.equal(M.ids_to_multihot(ids, 7), y)
    assert M.multihot_to_ids(torch.zeros(0, 7)).shape == (0, 0)
    assert M.multihot_to_ids(torch.zeros(2, 7), pad_id=-9).shape == (2, 0)
    assert M.multihot_to_ids(torch.zeros(2, 7), min_width=1).tolist() == [[-1], [-1]]
    rows, cols = M.id_pairs(ids)
    want_rows, want_cols = M.nonzero_pairs(y)
    assert torch.equal(rows, want_rows) and torch.equal(cols, want_cols)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bool])
def test_large_dense_scan_reads_a_strided_view(dtype):
    # over 1,024 labels and 2**20 cells as_multihot scans the raw bytes; a column-strided view
    # (y[:, ::2]) flattens without a copy to a stride-2 vector, which must still be read element by element
    n, width = 1024, M.COMPACT_MIN_LABELS + 1
    g = torch.Generator().manual_seed(0)
    wide = torch.zeros(n, 2 * width, dtype=dtype)
    wide[torch.arange(n), 2 * torch.randint(0, width, (n,), generator=g)] = 1
    view = wide[:, ::2]
    assert view.numel() >= M._SCAN_MIN_ENTRIES and not view.is_contiguous()
    got = M.as_multihot(view, allow_sparse=True)
    want = M.as_multihot(view.contiguous(), allow_sparse=True)
    assert got.is_sparse and torch.equal(got.to_dense(), want.to_dense())
    assert torch.equal(got.to_dense(), view.float())
