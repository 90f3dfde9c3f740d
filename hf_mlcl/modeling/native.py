"""hf_mlcl models saved in the ecosystem's own formats: an encoder as a sentence-transformers folder, a classifier
with a native head as its family's transformers classifier (docs/usage.md, "Saved models")."""

from __future__ import annotations

import copy
import json
import os
import shutil
from collections.abc import Callable
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from hf_mlcl.files import atomic_path

from .configuration_mlcl import MLCLConfig
from .folders_mlcl import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    HEADS_WEIGHTS_NAME,
    save_folder_atomically,
)
from .native_mlcl import native_encoder_reason, write_sentence_transformers_files

__all__ = ["save_native", "set_sentence_embedding", "to_native_classifier", "to_sentence_transformers"]

_INDEX_NAME = "model.safetensors.index.json"
_BACKBONE = "backbone."
_HEAD = "projection_head."
_CLASSIFIER = "classifier."
_PEFT_MODEL = "base_model.model."  # PEFT's prefix of the wrapped model's keys


def _saved_state(folder: str) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's ``model.safetensors`` (or of the shards its index lists), in its saved dtype."""
    index = os.path.join(folder, _INDEX_NAME)
    if not os.path.isfile(index):
        return load_file(os.path.join(folder, HEADS_WEIGHTS_NAME))
    with open(index, encoding="utf-8") as fh:
        shards = sorted(set(json.load(fh)["weight_map"].values()))
    return {k: v for shard in shards for k, v in load_file(os.path.join(folder, shard)).items()}


def _write_backbone(folder: str, config: MLCLConfig, state: dict[str, torch.Tensor]) -> None:
    """The backbone in its own architecture: ``config.json`` (with ``architectures`` and the weights' dtype) and
    ``model.safetensors`` keyed as the backbone's own state dict."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    backbone_config = config.get_backbone_config()
    architecture = MODEL_MAPPING_NAMES.get(backbone_config.model_type)
    backbone_config.architectures = [architecture] if isinstance(architecture, str) else None
    floating = [v.dtype for v in state.values() if v.is_floating_point()]
    if floating:
        backbone_config.dtype = floating[0]
    backbone_config.save_pretrained(folder)
    save_file(state, os.path.join(folder, HEADS_WEIGHTS_NAME), metadata={"format": "pt"})


def _save_right_padded(tokenizer: Any, folder: str, max_length: int | None) -> None:
    """``tokenizer`` (when given) saved into ``folder`` padding on the right: consumers number positions from
    the first token, which for a decoder gives hf_mlcl's states only without left padding. With ``max_length``
    (the length the model was trained at), its ``model_max_length`` too: a pipeline or a tokenizer called with
    ``truncation=True`` cuts where hf_mlcl's training and ``predict`` did."""
    if tokenizer is not None:
        right = copy.deepcopy(tokenizer)
        right.padding_side = "right"
        if max_length:
            right.model_max_length = int(max_length)
        right.save_pretrained(folder)


def _pad_a_native_head_tells_apart(tokenizer: Any, config: Any) -> tuple[Any, int | None]:
    """``(tokenizer, None)``, or where the tokenizer pads with the token it appends to every text (its EOS as
    the pad, an EOS appended) under ``last_token`` pooling, a copy padding with its UNK or BOS token and that
    id: a family's ``XForSequenceClassification`` pools the last token that is not the pad id, so it would read
    the token before the appended one where hf_mlcl pools the appended one (by the attention mask). ValueError
    (before anything is written) for a tokenizer with neither to pad with."""
    if (
        tokenizer is None
        or getattr(config, "pooling", None) != "last_token"
        or tokenizer.pad_token_id is None
    ):
        return tokenizer, None
    ids = tokenizer("a")["input_ids"]
    if not ids or ids[-1] != tokenizer.pad_token_id:
        return tokenizer, None
    pad = next(
        (i for i in (tokenizer.unk_token_id, tokenizer.bos_token_id) if i is not None and i != ids[-1]), None
    )
    if pad is None:
        raise ValueError(
            f"the tokenizer pads with {tokenizer.pad_token!r}, the token it appends to every text, and has no UNK "
            "or BOS token to pad with instead: the native classifier would pool the token before it; give the "
            "tokenizer another pad token (tokenizer.pad_token = ...) and save again"
        )
    other = copy.deepcopy(tokenizer)
    other.pad_token = tokenizer.convert_ids_to_tokens(pad)
    return other, pad


