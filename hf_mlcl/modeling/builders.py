"""A stage's tokenizer and model from its model settings (``ModelArguments``): what the stages build.

* :func:`build_tokenizer_and_encoder`: the tokenizer and an ``MLCLEncoder`` from a saved hf_mlcl encoder, a
  backbone id / path, or a backbone config (``backbone_config``: a random-init backbone and a tokenizer
  trained on the training texts); every tokenizer gets the one pad-token policy
  (:func:`hf_mlcl.data.tokenizer.ensure_pad_token`);
* :func:`probe_model`: the classifier of stage 2 on that encoder (a LoRA encoder merged first; the
  encoder frozen for the linear / logistic probes), LoRA-wrapped for a LoRA fine-tune;
* :func:`with_lora`: ``apply_lora`` with the settings' rank, alpha, dropout and targets;
* :func:`align_special_tokens`: the model config's pad / bos / eos ids set to the tokenizer's before a
  Trainer is built;
* :func:`segment_multiple` (PLM-ICD's segment length, the collator's padding multiple) and
  :func:`adapter_encoder` (a folder saved as a LoRA adapter).

Settings are read by name, so anything shaped like ``hf_mlcl.training.ModelArguments`` works.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = [
    "adapter_encoder",
    "align_special_tokens",
    "build_tokenizer_and_encoder",
    "is_mlcl_checkpoint",
    "folder_layout",
    "holds_an_encoder",
    "is_native_encoder",
    "model_files_required",
    "native_settings",
    "probe_model",
    "require_a_model",
    "segment_multiple",
    "stored_config",
    "with_lora",
]

_ENCODER_MODEL_TYPES = {
    "bert",
    "roberta",
    "xlm-roberta",
    "distilbert",
    "electra",
    "deberta",
    "deberta-v2",
    "mpnet",
    "albert",
    "camembert",
    "longformer",
    "modernbert",
}


def is_mlcl_checkpoint(path: str | None) -> bool:
    """True when ``path`` is a folder holding a saved hf_mlcl model in hf_mlcl's own format (``config.json``
    with model_type mlcl)."""
    return bool(path) and os.path.isdir(path) and stored_config(path).get("model_type") == "mlcl"


def native_settings(path: str) -> dict | None:
    """A native folder's ``mlcl_config.json`` (None for a folder in hf_mlcl's format)."""
    from .native_mlcl import MLCL_FILE

    settings = os.path.join(path, MLCL_FILE)
    if not os.path.isfile(settings):
        return None
    with open(settings, encoding="utf-8") as fh:
        return json.load(fh)


def folder_layout(path: str) -> str:
    """The format of a saved model folder: ``"sentence-transformers"`` (an encoder, or a classifier with a
    linear head), ``"transformers"`` (a classifier with a native head), ``"peft"`` (a LoRA classifier with a
    native head, a ``SEQ_CLS`` adapter) or ``"hf_mlcl"`` (hf_mlcl's classes, with remote code)."""
    settings = native_settings(path)
    if settings is None:
        return "hf_mlcl"
    if settings.get("kind") == "classifier":
        return settings.get("layout", "transformers")
    return "sentence-transformers"


def holds_a_model(path: str | None) -> bool:
    """True when the folder ``path`` holds a saved model: its own ``config.json``, or an adapter's over its base
    (``MODEL_CONFIG_FILES``)."""
    from .folders_mlcl import MODEL_CONFIG_FILES

    return bool(path) and any(os.path.isfile(os.path.join(path, name)) for name in MODEL_CONFIG_FILES)


def require_a_model(path: str) -> None:
    """FileNotFoundError in one line when ``path`` is a local folder holding no saved model
    (:func:`holds_a_model`), before anything is read or loaded; a Hub id is left to its loader."""
    if os.path.isdir(path) and not holds_a_model(path):
        inside = [name for name in ("classifier", "encoder") if holds_a_model(os.path.join(path, name))]
        hint = (
            f"it is a run's folder: pass {' or '.join(os.path.join(path, name) for name in inside)}"
            if inside
            else "pass the folder that hf-mlcl run / probe wrote"
        )
        raise FileNotFoundError(
            f"{path} holds no saved model (no config.json or adapter_config.json); {hint}"
        )


@contextlib.contextmanager
def model_files_required(path: str) -> Iterator[None]:
    """Loading the model of the folder ``path``: a file transformers cannot find there (its weights) is a
    FileNotFoundError in one line naming the folder, not a traceback."""
    try:
        yield
    except OSError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        base = adapter_base(path)
        if base is not None and not os.path.isdir(base):
            raise FileNotFoundError(
                f"{path} is an adapter over the base model {base!r} (adapter_config.json), which is not a folder "
                f"here and did not load: {first}"
            ) from err
        raise FileNotFoundError(f"{path} holds no complete model: {first}") from err


def adapter_base(path: str | None) -> str | None:
    """The base model an adapter folder names (``base_model_name_or_path`` of its ``adapter_config.json``);
    None for a folder without one."""
    from .folders_mlcl import ADAPTER_CONFIG_NAME

    try:
        with open(os.path.join(path or "", ADAPTER_CONFIG_NAME), encoding="utf-8") as fh:
            base = json.load(fh).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError):
        return None
    return base if isinstance(base, str) and base else None


