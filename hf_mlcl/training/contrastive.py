"""`ContrastiveTrainer`: stage 1, label-aware contrastive training of an encoder with `transformers.Trainer`.

:class:`ContrastiveSetup` builds what stage 1 trains with (the loss, the label count, the contrast set, the
collator and, with a queue, the MoCo piece); :class:`ContrastiveTrainer` wires it into ``compute_loss``, the
GradCache step, the loss parameters' optimizer, evaluation (eval loss + kNN probe) and the checkpoint state.

References: SupCon two-view batches, Khosla et al. 2020, eq. 2; MoCo, He et al. 2020.
Design: docs/design.md, "Contrastive training step (hf_mlcl/training/contrastive.py)".
"""

from __future__ import annotations

import logging
import os
import warnings
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn
from transformers import Trainer, TrainerCallback

from hf_mlcl.data.sampler import PositiveEnsuredSampler
from hf_mlcl.labels.multihot import dataset_label_matrix, to_dense_float
from hf_mlcl.labels.statistics import resolve_num_labels
from hf_mlcl.losses.input_checks import FirstCallChecks
from hf_mlcl.losses.registry import build_contrastive_loss

from . import distributed as D
from .arguments import ContrastiveTrainingArguments, check_n_views
from .base import MultiLabelTrainer
from .gradcache import batch_rows, gradcache_backward, slice_batch, slice_rows
from .launch import launch_problem, shards_parameters
from .memory import (
    CandidateBuilder,
    EmbeddingQueue,
    MomentumContrast,
    check_queue_loss,
    max_candidates,
    output_embeddings,
    resolve_contrast_set,
)
from .momentum import build_key_encoder
from .state_file import (
    STATE_FILE,
    load_state_file,
    optimizer_state_to_tree,
    save_state_file,
    tree_to_optimizer_state,
)

logger = logging.getLogger(__name__)

