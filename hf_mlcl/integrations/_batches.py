"""One batch of an integration: labels to multi-hot and the loss, with the value checks on the first batch.

Both integrations (:mod:`hf_mlcl.integrations.sentence_transformers`, :mod:`hf_mlcl.integrations.trainer`)
turn the batch's labels (multi-hot rows or -1-padded id lists, :func:`hf_mlcl.labels.multihot.labels_to_multihot`)
into a multi-hot matrix and call the loss on this step's candidates
(:class:`hf_mlcl.training.memory.CandidateBuilder`). The checks that read values on the host — the
label format under ``"auto"`` (are integer labels 0/1?), the id range, labels 0/1 and finite embeddings
(the loss's ``check_inputs``) — run on the first batch (the format once per label dtype and width); later
batches read nothing on the host, so a training step does not wait for the accelerator. An id out of
range in a later batch still fails (an index error of the scatter).

A loss's own parameters (``msc``'s prototypes) are outside the model that the trainer wraps for several
processes, so nothing would average their gradients: each process would train its own copy. Their
gradients are averaged over the processes by a hook (:func:`hf_mlcl.training.distributed.mean_over_processes`),
as ``ContrastiveTrainer`` does for them.
"""

from __future__ import annotations

from torch import Tensor, nn

from hf_mlcl.labels.multihot import labels_to_multihot, resolve_label_format
from hf_mlcl.losses.input_checks import FirstCallChecks
from hf_mlcl.training import distributed as D
from hf_mlcl.training.memory import CandidateBuilder

__all__ = ["BatchLoss"]


class BatchLoss:
    """``loss_fn`` on one batch of embeddings and labels, checking the first batch's values only.

    Args:
        loss_fn: a contrastive loss (its ``check_inputs`` is managed here).
        num_labels: size of the label space (or None: the multi-hot width).
        label_format: ``"auto"``, ``"multi_hot"`` or ``"ids"``.
        gather_across_devices: contrast with every process's candidates (batch mode).
    """

    def __init__(
        self, loss_fn: nn.Module, num_labels: int | None, label_format: str, gather_across_devices: bool
    ) -> None:
        self.loss_fn = loss_fn
        self.num_labels = num_labels
        self.label_format = label_format
        self.checks = FirstCallChecks(loss_fn)
        self.candidates = CandidateBuilder(
            None, gather=gather_across_devices, supports_keys=getattr(loss_fn, "supports_keys", False)
        )
        self._formats: dict[tuple, str] = {}
        for parameter in loss_fn.parameters():
            if parameter.requires_grad:
                parameter.register_hook(D.mean_over_processes)

    def multi_hot(self, labels: Tensor, check_values: bool = True) -> Tensor:
        """The batch's labels as a (B, L) float32 multi-hot matrix; ``"auto"`` is resolved once per label
        dtype and width (:func:`~hf_mlcl.labels.multihot.resolve_label_format`)."""
        if not isinstance(labels, Tensor) or labels.dim() != 2:  # the ValueError naming the problem
            return labels_to_multihot(labels, self.num_labels, self.label_format)
        key = (labels.dtype, labels.layout, labels.shape[1])
        fmt = self._formats.get(key)
        if fmt is None:
            fmt = self._formats[key] = resolve_label_format(labels, self.num_labels, self.label_format)
        return labels_to_multihot(labels, self.num_labels, fmt, check_values=check_values)

    def __call__(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        with self.checks():
            y = self.multi_hot(labels.to(embeddings.device), check_values=self.checks.pending)
            return self.candidates.step(embeddings, y).loss(self.loss_fn)
