"""Supervised multi-label classification losses: BCE, focal, asymmetric (ASL), ZLPR.

Used by the probing / fine-tuning stage and as baselines (ABALONE paper, Audibert et al., Section
4.2.2: L_BCE, L_FCL with gamma = 2, L_ASY with gamma+ = 0, gamma- = 3, m = 0.3; their comprehensive
study adds ZLPR, Su et al. 2022). All take raw logits (N, L) and multi-hot labels (dense
bool/int/float or torch-sparse) and compute in ``max(float32, logits dtype)`` with autocast off. BCE,
focal and ASL are sums of per-entry terms and by default average over all N x L entries
(``reduction="mean"``, the ABALONE paper's 1/N 1/L; ``"sum"`` is Ridnik et al.'s official reduction);
ZLPR is one term per sample and averages over the N samples.

Every loss here scores a label by its logit s with the decision boundary s = 0 (sigmoid 0.5): BCE,
focal and ASL through sigmoid(s), ZLPR by construction (its positives are pushed above 0 and its
negatives below 0). So the scores the evaluation thresholds (sigmoid of the logits,
untuned default 0.5, tuned grid 0.01..0.99) apply to all of them unchanged.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from hf_mlcl.labels.multihot import as_multihot, is_sparse

from .core import compute_dtype_for
from .registry import register_loss

__all__ = ["SupervisedLoss", "BCELoss", "FocalLoss", "AsymmetricLoss", "ZLPRLoss"]

_REDUCTIONS = ("mean", "sum", "none")


class SupervisedLoss(nn.Module):
    """Base class of supervised multi-label losses: ``forward(logits, labels) -> scalar``.

    Subclasses implement :meth:`elementwise`: the (N, L) per-entry loss, or the (N,) per-sample loss of
    a loss that is not a sum over entries (ZLPR); ``"mean"`` averages over what it returns. ``check_inputs`` (default True)
    checks the label values and the finiteness of the logits on every call (host reads), like
    contrastive losses (:class:`hf_mlcl.losses.core.ContrastiveLoss`).

    Args:
        reduction: "mean" (over all N x L entries, or the N samples of a per-sample loss), "sum", or
            "none" (the (N, L) matrix, or the (N,) vector).
    """

    is_contrastive = False
    supports_keys = False

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        self.reduction = reduction
        self.check_inputs = True

    def elementwise(self, logits: Tensor, targets: Tensor) -> Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Loss of ``logits`` (N, L) against multi-hot ``labels`` (N, L)."""
        if not isinstance(logits, Tensor) or not logits.is_floating_point():
            raise ValueError("logits must be a floating-point torch.Tensor of shape (N, L)")
        if logits.dim() != 2:
            raise ValueError(f"logits must be 2-D (N, L), got shape {tuple(logits.shape)}")
        with torch.autocast(device_type=logits.device.type, enabled=False):
            y = as_multihot(labels, "labels", device=logits.device, check_values=self.check_inputs)
            if tuple(y.shape) != tuple(logits.shape):
                raise ValueError(
                    f"shape mismatch: logits {tuple(logits.shape)} vs labels {tuple(y.shape)}; "
                    "labels must be multi-hot with one column per output logit"
                )
            if self.check_inputs and logits.numel() and not bool(torch.isfinite(logits).all()):
                raise ValueError("logits contain NaN or inf values; check the model output / learning rate")
            dtype = compute_dtype_for(logits)
            x = logits.to(dtype)
            t = (y.to_dense() if is_sparse(y) else y).to(dtype)
            loss = self.elementwise(x, t)
            if self.reduction == "mean":
                loss = loss.mean() if loss.numel() else x.sum() * 0.0
            elif self.reduction == "sum":
                loss = loss.sum()
        return loss


