"""`ContrastiveTrainer`: stage 1, label-aware contrastive training of an encoder with `transformers.Trainer`.

:class:`ContrastiveSetup` (:mod:`hf_mlcl.training.contrastive_setup`) builds what stage 1 trains with (the
loss, the label count, the contrast set, the collator and, with a queue, the MoCo piece);
:class:`ContrastiveTrainer` wires it into ``compute_loss``, the GradCache step, the loss parameters'
optimizer, evaluation (eval loss + kNN probe), logging (:mod:`hf_mlcl.training.loss_window`) and the
checkpoint state.

References: SupCon two-view batches, Khosla et al. 2020, eq. 2; MoCo, He et al. 2020.
Design: docs/design.md, "Contrastive training step (hf_mlcl/training/contrastive.py)".
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any

import torch
import torch.nn as nn
from transformers import Trainer, TrainerCallback

from hf_mlcl.data.sampler import PositiveEnsuredSampler
from hf_mlcl.labels.multihot import to_dense_float
from hf_mlcl.losses.input_checks import FirstCallChecks

from . import distributed as D
from .base import MultiLabelTrainer
from .contrast_sets import CandidateBuilder
from .contrastive_setup import ContrastiveSetup, warn_if_gate_cannot_open
from .embedding_queue import EmbeddingQueue
from .gradcache import batch_rows, gradcache_backward, slice_batch, slice_rows
from .launch import shards_parameters
from .loss_window import LossWindow as _LossWindow
from .memory import output_embeddings
from .stage_arguments import ContrastiveTrainingArguments
from .state_file import (
    STATE_FILE,
    load_state_file,
    optimizer_state_to_tree,
    save_state_file,
    tree_to_optimizer_state,
)

logger = logging.getLogger(__name__)

__all__ = ["ContrastiveSetup", "ContrastiveTrainer", "STATE_FILE"]


class _StepCallback(TrainerCallback):
    """When training begins: rank 0's loss parameters and key encoder on every process. When an epoch begins:
    the positives sampler's epoch. Once per optimizer step: EMA update of the momentum encoder; zero the loss
    parameters' grads."""

    def __init__(self, trainer: ContrastiveTrainer) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer._same_state_on_every_process()
        return control

    def on_epoch_begin(self, args, state, control, **kwargs):
        # the positives sampler's epoch, which accelerate does not reach through the wrapper that skips a resumed
        # run's trained batches with several processes (state.epoch: the checkpoint's, e.g. 1.5 in epoch 1)
        sampler = getattr(self.trainer, "_positives_sampler", None)
        if sampler is not None:
            sampler.set_epoch(math.floor(state.epoch + 1e-6))
        return control

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
        warn_if_gate_cannot_open(self.loss_fn, args, self.candidates.contrast_set)
        if self.memory is not None or self._loss_parameters() or args.batch_sampler == "positives":
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
    @torch.no_grad()
    def _same_state_on_every_process(self) -> None:
        """Rank 0's loss parameters and buffers, and its key encoder, on every process. Preparing the model makes
        it rank 0's everywhere (DDP's broadcast), but these live outside it: a loss's parameters are drawn from
        each process's random state, and the key encoder was copied from each process's model before that
        broadcast (per-rank seeds leave them apart). The key encoder of a sharded model is an adapter inside
        the engine's model, which the engine keeps."""
        tensors = [t for t in self.loss_fn.state_dict().values() if isinstance(t, torch.Tensor)]
        averaged = getattr(self.momentum_encoder, "averaged_tensors", None)
        if averaged is not None:
            tensors += averaged()
        D.broadcast_from_first_(tensors)

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
        """Step the loss parameters' own optimizer at ``lr``, their gradients clipped as
        :meth:`_clip_loss_parameters` says. Under fp16 the gradients carry the loss scale of
        ``accelerator.backward``: the accelerator's grad scaler unscales them before the clip and skips the
        step on inf / NaN, and the main optimizer's step updates the scale for both optimizers."""
        optimizer = self._loss_optimizer_for_sharded()
        for group in optimizer.param_groups:
            group["lr"] = lr
        scaler = self.accelerator.scaler
        if scaler is not None:
            scaler.unscale_(optimizer)
        self._clip_loss_parameters()
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)

    def _clip_loss_parameters(self) -> None:
        """Clip the loss parameters' (unscaled) gradients to ``max_grad_norm`` by their own norm. The model's
        are clipped by theirs, by Trainer or inside a sharding engine, which cannot reach parameters outside
        it: each group by its own norm, so that every engine trains the same model."""
        params = self._loss_parameters()
        if params and self.args.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, self.args.max_grad_norm)

    def _clip_grad_norm(self, model: nn.Module):
        """Trainer's ``max_grad_norm`` clip of the model (its norm is the one logged), then the loss
        parameters' when they share its optimizer (no sharding engine: Trainer's clip has unscaled them)."""
        norm = super()._clip_grad_norm(model)
        if not self._sharded:
            self._clip_loss_parameters()
        return norm

    # ------------------------------------------------------------------ batches
    def _get_train_sampler(self, train_dataset=None):
        """``batch_sampler="positives"``: an epoch order in which every anchor of a batch has a positive
        under the loss's rule (:class:`hf_mlcl.data.sampler.PositiveEnsuredSampler`); else Trainer's."""
        dataset = self.train_dataset if train_dataset is None else train_dataset
        if self.args.batch_sampler != "positives" or dataset is None:
            return super()._get_train_sampler(train_dataset)
        data_seed = self.args.data_seed
        self._positives_sampler = PositiveEnsuredSampler(
            dataset[self.label_column],
            self.args.per_device_train_batch_size,
            self.loss_fn.sampler_rule,
            seed=self.args.seed if data_seed is None else data_seed,  # Trainer's rule for the data order
        )
        return self._positives_sampler

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