def _source_tokenizer(folder: str, tokenizer: Any, target: str | None, max_length: int | None = None) -> Any:
    """``tokenizer``; given none, the tokenizer saved in ``folder`` (None where it has none) for a new folder
    ``target``, so that it loads on its own, and for a rewrite in place with ``max_length``, so that its
    ``model_max_length`` becomes the length the new form truncates at (hf_mlcl's ``encode`` reads it)."""
    in_place = target is None or os.path.abspath(target) == os.path.abspath(folder)
    if tokenizer is not None or (in_place and not max_length):
        return tokenizer
    from .builders import holds_a_tokenizer

    if not holds_a_tokenizer(folder):
        return None
    from transformers import AutoTokenizer

    from hf_mlcl.data.tokenizer import portable_tokenizer

    return portable_tokenizer(AutoTokenizer.from_pretrained(folder))


def _remove_hf_mlcl_files(folder: str, *extra: str) -> None:
    """Remove the remote-code files (and ``extra`` names) a native folder no longer needs, where present."""
    for name in ("configuration_mlcl.py", "modeling_mlcl.py", *extra):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            os.remove(path)


def _mlcl_config(folder: str, kind: str) -> MLCLConfig:
    """The ``MLCLConfig`` of the hf_mlcl folder ``folder`` holding an ``MLCLEncoder`` (``kind`` "encoder") or an
    ``MLCLForMultiLabelClassification`` ("classifier"); ValueError naming what the folder holds otherwise."""
    from .builders import stored_config
    from .native_mlcl import MLCL_FILE

    wanted = {"encoder": "MLCLEncoder", "classifier": "MLCLForMultiLabelClassification"}[kind]
    stored = stored_config(folder)
    if stored.get("model_type") != MLCLConfig.model_type:
        native = os.path.isfile(os.path.join(folder, MLCL_FILE))
        raise ValueError(
            f"{folder} is already in its native form ({MLCL_FILE}): nothing to convert"
            if native
            else f"{folder} holds no hf_mlcl model (its config.json has no model_type {MLCLConfig.model_type!r})"
        )
    held = (stored.get("architectures") or [wanted])[0]
    if held != wanted:
        fix = "to_sentence_transformers" if held == "MLCLEncoder" else "to_native_classifier"
        raise ValueError(f"{folder} holds an {held}, not an {wanted}: convert it with {fix}")
    return MLCLConfig.from_pretrained(folder)


def to_sentence_transformers(
    folder: str,
    max_seq_length: int | None = None,
    embedding: str = "pooled",
    tokenizer: Any = None,
    target: str | None = None,
) -> bool:
    """Rewrite the encoder folder ``save_pretrained`` or ``save_lora_model`` wrote as a sentence-transformers
    model folder: the backbone in its own architecture (or the PEFT adapter over its base), ``modules.json``,
    ``1_Pooling``, the projection head as ``2_Dense`` / ``3_Dense``, and hf_mlcl's settings in
    ``mlcl_config.json``; the remote-code files go.

    Args:
        folder: the encoder folder (``model_type`` mlcl in its ``config.json``).
        max_seq_length: the token length the encoder was trained at.
        embedding: the folder's sentence embedding, ``"pooled"`` or ``"projected"``
            (:func:`~hf_mlcl.modeling.native_mlcl.write_sentence_transformers_files`).
        tokenizer: the encoder's tokenizer, saved into the folder padding on the right: consumers number
            positions from the first token, which for a decoder gives hf_mlcl's states only without left padding.
        target: write the new folder there instead (``folder`` is then only read; without ``tokenizer``, the
            one saved in ``folder`` goes with it); default: ``folder``.

    Returns:
        True when written; False (nothing written) for an encoder that has no such form (a segmented PLM-ICD
        encoder), which keeps the remote-code format.

    Raises:
        ValueError: ``folder`` holds no hf_mlcl encoder (a classifier, another model, a folder already
            converted), or ``embedding`` is not ``"pooled"`` or ``"projected"``.
    """
    config = _mlcl_config(folder, "encoder")
    tokenizer = _source_tokenizer(folder, tokenizer, target, max_seq_length)
    if native_encoder_reason(config) is not None:
        return False
    state = _saved_state(folder)
    head = {k[len(_HEAD) :]: v for k, v in state.items() if k.startswith(_HEAD)}

    def files(tmp: str, backbone_config: dict | None) -> None:
        write_sentence_transformers_files(tmp, config, head, max_seq_length, embedding, backbone_config)

    _write_st_folder(folder, config, state, files, tokenizer, target, max_seq_length)
    return True


