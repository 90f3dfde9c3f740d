"""Step-time overhead of `ContrastiveTrainer` (sd loss, in-batch) over a plain `Trainer` with BCE.

Steps of the two trainers strictly alternate in one process; the printed ratio is the median of the ratios of
adjacent steps. Target: ratio <= 1.10.

    python benchmarks/trainer_overhead.py [--steps 8 --warmup 2 --device cpu|cuda]

Method: docs/benchmarks.md, "Trainer overhead over a plain Trainer (benchmarks/trainer_overhead.py)"
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the measurements package
from measurements.shapes import MINILM_L6  # noqa: E402  (all-MiniLM-L6-v2's published shape)

BATCH, SEQ, LABELS = 32, 128, 20


def minilm_config() -> BertConfig:
    return BertConfig(**{k: v for k, v in MINILM_L6.items() if k != "model_type"})


def make_data(n: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1000, 30000, (n, SEQ), generator=g)
    ids[:, 0] = 101
    labels = (torch.rand(n, LABELS, generator=g) < 0.15).float()
    labels[torch.arange(n), torch.randint(0, LABELS, (n,), generator=g)] = 1.0  # >= 1 label each
    return [
        {"input_ids": ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": labels[i]}
        for i in range(n)
    ]


def collate(examples: list[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([ex[k] for ex in examples]) for k in ("input_ids", "attention_mask", "labels")}


class Baton:
    """Whose turn it is to run a training step (0 = plain Trainer, 1 = ContrastiveTrainer)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.turn = 0


class PingPongTimer(TrainerCallback):
    """Times each optimizer step and hands the turn to the other trainer after it.

    The two trainers run ``train()`` in two threads, but only the one holding the turn may start a
    step, so steps strictly alternate A, B, A, B ... and never overlap: each B step is timed next to
    an A step under the same machine load (paired comparison on a noisy shared machine).
    """

    def __init__(self, baton: Baton, me: int, device: str) -> None:
        self.baton, self.me, self.device = baton, me, device
        self.times: list[float] = []
        self._t0 = 0.0

    def _sync(self) -> None:
        if self.device == "cuda":
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        with self.baton.cond:
            self.baton.cond.wait_for(lambda: self.baton.turn == self.me)
        self._sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.times.append(time.perf_counter() - self._t0)
        with self.baton.cond:
            self.baton.turn = 1 - self.me
            self.baton.cond.notify_all()


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
    parser.add_argument("--steps", type=int, default=8, help="measured steps per trainer")
    parser.add_argument("--warmup", type=int, default=2, help="steps per trainer dropped first")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    opts = parser.parse_args()
    total = opts.warmup + opts.steps
    data = make_data(BATCH * total)
    tmp = tempfile.mkdtemp(prefix="trainer_overhead_")

    torch.manual_seed(0)
    cls_config = minilm_config()
    cls_config.num_labels = LABELS
    cls_config.problem_type = "multi_label_classification"
    baseline_model = BertForSequenceClassification(cls_config)
    torch.manual_seed(0)
    ours_model = MLCLEncoder.from_backbone(minilm_config(), pooling="cls", projection_dim=256)

    baton = Baton()
    t_base, t_ours = PingPongTimer(baton, 0, opts.device), PingPongTimer(baton, 1, opts.device)
    baseline = Trainer(
        model=baseline_model,
        args=TrainingArguments(**common_args(os.path.join(tmp, "bce"), total, opts.device)),
        train_dataset=data,
        data_collator=collate,
        callbacks=[t_base],
    )
    ours = ContrastiveTrainer(
        model=ours_model,
        args=ContrastiveTrainingArguments(
            **common_args(os.path.join(tmp, "sd"), total, opts.device), loss="sd", knn_k=0
        ),
        train_dataset=data,
        data_collator=collate,
        num_labels=LABELS,
        callbacks=[t_ours],
    )
    errors: list[BaseException] = []

    def run(trainer) -> None:
        try:
            trainer.train()
        except BaseException as err:  # surface thread failures in the main thread
            errors.append(err)
            with baton.cond:
                baton.turn = -1
                baton.cond.notify_all()

    threads = [threading.Thread(target=run, args=(t,)) for t in (baseline, ours)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    base = t_base.times[opts.warmup :]
    mine = t_ours.times[opts.warmup :]
    pair_ratios = [b / a for a, b in zip(base, mine)]
    med_base, med_ours = statistics.median(base), statistics.median(mine)
    print(
        f"device={opts.device} threads={torch.get_num_threads()} batch={BATCH} seq={SEQ} labels={LABELS} "
        f"warmup={opts.warmup} measured steps/side={len(base)} (steps alternate A,B,A,B...)"
    )
    print("plain Trainer (BCE) step ms:      " + " ".join(f"{t * 1e3:.0f}" for t in base))
    print("ContrastiveTrainer (sd) step ms:  " + " ".join(f"{t * 1e3:.0f}" for t in mine))
    print(
        f"median step time: plain Trainer (BCE) {med_base * 1e3:.1f} ms | ContrastiveTrainer (sd) {med_ours * 1e3:.1f} ms"
    )
    print(f"ratio of medians = {med_ours / med_base:.3f}")
    print(
        f"step-time ratio ContrastiveTrainer / Trainer (median of adjacent-step ratios) = "
        f"{statistics.median(pair_ratios):.3f} (target <= 1.10)"
    )


if __name__ == "__main__":
    main()
