"""Label similarity between an anchor's label set S and a candidate's T: the positive weights W of the
weighted SupCon family (``jaccard`` / L_Base and ``sd``), chosen with their ``label_similarity`` option.

:func:`resolve_label_similarity`, :func:`label_similarity_weights` and the :class:`LabelSimilarityOption`
mixin: ``"jaccard"``, ``"dice"``, ``"overlap"``, ``"cosine"``, a callable, or an (L, L) matrix (soft cosine).

References: soft cosine measure, Sidorov et al. 2014.
Design: docs/design.md, "Label similarities (hf_mlcl/losses/label_similarity.py)".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any, Union

import torch
from torch import Tensor, nn

from hf_mlcl.labels import multihot as M
from hf_mlcl.labels.relations import SET_SIMILARITIES, set_similarity, soft_cosine

__all__ = [
    "SET_SIMILARITIES",
    "LabelSimilaritySpec",
    "set_similarity",
    "soft_cosine",
    "resolve_label_similarity",
    "label_similarity_weights",
    "describe_label_similarity",
    "LabelSimilarityOption",
]


LabelSimilaritySpec = Union[str, Callable[[Tensor, Tensor], Tensor], Tensor, Any]


def _load_matrix(path: str) -> Tensor:
    if path.endswith(".npy"):
        import numpy as np

        return torch.from_numpy(np.load(path, allow_pickle=False))
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        tensors = load_file(path)
        if len(tensors) != 1:
            raise ValueError(
                f"{path} holds {len(tensors)} tensors ({sorted(tensors)}); save the (L, L) matrix alone"
            )
        return next(iter(tensors.values()))
    raise ValueError(
        f"label_similarity file {path!r}: give a .npy or .safetensors file holding the (L, L) matrix"
    )


def resolve_label_similarity(
    spec: LabelSimilaritySpec, allowed: tuple[str, ...] = SET_SIMILARITIES
) -> str | Callable[[Tensor, Tensor], Tensor] | Tensor:
    """The ``label_similarity`` option checked (ValueError naming the problem): a name of ``allowed``, a
    callable, or an (L, L) matrix returned as a float32 tensor (a path to a .npy / .safetensors file is
    read). A matrix must be square, finite, non-negative, symmetric and have a unit diagonal."""
    if isinstance(spec, (str, os.PathLike)) and (os.fspath(spec).endswith((".npy", ".safetensors"))):
        path = os.fspath(spec)
        if not os.path.isfile(path):
            raise ValueError(f"label_similarity file {path!r} does not exist")
        spec = _load_matrix(path)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key not in allowed:
            raise ValueError(
                f"label_similarity must be one of {allowed}, a callable (S, T) -> (N, M) weights, or an (L, L) "
                f"label-similarity matrix (or a .npy / .safetensors file of one); got {spec!r}"
            )
        return key
    if callable(spec) and not isinstance(spec, Tensor):
        return spec
    if not isinstance(spec, Tensor):
        try:
            spec = torch.as_tensor(spec)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"label_similarity must be a name, a callable or an (L, L) matrix; got {type(spec).__name__}"
            ) from err
    matrix = spec.to_dense() if M.is_sparse(spec) else spec
    if matrix.dim() != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ValueError(f"a label_similarity matrix must be square (L, L); got shape {tuple(matrix.shape)}")
    if not matrix.is_floating_point():
        matrix = matrix.to(torch.float32)
    matrix = matrix.detach().to(torch.promote_types(matrix.dtype, torch.float32))
    if not bool(torch.isfinite(matrix).all()) or bool((matrix < 0).any()):
        raise ValueError("a label_similarity matrix must hold finite, non-negative similarities")
    if not torch.allclose(matrix, matrix.T, rtol=1e-5, atol=1e-6):
        raise ValueError(
            "a label_similarity matrix must be symmetric (sim(l, m) == sim(m, l)); use (A + A.T) / 2"
        )
    if not torch.allclose(matrix.diagonal(), torch.ones_like(matrix.diagonal())):
        raise ValueError(
            "a label_similarity matrix must have a unit diagonal (every label is fully similar to itself)"
        )
    return matrix


def _check_threshold(threshold: Any, resolved: Any) -> float | None:
    """``threshold`` as a float (None stays None); ValueError unless a finite number >= 0, and < 1 for a named
    similarity (its weights lie in [0, 1]: a threshold of 1 or more would leave no positive)."""
    if threshold is None:
        return None
    named = isinstance(resolved, str) and resolved != "matrix"
    bound = f"a finite number >= 0{' and < 1' if named else ''}"
    try:
        value = float(threshold)
    except (TypeError, ValueError):
        value = float("nan")
    if isinstance(threshold, bool) or not (0.0 <= value < (1.0 if named else float("inf"))):
        where = f" for label_similarity={resolved!r}, whose weights lie in [0, 1]" if named else ""
        raise ValueError(f"label_similarity_threshold must be {bound}{where} (or None); got {threshold!r}")
    return value


def describe_label_similarity(spec: Any) -> str:
    """A short printable name of a resolved choice (for reprs and model cards)."""
    if isinstance(spec, str):
        return spec
    if isinstance(spec, Tensor):
        return f"matrix({spec.shape[0]}x{spec.shape[1]})"
    return getattr(spec, "__name__", type(spec).__name__)


def label_similarity_weights(spec: Any, ctx: Any, check: bool = False) -> tuple[Tensor, Tensor]:
    """(W, positive): the (N, M) weights of a resolved ``label_similarity`` choice on a
    :class:`~hf_mlcl.losses.core.ContrastContext` and the bool mask of its positives (W > 0), both 0 /
    False at each anchor's own column. ``check``: validate a callable's output values (a host read)."""
    dtype = ctx.dtype
    if isinstance(spec, str):
        positive = ctx.shares_label
        w = set_similarity(spec, ctx.inter, ctx.anchor_sizes, ctx.candidate_sizes)
        return torch.where(positive, w, torch.zeros((), dtype=w.dtype, device=w.device)).to(dtype), positive
    if isinstance(spec, Tensor):
        if spec.shape[0] != ctx.anchor_labels.shape[1]:
            raise ValueError(
                f"the label_similarity matrix is {spec.shape[0]} x {spec.shape[1]} but the labels have "
                f"{ctx.anchor_labels.shape[1]} columns; give one row and column per label"
            )
        w = soft_cosine(ctx.anchor_labels, ctx.candidate_labels, spec.to(device=ctx.device, dtype=dtype))
    else:
        w = spec(ctx.anchor_labels, ctx.candidate_labels)
        shape = (ctx.num_anchors, ctx.num_candidates)
        if not isinstance(w, Tensor) or tuple(w.shape) != shape:
            raise ValueError(
                f"the label_similarity callable must return an (N, M) = {shape} tensor of weights; got "
                f"{tuple(w.shape) if isinstance(w, Tensor) else type(w).__name__}"
            )
        w = M.cast(w.detach().to(ctx.device), dtype)
        if check and (not bool(torch.isfinite(w).all()) or bool((w < 0).any())):
            raise ValueError(
                "the label_similarity callable returned negative or non-finite weights; return W >= 0"
            )
        w = w.clone()
    if ctx.anchors_in_candidates:
        w.diagonal().zero_()
    return w, w > 0


class LabelSimilarityOption(nn.Module):
    """The ``label_similarity`` option of a loss (mixed into ``jaccard`` and ``sd``): the resolved choice,
    an (L, L) matrix kept as a non-persistent buffer (it follows ``.to(device)``, stays out of checkpoints),
    the weights on a context and the positive rule they give (:meth:`positives`)."""

    def positives(self, rel: Any) -> Tensor:
        """The loss's positive rule under its label similarity: S & T non-empty for a set similarity (the
        default), the candidates with W > 0 for a callable or a matrix (soft positives through related
        labels), and with a threshold only the candidates whose W exceeds it. ``rel``: the pairs'
        :class:`~hf_mlcl.labels.relations.PairRelations` (or a context)."""
        if (
            self.label_similarity_threshold is None
            and isinstance(self.label_similarity, str)
            and self.label_similarity != "matrix"
        ):
            return rel.shares_label
        return self.label_weights(rel)[1]

    def init_label_similarity(
        self, spec: LabelSimilaritySpec, own: tuple[str, ...] = (), threshold: float | None = None
    ) -> None:
        """Resolve ``spec`` against the set similarities plus the loss's ``own`` names (e.g. ``"sd"``), and
        the positives' ``threshold`` (None: every candidate with W > 0; ValueError unless a number >= 0, and
        below 1 for a named similarity, whose weights lie in [0, 1])."""
        resolved = resolve_label_similarity(spec, allowed=own + SET_SIMILARITIES)
        matrix = resolved if isinstance(resolved, Tensor) else None
        self.register_buffer("label_similarity_matrix", matrix, persistent=False)
        self.label_similarity = "matrix" if matrix is not None else resolved
        self.label_similarity_threshold = _check_threshold(threshold, self.label_similarity)
        if self.label_similarity_threshold is not None or not isinstance(resolved, str):
            # positives by weight, not by a shared label: no grouping the batch sampler knows ensures them
            self.sampler_rule = None

    @property
    def label_similarity_name(self) -> str:
        """The choice as printed in reprs and model cards (with its threshold, when there is one)."""
        if self.label_similarity_matrix is not None:
            name = describe_label_similarity(self.label_similarity_matrix)
        else:
            name = describe_label_similarity(self.label_similarity)
        threshold = self.label_similarity_threshold
        return name if threshold is None else f"{name} > {threshold:g}"

    def similarity_weights(self, ctx: Any) -> tuple[Tensor, Tensor]:
        """(W, positive) of the chosen similarity on ``ctx`` before any threshold
        (:func:`label_similarity_weights`; a loss with a similarity of its own overrides this for it)."""
        spec = (
            self.label_similarity_matrix
            if self.label_similarity_matrix is not None
            else self.label_similarity
        )
        return label_similarity_weights(spec, ctx, check=getattr(self, "check_inputs", False))

    def label_weights(self, ctx: Any) -> tuple[Tensor, Tensor]:
        """(W, positive) of the chosen similarity on ``ctx``: with ``label_similarity_threshold`` t, a candidate
        is a positive only when its W exceeds t, and keeps its weight W (0 elsewhere)."""
        w, positive = self.similarity_weights(ctx)
        if self.label_similarity_threshold is None:
            return w, positive
        positive = positive & (w > self.label_similarity_threshold)
        return torch.where(positive, w, torch.zeros((), dtype=w.dtype, device=w.device)), positive
