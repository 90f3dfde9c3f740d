"""Argument dataclasses read by `HfArgumentParser` from a recipe YAML and command-line overrides.

`ModelArguments` and `DataArguments` describe what to train on; `ContrastiveTrainingArguments`
(stage 1) and `ProbingTrainingArguments` (stage 2) are `transformers.TrainingArguments` subclasses,
so every Trainer knob (``learning_rate``, ``bf16``, ``eval_strategy`` ...) sits beside ours.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from typing import Any

from transformers import TrainingArguments

from hf_mlcl.data.label_formats import LABEL_FORMATS, UNKNOWN_LABELS
from hf_mlcl.data.stratify import SPLIT_STRATEGIES
from hf_mlcl.losses.registry import check_supervised_loss
from hf_mlcl.modeling.configuration_mlcl import HEADS, POOLINGS

logger = logging.getLogger(__name__)

PROBES = ("linear", "finetune", "logistic")
THRESHOLDS = ("global", "per_label")
BATCH_SAMPLERS = ("random", "positives")

# transformers defaults to False: a resumed run then restarts EarlyStoppingCallback's patience counter at 0
# and trains on past the evaluation where the uninterrupted run stops (seen in studies/results: a BCE run on
# Reuters with patience 3, resumed at epoch 17 after 2 epochs without improvement, went on past epoch 18).
_RESTORE_CALLBACKS_HELP = (
    "Restore the stateful callbacks (EarlyStoppingCallback's patience counter, the TrainerControl) from the "
    "checkpoint on resume, so a resumed run stops where the uninterrupted one would; default True (transformers: "
    "False). The checkpoint's callback arguments (e.g. the patience) replace those passed to the Trainer."
)
_NAN_INF_FILTER_HELP = (
    "Trainer's filter of NaN / inf step losses out of the logged loss; default False here (transformers: "
    "True). The filter reads every micro-batch's loss on the host, a device-to-host synchronisation that "
    "stalls the accelerator each step; hf_mlcl losses are never NaN for degenerate batches (no positive, "
    "empty label sets), and a non-finite loss (NaN / inf embeddings) stops ContrastiveTrainer with a "
    "ValueError at the next logging step or checkpoint instead of being hidden from the log."
)
_KEEP_COLUMNS_HELP = (
    "Always False here: hf_mlcl collators tokenize the raw `text` column and build multi-hot labels from "
    "`labels`, which Trainer would drop as unused by model.forward (True is reset to False with a warning)."
)

_KEEP_CHECKPOINTS_HELP = (
    "Keep the checkpoint-* folders once the stage has finished (`hf-mlcl` commands); default False: they only "
    "serve to resume an interrupted stage, so they are removed once its model, metrics and card are saved."
)


def check_n_views(n_views: int) -> None:
    """ValueError unless ``n_views`` is 1 or 2 (two dropout views of every text): the arguments' check, which
    the trainer repeats for arguments changed after they were built."""
    if n_views not in (1, 2):
        raise ValueError(f"n_views must be 1 or 2 (two dropout views of every text); got {n_views}")


def _keep_columns(args: TrainingArguments) -> None:
    """``remove_unused_columns`` must stay False (the collators need ``text`` and ``labels``)."""
    if args.remove_unused_columns:
        logger.warning(
            "remove_unused_columns=True would drop the text and label columns the hf_mlcl collators need; "
            "using remove_unused_columns=False"
        )
        args.remove_unused_columns = False


def _no_pinned_memory_without_accelerator(args: TrainingArguments) -> None:
    """``dataloader_pin_memory`` off where nothing can be pinned (``use_cpu``, or no accelerator): torch would
    warn at every DataLoader it builds (each epoch, each evaluation) that it cannot pin, and nothing is lost."""
    import torch

    has_accelerator = (
        torch.accelerator.is_available() if hasattr(torch, "accelerator") else torch.cuda.is_available()
    )
    if args.dataloader_pin_memory and (args.use_cpu or not has_accelerator):
        args.dataloader_pin_memory = False


def _as_dict(value: Any, name: str) -> dict | None:
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
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.backbone_config, dict):
            pass
        elif isinstance(self.backbone_config, str):
            self.backbone_config = _as_dict(self.backbone_config, "backbone_config")
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
        self.dataset_options = _as_dict(self.dataset_options, "dataset_options") or {}
        if isinstance(self.data_files, str) and self.data_files.lstrip().startswith("{"):
            self.data_files = _as_dict(self.data_files, "data_files")
        if self.label_format not in LABEL_FORMATS:
            raise ValueError(f"label_format must be one of {LABEL_FORMATS}; got {self.label_format!r}")
        if self.unknown_labels not in UNKNOWN_LABELS:
            raise ValueError(f"unknown_labels must be one of {UNKNOWN_LABELS}; got {self.unknown_labels!r}")
        if self.split_strategy not in SPLIT_STRATEGIES:
            raise ValueError(f"split_strategy must be one of {SPLIT_STRATEGIES}; got {self.split_strategy!r}")
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


@dataclass
class StageTrainingArguments(TrainingArguments):
    """The fields both stages' training arguments carry: the loss's keywords and the output folder's policy.

    ``__post_init__`` reads ``loss_kwargs`` (a mapping, or JSON) and keeps the text and label columns, then runs
    the stage's own checks (:meth:`check_stage`) before ``TrainingArguments`` sets up the run, so a bad value
    stops before any device is touched.
    """

    loss_kwargs: str | None = field(
        default=None, metadata={"help": "Extra loss keywords as a mapping (YAML) or JSON string."}
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Let a new run replace a non-empty output_dir (its old checkpoints are removed)."},
    )
    keep_checkpoints: bool = field(default=False, metadata={"help": _KEEP_CHECKPOINTS_HELP})
    remove_unused_columns: bool = field(default=False, metadata={"help": _KEEP_COLUMNS_HELP})
    restore_callback_states_from_checkpoint: bool = field(
        default=True, metadata={"help": _RESTORE_CALLBACKS_HELP}
    )

    def __post_init__(self) -> None:
        self.loss_kwargs = _as_dict(self.loss_kwargs, "loss_kwargs") or {}
        _keep_columns(self)
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        self.check_stage()
        _no_pinned_memory_without_accelerator(self)
        super().__post_init__()

    def check_stage(self) -> None:
        """The stage's own checks of its values (ValueError in one line); called by ``__post_init__``."""


