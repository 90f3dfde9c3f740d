"""Label-relation statistics between two multi-hot label matrices, by matrix products.

Every multi-label contrastive loss in this package needs only a handful of set statistics between the
label set S of an anchor and the label set T of a candidate:

* intersection size  abs(S & T)  = (Y_a @ Y_c^T)_{ia}
* set sizes          abs(S), abs(T) = row sums
* union size         abs(S | T)  = abs(S) + abs(T) - abs(S & T)
* set equality       S == T      <=> abs(S & T) == abs(S) == abs(T)
* Jaccard            abs(S & T) / abs(S | T)   (0 when both sets are empty)
* per-label candidate counts n_l(i) (MulSupCon): how many candidates of anchor i carry label l

All of them are computed with matrix products / row & column sums of the (N, L) and (M, L) multi-hot
matrices, never with an (N, M, L) tensor or a per-label Python loop, and they work with dense
(bool / int / float) and torch-sparse (COO or CSR) inputs. Sparse label matrices stay sparse; only the
(N, M) pair statistics are dense. Counts are kept in float32 (exact for integers below 2**24) whatever
the embedding dtype, and autocast is switched off by the caller (:mod:`hf_mlcl.losses.core`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "cast",
    "is_sparse",
    "nonzero_pairs",
    "as_multihot",
    "ids_to_multihot",
    "labels_to_multihot",
    "resolve_label_format",
    "cat_labels",
    "label_sizes",
    "label_counts",
    "intersections",
    "unions",
    "equality",
    "jaccard",
    "candidate_label_counts",
    "inverse_count_weights",
]

LABEL_DTYPE = torch.float32
_COMPACT_MIN_LABELS = 1024  # dense products over more labels than this skip the all-zero columns
_SCAN_MIN_ENTRIES = 2**20  # as_multihot(allow_sparse=True) scans dense matrices this large
_SCAN_BLOCK_BYTES = 256  # block size of that scan's first, vectorised pass


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)`` without the dispatcher round trip when ``t`` already has ``dtype``."""
    return t if t.dtype == dtype else t.to(dtype)


def is_sparse(labels: Tensor) -> bool:
    """True for torch-sparse layouts (COO, CSR, CSC, BSR, BSC)."""
    return labels.layout != torch.strided


def nonzero_pairs(labels: Tensor) -> tuple[Tensor, Tensor]:
    """(row, col) int64 index vectors of the non-zeros of a dense or sparse (N, L) multi-hot matrix,
    in row-major order (explicit zeros of a sparse matrix are skipped)."""
    if is_sparse(labels):
        lab = labels if labels.layout == torch.sparse_coo else labels.to_sparse_coo()
        lab = lab.coalesce()
        idx = lab.indices()
        keep = lab.values() != 0
        return idx[0][keep], idx[1][keep]
    nz = (labels != 0).nonzero()
    return nz[:, 0], nz[:, 1]


def _values(labels: Tensor) -> Tensor:
    return labels.values() if is_sparse(labels) else labels


