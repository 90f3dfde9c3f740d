"""The two-stage flow, one path for the command line, the demo and the study: data to saved models.

:func:`load_run_data`, :func:`train_contrastive` (stage 1), :func:`train_probe` (stage 2),
:func:`run_contrastive_stage` / :func:`run_probe_stage` (a stage with its model card), :func:`run_stages`
and :func:`evaluate_checkpoint`.

Design: docs/design.md, "Stages and what they write (hf_mlcl/training/stages.py)".
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from hf_mlcl.files import atomic_write_json, move_into
from hf_mlcl.modeling.builders import (
    adapter_encoder,
    align_special_tokens,
    build_tokenizer_and_encoder,
    is_mlcl_checkpoint,
    probe_model,
    segment_multiple,
    with_lora,
)
from hf_mlcl.recipes import CLASSIFIER_STAGES, STAGES

from . import distributed as D
from .checkpoints import remove_checkpoints, resolve_resume
from .preflight import (
    check_stage,
    finished_stage_metrics,
    preflight,
    remove_previous_checkpoints,
    require_a_step,
)
from .run_lock import RunLock
from .run_settings import RUN_SETTINGS_FILE, check_resume_settings, stage_settings

logger = logging.getLogger(__name__)

__all__ = [
    "METRICS_FILE",
    "PLOTS_DIR",
    "THRESHOLDS_FILE",
    "RunData",
    "StageResult",
    "encoder_loss",
    "evaluate_checkpoint",
    "load_run_data",
    "require_classifier",
    "run_contrastive_stage",
    "run_joint_stage",
    "run_probe_stage",
    "run_stages",
    "score_classifier",
    "train_contrastive",
    "train_joint",
    "train_probe",
]

METRICS_FILE = "metrics.json"
STAGING_DIR = ".model-staging"  # inside a stage's folder: its model as saved, before the final layout
THRESHOLDS_FILE = "thresholds.json"
PLOTS_DIR = "plots"


@dataclass
class RunData:
    """A run's data, loaded once: the ``DatasetDict`` (caps applied), its label names and its provenance
    notes (e.g. a validation split carved from train), which the model cards state."""

    dataset: Any
    label_names: list[str]
    notes: list[str] = field(default_factory=list)


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


def _collator(tokenizer: Any, model: Any, data: RunData, data_args: Any, n_views: int = 1) -> Any:
    from hf_mlcl.data import MultiLabelCollator

    return MultiLabelCollator(
        tokenizer,
        len(data.label_names),
        max_length=data_args.max_length,
        n_views=n_views,
        pad_to_multiple_of=segment_multiple(model),
    )


def _trainer_data(data: RunData, collator: Any, tokenizer: Any, callbacks: list | None) -> dict[str, Any]:
    """The keywords both stages hand their trainer: splits, collator, tokenizer, label count, callbacks."""
    return {
        "data_collator": collator,
        "train_dataset": data.dataset["train"],
        "eval_dataset": data.dataset["validation"],
        "processing_class": tokenizer,
        "num_labels": len(data.label_names),
        "callbacks": callbacks,
    }


def _fit(trainer: Any, created: list[str], stage: str) -> dict[str, Any]:
    """``trainer.train`` from the checkpoint ``resume_from_checkpoint`` names (after the previous run's
    checkpoints were removed with ``overwrite_output_dir``: the stage's data and model have loaded, the
    new run's inputs hold); InputError when it made no optimizer step. Returns the train metrics."""
    args = trainer.args
    writes = args.should_save  # the process that writes this folder (one per node with save_on_each_node)
    remove_previous_checkpoints(
        args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint, writes
    )
    resume = resolve_resume(args.resume_from_checkpoint, args.output_dir, writes)
    check_resume_settings(resume, trainer.run_settings, args.overwrite_output_dir)
    metrics = dict(trainer.train(resume_from_checkpoint=resume).metrics)
    require_a_step(trainer, created, stage)
    return metrics


def _save_stage(
    trainer: Any, tokenizer: Any, files: Mapping[str, Any], save_model: Callable[[], bool]
) -> None:
    """Every rank saves the model (``save_model``, True when it wrote the tokenizer too: under FSDP / ZeRO-3
    the ranks gather the weights together); the process that writes the folder (``args.should_save``: the
    global main process, or each node's main process with ``save_on_each_node``) writes the tokenizer (when
    the model's save did not), ``trainer_state.json`` (trained stages) and ``files`` (name -> JSON data); a
    barrier: the folder is complete before any rank goes on."""
    wrote_tokenizer = save_model()
    if trainer.run_settings is not None:
        files = {**files, RUN_SETTINGS_FILE: trainer.run_settings}
    if trainer.args.should_save:
        out = trainer.args.output_dir
        if not wrote_tokenizer:
            tokenizer.save_pretrained(out)
        if trainer.state.global_step > 0:
            # Trainer.save_state writes on the global main process only: a node-local folder would lack it
            trainer.state.save_to_json(os.path.join(out, "trainer_state.json"))
        for name, content in files.items():
            atomic_write_json(os.path.join(out, name), content)
    D.barrier()


def _staged_save(trainer: Any, save: Callable[[str], bool], native: Callable[[str], bool]) -> bool:
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


def _trainer_save(trainer: Any, folder: str | None = None) -> bool:
    """``trainer.save_model`` into ``folder`` (default: ``output_dir``); True when it wrote the tokenizer (its
    ``processing_class``) beside the weights: everywhere but FSDP without a full state dict, where transformers
    saves no model files at all."""
    trainer.save_model(folder or trainer.args.output_dir)
    if trainer.processing_class is None:
        return False
    if trainer.is_fsdp_enabled:
        return "FULL_STATE_DICT" in str(trainer.accelerator.state.fsdp_plugin.state_dict_type)
    return True


def train_contrastive(
    model_args: Any,
    data_args: Any,
    training_args: Any,
    callbacks: list | None = None,
    data: RunData | None = None,
) -> StageResult:
    """Stage 1: contrastive training of an encoder (writes what the module docstring lists).

    ``callbacks``: extra ``transformers.TrainerCallback`` objects for the trainer (e.g. a
    ``hf_mlcl.hub.ModelCardCallback``). ``data``: the run's :class:`RunData` (default: loaded here).
    Resumes from ``training_args.resume_from_checkpoint`` when set (a path, or True for the last
    complete checkpoint in ``output_dir``).
    """
    from transformers import set_seed

    from .contrastive import ContrastiveTrainer

    set_seed(training_args.seed)  # before any weight is initialised (projection head, fresh backbones)
    data = data if data is not None else load_run_data(data_args)
    created = preflight(
        training_args,
        "stage 1 (contrastive)",
        len(data.dataset["train"]),
        (model_args, None, False) if model_args.use_lora else None,
    )
    tokenizer, encoder = build_tokenizer_and_encoder(
        model_args, data.dataset["train"]["text"], model_args.projection_dim, label_names=data.label_names
    )
    if model_args.use_lora:
        encoder = with_lora(encoder, model_args, _checkpointing(training_args))
    collator = _collator(tokenizer, encoder, data, data_args, n_views=training_args.n_views)
    align_special_tokens(encoder, tokenizer)
    trainer = ContrastiveTrainer(
        model=encoder, args=training_args, **_trainer_data(data, collator, tokenizer, callbacks)
    )
    trainer.run_settings = stage_settings(training_args, model_args, data_args)
    return _finish_contrastive(
        trainer, tokenizer, _fit(trainer, created, "stage 1 (contrastive)"), model_args, data_args, data
    )


def _finish_contrastive(
    trainer: Any, tokenizer: Any, metrics: dict[str, Any], model_args: Any, data_args: Any, data: RunData
) -> StageResult:
    """After stage 1's training: its evaluation, the encoder (every rank: sharded weights are gathered
    together; a LoRA run as an adapter folder), ``metrics.json``; the result."""
    from hf_mlcl.modeling.lora import save_lora_model
    from hf_mlcl.modeling.native import to_sentence_transformers

    metrics.update(trainer.evaluate())
    args = trainer.args

    def save_model(folder: str) -> bool:
        if not model_args.use_lora:
            return _trainer_save(trainer, folder)
        save_lora_model(
            trainer.model_wrapped,
            folder,
            merge=model_args.merge_lora,
            accelerator=trainer.accelerator,
            is_main_process=args.should_save,
        )
        return False

    def native(staging: str) -> bool:
        return to_sentence_transformers(
            staging, data_args.max_length, tokenizer=tokenizer, target=args.output_dir
        )

    saved = {**metrics, "loss": args.loss, "dataset": data_args.dataset, "num_labels": len(data.label_names)}
    _save_stage(trainer, tokenizer, {METRICS_FILE: saved}, lambda: _staged_save(trainer, save_model, native))
    return StageResult(args.output_dir, metrics, data.label_names, data.notes, trainer)


def _checkpointing(args: Any) -> bool:
    """The Trainer's activation-checkpointing flag (``activation_checkpointing``, or its alias ``gradient_checkpointing``)."""
    return bool(args.activation_checkpointing or args.gradient_checkpointing)


def train_probe(
    model_args: Any,
    data_args: Any,
    probing_args: Any,
    encoder_path: str | None = None,
    callbacks: list | None = None,
    data: RunData | None = None,
) -> StageResult:
    """Stage 2: probe / fine-tune a classifier (writes what the module docstring lists).

    ``encoder_path``: a saved hf_mlcl encoder (stage 1's output_dir), a plain backbone id / path (BCE
    baseline: ``probe="finetune"`` with ``loss="bce"``), or None to use ``model_args``. ``probe="linear"`` /
    ``"logistic"`` freeze the encoder, ``"finetune"`` trains it (with ``model_args.use_lora``: LoRA adapters
    and the head, saved as an adapter folder, merged with ``merge_lora`` or when the encoder was itself saved
    as an adapter). The threshold is tuned on validation per ``probing_args.threshold`` and the test split
    (if any) is scored with it; both splits' scores come back in ``StageResult.scores``. The ``logistic``
    probe fits without ``Trainer.train``, so training hooks do not fire for it.
    """
    from transformers import set_seed

    from .probing import ProbingTrainer

    lora_finetune = model_args.use_lora and probing_args.probe == "finetune"
    set_seed(probing_args.seed)  # before the classifier head is initialised
    data = data if data is not None else load_run_data(data_args)
    train_rows = (
        None if probing_args.probe == "logistic" else len(data.dataset["train"])
    )  # logistic: all rows at once
    created = preflight(
        probing_args,
        "stage 2 (probe)",
        train_rows,
        (model_args, encoder_path, adapter_encoder(encoder_path)) if lora_finetune else None,
    )
    tokenizer, encoder = build_tokenizer_and_encoder(
        model_args, data.dataset["train"]["text"], source=encoder_path
    )
    model = probe_model(
        encoder, model_args, data.label_names, probing_args.probe, _checkpointing(probing_args)
    )
    collator = _collator(tokenizer, model, data, data_args)
    align_special_tokens(model, tokenizer)
    trainer = ProbingTrainer(
        model=model, args=probing_args, **_trainer_data(data, collator, tokenizer, callbacks)
    )
    trainer.run_settings = stage_settings(probing_args, model_args, data_args, encoder_path)
    metrics: dict[str, Any] = {
        "probe": probing_args.probe,
        "loss": probing_args.loss,
        "dataset": data_args.dataset,
    }
    if probing_args.probe == "logistic":
        remove_previous_checkpoints(
            probing_args.output_dir,
            probing_args.overwrite_output_dir,
            probing_args.resume_from_checkpoint,
            probing_args.should_save,
        )
        metrics.update(trainer.fit_logistic(data.dataset["validation"]))
        scores = {"validation": trainer.logistic_validation_scores}  # no second pass over validation
    else:
        metrics.update(_fit(trainer, created, "stage 2 (probe)"))
        scores = {"validation": trainer.predict_scores(data.dataset["validation"])}
    save = partial(
        _save_classifier, trainer, tokenizer, model_args, encoder_path, lora_finetune, probing_args.probe
    )
    return _finish_classifier(trainer, tokenizer, data, metrics, scores, save)


def _finish_classifier(
    trainer: Any,
    tokenizer: Any,
    data: RunData,
    metrics: dict[str, Any],
    scores: dict[str, Any],
    save: Callable[[], bool],
) -> StageResult:
    """After a classifier stage's training: the threshold tuned on the validation ``scores``, the test split
    scored with it, ``metrics.json``, ``thresholds.json`` and the model (``save``); the result."""
    args = trainer.args
    threshold = trainer.tune_threshold(*scores["validation"])
    metrics.update(trainer.split_metrics(*scores["validation"], "validation"))
    if "test" in data.dataset and len(data.dataset["test"]):
        scores["test"] = trainer.predict_scores(data.dataset["test"])
        metrics.update(trainer.split_metrics(*scores["test"], "test"))
    thr_value = threshold.tolist() if isinstance(threshold, np.ndarray) else float(threshold)
    metrics["threshold"] = thr_value
    metrics["threshold_strategy"] = str(args.threshold)
    trainer.accelerator.unwrap_model(trainer.model).config.decision_threshold = thr_value
    files = {
        METRICS_FILE: metrics,
        THRESHOLDS_FILE: {
            "strategy": str(args.threshold),
            "threshold": thr_value,
            "label_names": data.label_names,
        },
    }
    _save_stage(trainer, tokenizer, files, save)
    return StageResult(args.output_dir, metrics, data.label_names, data.notes, trainer, scores, threshold)


def train_joint(
    model_args: Any,
    data_args: Any,
    joint_args: Any,
    encoder_path: str | None = None,
    callbacks: list | None = None,
    data: RunData | None = None,
) -> StageResult:
    """The joint objective: a classifier fine-tuned with ``(1 - w) * supervised + w * contrastive``
    (:class:`~hf_mlcl.training.joint.JointTrainer`), then its threshold, test metrics and folder as stage 2's.

    ``encoder_path``: a saved hf_mlcl encoder (stage 1's output_dir) or a backbone id / path; None uses
    ``model_args``. With ``model_args.use_lora`` the backbone trains through LoRA adapters, saved as stage 2's
    LoRA fine-tune is. ``metrics.json`` records ``contrastive_weight`` and both losses.
    """
    from transformers import set_seed

    from .joint import JointTrainer

    stage = "joint"
    set_seed(joint_args.seed)  # before the classifier head is initialised
    data = data if data is not None else load_run_data(data_args)
    lora = (model_args, encoder_path, adapter_encoder(encoder_path)) if model_args.use_lora else None
    created = preflight(joint_args, stage, len(data.dataset["train"]), lora)
    tokenizer, encoder = build_tokenizer_and_encoder(
        model_args, data.dataset["train"]["text"], source=encoder_path
    )
    model = probe_model(encoder, model_args, data.label_names, "finetune", _checkpointing(joint_args))
    collator = _collator(tokenizer, model, data, data_args)
    align_special_tokens(model, tokenizer)
    trainer = JointTrainer(
        model=model, args=joint_args, **_trainer_data(data, collator, tokenizer, callbacks)
    )
    trainer.run_settings = stage_settings(joint_args, model_args, data_args, encoder_path)
    metrics: dict[str, Any] = {
        "probe": stage,
        "loss": joint_args.supervised_loss,
        "contrastive_loss": joint_args.loss,
        "contrastive_weight": joint_args.contrastive_weight,
        "dataset": data_args.dataset,
    }
    metrics.update(_fit(trainer, created, stage))
    scores = {"validation": trainer.predict_scores(data.dataset["validation"])}
    save = partial(
        _save_classifier, trainer, tokenizer, model_args, encoder_path, model_args.use_lora, "finetune"
    )
    return _finish_classifier(trainer, tokenizer, data, metrics, scores, save)


def _save_classifier(
    trainer: Any, tokenizer: Any, model_args: Any, encoder_path: str | None, lora_finetune: bool, probe: str
) -> bool:
    """Every rank (FSDP / ZeRO-3 gather); the process that writes the folder writes: a LoRA fine-tune as an
    adapter folder (merged when the encoder was itself an adapter: the new adapter applies to it, not to the
    base), a frozen probe on an adapter encoder as that adapter + its head, anything else as a full model, in
    its family's own format with a native head (:func:`~hf_mlcl.modeling.native.to_native_classifier`).
    True when the tokenizer was written with it (:func:`_trainer_save`)."""
    from hf_mlcl.modeling.lora import save_heads_with_adapter, save_lora_model
    from hf_mlcl.modeling.native import to_native_classifier

    args = trainer.args
    out, on_adapter = args.output_dir, adapter_encoder(encoder_path)
    if lora_finetune:
        save_lora_model(
            trainer.model_wrapped,
            out,
            merge=model_args.merge_lora or on_adapter,
            accelerator=trainer.accelerator,
            is_main_process=args.should_save,
        )
    elif on_adapter and probe in ("linear", "logistic") and not model_args.merge_lora:
        save_heads_with_adapter(
            trainer.model_wrapped,
            out,
            encoder_path,
            accelerator=trainer.accelerator,
            is_main_process=args.should_save,
        )
    else:
        native = partial(to_native_classifier, tokenizer=tokenizer, target=out)
        return _staged_save(trainer, partial(_trainer_save, trainer), native)
    return False


# ----------------------------------------------------------------------------------------------------
# stages with their model cards, and a whole run
# ----------------------------------------------------------------------------------------------------
def _with_card(
    train: Callable[..., StageResult], card_cb: Any, args: Any, *stage_args: Any, data: RunData | None = None
) -> StageResult:
    """Run a stage with the card callback attached, replay the finished trainer's data into it (the logistic
    probe never calls ``Trainer.train``, so its hooks alone would miss it), write the card on the process that
    writes the folder (``args.should_save``: the main process, or each node's with ``save_on_each_node``), then
    a barrier: no rank reads the folder (stage 2, evaluation, push) before it is complete. That process holds
    the folder's :class:`~hf_mlcl.training.run_lock.RunLock` meanwhile: a second run into it stops in one line."""
    lock = RunLock(args.output_dir) if args.should_save else None  # the process that writes the folder
    if lock is not None:
        lock.acquire()
    try:
        return _run_with_card(train, card_cb, args, *stage_args, data=data)
    finally:
        if lock is not None:
            lock.release()


def _run_with_card(
    train: Callable[..., StageResult], card_cb: Any, args: Any, *stage_args: Any, data: RunData | None = None
) -> StageResult:
    """The stage and its card (see :func:`_with_card`)."""
    result = train(*stage_args, callbacks=[card_cb], data=data)
    trainer = result.trainer
    card_cb.collect_from_trainer(trainer, result.metrics)
    if args.should_save:
        card = card_cb.card
        card.data_notes = list(result.data_notes)
        if result.label_names and (card.kind == "classifier" or not card.label_names):
            card.label_names, card.num_labels = [str(n) for n in result.label_names], len(result.label_names)
        if card.kind == "classifier":
            card.hyperparameters["threshold"] = str(args.threshold)
        card_cb.save(args.output_dir, model_name=args.hub_model_id)
        if not getattr(args, "keep_checkpoints", False):  # finished: its checkpoints serve no resume any more
            remove_checkpoints(args.output_dir)
    D.barrier()
    return result


def run_contrastive_stage(
    model_args: Any, data_args: Any, training_args: Any, data: RunData | None = None
) -> StageResult:
    """Stage 1 (:func:`train_contrastive`) with the encoder's model card written into its output_dir."""
    from hf_mlcl.hub import ModelCardCallback

    card_cb = ModelCardCallback("encoder", model_args=model_args, data_args=data_args)
    return _with_card(
        train_contrastive, card_cb, training_args, model_args, data_args, training_args, data=data
    )


def run_probe_stage(
    model_args: Any,
    data_args: Any,
    probing_args: Any,
    encoder_path: str | None,
    contrastive_loss: str | None = None,
    data: RunData | None = None,
) -> StageResult:
    """Stage 2 (:func:`train_probe`) with the classifier's model card written into its output_dir."""
    from hf_mlcl.hub import ModelCardCallback

    card_cb = ModelCardCallback(
        "classifier",
        model_args=model_args,
        data_args=data_args,
        contrastive_loss=contrastive_loss,
        encoder_path=encoder_path,
    )
    return _with_card(
        train_probe, card_cb, probing_args, model_args, data_args, probing_args, encoder_path, data=data
    )


def run_joint_stage(
    model_args: Any,
    data_args: Any,
    joint_args: Any,
    encoder_path: str | None,
    contrastive_loss: str | None = None,
    data: RunData | None = None,
) -> StageResult:
    """The joint objective (:func:`train_joint`) with the classifier's model card written into its output_dir."""
    from hf_mlcl.hub import ModelCardCallback

    card_cb = ModelCardCallback(
        "classifier", model_args=model_args, data_args=data_args, encoder_path=encoder_path
    )
    return _with_card(
        train_joint, card_cb, joint_args, model_args, data_args, joint_args, encoder_path, data=data
    )


def run_stages(
    model_args: Any,
    data_args: Any,
    stage_args: Mapping[str, Any],
    encoder_path: str | None = None,
    data: RunData | None = None,
    evaluate: bool = False,
    announce: Callable[..., None] | None = None,
) -> dict[str, StageResult]:
    """The stages of a run, ``stage_args["contrastive"]`` (optional) then ``stage_args["probe"]``, each with its
    model card; returns their results by name.

    Before any work every stage's launch and output folder are checked (:func:`~hf_mlcl.training.preflight.check_stage`).
    The data are loaded once, when a stage first needs them (``data`` when given). On resume a finished stage
    is skipped and its saved metrics reported (``StageResult.skipped``). Stage 2 probes stage 1's encoder
    (else ``encoder_path``, or the model arguments' model). ``evaluate``: the main process writes
    ``eval_<split>.json`` and the per-label F1 plot of the classifier on test (validation without a test
    split), from the scores stage 2 computed (a classifier skipped on resume is scored from its folder).
    ``announce(i, n, name, args, result)`` is called before each stage (``result`` None) and after it (the
    command line prints a header and where the stage saved its model).
    """
    names = [name for name in STAGES if name in stage_args]
    for name in names:
        check_stage(stage_args[name])
    results: dict[str, StageResult] = {}
    loss = encoder_loss(encoder_path)
    for i, name in enumerate(names, 1):
        args = stage_args[name]
        if announce is not None:
            announce(i, len(names), name, args, None)
        metrics = finished_stage_metrics(args, stage_settings(args, model_args, data_args, encoder_path))
        if metrics is not None:
            results[name] = StageResult(args.output_dir, metrics, skipped=True)
        elif name == "contrastive":
            data = data if data is not None else load_run_data(data_args)
            results[name] = run_contrastive_stage(model_args, data_args, args, data=data)
        else:
            data = data if data is not None else load_run_data(data_args)
            run = run_probe_stage if name == "probe" else run_joint_stage
            results[name] = run(model_args, data_args, args, encoder_path, loss, data=data)
        if name == "contrastive":
            encoder_path, loss = args.output_dir, args.loss
        if announce is not None:
            announce(i, len(names), name, args, results[name])
    classifier = next((name for name in CLASSIFIER_STAGES if name in results), None)
    if evaluate and classifier is not None and stage_args[classifier].process_index == 0:
        _evaluation_files(results[classifier], data_args, data)
    return results


# ----------------------------------------------------------------------------------------------------
# a saved classifier on a split
# ----------------------------------------------------------------------------------------------------
def encoder_loss(encoder_path: str | None) -> str | None:
    """The contrastive loss recorded in an encoder folder's card_data.json / metrics.json, if any."""
    if not encoder_path:
        return None
    for name in ("card_data.json", METRICS_FILE):
        path = os.path.join(encoder_path, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                value = json.load(fh).get("loss")
            if value:
                return value
    return None


def score_classifier(
    model: Any, tokenizer: Any, dataset: Any, num_labels: int, max_length: int, batch_size: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid scores (N, L) and multi-hot truth (N, L) of ``dataset`` (batched, no gradient)."""
    import torch
    from torch.utils.data import DataLoader

    from hf_mlcl.data import MultiLabelCollator

    collator = MultiLabelCollator(
        tokenizer, num_labels, max_length=max_length, pad_to_multiple_of=segment_multiple(model)
    )
    device = next(model.parameters()).device
    scores, truth = [], []
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
            labels = batch.pop("labels")
            inputs = {
                k: v.to(device)
                for k, v in batch.items()
                if k in ("input_ids", "attention_mask", "token_type_ids")
            }
            scores.append(torch.sigmoid(model(**inputs).logits.float()).cpu().numpy())
            truth.append(labels.to_dense().numpy() if labels.is_sparse else labels.numpy())
    return np.concatenate(scores), np.concatenate(truth) > 0.5


def require_classifier(checkpoint: str) -> None:
    """ValueError in one line when ``checkpoint`` is a stage-1 encoder folder, not a classifier: scoring it
    would put a randomly initialised head on the encoder. Reads ``config.json`` only (before any loading)."""
    from hf_mlcl.modeling.builders import is_native_encoder

    path = os.path.join(checkpoint, "config.json")
    architectures = []
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            architectures = json.load(fh).get("architectures") or []
    if "MLCLEncoder" in architectures or is_native_encoder(checkpoint):
        raise ValueError(
            f"{checkpoint} is an encoder (stage 1), but evaluate needs a classifier: train a head on it with "
            f"`hf-mlcl probe RECIPE --encoder_path {checkpoint}` (or `hf-mlcl run RECIPE`) and evaluate the "
            "classifier folder it writes"
        )


def write_evaluation(
    out: str,
    split: str,
    scores: np.ndarray,
    truth: np.ndarray,
    threshold: Any,
    data: RunData,
    dataset_name: str,
    plots: bool = True,
) -> dict[str, float]:
    """``eval_<split>.json`` (the metrics at ``threshold``, keys prefixed with the split) and, with ``plots``,
    ``plots/f1_vs_frequency_<split>.png`` into ``out``; returns the metrics."""
    from hf_mlcl.data import train_frequency
    from hf_mlcl.evaluation import compute_multilabel_metrics, per_label_f1, plot_f1_vs_frequency

    metrics = {
        f"{split}_{k}": float(v)
        for k, v in compute_multilabel_metrics(truth, scores, threshold=threshold).items()
    }
    os.makedirs(out, exist_ok=True)
    atomic_write_json(os.path.join(out, f"eval_{split}.json"), metrics)
    if plots and len(data.dataset["train"]):
        freq = train_frequency(data.dataset["train"], len(data.label_names))
        plot_f1_vs_frequency(
            per_label_f1(truth, scores >= threshold),
            freq,
            os.path.join(out, PLOTS_DIR, f"f1_vs_frequency_{split}.png"),
            title=f"{dataset_name}: per-label F1 ({split})",
        )
    return metrics


def _evaluation_files(probe: StageResult, data_args: Any, data: RunData | None) -> None:
    """The classifier's evaluation files on test (validation without a test split), from the probe's scores."""
    split = "test" if any(k.startswith("test_") for k in probe.metrics) else "validation"
    if probe.skipped or split not in probe.scores:  # finished before: score the saved classifier
        evaluate_checkpoint(probe.output_dir, data_args, split=split, data=data)
        return
    scores, truth = probe.scores[split]
    threshold = (
        np.asarray(probe.threshold) if isinstance(probe.threshold, np.ndarray) else float(probe.threshold)
    )
    write_evaluation(probe.output_dir, split, scores, truth, threshold, data, data_args.dataset)


def evaluate_checkpoint(
    checkpoint: str,
    data_args: Any,
    split: str = "test",
    batch_size: int = 32,
    plots: bool = True,
    output_dir: str | None = None,
    data: RunData | None = None,
) -> dict[str, float]:
    """Score a saved classifier on ``split`` at its stored decision threshold; write ``eval_<split>.json`` and
    ``plots/f1_vs_frequency_<split>.png`` into ``output_dir`` (default: the checkpoint folder). Returns the
    metrics, keys prefixed with the split name. An encoder folder is refused before anything is loaded."""
    from transformers import AutoTokenizer

    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.modeling.sharded import loading_whole_models

    require_classifier(checkpoint)
    with loading_whole_models():  # the main process alone scores the classifier, also in a ZeRO-3 run
        model = MLCLForMultiLabelClassification.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    data = data if data is not None else load_run_data(data_args)
    if split not in data.dataset:
        raise ValueError(
            f"dataset {data_args.dataset!r} has no {split!r} split; choose one of {list(data.dataset)}"
        )
    trained = [str(model.config.id2label[i]) for i in range(model.config.num_labels)]
    if trained != [str(n) for n in data.label_names]:
        raise ValueError(
            f"the checkpoint's {len(trained)} labels differ from dataset {data_args.dataset!r}'s "
            f"{len(data.label_names)} labels; evaluate on the dataset (and dataset_options) it was trained on"
        )
    scores, truth = score_classifier(
        model, tokenizer, data.dataset[split], len(data.label_names), data_args.max_length, batch_size
    )
    threshold = getattr(model.config, "decision_threshold", None)
    threshold = (
        0.5
        if threshold is None
        else (np.asarray(threshold) if isinstance(threshold, list) else float(threshold))
    )
    return write_evaluation(
        output_dir or checkpoint, split, scores, truth, threshold, data, data_args.dataset, plots
    )
