"""hf_mlcl models in the ecosystem's own formats: encoders as sentence-transformers folders (written and read),
classifiers with a native head as the backbone family's ``XForSequenceClassification`` (their keys, and read).

Layout and choices: docs/usage.md, "Saved models". Bundled into the remote code with ``modeling_mlcl.py``, so it
imports only the standard library, ``torch``, ``transformers`` and ``safetensors``, never ``hf_mlcl``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModel, AutoModelForSequenceClassification

from .configuration_mlcl import NATIVE_HEAD_POOLING, backbone_config_to_dict
from .folders_mlcl import apply_adapter

__all__ = [
    "DENSE_DIRS",
    "EMBEDDINGS",
    "MLCL_FILE",
    "NATIVE_FILES",
    "NativeFolder",
    "CLASSIFIER_SETTINGS",
    "classifier_key_rules",
    "load_native_classifier",
    "load_classifier_folder",
    "load_peft_classifier",
    "LABEL_SETTINGS",
    "PEFT",
    "peft_head_modules",
    "load_native_encoder",
    "native_classifier_reason",
    "SENTENCE_TRANSFORMERS",
    "write_classifier_files",
    "classifier_settings",
    "write_json",
    "native_classifier_class",
    "rename_keys",
    "POOLING_DIR",
    "native_encoder_reason",
    "write_sentence_transformers_files",
]

MLCL_FILE = "mlcl_config.json"
POOLING_DIR = "1_Pooling"
DENSE_DIRS = ("2_Dense", "3_Dense")
# an encoder folder's sentence embeddings, each with the modules its modules.json lists: Transformer and Pooling,
# then for the projected one the projection head's two Dense modules
_LISTED = {"pooled": 2, "projected": 4}
EMBEDDINGS = tuple(_LISTED)
_ST_POOLING_KEYS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "last_token": "pooling_mode_lasttoken",
}
_ST_POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)
SENTENCE_TRANSFORMERS = "sentence-transformers"  # a native folder's layout (mlcl_config.json "layout")
TRANSFORMERS = (
    "transformers"  # a classifier with a native head: its family's XForSequenceClassification folder
)
PEFT = "peft"  # a LoRA classifier with a native head: a PEFT adapter of task type SEQ_CLS over its family's class
LABEL_SETTINGS = ("id2label", "label2id", "problem_type", "decision_threshold")
_ST_MODULES = (
    "sentence_transformers.models.Transformer",
    "sentence_transformers.models.Pooling",
    "sentence_transformers.models.Dense",
    "sentence_transformers.models.Dense",
)
# what an encoder folder is read from beside its settings and its backbone: the adapter and the projection head
NATIVE_FILES = ("adapter_model.safetensors", *(f"{d}/model.safetensors" for d in DENSE_DIRS))
_SETTINGS = (
    "pooling",
    "projection_dim",
    "projection_hidden_dim",
    "chunk_size",
    "backbone_name_or_path",
    "id2label",
    "label2id",
)


def base_dtype(config: Any) -> str | None:
    """The dtype an adapter folder's base model loads in (``mlcl_config.json`` ``dtype``, and sentence-transformers'
    ``model_args``): the one the backbone trained in, recorded by ``save_pretrained`` in the ``MLCLConfig``; a base
    stored in another dtype (float32 weights trained cast to bfloat16) would otherwise reload as another model."""
    dtype = getattr(config, "dtype", None)
    return str(dtype).removeprefix("torch.") if dtype is not None else None


def native_encoder_reason(config: Any) -> str | None:
    """Why an encoder with this ``MLCLConfig`` has no sentence-transformers form, or None when it has one."""
    if config.segmented:
        return "it encodes documents as segments (PLM-ICD), which sentence-transformers' Transformer module cannot"
    return None


def write_json(path: str, data: Any) -> None:
    """``data`` as indented JSON at ``path`` (its folder made where missing)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2)
        fh.write("\n")


def _modules_list(listed: int) -> list[dict[str, Any]]:
    """``modules.json``'s entries for the first ``listed`` modules: Transformer, Pooling, the two Dense."""
    paths = ("", POOLING_DIR, *DENSE_DIRS)[:listed]
    return [
        {"idx": i, "name": str(i), "path": path, "type": kind}
        for i, (path, kind) in enumerate(zip(paths, _ST_MODULES))
    ]


def listed_modules(embedding: str) -> list[dict[str, Any]]:
    """``modules.json`` of an encoder folder whose sentence embedding is ``embedding`` (``EMBEDDINGS``)."""
    if embedding not in EMBEDDINGS:
        raise ValueError(f"embedding must be one of {EMBEDDINGS}; got {embedding!r}")
    return _modules_list(_LISTED[embedding])


