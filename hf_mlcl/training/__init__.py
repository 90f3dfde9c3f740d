"""hf_mlcl.training: argument dataclasses, the two Trainers, distributed gather, GradCache, entry points.

* :class:`ContrastiveTrainer` (stage 1) and :class:`ProbingTrainer` (stage 2), both
  ``transformers.Trainer`` subclasses;
* :func:`train_contrastive` / :func:`train_probe`: dataset -> tokenizer -> model -> trainer -> train ->
  evaluate -> save; :mod:`hf_mlcl.training.pipeline` runs them with model cards for the CLI and demo;
* :mod:`hf_mlcl.training.checkpoints`: launch and output-folder checks before any work,
  complete-or-absent checkpoints, which one a resume takes, the trainer's extra state as safetensors;
* :mod:`hf_mlcl.training.features`: frozen pooled features in memory and on disk (the linear probe);
* :mod:`hf_mlcl.training.distributed` (candidate gathering with gradient) and
  :mod:`hf_mlcl.training.gradcache` (GradCache, Gao et al. 2021).
"""

from hf_mlcl.evaluation.knn import knn_probe_metrics  # lives in hf_mlcl.evaluation.knn; kept importable here

from .arguments import ContrastiveTrainingArguments, DataArguments, ModelArguments, ProbingTrainingArguments
from .contrastive import ContrastiveTrainer, build_contrastive_loss
from .entry import train_contrastive, train_probe
from .gradcache import gradcache_backward
from .probing import ProbingTrainer, fit_logistic_probe

__all__ = [
    "ContrastiveTrainer",
    "ContrastiveTrainingArguments",
    "DataArguments",
    "ModelArguments",
    "ProbingTrainer",
    "ProbingTrainingArguments",
    "build_contrastive_loss",
    "fit_logistic_probe",
    "gradcache_backward",
    "knn_probe_metrics",
    "train_contrastive",
    "train_probe",
]
