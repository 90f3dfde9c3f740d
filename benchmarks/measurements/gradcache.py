"""``gradcache``: a 4,096-text contrast set on one device through GradCache, against plain batches.

MiniLM-L6 shape (random init, mean pooling, dropout off so both paths see the same network), 128
tokens, loss ``sd``, bf16 on a GPU. First the largest plain batch that fits is found by trying 4,096,
2,048, 1,024 ... texts per step (``ContrastiveTrainer`` with ``gradcache_chunk_size=0``; an out-of-memory
error halves the batch). Then GradCache (Gao et al., RepL4NLP 2021) trains with the full 4,096 as the
contrast set in chunks of 256. Recorded: peak memory and samples/s of both, and the loss of the first
step of GradCache and of the plain run on the same batch of the largest plain size, from the same
initial weights (they must agree).
"""

from __future__ import annotations

import gc
import os
import statistics
import tempfile
from typing import Any

from .common import BERT_TINY, MINILM_L6, Cell

DESCRIPTION = (
    "MiniLM-L6 stage 1 with a 4,096 contrast set through GradCache (chunks of 256) vs the largest plain batch "
    "that fits: peak memory, samples/s, same loss"
)
CONTRAST, CHUNK = 4096, 256
NUM_LABELS = 20


def cells(tiny: bool) -> list[Cell]:
    return [Cell("minilm-4096", timeout=900)]


def run(cell: Cell, tiny: bool, cache_dir: str) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig, AutoModel, set_seed

    from hf_mlcl.modeling import MLCLEncoder
    from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments

    from .common import StepProbe, device, peak_memory, random_token_rows, reset_peak_memory, stack_rows

    contrast, chunk, seq = (64, 16, 16) if tiny else (CONTRAST, CHUNK, 128)
    shape = dict(BERT_TINY if tiny else MINILM_L6)
    folder = os.path.join(cache_dir, "gradcache-minilm" + ("-tiny" if tiny else ""))
    if not os.path.isfile(os.path.join(folder, "config.json")):
        torch.manual_seed(0)
        model_type = shape.pop("model_type")
        shape.update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
        AutoModel.from_config(AutoConfig.for_model(model_type, **shape)).save_pretrained(folder)
    bf16 = device().type == "cuda"
    warmup, steps = (1, 2) if tiny else (2, 4)
    rows = random_token_rows(contrast * (warmup + steps), seq, 1000 if tiny else 30522, NUM_LABELS, 101)

    def train(batch: int, gradcache: int, max_steps: int) -> dict[str, Any]:
        set_seed(0)
        encoder = MLCLEncoder.from_backbone(folder, pooling="mean", projection_dim=256)
        probe = StepProbe()
        args = ContrastiveTrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="gradcache-", dir=cache_dir),
            loss="sd",
            knn_k=0,
            per_device_train_batch_size=batch,
            gradcache_chunk_size=gradcache,
            max_steps=max_steps,
            bf16=bf16,
            learning_rate=2e-5,
            logging_strategy="no",
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            dataloader_num_workers=0,
            seed=0,
            train_sampling_strategy="sequential",
        )
        trainer = ContrastiveTrainer(
            model=encoder,
            args=args,
            train_dataset=rows,
            data_collator=stack_rows,
            num_labels=NUM_LABELS,
            callbacks=[probe],
        )
        reset_peak_memory()
        out = trainer.train()
        result = {
            "batch": batch,
            "gradcache_chunk_size": gradcache,
            "steps": max_steps,
            "first_step_loss": None,
            "mean_loss": out.training_loss,
            "peak_memory": peak_memory(),
            "step_times_s": probe.times,
        }
        timed = probe.times[warmup:]
        if timed:
            result["samples_per_s"] = batch / statistics.median(timed)
        del trainer, encoder
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return result

    largest, tried = None, []
    batch = contrast
    while batch >= 8:
        try:
            largest = train(batch, 0, warmup + steps)
            break
        except torch.OutOfMemoryError:
            tried.append(batch)
            gc.collect()
            torch.cuda.empty_cache()
            batch //= 2
    if largest is None:
        raise RuntimeError(f"no plain batch of {contrast} down to 8 texts fits")
    cached = train(contrast, chunk, warmup + steps)
    # the same first batch (the largest plain size) through both paths, one step each
    plain_one = train(largest["batch"], 0, 1)["mean_loss"]
    cached_one = train(largest["batch"], min(chunk, largest["batch"] // 2), 1)["mean_loss"]
    same = abs(plain_one - cached_one) <= 1e-3 * max(1.0, abs(plain_one))
    return {
        "encoder": "MiniLM-L6 shape, random init, dropout off" + (" (tiny)" if tiny else ""),
        "seq_len": seq,
        "bf16": bf16,
        "contrast_set": contrast,
        "chunk": chunk,
        "plain_batches_out_of_memory": tried,
        "largest_plain": largest,
        "gradcache": cached,
        "memory_ratio": (cached["peak_memory"].get("allocated_gib") or cached["peak_memory"].get("rss_gib"))
        / (largest["peak_memory"].get("allocated_gib") or largest["peak_memory"].get("rss_gib")),
        "speed_ratio": cached["samples_per_s"] / largest["samples_per_s"],
        "same_loss": {"plain": plain_one, "gradcache": cached_one, "batch": largest["batch"], "same": same},
        "checks": {"same_loss": same},
    }