def holds_a_tokenizer(path: str | None) -> bool:
    """True when the folder ``path`` holds a saved tokenizer (``tokenizer.json`` or ``tokenizer_config.json``)."""
    return bool(path) and any(
        os.path.isfile(os.path.join(path, name)) for name in ("tokenizer.json", "tokenizer_config.json")
    )


def stored_config(path: str) -> dict:
    """The folder's ``config.json`` as a dict ({} without one), read without loading anything."""
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        return {}
    with open(file, encoding="utf-8") as fh:
        return json.load(fh)


def holds_an_encoder(path: str) -> bool:
    """True when the folder ``path`` holds an hf_mlcl encoder (stage 1), in the sentence-transformers layout or in
    hf_mlcl's own (``MLCLEncoder`` in its ``config.json``), not a classifier."""
    return is_native_encoder(path) or "MLCLEncoder" in (stored_config(path).get("architectures") or [])


def is_native_encoder(path: str | None) -> bool:
    """True when ``path`` is a folder holding an hf_mlcl encoder saved as a sentence-transformers folder."""
    settings = native_settings(path) if path else None
    return settings is not None and settings.get("kind", "encoder") == "encoder"


def _tokenizer_style(model_type: str) -> str:
    return "bert" if model_type in _ENCODER_MODEL_TYPES else "llama"


def _encoder_from_backbone(source: Any, model_args: Any, projection_dim: int, **extra: Any):
    """A fresh MLCLEncoder around a backbone id / path / config dict, configured from ``model_args``.

    A ``label_attention`` (PLM-ICD) recipe gets a segmented encoder: its document embedding is the
    masked mean over all segment tokens.
    """
    from .modeling_mlcl import MLCLEncoder

    if model_args.projection_hidden_dim is not None:
        extra["projection_hidden_dim"] = model_args.projection_hidden_dim
    return MLCLEncoder.from_backbone(
        source,
        pooling=model_args.pooling,
        projection_dim=projection_dim,
        chunk_size=model_args.chunk_size,
        segmented=model_args.head == "label_attention",
        **extra,
    )


