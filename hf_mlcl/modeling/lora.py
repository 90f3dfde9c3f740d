"""LoRA for any backbone with peft (Llama-3.1-8B, BERT, RoBERTa, MiniLM, ModernBERT ...): adapters +
trainable heads (their pad token: :func:`hf_mlcl.data.tokenizer.ensure_pad_token`).

``apply_lora`` follows the recipe of the design: LoRA r=16, alpha=32, dropout=0.1 on the attention and
MLP projections (Hu et al., 2022, "LoRA", Eq. 3: h = W0 x + (alpha / r) B A x), bf16 backbone when the
GPU supports it, activation checkpointing without re-entrancy, and our heads (projection head /
classifier) in ``modules_to_save`` so they train and are saved with the adapter. The projections have
other names in every architecture: :func:`default_lora_targets` picks them from the backbone's
``model_type`` (:data:`LORA_TARGETS_BY_MODEL_TYPE`: the attention's query / key / value / output and the
feed-forward layers, never a pooler or our heads), so ``use_lora`` needs no ``lora_target_modules`` for
the architectures listed there.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from hf_mlcl.files import atomic_path

DEFAULT_LORA_TARGETS: tuple[str, ...] = (
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
)
# BERT-style layers: attention.self.{query,key,value}, attention.output.dense, intermediate.dense,
# output.dense ("output.dense" matches both output layers; not the pooler's "pooler.dense" nor a head)
_BERT_TARGETS: tuple[str, ...] = ("query", "key", "value", "intermediate.dense", "output.dense")
# the model arguments of a LoRA run (ModelArguments fields), which its card and its recorded settings state
LORA_OPTIONS = ("use_lora", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "merge_lora")
LORA_TARGETS_BY_MODEL_TYPE: dict[str, tuple[str, ...]] = {
    **{
        t: DEFAULT_LORA_TARGETS
        for t in ("llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text")
    },
    **{t: _BERT_TARGETS for t in ("bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie")},
    "deberta-v2": ("query_proj", "key_proj", "value_proj", "intermediate.dense", "output.dense"),
    "distilbert": ("q_lin", "k_lin", "v_lin", "out_lin", "lin1", "lin2"),
    "mpnet": ("q", "k", "v", "o", "intermediate.dense", "output.dense"),
    "modernbert": ("Wqkv", "Wo", "Wi"),  # attn.Wqkv, attn.Wo, mlp.Wi, mlp.Wo
}
HEAD_MODULES: tuple[str, ...] = ("projection_head", "classifier")

logger = logging.getLogger(__name__)


def bf16_available() -> bool:
    """True on CUDA devices with bf16 support."""
    return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())


def _enable_checkpointing(model: nn.Module) -> None:
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()


def _matches(name: str, target: str) -> bool:
    """peft's rule for a ``target_modules`` entry: the module's full name, or its dotted suffix."""
    return name == target or name.endswith("." + target)


def default_lora_targets(model: nn.Module) -> list[str]:
    """The LoRA target modules of ``model``'s backbone (an hf_mlcl model's ``backbone``, or a transformers
    model), from its ``config.model_type`` (:data:`LORA_TARGETS_BY_MODEL_TYPE`); ValueError naming the
    model type and its linear layers when the architecture is not listed."""
    backbone = getattr(model, "backbone", model)
    model_type = getattr(getattr(backbone, "config", None), "model_type", None)
    targets = LORA_TARGETS_BY_MODEL_TYPE.get(str(model_type))
    if targets is None:
        linear = sorted(
            {n.rsplit(".", 1)[-1] for n, m in backbone.named_modules() if isinstance(m, nn.Linear)}
        )
        raise ValueError(
            f"no default LoRA target modules for model type {model_type!r} (known: "
            f"{sorted(LORA_TARGETS_BY_MODEL_TYPE)}); pass lora_target_modules / target_modules with the names of "
            f"its attention and feed-forward layers (its linear layers: {linear[:12]})"
        )
    return list(targets)


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

    - ``target_modules`` default: the backbone's attention and feed-forward projections for its
      architecture (:func:`default_lora_targets`; q, k, v, o, gate, up, down for Llama / Mistral / Qwen,
      query, key, value and the dense output layers for BERT / RoBERTa / MiniLM, Wqkv / Wo / Wi for
      ModernBERT).
    - ``modules_to_save`` default: our heads present in the model (``projection_head`` /
      ``classifier``), so they are trained and saved with the adapter.
    - ``bf16`` (default: CUDA with bf16 support) casts the backbone's parameters to bfloat16 (its buffers, such
      as rotary frequencies, keep their dtype); heads stay fp32 and peft keeps the adapter weights in fp32. The
      saved folder records the dtype, and its base loads in it.
    - ``gradient_checkpointing``: activation checkpointing with ``use_reentrant=False`` plus
      ``enable_input_require_grads`` (needed when the embeddings are frozen).

    The returned ``PeftModel`` is called like the encoder. Save it as an hf_mlcl adapter folder with
    :func:`save_lora_adapter` (``MLCLEncoder.from_pretrained`` / ``AutoModel`` load it onto the base
    model), or as a plain PEFT adapter with ``peft_model.save_pretrained``.
    Set the pad token first with :func:`hf_mlcl.data.tokenizer.ensure_pad_token`.
    """
    from peft import LoraConfig, get_peft_model

    if r <= 0 or alpha <= 0:
        raise ValueError(f"LoRA r and alpha must be positive; got r={r}, alpha={alpha}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"LoRA dropout must be in [0, 1); got {dropout}")
    names = [name for name, _ in encoder.named_modules()]
    targets = list(target_modules) if target_modules is not None else default_lora_targets(encoder)
    unmatched = [t for t in targets if not any(_matches(name, t) for name in names)]
    if len(unmatched) == len(targets):
        raise ValueError(
            f"none of the LoRA target modules {targets} exists in this backbone; pass target_modules=... "
            "(e.g. ['query', 'key', 'value'] for BERT / RoBERTa; leave it unset for the architecture's default)"
        )
    if target_modules is not None and unmatched:  # a misspelt name beside a right one got no adapter
        raise ValueError(
            f"the LoRA target modules {unmatched} match no module of this backbone (the others do); correct or "
            "remove them"
        )
    if modules_to_save is None:
        modules_to_save = [h for h in HEAD_MODULES if h in {n for n in names if "." not in n}]
    if bf16 is None:
        bf16 = bf16_available()
    if bf16:
        # the parameters only: a floating buffer keeps the dtype its model computed it in (Llama's rotary
        # inv_freq stays float32), as loading the base with dtype=bfloat16 gives it and every reload rebuilds it
        for param in getattr(encoder, "backbone", encoder).parameters():
            if param.is_floating_point() and param.dtype != torch.bfloat16:
                param.data = param.data.to(torch.bfloat16)
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


_PEFT_PREFIX = "base_model.model."
_BACKBONE_PREFIX = "base_model.model.backbone."


def _adapter_and_heads(
    model: nn.Module, state: Mapping[str, torch.Tensor] | None = None
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(backbone LoRA matrices with PEFT's adapter keys, heads keyed as in the hf_mlcl model) of the active
    adapter, read from ``state`` (a state dict of the PeftModel holding at least its adapter and heads, e.g.
    gathered from FSDP shards) or from the live model. Only the state dict is read (peft's ``get_peft_model_state_dict`` reads the live heads, which under FSDP would
    gather on one process alone)."""
    name = model.active_adapter
    state = model.state_dict() if state is None else state
    adapter: dict[str, torch.Tensor] = {}
    for full_key, value in state.items():
        parts = full_key.split(".")
        if name not in parts or not any(part.startswith("lora_") for part in parts):
            continue  # not this adapter's LoRA matrices (the heads are saved below with the model)
        key = ".".join(part for part in parts if part != name)  # PEFT's adapter keys carry no adapter name
        if not key.startswith(_BACKBONE_PREFIX):
            raise ValueError(
                f"LoRA weight {key} lies outside the backbone; adapter folders hold backbone adapters only "
                "(use merge_lora: true)"
            )
        adapter[_PEFT_PREFIX + key[len(_BACKBONE_PREFIX) :]] = value.detach().to("cpu").contiguous()
    inner = model.base_model.model
    wrapped = {child for child, module in inner.named_children() if hasattr(module, "modules_to_save")}
    own = f"modules_to_save.{name}."
    heads: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not key.startswith(_PEFT_PREFIX) or key.startswith(_BACKBONE_PREFIX):
            continue
        child, _, rest = key[len(_PEFT_PREFIX) :].partition(".")
        if child in wrapped:
            if not rest.startswith(own):
                continue  # the wrapper's original module and other adapters' copies
            rest = rest[len(own) :]
        heads[f"{child}.{rest}"] = value.detach().to("cpu").contiguous()
    return adapter, heads


def save_lora_adapter(
    model: nn.Module,
    save_directory: str,
    base_model_name_or_path: str,
    state_dict: Mapping[str, torch.Tensor] | None = None,
) -> None:
    """Save a LoRA-trained hf_mlcl model (the ``PeftModel`` of :func:`apply_lora`) as an adapter folder.

    Written: PEFT's ``adapter_config.json`` (``base_model_name_or_path`` = the base backbone's Hub id, or its
    absolute path for a local folder, ``modules_to_save`` cleared) and ``adapter_model.safetensors`` with the
    backbone's LoRA matrices (keys relative to the backbone, ``base_model.model.<module>.lora_A.weight``); then the
    model's own ``save_pretrained`` with the heads only (projection head / classifier in
    ``model.safetensors``), ``config.json`` and the remote code. The adapter files go first, so an
    interrupted save never leaves a config with heads-only weights that loads as a full model.
    ``MLCLEncoder`` / ``MLCLForMultiLabelClassification.from_pretrained`` load the base by that id and apply
    the adapter (unmerged with peft, else merged in: ``merge_lora_weights``; Hu et al., 2022, Eq. 3).

    The weights are read from the live model, or from ``state_dict`` (a state dict of the ``PeftModel``
    holding at least its adapter and heads, e.g. gathered from FSDP shards). One process writes; for a model that DeepSpeed or FSDP
    shards, every process calls :func:`save_lora_model` instead.
    """
    import copy
    import os

    from hf_mlcl.files import atomic_write_safetensors

    from .folders_mlcl import ADAPTER_WEIGHTS_NAME

    if not hasattr(model, "peft_config"):
        raise ValueError(f"save_lora_adapter expects the PeftModel of apply_lora; got {type(model).__name__}")
    adapter, heads = _adapter_and_heads(model, state_dict)
    config = copy.deepcopy(model.peft_config[model.active_adapter])
    # a local base as an absolute path: peft reads a relative one from the working directory of the load
    local = os.path.isdir(base_model_name_or_path)
    config.base_model_name_or_path = (
        os.path.abspath(base_model_name_or_path) if local else base_model_name_or_path
    )
    config.modules_to_save = None
    config.inference_mode = True
    atomic_write_safetensors(
        adapter, os.path.join(save_directory, ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"}
    )
    config.save_pretrained(save_directory)
    model.base_model.model.save_pretrained(
        save_directory, state_dict=heads, is_main_process=True
    )  # the caller writes


def merge_rounding(model: nn.Module) -> float | None:
    """The share of the LoRA update that merging ``model``'s active adapters into their weights would round
    away: ``||round(W + dW) - W - dW|| / ||dW||`` over every adapted layer, dW in float32; None when no
    adapted weight is bf16 / fp16 (a float32 merge keeps the update to float32 rounding). One layer at a time."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    lost = total = 0.0
    low = False
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, BaseTunerLayer) or not hasattr(module, "get_delta_weight"):
                continue
            weight = module.get_base_layer().weight
            if weight.dtype not in (torch.bfloat16, torch.float16):
                continue
            low = True
            for name in module.active_adapters:
                delta = module.get_delta_weight(name).float()
                merged = (weight.float() + delta).to(weight.dtype).float()
                lost += float((merged - weight.float() - delta).pow(2).sum())
                total += float(delta.pow(2).sum())
    return (lost**0.5 / total**0.5 if total else 0.0) if low else None