@dataclass
class ContrastiveTrainingArguments(StageTrainingArguments):
    """Stage 1: label-aware contrastive training of the encoder."""

    loss: str = field(default="sd", metadata={"help": "A name from hf_mlcl.losses.list_losses()."})
    temperature: float | None = field(default=None, metadata={"help": "Default: the loss paper's value."})
    n_views: int = field(default=1, metadata={"help": "1, or 2 for two dropout views of every text."})
    queue_size: int = field(
        default=0, metadata={"help": "MoCo queue length K; 0 = in-batch candidates only."}
    )
    contrast_set: str | None = field(
        default=None,
        metadata={
            "help": "With a queue: 'keys' (current keys + queue, no query-query pairs), 'queries+queue' "
            "(other in-batch + queue) or 'queries+keys' (both); default: the loss paper's (docs/losses.md)."
        },
    )
    queue_warmup: bool | None = field(
        default=None,
        metadata={
            "help": "Leave the queue out of the contrast set until it has been filled once (MulSupCon code); "
            "default: the loss's (True except msc)."
        },
    )
    momentum: float = field(default=0.999, metadata={"help": "EMA factor of the momentum (key) encoder."})
    gather_across_devices: bool = field(
        default=True,
        metadata={"help": "Use every process's samples as candidates (all_gather with gradient)."},
    )
    gradcache_chunk_size: int = field(default=0, metadata={"help": "GradCache sub-batch size; 0 = off."})
    batch_sampler: str = field(
        default="random",
        metadata={
            "help": "'random', or 'positives': batches in which every anchor has a positive under the loss's "
            "rule as far as the data allows (hf_mlcl.data.sampler; `hf-mlcl inspect` shows the effect)."
        },
    )
    dataloader_drop_last: bool = field(
        default=True,
        metadata={
            "help": "Drop the last incomplete batch: equal per-process contrast sets (DDP gather); default True."
        },
    )
    knn_k: int = field(
        default=10,
        metadata={
            "help": "Neighbours of the leave-one-out kNN probe reported at evaluation (eval_knn_*); 0 = off."
        },
    )
    logging_nan_inf_filter: bool = field(default=False, metadata={"help": _NAN_INF_FILTER_HELP})

    def check_stage(self) -> None:
        check_n_views(self.n_views)
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0 (0 = in-batch only); got {self.queue_size}")
        from .memory import check_contrast_set

        check_contrast_set(self.contrast_set, self.queue_size)
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1); got {self.momentum}")
        if self.gradcache_chunk_size < 0:
            raise ValueError(f"gradcache_chunk_size must be >= 0 (0 = off); got {self.gradcache_chunk_size}")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0; got {self.temperature}")
        if self.knn_k < 0:
            raise ValueError(f"knn_k must be >= 0 (0 = no kNN probe at evaluation); got {self.knn_k}")
        if self.batch_sampler not in BATCH_SAMPLERS:
            raise ValueError(f"batch_sampler must be one of {BATCH_SAMPLERS}; got {self.batch_sampler!r}")