def _raise_non_binary(name: str, vals: Tensor) -> None:
    """Raise the ValueError naming the first non-binary value of ``vals`` (if there is one)."""
    bad = (vals != 0) & (vals != 1)  # NaN is caught here too (NaN != 0 and NaN != 1)
    if bool(bad.any()):
        example = vals[bad][0].item()
        if example != example:
            raise ValueError(f"{name} contains NaN; labels must be binary multi-hot (0/1)")
        raise ValueError(
            f"{name} must be binary multi-hot (0/1) but contains the value {example!r}; "
            "pass a multi-hot matrix (not label counts, indices or soft labels)"
        )


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _scan_dense(labels: Tensor, name: str) -> Tensor | None:
    """Validate a large dense multi-hot matrix in one pass and return it as float32 COO if sparse.

    The non-zeros are found from the raw bytes: one vectorised ``amax`` over 256-byte blocks viewed
    as uint8 (any set bit — a 1, a NaN, a negative value, even -0.0 — makes a block's max non-zero);
    the flagged blocks are then read as 8-byte words, ``nonzero`` finds the non-zero words and a
    second, small ``nonzero`` the non-zero elements inside them (8 bools, 4 halves or 2 floats per
    word: a bool matrix costs an eighth of the element-wise search). Only the non-zero entries are
    checked for being exactly 1. About one bandwidth-bound pass over the memory instead of several
    elementwise passes. Returns None when the matrix is not sparse enough (more than 1/32 non-zero)
    for sparse products to pay off; it is valid either way.
    """
    flat = labels.reshape(-1)
    n = flat.numel()
    per_block = max(1, _SCAN_BLOCK_BYTES // flat.element_size())
    nb = n // per_block
    head = nb * per_block
    blocks = flat[:head].view(nb, per_block)
    hit = torch.nonzero(blocks.view(torch.uint8).amax(dim=1)).squeeze(1)
    # the flagged blocks as 8-byte words: the non-zero words, then the set elements inside them, found
    # on integer views (a flat nonzero over integers is several times faster than one over floats);
    # -0.0 has a set bit and is dropped below
    words = blocks.index_select(0, hit).view(torch.int64).view(-1)
    word = torch.nonzero(words).squeeze(1)
    per_word = 8 // flat.element_size()
    in_word = words[word].view(_SAME_SIZE_INT[flat.element_size()]).view(-1, per_word)
    w, e = torch.nonzero(in_word, as_tuple=True)
    loc = word[w] * per_word + e  # position in the flagged blocks, one after the other
    elems = torch.cat(
        [hit[loc // per_block] * per_block + loc % per_block, head + torch.nonzero(flat[head:]).squeeze(1)]
    )
    vals = flat[elems]
    keep = vals != 0  # -0.0 is a zero label
    if not bool(keep.all()):
        elems, vals = elems[keep], vals[keep]
    if vals.dtype != torch.bool and bool((vals != 1).any()):
        _raise_non_binary(name, vals)
    if elems.numel() * 32 > n:
        return None
    width = labels.shape[1]
    idx = torch.stack([elems // width, elems % width])
    ones = torch.ones(elems.numel(), dtype=LABEL_DTYPE, device=flat.device)
    return torch.sparse_coo_tensor(idx, ones, labels.shape, check_invariants=False, is_coalesced=True)


def ids_to_multihot(ids: Tensor, num_labels: int, pad_id: int = -1, check_values: bool = True) -> Tensor:
    """(N, K) label-id lists padded with ``pad_id`` -> (N, ``num_labels``) float32 multi-hot (one scatter).

    ValueError naming the offending id when one lies outside ``[0, num_labels)``. That check reads the
    ids on the host (a synchronisation on an accelerator); ``check_values=False`` skips it, and an id
    outside the range then still fails, in the scatter (an index error), instead of being dropped.
    """
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(
            f"label ids must be an integer (N, K) tensor padded with {pad_id}; got "
            f"{getattr(ids, 'dtype', type(ids).__name__)} of shape {tuple(getattr(ids, 'shape', ()))}"
        )
    valid = ids != pad_id
    if check_values:
        bad = valid & ((ids < 0) | (ids >= num_labels))
        if bool(bad.any()):
            raise ValueError(f"label id {int(ids[bad][0])} is outside [0, {num_labels}) (padding id: {pad_id})")
    # padding goes to the extra column num_labels, dropped below; an id >= num_labels is moved past it
    # (out of range for the scatter) so that an unchecked bad id can never pass for padding
    index = torch.where(valid, ids + (ids >= num_labels).to(ids.dtype), torch.full_like(ids, num_labels))
    out = torch.zeros(ids.shape[0], num_labels + 1, dtype=LABEL_DTYPE, device=ids.device)
    out.scatter_(1, index.long(), 1.0)
    return out[:, :num_labels]


LABEL_INPUT_FORMATS = ("auto", "multi_hot", "ids")


def resolve_label_format(labels: Tensor, num_labels: int | None = None, label_format: str = "auto") -> str:
    """``"multi_hot"`` or ``"ids"`` for a batch of labels (the rule of :func:`labels_to_multihot`).

    ``"auto"`` reads the values of an integer tensor exactly ``num_labels`` wide (are they all 0/1?): a
    host synchronisation on an accelerator, so callers that see many batches of one dataset resolve
    the format once per (dtype, width).
    """
    if label_format not in LABEL_INPUT_FORMATS:
        raise ValueError(f"label_format must be one of {LABEL_INPUT_FORMATS}; got {label_format!r}")
    if not isinstance(labels, Tensor) or labels.dim() != 2:
        raise ValueError(
            "labels must be a (batch, L) multi-hot or (batch, K) -1-padded label-id tensor; got "
            f"{tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__}"
        )
    if label_format != "auto":
        return label_format
    if labels.is_floating_point() or labels.dtype == torch.bool or is_sparse(labels):
        return "multi_hot"
    if labels.shape[1] != num_labels:  # decided by the width: no value read
        return "ids"
    return "multi_hot" if bool(((labels == 0) | (labels == 1)).all()) else "ids"


def labels_to_multihot(
    labels: Tensor, num_labels: int | None = None, label_format: str = "auto", check_values: bool = True
) -> Tensor:
    """A batch's labels as (B, L) float32 multi-hot: ``"multi_hot"`` rows pass through, ``"ids"`` ((B, K)
    label ids padded with -1) are scattered (:func:`ids_to_multihot`, needs ``num_labels``). ``"auto"``:
    float / bool tensors are multi-hot; integer tensors are ids unless they hold only 0/1 and are exactly
    ``num_labels`` wide (name the format where that could be ambiguous; :func:`resolve_label_format`).
    ValueError naming the problem. ``check_values=False`` skips the id-range check (see
    :func:`ids_to_multihot`); with ``"auto"`` the values are still read to pick the format.
    """
    fmt = resolve_label_format(labels, num_labels, label_format)
    if fmt == "multi_hot":
        if num_labels is not None and labels.shape[1] != num_labels:
            raise ValueError(f"multi-hot labels are {labels.shape[1]} wide but num_labels={num_labels}")
        return labels if is_sparse(labels) else labels.to(LABEL_DTYPE)
    if num_labels is None:
        raise ValueError("label-id lists need num_labels= (the size of the label space)")
    return ids_to_multihot(labels, num_labels, check_values=check_values)


def as_multihot(
    labels: Tensor,
    name: str = "labels",
    device: torch.device | None = None,
    allow_sparse: bool = False,
    check_values: bool = True,
) -> Tensor:
    """Validate a multi-hot (N, L) matrix and return it as float32 (dense) or coalesced float32 COO.

    Accepts bool / integer / floating dense tensors and torch-sparse COO / CSR / CSC tensors.
    Raises ``ValueError`` naming the problem for: non-tensors, wrong rank, NaN / non-binary values
    (duplicate COO entries that sum to 2 count as non-binary).

    ``check_values=False`` skips the value check, the one part that reads the labels on the host (a
    synchronisation on an accelerator): for labels already validated, e.g. once before training or on
    the host by the collator that built them. A dense matrix then costs no host read at all (sparse
    layouts and the sparse scan below need data-dependent shapes whatever this says).

    ``allow_sparse``: a large dense matrix (more than ``_COMPACT_MIN_LABELS`` labels, at least
    2**20 entries) that is at most 1/32 non-zero is returned as sparse COO, validated in the same
    pass (:func:`_scan_dense`): the losses then run on sparse label products whatever the input
    format, so dense and sparse labels cost about the same.
    """
    if not isinstance(labels, Tensor):
        raise ValueError(
            f"{name} must be a torch.Tensor multi-hot matrix of shape (N, L), got {type(labels).__name__}; "
            "convert label-index lists to multi-hot first (e.g. with hf_mlcl.data.MultiLabelCollator)"
        )
    if labels.dim() != 2:
        raise ValueError(f"{name} must be a 2-D multi-hot matrix (N, L), got shape {tuple(labels.shape)}")
    if labels.is_complex():
        raise ValueError(f"{name} must be real-valued 0/1, got dtype {labels.dtype}")
    if device is not None and labels.device != device:
        labels = labels.to(device)
    if is_sparse(labels):
        if labels.layout != torch.sparse_coo:
            labels = labels.to_sparse_coo()
        labels = labels.coalesce()
    elif allow_sparse and labels.shape[1] > _COMPACT_MIN_LABELS and labels.numel() >= _SCAN_MIN_ENTRIES:
        scanned = _scan_dense(labels, name)
        return cast(labels, LABEL_DTYPE) if scanned is None else scanned
    vals = _values(labels)
    # v (v - 1) is 0 exactly for v in {0, 1}: NaN, +-inf and every other value give a non-zero
    # (for integers too: v (v - 1) = 0 mod 2^bits only for v = 0 or 1, one factor being odd)
    if check_values and vals.dtype != torch.bool and bool((vals * (vals - 1)).any()):
        _raise_non_binary(name, vals)
    if is_sparse(labels):
        idx = labels.indices()
        v = cast(labels.values(), LABEL_DTYPE)
        keep = v != 0  # drop explicit zeros so nnz == number of (row, label) memberships
        # a subset of coalesced (sorted, unique) indices is still coalesced: no second sort
        return torch.sparse_coo_tensor(
            idx[:, keep],
            v[keep],
            labels.shape,
            device=labels.device,
            check_invariants=False,
            is_coalesced=True,
        )
    return cast(labels, LABEL_DTYPE)


def cat_labels(first: Tensor, second: Tensor | None) -> Tensor:
    """Row-concatenate two validated multi-hot matrices (sparse if either is sparse)."""
    if second is None:
        return first
    if is_sparse(first) or is_sparse(second):
        a = (first if is_sparse(first) else first.to_sparse()).coalesce()
        b = (second if is_sparse(second) else second.to_sparse()).coalesce()
        # rows of b after those of a: the concatenated (row, col) indices stay sorted and unique
        shift = torch.zeros(2, 1, dtype=b.indices().dtype, device=b.device)
        shift[0] = a.shape[0]  # a fill on the device, not a host copy
        return torch.sparse_coo_tensor(
            torch.cat([a.indices(), b.indices() + shift], dim=1),
            torch.cat([a.values(), b.values()]),
            (a.shape[0] + b.shape[0], *a.shape[1:]),
            device=a.device, check_invariants=False, is_coalesced=True,
        )  # fmt: skip
    return torch.cat([first, second], dim=0)


def label_sizes(labels: Tensor) -> Tensor:
    """Row sums abs(S) of a multi-hot matrix, (N,) float32."""
    if is_sparse(labels):
        n = labels.shape[0]
        out = torch.zeros(n, dtype=LABEL_DTYPE, device=labels.device)
        return out.index_add_(0, labels.indices()[0], cast(labels.values(), LABEL_DTYPE))
    return cast(labels, LABEL_DTYPE).sum(dim=1)


def label_counts(labels: Tensor) -> Tensor:
    """Column sums (how many rows carry each label), (L,) float32."""
    if is_sparse(labels):
        n_labels = labels.shape[1]
        out = torch.zeros(n_labels, dtype=LABEL_DTYPE, device=labels.device)
        return out.index_add_(0, labels.indices()[1], cast(labels.values(), LABEL_DTYPE))
    return cast(labels, LABEL_DTYPE).sum(dim=0)


def _matmul_t(a: Tensor, b: Tensor) -> Tensor:
    """Dense (N, M) = a @ b^T for dense/sparse a (N, L) and b (M, L)."""
    sa, sb = is_sparse(a), is_sparse(b)
    dtype = (
        a.dtype
        if a.dtype == b.dtype == LABEL_DTYPE
        else torch.promote_types(torch.promote_types(a.dtype, b.dtype), LABEL_DTYPE)
    )
    a, b = cast(a, dtype), cast(b, dtype)
    if not sa and not sb:
        if a.shape[1] > _COMPACT_MIN_LABELS:
            # only labels some row of ``a`` carries can contribute: drop the other columns first
            used = torch.nonzero((a != 0).any(dim=0)).flatten()
            if used.numel() < a.shape[1] // 2:
                a, b = a.index_select(1, used), b.index_select(1, used)
        return a @ b.T
    if sa and not sb:
        return torch.sparse.mm(a, b.T.contiguous())
    if sb and not sa:
        return torch.sparse.mm(b, a.T.contiguous()).T
    return _sparse_sparse_matmul_t(a, b)


def _sparse_sparse_matmul_t(a: Tensor, b: Tensor, *more: Tensor) -> Tensor | tuple[Tensor, ...]:
    """Dense (N, M) = a @ b^T for two sparse COO matrices, as one sparse @ dense product.

    torch's sparse @ sparse product builds a sparse (N, M) result (hash accumulation, then
    ``to_dense``); here only the U label columns that ``a`` carries can contribute, so a^T is
    scattered into a small dense (U, N) matrix, b's entries in those columns are re-indexed into a
    sparse (M, U) matrix (its other entries dropped) and the result is (b_U @ a_U^T)^T: O(nnz(b) N)
    work with no sparse output. Integer counts are exact; weighted products only change the
    summation order. Further sparse (N, L) matrices ``more`` (entries only in the columns ``a``
    carries) share the same product: their transposes stand beside a^T, and the call returns
    ``(a @ b^T, *(m @ b^T for m in more))``.
    """
    a, b = a.coalesce(), b.coalesce()
    ai, bi = a.indices(), b.indices()
    device = a.device
    used = torch.zeros(a.shape[1], dtype=torch.bool, device=device)
    used[ai[1]] = True
    cols = torch.nonzero(used).squeeze(1)
    remap = torch.full((a.shape[1],), -1, dtype=torch.long, device=device)
    remap[cols] = torch.arange(cols.numel(), device=device)
    n = a.shape[0]
    a_t = torch.zeros(cols.numel(), n * (1 + len(more)), dtype=a.dtype, device=device)
    for k, m in enumerate((a, *more)):
        m = m.coalesce()
        mi = m.indices()
        a_t.index_put_((remap[mi[1]], mi[0] + k * n), m.values().to(a.dtype), accumulate=True)
    b_col = remap[bi[1]]
    keep = b_col >= 0
    # remap is increasing on the kept columns, so the filtered entries stay sorted and unique
    b_u = torch.sparse_coo_tensor(
        torch.stack([bi[0][keep], b_col[keep]]),
        b.values()[keep],
        (b.shape[0], cols.numel()),
        check_invariants=False,
        is_coalesced=True,
    )
    out = torch.sparse.mm(b_u, a_t).T
    if not more:
        return out
    return tuple(out[k * n : (k + 1) * n] for k in range(1 + len(more)))


def intersections(anchor_labels: Tensor, candidate_labels: Tensor) -> Tensor:
    """abs(S_i & T_a) for all pairs: Y_a @ Y_c^T, dense (N, M) (float32 for validated label matrices)."""
    if anchor_labels.shape[1] != candidate_labels.shape[1]:
        raise ValueError(
            f"label width differs: anchors have {anchor_labels.shape[1]} labels, candidates "
            f"{candidate_labels.shape[1]}; both label matrices must use the same label space"
        )
    return _matmul_t(anchor_labels, candidate_labels)


def unions(sizes_a: Tensor, sizes_c: Tensor, inter: Tensor) -> Tensor:
    """abs(S | T) = abs(S) + abs(T) - abs(S & T), (N, M)."""
    # one (N, M) allocation: a fresh large tensor costs as much as the arithmetic on CPU (page faults)
    union = sizes_a[:, None] + sizes_c[None, :]
    return union.to(torch.promote_types(union.dtype, inter.dtype)).sub_(inter)


def equality(sizes_a: Tensor, sizes_c: Tensor, inter: Tensor) -> Tensor:
    """S == T as a bool (N, M) matrix (two empty sets are equal)."""
    return (inter == sizes_a[:, None]) & (inter == sizes_c[None, :])


def jaccard(sizes_a: Tensor, sizes_c: Tensor, inter: Tensor) -> Tensor:
    """abs(S & T) / abs(S | T), (N, M); defined as 0 when both sets are empty."""
    # union >= intersection >= 0, and an empty union has an empty intersection: 0 / max(union, 1) = 0
    union = unions(sizes_a, sizes_c, inter).clamp_min_(1)
    if not union.is_floating_point():
        return inter / union
    return torch.div(inter, union, out=union)  # in place of the union: no second (N, M) allocation


def candidate_label_counts(
    anchor_labels: Tensor, candidate_labels: Tensor, anchors_in_candidates: bool
) -> Tensor:
    """n_l(i): number of candidates of anchor i that carry label l, for l in S_i (0 elsewhere).

    n(i) = Y_i * (colsum(Y_c) - Y_i) when the anchor itself is one of the candidates
    (``anchors_in_candidates``; it is excluded from its own contrast set), else Y_i * colsum(Y_c).
    Returns the same layout as ``anchor_labels`` (sparse stays sparse, with the anchors' sparsity
    pattern; the stored values are the counts and may be 0), float32 (N, L).
    """
    col = label_counts(candidate_labels)
    if is_sparse(anchor_labels):
        idx = anchor_labels.indices()
        vals = col[idx[1]] - (1.0 if anchors_in_candidates else 0.0)
        return torch.sparse_coo_tensor(
            idx, vals, anchor_labels.shape, device=anchor_labels.device, check_invariants=False
        ).coalesce()
    y = cast(anchor_labels, LABEL_DTYPE)
    return y * (col[None, :] - (y if anchors_in_candidates else 0.0))


def inverse_count_weights(
    anchor_labels: Tensor,
    candidate_labels: Tensor,
    anchors_in_candidates: bool,
    dtype: torch.dtype = LABEL_DTYPE,
    with_intersections: bool = False,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """MulSupCon weights: W_ia = sum_{l in S_i & T_a} 1 / n_l(i), and the number of (i, l) pairs.

    Vectorised as W = (Y_i * 1/n(i)) @ Y_c^T with n(i) from :func:`candidate_label_counts` (entries
    with n_l(i) = 0 — labels no candidate carries — contribute nothing). The second output is, per
    anchor, the number of its labels l with n_l(i) >= 1, i.e. the (anchor, label) pairs that have at
    least one positive. W is dense (N, M). Note W also has non-zero entries at the anchor's
    own column when the anchor is a candidate; the caller masks the contrast set. ``dtype`` is the
    dtype of the reciprocals and of W (float64 keeps 1/n exact to double precision).
    ``with_intersections``: also return abs(S_i & T_a) (N, M) in ``dtype`` (exact counts), from the
    same product when the labels are sparse (a caller that needs both, e.g. HBL on MulSupCon).
    """
    counts = cast(candidate_label_counts(anchor_labels, candidate_labels, anchors_in_candidates), dtype)
    if is_sparse(counts):
        idx, vals = counts.indices(), counts.values()
        pos = vals > 0
        inv_vals = torch.where(pos, 1.0 / vals.clamp_min(1), torch.zeros_like(vals))
        inv = torch.sparse_coo_tensor(
            idx, inv_vals, counts.shape, device=counts.device, check_invariants=False
        ).coalesce()
        pairs = torch.zeros(counts.shape[0], dtype=dtype, device=counts.device)
        pairs.index_add_(0, idx[0], pos.to(dtype))
    else:
        pos = counts > 0
        inv = torch.where(pos, 1.0 / counts.clamp_min(1), torch.zeros_like(counts))
        pairs = pos.to(dtype).sum(dim=1)
    yc = cast(candidate_labels, dtype)
    if not with_intersections:
        return _matmul_t(inv, yc), pairs
    ya = cast(anchor_labels, dtype)
    if is_sparse(inv) and is_sparse(ya) and is_sparse(yc):
        # inv has the anchors' pattern: both products share one pass over the candidates
        inter, w = _sparse_sparse_matmul_t(ya, yc, inv)
        return w, pairs, inter
    return _matmul_t(inv, yc), pairs, _matmul_t(ya, yc)
