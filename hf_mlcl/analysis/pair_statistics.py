"""How each loss sees one batch: label relations and positives of every (anchor, candidate) pair.

The relations and positive rules are the ones the losses train with, read from their one definition:
:class:`~hf_mlcl.labels.relations.PairRelations` and :func:`~hf_mlcl.labels.relations.relation_masks` for the
Similarity-Dissimilarity paper's R1-R5 (Huang et al., sec. 2.3, eqs. 8-12; the first matching relation wins),
and each loss class's own rule (``AllLoss.positives``, ``MulSupConLoss.positive_label_pairs``,
ws-MulSupCon's ``healthy_positives``, HBL's ``gate_open``; the others: S & T non-empty). Counts come from
matrix products of the multi-hot matrices, with no loop over samples; the caller leaves anchors with an empty
S out of the relation counts.
"""

from __future__ import annotations

from torch import Tensor

from hf_mlcl.labels.relations import RELATIONS, PairRelations, relation_masks
from hf_mlcl.losses.all_ import AllLoss
from hf_mlcl.losses.any_ import AnyLoss
from hf_mlcl.losses.hbl import HBLLoss
from hf_mlcl.losses.mulsupcon import MulSupConLoss
from hf_mlcl.losses.ws_mulsupcon import WSMulSupConLoss

__all__ = ["RELATIONS", "batch_pair_statistics"]


def batch_pair_statistics(
    anchor_labels: Tensor, candidate_labels: Tensor, self_index: bool, k_min: int = 128
) -> dict[str, Tensor]:
    """Per-anchor counts for one step (all (N,) int64 tensors unless stated).

    Args:
        anchor_labels: (N, L) multi-hot (bool / 0-1) of the anchors.
        candidate_labels: (M, L) multi-hot of the candidates; when ``self_index`` is True the first N
            candidates are the anchors themselves and (i, i) is excluded.
        k_min: HBL's reliability gate.

    Returns counts ``R1`` ... ``R5`` (pairs per anchor in each relation), ``pos_all``, ``pos_any``
    (positives per anchor), ``pairs`` (abs(S)), ``pairs_without_positive`` (MulSupCon pairs with
    no candidate carrying the label), ``healthy_positives`` (empty-label candidates) and the bool
    ``gate_open``; plus ``sizes`` (abs(S)).
    """
    n = anchor_labels.shape[0]
    keys = candidate_labels[n:] if self_index else candidate_labels
    rel = PairRelations(anchor_labels, keys if keys.shape[0] or not self_index else None, self_index)
    sizes = rel.anchor_sizes.long()
    out = {name: mask.sum(1) for name, mask in relation_masks(rel).items()}
    out.update(
        pos_all=AllLoss.positives(rel).sum(1),
        pos_any=AnyLoss.positives(rel).sum(1),
        pairs=sizes,
        pairs_without_positive=sizes - MulSupConLoss.positive_label_pairs(rel).long(),
        healthy_positives=WSMulSupConLoss.healthy_positives(rel).long(),
        gate_open=HBLLoss.gate_open(rel, k_min),
        sizes=sizes,
    )
    return out