def _write_modules(
    folder: str,
    pooling: str,
    hidden: int,
    dense: list[tuple[str, torch.Tensor, torch.Tensor, str]],
    listed: int,
    max_seq_length: int | None,
    dtype: str | None = None,
) -> None:
    """The sentence-transformers files of a folder whose backbone is (or will be) saved there in its own
    architecture: ``1_Pooling`` with hf_mlcl's ``pooling`` of ``hidden`` states, each ``(directory, weight, bias,
    activation)`` of ``dense`` as a ``Dense`` module, ``modules.json`` listing the first ``listed`` modules, and the
    configs (truncation at ``max_seq_length``; the backbone loaded in ``dtype`` where given)."""
    config = {key: False for key in _ST_POOLING_MODES}
    config.update(word_embedding_dimension=hidden, include_prompt=True)
    config[_ST_POOLING_KEYS[pooling]] = True
    write_json(os.path.join(folder, POOLING_DIR, "config.json"), config)
    for directory, weight, bias, activation in dense:
        write_json(
            os.path.join(folder, directory, "config.json"),
            {
                "in_features": int(weight.shape[1]),
                "out_features": int(weight.shape[0]),
                "bias": True,
                "activation_function": activation,
            },
        )
        tensors = {"linear.weight": weight, "linear.bias": bias}
        tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
        save_file(tensors, os.path.join(folder, directory, "model.safetensors"), metadata={"format": "pt"})
    write_json(os.path.join(folder, "modules.json"), _modules_list(listed))
    st_config: dict[str, Any] = {"max_seq_length": max_seq_length, "do_lower_case": False}
    if dtype is not None:
        st_config["model_args"] = {"dtype": dtype}  # the name every sentence-transformers release reads
    write_json(os.path.join(folder, "sentence_bert_config.json"), st_config)
    write_json(
        os.path.join(folder, "config_sentence_transformers.json"),
        {
            "__version__": {"pytorch": torch.__version__},
            "prompts": {},
            "default_prompt_name": None,
            "similarity_fn_name": "cosine",
        },
    )


def write_sentence_transformers_files(
    folder: str,
    config: Any,
    projection_head: Mapping[str, torch.Tensor],
    max_seq_length: int | None = None,
    embedding: str = "pooled",
    backbone_config: Mapping[str, Any] | None = None,
) -> None:
    """Write the sentence-transformers files of an encoder whose backbone is (or will be) saved in ``folder`` in
    its own architecture (``config.json`` + weights, or a PEFT adapter).

    Args:
        folder: the model folder.
        config: the encoder's ``MLCLConfig``.
        projection_head: the projection head's weights (``dense.*``, ``out_proj.*``).
        max_seq_length: the length the encoder was trained at; sentence-transformers truncates there.
        embedding: ``"pooled"`` (the pooled backbone output, the representation the papers keep after stage 1)
            or ``"projected"`` (pooled, then the projection head as two ``Dense`` modules) as the folder's
            sentence embedding. Both Dense modules are written either way; hf_mlcl reads them back.
        backbone_config: the backbone's config dict, kept for a folder without ``config.json`` (an adapter).

    Raises:
        ValueError: an unknown ``embedding`` or an encoder without a sentence-transformers form.
    """
    if embedding not in EMBEDDINGS:
        raise ValueError(f"embedding must be one of {EMBEDDINGS}; got {embedding!r}")
    reason = native_encoder_reason(config)
    if reason is not None:
        raise ValueError(f"this encoder has no sentence-transformers form: {reason}")
    activations = ("torch.nn.modules.activation.ReLU", "torch.nn.modules.linear.Identity")
    dense = [
        (directory, projection_head[f"{layer}.weight"], projection_head[f"{layer}.bias"], activation)
        for directory, layer, activation in zip(DENSE_DIRS, ("dense", "out_proj"), activations)
    ]
    hidden = int(projection_head["dense.weight"].shape[1])
    dtype = base_dtype(config) if backbone_config is not None else None
    _write_modules(folder, config.pooling, hidden, dense, _LISTED[embedding], max_seq_length, dtype)
    settings = {"kind": "encoder", **{key: getattr(config, key) for key in _SETTINGS}}
    settings.update(embedding=embedding, max_seq_length=max_seq_length)
    if backbone_config is not None:
        settings.update(backbone_config=dict(backbone_config), dtype=dtype)
    write_json(os.path.join(folder, MLCL_FILE), settings)


