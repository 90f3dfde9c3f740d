"""The two-stage pipeline as library calls: run a stage with its model card, score a saved classifier.

What the ``hf-mlcl`` commands (:mod:`hf_mlcl.cli`) and the demo (:mod:`hf_mlcl.demo`) share, so that
both stay thin callers and library code never imports the command line:

* :func:`run_contrastive_stage` / :func:`run_probe_stage`: :func:`~hf_mlcl.training.train_contrastive`
  / :func:`~hf_mlcl.training.train_probe` with a :class:`~hf_mlcl.hub.ModelCardCallback` attached, the
  card written into the stage's ``output_dir`` by the process that writes that folder (``should_save``),
  then a barrier, so no rank reads a stage's folder before it is complete (every rank calls these under
  ``accelerate launch``);
* :func:`score_classifier`: sigmoid scores and multi-hot truth of a dataset under a saved classifier;
* :func:`evaluate_checkpoint`: a saved classifier scored on a split at its stored decision threshold,
  with ``eval_<split>.json`` and the per-label F1 plot (:func:`require_classifier` first: an encoder
  folder is refused before anything is loaded or written);
* :func:`encoder_loss`: the contrastive loss an encoder folder was trained with;
* :func:`check_stage` / :func:`finished_stage_metrics`: before any work, the launch and output-folder
  checks of :mod:`hf_mlcl.training.run_guard`; on resume, a finished stage's metrics instead of a rerun.
"""

from __future__ import annotations

import json
import os
from typing import Any

from . import distributed as D

__all__ = [
    "PLOTS_DIR",
    "check_stage",
    "finished_stage_metrics",
    "encoder_loss",
    "evaluate_checkpoint",
    "run_contrastive_stage",
    "run_probe_stage",
    "require_classifier",
    "score_classifier",
]

PLOTS_DIR = "plots"


def _call_with_card(fn, card_cb, *args) -> tuple[Any, dict]:
    """Run a training entry point with the card callback attached, then replay the finished trainer's
    data into it (the logistic probe never calls ``Trainer.train``, so its hooks alone would miss it)."""
    trainer, metrics = fn(*args, callbacks=[card_cb])
    card_cb.collect_from_trainer(trainer, metrics)
    return trainer, metrics


def _label_names(trainer) -> list[str] | None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    id2label = getattr(model.config, "id2label", None) or {}
    return [str(id2label[i]) for i in sorted(id2label, key=int)] if id2label else None


def check_stage(args) -> None:
    """Stop before any work when the launch cannot form a working process group or ``args.output_dir``
    holds another run (:func:`~hf_mlcl.training.run_guard.check_launch`,
    :func:`~hf_mlcl.training.run_guard.check_output_dir`). Deletes nothing: with ``overwrite_output_dir``
    the old checkpoints go only once the stage's data and model have loaded (the stage entry points)."""
    from .run_guard import check_launch, check_output_dir

    check_launch(args)
    check_output_dir(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint)


def finished_stage_metrics(args) -> dict | None:
    """When resuming and the stage's folder already holds its finished output: its saved metrics (the stage
    is not redone). Otherwise None. Under several processes the stage counts as finished only when it is
    in every process's folder (node-local folders may differ), so every process takes the same path
    (every process calls this)."""
    from .checkpoints import wants_resume
    from .entry import METRICS_FILE
    from .run_guard import stage_finished

    if not wants_resume(args.resume_from_checkpoint):
        return None
    if not all(D.all_gather_object(stage_finished(args.output_dir))):
        return None
    print(f"{args.output_dir} is finished; resuming after it")
    with open(os.path.join(args.output_dir, METRICS_FILE), encoding="utf-8") as fh:
        return json.load(fh)


def run_contrastive_stage(model_args, data_args, training_args) -> tuple[Any, dict]:
    """Stage 1 via ``hf_mlcl.training.train_contrastive``; writes the encoder card into output_dir."""
    from hf_mlcl.hub import ModelCardCallback

    from .entry import train_contrastive

    card_cb = ModelCardCallback("encoder", model_args=model_args, data_args=data_args)
    trainer, metrics = _call_with_card(train_contrastive, card_cb, model_args, data_args, training_args)
    if training_args.should_save:  # the folder's writer: the main process, or each node's (save_on_each_node)
        names = _label_names(trainer)
        if names and not card_cb.card.label_names:
            card_cb.card.label_names, card_cb.card.num_labels = names, len(names)
        card_cb.save(training_args.output_dir, model_name=training_args.hub_model_id)
    D.barrier()  # stage 2 (on any rank) starts only once the encoder, its metrics and card are written
    return trainer, metrics


