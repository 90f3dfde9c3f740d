"""Hierarchical Boundary Learning (HBL): a structural regulariser wrapped around any contrastive loss.

:class:`HBLLoss` adds the margin terms L_rel / L_abs of the soft and hard positives (split at the median
Jaccard, :func:`hbl_median_thresholds`, :func:`hbl_soft_positives`) to a base loss, behind a reliability
gate. With ``lambda_scaling="eq7"`` the value returned is eq. (7) multiplied by N / P (eq. (7) = returned
value * P / N).

References: Chen, Lyu, Wang, Tang, "Learning Semantic Boundaries: An Adaptive Structural Loss for
Multi-Label Contrastive Learning", Section III-D, eqs. (3)-(7).
Design: docs/design.md, "HBL structural loss (hf_mlcl/losses/hbl.py)".
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from hf_mlcl.labels import relations as R
from hf_mlcl.labels.host_reads import host_reads_are_free
from hf_mlcl.labels.relations import PairRelations

from .core import ContrastContext, ContrastiveLoss, loss_components
from .registry import LossSettings, get_loss_class, register_loss, resolve_loss_name

__all__ = ["HBLLoss", "hbl_median_thresholds", "hbl_partition", "hbl_per_anchor", "hbl_soft_positives"]

LAMBDA_SCALINGS = ("base", "eq7")


# integer types whose order on the bit patterns of non-negative floats is the float order
_ORDERED_BITS = {torch.float32: torch.int32, torch.float64: torch.int64}


def hbl_median_thresholds(jaccard: Tensor, positive: Tensor) -> tuple[Tensor, Tensor]:
    """theta_i = numpy-style median of ``jaccard[i, positive[i]]`` (eq. 3), vectorised.

    Returns ``(theta, n_pos)``; rows without a positive get theta = +inf (no soft / hard member).

    A selection, not a sort: row i's lower middle value is its lo_i-th smallest positive
    (lo_i = (n_i - 1) // 2). Pushing k - lo_i of the row's non-positives to -inf and the others to
    +inf (k = (M - 1) // 2, always feasible) makes it the k-th smallest entry of every row, so one
    ``kthvalue`` with a common k finds all of them; the upper middle value is that one again when
    at least n_i // 2 + 1 positives are <= it, else the smallest positive above it.
    """
    n_pos = positive.sum(dim=1)
    m = jaccard.shape[1]
    if m == 0:
        return torch.full_like(n_pos, float("inf"), dtype=jaccard.dtype), n_pos
    k = (m - 1) // 2
    below = k - (n_pos - 1).clamp_min(0) // 2  # non-positives sent to -inf in each row
    rank = torch.cumsum(~positive, dim=1, dtype=torch.int32)  # 1-based rank of each non-positive in its row
    inf = torch.full((), float("inf"), dtype=jaccard.dtype, device=jaccard.device)  # a fill, not a host copy
    bits = _ORDERED_BITS.get(jaccard.dtype)
    if bits is None:
        fill = torch.where(rank <= below[:, None], -inf, inf)
        x_lo = torch.where(positive, jaccard, fill).kthvalue(k + 1, dim=1).values
    else:
        # Jaccard values are >= +0.0, and the bit patterns of non-negative IEEE floats order like the
        # floats themselves: the selection runs on integers (faster on CPU), with the integer
        # extremes standing in for -inf / +inf
        info = torch.iinfo(bits)
        low = torch.full((), info.min, dtype=bits, device=jaccard.device)
        high = torch.full((), info.max, dtype=bits, device=jaccard.device)
        fill = torch.where(rank <= below[:, None], low, high)
        keyed = torch.where(positive, jaccard.view(bits), fill)
        x_lo = keyed.kthvalue(k + 1, dim=1).values.view(jaccard.dtype)  # a positive's value (n_pos > 0)
    greater = positive & (jaccard > x_lo[:, None])
    x_above = torch.where(greater, jaccard, inf).amin(dim=1)
    x_hi = torch.where(n_pos - greater.sum(dim=1) >= n_pos // 2 + 1, x_lo, x_above)
    theta = (x_lo + x_hi) / 2
    theta = torch.where(n_pos > 0, theta, inf)
    return theta, n_pos


@functools.lru_cache(maxsize=16)
def _fraction_ranks(max_union: int, dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """Every code p * (U + 1) + q (0 <= p, q <= U, U = ``max_union``) -> the rank of p / max(q, 1) among
    the distinct values of all codes, and those distinct values in increasing order.

    The values are computed by the division :func:`~hf_mlcl.labels.relations.jaccard` performs, in the
    same dtype, so they are bit-identical to the Jaccard matrix's entries; impossible codes (p > q)
    are +inf and rank last.
    """
    u1 = max_union + 1
    codes = torch.arange(u1 * u1, device=device)
    p, q = codes.div(u1, rounding_mode="floor"), codes.remainder(u1)
    values = (p.to(dtype) / q.to(dtype).clamp_min(1)).masked_fill(p > q, float("inf"))
    distinct, rank = torch.unique(values, sorted=True, return_inverse=True)
    return rank, distinct


def _counted_soft_positives(
    inter: Tensor, anchor_sizes: Tensor, candidate_sizes: Tensor, positive: Tensor
) -> tuple[Tensor, Tensor, Tensor] | None:
    """(soft, theta, n_pos) from a per-row histogram of the positives' exact Jaccard fractions, or None
    when that histogram would not be cheaper than a selection over the (N, M) matrix.

    Every Jaccard value is a fraction inter / union of small integers, so a positive is fully described
    by its code inter * (U + 1) + union (U bounds the union). One ``bincount`` of the codes gives each
    row's histogram; its cumulative counts give the two middle order statistics exactly, and a
    per-row table of codes at or above theta gives the soft set, with no sort or selection of the
    (N, M) matrix. Used on CPU (cheaper there; a selection is kept on other devices).
    """
    n, m = inter.shape
    if not host_reads_are_free(inter) or inter.dtype not in _ORDERED_BITS or n == 0 or m == 0:
        return None
    max_union = int(anchor_sizes.max()) + int(candidate_sizes.max()) - 1  # a positive shares >= 1 label
    n_codes = (max_union + 1) ** 2
    if max_union < 1 or n_codes > 4 * m:
        return None
    device = inter.device
    # inter * (U + 1) + union = inter * U + abs(S) + abs(T), exact in floating point at these sizes;
    # the non-positives get code 0 (the value 0, which no positive has)
    # (a bool operand takes a slow path on CPU; its uint8 view multiplies like a float)
    code = (anchor_sizes[:, None] + candidate_sizes[None, :]).add_(inter, alpha=max_union)
    code.mul_(positive.view(torch.uint8))
    index_dtype = torch.int32 if n * n_codes < 2**31 else torch.int64
    flat = code.to(index_dtype).add_(
        torch.arange(0, n * n_codes, n_codes, device=device, dtype=index_dtype)[:, None]
    )
    counts = torch.bincount(flat.view(-1), minlength=n * n_codes).view(n, n_codes)
    rank, values = _fraction_ranks(max_union, inter.dtype, device)
    hist = torch.zeros(n, values.numel(), dtype=counts.dtype, device=device).index_add_(1, rank, counts)
    hist[:, 0] = 0  # the value 0: the non-positives
    cum = hist.cumsum(dim=1)
    n_pos = cum[:, -1]
    middle = torch.stack([(n_pos - 1).clamp_min(0) // 2, n_pos // 2], dim=1)  # 0-based middle ranks
    x = values[torch.searchsorted(cum, middle, right=True).clamp_max_(values.numel() - 1)]
    inf = torch.full((), float("inf"), dtype=inter.dtype, device=device)
    theta = torch.where(n_pos > 0, (x[:, 0] + x[:, 1]) / 2, inf)
    # codes whose value is >= theta (rank at or above the first such distinct value), per row
    soft_codes = rank[None, :] >= torch.searchsorted(values, theta)[:, None]
    return soft_codes.view(-1)[flat], theta, n_pos


def hbl_soft_positives(
    positive: Tensor,
    jaccard: Tensor | None = None,
    inter: Tensor | None = None,
    label_sizes: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Soft positives P_s = {a in P : J_ia >= theta_i} of eq. (3), with theta_i and abs(P_i).

    Returns ``(soft (N, M) bool, theta (N,), n_pos (N,))``; theta is +inf for a row without positives.
    With ``inter`` and ``label_sizes`` = (abs(S_i), abs(T_a)) the exact fraction histogram is used
    where it is cheaper (CPU, small label sets); otherwise the selection of
    :func:`hbl_median_thresholds` on ``jaccard`` (computed from the counts when not given). Both give
    bit-identical results.
    """
    if inter is not None and label_sizes is not None:
        counted = _counted_soft_positives(inter, *label_sizes, positive)
        if counted is not None:
            return counted
        if jaccard is None:
            jaccard = R.jaccard(*label_sizes, inter)
    if jaccard is None:
        raise ValueError("hbl_soft_positives needs jaccard, or inter with label_sizes")
    theta, n_pos = hbl_median_thresholds(jaccard, positive)
    return positive & (jaccard >= theta[:, None]), theta, n_pos


def hbl_partition(
    positive: Tensor,
    k_min: int,
    n_positives: Tensor,
    jaccard: Tensor | None = None,
    inter: Tensor | None = None,
    label_sizes: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """``(soft, hard, gate)``: the soft and hard positives of eq. (3) (P_s = {J >= theta}, P_h = P minus P_s)
    and the reliability gate of eq. (6) as implemented (module docstring): abs(P) >= k_min and both halves
    non-empty. The one definition of HBL's rule, read by :func:`hbl_per_anchor` and ``hf-mlcl inspect``
    (:meth:`HBLLoss.gate_open`). Arguments as :func:`hbl_soft_positives`; ``n_positives`` = abs(P_i)."""
    soft, _, n_sel = hbl_soft_positives(positive, jaccard, inter, label_sizes)
    hard = positive ^ soft  # P_s is a subset of P
    # a row with a positive always has a soft one (its largest value is >= the median theta)
    return soft, hard, (n_positives >= k_min) & (n_sel > 0) & hard.any(dim=1)


def hbl_per_anchor(
    anchors: Tensor,
    candidates: Tensor,
    inter: Tensor,
    jaccard: Tensor | None,
    contrast_mask: Tensor,
    gamma: float,
    m_rel: float,
    m_abs: float,
    k_min: int,
    similarity: Tensor | None = None,
    positive: Tensor | None = None,
    label_sizes: tuple[Tensor, Tensor] | None = None,
    n_positives: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """L_HBL_i for every anchor (eqs. 3-6) and the gate mask.

    Args:
        anchors / candidates: (N, D) / (M, D) embeddings (normalised here for the cosine similarity).
        inter, jaccard: (N, M) label intersections and Jaccard similarities (``jaccard`` may be None
            when ``label_sizes`` is given).
        contrast_mask: (N, M) bool contrast set (self excluded).
        similarity: optional precomputed (N, M) cosine similarities, or any transform of them that
            is increasing within each row (they are used only to *select* pairs; the loss itself is
            recomputed from the embeddings at the selected pairs).
        positive: optional precomputed ``(inter > 0) & contrast_mask``.
        label_sizes: optional (abs(S_i) (N,), abs(T_a) (M,)) label counts: the soft / hard split then
            comes from the exact fraction histogram of :func:`hbl_soft_positives` where cheaper.
        n_positives: optional precomputed ``positive.sum(dim=1)`` (abs(P_i), the gate's count).
    Returns ``(per_anchor (N,), gated (N,) bool)``; per_anchor is 0 where the gate is closed.
    """
    zn = F.normalize(anchors, dim=-1)
    n = zn.shape[0]
    zero = torch.zeros(n, dtype=zn.dtype, device=zn.device) + 0.0 * zn.sum()
    with torch.no_grad():
        if positive is None:
            positive = (inter > 0) & contrast_mask
        n_pos_all = positive.sum(dim=1) if n_positives is None else n_positives
        reliable = n_pos_all >= k_min
        # On the host (CPU tensors) the anchors that cannot pass the reliability gate are dropped before
        # the partition, the costly part; elsewhere that selection would read the gate on the host (a
        # synchronisation), so every row is partitioned and the gate masks the result.
        rows = reliable.nonzero().squeeze(1) if host_reads_are_free(reliable) else None
        if rows is not None and rows.numel() == 0:
            return zero, torch.zeros(n, dtype=torch.bool, device=zn.device)
        if rows is not None and rows.numel() == n:
            rows = None  # every anchor: no row copies
        sub_jac, sub_inter, sub_mask, sizes = jaccard, inter, contrast_mask, label_sizes
        if rows is not None:  # (N, M) row copies only when some anchor is gated out
            sub_mask, positive, sub_inter = contrast_mask[rows], positive[rows], inter[rows]
            sub_jac = None if jaccard is None else jaccard[rows]
            sizes = None if label_sizes is None else (label_sizes[0][rows], label_sizes[1])
        # inter == 0 within the contrast set: P is a subset of it, so the exclusive or (one pass) is the difference
        negative = sub_mask ^ positive
        sub_n = n_pos_all if rows is None else n_pos_all[rows]
        soft, hard, ok = hbl_partition(positive, k_min, sub_n, sub_jac, sub_inter, sizes)
        if rows is None:
            gated = ok
        else:
            gated = torch.zeros(n, dtype=torch.bool, device=zn.device)
            gated[rows[ok]] = True
            if not bool(ok.any()):
                return zero, gated
            if not bool(ok.all()):
                rows, soft, hard, negative = rows[ok], soft[ok], hard[ok], negative[ok]
        every = rows is None
        if similarity is None:
            sim = (zn if every else zn[rows]) @ F.normalize(candidates, dim=-1).T
        else:
            sim = similarity if every else similarity[rows]
        sim = sim.to(zn.dtype)
        # Masked extremes: sim -/+ big outside the set (big = the dtype's largest finite value) leaves
        # the members' values exact and puts every non-member below / above them (sim is first
        # clamped to +-big / 2: the kept scores are -inf at the anchor's own column); the outside masks
        # enter as uint8 (a bool mask or a where takes a slow path on CPU) and the four masked copies
        # share one buffer. max / min(dim).indices: argmax / argmin's first-occurrence index. A row
        # whose set is empty (only when every row is kept) gets some index; the gate zeroes its term.
        big = torch.finfo(sim.dtype).max
        sim = sim.clamp(-big / 2, big / 2)
        buf = torch.empty_like(sim)
        out_hard, out_soft, out_neg = ((~mask).view(torch.uint8) for mask in (hard, soft, negative))
        i_hard_max = torch.add(sim, out_hard, alpha=-big, out=buf).max(dim=1).indices
        i_hard_min = torch.add(sim, out_hard, alpha=big, out=buf).min(dim=1).indices
        i_soft_min = torch.add(sim, out_soft, alpha=big, out=buf).min(dim=1).indices
        i_neg_max = torch.add(sim, out_neg, alpha=-big, out=buf).max(dim=1).indices
        has_neg = negative.any(dim=1)
    # the four selected candidates of every kept anchor, gathered in one index and normalised there
    # (not all M candidates): one (M, D) scatter in the backward instead of four
    z_sel = zn if every else zn[rows]  # (an index of every row would cost an (N, D) scatter in the backward)
    picked = F.normalize(candidates[torch.cat([i_hard_max, i_soft_min, i_neg_max, i_hard_min])], dim=-1)
    s_hard_max, s_soft_min, s_neg_max, s_hard_min = (picked.view(4, *z_sel.shape) * z_sel).sum(dim=-1)
    l_rel = torch.relu(s_hard_max - s_soft_min + m_rel)
    l_abs = torch.relu(s_neg_max - s_hard_min + m_abs)
    l_abs = torch.where(has_neg, l_abs, torch.zeros_like(l_abs))
    term = l_rel + gamma * l_abs
    if every:  # the anchors whose gate is closed contribute 0 (and no gradient)
        return zero + torch.where(gated, term, torch.zeros_like(term)), gated
    per_anchor = zero.index_add(0, rows, term)
    return per_anchor, gated


@register_loss("hbl")
class HBLLoss(ContrastiveLoss):
    """Base contrastive loss + lambda * mean_i L_HBL_i (Chen et al., eq. 7).

    Args:
        base: name of a registered contrastive loss (default "mulsupcon", the paper's) or a
            contrastive loss module.
        base_kwargs: keyword arguments for the base loss (``normalize`` and, where the base declares them
            in its ``run_settings``, ``temperature`` / ``num_labels`` / ``embedding_dim`` given to HBL are
            forwarded when ``base_kwargs`` does not set them).
        lambda_: weight of the structural term. gamma: weight of L_abs inside L_HBL.
        m_rel, m_abs: margins of eqs. (4) and (5). k_min: reliability gate (minimum positives,
            abs(P) >= k_min; see the module docstring).
        lambda_scaling: ``"base"`` (default) or ``"eq7"``: how lambda_ weighs HBL against a base that
            averages over (anchor, label) pairs (module docstring; ``"eq7"`` returns eq. (7) multiplied
            by N / P).
        temperature, normalize: the base's (a base given by name is built with them; default: its paper's
            temperature, normalised embeddings). A base module keeps its own: a different value here is a
            ValueError.

    :meth:`components`: "loss" (= base + lambda_ * scale * hbl), "base", "hbl" (the unweighted mean L_HBL),
    "gate_open" (share of anchors whose gate is open) and the base loss's own components prefixed
    with "base/".

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import HBLLoss
        >>> hbl = HBLLoss(base="mulsupcon", k_min=2)  # any registered contrastive loss as the base
        >>> parts = hbl.components(torch.randn(4, 8), torch.tensor([[1, 1, 0], [1, 0, 0], [0, 1, 1], [1, 1, 0]]))
        >>> sorted(k for k in parts if "/" not in k)
        ['base', 'gate_open', 'hbl', 'loss']
    """

    display_name = "HBL (hierarchical boundary learning)"
    reference = (
        "Chen, Lyu, Wang & Tang, Learning Semantic Boundaries: An Adaptive Structural Loss for Multi-Label "
        "Contrastive Learning"
    )
    citation = (
        "@misc{chen2025hbl,\n  title={Learning Semantic Boundaries: An Adaptive Structural Loss for "
        "Multi-Label Contrastive Learning},\n  author={Chen, Ning and Lyu, Shen-Huan and Wang, Yanyan and "
        "Tang, Bin},\n  year={2025}\n}"
    )

    supports_keys = True
    # HBL is built on MulSupCon (positives "within the current queue"): its MoCo set and warm-up
    default_contrast_set = "keys"
    default_queue_warmup = True
    run_settings = (
        "temperature",
        "num_labels",
        "embedding_dim",
    )  # handed on to the base (its own run_settings)

    def __init__(
        self,
        base: str | nn.Module = "mulsupcon",
        base_kwargs: dict | None = None,
        lambda_: float = 0.01,
        gamma: float = 0.8,
        m_rel: float = 0.1,
        m_abs: float = 0.3,
        k_min: int = 128,
        temperature: float | None = None,
        normalize: bool | None = None,
        num_labels: int | None = None,
        embedding_dim: int | None = None,
        lambda_scaling: str = "base",
    ) -> None:
        if lambda_scaling not in LAMBDA_SCALINGS:
            raise ValueError(
                f"hbl lambda_scaling must be one of {LAMBDA_SCALINGS} ('base': lambda against the base loss as "
                f"reported, 'eq7': eq. 7's balance with a per-label base); got {lambda_scaling!r}"
            )
        for name, value in (("lambda_", lambda_), ("gamma", gamma), ("m_rel", m_rel), ("m_abs", m_abs)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value) >= 0:
                raise ValueError(f"hbl {name} must be a non-negative float, got {value!r}")
        if isinstance(k_min, bool) or not isinstance(k_min, int) or k_min < 0:
            raise ValueError(
                f"hbl k_min must be a non-negative integer (paper: 64, 128 or 256), got {k_min!r}"
            )
        if base_kwargs is not None and not isinstance(base_kwargs, dict):
            raise ValueError(
                f"base_kwargs must be a dict of keyword arguments, got {type(base_kwargs).__name__}"
            )
        if isinstance(base, str):
            key = resolve_loss_name(base)
            cls = get_loss_class(key)
            if key == "hbl":
                raise ValueError(
                    "hbl cannot wrap itself; pick a contrastive base such as 'mulsupcon' or 'any'"
                )
            if not getattr(cls, "is_contrastive", False):
                raise ValueError(f"hbl needs a contrastive base loss, {key!r} is a supervised loss")
            kwargs = {"normalize": True if normalize is None else normalize, **(base_kwargs or {})}
            base_module = cls(**LossSettings(temperature, num_labels, embedding_dim).for_loss(cls, kwargs))
        elif isinstance(base, nn.Module):
            if base_kwargs:
                raise ValueError("base_kwargs is only used when base is a loss name, not a module")
            base_module = base
            own = {
                "temperature": getattr(base, "temperature", None),
                "normalize": getattr(base, "normalize", None),
            }
            clash = [
                f"{name}={value!r} (the base has {own[name]!r})"
                for name, value in (("temperature", temperature), ("normalize", normalize))
                if value is not None and own[name] is not None and value != own[name]
            ]
            if clash:
                raise ValueError(
                    f"hbl with a base module computes with the base's settings; {', '.join(clash)}: set them on "
                    "the base, or pass base as a loss name"
                )
        else:
            raise ValueError(
                f"base must be a registered loss name or a loss module, got {type(base).__name__}"
            )
        base_tau = getattr(base_module, "temperature", None)
        # the base's own normalize; else the one asked for (default on)
        base_norm = getattr(base_module, "normalize", None)
        if base_norm is None:
            base_norm = True if normalize is None else normalize
        super().__init__(temperature=base_tau if base_tau is not None else 0.1, normalize=bool(base_norm))
        self.base = base_module
        self.lambda_ = float(lambda_)
        self.gamma = float(gamma)
        self.m_rel = float(m_rel)
        self.m_abs = float(m_abs)
        self.k_min = int(k_min)
        self.lambda_scaling = lambda_scaling
        self.supports_keys = bool(getattr(base_module, "supports_keys", True))
        self.requires_label_statistics = bool(getattr(base_module, "requires_label_statistics", False))

    def extra_repr(self) -> str:
        return (
            f"lambda_={self.lambda_}, gamma={self.gamma}, m_rel={self.m_rel}, m_abs={self.m_abs}, "
            f"k_min={self.k_min}, lambda_scaling={self.lambda_scaling!r}"
        )

    def set_label_statistics(self, train_labels: Tensor) -> None:
        """Forwarded to the base loss (e.g. ws_mulsupcon's class weights)."""
        if not hasattr(self.base, "set_label_statistics"):
            raise ValueError(f"the base loss {type(self.base).__name__} takes no label statistics")
        self.base.set_label_statistics(train_labels)

    @property
    def _shares_context(self) -> bool:
        """The base is a :class:`ContrastiveLoss` computed the standard way: both terms read one context (labels
        validated and intersected once, the base's similarity order reused)."""
        return (
            isinstance(self.base, ContrastiveLoss)
            and type(self.base).components is ContrastiveLoss.components
        )

    @property
    def context_owner(self) -> ContrastiveLoss:
        return self.base if self._shares_context else self

    def components_on(self, ctx: ContrastContext) -> dict[str, Tensor]:
        """base + lambda_ * scale * mean_i L_HBL_i (scale 1 unless ``"eq7"``), with the parts of the class
        docstring, on the base's context (or HBL's own, for a base module of another kind)."""
        if self._shares_context:
            ctx.keep_scores = self.base.normalize  # the fused kernel's scores order the pairs by cosine
            ctx.share_intersections = True  # a base that computes them anyway (mulsupcon) hands them over
            base_comps = self.base.components_on(ctx)
        else:
            inputs = (ctx.embeddings, ctx.anchor_labels, ctx.key_embeddings, ctx.key_labels)
            extra = {} if ctx.anchors_in_candidates else {"anchors_in_candidates": False}
            parts = getattr(self.base, "components", None)
            base_comps = parts(*inputs, **extra) if callable(parts) else {"loss": self.base(*inputs, **extra)}
        base_loss = base_comps["loss"]
        if ctx.num_anchors == 0:
            hbl, gate_open = ctx.zero(), 0.0
        else:
            per_anchor, gated = self._per_anchor(ctx, ctx.similarity_order())
            hbl, gate_open = per_anchor.mean(), gated.float().mean()
        loss = base_loss + self._lambda_factor(ctx, base_loss.dtype) * hbl.to(base_loss.dtype)
        parts = {"base": base_loss, "hbl": hbl, "gate_open": gate_open}
        parts.update((f"base/{name}", value) for name, value in base_comps.items() if name != "loss")
        return loss_components(loss, parts)

    @classmethod
    def gate_open(cls, rel: PairRelations, k_min: int) -> Tensor:
        """(N,) bool: the anchors whose reliability gate opens (eq. 6, :func:`hbl_partition`) on the
        positives of :meth:`~hf_mlcl.losses.core.ContrastiveLoss.positives` (S & T non-empty)."""
        positive = cls.positives(rel)
        sizes = (rel.anchor_sizes, rel.candidate_sizes)
        return hbl_partition(positive, k_min, positive.sum(dim=1), inter=rel.inter, label_sizes=sizes)[2]

    def _lambda_factor(self, ctx: ContrastContext, dtype: torch.dtype) -> float | Tensor:
        """lambda_ times 1 (``"base"``), or times N / P for eq. 7's balance against a base averaged over
        label pairs (a 0-d tensor: P stays on the device; computed in float64, rounded once to ``dtype``)."""
        label_pairs = getattr(self.base, "label_pairs", None)
        if self.lambda_scaling == "base" or label_pairs is None or ctx.num_anchors == 0:
            return self.lambda_
        with torch.no_grad():
            pairs = label_pairs(ctx).to(torch.float64)
            scale = torch.where(pairs > 0, torch.full_like(pairs, ctx.num_anchors) / pairs, 1.0)
            return (self.lambda_ * scale).to(dtype)

    def _per_anchor(self, ctx: ContrastContext, sim: Tensor | None) -> tuple[Tensor, Tensor]:
        # No anchor can pass the reliability gate when its contrast set (the candidates less its own column)
        # is smaller than k_min, known from the shapes on every device; otherwise reading the gate is free
        # on the host only (elsewhere hbl_per_anchor masks the closed gates). Either way L_HBL = 0 without
        # touching the embeddings (the total stays connected to the graph through the base loss).
        reachable = ctx.num_candidates - int(ctx.anchors_in_candidates) >= self.k_min
        n_positives = ctx.shares_label.sum(dim=1) if reachable else None
        if not reachable or (
            host_reads_are_free(n_positives) and not bool((n_positives >= self.k_min).any())
        ):
            zero = torch.zeros(ctx.num_anchors, dtype=ctx.dtype, device=ctx.device)
            return zero, zero.bool()
        # the raw (upcast) candidates: hbl_per_anchor normalises the anchors and the few selected
        # candidates itself, so the M candidates are not normalised as a whole
        return hbl_per_anchor(
            ctx.embeddings,
            ctx.raw_candidates,
            ctx.inter,
            None,  # the Jaccard matrix is formed from the counts only if the fraction histogram is not used
            ctx.contrast_mask,
            gamma=self.gamma,
            m_rel=self.m_rel,
            m_abs=self.m_abs,
            k_min=self.k_min,
            similarity=sim,
            positive=ctx.shares_label,  # (inter > 0) off the anchor's own column = inside the contrast set
            label_sizes=(ctx.anchor_sizes, ctx.candidate_sizes),
            n_positives=n_positives,
        )
