"""``throughput``: stage-1 training speed of ContrastiveTrainer against the trainers users already run.

Rows ``contrastive``, ``trainer_bce``, ``st_mlcl`` and ``st_mnrl`` on the all-MiniLM-L6-v2 and RoBERTa-base
shapes (random weights), batch 64 x 128 tokens, bf16 on a GPU.

Method: docs/benchmarks.md, "Stage-1 throughput against the peers (benchmarks/measurements/throughput.py)"
"""

from __future__ import annotations

import gc
import os
import random
import statistics
import tempfile
from typing import Any

from .common import BERT_TINY, MINILM_L6, ROBERTA_BASE, Cell

DESCRIPTION = (
    "stage-1 samples/s in bf16, batch 64 x 128 tokens, MiniLM-L6 and RoBERTa-base shapes: ContrastiveTrainer (sd) "
    "vs Trainer + BCE vs SentenceTransformerTrainer (MultiLabelContrastiveLoss, MultipleNegativesRankingLoss); "
    "host syncs per training step"
)
ROWS = ("contrastive", "trainer_bce", "st_mlcl", "st_mnrl")
NUM_LABELS = 20
WORDS = 2000


def cells(tiny: bool) -> list[Cell]:
    return [
        Cell("minilm", params={"encoder": "minilm"}, timeout=600),
        Cell("roberta-base", params={"encoder": "roberta-base"}, timeout=600),
    ]


class _TokenizeMultiHot:
    """Collator of the Trainer + BCE row: tokenize the texts, multi-hot the label ids."""

    def __init__(self, tokenizer, seq: int, num_labels: int) -> None:
        self.tokenizer, self.seq, self.num_labels = tokenizer, seq, num_labels

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        batch = self.tokenizer(
            [r["text"] for r in rows], padding=True, truncation=True, max_length=self.seq, return_tensors="pt"
        )
        labels = torch.zeros(len(rows), self.num_labels)
        for i, r in enumerate(rows):
            labels[i, r["labels"]] = 1.0
        batch["labels"] = labels
        return dict(batch)


def _texts(n: int, seq: int, seed: int = 0) -> tuple[list[str], list[list[int]], list[str]]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(WORDS)]
    texts = [" ".join(rng.choices(vocab, k=seq + 8)) for _ in range(n)]
    labels = [sorted(rng.sample(range(NUM_LABELS), rng.randint(1, 4))) for _ in range(n)]
    return texts, labels, vocab


