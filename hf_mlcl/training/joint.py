"""`JointTrainer`: a classifier fine-tuned end to end with ``(1 - w) * supervised + w * contrastive`` per batch.

The supervised loss (bce, focal, asymmetric, zlpr) reads the head's logits, the contrastive loss (any
registered one, with its queue, contrast set, GradCache and gathers of :class:`ContrastiveTrainer`) the pooled
representation the head classifies, or a training-only projection of it (``contrastive_projection_dim``).
Evaluation and the threshold protocol are the probe's.

References: Gunel et al. 2021, "Supervised Contrastive Learning for Pre-trained Language Model Fine-tuning",
eq. 1; Lin et al. 2023, multi-label contrastive terms used jointly with BCE.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn

from hf_mlcl.losses.core import compute_dtype_for
from hf_mlcl.losses.registry import supervised_loss
from hf_mlcl.modeling.layers_mlcl import ProjectionHead

from .arguments import JointTrainingArguments
from .classifier_eval import ClassifierEvaluation
from .contrastive import ContrastiveTrainer

__all__ = ["JointTrainer"]


def _seeded_projection(width: int, dim: int, seed: int) -> ProjectionHead:
    """Khosla et al.'s projection head ``width -> width -> dim`` with ``nn.Linear``'s default distribution
    (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases) drawn from its own generator seeded with
    ``seed``: every process starts from the same head, and no global random state is read or changed."""
    generator = torch.Generator().manual_seed(seed)
    with torch.device("meta"):
        head = ProjectionHead(width, width, dim)
    head = head.to_empty(device="cpu")
    with torch.no_grad():
        for layer in (head.dense, head.out_proj):
            bound = layer.in_features**-0.5
            layer.weight.uniform_(-bound, bound, generator=generator)
            layer.bias.uniform_(-bound, bound, generator=generator)
    return head


class JointTrainer(ClassifierEvaluation, ContrastiveTrainer):
    """A `transformers.Trainer` for the joint objective ``(1 - w) * supervised + w * contrastive``.

    Args: those of :class:`~hf_mlcl.training.ContrastiveTrainer`, with
        model: an ``MLCLForMultiLabelClassification`` with a trainable encoder and a ``linear`` or ``native``
            head (``from_encoder(..., freeze_encoder=False)``); its output's ``embeddings`` (the pooled
            representation) feed the contrastive term, its ``logits`` the supervised one.
        args: ``JointTrainingArguments`` (``contrastive_weight`` w, ``supervised_loss``, the contrastive
            options of stage 1, ``threshold``).
        loss_fn: a ready contrastive loss (default: built from ``args``).
        supervised_loss_fn (keyword): a ready supervised loss (default: ``get_loss(args.supervised_loss,
            **args.supervised_loss_kwargs)``).

    Each training log has ``loss`` (the joint value), ``loss_supervised``, ``loss_contrastive`` and the
    contrastive loss's own parts. Evaluation reports the classifier's metrics (threshold 0.5, or the tuned
    one after :meth:`tune_threshold`) and the joint loss of each evaluation batch (in-batch candidates).

    Raises:
        ValueError: what :class:`ContrastiveTrainer` checks, a frozen encoder, a ``label_attention`` head,
            or a contrastive ``supervised_loss_fn``.

    Example:
        >>> model = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=names, freeze_encoder=False)
        >>> args = JointTrainingArguments(output_dir="out", loss="sd", contrastive_weight=0.5)
        >>> JointTrainer(model=model, args=args, train_dataset=ds, processing_class=tok).train()
    """

    projection: nn.Module | None = None  # the training-only projection head (contrastive_projection_dim)
    args_class = JointTrainingArguments
    args_hint = "JointTrainingArguments(output_dir=..., contrastive_weight=...)"
    model_hint = "MLCLForMultiLabelClassification.from_encoder(..., freeze_encoder=False)"

    def __init__(self, *positional: Any, supervised_loss_fn: nn.Module | None = None, **kwargs: Any) -> None:
        self._given_supervised_loss = supervised_loss_fn
        super().__init__(*positional, **kwargs)

    def stage_setup(self, model, args, train_dataset, data_collator, processing_class, loss_fn, num_labels):
        """The contrastive setup of stage 1 on the pooled width, the supervised loss and the start threshold."""
        config = getattr(model, "config", None)
        if getattr(config, "freeze_encoder", False):
            raise ValueError(
                "the joint objective trains the encoder: build the classifier with freeze_encoder=False"
            )
        if getattr(config, "head", "linear") == "label_attention":
            raise ValueError(
                "the joint objective reads the pooled representation of a linear or native head; "
                "head='label_attention' pools none"
            )
        collator = super().stage_setup(
            model, args, train_dataset, data_collator, processing_class, loss_fn, num_labels
        )
        self.supervised_loss_fn = supervised_loss(
            args.supervised_loss,
            args.supervised_loss_kwargs,
            self._given_supervised_loss,
            "supervised_loss_fn",
        )
        self._width = int(model.backbone_hidden_size)  # the pooled part of [embeddings | logits]
        self.projection = None
        if args.contrastive_projection_dim:
            self.projection = _seeded_projection(self._width, args.contrastive_projection_dim, args.seed)
        self.start_threshold(args)
        return collator

    def embedding_width(self, model: nn.Module, args: Any) -> int:
        """The width the contrastive term reads: the pooled representation's (the backbone's hidden size), or
        ``contrastive_projection_dim`` behind a projection head."""
        return int(args.contrastive_projection_dim or model.backbone_hidden_size)

    def after_setup(self) -> None:
        if self.projection is not None:
            self.projection.to(self.args.device)
        super().after_setup()
        self.supervised_loss_fn.to(self.args.device)

    def _loss_parameters(self) -> list[nn.Parameter]:
        """The contrastive loss's parameters and the projection head's: trained, averaged over processes and
        checkpointed beside the model, not saved with the classifier."""
        head = [] if self.projection is None else list(self.projection.parameters())
        return [*super()._loss_parameters(), *head]

    def extra_state_dict(self) -> dict[str, Any]:
        state = super().extra_state_dict()
        if self.projection is not None:
            state["projection"] = self.projection.state_dict()
        return state

    def load_extra_state_dict(self, state: dict[str, Any]) -> None:
        super().load_extra_state_dict(state)
        if self.projection is not None and "projection" in state:
            self.projection.load_state_dict(state["projection"])

    # ------------------------------------------------------------------ encoding and loss
    def _encode(self, model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        """``[embeddings | logits]`` (B, hidden + L) in the losses' dtype (float32, or float64 for a float64
        model): one tensor, so that GradCache caches the gradient of both terms with respect to both outputs."""
        outputs = model(**batch)
        dtype = compute_dtype_for(outputs.embeddings, outputs.logits)
        return torch.cat([outputs.embeddings.to(dtype), outputs.logits.to(dtype)], dim=-1)

    def _loss_parts(
        self, encoded: torch.Tensor, labels: torch.Tensor, batch_keys: tuple | None = None
    ) -> dict[str, torch.Tensor]:
        """``(1 - w) * supervised + w * contrastive`` and its parts (``supervised``, ``contrastive`` and the
        contrastive loss's own)."""
        embeddings, logits = encoded[:, : self._width], encoded[:, self._width :]
        if self.projection is not None:  # a float32 head, whatever the model's dtype
            embeddings = self.projection(embeddings.to(self.projection.dense.weight.dtype))
        contrastive = super()._loss_parts(embeddings, labels, batch_keys)
        supervised = self.supervised_loss_fn(logits, labels)
        w = float(self.args.contrastive_weight)
        parts = {name: value for name, value in contrastive.items() if name != "loss"}
        parts.update(contrastive=contrastive["loss"].detach(), supervised=supervised.detach())
        parts["loss"] = (1.0 - w) * supervised + w * contrastive["loss"]
        return parts

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """The joint loss of one micro-batch; with ``return_outputs`` also ``{"logits": ...}``."""
        loss, encoded = super().compute_loss(model, inputs, True, num_items_in_batch)
        return (loss, {"logits": encoded[:, self._width :]}) if return_outputs else loss

    # ------------------------------------------------------------------ evaluation
    @contextmanager
    def _every_row(self) -> Iterator[None]:
        """While an evaluation loader is built: no dropped last batch (training keeps the stage-1 default,
        equal contrast sets per process; predictions need every row)."""
        drop, self.args.dataloader_drop_last = self.args.dataloader_drop_last, False
        try:
            yield
        finally:
            self.args.dataloader_drop_last = drop

    def get_eval_dataloader(self, eval_dataset: Any = None):
        with self._every_row():
            return super().get_eval_dataloader(eval_dataset)

    def get_test_dataloader(self, test_dataset: Any):
        with self._every_row():
            return super().get_test_dataloader(test_dataset)
