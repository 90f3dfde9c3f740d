"""One fused autograd step for the weighted contrastive log-softmax: the engine's fast kernel.

:func:`fused_contrastive_loss` computes ``sum_i coef_i [Wsum_i LSE_i - sum_a W_ia s_ia] + const`` (optional
L2 normalisation, keys and extra candidates such as ABALONE's prototypes) with a closed-form backward.

Design: docs/design.md, "Fused kernel (hf_mlcl/losses/fused.py)".
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from hf_mlcl.labels.multihot import cast

__all__ = ["fused_contrastive_loss"]

_NORM_EPS = 1e-12  # F.normalize's default
# exp(-x) stays a normal number for x below these (float32 / float64 / others: no shortcut)
_SAFE_EXP = {torch.float32: 80.0, torch.float64: 700.0}


def _normalize(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``F.normalize(x, dim=-1)`` and what its backward needs: (z, 1 / max(norm, eps), norm > eps)."""
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    active = norm > _NORM_EPS
    inv = norm.clamp_min_(_NORM_EPS).reciprocal_()
    return x * inv, inv, active


def _normalize_backward(grad: Tensor, z: Tensor, inv: Tensor, active: Tensor) -> Tensor:
    """Gradient through ``x / max(norm, eps)``: (g - z (z . g)) / norm where norm > eps, else g / eps."""
    proj = torch.linalg.vecdot(z, grad, dim=1).unsqueeze(1).mul_(active)
    return grad.addcmul_(z, proj, value=-1.0).mul_(inv)


class _FusedContrastive(torch.autograd.Function):
    @staticmethod
    def forward(  # type: ignore[override]
        ctx,
        anchors: Tensor,
        keys: Tensor | None,
        extra: Tensor | None,
        weights: Tensor,
        wsum: Tensor,
        extra_rows: Tensor | None,
        extra_cols: Tensor | None,
        extra_vals: Tensor | None,
        coef: Tensor,
        const: Tensor | None,
        inv_tau: float,
        log_d: float | None,
        normalize: bool,
        extra_unit: bool,
        self_in_candidates: bool,
        keep_scores: bool,
        normalize_extra: bool,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n = anchors.shape[0]
        a_inv = a_act = k_inv = k_act = e_inv = e_act = None
        if normalize:
            anchors, a_inv, a_act = _normalize(anchors)
            if keys is not None:
                keys, k_inv, k_act = _normalize(keys)
        if normalize_extra and extra is not None:
            extra, e_inv, e_act = _normalize(extra)
            extra_unit = True
        # every candidate block in one matrix: [anchors (self_in_candidates); keys; extra], so that the
        # similarities, the shift and the exponentials are one product and one pass each
        blocks = [b for b in ((anchors if self_in_candidates else None), keys, extra) if b is not None]
        cands = blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=0)
        m = weights.shape[1]  # sample candidates; columns m.. are the extra candidates
        dtype = anchors.dtype
        # Scores are shifted by a per-row constant C_i before exp (the usual max-subtraction); the
        # shift cancels exactly in Wsum_i (log sum exp(s - C) + C) - sum_a W_ia s_ia, so the bracket
        # is computed from the shifted scores alone. With unit-norm embeddings (and prototypes)
        # s <= 1/tau, so C = 1/tau needs no max pass as long as exp(-2/tau) cannot underflow.
        floor = 2.0 * inv_tau - min(0.0, log_d or 0.0)  # lowest shifted exponent
        bound = normalize and (extra is None or extra_unit) and floor < _SAFE_EXP.get(dtype, 0.0)
        shift = anchors.new_full((), -inv_tau) if bound else anchors.new_zeros(())
        s = torch.addmm(shift, anchors, cands.T, alpha=inv_tau)  # (N, M + P) = s - C
        s_samples = s[:, :m] if extra is not None else s
        num = torch.linalg.vecdot(weights, s_samples)  # W is 0 on the diagonal, where s is still finite
        if extra is not None and extra_vals is not None and extra_vals.numel():
            num = num.index_add(0, extra_rows, s[extra_rows, extra_cols + m] * extra_vals)
        if self_in_candidates:
            s.diagonal().fill_(-math.inf)  # the anchor's own column leaves the contrast set
        if log_d is not None:
            s_samples.add_(log_d)  # the samples' denominator weight d; the extra candidates keep 1
        if not bound and s.shape[1]:  # no candidate at all (keys-only with no key): nothing to shift
            rmax = s.amax(dim=1, keepdim=True).clamp_min_(torch.finfo(dtype).min)  # empty set: -inf
            s.sub_(rmax)
            num = num - wsum * rmax.squeeze(1)
        # the sample scores s - C (a per-row shift of the similarities: same order within a row), kept
        # on request for callers that select candidates by similarity (HBL's hardest pairs)
        scores = s_samples.clone() if keep_scores else s.new_empty(0)
        e = s.exp_()  # exp(s - C), 0 on the diagonal; s is not needed any more
        total = e.sum(dim=1)
        if e.shape[1] <= 1:  # a lone anchor without keys, or no candidate: empty contrast set, no weight
            total = total.clamp_min(torch.finfo(dtype).tiny)
        bracket = torch.addcmul(-num, wsum, total.log())  # (N,) [Wsum LSE - sum W s], C cancelled
        loss = torch.dot(coef, bracket)
        if const is not None:
            loss = loss + const
        ctx.save_for_backward(
            anchors,
            keys,
            extra,
            weights,
            extra_rows,
            extra_cols,
            extra_vals,
            coef,
            wsum,
            e,
            total,
            a_inv,
            a_act,
            k_inv,
            k_act,
            e_inv,
            e_act,
        )
        ctx.inv_tau = inv_tau
        ctx.n = n if self_in_candidates else 0
        ctx.mark_non_differentiable(bracket, scores)
        return loss, bracket, scores

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: Tensor, _grad_bracket: Tensor | None, _grad_scores: Tensor | None):  # type: ignore[override]
        return _closed_form_backward(ctx, grad_loss)


