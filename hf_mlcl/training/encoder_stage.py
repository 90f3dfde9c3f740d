"""Stage 1 from its arguments: :func:`train_contrastive` trains an encoder with a contrastive loss and saves it
as a sentence-transformers folder (:func:`~hf_mlcl.modeling.native.to_sentence_transformers`).
"""

from __future__ import annotations

from typing import Any

from hf_mlcl.modeling.builders import build_tokenizer_and_encoder, with_lora

from .padding_free import check_padding_free_run
from .preflight import preflight
from .run_settings import stage_settings, with_data_fingerprint
from .stage_steps import (
    METRICS_FILE,
    RunData,
    StageResult,
    fit,
    load_run_data,
    save_stage,
    stage_trainer,
    staged_save,
    trainer_save,
)

__all__ = ["train_contrastive"]


def train_contrastive(
    model_args: Any,
    data_args: Any,
    training_args: Any,
    callbacks: list | None = None,
    data: RunData | None = None,
    settings: dict | None = None,
) -> StageResult:
    """Stage 1: contrastive training of an encoder (writes what the module docstring lists).

    ``callbacks``: extra ``transformers.TrainerCallback`` objects for the trainer (e.g. a
    ``hf_mlcl.hub.ModelCardCallback``). ``data``: the run's :class:`RunData` (default: loaded here).
    ``settings``: the stage's :func:`~hf_mlcl.training.run_settings.stage_settings` (default: computed here).
    Resumes from ``training_args.resume_from_checkpoint`` when set (a path, or True for the last
    complete checkpoint in ``output_dir``).
    """
    from transformers import set_seed

    from .contrastive import ContrastiveTrainer

    set_seed(training_args.seed)  # before any weight is initialised (projection head, fresh backbones)
    check_padding_free_run(model_args, data_args, training_args)
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
        encoder = with_lora(encoder, model_args)
    trainer = stage_trainer(
        ContrastiveTrainer,
        encoder,
        tokenizer,
        training_args,
        data,
        data_args,
        callbacks,
        training_args.n_views,
    )
    trainer.run_settings = with_data_fingerprint(
        settings or stage_settings(training_args, model_args, data_args), data
    )
    return _finish_contrastive(
        trainer, tokenizer, fit(trainer, created, "stage 1 (contrastive)"), model_args, data_args, data
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
            return trainer_save(trainer, folder)
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
    save_stage(trainer, tokenizer, {METRICS_FILE: saved}, lambda: staged_save(trainer, save_model, native))
    return StageResult(args.output_dir, metrics, data.label_names, data.notes, trainer)
