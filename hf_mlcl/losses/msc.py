"""ABALONE's balanced Multi-label Supervised Contrastive loss L_MSC with learnable label prototypes.

:class:`MSCLoss`: per-label positives (samples and the label's prototype) with overlap weights f and the
normaliser N(i, j), samples down-weighted by beta in the denominator; ``alpha`` from the authors' code.

References: "Exploring Contrastive Learning for Long-Tailed Multi-Label Text Classification" (ABALONE),
Section 3.3, eqs. (1)-(5).
Design: docs/design.md, "ABALONE's MSC loss (hf_mlcl/losses/msc.py)".
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from hf_mlcl.labels.statistics import PairLabelView

from .core import ContrastContext, ContrastiveLoss
from .jaccard import AUDIBERT_CITATION, AUDIBERT_REFERENCE
from .registry import register_loss

__all__ = ["MSCLoss"]


@register_loss("msc", "abalone")
class MSCLoss(ContrastiveLoss):
    """ABALONE L_MSC (eqs. 1-5) with L learnable, L2-normalised label prototypes.

    Args:
        num_labels: L, number of labels (one prototype per label).
        embedding_dim: D, dimension of the embeddings the prototypes live with.
        beta: denominator weight g of every sample candidate (eq. 1), 0 < beta < 1 (ValueError
            otherwise); prototypes have 1.
        alpha: weight of the sample positives' attraction, 0 <= alpha <= 1 (the authors' released
            code; module docstring): 1 (default) is the paper's equation, 0 prototype-only attraction
            (the authors' NLP configuration). It scales f in the numerator and in N(i,j).
        temperature: tau (paper: 0.1).
        normalize: L2-normalise embeddings and keys (the prototypes are always normalised).

    The prototypes are initialised as random unit vectors (so the raw parameter has norm 1 and the
    normalisation does not rescale its gradient).

    The prototypes ``self.prototypes`` are an ordinary ``nn.Parameter``: put the loss module's
    parameters in the optimizer and save its ``state_dict`` with the model.

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import MSCLoss
        >>> msc = MSCLoss(num_labels=3, embedding_dim=8)  # learnable prototypes: give them to the optimizer
        >>> msc.prototypes.shape, msc(torch.randn(4, 8), torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 1], [0, 1, 1]])).ndim
        (torch.Size([3, 8]), 0)
    """

    display_name = "MSC / ABALONE"
    reference = AUDIBERT_REFERENCE
    citation = AUDIBERT_CITATION

    default_temperature = 0.1
    supports_keys = True
    default_contrast_set = "queries+queue"  # sec. 3: H = I u Q, Q = keys of the preceding instances
    default_queue_warmup = False  # the paper uses the queue from the first step
    run_settings = ("temperature", "num_labels", "embedding_dim")

    def __init__(
        self,
        num_labels: int,
        embedding_dim: int,
        beta: float = 0.1,
        temperature: float | None = None,
        normalize: bool = True,
        alpha: float = 1.0,
    ) -> None:
        super().__init__(temperature=temperature, normalize=normalize)
        for name, value in (("num_labels", num_labels), ("embedding_dim", embedding_dim)):
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
                raise ValueError(f"msc needs a positive integer {name}, got {value!r}")
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not (0 < float(beta) < 1):
            raise ValueError(
                f"msc beta must be a float with 0 < beta < 1 (eq. 1: samples weigh less than the prototypes, "
                f"which have weight 1; paper default 0.1), got {beta!r}"
            )
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not (0 <= float(alpha) <= 1):
            raise ValueError(
                f"msc alpha must be a float with 0 <= alpha <= 1 (1: the paper's sample attraction, 0: prototypes "
                f"only, as the authors' NLP configuration), got {alpha!r}"
            )
        self.num_labels = int(num_labels)
        self.embedding_dim = int(embedding_dim)
        self.beta = float(beta)
        self.alpha = float(alpha)
        self.prototypes = nn.Parameter(F.normalize(torch.randn(num_labels, embedding_dim), dim=-1))

    def extra_repr(self) -> str:
        return (
            f"num_labels={self.num_labels}, embedding_dim={self.embedding_dim}, beta={self.beta}, alpha={self.alpha}, "
            + super().extra_repr()
        )

    def normalized_prototypes(self, dtype: torch.dtype | None = None) -> Tensor:
        """The prototypes c_j / ||c_j|| (L, D) as used in the loss."""
        p = self.prototypes if dtype is None else self.prototypes.to(dtype)
        return F.normalize(p, dim=-1)

    def compute(self, ctx: ContrastContext) -> tuple[Tensor, dict]:
        y = ctx.anchor_labels
        if y.shape[1] != self.num_labels:
            raise ValueError(
                f"msc was built for num_labels={self.num_labels} but labels have {y.shape[1]} columns; "
                "construct it with num_labels equal to the label-matrix width"
            )
        if ctx.embeddings.shape[1] != self.embedding_dim:
            raise ValueError(
                f"msc was built for embedding_dim={self.embedding_dim} but embeddings have "
                f"D={ctx.embeddings.shape[1]}; construct it with the projection dimension"
            )
        dtype = ctx.dtype
        protos = self.prototypes.to(device=ctx.device, dtype=dtype)  # normalised inside the kernel

        # ---- label-only weights (no gradient)
        with torch.no_grad():
            view = PairLabelView(y, ctx.candidate_labels)
            sizes = ctx.anchor_sizes.to(dtype)
            f = torch.where(self.positives(ctx), ctx.union.to(dtype).clamp_min(1).reciprocal(), 0.0)
            if self.alpha != 1.0:
                f = f.mul_(self.alpha)  # the authors' code: alpha f in the numerator and in N(i,j)
            # eq. (5): R_ij = 1 / N(i,j), N = 1 + samples (0 at the view's cells off the anchors' labels)
            r = view.on_pairs((1.0 + view.collect(f)).reciprocal())
            w = f * view.spread(r)  # W_il = f_il * sum_{j in S_i & T_l} 1/N(i,j)
            valid = sizes > 0
            # l(z_i) / abs(S_i), averaged over the anchors with a label (eq. 2)
            coef = torch.where(valid, sizes, math.inf).reciprocal_() / valid.sum().clamp_min(1).to(dtype)

        # ---- one fused pass: samples with d = beta, prototypes with d = 1 and weights R_ij
        loss, _ = ctx.fused(
            w,
            coef,
            log_d=math.log(self.beta),
            extra=protos,
            extra_weights=(view.rows, view.cols, r),
            normalize_extra=True,
        )
        return loss, {}
