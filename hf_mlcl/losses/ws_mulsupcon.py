"""ws-MulSupCon: weighted stratification in multi-label contrastive learning (Lin & Chen).

:class:`WSMulSupConLoss`: IoU- and class-weighted MulSupCon terms per stratum (single-label, multi-label,
healthy), the paper's eq. (9) by default or the authors' public code with ``authors_code=True``.

References: Lin & Chen, "Weighted Stratification in Multi-Label Contrastive Learning for Long-Tailed
Medical Image Classification", Section 2.2, eqs. (2)-(9).
Design: docs/design.md, "ws-MulSupCon (hf_mlcl/losses/ws_mulsupcon.py)".
"""

from __future__ import annotations

import torch
from torch import Tensor

from hf_mlcl.labels import multihot as M
from hf_mlcl.labels import relations as R
from hf_mlcl.labels.relations import PairRelations
from hf_mlcl.labels.statistics import PairLabelView, dense_label_products, ws_class_weights

from .core import ContrastContext, ContrastiveLoss
from .registry import register_loss

__all__ = ["WSMulSupConLoss"]


def _masked_lse(logits: Tensor, mask: Tensor) -> Tensor:
    """Row logsumexp over ``mask`` (N,); rows with an empty mask get 0 (they carry no weight)."""
    has_any = mask.any(dim=1, keepdim=True)
    masked = logits.masked_fill(~mask, float("-inf")).masked_fill(~has_any, 0.0)
    return torch.logsumexp(masked, dim=1)


def _weighted_logp_sum(weights: Tensor, logits: Tensor, lse: Tensor) -> Tensor:
    """sum_a W_ia (s_ia - LSE_i) per anchor (N,), W zero outside the contrast set."""
    return (weights * logits).sum(dim=1) - weights.sum(dim=1) * lse


