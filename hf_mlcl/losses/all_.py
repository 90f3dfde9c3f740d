"""ALL strategy of multi-label SupCon: positives are candidates with exactly the anchor's label set.

Paper: Similarity-Dissimilarity Loss (Huang et al.), Section 2.2, eq. (1) (positive set) and eq. (3)
(per-anchor loss), following SupCon (Khosla et al., 2020). Registered as ``"all"``.

* positives of anchor i: candidates p in the contrast set with T_p == S_i and S_i non-empty;
* weight W_ip = 1;
* per-anchor normaliser: number of positives abs(P(i));
* reduction: mean over anchors with at least one positive (the paper's eq. (4) sums);
* a batch with no negative pair keeps the SupCon formula, loss_i = LSE_i - mean_p s_ip >= log abs(P(i)),
  where pytorch-metric-learning's ``SupConLoss`` returns 0 (docs/losses.md, "Choices where a paper is
  ambiguous (each is an option; the default is justified in the docstring)", "A batch with no negative pair").
"""

from __future__ import annotations

from torch import Tensor

from hf_mlcl.labels.relations import PairRelations

from .core import ContrastiveLoss
from .mulsupcon import MULSUPCON_CITATION
from .registry import register_loss


@register_loss("all")
class AllLoss(ContrastiveLoss):
    """Multi-label SupCon with the ALL positive rule (eq. 1 and 3 of the SD-loss paper).

    Args:
        temperature: tau (default 0.07, the SD paper's value).
        normalize: L2-normalise embeddings inside the loss.

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import AllLoss
        >>> same_sets = torch.tensor([[1, 0, 1], [1, 0, 1], [0, 1, 0], [0, 1, 0]])  # rows 0-1 and 2-3 positives
        >>> AllLoss(temperature=0.1)(torch.randn(4, 8), same_sets).shape
        torch.Size([])
    """

    display_name = "ALL (exact label-set match)"
    reference = "Zhang & Wu, Multi-Label Supervised Contrastive Learning, AAAI 2024 (baseline strategy)"
    citation = MULSUPCON_CITATION

    default_temperature = 0.07

    sampler_rule = "same_label_set"  # the rows a batch sampler pairs: those with the same label set

    @staticmethod
    def positives(rel: PairRelations) -> Tensor:
        """T == S with S non-empty, inside the contrast set (eq. 1); weighted by the base class's SupCon terms."""
        return rel.equal & (rel.anchor_sizes > 0)[:, None] & rel.contrast_mask
