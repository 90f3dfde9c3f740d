"""Label relations between two multi-hot label matrices, by matrix products.

Intersections, sizes, unions, equality, Jaccard, MulSupCon's per-label counts, the R1-R5 relations, set
similarities and the soft cosine, for dense or torch-sparse inputs; :class:`PairRelations` holds them for
one contrast set, each computed on first use.

References: Huang et al. (Similarity-Dissimilarity loss), sec. 2.3, eqs. 8-12.
Design: docs/design.md, "Label relations (hf_mlcl/labels/relations.py)".
"""

from __future__ import annotations

from functools import cached_property

import torch
from torch import Tensor

from .host_reads import host_reads_are_free
from .multihot import COMPACT_MIN_LABELS, LABEL_DTYPE, cast, coalesced, is_sparse

__all__ = [
    "RELATIONS",
    "PairRelations",
    "candidate_label_counts",
    "cat_labels",
    "equality",
    "intersections",
    "inverse_count_weights",
    "jaccard",
    "label_counts",
    "label_sizes",
    "relation_masks",
    "set_similarity",
    "soft_cosine",
    "unions",
]

RELATIONS = ("R1", "R2", "R3", "R4", "R5")
SET_SIMILARITIES = ("jaccard", "dice", "overlap", "cosine")


def cat_labels(first: Tensor, second: Tensor | None) -> Tensor:
    """Row-concatenate two validated multi-hot matrices (sparse if either is sparse)."""
    if second is None:
        return first
    if is_sparse(first) or is_sparse(second):
        a = coalesced(first if is_sparse(first) else first.to_sparse())
        b = coalesced(second if is_sparse(second) else second.to_sparse())
        # rows of b after those of a: the concatenated (row, col) indices stay sorted and unique
        shift = torch.zeros(2, 1, dtype=b.indices().dtype, device=b.device)
        shift[0] = a.shape[0]  # a fill on the device, not a host copy
        return torch.sparse_coo_tensor(
            torch.cat([a.indices(), b.indices() + shift], dim=1),
            torch.cat([a.values(), b.values()]),
            (a.shape[0] + b.shape[0], *a.shape[1:]),
            device=a.device,
            check_invariants=False,
            is_coalesced=True,
        )
    return torch.cat([first, second], dim=0)


def _sums(labels: Tensor, keep: int) -> Tensor:
    """float32 sums of a (validated COO or dense) multi-hot matrix over the other axis, one per entry of
    axis ``keep`` (0: per row, 1: per column)."""
    if is_sparse(labels):
        out = torch.zeros(labels.shape[keep], dtype=LABEL_DTYPE, device=labels.device)
        return out.index_add_(0, labels.indices()[keep], cast(labels.values(), LABEL_DTYPE))
    return cast(labels, LABEL_DTYPE).sum(dim=1 - keep)


def label_sizes(labels: Tensor) -> Tensor:
    """Row sums abs(S) of a multi-hot matrix, (N,) float32."""
    return _sums(labels, 0)


def label_counts(labels: Tensor) -> Tensor:
    """Column sums (how many rows carry each label), (L,) float32."""
    return _sums(labels, 1)


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
        if a.shape[1] > COMPACT_MIN_LABELS and host_reads_are_free(a):
            # only labels some row of ``a`` carries can contribute: drop the other columns first (a choice
            # made on the host: on an accelerator the whole product costs less than the read)
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
    a, b = coalesced(a), coalesced(b)
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
        m = coalesced(m)
        mi = m.indices()
        a_t.index_put_((remap[mi[1]], mi[0] + k * n), m.values().to(a.dtype), accumulate=True)
    b_col = remap[bi[1]]
    keep = torch.nonzero(b_col >= 0).squeeze(1)  # one host read (the count) for the three selections
    # remap is increasing on the kept columns, so the filtered entries stay sorted and unique
    b_u = torch.sparse_coo_tensor(
        torch.stack([bi[0].index_select(0, keep), b_col.index_select(0, keep)]),
        b.values().index_select(0, keep),
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
        # the anchors' own (row, col) pattern: coalesced when theirs is, no second sort
        return coalesced(
            torch.sparse_coo_tensor(
                idx,
                vals,
                anchor_labels.shape,
                device=anchor_labels.device,
                check_invariants=False,
                is_coalesced=anchor_labels.is_coalesced(),
            )
        )
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
            idx, inv_vals, counts.shape, device=counts.device, check_invariants=False, is_coalesced=True
        )  # counts is coalesced: the same pattern
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