def set_sentence_embedding(folder: str, embedding: str) -> None:
    """Choose the sentence embedding of an encoder folder already in its sentence-transformers form (what
    ``hf-mlcl run`` writes): ``"pooled"`` (the default, the representation the papers keep) or ``"projected"``
    (then the projection head, the space the contrastive loss was computed in). Rewrites ``modules.json`` and
    ``mlcl_config.json``; the weights stay.

    Args:
        folder: the encoder folder (``mlcl_config.json`` of kind encoder, sentence-transformers layout).
        embedding: ``"pooled"`` or ``"projected"``.

    Raises:
        ValueError: an unknown ``embedding``, or a folder that is no sentence-transformers encoder hf_mlcl wrote
            (an hf_mlcl-format folder: :func:`to_sentence_transformers` takes ``embedding`` itself).

    Example:
        >>> set_sentence_embedding("outputs/my_csv/encoder", "projected")  # doctest: +SKIP
        >>> SentenceTransformer("outputs/my_csv/encoder").encode(texts)  # the projected vectors  # doctest: +SKIP
    """
    from hf_mlcl.files import atomic_write_text

    from .builders import native_settings
    from .native_mlcl import MLCL_FILE, SENTENCE_TRANSFORMERS, listed_modules

    modules = listed_modules(embedding)  # the embedding checked first
    settings = native_settings(folder)
    layout = (settings or {}).get("layout", SENTENCE_TRANSFORMERS)
    if not settings or settings.get("kind") != "encoder" or layout != SENTENCE_TRANSFORMERS:
        raise ValueError(
            f"{folder} holds no sentence-transformers encoder hf_mlcl wrote (no {MLCL_FILE} of kind encoder); "
            "an hf_mlcl-format encoder folder takes the embedding in to_sentence_transformers(folder, embedding=...)"
        )
    settings["embedding"] = embedding
    atomic_write_text(os.path.join(folder, "modules.json"), json.dumps(modules, indent=2) + "\n")
    atomic_write_text(os.path.join(folder, MLCL_FILE), json.dumps(settings, indent=2) + "\n")


def _write_st_folder(
    folder: str,
    config: MLCLConfig,
    state: dict[str, torch.Tensor],
    files: Callable[[str, dict | None], None],
    tokenizer: Any,
    target: str | None,
    max_seq_length: int | None,
) -> None:
    """The sentence-transformers folder of the hf_mlcl folder ``folder`` (its ``config`` and saved ``state``):
    the backbone in its own architecture, or its PEFT adapter copied first (the folder never holds modules and
    settings without it); ``files(tmp, backbone_config)`` writes the modules and settings (``backbone_config``
    given for an adapter folder, which has no ``config.json``); the remote code goes."""
    adapter = os.path.isfile(os.path.join(folder, ADAPTER_CONFIG_NAME))

    def write(tmp: str) -> None:
        if not adapter:
            _write_backbone(
                tmp, config, {k[len(_BACKBONE) :]: v for k, v in state.items() if k.startswith(_BACKBONE)}
            )
        files(tmp, config.backbone_config if adapter else None)
        _save_right_padded(tokenizer, tmp, max_seq_length)

    target = folder if target is None else target
    os.makedirs(target, exist_ok=True)
    if adapter:
        for name in (ADAPTER_CONFIG_NAME, ADAPTER_WEIGHTS_NAME):
            if os.path.abspath(target) != os.path.abspath(folder):
                with atomic_path(os.path.join(target, name)) as tmp:
                    shutil.copyfile(os.path.join(folder, name), tmp)
    save_folder_atomically(target, write)  # also removes the heads' model.safetensors of an adapter folder
    # the remote code goes; so does an adapter folder's config.json, which would hide the base model it names
    _remove_hf_mlcl_files(target, *(("config.json",) if adapter else ()))


