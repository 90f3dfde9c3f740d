"""Worker of test_training_tokenizer_once.py, launched by `torchrun --nproc_per_node 2` (gloo, CPU).

Builds the encoder of a ``backbone_config`` (no tokenizer given: one is trained on the fly) the way both
stages do, counting the calls of ``train_tokenizer`` in this process, and writes ``<root>/rank<r>.json``
with the count, the vocabulary and the ids of a text.
"""

from __future__ import annotations

import json
import os
import sys

import torch.distributed as dist

import hf_mlcl.data as data
from hf_mlcl.modeling.builders import build_tokenizer_and_encoder
from hf_mlcl.training import distributed as D
from hf_mlcl.training.arguments import ModelArguments

TEXTS = [
    f"patient {w} reports {v} pain in the {w}{v} region number {i}"
    for i, (w, v) in enumerate(
        zip(
            ["chest", "lower", "upper", "left", "right", "acute"] * 40,
            ["mild", "severe", "chronic", "sharp"] * 60,
        )
    )
]


def main(root: str) -> None:
    dist.init_process_group("gloo")
    calls = []
    train = data.train_tokenizer

    def counting(*args, **kwargs):
        calls.append(1)
        return train(*args, **kwargs)

    data.train_tokenizer = counting  # what build_tokenizer_and_encoder imports when it trains one
    config = {
        "model_type": "llama",
        "vocab_size": 150,
        "hidden_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "intermediate_size": 32,
    }
    tokenizer, encoder = build_tokenizer_and_encoder(
        ModelArguments(backbone_config=config, pooling="last_token"), TEXTS, 8
    )
    out = {
        "calls": len(calls),
        "vocab": sorted(tokenizer.get_vocab().items()),
        "ids": tokenizer("patient chest mild pain")["input_ids"],
        "vocab_size": encoder.config.backbone_config["vocab_size"],
    }
    with open(os.path.join(root, f"rank{dist.get_rank()}.json"), "w", encoding="utf-8") as fh:
        json.dump(out, fh)
    D.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