def set_similarity(kind: str, inter: Tensor, sizes_a: Tensor, sizes_c: Tensor) -> Tensor:
    """(N, M) similarity of label sets from their intersection counts ``inter`` = abs(S & T) and sizes
    abs(S) (N,), abs(T) (M,); 0 where the intersection is empty. ``kind`` in :data:`SET_SIMILARITIES`."""
    if kind == "jaccard":
        return jaccard(sizes_a, sizes_c, inter)
    if kind == "dice":
        denom = (sizes_a[:, None] + sizes_c[None, :]).clamp_min(1)
        return 2 * inter / denom
    if kind == "overlap":
        denom = torch.minimum(sizes_a[:, None], sizes_c[None, :]).clamp_min(1)
        return inter / denom
    if kind == "cosine":
        denom = (sizes_a[:, None] * sizes_c[None, :]).clamp_min(1).sqrt()
        return inter / denom
    raise ValueError(
        f"label_similarity must be one of {SET_SIMILARITIES}, a callable or an (L, L) matrix; got {kind!r}"
    )


def _quadratic_diagonal(labels: Tensor, matrix: Tensor) -> tuple[Tensor, Tensor]:
    """(Y A (N, L) dense, diag(Y A Y^T) (N,)) for a dense or sparse multi-hot Y."""
    if is_sparse(labels):
        ya = torch.sparse.mm(labels.to(matrix.dtype), matrix)
        idx = labels.indices()
        diag = torch.zeros(labels.shape[0], dtype=matrix.dtype, device=matrix.device)
        diag.index_add_(0, idx[0], ya[idx[0], idx[1]] * labels.values().to(matrix.dtype))
        return ya, diag
    y = labels.to(matrix.dtype)
    ya = y @ matrix
    return ya, (ya * y).sum(dim=1)


def soft_cosine(anchor_labels: Tensor, candidate_labels: Tensor, matrix: Tensor) -> Tensor:
    """Soft cosine (Sidorov et al. 2014) of every (anchor, candidate) pair of multi-hot rows under the
    (L, L) label-similarity matrix ``matrix``: (Y_a A Y_c^T)_ik / sqrt((Y_a A Y_a^T)_ii (Y_c A Y_c^T)_kk),
    0 for an empty set. Dense or sparse label matrices; ``matrix`` dense, in the result's dtype."""
    ya, diag_a = _quadratic_diagonal(anchor_labels, matrix)
    if candidate_labels is anchor_labels:
        diag_c = diag_a
    else:
        diag_c = _quadratic_diagonal(candidate_labels, matrix)[1]
    soft = intersections(ya, candidate_labels)  # (Y_a A) @ Y_c^T, dense or sparse Y_c
    norm = (diag_a[:, None] * diag_c[None, :]).sqrt()
    return torch.where(norm > 0, soft / norm.clamp_min(torch.finfo(norm.dtype).tiny), torch.zeros_like(soft))


