"""The shared base of the hf_mlcl models (``MLCLPreTrainedModel``): the backbone and its padding mask, segmented
(PLM-ICD) encoding, construction from a backbone, loading every folder form hf_mlcl writes, atomic saving.

Bundled into the remote code with ``modeling_mlcl.py``: it imports only the standard library, ``torch``,
``transformers`` and its siblings, never ``hf_mlcl``.
"""

from __future__ import annotations

import copy
import inspect
import json
import os
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init

from .configuration_mlcl import (
    MLCL_CONFIG_KEYS,
    MLCLConfig,
    backbone_config_to_dict,
    normalise_id2label,
)
from .folders_mlcl import (
    ADAPTER_CONFIG_NAME,
    bundle_code_files,
    hub_file,
    hub_keywords,
    load_adapter_folder,
    resolve_subfolder,
    save_folder_atomically,
)
from .layers_mlcl import unpack_rows
from .native_mlcl import (
    MLCL_FILE,
    NATIVE_FILES,
    PEFT,
    SENTENCE_TRANSFORMERS,
    NativeFolder,
    load_classifier_folder,
    load_native_classifier,
    load_native_encoder,
    load_peft_classifier,
)

# Bidirectional encoders whose transformers implementation (masking_utils.create_bidirectional_mask)
# hands a prepared 4-D attention mask to the attention function unchanged (MLCLPreTrainedModel._backbone_mask);
# tests/modeling compare each with its own 2-D mask path.
PREPARED_MASK_MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta"})
# Decoder families whose transformers implementation keeps rows packed into one row apart by their position ids
# (masking_utils detects the packed rows; OPT, for one, builds its mask without them and its rows would attend to
# each other); tests/modeling/test_padding_free.py compares each with padded rows under sdpa and eager.
PACKED_ROW_MODEL_TYPES = frozenset(
    {
        "cohere",
        "gemma",
        "gemma2",
        "gemma3_text",
        "granite",
        "llama",
        "mistral",
        "mixtral",
        "olmo2",
        "phi3",
        "qwen2",
        "qwen3",
        "qwen3_moe",
        "starcoder2",
    }
)


def padding_free_reason(model_type: Any, is_causal: Any = True, segmented: bool = False) -> str | None:
    """Why a backbone of ``model_type`` cannot encode rows packed without padding (None: it can): it must be
    a family of :data:`PACKED_ROW_MODEL_TYPES` with causal attention (``config.is_causal`` not False), not
    segmented (PLM-ICD)."""
    if segmented:
        return "padding_free batches cannot be segmented (PLM-ICD); use padded batches"
    if model_type not in PACKED_ROW_MODEL_TYPES or is_causal is False:
        kind = f"{model_type!r}" + (" with is_causal false" if is_causal is False else "")
        return (
            "padding_free batches need a decoder whose rows transformers keeps apart by their position ids "
            f"({', '.join(sorted(PACKED_ROW_MODEL_TYPES))}); {kind} is not one: use padded batches"
        )
    return None


# ----------------------------------------------------------------------------------------------------
# base class
# ----------------------------------------------------------------------------------------------------