def native_classifier_reason(config: Any) -> str | None:
    """Why a classifier with this ``MLCLConfig`` has no sentence-transformers form (only a ``linear`` head on a
    pooled representation has one), or None when it has one."""
    if config.head != "linear":
        return f"its head is {config.head!r}, not a linear layer on a pooled representation"
    return native_encoder_reason(config)


def write_classifier_files(
    folder: str,
    config: Any,
    classifier: Mapping[str, torch.Tensor],
    max_seq_length: int | None = None,
    backbone_config: Mapping[str, Any] | None = None,
) -> None:
    """Write the sentence-transformers files of a classifier with a ``linear`` head whose backbone is (or will
    be) saved in ``folder`` in its own architecture: its pooling, then the head as a ``Dense`` module with a
    sigmoid, so ``SentenceTransformer(folder).encode(texts)`` gives each label's probability; the labels, the
    tuned decision threshold and hf_mlcl's settings in ``mlcl_config.json``.

    Args:
        folder: the model folder.
        config: the classifier's ``MLCLConfig``.
        classifier: the head's weights (``weight`` (L, H), ``bias`` (L,)).
        max_seq_length: the length the classifier was trained at; sentence-transformers truncates there.
        backbone_config: the backbone's config dict, kept for a folder without ``config.json`` (an adapter).

    Raises:
        ValueError: a classifier without this form (:func:`native_classifier_reason`).
    """
    reason = native_classifier_reason(config)
    if reason is not None:
        raise ValueError(f"this classifier has no sentence-transformers form: {reason}")
    weight = classifier["weight"]
    dense = [(DENSE_DIRS[0], weight, classifier["bias"], "torch.nn.modules.activation.Sigmoid")]
    dtype = base_dtype(config) if backbone_config is not None else None
    _write_modules(folder, config.pooling, int(weight.shape[1]), dense, 3, max_seq_length, dtype)
    settings = classifier_settings(config, SENTENCE_TRANSFORMERS, max_seq_length, backbone_config)
    write_json(os.path.join(folder, MLCL_FILE), settings)


