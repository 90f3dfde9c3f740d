"""A saved classifier on a split: :func:`evaluate_checkpoint` scores it at its stored threshold (streamed in
batches, :func:`stream_classifier`) and writes ``eval_<split>.json`` with the per-label F1 plot
(:func:`write_evaluation`).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import numpy as np

from hf_mlcl.evaluation.inputs import sigmoid, to_numpy
from hf_mlcl.evaluation.streaming import EXACT_CELLS, MultiLabelAccumulator
from hf_mlcl.files import atomic_write_json
from hf_mlcl.hub.model_card import CARD_DATA_FILE
from hf_mlcl.modeling.builders import segment_multiple

from .run_settings import evaluation_differs
from .stage_steps import METRICS_FILE, PLOTS_DIR, RunData, StageResult, load_run_data

logger = logging.getLogger(__name__)

__all__ = [
    "encoder_loss",
    "evaluate_checkpoint",
    "require_classifier",
    "score_classifier",
    "stream_classifier",
    "write_evaluation",
]


def encoder_loss(encoder_path: str | None) -> str | None:
    """The contrastive loss recorded in an encoder folder's card_data.json / metrics.json, if any."""
    if not encoder_path:
        return None
    for name in (CARD_DATA_FILE, METRICS_FILE):
        path = os.path.join(encoder_path, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                value = json.load(fh).get("loss")
            if value:
                return value
    return None


def _scored_batches(
    model: Any, tokenizer: Any, dataset: Any, num_labels: int, max_length: int, batch_size: int
) -> Any:
    """(logits (B, L) float32, multi-hot truth (B, L)) of each batch of ``dataset`` (no gradient)."""
    import torch
    from torch.utils.data import DataLoader

    from hf_mlcl.data import MultiLabelCollator

    collator = MultiLabelCollator(
        tokenizer, num_labels, max_length=max_length, pad_to_multiple_of=segment_multiple(model)
    )
    device = next(model.parameters()).device
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
            labels = batch.pop("labels")
            inputs = {
                k: v.to(device)
                for k, v in batch.items()
                if k in ("input_ids", "attention_mask", "token_type_ids")
            }
            logits = model(**inputs).logits.float().cpu().numpy()
            yield logits, to_numpy(labels, "labels")


def score_classifier(
    model: Any, tokenizer: Any, dataset: Any, num_labels: int, max_length: int, batch_size: int = 32
) -> tuple[np.ndarray, np.ndarray]:
    """Sigmoid scores (N, L) float64 and multi-hot truth (N, L) of ``dataset`` (batched, no gradient; dense: for
    small splits, :func:`stream_classifier` streams). The scores are those a training run tunes its threshold on
    and tests with: the float64 sigmoid of the float32 logits."""
    logits, truth = [], []
    for s, t in _scored_batches(model, tokenizer, dataset, num_labels, max_length, batch_size):
        logits.append(s)
        truth.append(t)
    return sigmoid(np.concatenate(logits).astype(np.float64)), np.concatenate(truth) > 0.5


def stream_classifier(
    model: Any,
    tokenizer: Any,
    dataset: Any,
    num_labels: int,
    max_length: int,
    batch_size: int = 32,
    threshold: Any = 0.5,
    exact_cells: int = EXACT_CELLS,
) -> MultiLabelAccumulator:
    """:func:`score_classifier`'s scores streamed into a :class:`MultiLabelAccumulator` of logits counting at
    ``threshold`` (no (N, L) array held; exact up to ``exact_cells`` rows x labels), as a training run's
    evaluation counts them."""
    acc = MultiLabelAccumulator(num_labels, thresholds=[threshold], exact_cells=exact_cells)
    for s, t in _scored_batches(model, tokenizer, dataset, num_labels, max_length, batch_size):
        acc.add_batch(s, t > 0.5)
    return acc


def require_classifier(checkpoint: str) -> None:
    """ValueError in one line when ``checkpoint`` is a stage-1 encoder folder, not a classifier: scoring it
    would put a randomly initialised head on the encoder. Reads ``config.json`` only (before any loading)."""
    from hf_mlcl.modeling.builders import holds_an_encoder, require_a_model

    require_a_model(checkpoint)
    if holds_an_encoder(checkpoint):
        raise ValueError(
            f"{checkpoint} is an encoder (stage 1), but evaluate needs a classifier: train a head on it with "
            f"`hf-mlcl probe RECIPE --encoder_path {checkpoint}` (or `hf-mlcl run RECIPE`) and evaluate the "
            "classifier folder it writes"
        )


def write_evaluation(
    out: str,
    split: str,
    scores: np.ndarray | MultiLabelAccumulator,
    truth: np.ndarray | None,
    threshold: Any,
    data: RunData,
    dataset_name: str,
    plots: bool = True,
) -> dict[str, float]:
    """``eval_<split>.json`` (the metrics at ``threshold``, keys prefixed with the split) and, with ``plots``,
    ``plots/f1_vs_frequency_<split>.png`` into ``out``; returns the metrics. ``scores`` dense (N, L) with
    ``truth``, or a :class:`MultiLabelAccumulator` with ``truth=None``."""
    from hf_mlcl.data import train_frequency
    from hf_mlcl.evaluation import compute_multilabel_metrics, per_label_f1, plot_f1_vs_frequency

    streamed = isinstance(scores, MultiLabelAccumulator)
    result = (
        scores.compute(threshold)
        if streamed
        else compute_multilabel_metrics(truth, scores, threshold=threshold)
    )
    metrics = {f"{split}_{k}": float(v) for k, v in result.items()}
    os.makedirs(out, exist_ok=True)
    atomic_write_json(os.path.join(out, f"eval_{split}.json"), metrics)
    if plots and len(data.dataset["train"]):
        freq = train_frequency(data.dataset["train"], len(data.label_names))
        plot_f1_vs_frequency(
            scores.per_label_f1(threshold) if streamed else per_label_f1(truth, scores >= threshold),
            freq,
            os.path.join(out, PLOTS_DIR, f"f1_vs_frequency_{split}.png"),
            title=f"{dataset_name}: per-label F1 ({split})",
        )
    return metrics


def evaluation_files(probe: StageResult, data_args: Any, data: RunData | None) -> None:
    """The classifier's evaluation files on test (validation without a test split), from the probe's scores
    (dense, or its trainer's streamed evaluation of the split)."""
    split = "test" if any(k.startswith("test_") for k in probe.metrics) else "validation"
    streamed = getattr(probe.trainer, "evaluations", None) or {}
    if probe.skipped or (split not in probe.scores and split not in streamed):
        evaluate_checkpoint(probe.output_dir, data_args, split=split, data=data)  # score the saved classifier
        return
    scores, truth = probe.scores[split] if split in probe.scores else (streamed[split], None)
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
    device: str | None = None,
) -> dict[str, float]:
    """Score a saved classifier on ``split`` at its stored decision threshold; write ``eval_<split>.json`` and
    ``plots/f1_vs_frequency_<split>.png`` into ``output_dir`` (default: the checkpoint folder). Returns the
    metrics, keys prefixed with the split name. An encoder folder is refused before anything is loaded, a split
    the data lack before the model loads, and so are rows or a max_length other than the folder's own without
    ``output_dir`` (:func:`~hf_mlcl.training.run_settings.evaluation_differs`). ``device``: where it scores
    (default: the GPU there is, else the CPU)."""
    import torch
    from transformers import AutoTokenizer

    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.modeling.builders import model_files_required
    from hf_mlcl.modeling.sharded import loading_whole_models

    require_classifier(checkpoint)
    data = data if data is not None else load_run_data(data_args)
    if split not in data.dataset:  # before the model loads
        raise ValueError(
            f"dataset {data_args.dataset!r} has no {split!r} split; choose one of {list(data.dataset)}"
        )
    into_checkpoint = output_dir is None or (
        os.path.isdir(output_dir) and os.path.samefile(output_dir, checkpoint)
    )  # its own folder named as --output_dir writes over its scores too
    changed = (
        evaluation_differs(checkpoint, data.dataset, split, data_args.max_length) if into_checkpoint else []
    )
    if changed:  # the folder's own scores (which a push uploads) stay
        raise ValueError(
            f"{checkpoint} holds the scores of the data it was trained on, and these differ ({', '.join(changed)}); "
            "pass another --output_dir for their metrics and plots"
        )
    # the main process alone scores the classifier, also in a ZeRO-3 run
    with loading_whole_models(), model_files_required(checkpoint):
        model = MLCLForMultiLabelClassification.from_pretrained(checkpoint)
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    trained = [str(model.config.id2label[i]) for i in range(model.config.num_labels)]
    given = [str(n) for n in data.label_names]
    if trained != given:
        if sorted(trained) == sorted(given):
            i = next(j for j, (a, b) in enumerate(zip(trained, given)) if a != b)
            raise ValueError(
                f"dataset {data_args.dataset!r} has the checkpoint's {len(trained)} labels in another order (label "
                f"{i} is {trained[i]!r} in the checkpoint, {given[i]!r} in the data); give the data the "
                "checkpoint's order (label_names in dataset_options, one name per line in that order)"
            )
        raise ValueError(
            f"the checkpoint's {len(trained)} labels differ from dataset {data_args.dataset!r}'s "
            f"{len(data.label_names)} labels; evaluate on the dataset (and dataset_options) it was trained on"
        )
    threshold = getattr(model.config, "decision_threshold", None)
    threshold = (
        0.5
        if threshold is None
        else (np.asarray(threshold) if isinstance(threshold, list) else float(threshold))
    )
    evaluation = stream_classifier(
        model,
        tokenizer,
        data.dataset[split],
        len(data.label_names),
        data_args.max_length,
        batch_size,
        threshold=threshold,
    )
    return write_evaluation(
        output_dir or checkpoint, split, evaluation, None, threshold, data, data_args.dataset, plots
    )
