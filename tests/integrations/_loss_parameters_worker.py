"""One of two gloo processes of tests/integrations/test_integrations_loss_parameters_ddp.py.

Usage: python _loss_parameters_worker.py RANK WORLD_SIZE FOLDER. FOLDER holds the SentenceTransformer
(``st``), the texts and labels of each rank (``batches.pt``) and the process group's file store. The process
computes the msc loss of its own batch with the sentence-transformers loss (plain and GradCache) and with
``ContrastiveLossFunc``, backpropagates, and writes the prototypes' gradients to ``FOLDER/grads<RANK>.pt``;
then one training batch of each integration with a queue, whose contents go to ``FOLDER/queues<RANK>.pt``.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from sentence_transformers import SentenceTransformer

from hf_mlcl.integrations.sentence_transformers import (
    CachedMultiLabelContrastiveLoss,
    MultiLabelContrastiveLoss,
)
from hf_mlcl.integrations.trainer import ContrastiveLossFunc
from hf_mlcl.training import distributed as D


def backward(name: str, loss, model: SentenceTransformer, texts: list[str], labels: torch.Tensor) -> None:
    """One batch through an integration's loss, and its backward (``compute_loss_func`` takes the embeddings)."""
    features = [model.preprocess(texts)]
    if name == "compute_loss_func":
        value = loss(model(features[0])["sentence_embedding"], labels)
    else:
        value = loss(features, labels)
    value.backward()


def prototype_gradients(
    model: SentenceTransformer, texts: list[str], labels: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The prototypes' gradient of each integration's msc loss on one batch, the prototypes starting equal."""
    num_labels = labels.shape[1]
    torch.manual_seed(0)  # the same prototypes in every process (as Trainer's seed gives them)
    losses = {
        "sentence_transformers": MultiLabelContrastiveLoss(model, "msc", num_labels=num_labels),
        "sentence_transformers_cached": CachedMultiLabelContrastiveLoss(
            model, "msc", mini_batch_size=3, num_labels=num_labels
        ),
        "compute_loss_func": ContrastiveLossFunc(
            "msc",
            num_labels=num_labels,
            embedding_dim=model.get_embedding_dimension(),
            gather_across_devices=False,
        ),
    }
    start = losses["sentence_transformers"].loss_fn.state_dict()
    grads = {}
    mean = D.mean_over_processes
    for name, loss in losses.items():
        loss.loss_fn.load_state_dict(start)
        calls = []
        D.mean_over_processes = lambda grad, calls=calls: (
            calls.append(1) or mean(grad)
        )  # count one backward's averages
        try:
            backward(name, loss, model, texts, labels)
        finally:
            D.mean_over_processes = mean
        grads[name] = loss.loss_fn.prototypes.grad.clone()
        grads[f"{name}_averages"] = torch.tensor(len(calls))
    return grads


def queue_contents(model: SentenceTransformer, texts: list[str], labels: torch.Tensor) -> dict[str, tuple]:
    """The queue (keys, labels) of each integration after one training batch (queue of 12 keys)."""
    num_labels = labels.shape[1]
    losses = {
        "sentence_transformers": MultiLabelContrastiveLoss(
            model, "mulsupcon", num_labels=num_labels, queue_size=12
        ),
        "compute_loss_func": ContrastiveLossFunc("mulsupcon", num_labels=num_labels, queue_size=12),
    }
    out = {}
    for name, loss in losses.items():
        backward(name, loss, model, texts, labels)
        out[name] = (loss.queue.embeddings.detach().clone(), loss.queue.labels.clone())
    return out


def main() -> None:
    rank, world_size, folder = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    if world_size > 1:
        store = f"file://{os.path.join(folder, 'store')}"
        dist.init_process_group("gloo", init_method=store, rank=rank, world_size=world_size)
    model = SentenceTransformer(os.path.join(folder, "st"), device="cpu")
    model.eval()  # no dropout: the single-process reference sees the same embeddings
    batches = torch.load(os.path.join(folder, "batches.pt"))
    texts, labels = batches[rank]
    torch.save(prototype_gradients(model, texts, labels), os.path.join(folder, f"grads{rank}.pt"))
    torch.save(queue_contents(model, texts, labels), os.path.join(folder, f"queues{rank}.pt"))
    if world_size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
