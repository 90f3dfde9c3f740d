"""hf_mlcl.analysis: how each contrastive loss will see a dataset, before any GPU hour is spent.

``inspect_dataset(name, data_dir, splits)`` / ``inspect_labels(label_lists, num_labels)`` sample real
batches (with a queue and several processes) and report label cardinality and long tail, the
Similarity-Dissimilarity relations R1-R5 of (anchor, candidate) pairs, positives and wasted anchors
per loss, HBL's gate-open rate and a queue-size recommendation; ``write_report`` writes the table,
JSON and PNGs. The ``hf-mlcl inspect`` command is a thin caller.
"""

from .pair_statistics import RELATIONS, batch_pair_statistics
from .report import QUEUE_GRID, format_report, inspect_dataset, inspect_labels, write_report

__all__ = [
    "QUEUE_GRID",
    "RELATIONS",
    "batch_pair_statistics",
    "format_report",
    "inspect_dataset",
    "inspect_labels",
    "write_report",
]
