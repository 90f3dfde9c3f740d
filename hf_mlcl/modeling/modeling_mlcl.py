"""hf_mlcl encoder (backbone + pooling + projection head) and multi-label classifiers.

This module is copied next to the weights by ``save_pretrained`` (Hub "remote code") and loaded with
``AutoModel.from_pretrained(dir, trust_remote_code=True)`` in environments where ``hf_mlcl`` is not
installed, so it must stay self-contained: it imports only the standard library, ``torch``,
``transformers`` and its siblings (``configuration_mlcl``; ``layers_mlcl``: pooling and heads; ``folders_mlcl``:
atomic saves, adapter folders; the last two inlined into the saved copy) — never ``hf_mlcl``.

References:
- Khosla et al., 2020, "Supervised Contrastive Learning": projection head = 2-layer MLP with ReLU,
  dropped after contrastive training (linear evaluation protocol).
- Huang et al., 2022, "PLM-ICD": segment pooling (a document split into segments encoded separately,
  token states concatenated) and label-wise attention: Z = tanh(H W1), A = softmax(Z W2) over
  tokens, V = A^T H, logit_k = w3_k . V_k + b_k.
"""

from __future__ import annotations

import inspect
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_outputs import SequenceClassifierOutput
from transformers.utils import ModelOutput

from .configuration_mlcl import (
    MLCL_CONFIG_KEYS,
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
    bundle_code_files,
    hub_file,
    load_adapter_folder,
    merge_lora_weights,
    save_folder_atomically,
)
from .layers_mlcl import LabelAttentionHead, ProjectionHead, last_token_index, masked_mean, pool_states
from .native_mlcl import MLCL_FILE, NATIVE_FILES, load_native_classifier, load_native_encoder

# Bidirectional encoders whose transformers implementation (masking_utils.create_bidirectional_mask)
# hands a prepared 4-D attention mask to the attention function unchanged (MLCLPreTrainedModel._backbone_mask);
# tests/modeling compare each with its own 2-D mask path.
PREPARED_MASK_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})


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


# ----------------------------------------------------------------------------------------------------
# base class
# ----------------------------------------------------------------------------------------------------


