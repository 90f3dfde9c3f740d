"""The base of hf_mlcl's trainers (stage 1, stage 2, joint): the checks and plumbing around ``transformers.Trainer``.

* before ``Trainer.__init__`` (:meth:`MultiLabelTrainer.check_inputs`, :meth:`MultiLabelTrainer.collator_for`):
  the arguments are the stage's ``TrainingArguments`` subclass, there is a model, every dataset has the
  label column, the model leaves the loss to the trainer (``accepts_loss_kwargs`` False:
  transformers#47688), the collator (a ``MultiLabelCollator`` by default) has the label count and the
  number of views, and a collator packing rows without padding a model and arguments that take them;
* Liger-Kernel on the backbone with ``use_liger_kernel`` (:mod:`hf_mlcl.modeling.liger`);
* after it: the launch got the DeepSpeed / FSDP engine it asked for (:mod:`hf_mlcl.training.launch`),
  checked again when training starts, and the loss sits on the training device;
* checkpoints are complete or marked incomplete (:class:`~hf_mlcl.training.checkpoints.CompleteCheckpointsMixin`);
* ``compute_loss`` receives the batch and takes its labels out itself (:meth:`MultiLabelTrainer.split_labels`),
  and returns the per-micro-batch loss: ``loss_is_scaled_for_ga = False``, Trainer divides it by the
  accumulation steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import Trainer

from hf_mlcl.modeling.liger import apply_liger_kernel_to_backbone

from .checkpoints import CompleteCheckpointsMixin
from .launch import EngineCheckCallback, check_engine_applied, clear_previous_deepspeed_state
from .padding_free import check_padding_free_args, check_padding_free_model

__all__ = ["MultiLabelTrainer", "check_label_column", "dataset_columns"]


def dataset_columns(dataset: Any) -> list[str] | None:
    """Column names of a ``datasets.Dataset`` (or the keys of a map-style dataset's first item)."""
    if dataset is None:
        return None
    cols = getattr(dataset, "column_names", None)
    if isinstance(cols, list):
        return cols
    try:
        first = dataset[0]
    except Exception:  # iterable datasets: cannot peek without consuming
        return None
    return list(first) if isinstance(first, dict) else None


def check_label_column(dataset: Any, label_column: str, which: str) -> None:
    """ValueError when a dataset has no label column (the contrastive and probing losses need labels)."""
    if dataset is None:
        return
    cols = dataset_columns(dataset)
    if cols is not None and label_column not in cols:
        raise ValueError(
            f"the {which} dataset has no {label_column!r} column (columns: {cols}); multi-label training "
            f"needs label-id lists in {label_column!r} — load it with hf_mlcl.data.load_mlc_dataset or rename "
            "the column (dataset.rename_column(old, 'labels'))"
        )


class MultiLabelTrainer(CompleteCheckpointsMixin, Trainer):
    """``transformers.Trainer`` with what both hf_mlcl trainers share (see the module docstring).

    Args (both trainers):
        model / args / data_collator / train_dataset / eval_dataset / processing_class / compute_metrics:
            as ``transformers.Trainer`` (``args`` of the stage's ``TrainingArguments`` subclass; the collator
            defaults to a ``MultiLabelCollator`` of ``processing_class``).
        loss_fn: a ready loss (default: built from ``args``).
        num_labels: the label count (default: read from the dataset's ClassLabel feature).
        label_column: the dataset column with label ids.
        Other keywords go to ``transformers.Trainer``.

    The construction is one template: :meth:`check_inputs`, the subclass's :meth:`stage_setup` (its loss,
    label count and collator), ``Trainer.__init__``, the engine checks, the subclass's :meth:`after_setup`.
    Subclasses set ``args_class`` (their ``TrainingArguments``), ``args_hint`` and ``model_hint`` (how to
    build them, for the errors).
    """

    loss_is_scaled_for_ga = False  # per-micro-batch loss; Trainer divides by the accumulation steps
    args_class: type = object
    args_hint = ""
    model_hint = ""

    def __init__(
        self,
        model: nn.Module | None = None,
        args: Any = None,
        data_collator: Any = None,
        train_dataset: Any = None,
        eval_dataset: Any = None,
        processing_class: Any = None,
        loss_fn: nn.Module | None = None,
        num_labels: int | None = None,
        label_column: str = "labels",
        compute_metrics: Any = None,
        **kwargs: Any,
    ) -> None:
        self.check_inputs(model, args, train_dataset, eval_dataset, label_column)
        if args.use_liger_kernel:  # Trainer's own call finds no kernels for the wrapper's model type
            apply_liger_kernel_to_backbone(model, args.liger_kernel_config)
        self.label_column = label_column
        data_collator = self.stage_setup(
            model, args, train_dataset, data_collator, processing_class, loss_fn, num_labels
        )
        if getattr(
            data_collator, "padding_free", False
        ):  # rows packed into one: model and arguments must take it
            check_padding_free_args(args)
            check_padding_free_model(model)
        super().__init__(
            model=model,
            args=args,
            data_collator=data_collator,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            compute_metrics=compute_metrics,
            **kwargs,
        )
        if compute_metrics is None:
            self.compute_metrics = self.default_metrics()
        check_engine_applied(self)
        self.add_callback(EngineCheckCallback(self))
        self.loss_fn.to(self.args.device)
        self.after_setup()

    def stage_setup(
        self,
        model: nn.Module,
        args: Any,
        train_dataset: Any,
        data_collator: Any,
        processing_class: Any,
        loss_fn: nn.Module | None,
        num_labels: int | None,
    ) -> Any:
        """Before ``Trainer.__init__``: set ``self.loss_fn`` and ``self.num_labels``; return the collator."""
        raise NotImplementedError

    def default_metrics(self) -> Any:
        """The ``compute_metrics`` used when none is given (None: Trainer's loss only)."""
        return None

    def after_setup(self) -> None:
        """After ``Trainer.__init__`` and the engine checks (the prepared accelerator exists)."""

    @classmethod
    def check_inputs(
        cls, model: nn.Module | None, args: Any, train_dataset: Any, eval_dataset: Any, label_column: str
    ) -> None:
        """ValueError (one line, naming the fix) for: arguments of another class, no model, a dataset
        without the label column, a model that normalises its own loss. Then clears a finished DeepSpeed
        run's accelerator state, so that this trainer can run under DeepSpeed too (stage 2 after stage 1:
        :func:`~hf_mlcl.training.launch.clear_previous_deepspeed_state`)."""
        name = cls.__name__
        if not isinstance(args, cls.args_class):
            got = "no args" if args is None else type(args).__name__
            raise ValueError(f"{name} needs {cls.args_hint}, got {got}")
        if model is None:
            raise ValueError(f"{name} needs a model ({cls.model_hint})")
        check_label_column(train_dataset, label_column, "train")
        evals = eval_dataset.items() if isinstance(eval_dataset, Mapping) else [(None, eval_dataset)]
        for split, ds in evals:
            check_label_column(ds, label_column, "eval" if split is None else f"eval ({split})")
        if getattr(model, "accepts_loss_kwargs", False):
            raise ValueError(
                f"{type(model).__name__}.accepts_loss_kwargs is True: Trainer would assume the model normalises "
                "its loss by num_items_in_batch (transformers#47688); set accepts_loss_kwargs = False"
            )
        clear_previous_deepspeed_state(args)

    @staticmethod
    def collator_for(data_collator: Any, processing_class: Any, num_labels: int, n_views: int) -> Any:
        """``data_collator``, or a ``MultiLabelCollator`` of ``processing_class``; ValueError when neither is
        given or when the collator's views or label count differ from the stage's."""
        if data_collator is None:
            if processing_class is None:
                raise ValueError("pass data_collator=MultiLabelCollator(...) or processing_class=<tokenizer>")
            from hf_mlcl.data import MultiLabelCollator

            data_collator = MultiLabelCollator(processing_class, num_labels, n_views=n_views)
        views = getattr(data_collator, "n_views", None)
        if views is not None and int(views) != n_views:
            raise ValueError(
                f"the data collator makes n_views={views} but the stage uses n_views={n_views}; build the "
                f"collator with n_views={n_views}"
            )
        labels = getattr(data_collator, "num_labels", None)
        if labels is not None and int(labels) != num_labels:
            raise ValueError(
                f"label-count mismatch: the data collator has num_labels={labels} but the dataset has {num_labels}"
            )
        return data_collator

    def floating_point_ops(self, inputs: dict[str, Any]) -> int:
        """Trainer's estimate of a step's FLOPs, 6 x input tokens x non-embedding parameters (Kaplan et al.,
        2020, Sec. 2.1), with the parameter count taken once per model: ``Trainer`` calls this at every
        step, and ``num_parameters(exclude_embeddings=True)`` walks every module and parameter each time."""
        main = getattr(self.model, "main_input_name", "input_ids")
        if main not in inputs or not hasattr(self.model, "num_parameters"):
            return 0
        cached = getattr(self, "_flops_parameters", None)
        if cached is None or cached[0] != id(self.model):
            cached = self._flops_parameters = (
                id(self.model),
                self.model.num_parameters(exclude_embeddings=True),
            )
        return 6 * inputs[main].numel() * cached[1]

    def split_labels(self, inputs: dict[str, Any]) -> tuple[dict[str, Any], torch.Tensor]:
        """(model inputs, labels): a copy of the batch without its label entry (``self.label_column``, else
        ``"labels"``); ValueError when the batch has none."""
        inputs = dict(inputs)
        labels = inputs.pop(self.label_column if self.label_column in inputs else "labels", None)
        if labels is None:
            raise ValueError(
                f"the batch has no {self.label_column!r}; the collator must return multi-hot labels"
            )
        return inputs, labels