def _unload_injected(backbone: nn.Module) -> None:
    """Merge the adapters transformers' ``load_adapter`` injected into ``backbone`` and put the base layers back."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for name, module in list(backbone.named_modules()):
        if isinstance(module, BaseTunerLayer):
            module.merge()
            parent, _, child = name.rpartition(".")
            setattr(backbone.get_submodule(parent) if parent else backbone, child, module.get_base_layer())
    backbone._hf_peft_config_loaded = False
    backbone.peft_config = {}


def merge_lora(model: nn.Module) -> nn.Module:
    """A LoRA-wrapped hf_mlcl model with its adapters merged into the base weights (peft's
    ``merge_and_unload``): a plain ``MLCLEncoder`` / classifier. Also accepts a model whose backbone alone is a
    ``PeftModel`` or carries adapters transformers' ``load_adapter`` injected (a loaded adapter folder); a model
    without adapters is returned as is. A merge into bf16 / fp16 weights that rounds away more than 1 % of the
    update (:func:`merge_rounding`) is logged as a warning with the share."""
    backbone = getattr(model, "backbone", None)
    injected = bool(getattr(backbone, "_hf_peft_config_loaded", False))
    if not (hasattr(model, "merge_and_unload") or hasattr(backbone, "merge_and_unload") or injected):
        return model
    lost = merge_rounding(model)
    if lost is not None and lost > 0.01:
        logger.warning(
            f"merging the LoRA adapter into low-precision weights rounds away {lost:.1%} of its update "
            "(norm); keep the adapter unmerged to keep the trained model"
        )
    if hasattr(model, "merge_and_unload"):
        return model.merge_and_unload()
    if injected:
        _unload_injected(backbone)
    else:
        model.backbone = backbone.merge_and_unload()
    return model


def save_lora_model(
    model: nn.Module,
    save_directory: str,
    base_model_name_or_path: str | None = None,
    merge: bool = False,
    accelerator: Any = None,
    is_main_process: bool | None = None,
    merge_live: bool = False,
) -> None:
    """Save the model of a finished LoRA stage; EVERY process of the run calls it, the main one writes.

    Args:
        model: the model as prepared for training (``Trainer.model_wrapped``: a ``DeepSpeedEngine``, an
            FSDP root, DDP) or the ``PeftModel`` of :func:`apply_lora` itself.
        save_directory: the folder to write.
        base_model_name_or_path: the base backbone the adapter loads onto (default: the model's
            ``config.backbone_name_or_path``).
        merge: write merged full weights (a plain hf_mlcl model) instead of an adapter folder.
        accelerator: the run's ``accelerate.Accelerator`` (``trainer.accelerator``); needed under FSDP1.
        is_main_process: whether this process writes (``TrainingArguments.should_save``: the main process
            of every node with ``save_on_each_node``); default: the global main process.
        merge_live: with ``merge``, merge the live model itself: its backbone is not the base as stored (a
            stage-1 adapter merged into it), so an adapter over that base would lose it. One process only.

    The trainable weights are gathered as the engine requires: DeepSpeed ZeRO-3 and FSDP2 gather the
    adapter and head parameters only (``deepspeed.zero.GatheredParameters``, ``DTensor.full_tensor``:
    cheap, never the frozen base); FSDP1 gathers the full state dict the accelerator gives
    (``accelerator.get_state_dict``); plain, DDP and ZeRO-1/2 models are read as they are. The main
    process then writes the adapter folder of :func:`save_lora_adapter` (it loads with ``MLCLEncoder`` /
    ``MLCLForMultiLabelClassification.from_pretrained`` and ``AutoModel*`` with ``trust_remote_code=True``).
    Merged weights are written with ``merge=True``: the adapter folder reloaded onto its base as stored on the main
    process and merged there (a float32 base cast to bf16 for training keeps the whole update; the live model stays
    as it is), whatever the launch; and from the live model with ``merge_live`` or when the backbone was built
    from a config (no base model to point an adapter at; sharded, that is a ValueError). Returns when the folder
    is complete on every process.
    """
    import os
    import shutil
    import tempfile

    from .sharded import is_main_process as _is_main_process
    from .sharded import loading_whole_models, readable_state, sharding_kind, unwrap_model, wait_for_everyone

    kind = sharding_kind(model)
    peft_model = unwrap_model(model)
    if not hasattr(peft_model, "peft_config"):
        raise ValueError(
            f"save_lora_model expects a model wrapped by apply_lora; got {type(peft_model).__name__}"
        )
    inner = peft_model.base_model.model
    base = base_model_name_or_path or getattr(inner.config, "backbone_name_or_path", None)
    is_main = _is_main_process(accelerator) if is_main_process is None else bool(is_main_process)
    if not base and kind is not None:
        raise ValueError(
            "a LoRA model whose backbone was built from a config has no base model to save an adapter for, and "
            f"its weights are sharded ({kind}): build the backbone from a saved model (model_name_or_path)"
        )
    if kind is None and (not base or (merge and merge_live)):
        if not merge:
            logger.warning(
                "use_lora with a backbone built from a config: no base model to load an adapter onto, "
                "saving the merged weights"
            )
        if is_main:
            merge_lora(peft_model).save_pretrained(save_directory, is_main_process=True)
    else:
        target = save_directory
        if merge and is_main:  # the adapter goes to a temporary folder, reloaded merged below
            target = tempfile.mkdtemp(
                prefix=".adapter-", dir=os.path.dirname(os.path.abspath(save_directory))
            )
        adapter = peft_model.active_adapter
        names = [
            n
            for n, _ in peft_model.named_parameters()
            if not n.startswith(_BACKBONE_PREFIX) or adapter in n.split(".")
        ]
        with readable_state(model, names, accelerator) as state:
            if is_main:
                save_lora_adapter(peft_model, target, base, state_dict=state)
        if merge and is_main:
            try:
                with loading_whole_models():  # one process loads the base: no ZeRO-3 partitioning
                    # the adapter applied unmerged (peft) on the base in its stored dtype: a float32 base
                    # cast to bf16 for training keeps the whole update when merged in float32
                    reloaded = type(inner).from_pretrained(target, dtype="auto")
                merge_lora(reloaded).save_pretrained(save_directory, is_main_process=True)
            finally:
                shutil.rmtree(target, ignore_errors=True)
    wait_for_everyone()


def save_heads_with_adapter(
    model: nn.Module,
    save_directory: str,
    adapter_directory: str,
    accelerator: Any = None,
    is_main_process: bool | None = None,
) -> None:
    """Save a model whose backbone is the base model + an unchanged saved adapter (a frozen-encoder probe
    on an adapter encoder) as an adapter folder too: the adapter files of ``adapter_directory`` are
    copied, then ``model.save_pretrained`` writes the heads only (every weight outside the backbone),
    ``config.json`` and the remote code. Loads like :func:`save_lora_adapter`'s folders.

    ``model`` may be the model as prepared for training (DeepSpeedEngine, FSDP root, DDP); then EVERY
    process calls this (the heads are gathered as in :func:`save_lora_model`, ``accelerator`` needed under
    FSDP1) and the main process writes (``is_main_process`` as in :func:`save_lora_model`). Returns when
    the folder is complete on every process.
    """
    import os
    import shutil

    from .folders_mlcl import ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME
    from .sharded import is_main_process as _is_main_process
    from .sharded import readable_state, unwrap_model, wait_for_everyone

    inner = unwrap_model(model)
    writes = _is_main_process(accelerator) if is_main_process is None else bool(is_main_process)
    prefix = f"{inner.base_model_prefix}."
    names = [n for n, _ in inner.named_parameters() if not n.startswith(prefix)]
    with readable_state(model, names, accelerator) as state:
        if writes:
            os.makedirs(save_directory, exist_ok=True)
            for name in (ADAPTER_WEIGHTS_NAME, ADAPTER_CONFIG_NAME):
                with atomic_path(os.path.join(save_directory, name)) as tmp:
                    shutil.copyfile(os.path.join(adapter_directory, name), tmp)
            state = inner.state_dict() if state is None else state
            heads = {
                k: v.detach().to("cpu").contiguous() for k, v in state.items() if not k.startswith(prefix)
            }
            inner.save_pretrained(save_directory, state_dict=heads, is_main_process=True)
    wait_for_everyone()


__all__ = [
    "DEFAULT_LORA_TARGETS",
    "LORA_OPTIONS",
    "LORA_TARGETS_BY_MODEL_TYPE",
    "apply_lora",
    "bf16_available",
    "default_lora_targets",
    "merge_lora",
    "merge_rounding",
    "save_heads_with_adapter",
    "save_lora_adapter",
    "save_lora_model",
    "trainable_parameter_names",
]
