"""What a run trains on, as `HfArgumentParser` dataclasses: :class:`ModelArguments` (the encoder: a Hub id,
a local path or a backbone config, with pooling, head and LoRA) and :class:`DataArguments` (the dataset, how
its text and labels are read, splits and lengths); :func:`as_dict` reads a mapping-valued argument (YAML
mapping or JSON string) for these and the stage arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from typing import Any

from hf_mlcl.data.label_formats import LABEL_FORMATS, UNKNOWN_LABELS
from hf_mlcl.data.stratify import SPLIT_STRATEGIES, check_split_strategy
from hf_mlcl.modeling.configuration_mlcl import HEADS, POOLINGS

__all__ = ["DataArguments", "ModelArguments", "as_dict"]


def as_dict(value: Any, name: str) -> dict | None:
    """Accept a dict (YAML) or a JSON string (command line) for a dict-valued argument."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise ValueError(
                f"{name} must be a JSON object, e.g. '{{\"beta\": 0.1}}'; got {value!r}"
            ) from err
        if not isinstance(parsed, dict):
            raise ValueError(f"{name} must be a JSON object; got {value!r}")
        return parsed
    raise ValueError(f"{name} must be a mapping; got {type(value).__name__}")


@dataclass
class ModelArguments:
    """The encoder: a Hub id / local path, or a backbone config (tests, demo), plus pooling and head."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Backbone id or path (AutoModel), or a trained hf_mlcl encoder checkpoint."},
    )
    backbone_config: str | None = field(
        default=None,
        metadata={
            "help": "JSON/YAML mapping of a backbone config (with `model_type`) to build a random-init backbone."
        },
    )
    tokenizer_name_or_path: str | None = field(
        default=None, metadata={"help": "Defaults to model_name_or_path."}
    )
    pooling: str = field(default="cls", metadata={"help": f"One of {POOLINGS}."})
    projection_dim: int = field(
        default=256, metadata={"help": "Output size of the projection head (the stage-1 embedding)."}
    )
    projection_hidden_dim: int | None = field(
        default=None,
        metadata={"help": "Hidden size of the 2-layer projection head (default: backbone hidden size)."},
    )
    head: str = field(default="linear", metadata={"help": f"Classifier head for probing: one of {HEADS}."})
    chunk_size: int = field(
        default=128, metadata={"help": "Segment length for the PLM-ICD label-attention path."}
    )
    use_lora: bool = field(
        default=False,
        metadata={"help": "Wrap the backbone (any encoder or decoder) with LoRA adapters (peft)."},
    )
    merge_lora: bool = field(
        default=False,
        metadata={
            "help": "LoRA runs: save the merged full weights instead of the adapter folder (LoRA matrices + "
            "heads, loaded onto the base model named in adapter_config.json)."
        },
    )
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.1
    lora_target_modules: list[str] | None = field(
        default=None,
        metadata={
            "help": "Default: the architecture's attention and feed-forward projections "
            "(hf_mlcl.modeling.lora.LORA_TARGETS_BY_MODEL_TYPE: Llama, BERT, RoBERTa, MiniLM, ModernBERT ...)."
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "The backbone's attention kernel, as transformers names it (sdpa, eager, flash_attention_2, "
            "flex_attention ...); default: transformers' choice (sdpa)."
        },
    )
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.backbone_config, dict):
            pass
        elif isinstance(self.backbone_config, str):
            self.backbone_config = as_dict(self.backbone_config, "backbone_config")
        if self.pooling not in POOLINGS:
            raise ValueError(f"unknown pooling {self.pooling!r}; choose one of {POOLINGS}")
        if self.head not in HEADS:
            raise ValueError(f"unknown head {self.head!r}; choose one of {HEADS}")
        if self.chunk_size <= 0:
            raise ValueError(f"chunk_size must be a positive number of tokens; got {self.chunk_size}")
        if self.projection_dim <= 0:
            raise ValueError(f"projection_dim must be positive; got {self.projection_dim}")


# the own-data fields whose loader option (hf_mlcl.data.custom.CUSTOM_OPTIONS) has another name
_OPTION_FIELDS = {"config_name": "dataset_config", "label_names": "label_names_file"}


@dataclass
class DataArguments:
    """Which dataset — a name of `hf_mlcl.data.list_datasets()`, a Hub dataset id, or local csv / tsv /
    json / jsonl / parquet files (see `hf_mlcl.data.custom`) — how to read its text and labels, and lengths."""

    dataset: str = field(
        default="synthetic",
        metadata={
            "help": "Registry name (aapd, goemotions, mimic3 ...), a Hub dataset id ('owner/name'), a local "
            "csv/tsv/json/jsonl/parquet file or folder, or a format name (csv, json, parquet) with data_files."
        },
    )
    data_dir: str | None = field(
        default=None,
        metadata={
            "help": "Folder with a registered dataset's files (for your own files: the base of relative paths)."
        },
    )
    dataset_options: str | None = field(
        default=None, metadata={"help": "Loader keyword arguments as a mapping (YAML) or JSON string."}
    )
    # ---- your own data (ignored for registered names; hf_mlcl.data.custom.load_custom_dataset)
    data_files: str | None = field(
        default=None,
        metadata={
            "help": "One file per split as a mapping {train: a.csv, validation: b.csv, test: c.csv} "
            "(YAML or JSON), or one file to split."
        },
    )
    dataset_config: str | None = field(default=None, metadata={"help": "Config name of a Hub dataset."})
    text_column: str = field(default="text", metadata={"help": "Column holding the document text."})
    label_column: str | None = field(
        default=None, metadata={"help": "Column holding the labels (default: 'labels' or 'label')."}
    )
    label_columns: str | None = field(
        default=None,
        metadata={"help": "One 0/1 column per label: their names (comma-separated or a YAML list)."},
    )
    label_format: str = field(default="auto", metadata={"help": f"One of {LABEL_FORMATS}; auto detects it."})
    label_separator: str | None = field(
        default=None, metadata={"help": "Separator of label_format=delimited (default: first of ; | , seen)."}
    )
    label_names_file: str | None = field(
        default=None,
        metadata={
            "help": "File with one label name per line (default: a ClassLabel feature, else the sorted "
            "union of the train labels)."
        },
    )
    unknown_labels: str = field(
        default="error",
        metadata={
            "help": "Labels seen only outside train / outside the names: 'error' (names them) or 'drop'."
        },
    )
    validation_fraction: float = field(
        default=0.1, metadata={"help": "Share of train carved (seeded) into validation when there is none."}
    )
    test_fraction: float = field(
        default=0.0,
        metadata={"help": "Share of train carved into a test split when there is none (0 = no test)."},
    )
    split_seed: int = field(default=42, metadata={"help": "Seed of the validation / test carving."})
    split_strategy: str = field(
        default="random",
        metadata={
            "help": f"How a missing validation / test split is carved from train: one of {SPLIT_STRATEGIES} "
            "('stratified': iterative stratification, Sechidis et al. 2011, keeps rare labels in it)."
        },
    )
    max_length: int = field(
        default=512, metadata={"help": "Maximum tokens per document (3,072 for PLM-ICD)."}
    )
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "Train on batches without padding: a batch's rows packed into one row (decoder backbones; "
            "flash attention runs them without padding's work). Not with GradCache."
        },
    )
    max_train_samples: int | None = field(
        default=None,
        metadata={"help": "Keep this many training examples (the first rows, or see subset_seed)."},
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "Cap of the validation split."})
    max_test_samples: int | None = field(default=None, metadata={"help": "Cap of the test split."})
    subset_seed: int | None = field(
        default=None,
        metadata={
            "help": "With max_*_samples: take a random subset drawn with this seed instead of the first rows "
            "(the same seed gives the same rows on every machine)."
        },
    )

    def __post_init__(self) -> None:
        self.dataset_options = as_dict(self.dataset_options, "dataset_options") or {}
        if isinstance(self.data_files, str) and self.data_files.lstrip().startswith("{"):
            self.data_files = as_dict(self.data_files, "data_files")
        if self.label_format not in LABEL_FORMATS:
            raise ValueError(f"label_format must be one of {LABEL_FORMATS}; got {self.label_format!r}")
        if self.unknown_labels not in UNKNOWN_LABELS:
            raise ValueError(f"unknown_labels must be one of {UNKNOWN_LABELS}; got {self.unknown_labels!r}")
        check_split_strategy(self.split_strategy)
        if not 0.0 < self.validation_fraction < 1.0:
            raise ValueError(f"validation_fraction must lie in (0, 1); got {self.validation_fraction}")
        if not 0.0 <= self.test_fraction < 1.0 or self.validation_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"test_fraction must lie in [0, 1) and leave train rows (validation_fraction + test_fraction < 1); "
                f"got {self.test_fraction}"
            )
        if self.max_length <= 0:
            raise ValueError(f"max_length must be positive; got {self.max_length}")
        for name in ("max_train_samples", "max_eval_samples", "max_test_samples"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be a positive number of examples or None (all); got {value}")

    def loader_options(self) -> dict[str, Any]:
        """Keyword arguments for ``load_mlc_dataset``: ``dataset_options`` plus the own-data fields that
        differ from their defaults (so a registered name gets only its loader's options)."""
        from hf_mlcl.data.custom import CUSTOM_OPTIONS

        defaults = {f.name: f.default for f in fields(self)}
        options = dict(self.dataset_options or {})
        for key in CUSTOM_OPTIONS:
            name = _OPTION_FIELDS.get(key, key)
            if name in defaults and getattr(self, name) != defaults[name]:
                options.setdefault(key, getattr(self, name))
        return options
