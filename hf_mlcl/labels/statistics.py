"""Label statistics: the size of a label space, training-set class weights and per-(anchor, label) products.

:func:`resolve_num_labels` (the label count every part agrees on), :func:`ws_class_weights` (ws-MulSupCon's
training-set class weights) and :class:`PairLabelView` (per-(anchor, label) batch products without an
(N, M, L) tensor).

References: Lin & Chen (ws-MulSupCon), eqs. 6-7.
Design: docs/design.md, "Label statistics (hf_mlcl/labels/statistics.py)".
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from torch import Tensor

from .multihot import as_multihot, cast, is_sparse, nonzero_pairs

__all__ = [
    "PairLabelView",
    "dataset_num_labels",
    "dense_label_products",
    "model_num_labels",
    "resolve_num_labels",
    "ws_class_weights",
]

_DEFAULT_ID2LABEL = {0: "LABEL_0", 1: "LABEL_1"}
# dense (N, M, L)-flop products are used instead of sparse ones up to this much work
_DENSE_MAX_WORK = 2**25


def dense_label_products(anchor_labels: Tensor, candidate_labels: Tensor) -> bool:
    """Whether per-(anchor, label) products run densely over all L columns: both matrices dense and
    N * M * L at most ``_DENSE_MAX_WORK`` (a small label space; sparse products cost more there)."""
    return (
        not is_sparse(anchor_labels)
        and not is_sparse(candidate_labels)
        and anchor_labels.shape[0] * candidate_labels.shape[0] * anchor_labels.shape[1] <= _DENSE_MAX_WORK
    )


def _csr_of_ones(rows: Tensor, cols: Tensor, shape: tuple[int, int], dtype: torch.dtype) -> Tensor:
    """Sparse CSR matrix with 1 at the (unique) positions (rows, cols), columns sorted within each row —
    what ``sparse_coo_tensor(...).coalesce().to_sparse_csr()`` builds, with one sort instead of a
    coalesce (sort, deduplication, reduction) and a conversion."""
    n_rows, n_cols = shape
    order = torch.argsort(rows * n_cols + cols)
    per_row = torch.zeros(n_rows, dtype=torch.long, device=rows.device).index_add_(
        0, rows, torch.ones_like(rows)
    )
    crow = torch.zeros(n_rows + 1, dtype=torch.long, device=rows.device)
    torch.cumsum(per_row, dim=0, out=crow[1:])  # a bincount would read the largest row on the host
    ones = torch.ones(rows.numel(), dtype=dtype, device=rows.device)
    return torch.sparse_csr_tensor(crow, cols[order], ones, shape, check_invariants=False)


def ws_class_weights(train_labels: Tensor, authors_code: bool = False) -> tuple[Tensor, Tensor]:
    """Class weights of ws-MulSupCon from training-set label statistics (Lin & Chen, eqs. 6 and 7).

    Args:
        train_labels: (N, L) multi-hot matrix of the *training set* (dense bool/int/float or torch
            sparse COO/CSR).
        authors_code: False (default) -> the paper's definitions; True -> the authors' public code.

    Returns:
        ``(single_weights, multi_weights)``, two float32 (L,) tensors.

    Paper (default):
        * ``D̄_j = (D - d_j) / D`` (eq. 6), d_j = number of training cases with label j,
          D = sum_j d_j (all label occurrences);
        * ``C̄_j = 1 / (C_j / M_j) = M_j / C_j`` (eq. 7), M_j = number of multi-label cases
          (abs(y) >= 2) containing j, C_j = total count of labels co-occurring with j over those cases
          = sum over multi-label cases n containing j of (abs(y_n) - 1). A label that never occurs in
          a multi-label case (M_j = 0, C̄_j undefined) gets the neutral weight 1.0 (C̄_j <= 1 always,
          since C_j >= M_j).
    Authors' code (``authors_code=True``, ws-MulSupCon repository, ``pretrain.py``):
        * single weights identical;
        * ``C̄_j = (M - m_j) / M`` with m_j = M_j (multi-label cases containing j) and
          M = sum_j m_j; all ones when there is no multi-label case.
    If D = 0 (no label at all) the single weights are all 1.0.
    """
    labels = as_multihot(train_labels, "train_labels")
    n_rows, n_labels = labels.shape
    rows, cols = nonzero_pairs(labels)
    f32 = torch.float32
    d = torch.zeros(n_labels, dtype=f32, device=labels.device).index_add_(
        0, cols, torch.ones_like(cols, dtype=f32)
    )
    total = d.sum()
    if total > 0:
        single_w = (total - d) / total
    else:
        single_w = torch.ones(n_labels, dtype=f32, device=labels.device)
    sizes = torch.zeros(n_rows, dtype=f32, device=labels.device).index_add_(
        0, rows, torch.ones_like(rows, dtype=f32)
    )
    entry_size = sizes[rows]
    multi_entry = entry_size >= 2
    m = torch.zeros(n_labels, dtype=f32, device=labels.device).index_add_(0, cols, multi_entry.to(f32))
    if authors_code:
        m_total = m.sum()
        if m_total > 0:
            multi_w = (m_total - m) / m_total
        else:
            multi_w = torch.ones(n_labels, dtype=f32, device=labels.device)
    else:
        c = torch.zeros(n_labels, dtype=f32, device=labels.device).index_add_(
            0, cols, torch.where(multi_entry, entry_size - 1, torch.zeros_like(entry_size))
        )
        multi_w = torch.where(c > 0, m / c.clamp_min(1), torch.ones_like(c))
    return single_w, multi_w


class PairLabelView:
    """Compacted view of anchor / candidate label matrices for per-(anchor, label) weighted products.

    Args:
        anchor_labels: (N, L) validated multi-hot (float32 dense or sparse COO), see
            :func:`hf_mlcl.labels.multihot.as_multihot`.
        candidate_labels: (M, L) same label space.

    Attributes:
        rows, cols: (P,) int64, the anchor non-zeros (pair p = (anchor rows[p], label cols[p])); with
            dense products every cell of the (N, L) grid in row-major order, ``pair_mask`` marking the
            anchors' labels (the other cells get the value 0 from every method; see :meth:`on_pairs`).
        pair_mask: (P,) bool, or None when every pair is a non-zero (sparse products).
        ucol: (P,) int64, the compact column (0..U-1) of each pair's label.
        num_active: U, number of distinct labels carried by the anchors.
        cand_rows, cand_ucols: candidate non-zeros restricted to the U active labels.
    """

    def __init__(self, anchor_labels: Tensor, candidate_labels: Tensor) -> None:
        self.num_anchors = anchor_labels.shape[0]
        self.num_candidates = candidate_labels.shape[0]
        self.device = anchor_labels.device
        n_labels = anchor_labels.shape[1]
        self._dense: Tensor | None = None
        self.pair_mask: Tensor | None = None
        if dense_label_products(anchor_labels, candidate_labels):
            # small label space: dense products over all L columns beat building sparse matrices; the
            # pairs are the whole (N, L) grid (row-major, the order of the non-zeros within each row)
            self._dense = candidate_labels
            grid = torch.arange(self.num_anchors * n_labels, device=self.device)
            self.rows, self.cols = grid.div(n_labels, rounding_mode="floor"), grid.remainder(n_labels)
            self.pair_mask = (anchor_labels != 0).reshape(-1)
            self.ucol = self.cols
            self.num_active = n_labels
            return
        # validated matrices store no zeros: their indices are the pairs (no host read)
        self.rows, self.cols = nonzero_pairs(anchor_labels, explicit_zeros=False)
        active, self.ucol = torch.unique(self.cols, return_inverse=True)
        self.num_active = int(active.numel())
        lut = torch.full((anchor_labels.shape[1],), -1, dtype=torch.long, device=self.device)
        lut[active] = torch.arange(self.num_active, device=self.device)
        crow, ccol = nonzero_pairs(candidate_labels, explicit_zeros=False)
        cu = lut[ccol]
        keep = torch.nonzero(cu >= 0).squeeze(1)  # one host read for both selections
        self.cand_rows = crow.index_select(0, keep)
        self.cand_ucols = cu.index_select(0, keep)
        self._yc_u: Tensor | None = None
        self._yc_u_t: Tensor | None = None

    # sparse (M, U) and (U, M) candidate matrices, built lazily (CSR: fast sparse x dense on CPU/GPU)
    def _cand(self, dtype: torch.dtype) -> Tensor:
        if self._yc_u is None or self._yc_u.dtype != dtype:
            self._yc_u = _csr_of_ones(
                self.cand_rows, self.cand_ucols, (self.num_candidates, self.num_active), dtype
            )
        return self._yc_u

    def _cand_t(self, dtype: torch.dtype) -> Tensor:
        if self._yc_u_t is None or self._yc_u_t.dtype != dtype:
            shape = (self.num_active, self.num_candidates)
            self._yc_u_t = _csr_of_ones(self.cand_ucols, self.cand_rows, shape, dtype)
        return self._yc_u_t

    def on_pairs(self, values: Tensor) -> Tensor:
        """Per-pair ``values`` (P,) with 0 at the grid cells off the anchors' labels (dense products);
        unchanged with sparse products, whose pairs are all non-zeros."""
        if self.pair_mask is None:
            return values
        return torch.where(self.pair_mask, values, torch.zeros((), dtype=values.dtype, device=values.device))

    def dense_pairs(self, values: Tensor) -> Tensor:
        """Scatter per-pair values (P,) into a dense (N, U) matrix (0 off the anchors' pattern)."""
        if self.pair_mask is not None:
            return self.on_pairs(values).view(self.num_anchors, self.num_active)
        out = torch.zeros(self.num_anchors, self.num_active, dtype=values.dtype, device=self.device)
        out[self.rows, self.ucol] = values
        return out

    def spread(self, values: Tensor) -> Tensor:
        """(N, M) matrix ``W_ia = sum_{j in S_i & T_a} q_ij`` for per-pair values q (P,) (no grad)."""
        if self._dense is not None:
            return self.dense_pairs(values) @ cast(self._dense, values.dtype).T
        if self.num_active == 0 or values.numel() == 0:
            return torch.zeros(self.num_anchors, self.num_candidates, dtype=values.dtype, device=self.device)
        q = self.dense_pairs(values)  # (N, U)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sparse CSR beta-support warnings
            out = torch.sparse.mm(self._cand(values.dtype), q.T.contiguous())  # (M, N)
        return out.T

    def spread_by_candidate(self, values: Tensor, values_b: Tensor, use_b: Tensor) -> Tensor:
        """``spread(values)`` for the candidates with ``use_b`` False and ``spread(values_b)`` for the others.

        (N, M), no grad. With sparse products it is one sparse (M, 2U) @ dense (2U, N) product: a
        candidate's entries sit in the first U columns or, when ``use_b``, in the last U, so every
        output entry sums the same terms in the same order as :meth:`spread` would.
        """
        if self._dense is not None or self.num_active == 0 or values.numel() == 0:
            return torch.where(use_b[None, :], self.spread(values_b), self.spread(values))
        q = torch.cat([self.dense_pairs(values), self.dense_pairs(values_b)], dim=1)  # (N, 2U)
        return self._by_candidate_product(use_b, q.T.contiguous()).T

    def _by_candidate_product(self, use_b: Tensor, rhs: Tensor) -> Tensor:
        """(M, C) = sparse (M, 2U) candidate matrix @ ``rhs`` (2U, C): a candidate's entries sit in the
        first U columns, or in the last U when ``use_b``, so it meets the matching half of ``rhs``."""
        u = self.num_active
        shift = use_b[self.cand_rows].long() * u
        cand = _csr_of_ones(self.cand_rows, self.cand_ucols + shift, (self.num_candidates, 2 * u), rhs.dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # sparse CSR beta-support warnings
            return torch.sparse.mm(cand, rhs)

    def spread_by_candidate_and_intersections(
        self, values: Tensor, values_b: Tensor, use_b: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``(spread_by_candidate(values, values_b, use_b), intersections)`` from one sparse product.

        The intersections abs(S_i & T_a) (N, M) are ``spread`` of ones: the sparse (M, 2U) candidate
        matrix of :meth:`spread_by_candidate` times the dense (2U, 2N) matrix [[q^T, Y^T], [q_b^T, Y^T]]
        (Y: the anchors' compact labels, in both halves since a candidate sits in one of them) gives
        both, sharing the candidate matrix and one pass over it instead of a second compaction and
        product for the intersections. Exact counts (sums of ones), no grad.
        """
        if self._dense is not None or self.num_active == 0 or values.numel() == 0:
            ones = torch.ones_like(values)
            return self.spread_by_candidate(values, values_b, use_b), self.spread(ones)
        u, n = self.num_active, self.num_anchors
        rhs = torch.zeros(2 * u, 2 * n, dtype=values.dtype, device=self.device)
        rhs[self.ucol, self.rows] = values
        rhs[self.ucol + u, self.rows] = values_b
        rhs[self.ucol, self.rows + n] = 1.0
        rhs[self.ucol + u, self.rows + n] = 1.0
        out = self._by_candidate_product(use_b, rhs)  # (M, 2N)
        return out[:, :n].T, out[:, n:].T

    def collect(self, weights: Tensor) -> Tensor:
        """Per-pair values ``sum_a F_ia [j in T_a]`` (P,) for an (N, M) matrix F (no grad)."""
        if self._dense is not None:
            return self.on_pairs((weights @ cast(self._dense, weights.dtype)).reshape(-1))
        if self.num_active == 0 or self.rows.numel() == 0:
            return torch.zeros(self.rows.numel(), dtype=weights.dtype, device=self.device)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            g = torch.sparse.mm(self._cand_t(weights.dtype), weights.T.contiguous())  # (U, N)
        return g[self.ucol, self.rows]

    def candidate_counts(self, row_weights: Tensor | None = None) -> Tensor:
        """Per-pair ``sum_a w_a [j in T_a]`` over *all* candidates (P,), w = 1 by default."""
        dtype = torch.float32 if row_weights is None else row_weights.dtype
        if self._dense is not None:
            yc = cast(self._dense, dtype)
            per_label = yc.sum(dim=0) if row_weights is None else row_weights @ yc
            return self.on_pairs(per_label[self.cols])
        w = (
            torch.ones(self.cand_rows.numel(), dtype=dtype, device=self.device)
            if row_weights is None
            else row_weights[self.cand_rows]
        )
        per_label = torch.zeros(self.num_active, dtype=dtype, device=self.device).index_add_(
            0, self.cand_ucols, w
        )
        return per_label[self.ucol]


def dataset_num_labels(dataset: Any, label_column: str = "labels") -> int | None:
    """Number of labels declared by the dataset's ``Sequence(ClassLabel)`` feature, or None."""
    features = getattr(dataset, "features", None)
    if not features or label_column not in features:
        return None
    feat = features[label_column]
    inner = getattr(feat, "feature", feat)  # Sequence(ClassLabel) / List(ClassLabel)
    n = getattr(inner, "num_classes", None)
    return int(n) if n is not None else None


def model_num_labels(model: Any) -> int | None:
    """The model config's label count when it was set on purpose (not PretrainedConfig's default 2)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    id2label = getattr(config, "id2label", None)
    if not id2label or {int(k): v for k, v in id2label.items()} == _DEFAULT_ID2LABEL:
        return None
    return int(config.num_labels)


def resolve_num_labels(
    dataset: Any,
    num_labels: int | None,
    label_column: str,
    model: Any = None,
    loss: Any = None,
    queue: Any = None,
) -> int:
    """The label count everyone must agree on; ValueError naming the two sides of any mismatch."""
    sources: list[tuple[str, int]] = []
    if num_labels is not None:
        sources.append(("num_labels argument", int(num_labels)))
    n_ds = dataset_num_labels(dataset, label_column)
    if n_ds is not None:
        sources.append((f"the dataset's {label_column!r} ClassLabel feature", n_ds))
    n_model = model_num_labels(model)
    if n_model is not None:
        sources.append(("model.config.num_labels", n_model))
    n_loss = getattr(loss, "num_labels", None)
    if isinstance(n_loss, int):
        sources.append((f"the loss's num_labels ({type(loss).__name__})", n_loss))
    n_queue = getattr(queue, "num_labels", None)
    if isinstance(n_queue, int):
        sources.append(("the embedding queue's num_labels", n_queue))
    if not sources:
        raise ValueError(
            "cannot tell the number of labels: the dataset has no ClassLabel feature; pass num_labels= to the "
            "trainer (or load the data with hf_mlcl.data.load_mlc_dataset)"
        )
    first_name, first = sources[0]
    for name, value in sources[1:]:
        if value != first:
            raise ValueError(
                f"label-count mismatch: {first_name} says {first} labels but {name} says {value}; build the "
                "model / loss / queue for the dataset's label space (len(hf_mlcl.data.label_names(ds)))"
            )
    return first
