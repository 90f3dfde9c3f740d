"""The stages of a run, one path for the command line, the demo and the study: each stage with its model card
(:func:`run_contrastive_stage`, :func:`run_probe_stage`, :func:`run_joint_stage`) and :func:`run_stages`.

A stage's own work lives in its module: :mod:`~hf_mlcl.training.encoder_stage` (stage 1),
:mod:`~hf_mlcl.training.classifier_stages` (the probe, the joint objective), the steps they share in
:mod:`~hf_mlcl.training.stage_steps`, a saved classifier's evaluation in :mod:`~hf_mlcl.training.saved_evaluation`.

Design: docs/design.md, "Stages and what they write (hf_mlcl/training/stages.py)".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from hf_mlcl.stage_names import CLASSIFIER_STAGES, STAGES

from . import distributed as D
from .checkpoints import remove_checkpoints, wants_resume
from .classifier_stages import train_joint, train_probe
from .encoder_stage import train_contrastive
from .preflight import InputError, check_lora_save, check_output_dir, check_stage, finished_stage_metrics
from .run_lock import RunLock
from .run_settings import recorded_data, stage_settings, with_data_fingerprint
from .saved_evaluation import (
    encoder_loss,
    evaluate_checkpoint,
    evaluation_files,
    require_classifier,
    score_classifier,
    write_evaluation,
)
from .stage_steps import METRICS_FILE, PLOTS_DIR, THRESHOLDS_FILE, RunData, StageResult, load_run_data

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
    "write_evaluation",
]


def _with_card(
    train: Callable[..., StageResult],
    card_cb: Any,
    args: Any,
    *stage_args: Any,
    data: RunData | None = None,
    settings: dict | None = None,
    data_args: Any = None,
) -> StageResult:
    """Run a stage with the card callback attached, replay the finished trainer's data into it (the logistic
    probe never calls ``Trainer.train``, so its hooks alone would miss it), write the card on the process that
    writes the folder (``args.should_save``: the main process, or each node's with ``save_on_each_node``), then
    a barrier: no rank reads the folder (stage 2, evaluation, push) before it is complete. That process holds
    the folder's :class:`~hf_mlcl.training.run_lock.RunLock` meanwhile: a second run into it stops in one line.

    Under the lock the folder is checked again (a run may have filled it since this one's first check) and a
    finished stage with the same ``settings`` is not trained again on resume (``StageResult.skipped``); one that
    recorded its rows is compared on them too (the data loaded from ``data_args`` where not given)."""
    lock = RunLock(args.output_dir) if args.should_save else None  # the process that writes the folder
    problem = None
    if lock is not None:
        try:
            lock.acquire()  # InputError when another run holds the folder
            check_output_dir(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint)
        except InputError as error:
            lock.release()
            problem = str(error)
    # every process stops alike (the others would wait for the writer in the next collective)
    found = [p for p in D.all_gather_object(problem) if p]
    if found:
        raise InputError(found[0])
    try:
        settings, data = _with_recorded_rows(args, settings, data, data_args)
        metrics = finished_stage_metrics(args, settings)
        if metrics is not None:
            return StageResult(args.output_dir, metrics, skipped=True)
        result = train(*stage_args, callbacks=[card_cb], data=data, settings=settings)
        return _write_card(card_cb, args, result)
    finally:
        if lock is not None:
            lock.release()


def _with_recorded_rows(
    args: Any, settings: dict | None, data: RunData | None, data_args: Any
) -> tuple[dict | None, RunData | None]:
    """``(settings, data)``: on a resume into a folder whose finished stage recorded the rows it trained on, the
    settings with the fingerprints of the rows now loaded (``data``, loaded from ``data_args`` where not given),
    so they are compared (the data load before the stage would be skipped); else both as given."""
    if settings is None or "data_fingerprint" in settings:  # none to compare, or computed already
        return settings, data
    if not (wants_resume(args.resume_from_checkpoint) and recorded_data(args.output_dir)):
        return settings, data
    data = data if data is not None else load_run_data(data_args)
    return with_data_fingerprint(settings, data), data


def _write_card(card_cb: Any, args: Any, result: StageResult) -> StageResult:
    """After the stage: its card (see :func:`_with_card`), then the barrier; ``result``."""
    trainer = result.trainer
    card_cb.collect_from_trainer(trainer, result.metrics)
    if args.should_save:
        card = card_cb.card
        card.data_notes = list(result.data_notes)
        if result.label_names and (card.kind == "classifier" or not card.label_names):
            card.label_names, card.num_labels = [str(n) for n in result.label_names], len(result.label_names)
        card_cb.save(args.output_dir, model_name=args.hub_model_id)
        if not getattr(args, "keep_checkpoints", False):  # finished: its checkpoints serve no resume any more
            remove_checkpoints(args.output_dir)
    D.barrier()
    return result


def run_contrastive_stage(
    model_args: Any,
    data_args: Any,
    training_args: Any,
    data: RunData | None = None,
    settings: dict | None = None,
) -> StageResult:
    """Stage 1 (:func:`train_contrastive`) with the encoder's model card written into its output_dir;
    ``settings``: its :func:`~hf_mlcl.training.run_settings.stage_settings` when the caller has them."""
    from hf_mlcl.hub import ModelCardCallback

    card_cb = ModelCardCallback("encoder", model_args=model_args, data_args=data_args)
    if settings is None:
        settings = stage_settings(training_args, model_args, data_args)
    return _with_card(
        train_contrastive,
        card_cb,
        training_args,
        model_args,
        data_args,
        training_args,
        data=data,
        settings=settings,
        data_args=data_args,
    )


def run_probe_stage(
    model_args: Any,
    data_args: Any,
    probing_args: Any,
    encoder_path: str | None,
    contrastive_loss: str | None = None,
    data: RunData | None = None,
    settings: dict | None = None,
) -> StageResult:
    """Stage 2 (:func:`train_probe`) with the classifier's model card written into its output_dir
    (``settings`` as in :func:`run_contrastive_stage`)."""
    return _classifier_stage(
        train_probe, model_args, data_args, probing_args, encoder_path, data, settings, contrastive_loss
    )


def run_joint_stage(
    model_args: Any,
    data_args: Any,
    joint_args: Any,
    encoder_path: str | None,
    contrastive_loss: str | None = None,
    data: RunData | None = None,
    settings: dict | None = None,
) -> StageResult:
    """The joint objective (:func:`train_joint`) with the classifier's model card written into its output_dir
    (``settings`` as in :func:`run_contrastive_stage`)."""
    return _classifier_stage(
        train_joint, model_args, data_args, joint_args, encoder_path, data, settings, contrastive_loss
    )


def _classifier_stage(
    train: Callable[..., StageResult],
    model_args: Any,
    data_args: Any,
    args: Any,
    encoder_path: str | None,
    data: RunData | None,
    settings: dict | None,
    contrastive_loss: str | None = None,
) -> StageResult:
    """A classifier stage, ``train(model_args, data_args, args, encoder_path)``, with its model card (the
    encoder's ``contrastive_loss`` on it when given) and ``settings`` (default: computed here)."""
    from hf_mlcl.hub import ModelCardCallback

    card_cb = ModelCardCallback(
        "classifier",
        model_args=model_args,
        data_args=data_args,
        contrastive_loss=contrastive_loss,
        encoder_path=encoder_path,
    )
    if settings is None:
        settings = stage_settings(args, model_args, data_args, encoder_path)
    return _with_card(
        train,
        card_cb,
        args,
        model_args,
        data_args,
        args,
        encoder_path,
        data=data,
        settings=settings,
        data_args=data_args,
    )


def _check_lora_finetune_of_stage_one(model_args: Any, stage_args: Mapping[str, Any]) -> None:
    """Before stage 1 trains: a LoRA fine-tune in stage 2 of the adapter stage 1 will save must be able to save
    (:func:`~hf_mlcl.training.preflight.check_lora_save`; stage 2 checks again on the folder itself)."""
    classifier = next((name for name in CLASSIFIER_STAGES if name in stage_args), None)
    if "contrastive" not in stage_args or classifier is None or not model_args.use_lora:
        return
    args = stage_args[classifier]
    if classifier == "probe" and args.probe != "finetune":
        return
    saves_adapter = bool(model_args.model_name_or_path) and not model_args.merge_lora  # encoder_stage's save
    check_lora_save(model_args, args, None, saves_adapter)


def _check_segment_length(model_args: Any, data_args: Any) -> None:
    """Before any stage: a segmented (PLM-ICD, ``head="label_attention"``) model reads ``max_length`` as
    segments of ``chunk_size`` tokens, so the one must be a multiple of the other."""
    chunk, length = getattr(model_args, "chunk_size", None), getattr(data_args, "max_length", None)
    if getattr(model_args, "head", None) == "label_attention" and chunk and length and length % chunk:
        raise InputError(
            f"max_length {length} is not a multiple of chunk_size {chunk}: head 'label_attention' reads a text "
            f"as segments of chunk_size tokens; choose e.g. --max_length {max(chunk, length - length % chunk)}"
        )


# families with a learned table of absolute positions, and how many of its rows come before the first position
# (RoBERTa's family starts after the padding index: 514 rows hold 512 positions); others (rotary, relative:
# Llama, DeBERTa, ModernBERT ...) have no such table to run past
_LEARNED_POSITIONS = {
    **dict.fromkeys(("bert", "distilbert", "electra", "albert", "ernie", "megatron-bert"), 0),
    **dict.fromkeys(
        (
            "roberta",
            "xlm-roberta",
            "xlm-roberta-xl",
            "camembert",
            "mpnet",
            "longformer",
            "roberta-prelayernorm",
            "data2vec-text",
        ),
        2,
    ),
}


def _check_positions(model_args: Any, data_args: Any, encoder_path: str | None) -> None:
    """Before any stage: ``max_length`` within the positions a backbone with a learned position table has (a
    longer text fails at its first forward past them: in training, or later in ``predict``). Segmented models,
    whose segments are ``chunk_size`` long, and families without such a table are not checked."""
    from hf_mlcl.modeling.builders import backbone_config_dict

    length = getattr(data_args, "max_length", None)
    if not length or getattr(model_args, "head", None) == "label_attention":
        return
    config = backbone_config_dict(model_args, encoder_path) or {}
    offset = _LEARNED_POSITIONS.get(config.get("model_type"))
    positions = config.get("max_position_embeddings")
    if offset is None or not isinstance(positions, int):
        return
    if config.get("position_embedding_type", "absolute") != "absolute":
        return
    limit = positions - offset
    if length > limit:
        raise InputError(
            f"max_length {length} is longer than the {limit} positions the backbone ({config['model_type']}) has; "
            f"choose --max_length {limit} or less"
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
        check_stage(stage_args[name], data_args)
    _check_lora_finetune_of_stage_one(model_args, stage_args)
    _check_segment_length(model_args, data_args)
    _check_positions(model_args, data_args, encoder_path)
    results: dict[str, StageResult] = {}
    loss = encoder_loss(encoder_path)
    for i, name in enumerate(names, 1):
        args = stage_args[name]
        if announce is not None:
            announce(i, len(names), name, args, None)
        # a finished stage on resume loads no data, unless its folder recorded the rows it trained on (the stage
        # checks again under its lock)
        settings = stage_settings(args, model_args, data_args, encoder_path)  # once per stage
        settings, data = _with_recorded_rows(args, settings, data, data_args)
        metrics = finished_stage_metrics(args, settings)
        if metrics is not None:
            results[name] = StageResult(args.output_dir, metrics, skipped=True)
        elif name == "contrastive":
            data = data if data is not None else load_run_data(data_args)
            results[name] = run_contrastive_stage(model_args, data_args, args, data=data, settings=settings)
        else:
            data = data if data is not None else load_run_data(data_args)
            run = run_probe_stage if name == "probe" else run_joint_stage
            results[name] = run(model_args, data_args, args, encoder_path, loss, data=data, settings=settings)
        if name == "contrastive":
            encoder_path, loss = args.output_dir, args.loss
        if announce is not None:
            announce(i, len(names), name, args, results[name])
    classifier = next((name for name in CLASSIFIER_STAGES if name in results), None)
    if evaluate and classifier is not None and stage_args[classifier].process_index == 0:
        evaluation_files(results[classifier], data_args, data)
    return results