def _closed_form_backward(ctx, grad_loss):
    """Gradients of :class:`_FusedContrastive` (see the module docstring) from its saved tensors."""
    anchors, keys, extra, weights, e_rows, e_cols, e_vals, coef, wsum, e, total, *norms = ctx.saved_tensors
    a_inv, a_act, k_inv, k_act, e_inv, e_act = norms
    n = ctx.n
    m = weights.shape[1]
    b = coef * (grad_loss * ctx.inv_tau)  # d loss / d bracket_i, times 1/tau (for d s / d z)
    g = e * (b * wsum / total)[:, None]  # Wsum_i P_ia (P = 0 on the diagonal)
    g_samples = g[:, :m] if extra is not None else g
    g_samples.addcmul_(weights, b[:, None], value=-1.0)  # - W_ia (0 on the diagonal, like P)
    if extra is not None and e_vals is not None and e_vals.numel():
        g.index_put_((e_rows, e_cols + m), -(b[e_rows] * e_vals), accumulate=True)
    need_a, need_k, need_e = ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.needs_input_grad[2]
    grad_a = grad_k = grad_e = None
    # s_ia = z_i . c_a: the anchors get g @ C as queries and, being the first n candidates,
    # g[:, :n]^T @ Z as candidates: one product with (g[:, :n] + g[:, :n]^T)
    g_k = g[:, n:m] if keys is not None else None
    g_e = g[:, m:] if extra is not None else None
    if need_a:
        if n:
            ga = g[:, :n]
            grad_a = (ga + ga.T) @ anchors
            if g_k is not None:
                grad_a.addmm_(g_k, keys)
        else:
            grad_a = g_k @ keys
        if g_e is not None:
            grad_a.addmm_(g_e, extra)
    if need_k and g_k is not None:
        grad_k = g_k.T @ anchors
    if need_e and g_e is not None:
        grad_e = g_e.T @ anchors
    if a_inv is not None:
        if grad_a is not None:
            grad_a = _normalize_backward(grad_a, anchors, a_inv, a_act)
        if grad_k is not None:
            grad_k = _normalize_backward(grad_k, keys, k_inv, k_act)
    if e_inv is not None and grad_e is not None:
        grad_e = _normalize_backward(grad_e, extra, e_inv, e_act)
    # one gradient per input of _FusedContrastive.forward: the three embedding blocks, then 14 non-tensors
    return (grad_a, grad_k, grad_e) + (None,) * 14


