"""Leave-one-out cosine kNN probe of an embedding space: a cheap representation-quality signal.

``ContrastiveTrainer`` reports it at evaluation time (``eval_knn_micro_f1`` ...); it works on any
(N, D) embeddings with (N, L) multi-hot labels.
"""

from __future__ import annotations

import numpy as np
import torch

from hf_mlcl.evaluation.inputs import to_numpy
from hf_mlcl.evaluation.metrics import per_label_f1

__all__ = ["knn_probe_metrics"]


def knn_probe_metrics(
    embeddings: np.ndarray | torch.Tensor, labels: np.ndarray | torch.Tensor, k: int = 10, block: int = 1024
) -> dict[str, float]:
    """Leave-one-out cosine kNN probe of an embedding space (cheap representation-quality signal).

    Scores of sample i = mean multi-hot label vector of its k nearest neighbours (cosine, i itself
    excluded); prediction = score >= 0.5 (majority vote). Returns ``knn_micro_f1``, ``knn_macro_f1``
    (mean per-label F1, labels never true nor predicted count 0) and ``knn_p@1`` (precision of the
    top-scored label; labels tied at the top count with their share, as P@k of
    :func:`~hf_mlcl.evaluation.compute_multilabel_metrics`, so no label order matters). Similarities are
    computed in row blocks (memory O(block * N)).
    """
    z = torch.as_tensor(to_numpy(embeddings, "embeddings"), dtype=torch.float32)
    y = torch.as_tensor(to_numpy(labels, "labels")) > 0.5
    n = z.shape[0]
    if n < 2:
        return {}
    k = max(1, min(int(k), n - 1))
    z = torch.nn.functional.normalize(z, dim=-1)
    yf = y.float()
    scores = torch.empty(n, y.shape[1])
    for start in range(0, n, block):
        stop = min(n, start + block)
        sim = z[start:stop] @ z.T
        sim[torch.arange(stop - start), torch.arange(start, stop)] = float("-inf")
        idx = sim.topk(k, dim=1).indices
        scores[start:stop] = yf[idx].mean(dim=1)
    truth, pred = y.numpy(), (scores >= 0.5).numpy()
    # micro-F1 = the F1 of all cells pooled as one label; macro-F1 = mean per-label F1 (0/0 -> 0)
    micro = float(per_label_f1(truth.reshape(-1, 1), pred.reshape(-1, 1))[0])
    macro = float(per_label_f1(truth, pred).mean())
    top = scores == scores.amax(dim=1, keepdim=True)  # every label tied at the top score
    p1 = float(((top & y).sum(dim=1).double() / top.sum(dim=1)).mean())
    return {"knn_micro_f1": micro, "knn_macro_f1": macro, "knn_p@1": p1}