@register_loss("ws_mulsupcon", "ws-mulsupcon", "wsmulsupcon")
class WSMulSupConLoss(ContrastiveLoss):
    """ws-MulSupCon (Lin & Chen, eqs. 2-9), optionally the authors' public-code variant.

    Args:
        lambda_: weight of the healthy-case loss L_h in eq. (9) (paper: 0.7 on CXR-14).
        authors_code: reproduce the authors' public code (per-stratum softmax, C̄_j = (M - m_j)/M);
            see the module docstring.
        class_weights: use the training-set class weights D̄, C̄ (paper). False gives the
            "stratified + IoU" ablation (all class weights 1) and needs no statistics.
        temperature: tau (paper / code: 0.1). normalize: L2-normalise embeddings and keys.

    ``set_label_statistics(train_labels)`` must be called before the first forward when
    ``class_weights`` is True (else ``ValueError``); train_labels is the dense or torch-sparse (N, L)
    multi-hot matrix of the training set.

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import WSMulSupConLoss
        >>> ws = WSMulSupConLoss()
        >>> ws.set_label_statistics(torch.tensor([[1, 0], [1, 1], [1, 0], [0, 1]]))  # training-set labels
        >>> ws(torch.randn(3, 8), torch.tensor([[1, 0], [1, 1], [0, 1]])).ndim
        0
    """

    display_name = "ws-MulSupCon (weighted stratification)"
    reference = (
        "Lin & Chen, Weighted Stratification in Multi-Label Contrastive Learning for Long-Tailed Medical "
        "Image Classification"
    )
    citation = (
        "@misc{lin2025wsmulsupcon,\n  title={Weighted Stratification in Multi-Label Contrastive Learning "
        "for Long-Tailed Medical Image Classification},\n  author={Lin, Ying-Chih and Chen, Yong-Sheng},\n"
        "  year={2025}\n}"
    )

    default_temperature = 0.1
    supports_keys = True
    requires_label_statistics = True

    def __init__(
        self,
        lambda_: float = 0.7,
        authors_code: bool = False,
        class_weights: bool = True,
        temperature: float | None = None,
        normalize: bool = True,
    ) -> None:
        super().__init__(temperature=temperature, normalize=normalize)
        if (
            isinstance(lambda_, bool)
            or not isinstance(lambda_, (int, float))
            or not (0.0 <= float(lambda_) <= 1.0)
        ):
            raise ValueError(f"lambda_ must be a float in [0, 1] (paper: 0.7), got {lambda_!r}")
        self.lambda_ = float(lambda_)
        self.authors_code = bool(authors_code)
        self.class_weights = bool(class_weights)
        # instance override: without class weights there is nothing to fetch from the training set
        self.requires_label_statistics = self.class_weights
        self.register_buffer("single_weights", None, persistent=False)
        self.register_buffer("multi_weights", None, persistent=False)

    def extra_repr(self) -> str:
        return (
            f"lambda_={self.lambda_}, authors_code={self.authors_code}, class_weights={self.class_weights}, "
            + super().extra_repr()
        )

    @staticmethod
    def healthy_positives(rel: PairRelations) -> Tensor:
        """(N,): eq. (8), a healthy anchor's positives are the healthy (empty-label) candidates of its
        contrast set: as many as there are healthy candidates, less itself when it is one (in-batch).
        Given for every anchor; only the healthy ones use it (labelled anchors have the ANY rule,
        :meth:`~hf_mlcl.losses.core.ContrastiveLoss.positives`)."""
        own_column = 1.0 if rel.anchors_in_candidates else 0.0
        return (rel.candidate_sizes == 0).sum().to(rel.dtype) - own_column * (rel.anchor_sizes == 0).to(
            rel.dtype
        )

    def set_label_statistics(self, train_labels: Tensor) -> None:
        """Compute D̄_j and C̄_j from the training-set multi-hot matrix (dense or torch sparse (N, L))."""
        single_w, multi_w = ws_class_weights(train_labels, authors_code=self.authors_code)
        device = self.single_weights.device if self.single_weights is not None else single_w.device
        self.single_weights = single_w.to(device)
        self.multi_weights = multi_w.to(device)

    @property
    def has_label_statistics(self) -> bool:
        return self.single_weights is not None

    def _label_weights(
        self, num_labels: int, dtype: torch.dtype, device: torch.device
    ) -> tuple[Tensor, Tensor] | None:
        """(D̄, C̄) as (L,) vectors, or None without class weights; ValueError when they cannot apply."""
        if not self.class_weights:
            return None
        if self.single_weights is None:
            raise ValueError(
                "ws_mulsupcon needs training-set label statistics for its class weights D̄_j, C̄_j: call "
                "loss.set_label_statistics(train_labels) with the (N, L) multi-hot training labels before "
                "the first forward (the ContrastiveTrainer does this automatically; ContrastiveLossFunc and "
                "MultiLabelContrastiveLoss have the same method), or build the loss "
                "with class_weights=False for the unweighted stratified variant"
            )
        if self.single_weights.numel() != num_labels:
            raise ValueError(
                f"ws_mulsupcon label statistics cover {self.single_weights.numel()} labels but the batch "
                f"labels have {num_labels} columns; call set_label_statistics with the training labels of "
                "the same label space"
            )
        return (
            self.single_weights.to(device=device, dtype=dtype),
            self.multi_weights.to(device=device, dtype=dtype),
        )

    def _class_weights(
        self, cols: Tensor, single_pair: Tensor, num_labels: int, dtype: torch.dtype
    ) -> Tensor:
        weights = self._label_weights(num_labels, dtype, cols.device)
        if weights is None:
            return torch.ones(cols.shape, dtype=dtype, device=cols.device)
        return torch.where(single_pair, weights[0][cols], weights[1][cols])

    def _paper_weights_dense(
        self,
        ctx: ContrastContext,
        iou: Tensor,
        single_a: Tensor,
        multi_a: Tensor,
        single_c: Tensor,
        multi_c: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """W_s + W_m (N, M) and the per-anchor count of pairs with a positive, in dense (N, L) algebra.

        The small-label-space form of the pair computation in :meth:`compute` (same values): for an
        anchor i carrying j, n_s(i, j) = #single-label candidates carrying j minus the anchor itself
        when it is a single-label candidate of its own row, likewise n_m; q = class weight / n on
        the anchor's labels; W_ia = IoU_ia * sum_j q_(stratum of a)(i, j) [j in T_a]. One product
        per quantity instead of per-pair gathers (fewer, larger ops: the cost of a small in-batch step).
        """
        dtype = ctx.dtype
        ya = M.cast(ctx.anchor_labels, dtype)
        yc = M.cast(ctx.candidate_labels, dtype)
        strata_c = torch.stack([single_c, multi_c]).to(dtype)  # (2, M) single / multi candidates
        counts = (strata_c @ yc).reshape(1, -1)  # (1, 2L): candidates of each stratum carrying label j
        own = 1.0 if ctx.anchors_in_candidates else 0.0  # keys-only contrast set: no own column
        own_a = torch.stack([single_a, multi_a], dim=1).to(dtype).repeat_interleave(ya.shape[1], dim=1)
        n = counts - own * own_a  # (N, 2L) = [n_s | n_m] on the anchors' labels
        weights = self._label_weights(ya.shape[1], dtype, ya.device)
        cw = ya if weights is None else torch.where(single_a[:, None], weights[0], weights[1]) * ya
        q = torch.where(n > 0, cw.repeat(1, 2) / n.clamp_min(1), 0.0)  # [q_s | q_m]
        stratified = torch.cat([yc * strata_c[0][:, None], yc * strata_c[1][:, None]], dim=1)  # (M, 2L)
        w_sm = (q @ stratified.T).mul_(iou)
        if ctx.anchors_in_candidates:  # the anchor's own column is outside its contrast set
            w_sm.diagonal().zero_()
        width = ya.shape[1]
        pairs = (((n[:, :width] + n[:, width:]) > 0) & (ya > 0)).sum(dim=1).to(dtype)
        return w_sm, pairs

    def _paper_loss(
        self,
        ctx: ContrastContext,
        w_sm: Tensor,
        pairs_per_anchor: Tensor,
        strata_a: tuple[Tensor, ...],
        healthy_c: Tensor,
        n_h: Tensor,
    ) -> tuple[Tensor, dict]:
        """Eq. (9) of the paper in one fused pass: the strata's rows are disjoint (healthy anchors carry no
        pair, diseased ones no healthy weight), so each anchor's bracket [Wsum LSE - sum W s] is its stratum's
        term and eq. (9) is a per-anchor coefficient (1 - lambda) / P_stratum or lambda / abs(H).
        ``strata_a``: the single-label, multi-label and valid healthy anchors (bool (N,) each)."""
        dtype, device = ctx.dtype, ctx.device
        valid_h = strata_a[2]
        with torch.no_grad():
            # (3, N) stratum indicator: single / multi anchors, healthy anchors with a positive
            strata = torch.stack(strata_a).to(dtype)
            counts = strata @ (pairs_per_anchor + strata[2])  # pairs with a positive; healthy anchors
            factors = torch.full((3,), 1.0 - self.lambda_, dtype=dtype, device=device)
            factors[2] = self.lambda_
            per_count = torch.where(counts > 0, factors / counts.clamp_min(1), 0.0)
            coef = per_count @ strata
            # 1 / n_h on the valid healthy anchors' healthy columns (their rows of W_sm are 0)
            healthy_pos = valid_h[:, None] & healthy_c[None, :]
            w_sm = torch.where(healthy_pos, n_h.reciprocal()[:, None], w_sm)
            if ctx.anchors_in_candidates:  # not the anchor's own column
                w_sm.diagonal().zero_()
        loss, bracket = ctx.fused(w_sm, coef)
        sums = strata @ bracket
        parts = dict(
            zip(("ws", "wm", "h"), torch.where(counts > 0, sums / counts.clamp_min(1), 0.0).unbind())
        )
        return loss, parts

    def compute(self, ctx: ContrastContext) -> tuple[Tensor, dict]:
        dtype = ctx.dtype
        device = ctx.device
        with torch.no_grad():
            size_a = ctx.anchor_sizes
            size_c = ctx.candidate_sizes
            single_a, multi_a, healthy_a = size_a == 1, size_a >= 2, size_a == 0
            single_c, multi_c, healthy_c = size_c == 1, size_c >= 2, size_c == 0

            if not self.authors_code and dense_label_products(ctx.anchor_labels, ctx.candidate_labels):
                iou = ctx.jaccard.to(dtype)  # the own column is zeroed in the product
                w_sm, pairs_per_anchor = self._paper_weights_dense(
                    ctx, iou, single_a, multi_a, single_c, multi_c
                )
            else:
                view = PairLabelView(ctx.anchor_labels, ctx.candidate_labels)
                rows, cols = view.rows, view.cols
                single_pair = single_a[rows]
                cw = self._class_weights(cols, single_pair, ctx.anchor_labels.shape[1], dtype)
                # positives per (anchor, label) pair and candidate stratum; the anchor itself (in-batch
                # column i, same stratum as the anchor, carries j) is not in its contrast set
                own = 1.0 if ctx.anchors_in_candidates else 0.0  # keys-only contrast set: no own column
                n_s = view.candidate_counts(single_c.to(dtype)) - own * single_pair.to(dtype)
                n_m = view.candidate_counts(multi_c.to(dtype)) - own * multi_a[rows].to(dtype)
                zero = torch.zeros((), dtype=dtype, device=device)
                q_s = torch.where(n_s > 0, cw / n_s.clamp_min(1), zero)
                q_m = torch.where(n_m > 0, cw / n_m.clamp_min(1), zero)
                if self.authors_code:
                    iou = ctx.jaccard.to(dtype) * ctx.contrast_mask
                    w_s = iou * single_c[None, :] * view.spread(q_s)  # positives in P_s, weighted
                    w_m = iou * multi_c[None, :] * view.spread(q_m)  # positives in P_m, weighted
                else:
                    # w_s + w_m in one product: a candidate is in P_s or P_m by its own stratum (healthy
                    # candidates carry no label, so their entries are 0 either way)
                    # the intersections for the IoU come out of the same sparse product
                    w_sm, inter = view.spread_by_candidate_and_intersections(q_s, q_m, multi_c)
                    w_sm.mul_(R.jaccard(size_a, size_c, inter).to(dtype))
                    if ctx.anchors_in_candidates:  # the anchor's own column is outside its contrast set
                        w_sm.diagonal().zero_()
                    pair_ok = ((n_s + n_m) > 0).to(dtype)
                    pairs_per_anchor = torch.zeros(ctx.num_anchors, dtype=dtype, device=device)
                    pairs_per_anchor.index_add_(0, rows, pair_ok)

                def pair_count(pair_ok: Tensor, anchor_mask: Tensor) -> Tensor:
                    return (pair_ok & anchor_mask[rows]).sum().to(dtype)

            n_h = self.healthy_positives(ctx).to(dtype)
            valid_h = healthy_a & (n_h > 0)
            num_h = valid_h.sum().to(dtype)
            has_h = num_h > 0  # stays on the device: the branches below are tensor algebra

        if not self.authors_code:
            return self._paper_loss(ctx, w_sm, pairs_per_anchor, (single_a, multi_a, valid_h), healthy_c, n_h)

        s = ctx.logits
        zero_loss = ctx.zero()

        def safe_div(total: Tensor, count: Tensor) -> Tensor:
            """total / count, or the connected zero when count is 0 (tensor algebra, no host read)."""
            return torch.where(count > 0, total / count.clamp_min(1), zero_loss)

        with torch.no_grad():
            healthy_pos = ctx.contrast_mask & healthy_c[None, :]
            w_h = torch.where(valid_h[:, None] & healthy_pos, 1.0 / n_h.clamp_min(1)[:, None], 0.0)

        # ---- authors' public code: one softmax per candidate stratum
        contrast = ctx.contrast_mask
        lse_s = _masked_lse(s, contrast & (size_c <= 1)[None, :])
        lse_m = _masked_lse(s, contrast & (multi_c | healthy_c)[None, :])
        lse_all = _masked_lse(s, contrast)
        term_s = -_weighted_logp_sum(w_s, s, lse_s)  # per anchor, summed over its rows j
        term_m = -_weighted_logp_sum(w_m, s, lse_m)
        s2s = safe_div(torch.where(single_a, term_s, zero).sum(), pair_count(n_s > 0, single_a))
        s2m = safe_div(torch.where(single_a, term_m, zero).sum(), pair_count(n_m > 0, single_a))
        m2s = safe_div(torch.where(multi_a, term_s, zero).sum(), pair_count(n_s > 0, multi_a))
        m2m = safe_div(torch.where(multi_a, term_m, zero).sum(), pair_count(n_m > 0, multi_a))
        disease = s2s + s2m + m2s + m2m
        # eq. (9) when the batch has a valid healthy anchor, else the plain disease sum (authors' code)
        l_h = safe_div(-_weighted_logp_sum(w_h, s, lse_all).sum(), num_h)
        loss = torch.where(has_h, (1.0 - self.lambda_) * disease + self.lambda_ * l_h, disease)
        parts = {"ws": s2s + s2m, "wm": m2s + m2m, "h": l_h, "s2s": s2s, "s2m": s2m, "m2s": m2s, "m2m": m2m}
        return loss, parts
