"""LoRA for decoder backbones (Llama-3.1-8B) with peft: adapters + trainable heads, and their pad token.

``ensure_pad_token`` is the one pad-token policy of hf_mlcl (decoder tokenizers have none); the stage
entry points call it for every tokenizer.

``apply_lora`` follows the recipe of the design: LoRA r=16, alpha=32, dropout=0.1 on the attention and
MLP projections (Hu et al., 2022, "LoRA", Eq. 3: h = W0 x + (alpha / r) B A x), bf16 backbone when the
GPU supports it, activation checkpointing without re-entrancy, and our heads (projection head /
classifier) in ``modules_to_save`` so they train and are saved with the adapter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
LLAMA3_PAD_TOKEN = "<|finetune_right_pad_id|>"
HEAD_MODULES: tuple[str, ...] = ("projection_head", "classifier")


def bf16_available() -> bool:
    """True on CUDA devices with bf16 support."""
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def ensure_pad_token(tokenizer: Any, config: Any = None) -> int:
    """Give ``tokenizer`` a pad token and write its id into ``config.pad_token_id``.

    Uses Llama-3.1's reserved ``<|finetune_right_pad_id|>`` when the vocabulary has it, else the EOS
    token (padding is masked, so the choice only has to be a valid id). ``config`` may be a backbone
    config, an ``MLCLConfig`` (its ``backbone_config`` dict is updated as well) or a model (its
    ``config`` and, for hf_mlcl models, its backbone's config are updated). Returns the pad id.
    """
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        if LLAMA3_PAD_TOKEN in vocab:
            tokenizer.pad_token = LLAMA3_PAD_TOKEN
        elif tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            raise ValueError(
                "the tokenizer has no pad, no Llama-3 reserved pad and no EOS token; add one with "
                "tokenizer.add_special_tokens({'pad_token': '<pad>'}) and resize the embeddings"
            )
    pad_id = int(tokenizer.pad_token_id)
    if config is not None:
        targets = [config]
        if isinstance(config, nn.Module):
            targets = [config.config]
            backbone = getattr(config, "backbone", None)
            if backbone is not None:
                targets.append(backbone.config)
        for cfg in targets:
            cfg.pad_token_id = pad_id
            if isinstance(getattr(cfg, "backbone_config", None), dict):
                cfg.backbone_config["pad_token_id"] = pad_id
    return pad_id


def _enable_checkpointing(model: nn.Module) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def apply_lora(
    encoder: nn.Module,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.1,
    target_modules: Sequence[str] | None = None,
    modules_to_save: Sequence[str] | None = None,
    gradient_checkpointing: bool = True,
    bf16: bool | None = None,
) -> nn.Module:
    """Wrap an hf_mlcl model (``MLCLEncoder`` or classifier) with peft LoRA adapters.

    - ``target_modules`` default: q, k, v, o, gate, up, down projections (Llama / Mistral / Qwen).
    - ``modules_to_save`` default: our heads present in the model (``projection_head`` /
      ``classifier``), so they are trained and saved with the adapter.
    - ``bf16`` (default: CUDA with bf16 support) casts the backbone to bfloat16; heads stay fp32
      and peft keeps the adapter weights in fp32.
    - ``gradient_checkpointing``: activation checkpointing with ``use_reentrant=False`` plus
      ``enable_input_require_grads`` (needed when the embeddings are frozen).

    The returned ``PeftModel`` is called like the encoder. Save with ``peft_model.save_pretrained``
    and reload with ``PeftModel.from_pretrained(base_model, dir)`` (adapters and heads round-trip).
    Set the pad token first with :func:`ensure_pad_token`.
    """
    from peft import LoraConfig, get_peft_model

    if r <= 0 or alpha <= 0:
        raise ValueError(f"LoRA r and alpha must be positive; got r={r}, alpha={alpha}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1); got {dropout}")
    names = [name for name, _ in encoder.named_modules()]
    leaves = {name.rsplit(".", 1)[-1] for name in names}
    targets = list(target_modules) if target_modules is not None else list(DEFAULT_LORA_TARGETS)
    if not any(t in leaves for t in targets):
        raise ValueError(
            f"none of the LoRA target modules {targets} exists in this backbone; pass target_modules=... "
            "(e.g. ['query', 'key', 'value', 'dense'] for BERT / RoBERTa)"
        )
    if modules_to_save is None:
        modules_to_save = [h for h in HEAD_MODULES if h in {n for n in names if "." not in n}]
    if bf16 is None:
        bf16 = bf16_available()
    if bf16:
        backbone = getattr(encoder, "backbone", encoder)
        backbone.to(torch.bfloat16)
    if gradient_checkpointing:
        _enable_checkpointing(encoder)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules=targets,
        modules_to_save=list(modules_to_save) or None,
        bias="none",
    )
    return get_peft_model(encoder, config)


def trainable_parameter_names(model: nn.Module) -> list[str]:
    """Names of the parameters with ``requires_grad`` (handy for checks and logging)."""
    return [name for name, p in model.named_parameters() if p.requires_grad]


__all__ = [
    "DEFAULT_LORA_TARGETS",
    "LLAMA3_PAD_TOKEN",
    "apply_lora",
    "bf16_available",
    "ensure_pad_token",
    "trainable_parameter_names",
]
