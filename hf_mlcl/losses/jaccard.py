"""Jaccard-weighted multi-label SupCon, L_Base of Audibert et al. (ABALONE paper, Section 3.1).

Paper: Audibert, Gauffre & Amini, "Exploring contrastive learning for long-tailed multi-label text
classification" (ECML-PKDD 2024), Section 3.1, the L_Base equation and its normaliser N(i).
Registered as ``"jaccard"``.

* positives of anchor i: candidates with S_i & T_p non-empty;
* weight W_ip = abs(S & T) / abs(S | T) (Jaccard similarity), outside the log;
* per-anchor normaliser: N(i) = sum_p W_ip;
* reduction: mean over anchors with at least one positive (the paper divides by abs(B); anchors without
  positives contribute 0 there, we do not count them — docs/losses.md).
"""

from __future__ import annotations

import torch

from .core import ContrastContext, ContrastiveLoss, LossTerms
from .registry import register_loss


@register_loss("jaccard")
class JaccardLoss(ContrastiveLoss):
    """L_Base (Audibert et al.): SupCon with Jaccard-similarity positive weights.

    Args:
        temperature: tau (default 0.1, the value the paper adopts for all its experiments).
        normalize: L2-normalise embeddings inside the loss.
    """

    default_temperature = 0.1

    def build_terms(self, ctx: ContrastContext) -> LossTerms:
        w = torch.where(ctx.shares_label, ctx.jaccard, torch.zeros_like(ctx.jaccard)).to(ctx.dtype)
        return LossTerms(weights=w, normalizer=w.sum(dim=1))
