"""hf_mlcl.losses: multi-label supervised contrastive losses and supervised baselines.

``get_loss(name, **kwargs)`` builds a registered loss; ``list_losses()`` lists canonical names.
Contrastive losses share one engine (:mod:`hf_mlcl.losses.core`) and label-relation helpers
(:mod:`hf_mlcl.labels.relations`); ``docs/losses.md`` of the repository states the contract of each
(contrast set, positives, weights, normaliser, the choices made where a paper is ambiguous), and each
loss module cites its paper and equations.
"""

from __future__ import annotations

from . import (  # noqa: F401  (importing registers the losses)
    all_,
    any_,
    hbl,
    jaccard,
    msc,
    mulsupcon,
    similarity_dissimilarity,
    supervised,
    ws_mulsupcon,
)
from .all_ import AllLoss
from .any_ import AnyLoss
from .core import ContrastContext, ContrastiveLoss, LossTerms
from .hbl import HBLLoss
from .jaccard import JaccardLoss
from .msc import MSCLoss
from .mulsupcon import MulSupConLoss
from .registry import (
    LossSettings,
    build_contrastive_loss,
    check_supervised_loss,
    get_loss,
    get_loss_class,
    list_contrastive_losses,
    list_losses,
    list_supervised_losses,
    register_loss,
)
from .similarity_dissimilarity import SimilarityDissimilarityLoss, similarity_dissimilarity_weights
from .supervised import AsymmetricLoss, BCELoss, FocalLoss, SupervisedLoss, ZLPRLoss
from .ws_mulsupcon import WSMulSupConLoss

__all__ = [
    "LossSettings",
    "build_contrastive_loss",
    "get_loss",
    "get_loss_class",
    "list_losses",
    "list_contrastive_losses",
    "list_supervised_losses",
    "check_supervised_loss",
    "register_loss",
    "ContrastiveLoss",
    "ContrastContext",
    "LossTerms",
    "AllLoss",
    "AnyLoss",
    "SimilarityDissimilarityLoss",
    "similarity_dissimilarity_weights",
    "JaccardLoss",
    "MulSupConLoss",
    "MSCLoss",
    "WSMulSupConLoss",
    "HBLLoss",
    "SupervisedLoss",
    "BCELoss",
    "FocalLoss",
    "AsymmetricLoss",
    "ZLPRLoss",
]
