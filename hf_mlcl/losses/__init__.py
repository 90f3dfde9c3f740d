"""hf_mlcl.losses: multi-label supervised contrastive losses and supervised baselines.

``get_loss(name, **kwargs)`` builds a registered loss; ``list_losses()`` lists canonical names.
Contrastive losses share one engine (:mod:`hf_mlcl.losses.core`) and label-relation helpers
(:mod:`hf_mlcl.losses.relations`); see ``LOSSES.md`` for the exact contract of each.
"""

from __future__ import annotations

import importlib

from . import all_, any_, jaccard, mulsupcon, similarity_dissimilarity, supervised  # noqa: F401  (register)
from .all_ import AllLoss
from .any_ import AnyLoss
from .core import ContrastContext, ContrastiveLoss, LossTerms, masked_log_softmax, weighted_contrastive_loss
from .jaccard import JaccardLoss
from .mulsupcon import MulSupConLoss
from .registry import get_loss, get_loss_class, list_contrastive_losses, list_losses, register_loss
from .similarity_dissimilarity import SimilarityDissimilarityLoss, similarity_dissimilarity_weights
from .supervised import AsymmetricLoss, BCELoss, FocalLoss, SupervisedLoss

# Modules written concurrently by other authors: imported if present (plain imports once they exist).
for _mod in ("msc", "ws_mulsupcon", "hbl"):
    try:
        importlib.import_module(f"{__name__}.{_mod}")
    except ModuleNotFoundError as _err:  # pragma: no cover - transitional
        if _err.name != f"{__name__}.{_mod}":
            raise

__all__ = [
    "get_loss",
    "get_loss_class",
    "list_losses",
    "list_contrastive_losses",
    "register_loss",
    "ContrastiveLoss",
    "ContrastContext",
    "LossTerms",
    "masked_log_softmax",
    "weighted_contrastive_loss",
    "AllLoss",
    "AnyLoss",
    "SimilarityDissimilarityLoss",
    "similarity_dissimilarity_weights",
    "JaccardLoss",
    "MulSupConLoss",
    "SupervisedLoss",
    "BCELoss",
    "FocalLoss",
    "AsymmetricLoss",
]