def fused_contrastive_loss(
    anchors: Tensor,
    keys: Tensor | None,
    weights: Tensor,
    coef: Tensor,
    temperature: float,
    const: Tensor | None = None,
    log_d: float | None = None,
    extra: Tensor | None = None,
    extra_weights: tuple[Tensor, Tensor, Tensor] | None = None,
    normalize: bool = False,
    weight_sums: Tensor | None = None,
    extra_unit: bool = False,
    self_in_candidates: bool = True,
    keep_scores: bool = False,
    normalize_extra: bool = False,
) -> tuple[Tensor, Tensor] | tuple[Tensor, Tensor, Tensor]:
    """``sum_i coef_i [Wsum_i LSE_i - sum_a W_ia s_ia] + const`` with a closed-form backward.

    Args:
        anchors: (N, D) anchor embeddings; they are also the first N candidates, each excluded from
            its own contrast set.
        keys: optional (K, D) key embeddings, candidates N..N+K-1, never excluded.
        weights: (N, N+K) positive weights W >= 0, no gradient, 0 on the diagonal (i, i).
        coef: (N,) per-anchor coefficient (validity / normaliser / reduction), no gradient.
        temperature: tau > 0.
        const: optional 0-d constant added to the loss (label-only terms), no gradient.
        log_d: optional log of the denominator weight of every sample candidate (ABALONE: log beta).
        extra: optional (P, D) extra candidates in every anchor's contrast set with d = 1, used as
            given (ABALONE's prototypes, normalised by the caller); they receive gradients.
        extra_weights: optional ``(rows, cols, values)`` sparse positive weights on ``extra``.
        normalize: L2-normalise anchors and keys first (as ``F.normalize``).
        weight_sums: optional precomputed ``weights.sum(dim=1)``.
        extra_unit: the rows of ``extra`` have unit norm (lets the kernel skip the row-max pass).
        self_in_candidates: False for the keys-only contrast set: the candidates are the keys alone
            (needs keys; ``weights`` is then (N, K) and nothing is excluded).
        normalize_extra: L2-normalise the rows of ``extra`` here (as ``F.normalize``, with the
            closed-form backward) instead of taking them as given.
        keep_scores: also return the detached (N, M) sample scores ``s_ia + log_d - C_i`` (the
            similarities over tau, shifted by a per-row constant, -inf at the anchor's own column):
            within a row they order the candidates exactly as the similarities do.
    Returns ``(loss, bracket)``: the scalar loss and the detached (N,) per-anchor bracket
    ``Wsum_i LSE_i - sum_a W_ia s_ia`` (for logging per-part components); with ``keep_scores``,
    ``(loss, bracket, scores)``.
    """
    rows = cols = vals = None
    dtype = anchors.dtype
    if extra_weights is not None:
        rows, cols, vals = extra_weights
        vals = cast(vals, dtype)
    weights = cast(weights, dtype)
    wsum = weights.sum(dim=1) if weight_sums is None else cast(weight_sums, dtype)
    if vals is not None and vals.numel():
        wsum = wsum.index_add(0, rows, vals)
    if keys is not None:
        keys = cast(keys, dtype)
    loss, bracket, scores = _FusedContrastive.apply(
        anchors,
        keys,
        extra,
        weights,
        wsum,
        rows,
        cols,
        vals,
        cast(coef, dtype),
        const,
        1.0 / temperature,
        log_d,
        bool(normalize),
        bool(extra_unit),
        bool(self_in_candidates),
        bool(keep_scores),
        bool(normalize_extra),
    )
    return (loss, bracket, scores) if keep_scores else (loss, bracket)
