"""ContrastiveTrainer with batch_sampler="positives": its training batches give every anchor a positive
under the loss's rule (``all``: the same label set), where Trainer's order gives none; the run trains and
the argument's bad values are one line."""

from __future__ import annotations

import pytest
import torch
from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer

from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments


def _anchors_without_positive(batches) -> int:
    wasted = 0
    for batch in batches:
        y = batch["labels"]
        for i in range(len(y)):
            wasted += not any(torch.equal(y[i], y[j]) for j in range(len(y)) if j != i)
    return wasted


@pytest.mark.parametrize("sampler", ["random", "positives"])
def test_training_batches_of_the_positives_sampler_give_every_anchor_a_positive(tmp_path, sampler):
    tok, train = tiny_tokenizer(), tiny_split(32)  # 8 label sets, 4 rows each
    args = base_args(tmp_path, loss="all", max_steps=2, batch_sampler=sampler, train_sampling_strategy="sequential")
    trainer = ContrastiveTrainer(model=tiny_encoder(tok), args=args, train_dataset=train, data_collator=collator(tok),
                                 processing_class=tok, num_labels=4)  # fmt: skip
    wasted = _anchors_without_positive(trainer.get_train_dataloader())
    if sampler == "random":  # sequential: 4 consecutive rows of 4 different label sets
        assert wasted == 32
        return
    assert wasted == 0
    out = trainer.train()
    assert out.global_step == 2 and torch.isfinite(torch.tensor(out.training_loss))


def test_a_bad_batch_sampler_is_one_line(tmp_path):
    with pytest.raises(ValueError, match=r"batch_sampler must be one of \('random', 'positives'\)"):
        ContrastiveTrainingArguments(output_dir=str(tmp_path), batch_sampler="positive")