__all__ = ["ContrastiveSetup", "ContrastiveTrainer", "STATE_FILE"]


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
        resolve_contrast_set(
            self.loss_fn, args.contrast_set, args.queue_size
        )  # before the key encoder is built
        key_encoder = self.momentum_encoder or build_key_encoder(
            model, args.momentum, sharded, runner, args.queue_size
        )
        if self.queue is None and self.embedding_dim is None:
            raise ValueError(
                f"queue_size={args.queue_size}: the queue needs the embeddings' width; use a model whose config "
                "has projection_dim (MLCLEncoder) or pass a ready EmbeddingQueue(queue=...)"
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


def _warn_if_gate_cannot_open(
    loss_fn: nn.Module, args: ContrastiveTrainingArguments, contrast_set: str | None
) -> None:
    """One warning when HBL's reliability gate (abs(P) >= k_min) can never open: fewer candidates than k_min
    per anchor in batch + queue, so the structural term is exactly zero."""
    k_min = getattr(loss_fn, "k_min", None)
    if k_min is None or getattr(loss_fn, "lambda_", 1.0) == 0:
        return
    world = max(1, args.world_size)
    reach = max_candidates(
        args.per_device_train_batch_size, world, args.n_views, args.queue_size, contrast_set
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


def _sum_dtype(device: torch.device) -> torch.dtype:
    """float64 for the on-device sums of logged values (float32 where the device has no float64: mps)."""
    return torch.float32 if device.type == "mps" else torch.float64


class _LossWindow:
    """The loss parts of the micro-batches since the last log, summed on the device (float64: the values
    Python floats summed in the same order would give), and the count of non-finite training losses."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0
        self.nonfinite: torch.Tensor | None = None

    def add(self, parts: dict[str, torch.Tensor]) -> None:
        for name, value in parts.items():
            if name != "loss":
                value = value.detach().to(_sum_dtype(value.device))
                total = self.sums.get(name)
                self.sums[name] = value if total is None else total + value
        self.count += 1
        with torch.no_grad():
            loss = parts["loss"]
            bad = torch.ne(
                loss - loss, 0
            ).long()  # x - x is NaN exactly for NaN and +-inf (fewer ops than isfinite)
        self.nonfinite = bad if self.nonfinite is None else self.nonfinite + bad

    def averages(self) -> dict[str, float]:
        """``loss_<name>``: each part's window average, read on the host; the window restarts."""
        out = (
            {f"loss_{name}": float(total) / self.count for name, total in self.sums.items()}
            if self.count
            else {}
        )
        self.sums, self.count = {}, 0
        return out

    def raise_if_not_finite(self) -> None:
        """ValueError when a training loss since the last check was NaN or inf (one host read)."""
        if self.nonfinite is None:
            return
        bad, self.nonfinite = int(self.nonfinite), None
        if bad:
            raise ValueError(
                f"the contrastive loss was NaN or inf in {bad} training micro-batch(es) since the last logging "
                "step or checkpoint: the embeddings contain NaN or inf values; check the encoder output (learning "
                "rate, fp16 overflow). Training stops here, before a checkpoint of these weights is written."
            )


class _StepCallback(TrainerCallback):
    """Once per optimizer step: EMA update of the momentum encoder; zero the loss parameters' grads."""

    def __init__(self, trainer: ContrastiveTrainer) -> None:
        self.trainer = trainer

    def on_optimizer_step(self, args, state, control, **kwargs):
        tr = self.trainer
        if tr.memory is not None:
            tr.memory.update(tr._momentum_source())
        for p in tr._loss_parameters():
            p.grad = None
        return control


class ContrastiveTrainer(MultiLabelTrainer):
    """A `transformers.Trainer` for multi-label supervised contrastive losses (see module docstring).

    Args: those of :class:`~hf_mlcl.training.base.MultiLabelTrainer`, with
        model: an encoder whose forward returns an object with ``embeddings`` (e.g. ``MLCLEncoder``).
        args: ``ContrastiveTrainingArguments`` (loss, loss_kwargs, temperature, n_views, queue_size,
            contrast_set, queue_warmup, momentum, gather_across_devices, gradcache_chunk_size, knn_k ...).
        data_collator: default ``MultiLabelCollator(processing_class, num_labels, n_views=args.n_views)``.
        loss_fn: a ready ``ContrastiveLoss`` (default: built from ``args``).
        momentum_encoder / queue (keywords): ready MoCo parts (default: built when ``args.queue_size > 0``).

    Raises ValueError at construction for what :meth:`MultiLabelTrainer.check_inputs` and
    :meth:`ContrastiveSetup.from_args` check. ``memory`` is the MoCo piece (None in batch mode);
    ``queue`` and ``momentum_encoder`` are its parts.
    """

    args_class = ContrastiveTrainingArguments
    args_hint = (
        "ContrastiveTrainingArguments(output_dir=...) (its fields loss, n_views, queue_size, ... "
        "configure the contrastive stage)"
    )
    model_hint = "e.g. MLCLEncoder.from_backbone(...)"

    def __init__(
        self,
        *positional: Any,
        momentum_encoder: Any = None,
        queue: EmbeddingQueue | None = None,
        **kwargs: Any,
    ) -> None:
        self._moco_parts = (momentum_encoder, queue)
        super().__init__(*positional, **kwargs)

    def stage_setup(self, model, args, train_dataset, data_collator, processing_class, loss_fn, num_labels):
        """The :class:`ContrastiveSetup` of the arguments: loss, label count, contrast set, collator."""
        momentum_encoder, queue = self._moco_parts
        self._setup = ContrastiveSetup.from_args(
            args,
            model,
            train_dataset,
            self.label_column,
            num_labels,
            loss_fn,
            data_collator,
            processing_class,
            queue,
            momentum_encoder,
            self.embedding_width(model, args),
        )
        self.loss_fn, self.num_labels = self._setup.loss_fn, self._setup.num_labels
        # the first batch is checked (labels 0/1, finite embeddings), later ones are not: no host reads
        self._input_checks = FirstCallChecks(self.loss_fn)
        self._window = _LossWindow()  # on the device until a logging step
        return self._setup.data_collator

    def embedding_width(self, model: nn.Module, args: ContrastiveTrainingArguments) -> int | None:
        """The width of the embeddings the loss reads (None: the model's ``projection_dim``)."""
        return None

    def default_metrics(self) -> Any:
        return self._knn_metrics if self.args.knn_k > 0 else None

    def after_setup(self) -> None:
        """The parts that need the prepared accelerator: the loss parameters' optimizer under an engine and
        the MoCo piece (its key encoder is a second adapter of a sharded model)."""
        args = self.args
        self._sharded = shards_parameters(self)
        if self._sharded and self._loss_parameters() and args.fp16 and self.is_deepspeed_enabled:
            raise ValueError(
                f"{type(self.loss_fn).__name__} has learnable parameters, which train outside DeepSpeed's engine, "
                "and fp16 under DeepSpeed scales the loss inside the engine: pass --bf16 true --fp16 false (or fp32)"
            )
        self._loss_optimizer: torch.optim.Optimizer | None = None
        self.memory = self._setup.memory(args, self.model, self._sharded, lambda: self.model_wrapped)
        self.candidates = (
            self.memory.candidates
            if self.memory is not None
            else CandidateBuilder(
                None,
                gather=args.gather_across_devices,
                supports_keys=getattr(self.loss_fn, "supports_keys", False),
            )
        )
        _warn_if_gate_cannot_open(self.loss_fn, args, self.candidates.contrast_set)
        if self.memory is not None or self._loss_parameters():
            self.add_callback(_StepCallback(self))

    @property
    def queue(self) -> EmbeddingQueue | None:
        return None if self.memory is None else self.memory.queue

    @property
    def momentum_encoder(self) -> Any:
        return None if self.memory is None else self.memory.key_encoder

    def _momentum_source(self) -> nn.Module:
        """What the momentum encoder averages from: the prepared model (collective gathers) for the adapter
        encoder, the unwrapped model otherwise."""
        if self._sharded:
            return self.model_wrapped
        return self.accelerator.unwrap_model(self.model)

    # ------------------------------------------------------------------ parameters / optimizer
    def _loss_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.loss_fn.parameters() if p.requires_grad]

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        params = self._loss_parameters()
        if params and not self._sharded:
            held = {id(p) for group in optimizer.param_groups for p in group["params"]}
            new = [p for p in params if id(p) not in held]
            if new:
                optimizer.add_param_group({"params": new, "weight_decay": 0.0})
        return optimizer

    def _loss_optimizer_for_sharded(self) -> torch.optim.Optimizer:
        """Under DeepSpeed / FSDP the engine's optimizer takes only the model's parameters: the loss
        parameters get their own optimizer of the same class and settings (no weight decay), stepped with
        the main optimizer's learning rate (:meth:`_step_loss_parameters`)."""
        if self._loss_optimizer is None:
            cls, kwargs = Trainer.get_optimizer_cls_and_kwargs(
                self.args, self.accelerator.unwrap_model(self.model)
            )
            self._loss_optimizer = cls([{"params": self._loss_parameters(), "weight_decay": 0.0}], **kwargs)
        return self._loss_optimizer

    def _step_loss_parameters(self, lr: float) -> None:
        optimizer = self._loss_optimizer_for_sharded()
        for group in optimizer.param_groups:
            group["lr"] = lr
        optimizer.step()

    # ------------------------------------------------------------------ batches
    def _get_train_sampler(self, train_dataset=None):
        """``batch_sampler="positives"``: an epoch order in which every anchor of a batch has a positive
        under the loss's rule (:class:`hf_mlcl.data.sampler.PositiveEnsuredSampler`); else Trainer's."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.args.batch_sampler != "positives" or dataset is None:
            return super()._get_train_sampler(train_dataset)
        return PositiveEnsuredSampler(
            dataset[self.label_column],
            self.args.per_device_train_batch_size,
            self.loss_fn.sampler_rule,
            seed=self.args.seed,
        )

    # ------------------------------------------------------------------ encoding and loss
    def _encode(self, model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
        return output_embeddings(model(**batch))

    def _loss_parts(
        self, embeddings: torch.Tensor, labels: torch.Tensor, batch_keys: tuple | None = None
    ) -> dict[str, torch.Tensor]:
        """The loss and its parts for local anchors against this step's candidates (:class:`CandidateBuilder`);
        the first call runs the loss's input checks (labels 0/1, finite embeddings), later calls do not."""
        step = self.candidates.step(embeddings, labels, batch_keys)
        with self._input_checks():
            return step.components(self.loss_fn)

    def _prepare_views(self, model: nn.Module, model_inputs: dict[str, Any], labels: torch.Tensor):
        """(anchor inputs, anchor labels, momentum keys or None) of this micro-batch: with a queue in training
        the key view (view 2 with ``n_views=2``, else the same inputs) goes through the key encoder."""
        if self.memory is None or not model.training:
            return model_inputs, labels, None
        if self.args.n_views == 1:
            return model_inputs, labels, self.memory.keys(model_inputs, labels)
        n = batch_rows(model_inputs)
        b = n // 2
        keys = self.memory.keys(slice_batch(model_inputs, b, n, n), slice_rows(labels, b, n))
        return slice_batch(model_inputs, 0, b, n), slice_rows(labels, 0, b), keys

    def _record_components(self, parts: dict[str, torch.Tensor]) -> None:
        """Add this micro-batch's loss parts to the logging window (on the device)."""
        self._window.add(parts)

    def compute_loss(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        return_outputs: bool = False,
        num_items_in_batch: Any = None,
    ):
        """The contrastive loss of one micro-batch (not divided by the accumulation steps: Trainer does)."""
        anchor_inputs, anchor_labels, batch_keys = self._prepare_views(model, *self.split_labels(inputs))
        embeddings = self._encode(model, anchor_inputs)
        parts = self._loss_parts(embeddings, anchor_labels, batch_keys)
        if model.training:
            self._record_components(parts)
            self.candidates.enqueue(batch_keys)
        return (parts["loss"], embeddings) if return_outputs else parts["loss"]

    # ------------------------------------------------------------------ training step (GradCache)
    def training_step(
        self, model: nn.Module, inputs: dict[str, Any], num_items_in_batch: Any = None
    ) -> torch.Tensor:
        params = self._loss_parameters()
        # read before backward: DeepSpeed steps its optimizer and scheduler inside it
        lr = float(self.optimizer.param_groups[0]["lr"]) if params and self._sharded else None
        if self.args.gradcache_chunk_size > 0:
            loss = self._gradcache_training_step(model, inputs)
        else:
            loss = super().training_step(model, inputs, num_items_in_batch)
        if self.accelerator.sync_gradients and params:
            if D.is_distributed():
                for p in params:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
                D.all_reduce_mean_([p.grad for p in params])
            if lr is not None:
                self._step_loss_parameters(lr)
        return loss

    def _gradcache_training_step(self, model: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
        """GradCache (Gao et al. 2021) micro-batch: same gradients as the direct step, chunked memory."""
        model.train()
        if hasattr(self.optimizer, "train") and callable(self.optimizer.train):
            self.optimizer.train()
        inputs = self._prepare_inputs(inputs)
        anchor_inputs, anchor_labels, batch_keys = self._prepare_views(model, *self.split_labels(inputs))
        scale = 1.0 / self.current_gradient_accumulation_steps
        parts: dict[str, torch.Tensor] = {}

        def loss_fn(emb: torch.Tensor) -> torch.Tensor:
            parts.update(self._loss_parts(emb, anchor_labels, batch_keys))
            return parts["loss"]

        def encode(chunk: dict[str, Any]) -> torch.Tensor:
            with self.compute_loss_context_manager():
                return self._encode(model, chunk)

        loss, _ = gradcache_backward(
            encode,
            anchor_inputs,
            loss_fn,
            self.args.gradcache_chunk_size,
            device=self.args.device,
            backward_loss=lambda value: self.accelerator.backward(value * scale),
            no_sync=lambda: self.accelerator.no_sync(model),
        )
        self._record_components({**parts, "loss": loss})
        self.candidates.enqueue(batch_keys)
        return loss * scale

    # ------------------------------------------------------------------ evaluation
    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        """Eval loss (in-batch candidates, no queue) and view-1 embeddings + dense labels for the probe."""
        inputs = self._prepare_inputs(inputs)
        _, labels = self.split_labels(inputs)
        with torch.no_grad(), self.compute_loss_context_manager():
            loss, embeddings = self.compute_loss(model, inputs, return_outputs=True)
        loss = loss.detach()
        if prediction_loss_only:
            return loss, None, None
        n = embeddings.shape[0] // self.args.n_views
        return loss, embeddings[:n].detach().float(), to_dense_float(slice_rows(labels, 0, n))

    def _knn_metrics(self, eval_pred) -> dict[str, float]:
        from hf_mlcl.evaluation.knn import knn_probe_metrics

        return knn_probe_metrics(eval_pred.predictions, eval_pred.label_ids, k=self.args.knn_k)

    # ------------------------------------------------------------------ logging
    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """Trainer's log plus ``loss_<component>`` (window averages, read from the device here) and
        ``queue_fill``; raises the ValueError of a non-finite training loss since the last log."""
        self._window.raise_if_not_finite()
        if "loss" in logs:
            logs.update(self._window.averages())
            if self.queue is not None:
                logs["queue_fill"] = float(len(self.queue))
        super().log(logs, start_time)

    # ------------------------------------------------------------------ checkpoints
    def extra_state_dict(self) -> dict[str, Any]:
        """Loss parameters, momentum encoder and queue: what a checkpoint needs beyond Trainer's files."""
        state: dict[str, Any] = {"loss": self.loss_fn.state_dict()}
        if self._loss_optimizer is not None:
            state["loss_optimizer"] = optimizer_state_to_tree(self._loss_optimizer.state_dict())
        if self.memory is not None:
            state.update(self.memory.state_dict())
        return state

    def load_extra_state_dict(self, state: dict[str, Any]) -> None:
        self.loss_fn.load_state_dict(state["loss"])
        if self._sharded and self._loss_parameters() and "loss_optimizer" in state:
            self._loss_optimizer_for_sharded().load_state_dict(
                tree_to_optimizer_state(state["loss_optimizer"])
            )
        if self.memory is not None:
            self.memory.load_state_dict(state)

    def _save_checkpoint(self, model, trial) -> None:
        self._window.raise_if_not_finite()  # never a checkpoint of weights a NaN step has touched
        super()._save_checkpoint(model, trial)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """Trainer's save; with the adapter momentum encoder, of the trained adapter only."""
        hide = getattr(self.momentum_encoder, "hidden_from_saves", None)
        if hide is None:
            return super()._save(output_dir, state_dict)
        with hide():
            return super()._save(output_dir, state_dict)

    def save_extra_checkpoint_files(self, folder: str) -> None:
        """The loss / queue / momentum state (safetensors), written while the checkpoint is still marked
        incomplete (:class:`~hf_mlcl.training.checkpoints.CompleteCheckpointsMixin`)."""
        save_state_file(self.extra_state_dict(), os.path.join(folder, STATE_FILE))

    def _load_from_checkpoint(self, resume_from_checkpoint: str, model=None) -> None:
        super()._load_from_checkpoint(resume_from_checkpoint, model)
        self._load_extra_state_file(resume_from_checkpoint)

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        """Trainer's optimizer and scheduler; under DeepSpeed, whose resume skips ``_load_from_checkpoint``,
        also the loss / queue / momentum state (on every process, after the model is prepared)."""
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint is not None and self.is_deepspeed_enabled:
            self._load_extra_state_file(checkpoint)

    def _load_extra_state_file(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, STATE_FILE)
        if os.path.isfile(path):
            self.load_extra_state_dict(load_state_file(path, device=self.args.device))
        elif self.queue is not None or self._loss_parameters():
            logger.warning(f"{path} is missing: the queue / momentum encoder / loss parameters start fresh")
