"""Liger-Kernel's fused Triton kernels (RMSNorm, SwiGLU, RoPE ...) on the backbone of an hf_mlcl model.

``TrainingArguments(use_liger_kernel=True)`` makes ``Trainer`` patch the model it trains by its
``model_type``; an hf_mlcl model's is ``mlcl``, for which Liger has no kernels, so the hf_mlcl trainers hand
the backbone (Llama, Mistral, Qwen2 ...) over instead. Liger patches the backbone family's classes in
transformers for the whole process, as ``Trainer`` does. The language-model head's kernels stay off: a bare
backbone has no head, and Liger would replace its forward with a causal LM's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["apply_liger_kernel_to_backbone"]

# the kernels of a causal LM's head: a backbone has none (Liger would swap its forward for the LM's)
_HEAD_KERNELS_OFF = {"fused_linear_cross_entropy": False, "cross_entropy": False}


def apply_liger_kernel_to_backbone(model: Any, kernel_config: Mapping[str, Any] | None = None) -> Any:
    """Apply Liger-Kernel to the backbone of ``model`` (an hf_mlcl model or its LoRA ``PeftModel``).

    Args:
        model: the model whose ``backbone`` is patched in place.
        kernel_config: Liger's options (``TrainingArguments.liger_kernel_config``: ``rope``, ``rms_norm``,
            ``swiglu`` ...); the head's kernels are always off.

    Returns:
        The patched backbone.

    Raises:
        ImportError: liger-kernel is not installed (``pip install "hf-mlcl[liger]"``; it needs a GPU).
        ValueError: ``model`` has no ``backbone``.
    """
    from transformers.integrations.liger import apply_liger_kernel

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(base, "backbone", None)
    if backbone is None:
        raise ValueError(
            f"use_liger_kernel patches an hf_mlcl model's backbone; {type(base).__name__} has none"
        )
    apply_liger_kernel(backbone, {**dict(kernel_config or {}), **_HEAD_KERNELS_OFF})
    return backbone