@dataclass
class DecisionThresholdArguments:
    """The decision threshold of a stage that produces a classifier (the probe, the joint objective)."""

    threshold: str = field(
        default="global", metadata={"help": "'global' (tuned on validation), 'per_label', or a fixed float."}
    )

    def check_threshold(self) -> None:
        """ValueError in one line unless ``threshold`` is a strategy or a number in (0, 1)."""
        if str(self.threshold) not in THRESHOLDS:
            try:
                value = float(self.threshold)
            except (TypeError, ValueError) as err:
                raise ValueError(
                    f"threshold must be 'global', 'per_label' or a number in (0, 1); got {self.threshold!r}"
                ) from err
            if not 0.0 < value < 1.0:
                raise ValueError(f"a fixed threshold must lie in (0, 1); got {value}")

    @property
    def fixed_threshold(self) -> float | None:
        """The fixed threshold as a float, or None for the tuned strategies."""
        return None if str(self.threshold) in THRESHOLDS else float(self.threshold)


@dataclass
class ProbingTrainingArguments(DecisionThresholdArguments, StageTrainingArguments):
    """Stage 2: a multi-label head on the (frozen or fine-tuned) encoder."""

    probe: str = field(default="linear", metadata={"help": f"One of {PROBES}."})
    loss: str = field(
        default="bce",
        metadata={"help": "Supervised loss of hf_mlcl.losses: bce, focal, asymmetric (asl) or zlpr."},
    )
    logistic_c_grid: str = field(
        default="1.0,0.1,0.01",
        metadata={
            "help": "probe='logistic': inverse L2 strengths C tried per label (chosen on validation F1)."
        },
    )
    logistic_max_iter: int = field(default=1000, metadata={"help": "probe='logistic': lbfgs iterations."})
    cache_features: bool | None = field(
        default=None,
        metadata={
            "help": "probe='linear' / 'logistic': encode every train / eval text once with the frozen encoder and train the "
            "head on the cached pooled features (the encoder's outputs never change). None (default): cache "
            "where possible, else train on the texts with an info message; True: cache or stop with an error "
            "naming why not (label_attention head, FSDP / DeepSpeed, group_by_length ...); False: off. "
            "probe='logistic' fits on the same cached features."
        },
    )
    feature_cache_dir: str | None = field(
        default=None,
        metadata={
            "help": "probe='linear' / 'logistic' with cached features: also save each split's features in this "
            "folder and load them in later runs whose encoder weights, pooling, precision, token ids and labels "
            "are the same (e.g. both probes of one stage-1 encoder). Keyed by a hash of those, never by a path."
        },
    )

    def check_stage(self) -> None:
        if self.logistic_max_iter < 1:
            raise ValueError(
                f"logistic_max_iter must be a positive number of lbfgs iterations; got {self.logistic_max_iter}"
            )
        if self.probe not in PROBES:
            raise ValueError(f"unknown probe {self.probe!r}; choose one of {PROBES}")
        check_supervised_loss(self.loss)  # the loss registry answers what a supervised loss is
        if self.cache_features and self.probe == "finetune":
            raise ValueError(
                "cache_features=True needs a frozen encoder: probe='finetune' trains it, so its features change "
                "every step; use probe='linear' or leave cache_features unset"
            )
        if self.feature_cache_dir is not None:
            if self.probe == "finetune":
                raise ValueError(
                    "feature_cache_dir stores a frozen encoder's features: probe='finetune' trains the encoder; "
                    "use probe='linear' / 'logistic' or leave feature_cache_dir unset"
                )
            if self.cache_features is False:
                raise ValueError(
                    "feature_cache_dir saves the cached features, but cache_features=False turns them off: "
                    "leave cache_features unset (or true), or leave feature_cache_dir unset"
                )
        self.check_threshold()
        try:
            grid = self.logistic_c_grid_values
        except ValueError as err:
            raise ValueError(
                f"logistic_c_grid must be comma-separated positive floats, e.g. '1.0,0.1'; got {self.logistic_c_grid!r}"
            ) from err
        if not grid or any(c <= 0 for c in grid):
            raise ValueError(f"logistic_c_grid must hold positive floats; got {self.logistic_c_grid!r}")
        if self.ddp_find_unused_parameters is None and self.probe in ("linear", "logistic"):
            # the frozen encoder has no trainable parameter: every one of the head's is used in each step, so
            # DDP's search for unused ones (transformers' default) finds none and warns about the extra pass
            self.ddp_find_unused_parameters = False

    @property
    def logistic_c_grid_values(self) -> tuple[float, ...]:
        """``logistic_c_grid`` parsed (a list from YAML or a comma-separated string)."""
        value = self.logistic_c_grid
        items = value if isinstance(value, (list, tuple)) else str(value).split(",")
        return tuple(float(c) for c in items if str(c).strip())