def to_native_classifier(
    folder: str, tokenizer: Any = None, target: str | None = None, max_seq_length: int | None = None
) -> bool:
    """Rewrite a classifier folder ``save_pretrained`` or a LoRA save wrote in its native form: with a
    ``"native"`` head as its backbone family's ``XForSequenceClassification`` folder (``problem_type``
    multi-label, ``id2label``, the tuned ``decision_threshold``), with a ``"linear"`` head as a
    sentence-transformers folder whose output is each label's probability (the backbone in its own architecture
    or a PEFT adapter, its pooling, the head as a ``Dense`` module with a sigmoid); hf_mlcl's settings go to
    ``mlcl_config.json`` and the remote-code files go.

    Args:
        folder: the classifier folder (``model_type`` mlcl in its ``config.json``).
        tokenizer: the classifier's tokenizer, saved into the folder padding on the right (as in
            :func:`to_sentence_transformers`).
        target: write the new folder there instead (``folder`` is then only read; without ``tokenizer``, the
            one saved in ``folder`` goes with it); default: ``folder``.
        max_seq_length: the token length the classifier was trained at (a sentence-transformers folder
            truncates there).

    Returns:
        True when written; False (nothing written) for a classifier without a native form (PLM-ICD's label
        attention; a native head saved as an adapter on a family whose head an adapter cannot hold, RoBERTa's).

    Raises:
        ValueError: ``folder`` holds no hf_mlcl classifier (an encoder, another model, a folder already
            converted).
    """
    from .native_mlcl import (
        MLCL_FILE,
        TRANSFORMERS,
        classifier_key_rules,
        classifier_settings,
        native_classifier_class,
        native_classifier_reason,
        rename_keys,
        write_classifier_files,
        write_json,
    )

    config = _mlcl_config(folder, "classifier")
    tokenizer = _source_tokenizer(folder, tokenizer, target)
    if native_classifier_reason(config) is None:
        state = _saved_state(folder)
        head = {k[len(_CLASSIFIER) :]: v for k, v in state.items() if k.startswith(_CLASSIFIER)}

        def files(tmp: str, backbone_config: dict | None) -> None:
            write_classifier_files(tmp, config, head, max_seq_length, backbone_config)

        _write_st_folder(folder, config, state, files, tokenizer, target, max_seq_length)
        return True
    if config.head != "native":
        return False
    if os.path.isfile(os.path.join(folder, ADAPTER_CONFIG_NAME)):
        return _to_peft_classifier(folder, config, tokenizer, target, max_seq_length)
    backbone_config = config.get_backbone_config()
    model_type = backbone_config.model_type
    cls = native_classifier_class(model_type)
    backbone_config.architectures = [cls.__name__]
    tokenizer, pad = _pad_a_native_head_tells_apart(tokenizer, config)
    if pad is not None:
        backbone_config.pad_token_id = pad
    for key in ("id2label", "label2id", "problem_type"):
        setattr(backbone_config, key, getattr(config, key))
    threshold = getattr(config, "decision_threshold", None)
    if threshold is not None:
        backbone_config.decision_threshold = threshold
    state = rename_keys(_saved_state(folder), classifier_key_rules(model_type))
    with torch.device("meta"):
        native = cls(backbone_config)
    native.load_state_dict(state, strict=True, assign=True)  # checks that every weight has its place
    settings = classifier_settings(config, TRANSFORMERS, max_seq_length)

    def write(tmp: str) -> None:
        native.save_pretrained(tmp)
        write_json(os.path.join(tmp, MLCL_FILE), settings)
        _save_right_padded(tokenizer, tmp, max_seq_length)

    target = folder if target is None else target
    save_folder_atomically(target, write)
    _remove_hf_mlcl_files(target)
    return True


