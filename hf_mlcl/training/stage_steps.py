"""The steps every stage takes: the run's data (:func:`load_run_data`), the stage's trainer
(:func:`stage_trainer`), the training with its resume (:func:`fit`) and the save of a stage's folder, written
once through a staging folder (:func:`save_stage`, :func:`staged_save`); what a stage hands back
(:class:`StageResult`).
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hf_mlcl.files import atomic_write_json, disk_full, move_into
from hf_mlcl.modeling.builders import align_special_tokens, is_mlcl_checkpoint, segment_multiple

from . import distributed as D
from .checkpoints import TRAINER_STATE, CheckpointSaveError, resolve_resume, wants_resume
from .preflight import METRICS_FILE, remove_previous_run, replaces_previous_run, require_a_step
from .run_settings import RUN_SETTINGS_FILE, changed_settings, check_resume_settings

logger = logging.getLogger(__name__)

__all__ = [
    "METRICS_FILE",
    "PLOTS_DIR",
    "STAGING_DIR",
    "THRESHOLDS_FILE",
    "RunData",
    "StageResult",
    "fit",
    "load_run_data",
    "save_stage",
    "stage_trainer",
    "staged_save",
    "trainer_save",
]

STAGING_DIR = ".model-staging"  # inside a stage's folder: its model as saved, before the final layout
THRESHOLDS_FILE = "thresholds.json"
PLOTS_DIR = "plots"


@dataclass
class RunData:
    """A run's data, loaded once: the ``DatasetDict`` (caps applied), its label names and its provenance
    notes (e.g. a validation split carved from train), which the model cards state; ``fingerprints``, the
    digests of its splits' rows once a stage computed them (every stage of a run records the same)."""

    dataset: Any
    label_names: list[str]
    notes: list[str] = field(default_factory=list)
    fingerprints: dict[str, str] | None = field(default=None, repr=False)