class MLCLPreTrainedModel(PreTrainedModel):
    """Shared plumbing: backbone handling, segmented encoding, atomic ``save_pretrained``."""

    config_class = MLCLConfig
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    accepts_loss_kwargs = False  # Trainer must not assume we normalise by num_items_in_batch (#47688)
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True

    config: MLCLConfig

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        """Init our head layers (the backbone initialises itself): Xavier-uniform weights, zero biases."""
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)

    # -- backbone delegation ------------------------------------------------------------------------
    @property
    def is_gradient_checkpointing(self) -> bool:
        """``is_activation_checkpointing`` under the name peft reads when it wraps a model (transformers 5.x
        deprecates its own alias with a FutureWarning at every ``get_peft_model``)."""
        return self.is_activation_checkpointing

    def get_input_embeddings(self) -> nn.Module:
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.backbone.set_input_embeddings(value)

    def resize_token_embeddings(self, *args: Any, **kwargs: Any) -> nn.Module:
        """Resize the backbone's embeddings and keep ``config.backbone_config`` in sync."""
        out = self.backbone.resize_token_embeddings(*args, **kwargs)
        self.config.backbone_config = backbone_config_to_dict(self.backbone.config)
        return out

    @property
    def backbone_hidden_size(self) -> int:
        return int(self.backbone.config.get_text_config().hidden_size)

    def _backbone_accepts(self, name: str) -> bool:
        cache = self.__dict__.setdefault("_mlcl_backbone_params", {})
        if name not in cache:
            cache[name] = name in inspect.signature(self.backbone.forward).parameters
        return cache[name]

    def _pad_token_id(self) -> int:
        pad = getattr(self.backbone.config, "pad_token_id", None)
        return int(pad) if isinstance(pad, int) else 0

    def _backbone_mask(self, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """The padding mask in the form the backbone reads without a host read of its values.

        transformers turns a 2-D padding mask into the attention mask inside the backbone, and for SDPA
        it first asks whether the mask holds any padding (``padding_mask.all()``, to drop the mask and
        reach the flash kernel): a device-to-host synchronisation in every forward on an accelerator.
        For the bidirectional encoders of :data:`PREPARED_MASK_MODEL_TYPES` under SDPA the mask is
        handed over already prepared, (B, 1, 1, T) boolean (True = attend; SDPA broadcasts it over heads
        and queries), which transformers passes to SDPA unchanged: the same attention as the 2-D mask
        gives, and no host read. A batch without padding should come without ``attention_mask`` (what
        :class:`~hf_mlcl.data.MultiLabelCollator` does, checking on the host): a mask handed over would
        keep SDPA on its masked kernel where transformers would have dropped it for the flash kernel.
        Every other backbone (decoders, local attention, eager / flash / flex attention) gets the 2-D
        mask. An absent mask stays absent.
        """
        if attention_mask is None or attention_mask.ndim != 2:
            return attention_mask
        config = self.backbone.config
        if (
            getattr(config, "model_type", None) in PREPARED_MASK_MODEL_TYPES
            and getattr(config, "_attn_implementation", None) == "sdpa"
            and not getattr(config, "is_decoder", False)
        ):
            return attention_mask[:, None, None, :].bool()
        return attention_mask

    def _run_backbone(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        token_type_ids: torch.Tensor | None,
    ) -> torch.Tensor:
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": self._backbone_mask(attention_mask),
        }
        if token_type_ids is not None and self._backbone_accepts("token_type_ids"):
            kwargs["token_type_ids"] = token_type_ids
        if (
            attention_mask is not None
            and self.config.pooling == "last_token"
            and self._backbone_accepts("position_ids")
        ):
            # positions count real tokens only, so left padding leaves the states unchanged
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        if self._backbone_accepts("use_cache"):
            kwargs["use_cache"] = False
        out = self.backbone(**kwargs, return_dict=True)
        return out.last_hidden_state

    def encode_tokens(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, int | None]:
        """Token states (B, N, H), mask (B, N) and the segment length (None when not segmented).

        The mask is None when no ``attention_mask`` was given and the model is not segmented (every
        position is a real token; :func:`~hf_mlcl.modeling.layers_mlcl.pool_states` and the label-attention
        head then use no mask arithmetic).

        Segmented (PLM-ICD): the (B, T) document is right-padded to S * chunk_size tokens, reshaped to
        (B * S, chunk_size) rows, the rows holding at least one real token are encoded as one backbone
        batch, and the states are concatenated back to (B, S * chunk_size, H) (empty rows are zeros
        and masked out).

        Host reads: the unsegmented path reads no tensor value. The segmented path reads the segment
        mask once per forward (whether every segment holds a token, and which do): the backbone batch
        is the set of non-empty segments, a data-dependent shape. Encoding every segment instead would
        spend the backbone on padding (documents of a batch differ in length by many segments) and
        change which dropout masks the real segments draw, so the read stays.
        """
        if input_ids is None:
            raise ValueError("input_ids is required (tokenize the texts first)")
        if not self.config.segmented:
            states = self._run_backbone(input_ids, attention_mask, token_type_ids)
            return states, attention_mask, None
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)

        chunk = int(self.config.chunk_size)
        batch, length = input_ids.shape
        num_segments = max(1, -(-length // chunk))
        extra = num_segments * chunk - length
        if extra:
            input_ids = F.pad(input_ids, (0, extra), value=self._pad_token_id())
            attention_mask = F.pad(attention_mask, (0, extra), value=0)
            if token_type_ids is not None:
                token_type_ids = F.pad(token_type_ids, (0, extra), value=0)
        rows_ids = input_ids.reshape(batch * num_segments, chunk)
        rows_mask = attention_mask.reshape(batch * num_segments, chunk)
        rows_tt = token_type_ids.reshape(batch * num_segments, chunk) if token_type_ids is not None else None
        keep = rows_mask.bool().any(-1)
        if bool(keep.all()):
            states = self._run_backbone(rows_ids, rows_mask, rows_tt)
        else:
            if not bool(keep.any()):
                keep = keep.clone()
                keep[0] = True
            (index,) = keep.nonzero(as_tuple=True)
            encoded = self._run_backbone(
                rows_ids[index], rows_mask[index], rows_tt[index] if rows_tt is not None else None
            )
            states = encoded.new_zeros(batch * num_segments, chunk, encoded.shape[-1]).index_put(
                (index,), encoded
            )
        return states.reshape(batch, num_segments * chunk, -1), attention_mask, chunk

    # -- construction helpers -----------------------------------------------------------------------
    @classmethod
    def from_backbone(
        cls,
        name_or_path_or_config: str | os.PathLike | PreTrainedConfig | Mapping,
        pooling: str = "cls",
        projection_dim: int = 256,
        **kwargs: Any,
    ) -> MLCLPreTrainedModel:
        """Wrap an ``AutoModel`` backbone.

        A ``PreTrainedConfig`` (or a dict with ``model_type``) builds a random-init backbone (tests,
        demos); a string loads pretrained weights with ``AutoModel.from_pretrained``. Keywords that are
        ``MLCLConfig`` fields (``projection_hidden_dim``, ``chunk_size``, ``segmented``, ``head``,
        ``num_labels``, ``id2label`` ...) go to the config, the rest (``dtype``, ``attn_implementation``,
        ``trust_remote_code``, ``revision`` ...) to the backbone loader.
        """
        config_keys = MLCL_CONFIG_KEYS
        config_kwargs = {k: kwargs.pop(k) for k in list(kwargs) if k in config_keys}
        source = name_or_path_or_config
        if isinstance(source, Mapping):
            data = dict(source)
            if "model_type" not in data:
                raise ValueError("a backbone config dict needs a 'model_type' key (e.g. 'bert', 'llama')")
            from transformers import AutoConfig

            source = AutoConfig.for_model(data.pop("model_type"), **data)
        if isinstance(source, PreTrainedConfig):
            backbone = AutoModel.from_config(source, **kwargs)
            name = None
        elif isinstance(source, (str, os.PathLike)):
            cfg_file = os.path.join(os.fspath(source), "config.json")
            if os.path.isfile(cfg_file):
                import json

                with open(cfg_file, encoding="utf-8") as fh:
                    if json.load(fh).get("model_type") == MLCLConfig.model_type:
                        raise ValueError(
                            f"{source} is a saved hf_mlcl model, not a backbone; load it with "
                            f"{cls.__name__}.from_pretrained(path) (or from_encoder for a classifier)"
                        )
            backbone = AutoModel.from_pretrained(os.fspath(source), **kwargs)
            name = os.fspath(source)
        else:
            raise ValueError(
                "from_backbone expects a model id / path (str) or a backbone PreTrainedConfig; "
                f"got {type(name_or_path_or_config).__name__}"
            )
        if "id2label" in config_kwargs:
            config_kwargs["id2label"] = normalise_id2label(config_kwargs["id2label"])
            config_kwargs.setdefault("label2id", {v: k for k, v in config_kwargs["id2label"].items()})
        config = MLCLConfig(
            backbone_name_or_path=name,
            backbone_config=backbone_config_to_dict(backbone.config),
            pooling=pooling,
            projection_dim=projection_dim,
            **config_kwargs,
        )
        model = cls(config, backbone=backbone)
        device = next(backbone.parameters()).device
        if device.type != "meta":
            model.to(device)
        return model

    # -- loading --------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any, **kwargs: Any
    ):
        """``PreTrainedModel.from_pretrained``, plus folders saved as a LoRA adapter: when the folder holds
        ``adapter_config.json``, the base backbone is loaded by the id / path in it
        (``base_model_name_or_path``), the adapter is merged into it (:func:`merge_lora_weights`) and the
        heads are read from ``model.safetensors``. ``AutoModel*.from_pretrained(..., trust_remote_code=True)``
        and ``pipeline(...)`` come through here as well."""
        path = os.fspath(pretrained_model_name_or_path)
        hub = {
            k: kwargs[k]
            for k in ("revision", "cache_dir", "token", "local_files_only")
            if kwargs.get(k) is not None
        }
        adapter_file = hub_file(path, ADAPTER_CONFIG_NAME, hub)
        native = hub_file(path, MLCL_FILE, hub)
        if native is not None:
            files = {name: hub_file(path, name, hub) for name in NATIVE_FILES}
            files[ADAPTER_CONFIG_NAME] = adapter_file
            with open(native, encoding="utf-8") as fh:
                kind = json.load(fh).get("kind", "encoder")
            if kind == "classifier" and cls is MLCLForMultiLabelClassification:
                return load_native_classifier(cls, path, files, kwargs)
            if kind == "encoder" and cls is MLCLEncoder:
                return load_native_encoder(cls, path, files, adapter_file is not None, kwargs)
            if kind == "encoder":
                raise ValueError(
                    f"{path} is an encoder (a sentence-transformers folder): it has no classification head to load; "
                    f"build a classifier on it with MLCLForMultiLabelClassification.from_encoder(path, id2label=...) "
                    f"and train its head (hf-mlcl probe RECIPE --encoder_path {path})"
                )
            raise ValueError(
                f"{path} is a classifier; load it with MLCLForMultiLabelClassification.from_pretrained"
            )
        if adapter_file is None:
            return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)
        return load_adapter_folder(cls, path, adapter_file, hub, kwargs)

    # -- saving ---------------------------------------------------------------------------------------
    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """``PreTrainedModel.save_pretrained`` made atomic (:func:`~folders_mlcl.save_folder_atomically`: no
        half-written checkpoints), the backbone config refreshed from the live backbone (pad token, vocabulary),
        the code as ``configuration_mlcl.py`` + one ``modeling_mlcl.py`` (:func:`~folders_mlcl.bundle_code_files`).
        An ``is_main_process`` given by the caller decides whether this process writes (``should_save_on_this_rank``)."""
        self.config.backbone_config = backbone_config_to_dict(self.backbone.config)
        self._writer_named = "is_main_process" in kwargs
        try:
            if (
                kwargs.get("push_to_hub")
                or not kwargs.get("is_main_process", True)
                or os.path.isfile(os.fspath(save_directory))
            ):
                return super().save_pretrained(save_directory, *args, **kwargs)
            save_folder_atomically(
                os.fspath(save_directory), lambda tmp: self._save_into(tmp, *args, **kwargs)
            )
        finally:
            self._writer_named = False
        return None

    def _save_into(self, folder: str, *args: Any, **kwargs: Any) -> None:
        """``PreTrainedModel.save_pretrained`` into ``folder``, then its code files bundled into two."""
        super().save_pretrained(folder, *args, **kwargs)
        if os.path.isfile(os.path.join(folder, "modeling_mlcl.py")):
            bundle_code_files(folder)

    def should_save_on_this_rank(self, is_main_process: bool) -> bool:
        """Whether this process writes the files of ``save_pretrained`` (transformers 5 asks this).

        transformers writes on global rank 0 only, whatever ``is_main_process`` says, so a ``Trainer`` with
        ``save_on_each_node`` (``is_main_process=True`` on the main process of every node: node-local folders)
        would leave every other node's folder without config and weights, unable to resume or load the model.
        A caller that names the writer (passes ``is_main_process``) is followed; without it transformers' rule
        stands, which keeps a ``save_pretrained`` called on every rank from writing one folder many times."""
        if getattr(self, "_writer_named", False):
            return bool(is_main_process)
        return super().should_save_on_this_rank(is_main_process)


