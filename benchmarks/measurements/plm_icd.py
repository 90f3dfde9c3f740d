"""``plm_icd``: PLM-ICD at MIMIC length and label count: does the recipe fit one GPU, and how fast is it.

PLM-ICD (Huang, Tsai & Chen, ClinicalNLP 2022) reads a 3,072-token discharge summary as 24 segments of
128 tokens through a RoBERTa-base-sized biomedical encoder (here the RoBERTa-base architecture, random
init: the PM-M3-Voc weights are not public on the Hub) and classifies with a label-wise attention head.
The recipes are ``recipes/mimic4_icd10_full/plm-icd/{msc,bce}.yaml``: MIMIC-IV ICD-10 with all 25,230
codes (Nguyen et al. 2023; Edin et al. 2023, the count the dataset recipe states); stage 1 with ``msc``
(per-device batch 128 documents, GradCache chunks of 4, activation checkpointing, a 512 queue, the
25,230 label prototypes) and the BCE fine-tune of the label-attention classifier (batch 8). Rows are
3,072 random tokens with ~16 random codes each (MIMIC-IV ICD-10 averages about 16 codes per stay).
The MIMIC-III full cells use the 8,921 codes of PLM-ICD's code list in ``../shared/data/mimic_splits``
(``MLCL_DEVICE_DATA`` on a machine that carries it, see benchmarks/prepare_device.py).
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

from .common import REPO, ROBERTA_BASE, Cell

DESCRIPTION = (
    "PLM-ICD (RoBERTa-base shape, label attention) at 3,072 tokens in 128-token segments, the recipe's batch: "
    "stage 1 msc and the BCE fine-tune, MIMIC-IV ICD-10 full (25,230 codes) and MIMIC-III full (8,921 codes)"
)
ICD10_FULL = 25230
MIMIC3_CODES = os.path.join("data", "mimic_splits", "mimic3_caml", "ALL_CODES_plmicd.txt")


def cells(tiny: bool) -> list[Cell]:
    out = []
    for dataset in ("mimic4_icd10_full", "mimic3_full"):
        for run in ("msc", "bce"):
            out.append(Cell(f"{run}-{dataset}", params={"run": run, "dataset": dataset}, timeout=900))
    return out


def mimic3_codes() -> list[str]:
    """PLM-ICD's MIMIC-III full code list, from the carried data folder or ``../shared``."""
    for folder in (os.environ.get("MLCL_DEVICE_DATA"), os.path.join(os.path.dirname(REPO), "shared")):
        if not folder:
            continue
        for path in (os.path.join(folder, "mimic3_full_codes.txt"), os.path.join(folder, MIMIC3_CODES)):
            if os.path.isfile(path):
                with open(path, encoding="utf-8") as fh:
                    return [line.strip() for line in fh if line.strip()]
    raise FileNotFoundError(
        f"the MIMIC-III code list ({MIMIC3_CODES}) is neither in ../shared nor in $MLCL_DEVICE_DATA; "
        "run benchmarks/prepare_device.py where ../shared exists"
    )


def run(cell: Cell, tiny: bool, cache_dir: str) -> dict[str, Any]:
    import time

    import torch
    from transformers import AutoConfig, AutoModel, set_seed

    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
    from hf_mlcl.training import ContrastiveTrainer, ProbingTrainer

    from .common import (
        TIMED_RUN,
        StepProbe,
        device,
        peak_memory,
        random_token_rows,
        recipe_stage,
        reset_peak_memory,
        stack_rows,
        summary,
    )

    run_name, dataset = cell.params["run"], cell.params["dataset"]
    num_labels = ICD10_FULL if dataset == "mimic4_icd10_full" else len(mimic3_codes())
    stage = "probe" if run_name == "bce" else "contrastive"
    recipe_path = os.path.join("recipes", dataset, "plm-icd", f"{run_name}.yaml")
    folder = os.path.join(cache_dir, "roberta-tiny" if tiny else "roberta-base-random")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        torch.manual_seed(0)
        shape = dict(ROBERTA_BASE)
        if tiny:
            shape.update(
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                vocab_size=1000,
                max_position_embeddings=130,
            )
        model_type = shape.pop("model_type")
        AutoModel.from_config(AutoConfig.for_model(model_type, **shape)).save_pretrained(folder)
    if tiny:
        num_labels = min(num_labels, 500)
    out_root = tempfile.mkdtemp(prefix=f"{cell.name}-", dir=cache_dir)
    training: dict[str, Any] = {**TIMED_RUN}
    bf16 = device().type == "cuda"
    training["bf16"] = bf16
    warmup, steps = (1, 2) if tiny else (2, 4)
    training["max_steps"] = warmup + steps
    top = {"model_name_or_path": folder}
    if tiny:
        top.update(max_length=256, chunk_size=32)
        training["per_device_train_batch_size"] = 4
    if stage == "contrastive":
        training["knn_k"] = 0
        if tiny:
            training.update(gradcache_chunk_size=2, queue_size=8)
    else:
        training["load_best_model_at_end"] = False
    recipe, (model_args, data_args, targs) = recipe_stage(recipe_path, stage, top, training, out_root)
    seq, chunk, batch = data_args.max_length, model_args.chunk_size, targs.per_device_train_batch_size
    set_seed(0)
    encoder = MLCLEncoder.from_backbone(
        folder,
        pooling=model_args.pooling,
        projection_dim=model_args.projection_dim,
        chunk_size=chunk,
        segmented=True,
    )
    model = encoder
    if run_name == "bce":
        model = MLCLForMultiLabelClassification.from_encoder(
            encoder, num_labels=num_labels, head=model_args.head, freeze_encoder=False, chunk_size=chunk
        )
    model.to(device())
    vocab = 1000 if tiny else ROBERTA_BASE["vocab_size"]
    rows = random_token_rows(batch * (warmup + steps), seq, vocab, num_labels, 0, labels_per_row=16.0)
    probe = StepProbe(count_from=warmup)
    trainer_cls = ProbingTrainer if run_name == "bce" else ContrastiveTrainer
    trainer = trainer_cls(
        model=model,
        args=targs,
        train_dataset=rows,
        data_collator=stack_rows,
        num_labels=num_labels,
        callbacks=[probe],
    )
    reset_peak_memory()
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    times = probe.times[warmup:]
    median = summary(times)["median"]
    from .common import device_info

    info = device_info()
    memory = peak_memory()
    fits = None
    if info["kind"] == "cuda":
        fits = bool(memory["reserved_gib"] < info["memory_gib"])
    return {
        "run": run_name,
        "dataset": dataset,
        "recipe": recipe_path,
        "model": ("tiny RoBERTa" if tiny else "RoBERTa-base architecture") + ", random init",
        "head": model_args.head if run_name == "bce" else "projection (stage 1)",
        "num_labels": num_labels,
        "seq_len": seq,
        "segment_len": chunk,
        "segments": -(-seq // chunk),
        "per_device_batch": batch,
        "gradcache_chunk_size": int(getattr(targs, "gradcache_chunk_size", 0) or 0),
        "queue_size": int(getattr(targs, "queue_size", 0) or 0),
        "activation_checkpointing": bool(targs.activation_checkpointing),
        "bf16": bf16,
        "step_time_s": summary(times),
        "documents_per_s": batch / median,
        "peak_memory": memory,
        "fits": fits,
        "syncs_per_step": probe.syncs,
        "sync_sites": probe.sync_sites[:6],
        "train_s": train_s,
        "checks": {} if fits is None else {"fits": fits},
    }
