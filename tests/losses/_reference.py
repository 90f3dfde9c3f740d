"""The weighted contrastive loss written out with autograd: the reference the fused kernel of hf_mlcl.losses is
tested against (value and first-order gradients), and its masked log-softmax."""

from __future__ import annotations

import torch
from torch import Tensor


def masked_log_softmax(logits: Tensor, mask: Tensor, log_weights: Tensor | None = None) -> Tensor:
    """logp_ia = s_ia - log sum_{a: mask_ia} d_ia exp(s_ia) for masked entries; 0 elsewhere.

    Args:
        logits: (N, M) similarities already divided by the temperature.
        mask: (N, M) bool, True where candidate a is in the contrast set of anchor i.
        log_weights: optional log d, broadcastable to (N, M); ``-inf`` removes a candidate from the
            denominator (d = 0) without touching ``mask``.

    Rows whose contrast set is empty get logp = 0 everywhere (and zero gradient) instead of NaN.
    """
    scores = logits if log_weights is None else logits + log_weights
    masked = scores.masked_fill(~mask, float("-inf"))
    has_any = (masked > float("-inf")).any(dim=1, keepdim=True)
    masked = torch.where(has_any, masked, torch.zeros_like(masked))  # empty rows: finite dummy lse
    lse = torch.logsumexp(masked, dim=1, keepdim=True)
    return torch.where(mask & has_any, logits - lse, torch.zeros_like(logits))


def weighted_contrastive_loss(
    logits: Tensor,
    weights: Tensor,
    mask: Tensor,
    normalizer: Tensor,
    log_weights: Tensor | None = None,
    constant: Tensor | None = None,
    reduction_denominator: Tensor | float | None = None,
    anchor_valid: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reduce the weighted log-softmax to a scalar.

    loss_i = -(sum_a W_ia logp_ia + c_i) / norm_i for valid anchors, where an anchor is valid when it
    has a positive (some W_ia > 0 inside the contrast set), ``norm_i > 0`` and ``anchor_valid``.
    Returns ``(loss, per_anchor_loss, valid)``:

    * ``reduction_denominator is None``: loss = mean of loss_i over valid anchors;
    * otherwise: loss = sum_i loss_i / reduction_denominator (e.g. MulSupCon's number of
      (anchor, label) pairs, with norm_i = 1); a non-positive denominator is treated as 1.

    With no valid anchor the loss is a zero connected to the graph (gradient 0, never NaN).
    """
    logp = masked_log_softmax(logits, mask, log_weights)
    w = torch.where(mask, weights.to(logits.dtype), torch.zeros_like(logits))
    valid = (w > 0).any(dim=1) & (normalizer > 0)
    if anchor_valid is not None:
        valid = valid & anchor_valid
    num = (w * logp).sum(dim=1)
    if constant is not None:
        num = num + constant.to(logits.dtype)
    per_anchor = -num / normalizer.to(logits.dtype).clamp_min(torch.finfo(logits.dtype).tiny)
    per_anchor = torch.where(valid, per_anchor, torch.zeros_like(per_anchor))
    total = per_anchor.sum()
    if reduction_denominator is None:
        denom = valid.sum().clamp_min(1).to(logits.dtype)
    else:
        denom = torch.as_tensor(reduction_denominator, dtype=logits.dtype, device=logits.device)
        denom = torch.where(denom > 0, denom, torch.ones_like(denom))  # 0 only when nothing is valid
    return total / denom, per_anchor, valid
