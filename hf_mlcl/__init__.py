"""hf_mlcl: multi-label supervised contrastive learning for text encoders on the HuggingFace stack.

The common entry points are importable from the package root; they are resolved lazily so that
``import hf_mlcl`` stays cheap (no torch / transformers import until a name is used).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "get_loss": "hf_mlcl.losses",
    "list_losses": "hf_mlcl.losses",
    "MLCLConfig": "hf_mlcl.modeling",
    "MLCLEncoder": "hf_mlcl.modeling",
    "MLCLForMultiLabelClassification": "hf_mlcl.modeling",
    "load_mlc_dataset": "hf_mlcl.data",
    "list_datasets": "hf_mlcl.data",
    "make_synthetic_corpus": "hf_mlcl.data",
    "MultiLabelCollator": "hf_mlcl.data",
    "compute_multilabel_metrics": "hf_mlcl.evaluation",
    "ContrastiveTrainer": "hf_mlcl.training",
    "ProbingTrainer": "hf_mlcl.training",
    "JointTrainer": "hf_mlcl.training",
    "ContrastiveTrainingArguments": "hf_mlcl.training.arguments",
    "ProbingTrainingArguments": "hf_mlcl.training.arguments",
    "JointTrainingArguments": "hf_mlcl.training.arguments",
    "ModelArguments": "hf_mlcl.training.arguments",
    "DataArguments": "hf_mlcl.training.arguments",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hf_mlcl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