def run_probe_stage(
    model_args, data_args, probing_args, encoder_path: str | None, contrastive_loss: str | None = None
) -> tuple[Any, dict]:
    """Stage 2 via ``hf_mlcl.training.train_probe``; writes the classifier card into output_dir."""
    from hf_mlcl.hub import ModelCardCallback

    from .entry import train_probe

    card_cb = ModelCardCallback(
        "classifier",
        model_args=model_args,
        data_args=data_args,
        contrastive_loss=contrastive_loss,
        encoder_path=encoder_path,
    )
    trainer, metrics = _call_with_card(train_probe, card_cb, model_args, data_args, probing_args, encoder_path)
    if probing_args.should_save:  # the folder's writer: the main process, or each node's (save_on_each_node)
        names = _label_names(trainer)
        if names:
            card_cb.card.label_names, card_cb.card.num_labels = names, len(names)
        card_cb.card.hyperparameters["threshold"] = str(probing_args.threshold)
        card_cb.save(probing_args.output_dir, model_name=probing_args.hub_model_id)
    D.barrier()  # no rank reads the classifier folder (evaluation, push) before its card is written
    return trainer, metrics


def encoder_loss(encoder_path: str | None) -> str | None:
    """The contrastive loss recorded in an encoder folder's card_data.json / metrics.json, if any."""
    if not encoder_path:
        return None
    for name, key in (("card_data.json", "loss"), ("metrics.json", "loss")):
        path = os.path.join(encoder_path, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                value = json.load(fh).get(key)
            if value:
                return value
    return None


def score_classifier(model, tokenizer, dataset, num_labels: int, max_length: int, batch_size: int = 32):
    """Sigmoid scores (N, L) and multi-hot truth (N, L) of ``dataset`` (batched, no gradient)."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from hf_mlcl.data import MultiLabelCollator

    from .entry import segment_multiple

    collator = MultiLabelCollator(tokenizer, num_labels, max_length=max_length, pad_to_multiple_of=segment_multiple(model))
    device = next(model.parameters()).device
    scores, truth = [], []
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
            labels = batch.pop("labels")
            inputs = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            scores.append(torch.sigmoid(model(**inputs).logits.float()).cpu().numpy())
            truth.append(labels.to_dense().numpy() if labels.is_sparse else labels.numpy())
    return np.concatenate(scores), np.concatenate(truth) > 0.5


def require_classifier(checkpoint: str) -> None:
    """ValueError in one line when ``checkpoint`` is a stage-1 encoder folder, not a classifier: scoring it
    would put a randomly initialised head on the encoder. Reads ``config.json`` only (before any loading)."""
    path = os.path.join(checkpoint, "config.json")
    if not os.path.isfile(path):
        return  # a Hub id, or no model at all: from_pretrained says what is wrong
    with open(path, encoding="utf-8") as fh:
        architectures = json.load(fh).get("architectures") or []
    if "MLCLEncoder" in architectures:
        raise ValueError(
            f"{checkpoint} is an encoder (stage 1), but evaluate needs a classifier: train a head on it with "
            f"`hf-mlcl probe RECIPE --encoder_path {checkpoint}` (or `hf-mlcl run RECIPE`) and evaluate the "
            "classifier folder it writes"
        )


def evaluate_checkpoint(
    checkpoint: str,
    data_args,
    split: str = "test",
    batch_size: int = 32,
    plots: bool = True,
    output_dir: str | None = None,
) -> dict[str, float]:
    """Score a saved classifier on ``split`` at its stored decision threshold; write
    ``eval_<split>.json`` and ``plots/f1_vs_frequency_<split>.png`` into ``output_dir`` (default: the
    checkpoint folder). Returns the metrics, keys prefixed with the split name."""
    import numpy as np
    from transformers import AutoTokenizer

    from hf_mlcl.data import train_frequency
    from hf_mlcl.evaluation import compute_multilabel_metrics, per_label_f1, plot_f1_vs_frequency
    from hf_mlcl.files import atomic_write_json
    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.modeling.sharded import loading_whole_models

    from .entry import load_data

    require_classifier(checkpoint)
    with loading_whole_models():  # the main process alone scores the classifier, also in a ZeRO-3 run
        model = MLCLForMultiLabelClassification.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ds, names = load_data(data_args)
    if split not in ds:
        raise ValueError(f"dataset {data_args.dataset!r} has no {split!r} split; choose one of {list(ds)}")
    trained = [str(model.config.id2label[i]) for i in range(model.config.num_labels)]
    if trained != [str(n) for n in names]:
        raise ValueError(
            f"the checkpoint's {len(trained)} labels differ from dataset {data_args.dataset!r}'s {len(names)} labels; "
            "evaluate on the dataset (and dataset_options) it was trained on"
        )
    scores, truth = score_classifier(model, tokenizer, ds[split], len(names), data_args.max_length, batch_size)
    threshold = getattr(model.config, "decision_threshold", None)
    threshold = 0.5 if threshold is None else (np.asarray(threshold) if isinstance(threshold, list) else float(threshold))
    metrics = {f"{split}_{k}": float(v) for k, v in compute_multilabel_metrics(truth, scores, threshold=threshold).items()}
    out = output_dir or checkpoint
    os.makedirs(out, exist_ok=True)
    atomic_write_json(os.path.join(out, f"eval_{split}.json"), metrics)
    if plots and len(ds["train"]):
        freq = train_frequency(ds["train"], len(names))
        f1 = per_label_f1(truth, scores >= threshold)
        plot_f1_vs_frequency(f1, freq, os.path.join(out, PLOTS_DIR, f"f1_vs_frequency_{split}.png"),
                             title=f"{data_args.dataset}: per-label F1 ({split})")
    return metrics