@dataclass
class StageResult:
    """What a stage produced.

    Attributes:
        output_dir: the stage's folder.
        metrics: the stage's metrics (those of its ``metrics.json``).
        label_names / data_notes: the label space and the data's provenance notes.
        trainer: the finished trainer (None for a stage skipped because it had finished before).
        scores: the probe's ``(probabilities (N, L), truth (N, L) bool)`` per split it scored
            (``"validation"``, ``"test"``), at no extra pass.
        threshold: the probe's tuned decision threshold (a float or per-label array).
        skipped: the stage had finished before (resume): its metrics were read from its folder.
    """

    output_dir: str
    metrics: dict[str, Any]
    label_names: list[str] = field(default_factory=list)
    data_notes: list[str] = field(default_factory=list)
    trainer: Any = None
    scores: dict[str, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    threshold: float | np.ndarray | None = None
    skipped: bool = False


def load_run_data(data_args: Any) -> RunData:
    """``load_mlc_dataset`` with the ``max_*_samples`` caps applied (first rows, or a random subset drawn
    with ``subset_seed``), its label names and provenance notes (logged).

    ValueError naming an empty split, or a missing train / validation split (before any training)."""
    from hf_mlcl.data import data_notes, label_names, load_mlc_dataset
    from hf_mlcl.data.custom import check_splits

    ds = load_mlc_dataset(data_args.dataset, data_dir=data_args.data_dir, **data_args.loader_options())
    caps = (
        ("train", data_args.max_train_samples),
        ("validation", data_args.max_eval_samples),
        ("test", data_args.max_test_samples),
    )
    for split, cap in caps:
        if cap is not None and split in ds and len(ds[split]) > cap:
            if data_args.subset_seed is None:
                ds[split] = ds[split].select(range(int(cap)))
            else:  # a seeded random subset, kept in file order
                rows = np.random.default_rng(data_args.subset_seed).choice(
                    len(ds[split]), int(cap), replace=False
                )
                ds[split] = ds[split].select(np.sort(rows))
    for split in ("train", "validation"):
        if split not in ds:
            raise ValueError(f"dataset {data_args.dataset!r} has no {split!r} split (splits: {list(ds)})")
    check_splits(ds, f"dataset {data_args.dataset!r}")
    notes = data_notes(ds)
    for note in notes:
        logger.info("data: %s", note)
    return RunData(ds, list(label_names(ds["train"])), notes)


def stage_trainer(
    trainer_class: Any,
    model: Any,
    tokenizer: Any,
    args: Any,
    data: RunData,
    data_args: Any,
    callbacks: list | None,
    n_views: int = 1,
) -> Any:
    """The stage's ``trainer_class`` on ``model``: the multi-label collator (``n_views`` views a row, padded to
    the model's segment multiple, or packed without padding with ``data_args.padding_free``), the model's
    special token ids set to the tokenizer's, the train and validation splits, the label count and
    ``callbacks``."""
    from hf_mlcl.data import MultiLabelCollator

    padding_free = bool(getattr(data_args, "padding_free", False))  # the trainer checks model and arguments
    collator = MultiLabelCollator(
        tokenizer,
        len(data.label_names),
        max_length=data_args.max_length,
        n_views=n_views,
        pad_to_multiple_of=segment_multiple(model),
        padding_free=padding_free,
    )
    align_special_tokens(model, tokenizer)
    return trainer_class(
        model=model,
        args=args,
        data_collator=collator,
        train_dataset=data.dataset["train"],
        eval_dataset=data.dataset["validation"],
        processing_class=tokenizer,
        num_labels=len(data.label_names),
        callbacks=callbacks,
    )


def fit(trainer: Any, created: list[str], stage: str) -> dict[str, Any]:
    """``trainer.train`` from the checkpoint ``resume_from_checkpoint`` names, or from scratch where the run
    replaces the one in its folder (:func:`~hf_mlcl.training.preflight.replaces_previous_run`: that run's
    checkpoints and finished files go first; the stage's data and model have loaded, the new run's inputs
    hold); InputError when it made no optimizer step. Returns the train metrics."""
    args = trainer.args
    writes = args.should_save  # the process that writes this folder (one per node with save_on_each_node)
    resume = None
    if replaces_previous_run(args, trainer.run_settings):
        if wants_resume(args.resume_from_checkpoint):
            changes = "; ".join(changed_settings(args.output_dir, trainer.run_settings))
            logger.warning(
                f"{args.output_dir} finished with other settings ({changes}); --overwrite_output_dir true: "
                "trained again from the start"
            )
        remove_previous_run(args.output_dir, writes)
    else:
        resume = resolve_resume(args.resume_from_checkpoint, args.output_dir, writes, args.max_steps)
        check_resume_settings(resume, trainer.run_settings, args.overwrite_output_dir)
    metrics = dict(trainer.train(resume_from_checkpoint=resume).metrics)
    require_a_step(trainer, created, stage)
    return metrics


def save_stage(
    trainer: Any, tokenizer: Any, files: Mapping[str, Any], save_model: Callable[[], bool]
) -> None:
    """Every rank saves the model (``save_model``, True when it wrote the tokenizer too: under FSDP / ZeRO-3
    the ranks gather the weights together); the process that writes the folder (``args.should_save``: the
    global main process, or each node's main process with ``save_on_each_node``) writes the tokenizer (when
    the model's save did not), ``trainer_state.json`` (trained stages) and ``files`` (name -> JSON data); a
    barrier: the folder is complete before any rank goes on. A device without room for it: one line
    (:class:`~hf_mlcl.training.checkpoints.CheckpointSaveError`), not a writer's traceback."""
    try:
        _write_stage(trainer, tokenizer, files, save_model)
    except Exception as err:  # noqa: BLE001 (re-raised unless the device is full)
        if not disk_full(err, trainer.args.output_dir):
            raise
        raise CheckpointSaveError(
            f"no space left on the device while saving {trainer.args.output_dir} ({type(err).__name__}): free "
            "space, then run the command again with --resume_from_checkpoint true"
        ) from err
    D.barrier()


def _write_stage(
    trainer: Any, tokenizer: Any, files: Mapping[str, Any], save_model: Callable[[], bool]
) -> None:
    wrote_tokenizer = save_model()
    if trainer.run_settings is not None:
        files = {**files, RUN_SETTINGS_FILE: trainer.run_settings}
    if trainer.args.should_save:
        out = trainer.args.output_dir
        if not wrote_tokenizer:
            tokenizer.save_pretrained(out)
        if trainer.state.global_step > 0:
            # Trainer.save_state writes on the global main process only: a node-local folder would lack it
            trainer.state.save_to_json(os.path.join(out, TRAINER_STATE))
        for name, content in files.items():
            atomic_write_json(os.path.join(out, name), content)


def staged_save(trainer: Any, save: Callable[[str], bool], native: Callable[[str], bool]) -> bool:
    """``save(folder)`` into a staging folder inside ``output_dir`` (every rank: sharded weights are gathered
    together; True when it wrote the tokenizer), then on the process that writes the folder ``native(staging)``
    writes the model's native folder into ``output_dir`` (True when the model has one), else the staged files
    move in as they are. Each final file is written once. True when the tokenizer was written."""
    args = trainer.args
    staging = os.path.join(args.output_dir, STAGING_DIR)
    if args.should_save:
        shutil.rmtree(staging, ignore_errors=True)  # a save an earlier run left half done
    D.barrier()
    wrote_tokenizer = save(staging)
    if not args.should_save or not os.path.isdir(staging):
        return wrote_tokenizer
    if is_mlcl_checkpoint(staging) and native(staging):
        wrote_tokenizer = True
    else:
        move_into(staging, args.output_dir)
    shutil.rmtree(staging, ignore_errors=True)
    return wrote_tokenizer


def trainer_save(trainer: Any, folder: str | None = None) -> bool:
    """``trainer.save_model`` into ``folder`` (default: ``output_dir``); True when it wrote the tokenizer (its
    ``processing_class``) beside the weights: everywhere but FSDP without a full state dict, where transformers
    saves no model files at all."""
    trainer.save_model(folder or trainer.args.output_dir)
    if trainer.processing_class is None:
        return False
    if trainer.is_fsdp_enabled:
        return "FULL_STATE_DICT" in str(trainer.accelerator.state.fsdp_plugin.state_dict_type)
    return True
