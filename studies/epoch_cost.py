"""Projected wall time per epoch of the full-data studies on this machine, from a few timed batches.

    nice -n 19 .venv/bin/python studies/epoch_cost.py     # OMP_NUM_THREADS=2

For Reuters R90 (128 and 256 tokens) and GoEmotions (64 tokens): the median time of one training step
of all-MiniLM-L6-v2 (batch 32, forward + backward of the mean-pooled output + AdamW step) and of one
no-grad forward batch of 128 (the cost of a frozen-encoder pass: logistic features, linear-probe epochs,
evaluation), times the number of batches of the training split. The study's cells record the real
per-epoch times in their timeline.jsonl; this script gives the cost of cells before they run. On
shared cores the result depends on the load at the time: the script prints the load average.
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np
import torch


def main() -> None:
    from transformers import AutoModel, AutoTokenizer

    from hf_mlcl.data import load_mlc_dataset

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
    from minilm import find_minilm

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    path = find_minilm()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path)
    reuters = load_mlc_dataset("reuters21578", data_dir="../shared/data/reuters21578")["train"]["text"]
    goemotions = load_mlc_dataset("goemotions", data_dir="../shared/data/goemotions", splits="train")[
        "train"
    ]["text"]
    lens = [len(x) for x in tok(list(reuters[:2000]))["input_ids"]]
    print("reuters tokens, percentiles 25/50/75/90:", np.percentile(lens, [25, 50, 75, 90]))
    lens = [len(x) for x in tok(list(goemotions[:5000]))["input_ids"]]
    print("goemotions tokens, percentiles 50/90/99:", np.percentile(lens, [50, 90, 99]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def bench(texts, max_length: int, bs: int = 32, n: int = 4, train: bool = True) -> float:
        times = []
        for i in range(n):
            batch = tok(
                list(texts[i * bs : (i + 1) * bs]),
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            )
            t = time.time()
            if train:
                model(**batch).last_hidden_state.mean(1).sum().backward()
                opt.step()
                opt.zero_grad()
            else:
                with torch.no_grad():
                    model(**batch)
            times.append(time.time() - t)
        return float(np.median(times[1:]))  # the first batch warms up

    for name, texts, max_length, n_train in (
        ("reuters21578", reuters, 128, 6993),
        ("reuters21578", reuters, 256, 6993),
        ("goemotions_full", goemotions, 64, 43410),
    ):
        tr = bench(texts, max_length)
        ev = bench(texts, max_length, bs=128, n=3, train=False)
        print(
            f"{name} max_length {max_length}: train {tr:.2f} s / batch of 32 -> {tr * n_train / 32 / 60:.1f} min "
            f"per epoch; frozen forward {ev:.2f} s / batch of 128 -> {ev * n_train / 128 / 60:.1f} min per pass "
            f"over train; load average {os.getloadavg()[0]:.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
