"""ANY strategy of multi-label SupCon: positives are candidates sharing at least one label.

Paper: Similarity-Dissimilarity Loss (Huang et al.), Section 2.2, eq. (2) (positive set) and eq. (3)
(per-anchor loss), following SupCon (Khosla et al., 2020). Registered as ``"any"``.

* positives of anchor i: candidates p in the contrast set with S_i & T_p non-empty;
* weight W_ip = 1;
* per-anchor normaliser: number of positives abs(P(i));
* reduction: mean over anchors with at least one positive.
"""

from __future__ import annotations

from .core import ContrastiveLoss
from .mulsupcon import MULSUPCON_CITATION
from .registry import register_loss


@register_loss("any")
class AnyLoss(ContrastiveLoss):
    """Multi-label SupCon with the ANY positive rule (eq. 2 and 3 of the SD-loss paper).

    Args:
        temperature: tau (default 0.07, the SD paper's value).
        normalize: L2-normalise embeddings inside the loss.

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import AnyLoss
        >>> shared = torch.tensor([[1, 1], [1, 0], [0, 1]])  # row 0 shares a label with rows 1 and 2
        >>> AnyLoss()(torch.randn(3, 16), shared).ndim
        0
    """

    display_name = "ANY (shared label)"
    reference = "Zhang & Wu, Multi-Label Supervised Contrastive Learning, AAAI 2024 (baseline strategy)"
    citation = MULSUPCON_CITATION

    default_temperature = 0.07
    # positives: S & T non-empty (ContrastiveLoss.positives), SupCon terms (ContrastiveLoss.build_terms)