class MLCLPreTrainedModel(PreTrainedModel):
    """Shared plumbing: backbone handling, segmented encoding, atomic ``save_pretrained``."""

    config_class = MLCLConfig
    folder_kind: str | None = None  # "encoder" / "classifier": the native folder kind this class loads
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    accepts_loss_kwargs = False  # Trainer must not assume we normalise by num_items_in_batch (#47688)
    # the heads train in float32 over a bf16 / fp16 backbone (their inputs are cast to the heads' dtype): a
    # reload in the saved low precision keeps them in float32 as saved
    _keep_in_fp32_modules_strict = ["projection_head", "classifier"]
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

    def _backbone_numbers_positions(self) -> bool:
        """Whether the backbone numbers its positions from the input ids, counting real tokens only: its position
        embeddings have a padding index, and real tokens start at ``padding_idx + 1`` (RoBERTa, XLM-R, MPNet,
        Longformer, ESM ...); position ids from 0 would shift them."""
        cache = self.__dict__.setdefault("_mlcl_backbone_params", {})
        if "numbers positions" not in cache:
            cache["numbers positions"] = any(
                isinstance(module, nn.Embedding)
                and name.endswith("position_embeddings")
                and module.padding_idx is not None
                for name, module in self.backbone.named_modules()
            )
        return cache["numbers positions"]

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
        **extra: Any,
    ) -> torch.Tensor:
        """The backbone's last hidden states; ``extra`` (packed rows' position ids and offsets) is passed on."""
        kwargs: dict[str, Any] = {
            "input_ids": input_ids,
            "attention_mask": self._backbone_mask(attention_mask),
            **extra,
        }
        if token_type_ids is not None and self._backbone_accepts("token_type_ids"):
            kwargs["token_type_ids"] = token_type_ids
        if (
            attention_mask is not None
            and "position_ids" not in kwargs
            and self._backbone_accepts("position_ids")
            and not self._backbone_numbers_positions()
        ):
            # positions count real tokens only, so left padding leaves the states unchanged (for every
            # pooling: absolute position embeddings, BERT's or GPT-2's, would shift them); with right padding
            # these are the positions the backbone takes by itself
            kwargs["position_ids"] = (attention_mask.long().cumsum(-1) - 1).clamp_min(0)
        if self._backbone_accepts("use_cache"):
            kwargs["use_cache"] = False
        out = self.backbone(**kwargs, return_dict=True)
        return out.last_hidden_state

    def check_padding_free(self) -> None:
        """ValueError (one line) unless this model can encode rows packed without padding
        (:func:`padding_free_reason`)."""
        config = self.backbone.config
        reason = padding_free_reason(
            getattr(config, "model_type", None),
            getattr(config, "is_causal", True),
            bool(self.config.segmented),
        )
        if reason is not None:
            raise ValueError(reason)

    def _attention_is_flash(self) -> bool:
        """Whether the backbone runs a flash attention kernel (``flash_attention_2`` / ``_3``, or a hub kernel)."""
        return "flash" in str(getattr(self.backbone.config, "_attn_implementation", ""))

    def _encode_packed(
        self,
        input_ids: torch.Tensor,
        token_type_ids: torch.Tensor | None,
        position_ids: torch.Tensor | None,
        cu_seq_lens: torch.Tensor,
        max_seq_len: int | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows packed into one (1, T) row: right-padded states (B, max_seq_len, H) and their mask.

        transformers separates the rows by their ``position_ids`` (its causal masks detect packed rows where
        no attention mask is given); flash attention also gets the rows' offsets (``cu_seq_lens_q/k``,
        ``max_length_q/k``) for its variable-length kernel, which then need not be derived from the position
        ids. ValueError where :meth:`check_padding_free` says the model cannot take packed rows.
        """
        self.check_padding_free()
        if position_ids is None or max_seq_len is None:
            raise ValueError("packed rows need position_ids, cu_seq_lens and max_seq_len together")
        extra: dict[str, Any] = {"position_ids": position_ids}
        if self._attention_is_flash():
            offsets = cu_seq_lens.to(device=input_ids.device, dtype=torch.int32)
            extra.update(
                cu_seq_lens_q=offsets,
                cu_seq_lens_k=offsets,
                max_length_q=max_seq_len,
                max_length_k=max_seq_len,
            )
        states = self._run_backbone(input_ids, None, token_type_ids, **extra)
        return unpack_rows(states, position_ids, cu_seq_lens, int(max_seq_len))

    def encode_tokens(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cu_seq_lens: torch.Tensor | None = None,
        max_seq_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, int | None]:
        """Token states (B, N, H), mask (B, N) and the segment length (None when not segmented).

        Rows packed without padding (``cu_seq_lens``, ``position_ids`` and ``max_seq_len`` of
        :class:`~hf_mlcl.data.MultiLabelCollator` ``(padding_free=True)``) are encoded as one row, each row
        attending only to itself, and handed back right-padded (:meth:`_encode_packed`).

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
        if cu_seq_lens is not None:
            return (
                *self._encode_packed(input_ids, token_type_ids, position_ids, cu_seq_lens, max_seq_len),
                None,
            )
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
            # a copy: transformers' from_config writes the dtype into the config it is given (the caller's)
            backbone = AutoModel.from_config(copy.deepcopy(source), **kwargs)
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
            # a local folder by its absolute path: the saved model names it from anywhere
            if os.path.isdir(name):
                name = os.path.abspath(name)
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
        model.place_heads()
        return model

    def place_heads(self) -> None:
        """Move every module but the backbone to the device of the backbone's first parameter, where its outputs
        arrive; the backbone keeps its own placement (a ``device_map`` spreading it over several devices)."""
        device = next(self.backbone.parameters()).device
        if device.type == "meta":
            return
        for child in self.children():
            if child is not self.backbone:
                child.to(device)

    # -- loading --------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str | os.PathLike, *model_args: Any, **kwargs: Any
    ):
        """``PreTrainedModel.from_pretrained``, plus hf_mlcl's native folders and folders saved as a LoRA adapter:
        when the folder holds ``adapter_config.json``, the base backbone is loaded by the id / path in it
        (``base_model_name_or_path``), the adapter applied to it (unmerged with peft; merged in without peft or
        under ZeRO-3, :func:`~hf_mlcl.modeling.folders_mlcl.load_adapter_folder`) and the heads are read from
        ``model.safetensors``. ``AutoModel*.from_pretrained(..., trust_remote_code=True)`` comes through here
        for a local folder; given a Hub id whose repository holds ``adapter_config.json``, transformers loads
        the base model it names instead. A ``subfolder`` is followed in every layout."""
        path, kwargs = resolve_subfolder(
            os.fspath(pretrained_model_name_or_path), kwargs, (MLCL_FILE, ADAPTER_CONFIG_NAME)
        )
        pretrained_model_name_or_path = path
        hub = hub_keywords(kwargs)
        adapter_file = hub_file(path, ADAPTER_CONFIG_NAME, hub)
        native = hub_file(path, MLCL_FILE, hub)
        if native is not None:
            with open(native, encoding="utf-8") as fh:
                settings = json.load(fh)
            kind = settings.get("kind", "encoder")
            layout = SENTENCE_TRANSFORMERS if kind == "encoder" else settings.get("layout")
            if kind == cls.folder_kind and layout in (
                SENTENCE_TRANSFORMERS,
                PEFT,
            ):  # files beside the settings
                files = {name: hub_file(path, name, hub) for name in NATIVE_FILES}
                files[ADAPTER_CONFIG_NAME] = adapter_file
                folder = NativeFolder(path, settings, files, hub, kwargs)
                if kind == "encoder":
                    return load_native_encoder(cls, folder)
                load = load_classifier_folder if layout == SENTENCE_TRANSFORMERS else load_peft_classifier
                return load(cls, folder)
            if kind == "classifier" and cls.folder_kind == "classifier":
                return load_native_classifier(cls, path, settings, kwargs)
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


__all__ = ["MLCLPreTrainedModel", "PREPARED_MASK_MODEL_TYPES"]