@register_loss("bce")
class BCELoss(SupervisedLoss):
    """Binary cross-entropy on logits (ABALONE paper, L_BCE): -[y log p + (1 - y) log(1 - p)].

    Args:
        pos_weight: optional (L,) weight of the positive term (as ``BCEWithLogitsLoss``).
        reduction: "mean" | "sum" | "none".

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import BCELoss
        >>> logits, y = torch.randn(2, 3), torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> torch.allclose(BCELoss()(logits, y), torch.nn.functional.binary_cross_entropy_with_logits(logits, y))
        True
    """

    display_name = "binary cross-entropy"
    reference = "standard multi-label BCE"
    citation = ""

    def __init__(self, pos_weight: Tensor | None = None, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        self.register_buffer("pos_weight", None if pos_weight is None else torch.as_tensor(pos_weight))

    def elementwise(self, logits: Tensor, targets: Tensor) -> Tensor:
        pw = None if self.pos_weight is None else self.pos_weight.to(logits)
        return F.binary_cross_entropy_with_logits(logits, targets, pos_weight=pw, reduction="none")


@register_loss("focal")
class FocalLoss(SupervisedLoss):
    """Focal loss (Lin et al., 2017, eq. 5; ABALONE paper L_FCL):
    -[y (1 - p)^gamma log p + (1 - y) p^gamma log(1 - p)], optionally alpha-balanced.

    Args:
        gamma: focusing parameter (default 2, the ABALONE setting).
        alpha: optional weight of positives in [0, 1] (negatives get 1 - alpha); None = unweighted.
        reduction: "mean" | "sum" | "none".

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import BCELoss, FocalLoss
        >>> logits, y = torch.randn(2, 3), torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
        >>> torch.allclose(FocalLoss(gamma=0.0)(logits, y), BCELoss()(logits, y))  # gamma 0 is BCE
        True
    """

    display_name = "focal loss"
    reference = "Lin, Goyal, Girshick, He & Dollar, Focal Loss for Dense Object Detection, ICCV 2017"
    citation = (
        "@inproceedings{lin2017focal,\n  title={Focal Loss for Dense Object Detection},\n  author={Lin, "
        "Tsung-Yi and Goyal, Priya and Girshick, Ross and He, Kaiming and Doll{\\'a}r, Piotr},\n"
        "  booktitle={ICCV},\n  year={2017}\n}"
    )

    def __init__(self, gamma: float = 2.0, alpha: float | None = None, reduction: str = "mean") -> None:
        super().__init__(reduction=reduction)
        if gamma < 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        if alpha is not None and not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha must be in [0, 1] or None, got {alpha}")
        self.gamma = float(gamma)
        self.alpha = alpha

    def elementwise(self, logits: Tensor, targets: Tensor) -> Tensor:
        p = torch.sigmoid(logits)
        log_p = F.logsigmoid(logits)
        log_q = F.logsigmoid(-logits)
        pos = targets * (1 - p).pow(self.gamma) * log_p
        neg = (1 - targets) * p.pow(self.gamma) * log_q
        if self.alpha is not None:
            pos, neg = self.alpha * pos, (1 - self.alpha) * neg
        return -(pos + neg)


@register_loss("asymmetric", "asl")
class AsymmetricLoss(SupervisedLoss):
    """Asymmetric loss (Ridnik et al., ICCV 2021, eq. 6-7; ABALONE paper L_ASY).

    L+ = (1 - p)^gamma_pos log p;  L- = p_m^gamma_neg log(1 - p_m) with the shifted probability
    p_m = max(p - clip, 0) (hard threshold) — loss = -[y L+ + (1 - y) L-].

    Args:
        gamma_pos: positive focusing (default 0).
        gamma_neg: negative focusing (default 3, the ABALONE setting; Ridnik et al. use 4).
        clip: probability margin m (default 0.3, the ABALONE setting; Ridnik et al. use 0.05).
        reduction: "mean" | "sum" | "none".

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import AsymmetricLoss
        >>> asl = AsymmetricLoss()  # ABALONE's gamma_pos=0, gamma_neg=3, clip=0.3
        >>> asl(torch.randn(2, 3), torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 1.0]])).shape
        torch.Size([])
    """

    display_name = "asymmetric loss"
    reference = "Ridnik et al., Asymmetric Loss for Multi-Label Classification, ICCV 2021"
    citation = (
        "@inproceedings{ridnik2021asymmetric,\n  title={Asymmetric Loss for Multi-Label Classification},\n"
        "  author={Ridnik, Tal and Ben-Baruch, Emanuel and Zamir, Nadav and Noy, Asaf and Friedman, Itamar "
        "and Protter, Matan and Zelnik-Manor, Lihi},\n  booktitle={ICCV},\n  year={2021}\n}"
    )

    def __init__(
        self, gamma_pos: float = 0.0, gamma_neg: float = 3.0, clip: float = 0.3, reduction: str = "mean"
    ) -> None:
        super().__init__(reduction=reduction)
        if gamma_pos < 0 or gamma_neg < 0:
            raise ValueError(f"gamma_pos and gamma_neg must be >= 0, got {gamma_pos}, {gamma_neg}")
        if not 0.0 <= clip < 1.0:
            raise ValueError(f"clip must be in [0, 1), got {clip}")
        self.gamma_pos = float(gamma_pos)
        self.gamma_neg = float(gamma_neg)
        self.clip = float(clip)

    def elementwise(self, logits: Tensor, targets: Tensor) -> Tensor:
        p = torch.sigmoid(logits)
        log_p = F.logsigmoid(logits)
        if self.clip > 0:
            p_m = (p - self.clip).clamp_min(0)
            log_q = torch.log((torch.sigmoid(-logits) + self.clip).clamp_max(1.0))  # log(1 - p_m), >= log m
        else:
            p_m = p
            log_q = F.logsigmoid(-logits)
        pos = targets * (1 - p).pow(self.gamma_pos) * log_p
        neg = (1 - targets) * p_m.pow(self.gamma_neg) * log_q
        return -(pos + neg)


@register_loss("zlpr")
class ZLPRLoss(SupervisedLoss):
    """ZLPR, the zero-bounded log-sum-exp & pairwise rank-based loss (Su et al. 2022), per sample:

        log(1 + sum_{j in neg} e^{s_j}) + log(1 + sum_{i in pos} e^{-s_i})

    i.e. the pairwise ranking loss log(1 + sum_{i in pos, j in neg} e^{s_j - s_i}) with a threshold
    logit fixed at 0 added to both sides, so that the label count needs no tuning: a label is predicted
    when its logit is above 0 (sigmoid > 0.5, the default threshold of the evaluation). A row with no
    positive (or no negative) has an empty sum there: that log term is log 1 = 0. Computed with a
    logsumexp over [0, scores] (no overflow); averaged over the N samples (``"mean"``, as the
    comprehensive study's code), ``"sum"`` or ``"none"`` ((N,) per-sample losses).

    Args:
        reduction: "mean" | "sum" | "none".

    Example::

        >>> import torch
        >>> from hf_mlcl.losses import ZLPRLoss
        >>> logits, y = torch.tensor([[2.0, -1.0, 0.5]]), torch.tensor([[1.0, 0.0, 0.0]])
        >>> manual = torch.log(1 + torch.exp(torch.tensor(-1.0)) + torch.exp(torch.tensor(0.5))) + torch.log(
        ...     1 + torch.exp(torch.tensor(-2.0)))
        >>> torch.allclose(ZLPRLoss()(logits, y), manual)
        True
    """

    display_name = "ZLPR (zero-bounded log-sum-exp & pairwise rank-based loss)"
    reference = "Su, Zhu, Murtadha, Pan, Wen & Liu, ZLPR: A Novel Loss for Multi-label Classification, arXiv:2208.02955"
    citation = (
        "@article{su2022zlpr,\n  title={ZLPR: A Novel Loss for Multi-label Classification},\n  author={Su, "
        "Jianlin and Zhu, Mingren and Murtadha, Ahmed and Pan, Shengfeng and Wen, Bo and Liu, Yunfeng},\n"
        "  journal={arXiv preprint arXiv:2208.02955},\n  year={2022}\n}"
    )

    def elementwise(self, logits: Tensor, targets: Tensor) -> Tensor:
        positive = targets > 0
        neg_scores = logits.masked_fill(positive, float("-inf"))  # s_j of the negatives
        pos_scores = logits.neg().masked_fill(~positive, float("-inf"))  # -s_i of the positives
        both = torch.stack([neg_scores, pos_scores])  # (2, N, L)
        # the threshold's 0 joins each log-sum-exp: log(1 + sum e^x) = logsumexp([0, x])
        return torch.logsumexp(F.pad(both, (1, 0), value=0.0), dim=-1).sum(dim=0)