def build_tokenizer_and_encoder(
    model_args: Any,
    train_texts: list[str] | None,
    projection_dim: int = 256,
    source: str | None = None,
    label_names: Sequence[str] | None = None,
    dtype: str | None = None,
):
    """(tokenizer, MLCLEncoder) from a saved hf_mlcl encoder, a backbone id / path, or ``backbone_config``,
    its backbone on ``model_args.attn_implementation`` where that is set. A saved encoder loads in the dtype it
    trained in, or in ``dtype`` where given (``"auto"``: an adapter's base as stored, for a lossless merge).

    ``source`` overrides ``model_args.model_name_or_path`` (stage 2's ``encoder_path``); ``label_names``,
    when given, become the encoder config's ``id2label`` / ``label2id``. A tokenizer trained on the fly
    (``backbone_config`` without ``tokenizer_name_or_path``) is trained by the global main process and sent
    to the others (:func:`~hf_mlcl.modeling.sharded.built_once`), so every process of a multi-process
    launch calls this.
    """
    from transformers import AutoTokenizer

    from .modeling_mlcl import MLCLEncoder

    path = source or model_args.model_name_or_path
    extra = {"trust_remote_code": True} if model_args.trust_remote_code else {}
    attention = getattr(model_args, "attn_implementation", None)
    loader = {"attn_implementation": attention} if attention else {}
    if path:
        tok_path = model_args.tokenizer_name_or_path or path
        if model_args.tokenizer_name_or_path is None and os.path.isdir(path) and not holds_a_tokenizer(path):
            if not model_args.model_name_or_path or model_args.model_name_or_path == path:
                raise ValueError(f"{path} holds no tokenizer; set model_args.tokenizer_name_or_path")
            tok_path = model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(tok_path, **extra)
        if is_mlcl_checkpoint(path) or is_native_encoder(path):
            encoder = MLCLEncoder.from_pretrained(path, **loader, **({"dtype": dtype} if dtype else {}))
        else:
            encoder = _encoder_from_backbone(path, model_args, projection_dim, **extra, **loader)
    elif model_args.backbone_config:
        cfg = dict(model_args.backbone_config)
        if "model_type" not in cfg:
            raise ValueError("backbone_config needs a 'model_type' key (e.g. {'model_type': 'bert', ...})")
        if model_args.tokenizer_name_or_path:
            tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path, **extra)
        else:
            if not train_texts:
                raise ValueError(
                    "backbone_config without tokenizer_name_or_path needs training texts to train a tokenizer"
                )
            from hf_mlcl.data import train_tokenizer

            from .sharded import built_once

            # trained once for the launch (global main process) and sent to every process of every node
            tokenizer = built_once(
                lambda: train_tokenizer(
                    train_texts,
                    vocab_size=int(cfg.get("vocab_size", 2000)),
                    style=_tokenizer_style(cfg["model_type"]),
                    model_max_length=int(cfg.get("max_position_embeddings", 512)),
                )
            )
        cfg["vocab_size"] = len(tokenizer)
        cfg["pad_token_id"] = tokenizer.pad_token_id
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(tokenizer, name, None)
            if value is not None and cfg.get("model_type") not in _ENCODER_MODEL_TYPES:
                cfg[name] = value
        encoder = _encoder_from_backbone(cfg, model_args, projection_dim, **loader)
    else:
        raise ValueError(
            "set model_args.model_name_or_path (a backbone or hf_mlcl encoder) or model_args.backbone_config"
        )
    from hf_mlcl.data.tokenizer import ensure_pad_token, portable_tokenizer

    tokenizer = portable_tokenizer(tokenizer)  # saved under a class name transformers 4.x reads, too
    ensure_pad_token(tokenizer)  # the one pad-token policy (Llama-3 reserved pad, else EOS)
    backbone_cfg = getattr(getattr(encoder, "backbone", None), "config", None)
    if backbone_cfg is not None and getattr(backbone_cfg, "pad_token_id", None) is None:
        backbone_cfg.pad_token_id = tokenizer.pad_token_id  # Llama has no pad token by default
    if label_names is not None:
        encoder.config.id2label = {i: n for i, n in enumerate(label_names)}
        encoder.config.label2id = {n: i for i, n in enumerate(label_names)}
    return tokenizer, encoder


def segment_multiple(model) -> int | None:
    """The multiple token sequences must be padded to for ``model``: its chunk size when it reads long
    documents as fixed-size segments (PLM-ICD, Huang et al. 2022, sec. 3.1), else None."""
    cfg = getattr(model, "config", None)
    return int(cfg.chunk_size) if cfg is not None and getattr(cfg, "segmented", False) else None


