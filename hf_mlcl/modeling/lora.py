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

    The returned ``PeftModel`` is called like the encoder. Save it as an hf_mlcl adapter folder with
    :func:`save_lora_adapter` (``MLCLEncoder.from_pretrained`` / ``AutoModel`` load it onto the base
    model), or as a plain PEFT adapter with ``peft_model.save_pretrained``.
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


def save_lora_adapter(model: nn.Module, save_directory: str, base_model_name_or_path: str) -> None:
    """Save a LoRA-trained hf_mlcl model (the ``PeftModel`` of :func:`apply_lora`) as an adapter folder.

    Written: PEFT's ``adapter_config.json`` (``base_model_name_or_path`` = the base backbone's Hub id or
    path, ``modules_to_save`` cleared) and ``adapter_model.safetensors`` with the backbone's LoRA
    matrices (keys relative to the backbone, ``base_model.model.<module>.lora_A.weight``); then the
    model's own ``save_pretrained`` with the heads only (projection head / classifier in
    ``model.safetensors``), ``config.json`` and the remote code. The adapter files go first, so an
    interrupted save never leaves a config with heads-only weights that loads as a full model.
    ``MLCLEncoder`` / ``MLCLForMultiLabelClassification.from_pretrained`` and ``AutoModel*`` with
    ``trust_remote_code=True`` load the base by that id and merge the adapter
    (``hf_mlcl.modeling.modeling_mlcl.merge_lora_weights``; Hu et al., 2022, Eq. 3).
    """
    import copy
    import os

    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    from .modeling_mlcl import ADAPTER_WEIGHTS_NAME

    if not hasattr(model, "peft_config"):
        raise ValueError(f"save_lora_adapter expects the PeftModel of apply_lora; got {type(model).__name__}")
    name = model.active_adapter
    inner = model.base_model.model
    prefix, backbone_prefix = "base_model.model.", "base_model.model.backbone."
    adapter: dict[str, torch.Tensor] = {}
    for key, value in get_peft_model_state_dict(model, adapter_name=name).items():
        if "lora_" not in key:
            continue  # the heads (modules_to_save) are saved below with the model
        if not key.startswith(backbone_prefix):
            raise ValueError(
                f"LoRA weight {key} lies outside the backbone; adapter folders hold backbone adapters only "
                "(use merge_lora: true)"
            )
        adapter[prefix + key[len(backbone_prefix) :]] = value.detach().to("cpu").contiguous()
    heads: dict[str, torch.Tensor] = {}
    for child_name, child in inner.named_children():
        if child_name == "backbone":
            continue
        module = child.modules_to_save[name] if hasattr(child, "modules_to_save") else child
        for key, value in module.state_dict().items():
            heads[f"{child_name}.{key}"] = value.detach().to("cpu").contiguous()
    config = copy.deepcopy(model.peft_config[name])
    config.base_model_name_or_path = base_model_name_or_path
    config.modules_to_save = None
    config.inference_mode = True
    os.makedirs(save_directory, exist_ok=True)
    tmp = os.path.join(save_directory, f".{ADAPTER_WEIGHTS_NAME}.tmp")
    save_file(adapter, tmp, metadata={"format": "pt"})
    os.replace(tmp, os.path.join(save_directory, ADAPTER_WEIGHTS_NAME))
    config.save_pretrained(save_directory)
    inner.save_pretrained(save_directory, state_dict=heads)



def save_heads_with_adapter(model: nn.Module, save_directory: str, adapter_directory: str) -> None:
    """Save a model whose backbone is the base model + an unchanged saved adapter (a frozen-encoder probe
    on an adapter encoder) as an adapter folder too: the adapter files of ``adapter_directory`` are
    copied, then ``model.save_pretrained`` writes the heads only (every weight outside the backbone),
    ``config.json`` and the remote code. Loads like :func:`save_lora_adapter`'s folders."""
    import os
    import shutil

    from .modeling_mlcl import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME

    os.makedirs(save_directory, exist_ok=True)
    for name in (ADAPTER_WEIGHTS_NAME, ADAPTER_CONFIG_NAME):
        tmp = os.path.join(save_directory, f".{name}.tmp")
        shutil.copyfile(os.path.join(adapter_directory, name), tmp)
        os.replace(tmp, os.path.join(save_directory, name))
    prefix = f"{model.base_model_prefix}."
    heads = {k: v.detach().to("cpu").contiguous() for k, v in model.state_dict().items() if not k.startswith(prefix)}
    model.save_pretrained(save_directory, state_dict=heads)


__all__ = [
    "DEFAULT_LORA_TARGETS",
    "LLAMA3_PAD_TOKEN",
    "apply_lora",
    "bf16_available",
    "ensure_pad_token",
    "save_heads_with_adapter",
    "save_lora_adapter",
    "trainable_parameter_names",
]