# ----------------------------------------------------------------------------------------------------
# encoder
# ----------------------------------------------------------------------------------------------------


class MLCLEncoder(MLCLPreTrainedModel):
    """Backbone + pooling + projection head, trained with a (multi-label) contrastive loss.

    ``forward`` returns ``MLCLEncoderOutput(embeddings=(B, projection_dim), pooled=(B, hidden))``.
    With ``config.segmented`` (PLM-ICD contrastive training) the document is encoded as segments of
    ``chunk_size`` tokens and pooled over all segment tokens (masked mean for ``pooling="mean"``).
    """

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
    ) -> MLCLEncoderOutput | tuple[torch.Tensor, torch.Tensor]:
        states, mask, segment = self.encode_tokens(input_ids, attention_mask, token_type_ids)
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
        max_length: int | None = 512,
        output: str = "embeddings",
        normalize: bool = False,
    ) -> torch.Tensor:
        """Embed ``texts`` in eval mode; returns a CPU float32 tensor (N, D).

        ``output="embeddings"`` gives the projected vectors, ``"pooled"`` the backbone representation
        (what a linear probe uses). ``normalize=True`` L2-normalises the rows.
        """
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
                batch = tokenizer(
                    list(texts[start : start + batch_size]),
                    padding=True,
                    truncation=max_length is not None,
                    max_length=max_length,
                    return_tensors="pt",
                )
                batch = {
                    k: v.to(device)
                    for k, v in batch.items()
                    if k in ("input_ids", "attention_mask", "token_type_ids")
                }
                out = self(**batch)
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

    ``forward`` returns ``SequenceClassifierOutput(loss, logits)``; ``loss`` is the mean binary
    cross-entropy (computed in fp32) when ``labels`` (B, L) multi-hot, dense or torch-sparse, is given.
    """

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
    ) -> SequenceClassifierOutput | tuple:
        """Logits (and the BCE loss when ``labels`` is given) of tokenized documents, or of
        ``pooled_features`` (B, hidden) already pooled by this encoder (linear head only; then no
        ``input_ids``): the encoder is skipped and only :meth:`logits_from_pooled` runs."""
        if pooled_features is not None:
            if input_ids is not None:
                raise ValueError("pass input_ids or pooled_features, not both")
            logits = self.logits_from_pooled(pooled_features)
        else:
            with torch.set_grad_enabled(torch.is_grad_enabled() and self._backbone_trainable()):
                states, mask, segment = self.encode_tokens(input_ids, attention_mask, token_type_ids)
            if self.config.head != "label_attention":
                logits = self.logits_from_pooled(self.pool(states, mask, segment))
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
        return SequenceClassifierOutput(loss=loss, logits=logits)

    @classmethod
    def from_encoder(
        cls,
        encoder_or_path: MLCLEncoder | str | os.PathLike,
        num_labels: int | None = None,
        id2label: Mapping[int, str] | Sequence[str] | None = None,
        head: str = "linear",
        freeze_encoder: bool = True,
        chunk_size: int = 128,
        **kwargs: Any,
    ) -> MLCLForMultiLabelClassification:
        """Classifier on a trained encoder's backbone; the projection head is dropped (Khosla et al.).

        The classifier takes over the encoder's backbone module (no copy: an 8B backbone is not
        duplicated); ``copy.deepcopy`` the encoder first if it must stay unchanged. ``freeze_encoder``
        freezes the backbone for linear probing. Extra keywords (``segmented``, ``label_attention_dim``,
        ``classifier_dropout``, ``pooling``) override the encoder's config. LoRA-wrapped encoders must
        be merged first (``peft_model.merge_and_unload()``).
        """
        if isinstance(encoder_or_path, (str, os.PathLike)):
            encoder = MLCLEncoder.from_pretrained(os.fspath(encoder_or_path))
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
            chunk_size=chunk_size,
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
        device = next(encoder.backbone.parameters()).device
        model.to(device)
        model.train(encoder.training)
        return model


MLCLEncoder.register_for_auto_class("AutoModel")
MLCLForMultiLabelClassification.register_for_auto_class("AutoModelForSequenceClassification")

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "ADAPTER_WEIGHTS_NAME",
    "HEADS_WEIGHTS_NAME",
    "LabelAttentionHead",
    "MLCLEncoder",
    "MLCLEncoderOutput",
    "MLCLForMultiLabelClassification",
    "MLCLPreTrainedModel",
    "ProjectionHead",
    "last_token_index",
    "masked_mean",
    "merge_lora_weights",
    "pool_states",
]