def backbone_config_dict(model_args: Any, source: str | None = None) -> dict | None:
    """The backbone's config as a dict, read without loading weights: ``model_args.backbone_config``, or the
    ``config.json`` of the folder ``source`` (or ``model_name_or_path``) names (an hf_mlcl folder's backbone config,
    an adapter folder's base model), or transformers' ``AutoConfig`` of a Hub id. None where it cannot be read."""
    path = source or model_args.model_name_or_path
    if not path:
        return dict(model_args.backbone_config) if model_args.backbone_config else None
    try:
        if os.path.isdir(path):
            from .folders_mlcl import ADAPTER_CONFIG_NAME

            config_file = os.path.join(path, "config.json")
            if not os.path.isfile(config_file) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG_NAME)):
                base = adapter_base(path)
                return backbone_config_dict(model_args, base) if base and base != path else None
            with open(config_file, encoding="utf-8") as fh:
                config = json.load(fh)
            return config.get("backbone_config") if config.get("model_type") == "mlcl" else config
        from transformers import AutoConfig

        return AutoConfig.from_pretrained(path, trust_remote_code=model_args.trust_remote_code).to_dict()
    except (OSError, ValueError):
        return None


def adapter_encoder(path: str | None) -> bool:
    """True when ``path`` is an encoder folder saved as a LoRA adapter (``save_lora_adapter``)."""
    from .folders_mlcl import ADAPTER_CONFIG_NAME

    return bool(path) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG_NAME))


def with_lora(model: Any, model_args: Any) -> Any:
    """``model`` wrapped by ``hf_mlcl.modeling.apply_lora`` with the recipe's LoRA settings (our heads in
    ``modules_to_save``). Activation checkpointing is the Trainer's to switch on (its ``activation_checkpointing``
    and ``activation_checkpointing_kwargs`` reach the wrapped model when training starts)."""
    from .lora import apply_lora

    return apply_lora(
        model,
        r=model_args.lora_r,
        alpha=model_args.lora_alpha,
        dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        gradient_checkpointing=False,
    )


def probe_model(encoder: Any, model_args: Any, label_names: Sequence[str], probe: str):
    """The stage-2 classifier on ``encoder`` (``MLCLForMultiLabelClassification.from_encoder``): a LoRA encoder
    is merged first for a fine-tune or with ``merge_lora`` (a frozen one keeps a loaded adapter unmerged); ``probe`` ``"linear"`` / ``"logistic"`` freeze the encoder, ``"finetune"`` trains it,
    with ``model_args.use_lora`` as LoRA adapters + the classifier head (the backbone stays frozen)."""
    from .lora import merge_lora
    from .modeling_mlcl import MLCLForMultiLabelClassification

    wrapped = hasattr(encoder, "merge_and_unload") or hasattr(
        getattr(encoder, "backbone", None), "merge_and_unload"
    )
    if (
        wrapped or probe == "finetune" or model_args.merge_lora
    ):  # a frozen encoder keeps a loaded adapter unmerged
        encoder = merge_lora(encoder)
    model = MLCLForMultiLabelClassification.from_encoder(
        encoder,
        id2label=list(label_names),
        head=model_args.head,
        freeze_encoder=probe in ("linear", "logistic"),
        chunk_size=model_args.chunk_size,
    )
    if (
        model_args.use_lora and probe == "finetune"
    ):  # adapters + classifier head train; the backbone stays frozen
        model = with_lora(model, model_args)
    return model


def align_special_tokens(model: Any, tokenizer: Any) -> None:
    """The model config's pad / bos / eos ids set to the tokenizer's, where the tokenizer defines them,
    before the Trainer is built: what ``Trainer`` otherwise aligns itself, with a notice in every stage
    (transformers' ``align_special_tokens``; a config that lists several ids keeps them)."""
    config = model.config.get_text_config()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        current = getattr(config, name, None)
        if value is None or value == current or (isinstance(current, list) and value in current):
            continue
        setattr(config, name, [value, *current] if isinstance(current, list) else value)
