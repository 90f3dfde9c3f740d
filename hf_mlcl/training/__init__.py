"""hf_mlcl.training: the stages, their trainers and what they train with. One module per role:

* :mod:`~hf_mlcl.training.stages`: the orchestrator — each stage with its model card and ``run_stages`` (what
  the CLI, the demo and the study call); the stages themselves: :mod:`~hf_mlcl.training.encoder_stage`
  (``train_contrastive``), :mod:`~hf_mlcl.training.classifier_stages` (``train_probe``, ``train_joint``), the
  steps they share (:mod:`~hf_mlcl.training.stage_steps`: data, fit, save) and a saved classifier's
  evaluation (:mod:`~hf_mlcl.training.saved_evaluation`);
* :mod:`~hf_mlcl.training.arguments`: the argument dataclasses a recipe parses into;
* :mod:`~hf_mlcl.training.base`, :mod:`~hf_mlcl.training.contrastive`, :mod:`~hf_mlcl.training.probing`:
  :class:`ContrastiveTrainer` (stage 1) and :class:`ProbingTrainer` (stage 2), ``transformers.Trainer``
  subclasses on one shared base; :mod:`~hf_mlcl.training.joint`: :class:`JointTrainer` (both losses at once);
* :mod:`~hf_mlcl.training.memory` (the MoCo queue, the contrast set of a step, :class:`MomentumContrast`
  wrapping any loss) and :mod:`~hf_mlcl.training.momentum` (the key encoder);
* :mod:`~hf_mlcl.training.features`: frozen pooled features in memory and on disk (the linear probe);
* :mod:`~hf_mlcl.training.preflight` (launch and output-folder checks before any work),
  :mod:`~hf_mlcl.training.checkpoints` (complete-or-absent checkpoints, which one a resume takes) and
  :mod:`~hf_mlcl.training.state_file` (the trainer's extra state as safetensors);
* :mod:`~hf_mlcl.training.launch` (what the launch asked for — DeepSpeed / FSDP — and got; one failing
  process stops every process of it), :mod:`~hf_mlcl.training.distributed` (gathering with gradient,
  barriers, a clean shutdown) and :mod:`~hf_mlcl.training.gradcache` (GradCache, Gao et al. 2021).
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
