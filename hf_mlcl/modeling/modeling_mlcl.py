"""hf_mlcl encoder (backbone + pooling + projection head) and multi-label classifiers.

This module is copied next to the weights by ``save_pretrained`` (Hub "remote code") and loaded with
``AutoModel.from_pretrained(dir, trust_remote_code=True)`` in environments where ``hf_mlcl`` is not
installed, so it must stay self-contained: it imports only the standard library, ``torch``,
``transformers`` and its siblings (``base_mlcl``: the shared base class; ``configuration_mlcl``; ``layers_mlcl``,
``folders_mlcl``, ``native_mlcl``: inlined into the saved copy) — never ``hf_mlcl``.

References:
- Khosla et al., 2020, "Supervised Contrastive Learning": projection head = 2-layer MLP with ReLU,
  dropped after contrastive training (linear evaluation protocol).
- Huang et al., 2022, "PLM-ICD": segment pooling (a document split into segments encoded separately,
  token states concatenated) and label-wise attention: Z = tanh(H W1), A = softmax(Z W2) over
  tokens, V = A^T H, logit_k = w3_k . V_k + b_k.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import ModelOutput

from .base_mlcl import PREPARED_MASK_MODEL_TYPES, MLCLPreTrainedModel
from .configuration_mlcl import (
    NATIVE_HEAD_POOLING,
    MLCLConfig,
    backbone_config_to_dict,
    build_backbone,
    normalise_id2label,
)
from .folders_mlcl import (
    ADAPTER_CONFIG_NAME,
    ADAPTER_WEIGHTS_NAME,
    HEADS_WEIGHTS_NAME,
    merge_lora_weights,
)
from .layers_mlcl import LabelAttentionHead, ProjectionHead, last_token_index, masked_mean, pool_states


def model_inputs(
    tokenizer: Any, texts: list[str], device: Any, max_length: int | None
) -> dict[str, torch.Tensor]:
    """``texts`` tokenized as one padded batch (truncated at ``max_length`` unless it is None): the model's inputs
    (``input_ids``, ``attention_mask``, ``token_type_ids`` where the tokenizer gives them) on ``device``."""
    batch = tokenizer(
        texts, padding=True, truncation=max_length is not None, max_length=max_length, return_tensors="pt"
    )
    return {
        k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")
    }


def tokenizer_limit(tokenizer: Any) -> int | None:
    """The tokenizer's ``model_max_length``, or None where it sets no limit (transformers' huge sentinel)."""
    limit = getattr(tokenizer, "model_max_length", None)
    return int(limit) if isinstance(limit, int) and 0 < limit < 1_000_000 else None


@dataclass
class MLCLEncoderOutput(ModelOutput):
    """Output of [`MLCLEncoder`].

    Attributes:
        embeddings: ``(B, projection_dim)`` projected embeddings (the contrastive loss input).
        pooled: ``(B, hidden_size)`` pooled backbone representation before the projection head (the
            representation a linear probe is trained on).
    """

    embeddings: torch.FloatTensor | None = None
    pooled: torch.FloatTensor | None = None


@dataclass
class MLCLClassifierOutput(SequenceClassifierOutput):
    """Output of [`MLCLForMultiLabelClassification`]: ``SequenceClassifierOutput`` and

    Attributes:
        embeddings: ``(B, hidden_size)`` the pooled representation the linear / native head classifies (what
            the joint objective's contrastive term reads); None for the ``label_attention`` head and for
            ``pooled_features`` inputs.
    """

    embeddings: torch.FloatTensor | None = None


# ----------------------------------------------------------------------------------------------------
# encoder
# ----------------------------------------------------------------------------------------------------


class MLCLEncoder(MLCLPreTrainedModel):
    """Backbone + pooling + projection head, trained with a (multi-label) contrastive loss.

    ``forward`` returns ``MLCLEncoderOutput(embeddings=(B, projection_dim), pooled=(B, hidden))``.
    With ``config.segmented`` (PLM-ICD contrastive training) the document is encoded as segments of
    ``chunk_size`` tokens and pooled over all segment tokens (masked mean for ``pooling="mean"``).
    """

    folder_kind = "encoder"

    def __init__(self, config: MLCLConfig, backbone: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        self.backbone = backbone if backbone is not None else build_backbone(config)
        hidden = self.backbone_hidden_size
        proj_hidden = int(config.projection_hidden_dim or hidden)
        self.projection_head = ProjectionHead(hidden, proj_hidden, int(config.projection_dim))
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        return_dict: bool | None = True,
        position_ids: torch.Tensor | None = None,
        cu_seq_lens: torch.Tensor | None = None,
        max_seq_len: int | None = None,
    ) -> MLCLEncoderOutput | tuple[torch.Tensor, torch.Tensor]:
        """Embeddings (B, projection_dim) and pooled states (B, hidden) of tokenized rows: padded (B, N), or
        packed into one row (``position_ids``, ``cu_seq_lens``, ``max_seq_len``: :meth:`encode_tokens`)."""
        states, mask, segment = self.encode_tokens(
            input_ids, attention_mask, token_type_ids, position_ids, cu_seq_lens, max_seq_len
        )
        pooled = pool_states(states, mask, self.config.pooling, segment)
        head_dtype = self.projection_head.dense.weight.dtype
        embeddings = self.projection_head(pooled.to(head_dtype))
        if return_dict is False:
            return embeddings, pooled
        return MLCLEncoderOutput(embeddings=embeddings, pooled=pooled)

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        tokenizer: Any,
        batch_size: int = 32,
        max_length: int | None = None,
        output: str = "embeddings",
        normalize: bool = False,
    ) -> torch.Tensor:
        """Embed ``texts`` in eval mode; returns a CPU float32 tensor (N, D).

        ``output="embeddings"`` gives the projected vectors, ``"pooled"`` the backbone representation
        (what a linear probe uses). ``normalize=True`` L2-normalises the rows. ``max_length`` truncates;
        default: the tokenizer's ``model_max_length`` (in a sentence-transformers folder hf_mlcl wrote, the length
        it trained at, where that form truncates), 512 where the tokenizer sets no limit or the encoder reads
        segments (PLM-ICD: pass the trained length).
        """
        if max_length is None:
            max_length = (None if self.config.segmented else tokenizer_limit(tokenizer)) or 512
        if output not in ("embeddings", "pooled"):
            raise ValueError(f"output must be 'embeddings' or 'pooled'; got {output!r}")
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive; got {batch_size}")
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        parts = []
        try:
            for start in range(0, len(texts), batch_size):
                out = self(
                    **model_inputs(tokenizer, list(texts[start : start + batch_size]), device, max_length)
                )
                vec = (out.embeddings if output == "embeddings" else out.pooled).float()
                if normalize:
                    vec = F.normalize(vec, dim=-1)
                parts.append(vec.cpu())
        finally:
            self.train(was_training)
        if not parts:
            dim = self.config.projection_dim if output == "embeddings" else self.backbone_hidden_size
            return torch.empty(0, dim)
        return torch.cat(parts)


# ----------------------------------------------------------------------------------------------------
# classifier
# ----------------------------------------------------------------------------------------------------


class MLCLForMultiLabelClassification(MLCLPreTrainedModel):
    """Backbone + pooling + multi-label head: ``linear`` (the probe) or ``label_attention`` (PLM-ICD).

    ``forward`` returns ``MLCLClassifierOutput(loss, logits, embeddings)``; ``loss`` is the mean binary
    cross-entropy (computed in fp32) when ``labels`` (B, L) multi-hot, dense or torch-sparse, is given.
    """

    folder_kind = "classifier"

    def __init__(self, config: MLCLConfig, backbone: PreTrainedModel | None = None) -> None:
        super().__init__(config)
        if config.num_labels is None or config.num_labels < 1:
            raise ValueError(f"the classifier needs num_labels >= 1 (or id2label); got {config.num_labels}")
        if config.head == "label_attention" and not config.segmented:
            raise ValueError("head='label_attention' needs segmented=True (PLM-ICD segment encoding)")
        self.backbone = backbone if backbone is not None else build_backbone(config)
        hidden = self.backbone_hidden_size
        if config.head in ("linear", "native"):
            if config.native_pooling == "pooler" and getattr(self.backbone, "pooler", None) is None:
                raise ValueError(
                    "head='native' reads the backbone's pooler, but this backbone was built without one"
                )
            self.dropout = nn.Dropout(float(config.classifier_dropout or 0.0))
            self.classifier = nn.Linear(hidden, config.num_labels, bias=config.native_pooling != "last_token")
        else:
            self.classifier = LabelAttentionHead(hidden, int(config.label_attention_dim), config.num_labels)
        if config.freeze_encoder:
            self.backbone.requires_grad_(False)
        self.post_init()

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any, **kwargs: Any
    ):
        """``MLCLPreTrainedModel.from_pretrained``, with a frozen encoder (``config.freeze_encoder``) frozen
        again: transformers' weight loading hands back every loaded parameter with ``requires_grad=True``,
        so a reloaded linear probe would otherwise train its encoder. A folder without the head's weights
        (an encoder folder, a damaged classifier) is a ValueError naming them, never a random head."""
        want_info = kwargs.pop("output_loading_info", False)
        loaded = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        if isinstance(loaded, tuple):
            model, info = loaded
        else:  # an adapter folder: its heads were checked while loading
            model, info = (
                loaded,
                {"missing_keys": set(), "unexpected_keys": set(), "mismatched_keys": set(), "error_msgs": []},
            )
        missing = sorted(k for k in info["missing_keys"] if not k.startswith(f"{cls.base_model_prefix}."))
        if missing:
            path = os.fspath(pretrained_model_name_or_path)
            if "MLCLEncoder" in (model.config.architectures or []):
                raise ValueError(
                    f"{path} is an encoder (MLCLEncoder): it has no classification head to load; build a classifier on "
                    f"it with MLCLForMultiLabelClassification.from_encoder(path, id2label=...) and train its head "
                    f"(hf-mlcl probe RECIPE --encoder_path {path})"
                )
            raise ValueError(
                f"{path} holds no weights for {missing}: the classifier would score with a randomly initialised head; "
                "load a complete classifier folder (the output of train_probe / hf-mlcl probe)"
            )
        if model.config.freeze_encoder:
            model.backbone.requires_grad_(False)
        return (model, info) if want_info else model

    def train(self, mode: bool = True) -> MLCLForMultiLabelClassification:
        """Like ``nn.Module.train``, but a frozen encoder (linear probing) stays in eval mode (no dropout)."""
        super().train(mode)
        if self.config.freeze_encoder:
            self.backbone.eval()
        return self

    def _backbone_trainable(self) -> bool:
        return any(p.requires_grad for p in self.backbone.parameters())

    def pool(self, states: torch.Tensor, mask: torch.Tensor | None, segment: int | None) -> torch.Tensor:
        """The pooled representation (B, hidden) a linear or native head classifies: ``config.pooling`` of the
        token states, then, for a native head on a BERT / RoBERTa backbone, its pooler (dense + tanh)."""
        if self.config.native_pooling == "pooler":
            return self.backbone.pooler(states)
        return pool_states(states, mask, self.config.pooling, segment)

    def logits_from_pooled(self, pooled: torch.Tensor) -> torch.Tensor:
        """The linear head on pooled representations (B, hidden): ``classifier(dropout(pooled))``.

        Exactly what ``forward`` does after pooling, so a linear probe can be trained on pooled features
        computed once by the frozen encoder (``ProbingTrainer`` with ``cache_features``). The
        ``label_attention`` head reads token states, not a pooled vector: ValueError.
        """
        if self.config.head == "label_attention":
            raise ValueError(
                "head='label_attention' attends over token states; it classifies no pooled features"
            )
        return self.classifier(self.dropout(pooled.to(self.classifier.weight.dtype)))

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        return_dict: bool | None = True,
        pooled_features: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cu_seq_lens: torch.Tensor | None = None,
        max_seq_len: int | None = None,
    ) -> MLCLClassifierOutput | tuple:
        """Logits (and the BCE loss when ``labels`` is given) of tokenized documents (padded, or packed into
        one row: :meth:`encode_tokens`), or of ``pooled_features`` (B, hidden) already pooled by this encoder
        (linear head only; then no ``input_ids``): the encoder is skipped and only :meth:`logits_from_pooled`
        runs."""
        pooled = None
        if pooled_features is not None:
            if input_ids is not None:
                raise ValueError("pass input_ids or pooled_features, not both")
            logits = self.logits_from_pooled(pooled_features)
        else:
            with torch.set_grad_enabled(torch.is_grad_enabled() and self._backbone_trainable()):
                states, mask, segment = self.encode_tokens(
                    input_ids, attention_mask, token_type_ids, position_ids, cu_seq_lens, max_seq_len
                )
            if self.config.head != "label_attention":
                pooled = self.pool(states, mask, segment)
                logits = self.logits_from_pooled(pooled)
            else:
                head_dtype = self.classifier.third_linear.weight.dtype
                logits = self.classifier(states.to(head_dtype), mask)
        loss = None
        if labels is not None:
            if labels.is_sparse or labels.layout != torch.strided:
                labels = labels.to_dense()
            if labels.shape != logits.shape:
                raise ValueError(
                    f"labels have shape {tuple(labels.shape)} but the head predicts {tuple(logits.shape)} "
                    f"(num_labels={self.config.num_labels}); build the head with the dataset's label count"
                )
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels.to(logits.device).float())
        if return_dict is False:
            return (loss, logits) if loss is not None else (logits,)
        return MLCLClassifierOutput(loss=loss, logits=logits, embeddings=pooled)

    @classmethod
    def from_encoder(
        cls,
        encoder_or_path: MLCLEncoder | str | os.PathLike,
        num_labels: int | None = None,
        id2label: Mapping[int, str] | Sequence[str] | None = None,
        head: str = "linear",
        freeze_encoder: bool = True,
        chunk_size: int | None = None,
        load_kwargs: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> MLCLForMultiLabelClassification:
        """Classifier on a trained encoder's backbone; the projection head is dropped (Khosla et al.).

        The classifier takes over the encoder's backbone module (no copy: an 8B backbone is not
        duplicated); ``copy.deepcopy`` the encoder first if it must stay unchanged. ``freeze_encoder``
        freezes the backbone for linear probing. ``chunk_size`` (default: the encoder's) and the extra keywords
        (``segmented``, ``label_attention_dim``, ``classifier_dropout``, ``pooling``) override the encoder's
        config. ``load_kwargs`` go to ``MLCLEncoder.from_pretrained`` for a folder or Hub id (``revision``,
        ``token``, ``dtype``, ``subfolder`` ...). LoRA-wrapped encoders must
        be merged first (``peft_model.merge_and_unload()``).
        """
        if isinstance(encoder_or_path, (str, os.PathLike)):
            encoder = MLCLEncoder.from_pretrained(os.fspath(encoder_or_path), **dict(load_kwargs or {}))
        elif load_kwargs:
            raise ValueError("load_kwargs apply to an encoder folder or Hub id, not to an encoder model")
        else:
            encoder = encoder_or_path
        if not isinstance(encoder, MLCLPreTrainedModel):
            if hasattr(encoder, "merge_and_unload"):
                raise ValueError(
                    "from_encoder got a PEFT-wrapped model; merge the adapters first: "
                    "encoder = peft_model.merge_and_unload()"
                )
            raise ValueError(
                f"from_encoder expects an MLCLEncoder or a saved encoder folder; got {type(encoder).__name__}"
            )
        id2label = normalise_id2label(id2label)
        if id2label is not None and num_labels is not None and len(id2label) != int(num_labels):
            raise ValueError(
                f"label-count mismatch: num_labels={num_labels} but id2label has {len(id2label)} names; "
                "pass matching values (or only id2label)"
            )
        if id2label is None:
            if num_labels is None:
                raise ValueError("from_encoder needs num_labels or id2label (the label names)")
            id2label = {i: f"LABEL_{i}" for i in range(int(num_labels))}
        data = encoder.config.to_dict()
        for key in (
            "auto_map",
            "architectures",
            "id2label",
            "label2id",
            "problem_type",
            "transformers_version",
            "_name_or_path",
            "model_type",
            "num_labels",
            "dtype",
        ):
            data.pop(key, None)
        data.update(
            head=head,
            chunk_size=data.get("chunk_size", 128) if chunk_size is None else chunk_size,
            freeze_encoder=bool(freeze_encoder),
            segmented=True if head == "label_attention" else data.get("segmented", False),
        )
        data["backbone_config"] = backbone_config_to_dict(encoder.backbone.config)
        if head == "native":  # pooled as the backbone family's own classification head pools
            family = NATIVE_HEAD_POOLING.get(data["backbone_config"]["model_type"])
            data.update(pooling="last_token" if family == "last_token" else "cls", segmented=False)
        data.update(kwargs)
        config = MLCLConfig(
            id2label=id2label,
            label2id={name: i for i, name in id2label.items()},
            problem_type="multi_label_classification",
            **data,
        )
        model = cls(config, backbone=encoder.backbone)
        model.place_heads()
        model.train(encoder.training)
        return model


MLCLEncoder.register_for_auto_class("AutoModel")
MLCLForMultiLabelClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "PREPARED_MASK_MODEL_TYPES",
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "HEADS_WEIGHTS_NAME",
    "LabelAttentionHead",
    "MLCLClassifierOutput",
    "MLCLEncoder",
    "MLCLEncoderOutput",
    "MLCLForMultiLabelClassification",
    "MLCLPreTrainedModel",
    "ProjectionHead",
    "last_token_index",
    "masked_mean",
    "merge_lora_weights",
    "model_inputs",
    "pool_states",
]