def _to_peft_classifier(
    folder: str, config: MLCLConfig, tokenizer: Any, target: str | None, max_seq_length: int | None
) -> bool:
    """A LoRA classifier with a native head as a PEFT adapter of task type ``SEQ_CLS`` over its family's
    ``XForSequenceClassification``: the LoRA matrices keyed as in that class, the head as a saved module
    (``modules_to_save``), the labels, threshold and hf_mlcl's settings in ``mlcl_config.json``; no
    ``config.json``, so loaders read the base model the adapter names. False (nothing written) for a family
    whose head an adapter cannot hold (:func:`~hf_mlcl.modeling.native_mlcl.peft_head_modules`)."""
    from .native_mlcl import (
        MLCL_FILE,
        PEFT,
        classifier_key_rules,
        classifier_settings,
        native_classifier_class,
        peft_head_modules,
        rename_keys,
        write_json,
    )

    model_type = config.backbone_config["model_type"]
    saved = peft_head_modules(model_type)
    if saved is None:
        return False
    tokenizer, _ = _pad_a_native_head_tells_apart(tokenizer, config)  # loaders pass its pad id (usage.md)
    with open(os.path.join(folder, ADAPTER_CONFIG_NAME), encoding="utf-8") as fh:
        adapter_config = json.load(fh)
    adapter_config.update(task_type="SEQ_CLS", modules_to_save=saved)
    prefix = f"{_PEFT_MODEL}{native_classifier_class(model_type).base_model_prefix}."
    weights = {
        prefix + k.removeprefix(_PEFT_MODEL): v
        for k, v in load_file(os.path.join(folder, ADAPTER_WEIGHTS_NAME)).items()
    }
    heads = {k: v for k, v in _saved_state(folder).items() if k.startswith(_CLASSIFIER)}
    rules = [rule for rule in classifier_key_rules(model_type) if rule[0] == _CLASSIFIER]
    weights.update({_PEFT_MODEL + k: v for k, v in rename_keys(heads, rules).items()})
    settings = classifier_settings(config, PEFT, max_seq_length, config.backbone_config)

    def write(tmp: str) -> None:
        save_file(weights, os.path.join(tmp, ADAPTER_WEIGHTS_NAME), metadata={"format": "pt"})
        for name, data in ((ADAPTER_CONFIG_NAME, adapter_config), (MLCL_FILE, settings)):
            write_json(os.path.join(tmp, name), data)
        _save_right_padded(tokenizer, tmp, max_seq_length)

    target = folder if target is None else target
    save_folder_atomically(target, write)  # also removes the heads' model.safetensors
    _remove_hf_mlcl_files(target, "config.json")
    return True


def save_native(model: Any, folder: str, tokenizer: Any = None, max_seq_length: int | None = None) -> bool:
    """``model.save_pretrained(folder)`` (and the tokenizer), then, where the model has one, its native form in
    place: an ``MLCLEncoder`` as a sentence-transformers folder (:func:`to_sentence_transformers`), a classifier
    with ``head="native"`` as its family's ``XForSequenceClassification``, one with ``head="linear"`` as a
    sentence-transformers folder giving each label's probability (:func:`to_native_classifier`).

    Args:
        model: an ``MLCLEncoder`` or ``MLCLForMultiLabelClassification``.
        folder: where it goes.
        tokenizer: its tokenizer, saved with it.
        max_seq_length: the training length (sentence-transformers truncates there).

    Returns:
        True when the folder is in a native form; False when it keeps hf_mlcl's format (with remote code).

    Example::

        clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=names, head="native")
        save_native(clf, "out/classifier", tokenizer=tok)  # pipeline("text-classification", model=...)
    """
    from .modeling_mlcl import MLCLEncoder

    model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    if isinstance(model, MLCLEncoder):
        return to_sentence_transformers(folder, max_seq_length, tokenizer=tokenizer)
    return to_native_classifier(folder, tokenizer=tokenizer, max_seq_length=max_seq_length)
