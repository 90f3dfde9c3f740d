"""What stage 1 trains with (:class:`ContrastiveSetup`), built from its arguments before the Trainer exists:
the loss, the label count, the collator and, with a queue, the MoCo piece (key encoder, queue, contrast set);
and the warning for an HBL reliability gate that no step can open.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch.nn as nn

from hf_mlcl.labels.multihot import dataset_label_matrix
from hf_mlcl.labels.statistics import resolve_num_labels
from hf_mlcl.losses.registry import build_contrastive_loss

from .base import MultiLabelTrainer
from .contrast_sets import check_queue_loss, max_candidates, resolve_contrast_set
from .embedding_queue import EmbeddingQueue
from .launch import launch_problem
from .memory import MomentumContrast
from .momentum import build_key_encoder
from .stage_arguments import ContrastiveTrainingArguments, check_n_views

__all__ = ["ContrastiveSetup", "warn_if_gate_cannot_open"]


@dataclass
class ContrastiveSetup:
    """What stage 1 trains with, built from its arguments before the Trainer exists (:meth:`from_args`); the
    MoCo piece and its contrast set follow once the trainer knows whether an engine shards the model
    (:meth:`memory`).

    Attributes: the loss, the label count (dataset, model, loss and queue agree on it), the collator, the
    embedding width, and ready MoCo parts given by the caller.
    """

    loss_fn: nn.Module
    num_labels: int
    data_collator: Any
    embedding_dim: int | None
    queue: EmbeddingQueue | None = None
    momentum_encoder: Any = None

    @classmethod
    def from_args(
        cls,
        args: ContrastiveTrainingArguments,
        model: nn.Module,
        train_dataset: Any,
        label_column: str,
        num_labels: int | None = None,
        loss_fn: nn.Module | None = None,
        data_collator: Any = None,
        processing_class: Any = None,
        queue: EmbeddingQueue | None = None,
        momentum_encoder: Any = None,
        embedding_dim: int | None = None,
    ) -> ContrastiveSetup:
        """The setup of the arguments (``embedding_dim``: the width the loss reads, default the model's
        ``projection_dim``); ValueError (one line) for: ``n_views`` not in {1, 2}, a launch that
        cannot run as asked, a collator with other views, an unknown or supervised loss, a queue with a loss
        that cannot take keys, and a label count that differs between dataset / model / loss / queue /
        collator. The arguments' own checks come first, then the loss, then the label space."""
        check_n_views(args.n_views)
        if getattr(args, "train_sampling_strategy", None) == "group_by_length":
            warnings.warn(
                "train_sampling_strategy group_by_length batches rows of similar length together: every step's "
                "contrast set then depends on the texts' lengths; padding_free removes padding with random "
                "batches (decoder backbones)",
                UserWarning,
                stacklevel=4,
            )
        problem = launch_problem(args)
        if problem:  # e.g. GradCache under DeepSpeed: before the Trainer builds anything
            raise ValueError(problem)
        if (
            embedding_dim is None
        ):  # the model's projection head (MLCLEncoder), else unknown until a queue needs it
            width = getattr(getattr(model, "config", None), "projection_dim", None)
            embedding_dim = int(width) if width else None
        n_labels = resolve_num_labels(train_dataset, num_labels, label_column, model=model)
        collator = MultiLabelTrainer.collator_for(data_collator, processing_class, n_labels, args.n_views)
        if loss_fn is None:
            loss_fn = build_contrastive_loss(
                args.loss, args.loss_kwargs, args.temperature, n_labels, embedding_dim
            )
        elif not getattr(loss_fn, "is_contrastive", False):
            raise ValueError(
                f"loss_fn {type(loss_fn).__name__} is not a contrastive loss (is_contrastive is False)"
            )
        check_queue_loss(loss_fn, args.queue_size)
        if getattr(args, "batch_sampler", "random") == "positives" and not getattr(
            loss_fn, "sampler_rule", None
        ):
            similarity = getattr(loss_fn, "label_similarity_name", None)
            raise ValueError(
                "batch_sampler 'positives' groups rows that share a label or a label set, which need not be "
                f"positives of {type(loss_fn).__name__}"
                + (f" (label_similarity={similarity})" if similarity else " (it names no sampler_rule)")
                + ": use batch_sampler 'random', or a set similarity without a threshold"
            )
        resolve_num_labels(train_dataset, n_labels, label_column, model=model, loss=loss_fn, queue=queue)
        if getattr(loss_fn, "requires_label_statistics", False):
            if train_dataset is None:
                raise ValueError(
                    f"{type(loss_fn).__name__} needs training-set label statistics; pass train_dataset"
                )
            loss_fn.set_label_statistics(dataset_label_matrix(train_dataset, label_column, n_labels))
        return cls(loss_fn, n_labels, collator, embedding_dim, queue, momentum_encoder)

    def memory(
        self, args: ContrastiveTrainingArguments, model: nn.Module, sharded: bool, runner
    ) -> MomentumContrast | None:
        """The MoCo piece (``queue_size > 0``), on the training device: the loss paper's contrast set (or
        ``args.contrast_set``: ValueError when the loss cannot take it), the key encoder (a copy sharing the
        frozen base, or under DeepSpeed / FSDP a second adapter of the prepared model ``runner()``) and the
        queue (built on the device: its label format depends on it); None in batch mode."""
        if args.queue_size <= 0:
            return None
        # the checks first: the key encoder is a copy of the model (under sharding, a second adapter)
        resolve_contrast_set(self.loss_fn, args.contrast_set, args.queue_size)
        if self.queue is None and self.embedding_dim is None:
            raise ValueError(
                f"queue_size={args.queue_size}: the queue needs the embeddings' width; use a model whose config "
                "has projection_dim (MLCLEncoder) or pass a ready EmbeddingQueue(queue=...)"
            )
        key_encoder = self.momentum_encoder or build_key_encoder(
            model, args.momentum, sharded, runner, args.queue_size
        )
        queue = self.queue
        if queue is None:  # a given queue is empty, hence falsy: never `or`
            queue = EmbeddingQueue(args.queue_size, self.embedding_dim, self.num_labels, device=args.device)
        moco = MomentumContrast(
            self.loss_fn,
            key_encoder,
            queue,
            args.contrast_set,
            args.queue_warmup,
            gather=args.gather_across_devices,
        )
        return moco.to(args.device)


def warn_if_gate_cannot_open(
    loss_fn: nn.Module, args: ContrastiveTrainingArguments, contrast_set: str | None
) -> None:
    """One warning when HBL's reliability gate (abs(P) >= k_min) can never open: fewer candidates than k_min
    per anchor in batch + queue, so the structural term is exactly zero."""
    k_min = getattr(loss_fn, "k_min", None)
    if k_min is None or getattr(loss_fn, "lambda_", 1.0) == 0:
        return
    world = max(1, args.world_size)
    reach = max_candidates(
        args.per_device_train_batch_size,
        world,
        args.n_views,
        args.queue_size,
        contrast_set,
        gather=args.gather_across_devices,
    )
    if reach < k_min:
        warnings.warn(
            f"{type(loss_fn).__name__}: k_min={k_min} but an anchor has at most {reach} candidates per step "
            f"(batch {args.per_device_train_batch_size} x {world} processes, queue_size={args.queue_size}, "
            f"contrast set {contrast_set or 'in-batch'}): the reliability gate never opens and the HBL term "
            "adds exactly 0; raise queue_size / the batch size or lower k_min",
            UserWarning,
            stacklevel=5,
        )
