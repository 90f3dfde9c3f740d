"""The stages that write a classifier: :func:`train_probe` (a head on a frozen or fine-tuned encoder) and
:func:`train_joint` (one fine-tune with the joint objective); both tune the threshold on validation, score the
test split with it and save the classifier in its family's own format where it has one.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from hf_mlcl.modeling.builders import adapter_encoder, build_tokenizer_and_encoder, probe_model

from .padding_free import check_padding_free_run
from .preflight import preflight, remove_previous_run, replaces_previous_run
from .run_settings import stage_settings, with_data_fingerprint
from .stage_steps import (
    METRICS_FILE,
    THRESHOLDS_FILE,
    RunData,
    StageResult,
    fit,
    load_run_data,
    save_stage,
    stage_trainer,
    staged_save,
    trainer_save,
)

__all__ = ["train_joint", "train_probe"]


def train_probe(
    model_args: Any,
    data_args: Any,
    probing_args: Any,
    encoder_path: str | None = None,
    callbacks: list | None = None,
    data: RunData | None = None,
    settings: dict | None = None,
) -> StageResult:
    """Stage 2: probe / fine-tune a classifier (writes what the module docstring lists).

    ``encoder_path``: a saved hf_mlcl encoder (stage 1's output_dir), a plain backbone id / path (BCE
    baseline: ``probe="finetune"`` with ``loss="bce"``), or None to use ``model_args``. ``probe="linear"`` /
    ``"logistic"`` freeze the encoder, ``"finetune"`` trains it (with ``model_args.use_lora``: LoRA adapters
    and the head, saved as an adapter folder, merged with ``merge_lora`` or when the encoder was itself saved
    as an adapter). The threshold is tuned on validation per ``probing_args.threshold`` and the test split
    (if any) is scored with it. Both splits' dense scores come back in ``StageResult.scores`` up to
    ``exact_eval_cells`` rows x labels (:class:`~hf_mlcl.training.classifier_eval.ClassifierEvaluation`), their
    streamed evaluations at any size in ``StageResult.trainer.evaluations``. The ``logistic`` probe fits without
    ``Trainer.train``, so training hooks do not fire for it.
    ``settings``: the stage's :func:`~hf_mlcl.training.run_settings.stage_settings` (default: computed here).
    """
    from transformers import set_seed

    from .probing import ProbingTrainer

    probe = probing_args.probe
    lora_finetune = model_args.use_lora and probe == "finetune"
    set_seed(probing_args.seed)  # before the classifier head is initialised
    check_padding_free_run(model_args, data_args, probing_args, encoder_path)
    data = data if data is not None else load_run_data(data_args)
    train_rows = None if probe == "logistic" else len(data.dataset["train"])  # logistic: all rows at once
    created = preflight(
        probing_args,
        "stage 2 (probe)",
        train_rows,
        (model_args, encoder_path, adapter_encoder(encoder_path)) if lora_finetune else None,
    )
    tokenizer, model = _classifier_model(model_args, data, encoder_path, probe)
    trainer = stage_trainer(ProbingTrainer, model, tokenizer, probing_args, data, data_args, callbacks)
    trainer.run_settings = with_data_fingerprint(
        settings or stage_settings(probing_args, model_args, data_args, encoder_path), data
    )
    metrics: dict[str, Any] = {
        "probe": probe,
        "loss": probing_args.loss,
        "dataset": data_args.dataset,
    }
    if probe == "logistic":
        if replaces_previous_run(probing_args, trainer.run_settings):
            remove_previous_run(probing_args.output_dir, probing_args.should_save)
        metrics.update(trainer.fit_logistic(data.dataset["validation"]))
        # no second pass over validation
        evaluations = {"validation": trainer.evaluation_of_scores(*trainer.logistic_validation_scores)}
    else:
        metrics.update(fit(trainer, created, "stage 2 (probe)"))
        evaluations = {"validation": trainer.predict_evaluation(data.dataset["validation"], "validation")}
    return _finish_classifier(
        trainer, tokenizer, data, metrics, evaluations, model_args, data_args, encoder_path, probe
    )


def _classifier_model(
    model_args: Any, data: RunData, encoder_path: str | None, probe: str
) -> tuple[Any, Any]:
    """(tokenizer, classifier): ``probe``'s classifier (:func:`~hf_mlcl.modeling.builders.probe_model`) on the
    encoder at ``encoder_path`` (None: ``model_args``'s model)."""
    # a fine-tune merges an adapter encoder: onto its base as stored (a float32 base keeps the whole update);
    # a frozen probe reads the encoder as it trained
    tokenizer, encoder = build_tokenizer_and_encoder(
        model_args,
        data.dataset["train"]["text"],
        source=encoder_path,
        dtype="auto" if probe == "finetune" else None,
    )
    return tokenizer, probe_model(encoder, model_args, data.label_names, probe)


def _finish_classifier(
    trainer: Any,
    tokenizer: Any,
    data: RunData,
    metrics: dict[str, Any],
    evaluations: dict[str, Any],
    model_args: Any,
    data_args: Any,
    encoder_path: str | None,
    probe: str,
) -> StageResult:
    """After a classifier stage's training: the threshold tuned on the validation split's streamed
    ``evaluations``, the test split scored with it, ``metrics.json``, ``thresholds.json`` and the model
    (:func:`_save_classifier`); the result (dense scores of the splits evaluated exactly,
    ``trainer.evaluations`` of all)."""
    args = trainer.args
    threshold = trainer.tune_threshold(evaluations["validation"])
    metrics.update(trainer.split_metrics(evaluations["validation"], None, "validation"))
    if "test" in data.dataset and len(data.dataset["test"]):
        evaluations["test"] = trainer.predict_evaluation(data.dataset["test"])
        metrics.update(trainer.split_metrics(evaluations["test"], None, "test"))
    trainer.evaluations = evaluations
    scores = {split: ev.dense() for split, ev in evaluations.items() if ev.exact}
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
    save = partial(
        _save_classifier, trainer, tokenizer, model_args, encoder_path, probe, data_args.max_length
    )
    save_stage(trainer, tokenizer, files, save)
    return StageResult(args.output_dir, metrics, data.label_names, data.notes, trainer, scores, threshold)


def train_joint(
    model_args: Any,
    data_args: Any,
    joint_args: Any,
    encoder_path: str | None = None,
    callbacks: list | None = None,
    data: RunData | None = None,
    settings: dict | None = None,
) -> StageResult:
    """The joint objective: a classifier fine-tuned with ``(1 - w) * supervised + w * contrastive``
    (:class:`~hf_mlcl.training.joint.JointTrainer`), then its threshold, test metrics and folder as stage 2's.

    ``encoder_path``: a saved hf_mlcl encoder (stage 1's output_dir) or a backbone id / path; None uses
    ``model_args``. With ``model_args.use_lora`` the backbone trains through LoRA adapters, saved as stage 2's
    LoRA fine-tune is. ``metrics.json`` records ``contrastive_weight`` and both losses.
    ``settings``: the stage's :func:`~hf_mlcl.training.run_settings.stage_settings` (default: computed here).
    """
    from transformers import set_seed

    from .joint import JointTrainer

    stage = "joint"
    set_seed(joint_args.seed)  # before the classifier head is initialised
    check_padding_free_run(model_args, data_args, joint_args, encoder_path)
    data = data if data is not None else load_run_data(data_args)
    lora = (model_args, encoder_path, adapter_encoder(encoder_path)) if model_args.use_lora else None
    created = preflight(joint_args, stage, len(data.dataset["train"]), lora)
    tokenizer, model = _classifier_model(model_args, data, encoder_path, "finetune")
    trainer = stage_trainer(JointTrainer, model, tokenizer, joint_args, data, data_args, callbacks)
    trainer.run_settings = with_data_fingerprint(
        settings or stage_settings(joint_args, model_args, data_args, encoder_path), data
    )
    metrics: dict[str, Any] = {
        "probe": stage,
        "loss": joint_args.supervised_loss,
        "contrastive_loss": joint_args.loss,
        "contrastive_weight": joint_args.contrastive_weight,
        "contrastive_projection_dim": joint_args.contrastive_projection_dim,
        "dataset": data_args.dataset,
    }
    metrics.update(fit(trainer, created, stage))
    evaluations = {"validation": trainer.predict_evaluation(data.dataset["validation"], "validation")}
    return _finish_classifier(
        trainer, tokenizer, data, metrics, evaluations, model_args, data_args, encoder_path, "finetune"
    )


def _save_classifier(
    trainer: Any,
    tokenizer: Any,
    model_args: Any,
    encoder_path: str | None,
    probe: str,
    max_length: int | None,
) -> bool:
    """Every rank (FSDP / ZeRO-3 gather) saves into a staging folder, then the process that writes the folder
    writes the classifier's native form (:func:`~hf_mlcl.modeling.native.to_native_classifier`; truncation at
    ``max_length``), or hf_mlcl's format where it has none. Staged: a LoRA fine-tune as an adapter folder (merged
    when the encoder was itself an adapter: the new adapter applies to it, not to the base), a frozen probe on an
    adapter encoder as that adapter + its head, anything else as a full model. True when the tokenizer was
    written with it (:func:`trainer_save`)."""
    from hf_mlcl.modeling.lora import save_heads_with_adapter, save_lora_model
    from hf_mlcl.modeling.native import to_native_classifier

    args = trainer.args
    on_adapter = adapter_encoder(encoder_path)
    lora_finetune = model_args.use_lora and probe == "finetune"

    def save(folder: str) -> bool:
        if lora_finetune:
            save_lora_model(
                trainer.model_wrapped,
                folder,
                merge=model_args.merge_lora or on_adapter,
                accelerator=trainer.accelerator,
                is_main_process=args.should_save,
                merge_live=on_adapter,  # its backbone holds stage 1's adapter, merged in
            )
        elif on_adapter and probe in ("linear", "logistic") and not model_args.merge_lora:
            save_heads_with_adapter(
                trainer.model_wrapped,
                folder,
                encoder_path,
                accelerator=trainer.accelerator,
                is_main_process=args.should_save,
            )
        else:
            return trainer_save(trainer, folder)
        return False

    native = partial(
        to_native_classifier, tokenizer=tokenizer, target=args.output_dir, max_seq_length=max_length
    )
    return staged_save(trainer, save, native)
