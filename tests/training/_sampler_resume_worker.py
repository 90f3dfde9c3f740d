"""Worker of test_training_positive_batches' two-process resume (torchrun, gloo on CPU): a run of the positives
sampler (32 rows, batches of 4 a process: 4 steps an epoch) to step 8 with a checkpoint at step 6, in epoch 1,
then the same run resumed from that checkpoint; each writes the row ids of the batches it read, in order."""

from __future__ import annotations

import json
import os
import sys

from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer

from hf_mlcl.training import ContrastiveTrainer


def run(out: str, resume: str | None, data_seed: int | None = None) -> None:
    tok = tiny_tokenizer()
    rows = tiny_split(32).add_column("row", list(range(32)))
    base = collator(tok)
    batches: list[list[int]] = []  # in the order they were collated (accelerate reads one batch ahead)

    def collate(features):
        batches.append([f["row"] for f in features])
        return base([{k: v for k, v in f.items() if k != "row"} for f in features])

    args = base_args(
        out,
        loss="all",
        batch_sampler="positives",
        max_steps=8,
        save_strategy="steps",
        save_steps=6,
        knn_k=0,
        remove_unused_columns=False,
        ddp_backend="gloo",
        data_seed=data_seed,
    )
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok), args=args, train_dataset=rows, data_collator=collate
    )
    trainer.train(resume_from_checkpoint=resume)
    name = f"rows-{'resumed' if resume else 'full'}-{os.environ['RANK']}.json"
    with open(os.path.join(os.path.dirname(out), name), "w") as fh:
        json.dump(batches, fh)


if __name__ == "__main__":
    root = sys.argv[1]
    run(os.path.join(root, "full"), None)
    run(os.path.join(root, "resumed"), os.path.join(root, "full", "checkpoint-6"))