def classifier_settings(
    config: Any, layout: str, max_seq_length: int | None, backbone_config: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The ``mlcl_config.json`` of a classifier folder in ``layout``: its labels, tuned threshold and hf_mlcl's
    settings, the training length and, for a folder without ``config.json`` (an adapter), the backbone's config and
    the dtype its base loads in (:func:`base_dtype`)."""
    settings = {"kind": "classifier", "layout": layout, "max_seq_length": max_seq_length}
    settings.update({key: getattr(config, key, None) for key in (*LABEL_SETTINGS, *CLASSIFIER_SETTINGS)})
    if backbone_config is not None:
        settings.update(backbone_config=dict(backbone_config), dtype=base_dtype(config))
    return settings


CLASSIFIER_SETTINGS = (
    "head",
    "pooling",
    "classifier_dropout",
    "freeze_encoder",
    "chunk_size",
    "backbone_name_or_path",
)


def native_classifier_class(model_type: str) -> Any:
    """The transformers ``XForSequenceClassification`` class of a backbone family."""
    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES

    return getattr(transformers, MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES[model_type])


def classifier_key_rules(model_type: str) -> list[tuple[str, str]]:
    """``(hf_mlcl prefix, native prefix)`` pairs that rename a native-head classifier's state dict into its
    family's ``XForSequenceClassification`` one (the first matching prefix applies): the backbone under the
    class's base-model prefix; BERT's pooler stays in the backbone and the linear layer is its ``classifier``;
    RoBERTa's pooler dense is its head's ``classifier.dense`` and the linear layer its ``out_proj``; a decoder's
    linear layer is its ``score``."""
    prefix = native_classifier_class(model_type).base_model_prefix
    if NATIVE_HEAD_POOLING[model_type] == "last_token":
        return [("backbone.", f"{prefix}."), ("classifier.", "score.")]
    if model_type == "bert":
        return [("backbone.", f"{prefix}."), ("classifier.", "classifier.")]
    return [
        ("backbone.pooler.dense.", "classifier.dense."),
        ("backbone.", f"{prefix}."),
        ("classifier.", "classifier.out_proj."),
    ]


def rename_keys(state: Mapping[str, torch.Tensor], rules: list[tuple[str, str]]) -> dict[str, torch.Tensor]:
    """``state`` with each key's first matching prefix of ``rules`` replaced; ValueError for a key none matches."""
    out = {}
    for key, value in state.items():
        for old, new in rules:
            if key.startswith(old):
                out[new + key[len(old) :]] = value
                break
        else:
            raise ValueError(
                f"{key} has no place in the native classifier (prefixes {[r[0] for r in rules]})"
            )
    return out


def load_native_classifier(cls: Any, path: str, settings: Mapping[str, Any], kwargs: Mapping[str, Any]):
    """An ``MLCLForMultiLabelClassification`` (``cls``) with a native head from its family's
    ``XForSequenceClassification`` folder (weights renamed by :func:`classifier_key_rules`, reversed).

    Args:
        cls: the classifier class.
        path: the folder or Hub id.
        settings: its ``mlcl_config.json``.
        kwargs: ``from_pretrained``'s keywords (``dtype``, ``revision``, ``token`` ...).

    Returns:
        The classifier in eval mode.
    """
    loader = {k: v for k, v in kwargs.items() if k not in ("config", "output_loading_info")}
    native = AutoModelForSequenceClassification.from_pretrained(path, **loader)
    labels = {k: getattr(native.config, k) for k in ("id2label", "label2id", "problem_type")}
    threshold = getattr(native.config, "decision_threshold", None)
    config = cls.config_class(
        backbone_config=backbone_config_to_dict(native.config),
        **labels,
        **({"decision_threshold": threshold} if threshold is not None else {}),
        **{key: settings[key] for key in CLASSIFIER_SETTINGS if settings.get(key) is not None},
    )
    config._attn_implementation = native.config._attn_implementation  # as asked (build_backbone hands it on)
    model = cls(config).to(native.dtype)
    rules = [(new, old) for old, new in classifier_key_rules(native.config.model_type)]
    model.load_state_dict(rename_keys(native.state_dict(), rules), strict=True)
    model.to(native.device)
    return model.eval()


@dataclass(frozen=True)
class NativeFolder:
    """A native folder as its loaders read it (:func:`load_native_encoder`, :func:`load_classifier_folder`,
    :func:`load_peft_classifier`).

    Args:
        path: the folder or Hub id.
        settings: its ``mlcl_config.json``.
        files: the local copies of :data:`NATIVE_FILES` and of ``adapter_config.json`` (None where absent). With
            an adapter the base model it names is loaded and the adapter applied unmerged (transformers'
            ``load_adapter``), so a bf16 base keeps every update of its fp32 adapter.
        hub: the folder's Hub keywords (revision, cache, token).
        kwargs: ``from_pretrained``'s keywords (``dtype``, ``revision``, ``token`` ...), for the backbone.
    """

    path: str
    settings: Mapping[str, Any]
    files: Mapping[str, str | None]
    hub: Mapping[str, Any]
    kwargs: Mapping[str, Any]

    def adapter_base(self) -> str:
        """The base model the folder's ``adapter_config.json`` names; ValueError when it names none."""
        with open(self.files["adapter_config.json"], encoding="utf-8") as fh:
            base = json.load(fh).get("base_model_name_or_path")
        if not base:
            raise ValueError(f"{self.path}/adapter_config.json names no base model (base_model_name_or_path)")
        return base

    def dense(self, directory: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(weight, bias) of the folder's ``directory`` Dense module; ValueError when it is missing."""
        local = self.files.get(f"{directory}/model.safetensors")
        if local is None:
            raise ValueError(
                f"{self.path} has no {directory}/model.safetensors: its head's weights are missing"
            )
        tensors = load_file(local)
        return tensors["linear.weight"], tensors["linear.bias"]


def _native_model(
    cls: Any, folder: NativeFolder, config: Mapping[str, Any], load_head: Callable[[Any], None]
) -> Any:
    """``cls`` configured by ``config`` on the backbone of a sentence-transformers ``folder``: the backbone saved
    in it, or the base model its ``adapter_config.json`` names with the adapter applied once the model is built;
    its head loaded by ``load_head(model)``. In eval mode, on the backbone's device."""
    loader = {k: v for k, v in folder.kwargs.items() if k not in ("config", "output_loading_info")}
    source = folder.path
    adapter = folder.files.get("adapter_config.json") is not None
    if adapter:
        source = folder.adapter_base()
        loader.pop("revision", None)  # the adapter's revision, not the base model's
        loader.setdefault("dtype", folder.settings.get("dtype") or "auto")  # the dtype it trained in
    backbone = AutoModel.from_pretrained(source, **loader)
    model = cls(_config_on(cls, backbone, config), backbone=backbone)
    if adapter:
        apply_adapter(model.backbone, folder.path, folder.files["adapter_model.safetensors"], folder.hub)
    load_head(model)
    model.to(next(backbone.parameters()).device)
    return model.eval()


def load_native_encoder(cls: Any, folder: NativeFolder) -> Any:
    """An ``MLCLEncoder`` (``cls``) from a native encoder ``folder``.

    Returns:
        The encoder in eval mode.
    """

    def load_head(model: Any) -> None:
        head = {}
        for layer, directory in zip(("dense", "out_proj"), DENSE_DIRS):
            head[f"{layer}.weight"], head[f"{layer}.bias"] = folder.dense(directory)
        model.projection_head.load_state_dict(head)

    config = {key: folder.settings[key] for key in _SETTINGS if folder.settings.get(key) is not None}
    return _native_model(cls, folder, config, load_head)


def _config_on(cls: Any, backbone: Any, config: Mapping[str, Any]) -> Any:
    """The ``MLCLConfig`` of ``cls`` on ``backbone`` with the folder's settings ``config``."""
    return cls.config_class(backbone_config=backbone_config_to_dict(backbone.config), **config)


def _labels(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The label settings of a classifier folder's ``mlcl_config.json`` (``id2label`` keyed by int)."""
    labels = {key: settings[key] for key in LABEL_SETTINGS if settings.get(key) is not None}
    if "id2label" in labels:
        labels["id2label"] = {int(k): v for k, v in labels["id2label"].items()}
    return labels


def _classifier_settings(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The config keywords of a classifier folder's ``mlcl_config.json``: its labels and classifier settings."""
    labels = _labels(settings)
    return {**labels, **{key: settings[key] for key in CLASSIFIER_SETTINGS if settings.get(key) is not None}}


def load_classifier_folder(cls: Any, folder: NativeFolder) -> Any:
    """An ``MLCLForMultiLabelClassification`` (``cls``) with a ``linear`` head from its sentence-transformers
    ``folder`` (:func:`write_classifier_files`).

    Returns:
        The classifier in eval mode.
    """

    def load_head(model: Any) -> None:
        weight, bias = folder.dense(DENSE_DIRS[0])
        model.classifier.load_state_dict({"weight": weight, "bias": bias})

    return _native_model(cls, folder, _classifier_settings(folder.settings), load_head)


def peft_head_modules(model_type: str) -> list[str] | None:
    """The modules a PEFT ``SEQ_CLS`` adapter saves whole (``modules_to_save``) for a native-head LoRA classifier
    of this family: the linear layer, which is all the head holds apart from the backbone (a decoder's ``score``,
    BERT's ``classifier`` on its own pooler); None where the family's head holds more (RoBERTa's head holds the
    pooler's dense, which an adapter over the base would lack)."""
    if NATIVE_HEAD_POOLING.get(model_type) == "last_token":
        return ["score"]
    return ["classifier"] if model_type == "bert" else None


def load_peft_classifier(cls: Any, folder: NativeFolder) -> Any:
    """An ``MLCLForMultiLabelClassification`` (``cls``) with a native head from a PEFT ``SEQ_CLS`` adapter
    ``folder``: the base model it names as its family's ``XForSequenceClassification``, the adapter applied
    unmerged with its weights in float32 as saved (transformers' ``load_adapter``, which needs peft), the head
    from the adapter's saved modules.

    Returns:
        The classifier in eval mode.
    """
    path, settings, files = folder.path, folder.settings, folder.files
    loader = {
        k: v for k, v in folder.kwargs.items() if k not in ("config", "output_loading_info", "revision")
    }
    base = folder.adapter_base()
    loader.setdefault("dtype", settings.get("dtype") or "auto")  # the dtype it trained in
    model_type = settings["backbone_config"]["model_type"]
    labels = _labels(settings)
    pad = settings["backbone_config"].get("pad_token_id")
    shape = {key: labels[key] for key in ("id2label", "label2id", "problem_type") if key in labels}
    native = native_classifier_class(model_type).from_pretrained(base, **shape, pad_token_id=pad, **loader)
    apply_adapter(native, path, files["adapter_model.safetensors"], folder.hub)
    backbone = getattr(native, native.base_model_prefix)
    model = cls(_config_on(cls, backbone, _classifier_settings(settings)), backbone=backbone)
    rules = [(new, old) for old, new in classifier_key_rules(model_type) if old == "classifier."]
    # the head as saved (float32), not the copy peft made in the base's dtype
    saved = load_file(files["adapter_model.safetensors"])
    head = {k.removeprefix("base_model.model."): v for k, v in saved.items() if "lora_" not in k}
    model.classifier.load_state_dict(
        {k.removeprefix("classifier."): v for k, v in rename_keys(head, rules).items()}
    )
    model.to(next(backbone.parameters()).device)
    return model.eval()
