"""How each loss sees one batch: label relations and positives of every (anchor, candidate) pair.

All counts come from the multi-hot matrices by matrix products (intersection = Y_a @ Y_c^T, sizes =
row sums), as in :mod:`hf_mlcl.losses.relations`; nothing is N x M x L and nothing loops over samples.

Relations (Similarity-Dissimilarity paper, Huang et al., sec. 2.3, eqs. 8-12), anchor label set S,
candidate label set T; anchors with an empty S are left out (no loss uses them as label anchors), and
the first matching relation wins, so a candidate with an empty T is R1:

    R1  S & T empty           R2  S == T           R3  overlap, neither contains the other
    R4  S strictly contains T                      R5  S strictly inside T

Positives per loss (LOSSES contract, ``docs/losses.md``): ``all`` T == S; ``any`` / ``sd`` / ``jaccard``
/ ``msc`` samples / ``hbl`` S & T non-empty; ``mulsupcon`` per (anchor, label) pair, the candidates
carrying the label; ws-MulSupCon strata: single-label (abs(S) = 1) and multi-label anchors need a
candidate sharing a label, healthy anchors (S empty) another healthy candidate. HBL's gate (eq. 6, as
implemented): abs(P) >= k_min and both the soft (J >= median) and hard (J < median) halves non-empty.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hf_mlcl.losses.hbl import hbl_median_thresholds

__all__ = ["RELATIONS", "batch_pair_statistics"]

RELATIONS = ("R1", "R2", "R3", "R4", "R5")


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
    ya = anchor_labels.to(torch.float32)
    yc = candidate_labels.to(torch.float32)
    n, m = ya.shape[0], yc.shape[0]
    inter = ya @ yc.T
    sa, sc = ya.sum(1), yc.sum(1)
    valid = torch.ones(n, m, dtype=torch.bool)
    if self_index and n:
        valid[:, :n] &= ~torch.eye(n, dtype=torch.bool)
    a, c = sa[:, None], sc[None, :]
    share = (inter > 0) & valid
    r1 = (inter == 0) & valid
    r2 = share & (inter == a) & (inter == c)
    r4 = share & (inter == c) & (c < a)
    r5 = share & (inter == a) & (a < c)
    r3 = share & (inter < a) & (inter < c)
    # per-label candidate counts for MulSupCon: n_l(i) = colsum(Y_c) - own row
    col = yc.sum(0)[None, :].expand(n, -1)
    if self_index and n:
        col = col - yc[:n]
    pairs_without = ((ya > 0) & (col <= 0)).sum(1)
    jac = torch.where(inter > 0, inter / (a + c - inter).clamp_min(1), torch.zeros_like(inter))
    theta, n_pos = hbl_median_thresholds(jac, share)
    hard = (share & (jac < theta[:, None])).any(1)
    gate = (n_pos >= k_min) & hard & (sa > 0)
    healthy = ((sc == 0)[None, :] & valid).sum(1)
    out = {name: r.sum(1) for name, r in zip(RELATIONS, (r1, r2, r3, r4, r5))}
    out.update(
        pos_all=r2.sum(1) * (sa > 0),
        pos_any=share.sum(1),
        pairs=sa.long(),
        pairs_without_positive=pairs_without,
        healthy_positives=healthy,
        gate_open=gate,
        sizes=sa.long(),
    )
    return out
