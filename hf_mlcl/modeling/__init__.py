"""hf_mlcl.modeling: encoder (backbone + pooling + projection head), multi-label classifiers (linear
probe, PLM-ICD label attention), LoRA helpers; ``sharded`` reads and writes parameters that DeepSpeed
ZeRO-3 / FSDP shard. The MoCo key encoder and queue live with the training code
(:mod:`hf_mlcl.training.momentum`, :mod:`hf_mlcl.training.memory`).

``configuration_mlcl``, ``modeling_mlcl``, ``layers_mlcl`` and ``folders_mlcl`` are self-contained (they
are copied beside saved weights for ``trust_remote_code`` loading); everything else imports from them.
``builders`` makes a stage's tokenizer and model from its model settings.
"""

from __future__ import annotations

from .configuration_mlcl import HEADS, POOLINGS, MLCLConfig, backbone_config_to_dict
from .layers_mlcl import LabelAttentionHead, ProjectionHead, pool_states
from .lora import (
    DEFAULT_LORA_TARGETS,
    LORA_TARGETS_BY_MODEL_TYPE,
    apply_lora,
    bf16_available,
    default_lora_targets,
    merge_lora,
    save_lora_model,
)
from .modeling_mlcl import (
    MLCLClassifierOutput,
    MLCLEncoder,
    MLCLEncoderOutput,
    MLCLForMultiLabelClassification,
    MLCLPreTrainedModel,
)
from .native import save_native, to_native_classifier, to_sentence_transformers


def _register_local_auto_classes() -> None:
    """Let AutoConfig / AutoModel / AutoModelForSequenceClassification resolve ``model_type="mlcl"``
    without trust_remote_code when hf_mlcl is importable (remote code still works without hf_mlcl)."""
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    AutoConfig.register("mlcl", MLCLConfig, exist_ok=True)
    AutoModel.register(MLCLConfig, MLCLEncoder, exist_ok=True)
    AutoModelForSequenceClassification.register(MLCLConfig, MLCLForMultiLabelClassification, exist_ok=True)


_register_local_auto_classes()

__all__ = [
    "DEFAULT_LORA_TARGETS",
    "HEADS",
    "LORA_TARGETS_BY_MODEL_TYPE",
    "POOLINGS",
    "LabelAttentionHead",
    "MLCLConfig",
    "MLCLEncoder",
    "MLCLClassifierOutput",
    "MLCLEncoderOutput",
    "MLCLForMultiLabelClassification",
    "MLCLPreTrainedModel",
    "ProjectionHead",
    "apply_lora",
    "backbone_config_to_dict",
    "bf16_available",
    "default_lora_targets",
    "merge_lora",
    "pool_states",
    "save_lora_model",
    "save_native",
    "to_native_classifier",
    "to_sentence_transformers",
]
