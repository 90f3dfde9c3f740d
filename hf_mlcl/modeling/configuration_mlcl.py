"""Configuration of hf_mlcl encoders and classifiers.

This module is copied next to the weights by ``save_pretrained`` (Hub "remote code"), so it must stay
self-contained: it imports only the standard library and ``transformers``, never ``hf_mlcl``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from transformers import AutoConfig, AutoModel, PreTrainedConfig, PreTrainedModel

POOLINGS = ("cls", "mean", "last_token")
HEADS = ("linear", "label_attention", "native")
# head="native": the backbone families whose own sequence-classification head the classifier reproduces, and
# how that head pools: "pooler", the backbone's pooler (dense + tanh on the first token; RoBERTa's head holds the
# same dense + tanh) then a linear layer; "last_token", the last real token then a linear layer without bias
NATIVE_HEAD_POOLING = {
    **dict.fromkeys(("bert", "roberta", "xlm-roberta", "camembert"), "pooler"),
    **dict.fromkeys(("llama", "mistral", "qwen2", "qwen3"), "last_token"),
}

# Keys of a backbone config dict that describe the saving environment, not the architecture.
_VOLATILE_BACKBONE_KEYS = (
    "transformers_version",
    "_name_or_path",
    "id2label",
    "label2id",
    "dtype",
    "auto_map",
)


def backbone_config_to_dict(config: PreTrainedConfig) -> dict[str, Any]:
    """Serialise a backbone config to a JSON-ready dict (architecture only, ``model_type`` included)."""
    data = config.to_dict()
    for key in _VOLATILE_BACKBONE_KEYS:
        data.pop(key, None)
    data["model_type"] = config.model_type
    return data


class MLCLConfig(PreTrainedConfig):
    r"""Configuration of [`MLCLEncoder`] and [`MLCLForMultiLabelClassification`].

    The backbone is stored as a plain config dict (``backbone_config``, with ``model_type``), so a saved
    checkpoint rebuilds its backbone offline from ``config.json`` alone; ``backbone_name_or_path`` is
    provenance only and is never downloaded when a saved checkpoint is loaded.

    Args:
        backbone_name_or_path: Hub id / path the backbone weights came from (informational).
        backbone_config: Backbone config as a dict with ``model_type`` (or a ``PreTrainedConfig``, which
            is converted to a dict).
        pooling: ``"cls"`` (first token), ``"mean"`` (masked mean) or ``"last_token"`` (last non-pad
            token, for decoder LLMs).
        projection_dim: Output size of the two-layer projection head (Khosla et al., 2020: 128-2048;
            default 256).
        projection_hidden_dim: Hidden size of the projection head (default: backbone hidden size).
        head: Classifier head: ``"linear"`` (probe), ``"label_attention"`` (PLM-ICD, Huang et al. 2022) or
            ``"native"`` (the backbone family's own sequence-classification head, :data:`NATIVE_HEAD_POOLING`: the
            classifier then saves as the family's ``XForSequenceClassification``).
        chunk_size: Segment length in tokens for the segmented (PLM-ICD) path; must be positive.
        segmented: Encode inputs as segments of ``chunk_size`` tokens (each segment a row of the
            backbone batch). Default: True iff ``head == "label_attention"``.
        label_attention_dim: Width ``d_a`` of the label-wise attention (PLM-ICD uses 512).
        classifier_dropout: Dropout before the linear probe.
        freeze_encoder: Backbone frozen (linear probing): it then runs in eval mode and without grad.
        num_labels / id2label / label2id / problem_type: standard classifier fields; ``problem_type``
            defaults to ``"multi_label_classification"``.
    """

    model_type = "mlcl"

    backbone_name_or_path: str | None = None
    backbone_config: dict | None = None
    pooling: str = "cls"
    projection_dim: int = 256
    projection_hidden_dim: int | None = None
    head: str = "linear"
    chunk_size: int = 128
    segmented: bool | None = None
    label_attention_dim: int = 512
    classifier_dropout: float = 0.0
    freeze_encoder: bool = False
    problem_type: str | None = "multi_label_classification"

    def __post_init__(self, **kwargs: Any) -> None:
        num_labels = kwargs.get("num_labels")
        if num_labels is not None and self.id2label is not None and len(self.id2label) != int(num_labels):
            raise ValueError(
                f"label-count mismatch: num_labels={num_labels} but id2label has {len(self.id2label)} entries; "
                "pass only one of them or make them agree"
            )
        if isinstance(self.backbone_config, PreTrainedConfig):
            self.backbone_config = backbone_config_to_dict(self.backbone_config)
        if self.backbone_config is not None:
            if not isinstance(self.backbone_config, dict) or "model_type" not in self.backbone_config:
                raise ValueError(
                    "backbone_config must be a dict with a 'model_type' key (e.g. BertConfig(...).to_dict()); "
                    f"got {type(self.backbone_config).__name__}"
                )
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {POOLINGS}")
        if self.head not in HEADS:
            raise ValueError(f"unknown head {self.head!r}; choose one of {HEADS}")
        if not isinstance(self.chunk_size, int) or isinstance(self.chunk_size, bool) or self.chunk_size <= 0:
            raise ValueError(
                f"chunk_size must be a positive number of tokens (e.g. 128); got {self.chunk_size!r}"
            )
        if int(self.projection_dim) <= 0:
            raise ValueError(f"projection_dim must be positive (e.g. 256); got {self.projection_dim}")
        if self.projection_hidden_dim is not None and int(self.projection_hidden_dim) <= 0:
            raise ValueError(
                f"projection_hidden_dim must be positive or None (= backbone hidden size); got {self.projection_hidden_dim}"
            )
        if int(self.label_attention_dim) <= 0:
            raise ValueError(
                f"label_attention_dim must be positive (PLM-ICD: 512); got {self.label_attention_dim}"
            )
        if self.segmented is None:
            self.segmented = self.head == "label_attention"
        if self.head == "native":
            self._check_native_head()
        super().__post_init__(**kwargs)

    def _check_native_head(self) -> None:
        """head='native' needs a backbone family listed in :data:`NATIVE_HEAD_POOLING`, its pooling, no segments."""
        model_type = (self.backbone_config or {}).get("model_type")
        if model_type is None:
            return  # no backbone yet (from_backbone fills it in)
        if model_type not in NATIVE_HEAD_POOLING:
            raise ValueError(
                f"head='native' is not available for {model_type!r} backbones (available: "
                f"{sorted(NATIVE_HEAD_POOLING)}); use head='linear'"
            )
        pooling = "last_token" if NATIVE_HEAD_POOLING[model_type] == "last_token" else "cls"
        if self.pooling != pooling or self.segmented:
            raise ValueError(
                f"head='native' on a {model_type} backbone pools as its own classification head does: set "
                f"pooling={pooling!r} and segmented=False (got pooling={self.pooling!r}, segmented={self.segmented})"
            )

    @property
    def native_pooling(self) -> str | None:
        """How head='native' pools for this backbone (:data:`NATIVE_HEAD_POOLING`), None for other heads."""
        if self.head != "native":
            return None
        return NATIVE_HEAD_POOLING[self.backbone_config["model_type"]]

    def get_backbone_config(self) -> PreTrainedConfig:
        """Rebuild the backbone ``PreTrainedConfig`` from the stored dict (offline; no download)."""
        if self.backbone_config is None:
            raise ValueError(
                "MLCLConfig has no backbone_config; build the model with MLCLEncoder.from_backbone(name_or_config)"
            )
        data = dict(self.backbone_config)
        model_type = data.pop("model_type")
        return AutoConfig.for_model(model_type, **data)

    @property
    def backbone_hidden_size(self) -> int:
        """Hidden size of the backbone (``hidden_size`` or ``d_model`` in its config)."""
        cfg = self.backbone_config or {}
        for key in ("hidden_size", "d_model", "dim", "n_embd"):
            if cfg.get(key) is not None:
                return int(cfg[key])
        return int(self.get_backbone_config().hidden_size)


MLCLConfig.register_for_auto_class()


# the keywords of ``from_backbone`` that configure the wrapper: MLCLConfig's own fields and the label
# fields; every other keyword (``dtype``, ``device_map``, ``attn_implementation`` ...) goes to the backbone
# loader, also those PreTrainedConfig shares with the loader (``dtype``)
MLCL_CONFIG_KEYS = (
    {f.name for f in dataclasses.fields(MLCLConfig)} - {f.name for f in dataclasses.fields(PreTrainedConfig)}
) | {"num_labels", "id2label", "label2id", "problem_type"}


def build_backbone(config: MLCLConfig) -> PreTrainedModel:
    """Random-init backbone from the stored backbone config dict (offline; never downloads).

    An explicit attention implementation requested for the wrapper (``from_pretrained(dir,
    attn_implementation="flash_attention_2")``) is handed to the backbone; the default (sdpa) is left
    to the backbone's own choice.
    """
    kwargs = {}
    attn = getattr(config, "_attn_implementation", None)
    if isinstance(attn, str) and attn != "sdpa":
        kwargs["attn_implementation"] = attn
    return AutoModel.from_config(config.get_backbone_config(), **kwargs)


def normalise_id2label(id2label: Mapping | Sequence | None) -> dict[int, str] | None:
    """``id2label`` as ``{int: str}`` from a mapping (keys may be strings, as in JSON) or a list of names."""
    if id2label is None:
        return None
    if isinstance(id2label, Mapping):
        return {int(k): str(v) for k, v in id2label.items()}
    return {i: str(name) for i, name in enumerate(id2label)}


__all__ = [
    "MLCLConfig",
    "MLCL_CONFIG_KEYS",
    "NATIVE_HEAD_POOLING",
    "POOLINGS",
    "HEADS",
    "backbone_config_to_dict",
    "build_backbone",
    "normalise_id2label",
]
