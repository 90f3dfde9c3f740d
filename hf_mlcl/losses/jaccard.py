"""Jaccard-weighted multi-label SupCon, L_Base of Audibert et al. (ABALONE paper, Section 3.1).

Paper: Audibert, Gauffre & Amini, "Exploring contrastive learning for long-tailed multi-label text
classification" (ECML-PKDD 2024), Section 3.1, the L_Base equation and its normaliser N(i).
Registered as ``"jaccard"``.

* positives of anchor i: candidates with S_i & T_p non-empty;
* weight W_ip = abs(S & T) / abs(S | T) (Jaccard similarity), outside the log;
* per-anchor normaliser: N(i) = sum_p W_ip;
* reduction: mean over anchors with at least one positive (the paper divides by abs(B); anchors without
  positives contribute 0 there, we do not count them — docs/losses.md).

``label_similarity`` replaces the Jaccard weight by another label similarity (``"dice"``, ``"overlap"``,
``"cosine"``, a callable or an (L, L) label-similarity matrix for soft positives through related labels,
:mod:`hf_mlcl.losses.label_similarity`); the normaliser stays N(i) = sum_p W_ip.
"""

from __future__ import annotations

import torch

from .core import ContrastContext, ContrastiveLoss, LossTerms
from .label_similarity import LabelSimilarityOption, LabelSimilaritySpec
from .registry import register_loss

AUDIBERT_CITATION = (
    "@inproceedings{audibert2024exploring,\n  title={Exploring Contrastive Learning for Long-Tailed "
    "Multi-Label Text Classification},\n  author={Audibert, Alexandre and Gauffre, Aur{\\'e}lien and "
    "Amini, Massih-Reza},\n  booktitle={Joint European Conference on Machine Learning and Knowledge "
    "Discovery in Databases},\n  pages={245--261},\n  year={2024},\n  publisher={Springer}\n}"
)

AUDIBERT_REFERENCE = (
    "Audibert, Gauffre & Amini, Exploring Contrastive Learning for Long-Tailed Multi-Label Text "
    "Classification, ECML-PKDD 2024"
)


@register_loss("jaccard")
class JaccardLoss(LabelSimilarityOption, ContrastiveLoss):
    """L_Base (Audibert et al.): SupCon with Jaccard-similarity positive weights.

    Args:
        temperature: tau (default 0.1, the value the paper adopts for all its experiments).
        normalize: L2-normalise embeddings inside the loss.
        label_similarity: the positive weight: ``"jaccard"`` (default, the paper's), ``"dice"``,
            ``"overlap"``, ``"cosine"``, a callable ``(S, T) -> (N, M)`` on the label matrices, or an
            (L, L) label-similarity matrix (soft cosine; :mod:`hf_mlcl.losses.label_similarity`).
        label_similarity_threshold: a candidate is a positive only when its weight exceeds this (None: every
            candidate with a positive weight, the paper's rule).

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import JaccardLoss
        >>> z = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
        >>> JaccardLoss(temperature=0.1)(z, torch.tensor([[1, 1], [1, 0], [0, 1], [1, 1]])).item() > 0
        True
    """

    display_name = "L_Base (Jaccard-weighted SupCon)"
    reference = AUDIBERT_REFERENCE
    citation = AUDIBERT_CITATION

    default_temperature = 0.1

    def __init__(
        self,
        temperature: float | None = None,
        normalize: bool = True,
        label_similarity: LabelSimilaritySpec = "jaccard",
        label_similarity_threshold: float | None = None,
    ) -> None:
        super().__init__(temperature=temperature, normalize=normalize)
        self.init_label_similarity(label_similarity, threshold=label_similarity_threshold)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", label_similarity={self.label_similarity_name}"

    def build_terms(self, ctx: ContrastContext) -> LossTerms:
        if self.label_similarity == "jaccard" and self.label_similarity_threshold is None:
            w = torch.where(self.positives(ctx), ctx.jaccard, 0.0).to(ctx.dtype)  # 0 at the own column
        else:
            w = self.label_weights(ctx)[0]  # 0 at the own column
        wsum = w.sum(dim=1)
        return LossTerms(weights=w, normalizer=wsum, weight_sums=wsum, zero_diagonal=True)