def run(cell: Cell, tiny: bool, cache_dir: str) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers import losses as st_losses
    from sentence_transformers import models as st_models
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForSequenceClassification,
        Trainer,
        TrainingArguments,
    )

    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.data.registry import build_split
    from hf_mlcl.data.tokenizer import word_level_tokenizer
    from hf_mlcl.integrations.sentence_transformers import (
        MultiLabelContrastiveLoss,
        to_sentence_transformers_dataset,
    )
    from hf_mlcl.modeling import MLCLEncoder
    from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments

    from .common import StepProbe, StepProfile, device, peak_memory, reset_peak_memory, summary

    shape = dict(
        BERT_TINY if tiny else {"minilm": MINILM_L6, "roberta-base": ROBERTA_BASE}[cell.params["encoder"]]
    )
    pooling = "mean" if cell.params["encoder"] == "minilm" else "cls"
    batch, seq = (8, 16) if tiny else (64, 128)
    warmup, steps, rounds = (3, 3, 1) if tiny else (3, 12, 2)
    bf16 = device().type == "cuda"
    n = batch * (warmup + steps)
    texts, labels, vocab = _texts(n, seq)
    tokenizer = word_level_tokenizer(vocab, model_max_length=seq)
    folder = os.path.join(cache_dir, f"throughput-{cell.params['encoder']}{'-tiny' if tiny else ''}")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        torch.manual_seed(0)
        model_type = shape.pop("model_type")
        shape["vocab_size"] = max(shape["vocab_size"], len(tokenizer))
        AutoModel.from_config(AutoConfig.for_model(model_type, **shape)).save_pretrained(folder)
        tokenizer.save_pretrained(folder)
    names = [f"label{i}" for i in range(NUM_LABELS)]
    split = build_split(texts, labels, names)
    out_dir = tempfile.mkdtemp(prefix="throughput-", dir=cache_dir)
    common = dict(
        per_device_train_batch_size=batch,
        max_steps=warmup + steps,
        learning_rate=2e-5,
        bf16=bf16,
        logging_strategy="no",
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        dataloader_num_workers=0,
        dataloader_drop_last=True,
        output_dir=out_dir,
    )

    def contrastive(probe):
        encoder = MLCLEncoder.from_backbone(folder, pooling=pooling, projection_dim=256)
        args = ContrastiveTrainingArguments(loss="sd", knn_k=0, **common)
        collator = MultiLabelCollator(tokenizer, NUM_LABELS, max_length=seq)
        return ContrastiveTrainer(
            model=encoder,
            args=args,
            train_dataset=split,
            data_collator=collator,
            num_labels=NUM_LABELS,
            callbacks=[probe],
        )

    def trainer_bce(probe):
        model = AutoModelForSequenceClassification.from_pretrained(
            folder, num_labels=NUM_LABELS, problem_type="multi_label_classification"
        )
        args = TrainingArguments(remove_unused_columns=False, **common)
        return Trainer(
            model=model,
            args=args,
            train_dataset=split,
            data_collator=_TokenizeMultiHot(tokenizer, seq, NUM_LABELS),
            callbacks=[probe],
        )

    def sentence_transformer():
        module = st_models.Transformer(folder, max_seq_length=seq)
        return SentenceTransformer(
            modules=[module, st_models.Pooling(module.get_word_embedding_dimension(), pooling)],
            device=str(device()),
        )

    def st_mlcl(probe):
        model = sentence_transformer()
        data = to_sentence_transformers_dataset(split, label_format="multi_hot", num_labels=NUM_LABELS)
        args = SentenceTransformerTrainingArguments(**common)
        return SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=data,
            callbacks=[probe],
            loss=MultiLabelContrastiveLoss(model, "sd", num_labels=NUM_LABELS),
        )

    def st_mnrl(probe):
        model = sentence_transformer()
        pairs = Dataset.from_dict({"anchor": texts[0::2], "positive": texts[1::2]})
        args = SentenceTransformerTrainingArguments(**{**common, "per_device_train_batch_size": batch // 2})
        return SentenceTransformerTrainer(
            model=model,
            args=args,
            train_dataset=pairs,
            callbacks=[probe],
            loss=st_losses.MultipleNegativesRankingLoss(model),
        )

    builders = {
        "contrastive": contrastive,
        "trainer_bce": trainer_bce,
        "st_mlcl": st_mlcl,
        "st_mnrl": st_mnrl,
    }
    times: dict[str, list[float]] = {r: [] for r in ROWS}
    walls: dict[str, list[float]] = {r: [] for r in ROWS}
    syncs: dict[str, list[int]] = {r: [] for r in ROWS}
    sites: dict[str, list[str]] = {r: [] for r in ROWS}
    memory: dict[str, Any] = {}

    def train_with(row: str, callback) -> None:
        """One training run of ``row`` with ``callback``, its trainer freed afterwards."""
        trainer = builders[row](callback)
        trainer.train()
        del trainer
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    for _ in range(rounds):
        for row in ROWS:
            probe = StepProbe(count_from=warmup)
            reset_peak_memory()
            train_with(row, probe)
            memory[row] = peak_memory()  # the peak since the reset, read after the release
            times[row] += probe.times[warmup:]
            walls[row].append((probe.ends[-1] - probe.begins[warmup]) / steps)
            syncs[row] += probe.syncs
            sites[row] = sites[row] or probe.sync_sites[:6]
    # one more short run per row, outside the timed ones: one step under the profiler (the kernels a step
    # launches and where its time goes, to place the rows' differences)
    common["max_steps"] = warmup + 1
    profiles: dict[str, Any] = {}
    for row in ROWS:
        profile = StepProfile(at=warmup)
        train_with(row, profile)
        profiles[row] = profile.summary
    rows: dict[str, Any] = {}
    for row in ROWS:
        median = statistics.median(times[row])
        rows[row] = {
            "step_time_s": summary(times[row]),
            "samples_per_s": batch / median,
            "wall_samples_per_s": batch / statistics.median(walls[row]),
            "syncs_per_step": syncs[row],
            "sync_sites": sites[row],
            "peak_memory": memory[row],
            "profile": profiles[row],
        }
    speed = {r: rows[r]["samples_per_s"] for r in ROWS}
    ratios = {
        "contrastive_over_trainer_bce": speed["contrastive"] / speed["trainer_bce"],
        "contrastive_over_st_mlcl": speed["contrastive"] / speed["st_mlcl"],
        "contrastive_over_st_mnrl": speed["contrastive"] / speed["st_mnrl"],
    }
    return {
        "encoder": cell.params["encoder"] + (" (tiny BERT)" if tiny else " shape, random init"),
        "pooling": pooling,
        "batch": batch,
        "seq_len": seq,
        "num_labels": NUM_LABELS,
        "bf16": bf16,
        "warmup_steps": warmup,
        "measured_steps_per_run": steps,
        "rounds": rounds,
        "rows": rows,
        "ratios": ratios,
    }
