"""hf_mlcl.training: the stages, their trainers and what they train with, one module per role.

* stages: :mod:`~hf_mlcl.training.stages` (the orchestrator, ``run_stages``), ``encoder_stage``,
  ``classifier_stages``, ``stage_steps`` and ``saved_evaluation``; their settings in ``arguments``;
* trainers on one base (``base``): :class:`ContrastiveTrainer`, :class:`ProbingTrainer`, :class:`JointTrainer`;
* what a step trains with: ``memory`` (the MoCo queue, :class:`MomentumContrast`), ``momentum`` (the key
  encoder), ``features`` (frozen features), ``gradcache`` (Gao et al. 2021), ``distributed`` (gathering);
* runs: ``preflight``, ``checkpoints``, ``state_file``, ``launch``.

Each module's job: docs/usage.md, "The package layout".
"""

from hf_mlcl.evaluation.knn import knn_probe_metrics  # lives in hf_mlcl.evaluation.knn; kept importable here
from hf_mlcl.evaluation.logistic import fit_logistic_probe  # lives in hf_mlcl.evaluation.logistic

from .arguments import (
    ContrastiveTrainingArguments,
    DataArguments,
    JointTrainingArguments,
    ModelArguments,
    ProbingTrainingArguments,
)
from .contrastive import ContrastiveSetup, ContrastiveTrainer
from .gradcache import gradcache_backward
from .joint import JointTrainer
from .memory import EmbeddingQueue, MomentumContrast
from .momentum import AdapterMomentumEncoder, MomentumEncoder
from .probing import ProbingTrainer
from .stages import RunData, StageResult, load_run_data, run_stages, train_contrastive, train_probe

__all__ = [
    "AdapterMomentumEncoder",
    "ContrastiveSetup",
    "ContrastiveTrainer",
    "ContrastiveTrainingArguments",
    "DataArguments",
    "EmbeddingQueue",
    "JointTrainer",
    "JointTrainingArguments",
    "ModelArguments",
    "MomentumContrast",
    "MomentumEncoder",
    "ProbingTrainer",
    "ProbingTrainingArguments",
    "RunData",
    "StageResult",
    "fit_logistic_probe",
    "gradcache_backward",
    "knn_probe_metrics",
    "load_run_data",
    "run_stages",
    "train_contrastive",
    "train_probe",
]
