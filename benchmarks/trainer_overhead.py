"""Step-time overhead of `ContrastiveTrainer` (sd loss, in-batch) over a plain `Trainer` with BCE.

Both train the same MiniLM-sized encoder (random-init BertConfig: 6 layers, hidden 384, 12 heads,
intermediate 1536) on the same pre-tokenised batches (32 x 128 tokens, 20 labels) with the same
collate function, optimizer and settings:

* baseline: ``transformers.Trainer`` + ``BertForSequenceClassification(problem_type=
  "multi_label_classification")`` (BCE inside the model);
* ours: ``ContrastiveTrainer`` + ``MLCLEncoder`` (CLS pooling, projection head 384 -> 384 -> 256),
  ``loss="sd"``, in-batch candidates.

Step time = wall time from ``on_step_begin`` to ``on_step_end`` (forward, loss, backward, optimizer
step; batch prefetch excluded for both). The two trainers are interleaved in rounds (A, B, A, B ...),
each round dropping its first ``--warmup`` steps, and the ratio of the medians over all kept steps is
printed, so slow phases of a shared machine hit both sides. Target: ratio <= 1.10.

    python benchmarks/trainer_overhead.py [--rounds 3 --steps 3 --warmup 1 --device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hf_mlcl.modeling import MLCLEncoder  # noqa: E402
from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments  # noqa: E402

BATCH, SEQ, LABELS = 32, 128, 20


def minilm_config() -> BertConfig:
    return BertConfig(
        vocab_size=30522,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=12,
        intermediate_size=1536,
        max_position_embeddings=512,
    )


def make_data(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (n, SEQ), generator=g)
    ids[:, 0] = 101
    labels = (torch.rand(n, LABELS, generator=g) < 0.15).float()
    labels[torch.arange(n), torch.randint(0, LABELS, (n,), generator=g)] = 1.0  # >= 1 label each
    return [{"input_ids": ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": labels[i]} for i in range(n)]


def collate(examples: list[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([ex[k] for ex in examples]) for k in ("input_ids", "attention_mask", "labels")}


class StepTimer(TrainerCallback):
    def __init__(self, device: str) -> None:
        self.device = device
        self.times: list[float] = []
        self._t0 = 0.0

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.times.append(time.perf_counter() - self._t0)


def common_args(out: str, steps: int, device: str) -> dict:
    return dict(
        output_dir=out,
        per_device_train_batch_size=BATCH,
        max_steps=steps,
        learning_rate=2e-5,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=device == "cpu",
        dataloader_num_workers=0,
        train_sampling_strategy="sequential",
        bf16=device == "cuda",
        seed=0,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3, help="measured steps per round")
    parser.add_argument("--warmup", type=int, default=1, help="steps dropped at the start of every round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    opts = parser.parse_args()
    per_round = opts.warmup + opts.steps
    data = make_data(BATCH * per_round)
    tmp = tempfile.mkdtemp(prefix="trainer_overhead_")

    torch.manual_seed(0)
    cls_config = minilm_config()
    cls_config.num_labels = LABELS
    cls_config.problem_type = "multi_label_classification"
    baseline_model = BertForSequenceClassification(cls_config)
    torch.manual_seed(0)
    ours_model = MLCLEncoder.from_backbone(minilm_config(), pooling="cls", projection_dim=256)

    t_base, t_ours = StepTimer(opts.device), StepTimer(opts.device)
    baseline = Trainer(
        model=baseline_model,
        args=TrainingArguments(**common_args(os.path.join(tmp, "bce"), per_round, opts.device)),
        train_dataset=data,
        data_collator=collate,
        callbacks=[t_base],
    )
    ours = ContrastiveTrainer(
        model=ours_model,
        args=ContrastiveTrainingArguments(
            **common_args(os.path.join(tmp, "sd"), per_round, opts.device), loss="sd", knn_k=0
        ),
        train_dataset=data,
        data_collator=collate,
        num_labels=LABELS,
        callbacks=[t_ours],
    )
    kept_base: list[float] = []
    kept_ours: list[float] = []
    for r in range(opts.rounds):
        for trainer, timer, kept in ((baseline, t_base, kept_base), (ours, t_ours, kept_ours)):
            timer.times = []
            trainer.train()
            kept += timer.times[opts.warmup :]
        print(
            f"round {r + 1}: median step plain Trainer+BCE {statistics.median(t_base.times[opts.warmup:]) * 1e3:.1f} ms, "
            f"ContrastiveTrainer+sd {statistics.median(t_ours.times[opts.warmup:]) * 1e3:.1f} ms"
        )
    med_base, med_ours = statistics.median(kept_base), statistics.median(kept_ours)
    print(
        f"device={opts.device} threads={torch.get_num_threads()} batch={BATCH} seq={SEQ} labels={LABELS} "
        f"rounds={opts.rounds} warmup/round={opts.warmup} measured steps/side={len(kept_base)}"
    )
    print(f"median step time: plain Trainer (BCE) {med_base * 1e3:.1f} ms | ContrastiveTrainer (sd) {med_ours * 1e3:.1f} ms")
    print(f"step-time ratio ContrastiveTrainer / Trainer = {med_ours / med_base:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
