"""Similarity-Dissimilarity loss (Huang et al.): ANY positives re-weighted by K^s K^d.

:class:`SimilarityDissimilarityLoss` (registered as ``"similarity_dissimilarity"``, alias ``"sd"``) and
:func:`similarity_dissimilarity_weights`; ``weight_in_log`` and ``label_similarity`` are its options.

References: "Similarity-Dissimilarity Loss for Multi-label Supervised Contrastive Learning", Section 2.4,
eqs. (13)-(15), Theorems 1-5 (Section 2.6).
Design: docs/design.md, "Similarity-Dissimilarity loss (hf_mlcl/losses/similarity_dissimilarity.py)".
"""

from __future__ import annotations

import torch
from torch import Tensor

from .core import ContrastContext, ContrastiveLoss, LossTerms
from .label_similarity import LabelSimilarityOption, LabelSimilaritySpec
from .registry import register_loss


def similarity_dissimilarity_weights(inter: Tensor, anchor_sizes: Tensor, candidate_sizes: Tensor) -> Tensor:
    """K^s K^d for every (anchor, candidate) pair (eq. 14 x eq. 15), 0 where S & T is empty.

    Args:
        inter: (N, M) abs(S & T).
        anchor_sizes: (N,) abs(S).
        candidate_sizes: (M,) abs(T).
    """
    # K^s K^d = (abs(S & T) / abs(S)) * 1 / (1 + abs(T) - abs(S & T)) in one division: the denominator
    # is an exact integer product (>= 1), and a pair without a shared label gets 0 / d = 0
    return inter / (anchor_sizes.clamp_min(1)[:, None] * ((1.0 + candidate_sizes)[None, :] - inter))


@register_loss("similarity_dissimilarity", "sd")
class SimilarityDissimilarityLoss(LabelSimilarityOption, ContrastiveLoss):
    """Similarity-Dissimilarity loss, eq. (13)-(15) of Huang et al.

    Args:
        temperature: tau (default 0.07, the paper's value).
        normalize: L2-normalise embeddings inside the loss.
        weight_in_log: False -> K^s K^d multiplies log p (default); True -> eq. 13 literally,
            -(log(K^s K^d) + log p), whose gradient equals ANY's.
        label_similarity: ``"sd"`` (default: K^s K^d) or another weight in its place (``"jaccard"``,
            ``"dice"``, ``"overlap"``, ``"cosine"``, a callable, an (L, L) matrix; module docstring).
        label_similarity_threshold: a candidate is a positive only when its weight exceeds this (None: every
            candidate with a positive weight). ``label_similarity="jaccard"`` with 0.3 and ``temperature=0.1`` is
            pytorch-metric-learning's multi-label SupCon (docs/losses.md).

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import get_loss
        >>> sd = get_loss("sd")  # the registry alias
        >>> type(sd).__name__, sd(torch.randn(4, 8), torch.eye(4)[[0, 0, 1, 1]] + torch.eye(4)[[2, 2, 2, 3]]).ndim
        ('SimilarityDissimilarityLoss', 0)
    """

    display_name = "Similarity-Dissimilarity loss"
    reference = (
        "Huang, Long & Luo, Similarity-Dissimilarity Loss for Multi-label Supervised Contrastive Learning, "
        "arXiv:2410.13439v5"
    )
    citation = (
        "@article{huang2024similarity,\n  title={Similarity-Dissimilarity Loss for Multi-label Supervised "
        "Contrastive Learning},\n  author={Huang, Guangming and Long, Yunfei and Luo, Cunjin},\n  "
        "journal={arXiv preprint arXiv:2410.13439v5},\n  year={2024}\n}"
    )

    default_temperature = 0.07

    def __init__(
        self,
        temperature: float | None = None,
        normalize: bool = True,
        weight_in_log: bool = False,
        label_similarity: LabelSimilaritySpec = "sd",
        label_similarity_threshold: float | None = None,
    ):
        super().__init__(temperature=temperature, normalize=normalize)
        self.weight_in_log = bool(weight_in_log)
        self.init_label_similarity(label_similarity, own=("sd",), threshold=label_similarity_threshold)

    def extra_repr(self) -> str:
        return (
            super().extra_repr()
            + f", weight_in_log={self.weight_in_log}, label_similarity={self.label_similarity_name}"
        )

    def similarity_weights(self, ctx: ContrastContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(K^s K^d, S & T non-empty) for ``label_similarity="sd"``, else the chosen similarity's."""
        if self.label_similarity != "sd":
            return super().similarity_weights(ctx)
        positive = ctx.shares_label
        k = similarity_dissimilarity_weights(ctx.inter, ctx.anchor_sizes, ctx.candidate_sizes)
        return torch.where(positive, k, torch.zeros_like(k)).to(ctx.dtype), positive

    def build_terms(self, ctx: ContrastContext) -> LossTerms:
        k, positive = self.label_weights(ctx)
        count = positive.to(ctx.dtype)
        if not self.weight_in_log:
            return LossTerms(weights=k, normalizer=count.sum(dim=1), zero_diagonal=True)
        log_k = torch.where(
            positive, torch.log(k.clamp_min(torch.finfo(ctx.dtype).tiny)), torch.zeros_like(k)
        )
        wsum = count.sum(dim=1)
        return LossTerms(
            weights=count, normalizer=wsum, constant=log_k.sum(dim=1), weight_sums=wsum, zero_diagonal=True
        )
