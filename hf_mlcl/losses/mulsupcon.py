"""MulSupCon (Zhang & Wu, AAAI 2024): one SupCon term per (anchor, label) pair.

Paper: Zhang & Wu, "Multi-Label Supervised Contrastive Learning" (AAAI 2024); restated as eq. (5)-(7)
of the Similarity-Dissimilarity paper. Registered as ``"mulsupcon"``.

For each anchor i and each label l in S_i the positive set is P_l(i) = {p in contrast(i): l in T_p}
with n_l(i) = abs(P_l(i)); the (i, l) term is -1/n_l(i) sum_{p in P_l(i)} log p_ip with the ordinary
softmax denominator over the whole contrast set. The loss is the total over (anchor, label) pairs with
n_l(i) >= 1 divided by the number of such pairs (LOSSES.md).

Vectorised without an (N, M, L) tensor: sum_l sum_{p in P_l(i)} log p_ip / n_l(i) = sum_p W_ip log p_ip
with W_ip = sum_{l in S_i & T_p} 1/n_l(i) = ((Y_i * 1/n(i)) @ Y_c^T)_ip, n(i) = Y_i * (colsum(Y_c) - Y_i)
(self excluded); see :func:`hf_mlcl.losses.relations.inverse_count_weights`. Sparse labels stay sparse.

* weight W_ip as above; per-anchor normaliser 1; reduction: sum over anchors / number of pairs.
"""

from __future__ import annotations

from .core import ContrastContext, ContrastiveLoss, LossTerms
from .registry import register_loss
from .relations import inverse_count_weights

MULSUPCON_CITATION = (
    "@inproceedings{zhang2024mulsupcon,\n  title={Multi-Label Supervised Contrastive Learning},\n"
    "  author={Zhang, Pingyue and Wu, Mengyue},\n  booktitle={Proceedings of the AAAI Conference on "
    "Artificial Intelligence},\n  volume={38},\n  number={15},\n  pages={16786--16793},\n  year={2024}\n}"
)


@register_loss("mulsupcon")
class MulSupConLoss(ContrastiveLoss):
    """MulSupCon: per-label positive sets, each averaged, pairs averaged over the batch.

    Args:
        temperature: tau (default 0.1, the paper's value).
        normalize: L2-normalise embeddings inside the loss.

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import MulSupConLoss
        >>> y = torch.tensor([[1, 0, 1], [1, 0, 0], [0, 0, 1]])  # row 0 has one positive set per label
        >>> bool(MulSupConLoss()(torch.randn(3, 8), y) > 0)
        True
    """

    display_name = "MulSupCon"
    reference = "Zhang & Wu, Multi-Label Supervised Contrastive Learning, AAAI 2024"
    citation = MULSUPCON_CITATION

    default_temperature = 0.1

    def build_terms(self, ctx: ContrastContext) -> LossTerms:
        w, pairs = inverse_count_weights(
            ctx.anchor_labels, ctx.candidate_labels, anchors_in_candidates=True, dtype=ctx.dtype
        )
        w = w.to(ctx.dtype) * ctx.contrast_mask
        return LossTerms(
            weights=w,
            normalizer=(pairs > 0).to(ctx.dtype),
            reduction_denominator=pairs.sum(),
        )
