"""The two stage entry points, `train_contrastive` (stage 1) and `train_probe` (stage 2): data to saved model.

Both load the dataset with ``hf_mlcl.data.load_mlc_dataset``, build the tokenizer (from the model path,
or ``train_tokenizer`` on the training texts when the backbone is built from ``backbone_config``), the
model, the collator and the trainer, then train, evaluate and save into ``training_args.output_dir``:

``train_contrastive`` writes
    the encoder (``config.json`` + weights + remote-code files; ``MLCLEncoder.from_pretrained`` /
    ``AutoModel.from_pretrained(..., trust_remote_code=True)``; a LoRA run writes an adapter folder,
    ``hf_mlcl.modeling.lora.save_lora_model``), the tokenizer files, ``metrics.json``
    (train_* and eval_* metrics: eval_loss, eval_knn_micro_f1 ...), ``trainer_state.json`` and the
    Trainer's ``checkpoint-*`` folders (with ``mlcl_trainer_state.safetensors``).
``train_probe`` writes
    the classifier (``MLCLForMultiLabelClassification``: ``config.json`` with ``id2label`` /
    ``label2id`` / ``problem_type`` and ``decision_threshold``, weights, remote-code files; a LoRA run
    or a frozen probe on an adapter encoder writes an adapter folder instead), the
    tokenizer files, ``metrics.json`` (validation_* and test_* metrics at the tuned threshold, plus
    ``threshold`` and the probe settings), ``thresholds.json`` (the threshold, a float or a per-label
    list, with the label names) and, for trained probes, ``trainer_state.json``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np

from hf_mlcl.files import atomic_write_json

from . import distributed as D
from .arguments import ContrastiveTrainingArguments, DataArguments, ModelArguments, ProbingTrainingArguments
from .checkpoints import resolve_resume
from .run_guard import InputError

logger = logging.getLogger(__name__)

__all__ = [
    "train_contrastive",
    "train_probe",
    "load_data",
    "build_tokenizer_and_encoder",
    "is_mlcl_checkpoint",
    "check_train_batches",
]

METRICS_FILE = "metrics.json"
THRESHOLDS_FILE = "thresholds.json"

_ENCODER_MODEL_TYPES = {
    "bert", "roberta", "xlm-roberta", "distilbert", "electra", "deberta", "deberta-v2", "mpnet", "albert",
    "camembert", "longformer", "modernbert",
}  # fmt: skip


def is_mlcl_checkpoint(path: str | None) -> bool:
    """True when ``path`` is a folder holding a saved hf_mlcl model (``config.json`` with model_type mlcl)."""
    if not path or not os.path.isdir(path):
        return False
    cfg = os.path.join(path, "config.json")
    if not os.path.isfile(cfg):
        return False
    with open(cfg, encoding="utf-8") as fh:
        return json.load(fh).get("model_type") == "mlcl"


def load_data(data_args: DataArguments):
    """``load_mlc_dataset`` with the ``max_*_samples`` caps applied (first rows, or a random subset drawn
    with ``subset_seed``); returns (DatasetDict, label names).

    Empty splits are a ValueError naming them (before any training); the provenance notes of the splits
    (e.g. a validation split carved from train) are logged and stored in ``data_args.data_notes`` so the
    model card states them."""
    from hf_mlcl.data import data_notes, label_names, load_mlc_dataset
    from hf_mlcl.data.custom import check_splits

    ds = load_mlc_dataset(data_args.dataset, data_dir=data_args.data_dir, **data_args.loader_options())
    for split, cap in (
        ("train", data_args.max_train_samples),
        ("validation", data_args.max_eval_samples),
        ("test", data_args.max_test_samples),
    ):
        if cap is not None and split in ds and len(ds[split]) > cap:
            if data_args.subset_seed is None:
                ds[split] = ds[split].select(range(int(cap)))
            else:  # a seeded random subset, kept in file order
                rows = np.random.default_rng(data_args.subset_seed).choice(len(ds[split]), int(cap), replace=False)
                ds[split] = ds[split].select(np.sort(rows))
    for split in ("train", "validation"):
        if split not in ds:
            raise ValueError(f"dataset {data_args.dataset!r} has no {split!r} split (splits: {list(ds)})")
    check_splits(ds, f"dataset {data_args.dataset!r}")
    data_args.data_notes = data_notes(ds)
    for note in data_args.data_notes:
        logger.info("data: %s", note)
    return ds, list(label_names(ds["train"]))


def _tokenizer_style(model_type: str) -> str:
    return "bert" if model_type in _ENCODER_MODEL_TYPES else "llama"


def _encoder_from_backbone(source: Any, model_args: ModelArguments, projection_dim: int, **extra: Any):
    """A fresh MLCLEncoder around a backbone id / path / config dict, configured from ``model_args``.

    A ``label_attention`` (PLM-ICD) recipe gets a segmented encoder: its document embedding is the
    masked mean over all segment tokens.
    """
    from hf_mlcl.modeling.modeling_mlcl import MLCLEncoder

    if model_args.projection_hidden_dim is not None:
        extra["projection_hidden_dim"] = model_args.projection_hidden_dim
    return MLCLEncoder.from_backbone(
        source,
        pooling=model_args.pooling,
        projection_dim=projection_dim,
        chunk_size=model_args.chunk_size,
        segmented=model_args.head == "label_attention",
        **extra,
    )


def build_tokenizer_and_encoder(
    model_args: ModelArguments,
    train_texts: list[str] | None,
    projection_dim: int = 256,
    source: str | None = None,
):
    """(tokenizer, MLCLEncoder) from a saved hf_mlcl encoder, a backbone id / path, or ``backbone_config``.

    ``source`` overrides ``model_args.model_name_or_path`` (``train_probe``'s ``encoder_path``). A tokenizer
    trained on the fly (``backbone_config`` without ``tokenizer_name_or_path``) is trained by the global main
    process and sent to the others, so every process of a multi-process launch calls this.
    """
    from transformers import AutoTokenizer

    from hf_mlcl.modeling.modeling_mlcl import MLCLEncoder

    path = source or model_args.model_name_or_path
    extra = {"trust_remote_code": True} if model_args.trust_remote_code else {}
    if path:
        tok_path = model_args.tokenizer_name_or_path or path
        if (
            model_args.tokenizer_name_or_path is None
            and os.path.isdir(path)
            and not any(
                os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json")
            )
        ):
            if not model_args.model_name_or_path or model_args.model_name_or_path == path:
                raise ValueError(f"{path} holds no tokenizer; set model_args.tokenizer_name_or_path")
            tok_path = model_args.model_name_or_path
        tokenizer = AutoTokenizer.from_pretrained(tok_path, **extra)
        if is_mlcl_checkpoint(path):
            encoder = MLCLEncoder.from_pretrained(path)
        else:
            encoder = _encoder_from_backbone(path, model_args, projection_dim, **extra)
    elif model_args.backbone_config:
        cfg = dict(model_args.backbone_config)
        if "model_type" not in cfg:
            raise ValueError("backbone_config needs a 'model_type' key (e.g. {'model_type': 'bert', ...})")
        if model_args.tokenizer_name_or_path:
            tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name_or_path, **extra)
        else:
            if not train_texts:
                raise ValueError(
                    "backbone_config without tokenizer_name_or_path needs training texts to train a tokenizer"
                )
            from hf_mlcl.data import train_tokenizer

            # trained once for the launch (global main process) and sent to every process of every node
            tokenizer = D.built_once(lambda: train_tokenizer(
                train_texts,
                vocab_size=int(cfg.get("vocab_size", 2000)),
                style=_tokenizer_style(cfg["model_type"]),
                model_max_length=int(cfg.get("max_position_embeddings", 512)),
            ))  # fmt: skip
        cfg["vocab_size"] = len(tokenizer)
        cfg["pad_token_id"] = tokenizer.pad_token_id
        for name in ("bos_token_id", "eos_token_id"):
            value = getattr(tokenizer, name, None)
            if value is not None and cfg.get("model_type") not in _ENCODER_MODEL_TYPES:
                cfg[name] = value
        encoder = _encoder_from_backbone(cfg, model_args, projection_dim)
    else:
        raise ValueError(
            "set model_args.model_name_or_path (a backbone or hf_mlcl encoder) or model_args.backbone_config"
        )
    from hf_mlcl.modeling.lora import ensure_pad_token

    ensure_pad_token(tokenizer)  # the one pad-token policy (Llama-3 reserved pad, else EOS)
    backbone_cfg = getattr(getattr(encoder, "backbone", None), "config", None)
    if backbone_cfg is not None and getattr(backbone_cfg, "pad_token_id", None) is None:
        backbone_cfg.pad_token_id = tokenizer.pad_token_id  # Llama has no pad token by default
    return tokenizer, encoder


def _set_labels(config, names: list[str]) -> None:
    config.id2label = {i: n for i, n in enumerate(names)}
    config.label2id = {n: i for i, n in enumerate(names)}


def _trainer_data(ds, names: list[str], collator, tokenizer, callbacks: list | None) -> dict[str, Any]:
    """The keywords both stages hand their trainer: train / validation splits, collator, tokenizer,
    label count and callbacks."""
    return {
        "data_collator": collator,
        "train_dataset": ds["train"],
        "eval_dataset": ds["validation"],
        "processing_class": tokenizer,
        "num_labels": len(names),
        "callbacks": callbacks,
    }


def segment_multiple(model) -> int | None:
    """The multiple token sequences must be padded to for ``model``: its chunk size when it reads long
    documents as fixed-size segments (PLM-ICD, Huang et al. 2022, sec. 3.1), else None."""
    cfg = getattr(model, "config", None)
    return int(cfg.chunk_size) if cfg is not None and getattr(cfg, "segmented", False) else None


def _adapter_encoder(path: str | None) -> bool:
    """True when ``path`` is an encoder folder saved as a LoRA adapter (``save_lora_adapter``)."""
    from hf_mlcl.modeling.modeling_mlcl import ADAPTER_CONFIG_NAME

    return bool(path) and os.path.isfile(os.path.join(path, ADAPTER_CONFIG_NAME))


def _with_lora(model, model_args: ModelArguments, training_args):
    """``model`` wrapped by ``hf_mlcl.modeling.apply_lora`` with the recipe's LoRA settings (our heads in
    ``modules_to_save``)."""
    from hf_mlcl.modeling import apply_lora

    return apply_lora(
        model,
        r=model_args.lora_r,
        alpha=model_args.lora_alpha,
        dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        # the Trainer's own flag (activation_checkpointing, formerly gradient_checkpointing) decides
        gradient_checkpointing=training_args.activation_checkpointing or training_args.gradient_checkpointing,
    )


def _check_lora_save(model_args: ModelArguments, args, source: str | None, adapter_encoder: bool = False) -> None:
    """Before any loading: a LoRA run under DeepSpeed / FSDP must be able to write its adapter at the end."""
    from .sharding import requested_engine

    engine = requested_engine(args)
    if engine is None:
        return
    if not (source or model_args.model_name_or_path):
        raise ValueError(
            f"use_lora with a backbone built from backbone_config under {engine}: the sharded weights have no base "
            "model to save an adapter for; build the backbone from a saved model (model_name_or_path)"
        )
    if adapter_encoder:
        raise ValueError(
            f"probe: finetune with use_lora on an encoder saved as a LoRA adapter under {engine}: the new adapter "
            "applies to the merged encoder, not to the base model; save stage 1 with --merge_lora true or fine-tune "
            "without DeepSpeed / FSDP (the merged weights are then saved)"
        )


def check_train_batches(n_rows: int, args, stage: str) -> None:
    """:class:`~hf_mlcl.training.run_guard.InputError` (a ValueError, one line) when the train split cannot
    fill one batch on every process and the stage
    drops an incomplete last batch (``dataloader_drop_last``, stage 1's default): the stage would make no
    optimizer step. Each process takes ``args.train_batch_size`` rows per batch, ``args.world_size``
    processes share the split. Runs before any model is built or any folder is written."""
    if not args.dataloader_drop_last:
        return  # a short last batch still trains
    processes = max(1, int(args.world_size))
    per_process = int(args.train_batch_size)
    if n_rows >= per_process * processes:
        return
    batch = f"per_device_train_batch_size {per_process}" + (f" x {processes} processes" if processes > 1 else "")
    fit = n_rows // processes
    fix = (f"lower per_device_train_batch_size to at most {fit}" if fit
           else f"launch at most {n_rows} process{'es' if n_rows > 1 else ''}")  # fmt: skip
    raise InputError(
        f"the train split has {n_rows} rows, fewer than one batch of {per_process * processes} ({batch}), and "
        f"{stage} drops an incomplete last batch (dataloader_drop_last true), so it would train no step; {fix}, "
        "or add training rows"
    )


def _new_folders(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    out, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        out.append(path)
        path = os.path.dirname(path)
    return out


def _require_a_step(trainer, new_folders: list[str], stage: str) -> None:
    """:class:`~hf_mlcl.training.run_guard.InputError` (nothing saved) when the stage's training made no
    optimizer step, e.g.
    ``num_train_epochs 0``: its model would be the untrained one. The empty folders the stage created
    (the Trainer makes ``output_dir``) are removed again."""
    if trainer.state.global_step > 0:
        return
    D.barrier()
    if trainer.args.should_save:  # the process that writes this folder (one per node with save_on_each_node)
        for folder in new_folders:  # deepest first; only folders this stage created and left empty
            if os.path.isdir(folder) and not os.listdir(folder):
                os.rmdir(folder)
    args = trainer.args
    raise InputError(
        f"{stage} made no optimizer step (num_train_epochs {args.num_train_epochs}, max_steps {args.max_steps}, "
        f"{len(trainer.train_dataset)} train rows), so no model was saved; train at least one step"
    )


def _trainer_saves_tokenizer(trainer) -> bool:
    """True when ``trainer.save_model`` writes the tokenizer (its ``processing_class``) beside the weights:
    everywhere but FSDP without a full state dict, where transformers saves no model files at all."""
    if trainer.processing_class is None:
        return False
    if trainer.is_fsdp_enabled:
        return "FULL_STATE_DICT" in str(trainer.accelerator.state.fsdp_plugin.state_dict_type)
    return True


def _save_trainer_state(trainer) -> None:
    """``trainer_state.json`` into ``output_dir`` on the process that writes that folder (``args.should_save``:
    the global main process, or each node's main process with ``save_on_each_node``); ``Trainer.save_state``
    writes on the global main process only, which would leave a node-local folder without it."""
    trainer.state.save_to_json(os.path.join(trainer.args.output_dir, "trainer_state.json"))


def _replace_previous_run(args) -> None:
    """``overwrite_output_dir``: remove the previous run's checkpoints now, after the stage's inputs (data,
    model, batch size) have been checked and before training writes new ones
    (:func:`hf_mlcl.training.run_guard.remove_previous_checkpoints`)."""
    from .run_guard import remove_previous_checkpoints

    remove_previous_checkpoints(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint,
                                args.should_save)  # fmt: skip


def train_contrastive(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: ContrastiveTrainingArguments,
    callbacks: list | None = None,
):
    """Stage 1: contrastive training of an encoder. Returns ``(ContrastiveTrainer, metrics dict)``.

    ``callbacks``: extra ``transformers.TrainerCallback`` objects handed to the trainer (e.g. a
    ``hf_mlcl.hub.ModelCardCallback``), as ``Trainer(callbacks=...)`` takes them.

    Resumes from ``training_args.resume_from_checkpoint`` when set (a path, or True for the last
    checkpoint in ``output_dir``). Writes into ``output_dir`` what the module docstring lists.
    """
    from transformers import set_seed

    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.modeling.lora import save_lora_model

    from .contrastive import ContrastiveTrainer

    if model_args.use_lora:
        _check_lora_save(model_args, training_args, None)
    set_seed(training_args.seed)  # before any weight is initialised (projection head, fresh backbones)
    new_folders = _new_folders(training_args.output_dir)
    ds, names = load_data(data_args)
    check_train_batches(len(ds["train"]), training_args, "stage 1 (contrastive)")
    tokenizer, encoder = build_tokenizer_and_encoder(
        model_args, ds["train"]["text"], training_args.projection_dim
    )
    _set_labels(encoder.config, names)
    if model_args.use_lora:
        encoder = _with_lora(encoder, model_args, training_args)
    collator = MultiLabelCollator(
        tokenizer,
        len(names),
        max_length=data_args.max_length,
        n_views=training_args.n_views,
        pad_to_multiple_of=segment_multiple(encoder),
    )
    trainer = ContrastiveTrainer(
        model=encoder, args=training_args, **_trainer_data(ds, names, collator, tokenizer, callbacks)
    )
    _replace_previous_run(training_args)  # the data and the model are loaded: the new run's inputs hold
    resume = resolve_resume(
        training_args.resume_from_checkpoint, training_args.output_dir, training_args.should_save
    )
    train_out = trainer.train(resume_from_checkpoint=resume)
    _require_a_step(trainer, new_folders, "stage 1 (contrastive)")
    metrics: dict[str, Any] = dict(train_out.metrics)
    metrics.update(trainer.evaluate())
    # every rank: under FSDP / ZeRO-3 the ranks gather the weights together; the writing process writes
    if model_args.use_lora:
        save_lora_model(trainer.model_wrapped, training_args.output_dir, merge=model_args.merge_lora,
                        accelerator=trainer.accelerator, is_main_process=training_args.should_save)  # fmt: skip
    else:
        trainer.save_model(training_args.output_dir)
    if training_args.should_save:
        if model_args.use_lora or not _trainer_saves_tokenizer(trainer):
            tokenizer.save_pretrained(training_args.output_dir)
        _save_trainer_state(trainer)
        atomic_write_json(
            os.path.join(training_args.output_dir, METRICS_FILE),
            {**metrics, "loss": training_args.loss, "dataset": data_args.dataset, "num_labels": len(names)},
        )
    D.barrier()  # the encoder is on disk before any rank goes on (stage 2 loads it)
    return trainer, metrics


def train_probe(
    model_args: ModelArguments,
    data_args: DataArguments,
    probing_args: ProbingTrainingArguments,
    encoder_path: str | None = None,
    callbacks: list | None = None,
):
    """Stage 2: probe / fine-tune a classifier. Returns ``(ProbingTrainer, metrics dict)``.

    ``callbacks``: extra ``transformers.TrainerCallback`` objects handed to the trainer. The
    ``logistic`` probe fits without ``Trainer.train``, so training hooks do not fire for it.

    ``encoder_path``: a saved hf_mlcl encoder (the contrastive stage's output_dir), a plain backbone id
    / path (BCE baseline: ``probe="finetune"`` with ``loss="bce"``), or None to use ``model_args``
    (``model_name_or_path`` or ``backbone_config``). ``probe="linear"`` / ``"logistic"`` freeze the
    encoder, ``"finetune"`` trains it; with ``model_args.use_lora`` a fine-tune trains LoRA adapters and
    the classifier head only (``apply_lora``, the head in ``modules_to_save``) and saves an adapter folder
    (``hf_mlcl.modeling.lora.save_lora_model``; merged weights with ``merge_lora``, or when the encoder
    was itself saved as an adapter). The threshold is tuned on validation per
    ``probing_args.threshold`` and the test split (if any) is scored with it.
    """
    from transformers import set_seed

    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.modeling.lora import merge_lora, save_heads_with_adapter, save_lora_model
    from hf_mlcl.modeling.modeling_mlcl import MLCLForMultiLabelClassification

    from .probing import ProbingTrainer

    lora_finetune = model_args.use_lora and probing_args.probe == "finetune"
    if lora_finetune:
        _check_lora_save(model_args, probing_args, encoder_path, _adapter_encoder(encoder_path))
    set_seed(probing_args.seed)  # before the classifier head is initialised
    new_folders = _new_folders(probing_args.output_dir)
    ds, names = load_data(data_args)
    if probing_args.probe != "logistic":  # the logistic probe fits on all rows at once
        check_train_batches(len(ds["train"]), probing_args, "stage 2 (probe)")
    tokenizer, encoder = build_tokenizer_and_encoder(model_args, ds["train"]["text"], source=encoder_path)
    if hasattr(encoder, "merge_and_unload") or hasattr(
        getattr(encoder, "backbone", None), "merge_and_unload"
    ):
        encoder = merge_lora(encoder)
    model = MLCLForMultiLabelClassification.from_encoder(
        encoder,
        id2label=names,
        head=model_args.head,
        freeze_encoder=probing_args.probe in ("linear", "logistic"),
        chunk_size=model_args.chunk_size,
    )
    if lora_finetune:  # adapters + classifier head train; the backbone stays frozen
        model = _with_lora(model, model_args, probing_args)
    collator = MultiLabelCollator(
        tokenizer, len(names), max_length=data_args.max_length, pad_to_multiple_of=segment_multiple(model)
    )
    trainer = ProbingTrainer(model=model, args=probing_args, **_trainer_data(ds, names, collator, tokenizer, callbacks))
    metrics: dict[str, Any] = {
        "probe": probing_args.probe,
        "loss": probing_args.loss,
        "dataset": data_args.dataset,
    }
    _replace_previous_run(probing_args)  # the data and the model are loaded: the new run's inputs hold
    if probing_args.probe == "logistic":
        metrics.update(trainer.fit_logistic(ds["validation"]))
        val_scores, val_truth = trainer.logistic_validation_scores  # no second pass over validation
    else:
        resume = resolve_resume(
            probing_args.resume_from_checkpoint, probing_args.output_dir, probing_args.should_save
        )
        metrics.update(trainer.train(resume_from_checkpoint=resume).metrics)
        _require_a_step(trainer, new_folders, "stage 2 (probe)")
        val_scores, val_truth = trainer.predict_scores(ds["validation"])
    threshold = trainer.tune_threshold(val_scores, val_truth)
    metrics.update(trainer.split_metrics(val_scores, val_truth, "validation"))
    if "test" in ds and len(ds["test"]):
        test_scores, test_truth = trainer.predict_scores(ds["test"])
        metrics.update(trainer.split_metrics(test_scores, test_truth, "test"))
    thr_value = threshold.tolist() if isinstance(threshold, np.ndarray) else float(threshold)
    metrics["threshold"] = thr_value
    metrics["threshold_strategy"] = str(probing_args.threshold)
    unwrapped = trainer.accelerator.unwrap_model(trainer.model)
    unwrapped.config.decision_threshold = thr_value
    trainer_saves_tokenizer = False
    if lora_finetune:  # every rank (FSDP / ZeRO-3 gather); the writing process writes
        # an encoder loaded from a stage-1 adapter is merged: the new adapter applies to it, not to the base
        save_lora_model(trainer.model_wrapped, probing_args.output_dir,
                        merge=model_args.merge_lora or _adapter_encoder(encoder_path),
                        accelerator=trainer.accelerator, is_main_process=probing_args.should_save)  # fmt: skip
    elif _adapter_encoder(encoder_path) and probing_args.probe in ("linear", "logistic") and not model_args.merge_lora:
        # frozen base + adapter: the classifier is the same adapter + its head (every rank: ZeRO-3 / FSDP gather)
        save_heads_with_adapter(trainer.model_wrapped, probing_args.output_dir, encoder_path,
                                accelerator=trainer.accelerator, is_main_process=probing_args.should_save)  # fmt: skip
    else:
        trainer.save_model(probing_args.output_dir)  # every rank (FSDP / ZeRO-3 gather); the writing process writes
        trainer_saves_tokenizer = _trainer_saves_tokenizer(trainer)
    if probing_args.should_save:
        if not trainer_saves_tokenizer:
            tokenizer.save_pretrained(probing_args.output_dir)
        if probing_args.probe != "logistic":
            _save_trainer_state(trainer)
        atomic_write_json(os.path.join(probing_args.output_dir, METRICS_FILE), metrics)
        atomic_write_json(
            os.path.join(probing_args.output_dir, THRESHOLDS_FILE),
            {"strategy": str(probing_args.threshold), "threshold": thr_value, "label_names": names},
        )
    D.barrier()
    return trainer, metrics
