"""The shared engine of every contrastive loss: a masked, weighted, numerically stable log-softmax.

:class:`ContrastiveLoss` is the base class (``forward``, ``components``, ``positives``); a loss builds its
:class:`LossTerms` from the label relations of a :class:`ContrastContext`, and :func:`terms_loss` (the fused
kernel) computes the loss.

Design: docs/design.md, "Loss engine (hf_mlcl/losses/core.py)".
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from functools import cached_property

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from hf_mlcl.labels.multihot import as_multihot, cast
from hf_mlcl.labels.relations import PairRelations

from .fused import fused_contrastive_loss

__all__ = [
    "ContrastContext",
    "LossTerms",
    "ContrastiveLoss",
    "compute_dtype_for",
]


def compute_dtype_for(*tensors: Tensor | None) -> torch.dtype:
    """``max(float32, dtypes of the inputs)``: fp16/bf16 -> float32, float64 stays float64."""
    dtype = torch.float32
    for t in tensors:
        if t is not None and t.is_floating_point():
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@dataclass
class LossTerms:
    """What a loss module hands to the engine (all (N, M) unless stated; M = candidates).

    Attributes:
        weights: positive weights W (>= 0; entries outside the contrast set are ignored).
        normalizer: (N,) per-anchor divisor (anchors with normalizer <= 0 are skipped).
        constant: optional (N,) additive term c_i inside the bracket (e.g. sum_p log W for SD with
            ``weight_in_log=True``); must not depend on the embeddings.
        reduction_denominator: None -> mean over valid anchors; else a global divisor of the sum.
        anchor_valid: optional (N,) bool mask of anchors allowed to contribute.
        components: extra named parts reported by :meth:`ContrastiveLoss.components` (0-d tensors, or floats).
        weight_sums: optional (N,) ``weights.sum(dim=1)`` when the loss computed it anyway (e.g. as its
            normaliser), so the engine does not sum again.
        zero_diagonal: the loss guarantees W = 0 at each anchor's own column (it built W through
            ``contrast_mask`` or ``shares_label``), so the engine skips its check for it.
    """

    weights: Tensor
    normalizer: Tensor
    constant: Tensor | None = None
    reduction_denominator: Tensor | float | None = None
    anchor_valid: Tensor | None = None
    components: dict = field(default_factory=dict)
    weight_sums: Tensor | None = None
    zero_diagonal: bool = False


class ContrastContext(PairRelations):
    """Validated inputs of one forward call plus lazily computed label relations.

    The label relations of the pairs (``inter``, ``anchor_sizes``, ``candidate_sizes``, ``union``,
    ``equal``, ``jaccard``, ``shares_label``, ``contrast_mask``, ``self_mask``: exact integer counts in
    ``dtype``, so float64 stays exact) come from :class:`~hf_mlcl.labels.relations.PairRelations`; the
    embeddings' side is added here.

    Attributes:
        embeddings / key_embeddings: the inputs in ``dtype`` as given (not normalised).
        anchors: (N, D) anchor embeddings in ``dtype`` (L2-normalised when the loss normalises).
        keys: (K, D) key embeddings, likewise, or None.
        candidates: (M, D) = [anchors; keys], M = N + K, or the keys alone (M = K) when
            ``anchors_in_candidates`` is False; ``raw_candidates`` the same rows before normalisation.
        anchors_in_candidates: whether the anchors are (self-excluded) candidates of each other.
        anchor_labels / candidate_labels: validated multi-hot matrices (float32 dense or sparse COO).
        num_anchors, num_keys, temperature, dtype, normalize.
        logits: (N, M) = anchors @ candidates^T / temperature.

    Everything is computed on first use. The embeddings' finiteness check (a full pass) runs when
    ``anchors`` / ``keys`` are first read — before any general-path computation — or, for the fused
    kernel (:meth:`fused`), on the scalar result: non-finite inputs always give a non-finite loss
    there, and :meth:`ContrastiveLoss.components` then runs the full check, which raises.
    """

    def __init__(
        self,
        anchors: Tensor,
        anchor_labels: Tensor,
        keys: Tensor | None,
        key_labels: Tensor | None,
        temperature: float,
        anchors_in_candidates: bool = True,
        normalize: bool = False,
        checked: bool = True,
    ) -> None:
        super().__init__(anchor_labels, key_labels, anchors_in_candidates, dtype=anchors.dtype)
        self.embeddings = anchors
        self.key_embeddings = keys
        self.normalize = bool(normalize)
        self.checked = bool(checked)
        self.fused_used = False
        # keep_scores: the fused kernel also keeps its (N, M) sample scores in ``scores`` (a per-row
        # shift of logits, for callers that select candidates by similarity, e.g. HBL)
        self.keep_scores = False
        self.scores: Tensor | None = None
        self.temperature = temperature

    def check_finite(self) -> None:
        """The full NaN / inf check of the embeddings (ValueError naming the tensor), once."""
        if not self.checked:
            _check_finite(self.embeddings, "embeddings")
            if self.key_embeddings is not None:
                _check_finite(self.key_embeddings, "key_embeddings")
            self.checked = True

    @cached_property
    def anchors(self) -> Tensor:
        self.check_finite()
        return F.normalize(self.embeddings, dim=-1) if self.normalize else self.embeddings

    @cached_property
    def keys(self) -> Tensor | None:
        self.check_finite()
        k = self.key_embeddings
        return F.normalize(k, dim=-1) if (self.normalize and k is not None) else k

    @property
    def device(self) -> torch.device:
        return self.embeddings.device

    def fused(self, weights: Tensor, coef: Tensor, **kwargs) -> tuple[Tensor, Tensor]:
        """:func:`~hf_mlcl.losses.fused.fused_contrastive_loss` on this context's embeddings
        (normalised inside the kernel); ``kwargs`` as there. Marks the result as fused (the
        finiteness check moves to the scalar, see the class docstring)."""
        self.fused_used = True
        out = fused_contrastive_loss(
            self.embeddings,
            self.key_embeddings,
            weights,
            coef,
            self.temperature,
            normalize=self.normalize,
            self_in_candidates=self.anchors_in_candidates,
            keep_scores=self.keep_scores,
            **kwargs,
        )
        if self.keep_scores:
            self.scores = out[2]
        return out[0], out[1]

    def _as_candidates(self, anchors: Tensor, keys: Tensor | None) -> Tensor:
        """The contrast set's rule: [anchors; keys], the anchors alone without keys, the keys alone
        when the anchors are not candidates."""
        if not self.anchors_in_candidates:
            return keys
        return anchors if keys is None else torch.cat([anchors, keys], dim=0)

    @cached_property
    def candidates(self) -> Tensor:
        """(M, D) = [anchors; keys] (the anchors themselves when there are no keys, the keys alone
        when the anchors are not candidates)."""
        return self._as_candidates(self.anchors, self.keys)

    @cached_property
    def raw_candidates(self) -> Tensor:
        """(M, D): :attr:`candidates` before normalisation (from ``embeddings`` / ``key_embeddings``),
        for terms that normalise only the few candidates they pick."""
        return self._as_candidates(self.embeddings, self.key_embeddings)

    @cached_property
    def logits(self) -> Tensor:
        return self.anchors @ self.candidates.T / self.temperature

    def similarity_order(self) -> Tensor | None:
        """(N, M) scores that order each anchor's candidates by cosine similarity, from what this call has
        already computed (no extra product): the fused kernel's kept scores (``keep_scores``; a per-row
        shift of the logits) or the logits; None when neither exists or the embeddings are not
        normalised (then they do not order by cosine). For terms that only *select* candidates (HBL)."""
        if not self.normalize:
            return None
        if self.scores is not None:
            return self.scores
        if "logits" in self.__dict__:  # computed already, for a loss that reads the logits
            return self.logits.detach() * self.temperature
        return None

    def zero(self) -> Tensor:
        """A scalar zero connected to the graph of the embeddings."""
        k = self.key_embeddings
        return self.embeddings.sum() * 0.0 + (0.0 if k is None else k.sum() * 0.0)


def terms_loss(ctx: ContrastContext, terms: LossTerms) -> Tensor:
    """The scalar loss of ``terms`` on the standard contrast set of ``ctx``, with the fused kernel.

    loss_i = -(sum_a W_ia logp_ia + c_i) / norm_i for the valid anchors (a positive inside the contrast set,
    norm_i > 0, ``anchor_valid``), reduced by their mean or by ``reduction_denominator``; with no valid anchor a
    zero connected to the graph. The per-anchor factors fold into one coefficient
    ``coef_i = valid_i / (norm_i * denominator)``, so that
    loss = sum_i coef_i [Wsum_i LSE_i - sum_a W_ia s_ia] - sum_i coef_i c_i
    (:func:`hf_mlcl.losses.fused.fused_contrastive_loss`).
    """
    dtype = ctx.dtype
    w = cast(terms.weights, dtype)
    wsum = None if terms.weight_sums is None else cast(terms.weight_sums, dtype)
    if ctx.anchors_in_candidates and not terms.zero_diagonal:
        w = w.clone()  # the anchor's own column is outside its contrast set
        w.diagonal().zero_()
        wsum = None
    if wsum is None:
        wsum = w.sum(dim=1)
    norm = cast(terms.normalizer, dtype)
    valid = torch.minimum(wsum, norm) > 0  # has a positive (W >= 0) and a positive normaliser
    if terms.anchor_valid is not None:
        valid = valid & terms.anchor_valid
    if terms.reduction_denominator is None:
        scale = mean_scale(valid, dtype)
    else:
        denom = torch.as_tensor(terms.reduction_denominator, dtype=dtype, device=ctx.device)
        scale = torch.where(denom > 0, denom, torch.ones_like(denom)).reciprocal()
    # coef_i = valid_i / (norm_i * denominator): 1 / inf = 0 for the anchors that do not count
    coef = torch.where(valid, norm, math.inf).reciprocal_().mul_(scale)
    const = None if terms.constant is None else -torch.dot(coef, cast(terms.constant, dtype))
    return ctx.fused(w, coef, const=const, weight_sums=wsum)[0]


def mean_scale(valid: Tensor, dtype: torch.dtype) -> Tensor:
    """1 / max(number of True in ``valid``, 1) as a 0-d ``dtype`` tensor, on the device (no host read).

    Computed in float64 and rounded once to ``dtype``: the value of the Python float
    ``1.0 / max(int(valid.sum()), 1)`` that a product with a ``dtype`` tensor would use.
    """
    return valid.sum().clamp_min(1).to(torch.float64).reciprocal().to(dtype)


def _check_finite(x: Tensor, name: str) -> None:
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise ValueError(
            f"{name} contain NaN or inf values; check the encoder output (learning rate, fp16 overflow)"
        )


def _check_embeddings(x: Tensor, name: str, finite: bool = True) -> None:
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor of shape (N, D), got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(
            f"{name} must be 2-D (N, D), got shape {tuple(x.shape)}; flatten extra view dims first"
        )
    if not x.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if finite:
        _check_finite(x, name)


class ContrastiveLoss(nn.Module):
    """Base class of all multi-label contrastive losses (see module docstring for the engine).

    Subclasses implement :meth:`build_terms` (and optionally override :meth:`compute` for losses that
    combine several engine calls). The contract with callers (trainers, integrations):

    * ``forward(embeddings, labels, key_embeddings=None, key_labels=None)`` returns the scalar loss;
    * :meth:`components` (same arguments) returns the loss and its named parts in one dict, as
      sentence-transformers losses do: ``"loss"`` (the scalar, with its graph) and the parts as detached
      0-d tensors on the loss's device. Nothing is read on the host and nothing is kept on the module:
      a caller that logs the parts converts them to floats when it logs.

    Args:
        temperature: tau > 0 (default: the paper's value, ``default_temperature``).
        normalize: L2-normalise embeddings (and keys) inside the loss.

    Attribute ``check_inputs`` (default True): check that the labels are 0/1 and the embeddings finite
    (ValueError naming the problem) on every call. Both checks read values on the host, a
    synchronisation on an accelerator; with False (:func:`hf_mlcl.losses.input_checks.set_input_checks`)
    labels are taken as valid, non-finite embeddings give a non-finite loss, and a call on dense labels
    reads nothing on the host. Sparse (COO) labels, and msc / ws_mulsupcon's pair view of dense labels
    above 2**25 anchor x candidate x label cells, still read sizes on the host (their nonzero entries).
    """

    is_contrastive = True
    supports_keys = True
    supports_keys_only = True  # forward(..., anchors_in_candidates=False): the keys alone as candidates
    default_temperature = 0.07
    # MoCo mode (queue_size > 0): the paper's contrast set and whether the queue waits until it has
    # been filled once (hf_mlcl.training.memory). Losses without a MoCo setting of their own (all,
    # any, sd, jaccard) follow the SupCon / MulSupCon code they are compared with: keys, warm-up.
    default_contrast_set = "keys"
    default_queue_warmup = True
    # the keywords a run fills in from its settings (hf_mlcl.losses.registry.LossSettings)
    run_settings: tuple[str, ...] = ("temperature",)

    def __init__(self, temperature: float | None = None, normalize: bool = True) -> None:
        super().__init__()
        if temperature is None:
            temperature = self.default_temperature
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):  # numpy scalars too
            raise ValueError(f"temperature must be a positive float, got {temperature!r}")
        temperature = float(temperature)
        if not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(
                f"temperature must be > 0 and finite, got {temperature}; typical values are 0.05-0.2"
            )
        self.temperature = temperature
        self.normalize = bool(normalize)
        self.check_inputs = True

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, normalize={self.normalize}"

    #: How :class:`hf_mlcl.data.sampler.PositiveEnsuredSampler` groups rows so that each anchor of a batch has a
    #: positive under :meth:`positives`: ``"shared_label"`` (S & T non-empty) or ``"same_label_set"`` (T == S);
    #: None on a loss whose positives no such grouping ensures (a thresholded or non-set label similarity).
    sampler_rule = "shared_label"

    @staticmethod
    def positives(rel: PairRelations) -> Tensor:
        """(N, M) bool: the candidates of each anchor's contrast set that this loss pulls it towards.

        The one definition of the loss's positive rule: its :meth:`build_terms` and ``hf-mlcl inspect``
        (:mod:`hf_mlcl.analysis.pair_statistics`) both read it. Default: S & T non-empty (the ANY rule,
        Huang et al. eq. 2), the rule of any, sd, jaccard, msc's samples, ws-MulSupCon's labelled anchors
        and hbl; ``all`` has its own.
        """
        return rel.shares_label

    # ---------------------------------------------------------------- input handling
    def prepare(
        self,
        embeddings: Tensor,
        labels: Tensor,
        key_embeddings: Tensor | None = None,
        key_labels: Tensor | None = None,
        anchors_in_candidates: bool = True,
    ) -> ContrastContext:
        """Validate inputs (ValueError naming the problem), upcast, build the context.

        ``anchors_in_candidates=False`` makes the keys the only candidates (needs keys).
        Normalisation and the NaN / inf check of the embeddings are deferred to the context (see
        :class:`ContrastContext`); every check raises before the loss is returned. The checks of
        values (labels 0/1, finite embeddings) run only with ``check_inputs``.
        """
        _check_embeddings(embeddings, "embeddings", finite=False)
        if not anchors_in_candidates and key_embeddings is None:
            raise ValueError(
                "anchors_in_candidates=False (the 'keys' contrast set) needs key_embeddings / key_labels: "
                "the candidates are then the keys only"
            )
        if (key_embeddings is None) != (key_labels is None):
            raise ValueError("key_embeddings and key_labels must be given together (or both left None)")
        if key_embeddings is not None and not self.supports_keys:
            raise ValueError(
                f"{type(self).__name__} does not support key_embeddings / key_labels (no keys mode)"
            )
        check = self.check_inputs
        y = as_multihot(labels, "labels", device=embeddings.device, allow_sparse=True, check_values=check)
        if y.shape[0] != embeddings.shape[0]:
            raise ValueError(
                f"row-count mismatch: embeddings has {embeddings.shape[0]} rows but labels has {y.shape[0]}; "
                "pass one multi-hot label row per embedding row (repeat labels for extra views)"
            )
        yk = None
        if key_embeddings is not None:
            _check_embeddings(key_embeddings, "key_embeddings", finite=False)
            if key_embeddings.shape[1] != embeddings.shape[1]:
                raise ValueError(
                    f"embedding dim differs: embeddings have D={embeddings.shape[1]} but key_embeddings "
                    f"D={key_embeddings.shape[1]}"
                )
            yk = as_multihot(
                key_labels, "key_labels", device=embeddings.device, allow_sparse=True, check_values=check
            )
            if yk.shape[0] != key_embeddings.shape[0]:
                raise ValueError(
                    f"row-count mismatch: key_embeddings has {key_embeddings.shape[0]} rows but key_labels "
                    f"has {yk.shape[0]}"
                )
            if yk.shape[1] != y.shape[1]:
                raise ValueError(
                    f"label width differs: labels have {y.shape[1]} columns but key_labels have {yk.shape[1]}; "
                    "anchors and keys must share one label space"
                )
        dtype = compute_dtype_for(embeddings, key_embeddings)
        z = cast(embeddings, dtype)
        k = None
        if key_embeddings is not None:
            k = cast(key_embeddings, dtype)
            if k.device != z.device:
                k = k.to(z.device)
        # normalisation and the NaN / inf check happen on first use (ContrastContext)
        return ContrastContext(
            z,
            y,
            k,
            yk,
            self.temperature,
            anchors_in_candidates=anchors_in_candidates,
            normalize=self.normalize,
            checked=not check,
        )

    # ---------------------------------------------------------------- computation
    def build_terms(self, ctx: ContrastContext) -> LossTerms:
        """W, d and the normaliser of this loss. Default: SupCon over the loss's :meth:`positives` (Khosla et al.
        2020, eq. 2; the SD-loss paper's eq. 3): weight 1 on every positive, normalised by their number, the
        mean over anchors with a positive (``all``, ``any``); the other losses build their own."""
        w = self.positives(ctx).to(ctx.dtype)  # 0 at the anchor's own column (outside the contrast set)
        wsum = w.sum(dim=1)
        return LossTerms(weights=w, normalizer=wsum, weight_sums=wsum, zero_diagonal=True)

    def compute(self, ctx: ContrastContext) -> tuple[Tensor, dict]:
        """Loss and extra components from a prepared context: the loss's terms through the fused kernel
        (:func:`terms_loss`)."""
        terms = self.build_terms(ctx)
        return terms_loss(ctx, terms), dict(terms.components)

    def forward(
        self,
        embeddings: Tensor,
        labels: Tensor,
        key_embeddings: Tensor | None = None,
        key_labels: Tensor | None = None,
        anchors_in_candidates: bool = True,
    ) -> Tensor:
        """Scalar loss for anchors ``embeddings`` (N, D) with multi-hot ``labels`` (N, L).

        Optional ``key_embeddings`` (K, D) / ``key_labels`` (K, L) (MoCo queue or momentum keys) are
        extra candidates that are never excluded from the contrast set. ``anchors_in_candidates=False``
        drops the anchor-anchor pairs: the keys are then the whole contrast set (MulSupCon's
        ``scores = q . [k_batch ; queue]``). The loss's parts: :meth:`components`.
        """
        return self.components(embeddings, labels, key_embeddings, key_labels, anchors_in_candidates)["loss"]

    def components(
        self,
        embeddings: Tensor,
        labels: Tensor,
        key_embeddings: Tensor | None = None,
        key_labels: Tensor | None = None,
        anchors_in_candidates: bool = True,
    ) -> dict[str, Tensor]:
        """``{"loss": scalar loss (with its graph), part: detached 0-d tensor, ...}`` for the arguments of
        :meth:`forward` (e.g. hbl's ``"base"``, ``"hbl"``, ``"gate_open"``; ws_mulsupcon's strata)."""
        device_type = embeddings.device.type if isinstance(embeddings, Tensor) else "cpu"
        with torch.autocast(device_type=device_type, enabled=False):
            ctx = self.context_owner.prepare(
                embeddings, labels, key_embeddings, key_labels, anchors_in_candidates
            )
            return self.components_on(ctx)

    @property
    def context_owner(self) -> ContrastiveLoss:
        """The loss whose :meth:`prepare` builds the context of a call: this one (a wrapper, hbl, lets its base
        build it, so that both terms read one context)."""
        return self

    def components_on(self, ctx: ContrastContext) -> dict[str, Tensor]:
        """:meth:`components` on a prepared context: shared by :meth:`components` and by wrappers (hbl) that
        reuse the base loss's context. With ``check_inputs`` a non-finite fused result runs the full
        finiteness check, which raises."""
        if ctx.num_anchors == 0:
            loss, parts = ctx.zero(), {}
        else:
            loss, parts = self.compute(ctx)
        if not ctx.checked and not (ctx.fused_used and bool(torch.isfinite(loss.detach()))):
            ctx.check_finite()  # raises the named error when the inputs were not finite
        return loss_components(loss, parts)


def loss_components(loss: Tensor, parts: dict) -> dict[str, Tensor]:
    """``{"loss": loss, **parts}``: the loss as it is (with its graph), the parts as detached 0-d tensors on
    the loss's device (no host read). A part given as a Python number becomes a tensor of the loss's dtype
    (a fill on the device)."""
    comps = {"loss": loss}
    for name, value in parts.items():
        if isinstance(value, Tensor):
            comps[name] = value.detach()
        else:
            comps[name] = torch.full((), float(value), dtype=loss.dtype, device=loss.device)
    return comps
