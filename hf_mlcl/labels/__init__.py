"""hf_mlcl.labels: the one home of label matrices — multi-hot conversion, pair relations and label statistics.

* :mod:`hf_mlcl.labels.multihot`: id lists -> multi-hot (:func:`multi_hot_tensor`, the collator's and the
  trainers'), validation and layouts (:func:`as_multihot`: 0/1, dense or torch-sparse; the integrations'
  :func:`labels_to_multihot`; the bool forms gathered across processes and kept in queues);
* :mod:`hf_mlcl.labels.relations`: intersections, sizes, unions, equality, Jaccard, MulSupCon's per-label
  counts and the R1-R5 relations by matrix products, held for one contrast set by :class:`PairRelations`;
* :mod:`hf_mlcl.labels.statistics`: the label count everyone must agree on (:func:`resolve_num_labels`),
  ws-MulSupCon's training-set class weights and the per-(anchor, label) products of :class:`PairLabelView`.

It depends on torch and numpy only: the data collators, the losses, the trainers and ``hf-mlcl inspect``
all read their labels through it.
"""

from .multihot import (
    LABEL_INPUT_FORMATS,
    as_multihot,
    dataset_label_matrix,
    ids_to_multihot,
    label_coordinates,
    labels_to_multihot,
    multi_hot_tensor,
    nonzero_pairs,
    to_dense_bool,
    to_dense_float,
    to_sparse_bool,
)
from .relations import (
    RELATIONS,
    PairRelations,
    intersections,
    jaccard,
    label_counts,
    label_sizes,
    relation_masks,
)
from .statistics import PairLabelView, resolve_num_labels, ws_class_weights

__all__ = [
    "LABEL_INPUT_FORMATS",
    "RELATIONS",
    "PairLabelView",
    "PairRelations",
    "as_multihot",
    "dataset_label_matrix",
    "ids_to_multihot",
    "intersections",
    "jaccard",
    "label_coordinates",
    "label_counts",
    "label_sizes",
    "labels_to_multihot",
    "multi_hot_tensor",
    "nonzero_pairs",
    "relation_masks",
    "resolve_num_labels",
    "to_dense_bool",
    "to_dense_float",
    "to_sparse_bool",
    "ws_class_weights",
]
