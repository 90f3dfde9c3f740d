"""MulSupCon (Zhang & Wu, AAAI 2024): one SupCon term per (anchor, label) pair.

:class:`MulSupConLoss`, registered as ``"mulsupcon"``, with the official code's ``normalizer="pairs"``
(default) or eq. (7)'s ``"labels"``.

References: Zhang & Wu, "Multi-Label Supervised Contrastive Learning" (AAAI 2024); eqs. (5)-(7) of the
Similarity-Dissimilarity paper.
Design: docs/design.md, "MulSupCon (hf_mlcl/losses/mulsupcon.py)".
"""

from __future__ import annotations

from torch import Tensor

from hf_mlcl.labels.relations import PairRelations, inverse_count_weights, label_sizes

from .core import ContrastContext, ContrastiveLoss, LossTerms
from .registry import register_loss

NORMALIZERS = ("pairs", "labels")

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
        normalizer: ``"pairs"`` (default, official code: (anchor, label) pairs with a positive) or
            ``"labels"`` (eq. 7: sum_i abs(y_i)); see the module docstring.

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
    default_contrast_set = "keys"  # official code: scores = q . [k_batch ; queue]
    default_queue_warmup = True  # official code: the queue joins once it has been filled

    def __init__(self, temperature: float | None = None, normalize: bool = True, normalizer: str = "pairs"):
        super().__init__(temperature=temperature, normalize=normalize)
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"mulsupcon normalizer must be one of {NORMALIZERS} ('pairs': official code, 'labels': eq. 7); "
                f"got {normalizer!r}"
            )
        self.normalizer = normalizer

    def extra_repr(self) -> str:
        return super().extra_repr() + f", normalizer={self.normalizer!r}"

    @staticmethod
    def positive_label_pairs(rel: PairRelations) -> Tensor:
        """(N,): per anchor, its (anchor, label) pairs that have a positive (a candidate of its contrast set
        carrying the label, n_l(i) >= 1): the rule of the per-label positive sets P_l(i), read by
        ``hf-mlcl inspect``; :meth:`build_terms` gets the same counts with its weights."""
        return inverse_count_weights(
            rel.anchor_labels,
            rel.candidate_labels,
            anchors_in_candidates=rel.anchors_in_candidates,
            dtype=rel.dtype,
        )[1]

    def _weights_and_pairs(self, ctx: ContrastContext) -> tuple[Tensor, Tensor]:
        share = ctx.intersections_wanted
        out = inverse_count_weights(
            ctx.anchor_labels,
            ctx.candidate_labels,
            anchors_in_candidates=ctx.anchors_in_candidates,
            dtype=ctx.dtype,
            with_intersections=share,
        )
        if share:  # the intersections came out of the same product: the context keeps them (HBL reads them)
            ctx.provide_intersections(out[2])
        return out[0], out[1]

    def _denominator(self, ctx: ContrastContext, pairs: Tensor | None) -> Tensor:
        if self.normalizer == "labels":
            return label_sizes(ctx.anchor_labels).to(ctx.dtype).sum()
        return pairs.sum()

    def label_pairs(self, ctx: ContrastContext) -> Tensor:
        """The reduction denominator: (anchor, label) pairs with a positive, or sum_i abs(y_i) (eq. 7).

        HBL's eq.-7 scaling reads it (:class:`hf_mlcl.losses.hbl.HBLLoss`)."""
        pairs = None if self.normalizer == "labels" else self._weights_and_pairs(ctx)[1]
        return self._denominator(ctx, pairs)

    def build_terms(self, ctx: ContrastContext) -> LossTerms:
        w, pairs = self._weights_and_pairs(ctx)
        w = w.to(ctx.dtype) * ctx.contrast_mask
        return LossTerms(
            weights=w,
            normalizer=(pairs > 0).to(ctx.dtype),
            reduction_denominator=self._denominator(ctx, pairs),
            zero_diagonal=True,
        )