class PairRelations:
    """The label relations of every (anchor, candidate) pair of one contrast set, each computed on first use.

    Args:
        anchor_labels: (N, L) multi-hot of the anchors (validated float32 dense / sparse COO, or bool).
        key_labels: (K, L) multi-hot of the extra candidates (keys), or None.
        anchors_in_candidates: the candidates are [anchors; keys] with each anchor's own column outside
            its contrast set (True), or the keys alone (False; needs keys).
        dtype: the dtype of the counts (float32; float64 keeps a float64 loss exact).

    Attributes (exact integer counts in ``dtype``): ``inter`` (N, M), ``anchor_sizes`` (N,),
    ``candidate_sizes`` (M,), ``union``, ``equal`` (bool), ``jaccard``, ``shares_label`` (bool: S & T
    non-empty inside the contrast set), ``contrast_mask`` / ``self_mask`` (N, M) bool.
    """

    def __init__(
        self,
        anchor_labels: Tensor,
        key_labels: Tensor | None = None,
        anchors_in_candidates: bool = True,
        dtype: torch.dtype = LABEL_DTYPE,
    ) -> None:
        if not anchors_in_candidates and key_labels is None:
            raise ValueError(
                "anchors_in_candidates=False makes the keys the only candidates: pass key_labels"
            )
        self.anchor_labels = anchor_labels
        self.key_labels = key_labels
        self.anchors_in_candidates = bool(anchors_in_candidates)
        self.dtype = dtype
        self.num_anchors = anchor_labels.shape[0]
        self.num_keys = 0 if key_labels is None else key_labels.shape[0]
        self.candidate_labels = cat_labels(anchor_labels, key_labels) if anchors_in_candidates else key_labels
        # share_intersections: a loss that computes the label intersections as a by-product of its own
        # product hands them to ``inter`` (provide_intersections), for a caller that reads both (HBL)
        self.share_intersections = False

    @property
    def device(self) -> torch.device:
        return self.anchor_labels.device

    @property
    def num_candidates(self) -> int:
        return (self.num_anchors if self.anchors_in_candidates else 0) + self.num_keys

    @cached_property
    def contrast_mask(self) -> Tensor:
        """(N, M) bool: True where candidate a is in the contrast set of anchor i (all but (i, i))."""
        mask = torch.ones(self.num_anchors, self.num_candidates, dtype=torch.bool, device=self.device)
        if self.anchors_in_candidates:
            mask.diagonal().fill_(False)
        return mask

    @cached_property
    def self_mask(self) -> Tensor:
        """(N, M) bool, True at (i, i) (the anchor's own in-batch column; all False when the anchors
        are not candidates)."""
        return ~self.contrast_mask

    @cached_property
    def inter(self) -> Tensor:
        return cast(intersections(self.anchor_labels, self.candidate_labels), self.dtype)

    @property
    def intersections_wanted(self) -> bool:
        """True when a caller asked for ``inter`` to be shared (``share_intersections``) and it is not known yet."""
        return self.share_intersections and "inter" not in self.__dict__

    def provide_intersections(self, inter: Tensor) -> None:
        """Set ``inter`` (N, M) from exact counts computed elsewhere (e.g. beside MulSupCon's weights)."""
        if tuple(inter.shape) != (self.num_anchors, self.num_candidates):
            raise ValueError(
                f"intersections must be ({self.num_anchors}, {self.num_candidates}); got {tuple(inter.shape)}"
            )
        self.__dict__["inter"] = cast(inter, self.dtype)  # the cached_property's own slot

    @cached_property
    def anchor_sizes(self) -> Tensor:
        return cast(label_sizes(self.anchor_labels), self.dtype)

    @cached_property
    def candidate_sizes(self) -> Tensor:
        if self.candidate_labels is self.anchor_labels:
            return self.anchor_sizes
        return cast(label_sizes(self.candidate_labels), self.dtype)

    @cached_property
    def union(self) -> Tensor:
        return unions(self.anchor_sizes, self.candidate_sizes, self.inter)

    @cached_property
    def equal(self) -> Tensor:
        return equality(self.anchor_sizes, self.candidate_sizes, self.inter)

    @cached_property
    def jaccard(self) -> Tensor:
        return jaccard(self.anchor_sizes, self.candidate_sizes, self.inter)

    @cached_property
    def shares_label(self) -> Tensor:
        """(N, M) bool: S & T non-empty (and inside the contrast set)."""
        shares = self.inter > 0
        if self.anchors_in_candidates:
            shares.diagonal().fill_(False)
        return shares


def relation_masks(rel: PairRelations) -> dict[str, Tensor]:
    """The Similarity-Dissimilarity paper's relation of every pair in the contrast set (Huang et al., sec.
    2.3, eqs. 8-12) as (N, M) bool masks, the first matching relation winning (so a candidate with an
    empty T is R1): R1 S & T empty, R2 S == T, R3 overlap with neither containing the other, R4 S strictly
    contains T, R5 S strictly inside T."""
    inter, a, c = rel.inter, rel.anchor_sizes[:, None], rel.candidate_sizes[None, :]
    share = rel.shares_label
    return {
        "R1": (inter == 0) & rel.contrast_mask,
        "R2": share & (inter == a) & (inter == c),
        "R3": share & (inter < a) & (inter < c),
        "R4": share & (inter == c) & (c < a),
        "R5": share & (inter == a) & (a < c),
    }
