"""hf_mlcl.evaluation: multi-label metrics, threshold tuning, embedding-space quality and plots.

One module per concept: ``inputs`` (checked arrays, sigmoid), ``metrics`` (the scores of a split),
``ranking`` (AP / AUC / top-k engines), ``thresholds`` (tuning), ``streaming`` (a split in row chunks,
for large label counts), ``trainer_metrics`` (the ``compute_metrics`` adapter), ``knn`` (the kNN probe
of an embedding space), ``embedding`` (embedding-space quality), ``plots`` and ``tables`` (Markdown
result tables).

Metric key names and 0/0 conventions are documented in :mod:`hf_mlcl.evaluation.metrics`. The
``evaluate`` module lives in the folder ``METRIC_PATH``::

    metric = evaluate.load(hf_mlcl.evaluation.METRIC_PATH)   # works with HF_HUB_OFFLINE=1

Plots and embedding metrics import matplotlib / scikit-learn lazily.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from hf_mlcl.evaluation.inputs import apply_threshold, predictions_to_scores, sigmoid
from hf_mlcl.evaluation.metrics import (
    DEFAULT_KS,
    METRIC_KEYS,
    compute_multilabel_metrics,
    metric_keys,
    per_label_f1,
    per_label_scores,
)
from hf_mlcl.evaluation.streaming import MultiLabelAccumulator
from hf_mlcl.evaluation.thresholds import (
    threshold_grid,
    tune_and_evaluate,
    tune_global_threshold,
    tune_per_label_thresholds,
)
from hf_mlcl.evaluation.trainer_metrics import make_compute_metrics

METRIC_PATH: str = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multilabel_metric")

_LAZY = {
    "format_table": "hf_mlcl.evaluation.tables",
    "knn_probe_metrics": "hf_mlcl.evaluation.knn",
    "embedding_quality": "hf_mlcl.evaluation.embedding",
    "label_combinations": "hf_mlcl.evaluation.embedding",
    "top_combination_clusters": "hf_mlcl.evaluation.embedding",
    "plot_f1_vs_frequency": "hf_mlcl.evaluation.plots",
    "f1_by_frequency_bin": "hf_mlcl.evaluation.plots",
    "plot_embedding_projection": "hf_mlcl.evaluation.plots",
}

__all__ = [
    "DEFAULT_KS",
    "METRIC_KEYS",
    "METRIC_PATH",
    "MultiLabelAccumulator",
    "apply_threshold",
    "compute_multilabel_metrics",
    "make_compute_metrics",
    "metric_keys",
    "per_label_f1",
    "per_label_scores",
    "predictions_to_scores",
    "sigmoid",
    "threshold_grid",
    "tune_and_evaluate",
    "tune_global_threshold",
    "tune_per_label_thresholds",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'hf_mlcl.evaluation' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
