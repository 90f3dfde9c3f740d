"""The stages' training arguments, `transformers.TrainingArguments` subclasses read by `HfArgumentParser`:
:class:`ContrastiveTrainingArguments` (stage 1), :class:`ProbingTrainingArguments` (stage 2) and
:class:`JointTrainingArguments` (the joint objective), on :class:`StageTrainingArguments` (what every stage
carries) and :class:`DecisionThresholdArguments` (a classifier's threshold), with their checks, so every
Trainer knob (``learning_rate``, ``bf16``, ``eval_strategy`` ...) sits beside ours.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field

from transformers import TrainingArguments

from hf_mlcl.losses.registry import (
    check_contrastive_loss,
    check_joint_losses,
    check_loss_keywords,
    check_supervised_loss,
    supervised_loss,
)

from .model_data_arguments import as_dict
from .momentum import MOCO_MOMENTUM, check_momentum

logger = logging.getLogger(__name__)

__all__ = [
    "BATCH_SAMPLERS",
    "PROBES",
    "THRESHOLDS",
    "ContrastiveTrainingArguments",
    "DecisionThresholdArguments",
    "JointTrainingArguments",
    "ProbingTrainingArguments",
    "StageTrainingArguments",
    "check_n_views",
]

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


def _check_optimizer_values(args: TrainingArguments) -> None:
    """The values torch's optimizers refuse only once a stage builds one (after an earlier stage trained): a
    finite learning rate, weight decay and epsilon >= 0, Adam's betas in [0, 1)."""
    for name in ("learning_rate", "weight_decay", "adam_epsilon"):
        value = getattr(args, name)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
            raise ValueError(f"{name} must be a finite number >= 0; got {value!r}")
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(args, name)
        if not (isinstance(value, (int, float)) and 0 <= value < 1):
            raise ValueError(f"{name} must lie in [0, 1); got {value!r}")


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
        self.loss_kwargs = as_dict(self.loss_kwargs, "loss_kwargs") or {}
        _keep_columns(self)
        if self.label_names not in (None, ["labels"]):
            raise ValueError(
                f"label_names={self.label_names!r} is transformers' list of the batch keys that hold labels, and "
                "hf_mlcl's batches hold them in 'labels'; to name your data's labels pass --label_names_file "
                "(a file, one name per line)"
            )
        for name in (
            "per_device_train_batch_size",
            "per_device_eval_batch_size",
            "gradient_accumulation_steps",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer; got {value!r}")
        _check_optimizer_values(self)
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
    momentum: float = field(
        default=MOCO_MOMENTUM, metadata={"help": "EMA factor of the momentum (key) encoder."}
    )
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
        self.check_losses()
        check_n_views(self.n_views)
        if self.queue_size < 0:
            raise ValueError(f"queue_size must be >= 0 (0 = in-batch only); got {self.queue_size}")
        from .contrast_sets import check_contrast_set

        check_contrast_set(self.contrast_set, self.queue_size)
        check_momentum(self.momentum)
        if self.gradcache_chunk_size < 0:
            raise ValueError(f"gradcache_chunk_size must be >= 0 (0 = off); got {self.gradcache_chunk_size}")
        if self.temperature is not None and self.temperature <= 0:
            raise ValueError(f"temperature must be > 0; got {self.temperature}")
        if self.knn_k < 0:
            raise ValueError(f"knn_k must be >= 0 (0 = no kNN probe at evaluation); got {self.knn_k}")
        if self.batch_sampler not in BATCH_SAMPLERS:
            raise ValueError(f"batch_sampler must be one of {BATCH_SAMPLERS}; got {self.batch_sampler!r}")

    def check_losses(self) -> None:
        """ValueError in one line unless ``loss`` names a contrastive loss that takes ``loss_kwargs`` (before any
        model is loaded)."""
        check_contrastive_loss(self.loss)
        check_loss_keywords(self.loss, self.loss_kwargs)


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
        supervised_loss(
            self.loss, self.loss_kwargs, role="loss"
        )  # as the probe builds it: its keywords and values
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
    pooled representation the head classifies (or a training-only projection of it,
    ``contrastive_projection_dim``), and evaluation reports the classifier's
    metrics, not the kNN probe (``knn_k`` is not used)."""

    contrastive_weight: float = field(
        default=0.5,
        metadata={
            "help": "w in (1 - w) * supervised + w * contrastive, in [0, 1]; 0 is a plain fine-tune. Default "
            "0.5, the middle of Gunel et al.'s grid (0.1 ... 0.9): choose it on validation (BCE averages over "
            "every label entry, so with many labels search below 0.1 too; docs/losses.md)."
        },
    )
    supervised_loss: str = field(
        default="bce",
        metadata={"help": "The head's loss: bce, focal, asymmetric (asl) or zlpr (hf_mlcl.losses)."},
    )
    supervised_loss_kwargs: str | None = field(
        default=None, metadata={"help": "Keywords of the supervised loss as a mapping (YAML) or JSON string."}
    )
    contrastive_projection_dim: int = field(
        default=0,
        metadata={
            "help": "0 (default, Gunel et al.): the contrastive term reads the pooled representation the head "
            "classifies. N > 0: a projection head (Khosla et al.'s two-layer MLP, hidden width = the pooled "
            "width) maps it to N dimensions first; it trains with the contrastive term and is not part of the "
            "saved classifier. Batch mode only (queue_size 0)."
        },
    )

    def check_losses(self) -> None:
        """ValueError in one line unless ``loss`` is contrastive and ``supervised_loss`` supervised, each taking
        its keywords."""
        check_joint_losses(self.loss, self.supervised_loss)
        check_loss_keywords(self.loss, self.loss_kwargs)
        self.supervised_loss_kwargs = as_dict(self.supervised_loss_kwargs, "supervised_loss_kwargs") or {}
        supervised_loss(self.supervised_loss, self.supervised_loss_kwargs, role="supervised_loss")

    def check_stage(self) -> None:
        super().check_stage()
        self.check_threshold()
        if not 0.0 <= self.contrastive_weight <= 1.0:
            raise ValueError(f"contrastive_weight must lie in [0, 1]; got {self.contrastive_weight}")
        if self.contrastive_projection_dim < 0:
            raise ValueError(
                f"contrastive_projection_dim must be >= 0 (0 = the pooled representation); got "
                f"{self.contrastive_projection_dim}"
            )
        if self.contrastive_projection_dim and self.queue_size:
            raise ValueError(
                "contrastive_projection_dim > 0 projects the batch only: the queue's momentum keys have no "
                "projection head; use queue_size 0 or contrastive_projection_dim 0"
            )
        if self.n_views != 1:
            raise ValueError(
                "the joint objective classifies every row once: n_views must be 1 (the contrastive term pairs "
                f"the batch's documents by their labels); got {self.n_views}"
            )
