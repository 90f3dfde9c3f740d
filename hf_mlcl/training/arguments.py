"""Argument dataclasses read by `HfArgumentParser` from a recipe YAML and command-line overrides.

`ModelArguments` and `DataArguments` describe what to train on (:mod:`hf_mlcl.training.model_data_arguments`);
`ContrastiveTrainingArguments` (stage 1), `ProbingTrainingArguments` (stage 2) and `JointTrainingArguments`
are `transformers.TrainingArguments` subclasses (:mod:`hf_mlcl.training.stage_arguments`), so every Trainer
knob (``learning_rate``, ``bf16``, ``eval_strategy`` ...) sits beside ours. All are importable from here.
"""

from __future__ import annotations

from .model_data_arguments import DataArguments, ModelArguments, as_dict
from .stage_arguments import (
    BATCH_SAMPLERS,
    PROBES,
    THRESHOLDS,
    ContrastiveTrainingArguments,
    DecisionThresholdArguments,
    JointTrainingArguments,
    ProbingTrainingArguments,
    StageTrainingArguments,
    check_n_views,
)

__all__ = [
    "BATCH_SAMPLERS",
    "PROBES",
    "THRESHOLDS",
    "ContrastiveTrainingArguments",
    "DataArguments",
    "DecisionThresholdArguments",
    "JointTrainingArguments",
    "ModelArguments",
    "ProbingTrainingArguments",
    "StageTrainingArguments",
    "as_dict",
    "check_n_views",
]