@dataclass
class JointTrainingArguments(DecisionThresholdArguments, ContrastiveTrainingArguments):
    """The joint objective: a classifier fine-tuned end to end with ``(1 - w) * supervised + w * contrastive``
    on each batch (Gunel et al. 2021, eq. 1, with lambda = ``contrastive_weight``). The contrastive term's
    options are stage 1's (``loss``, ``loss_kwargs``, ``temperature``, the queue, GradCache ...); it reads the
    pooled representation the head classifies (no projection head), and evaluation reports the classifier's
    metrics, not the kNN probe (``knn_k`` is not used)."""

    contrastive_weight: float = field(
        default=0.5,
        metadata={
            "help": "w in (1 - w) * supervised + w * contrastive, in [0, 1]; 0 is a plain fine-tune. Default "
            "0.5, the middle of Gunel et al.'s grid (0.1 ... 0.9): choose it on validation."
        },
    )
    supervised_loss: str = field(
        default="bce",
        metadata={"help": "The head's loss: bce, focal, asymmetric (asl) or zlpr (hf_mlcl.losses)."},
    )
    supervised_loss_kwargs: str | None = field(
        default=None, metadata={"help": "Keywords of the supervised loss as a mapping (YAML) or JSON string."}
    )

    def check_stage(self) -> None:
        super().check_stage()
        self.check_threshold()
        self.supervised_loss_kwargs = _as_dict(self.supervised_loss_kwargs, "supervised_loss_kwargs") or {}
        check_supervised_loss(self.supervised_loss)
        if not 0.0 <= self.contrastive_weight <= 1.0:
            raise ValueError(f"contrastive_weight must lie in [0, 1]; got {self.contrastive_weight}")
        if self.n_views != 1:
            raise ValueError(
                "the joint objective classifies every row once: n_views must be 1 (the contrastive term pairs "
                f"the batch's documents by their labels); got {self.n_views}"
            )
