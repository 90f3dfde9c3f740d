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
    args = base_args(
        tmp_path, loss="all", max_steps=2, batch_sampler=sampler, train_sampling_strategy="sequential"
    )
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=args,
        train_dataset=train,
        data_collator=collator(tok),
        processing_class=tok,
        num_labels=4,
    )
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


def test_a_run_resumed_mid_epoch_gets_the_same_batches(tmp_path):
    """32 rows, batches of 8: 4 steps an epoch. A run resumed from checkpoint-3 (mid epoch 0) trains steps 4-6
    (the last two in epoch 1) on the batches of the uninterrupted run: the same losses."""
    tok, train = tiny_tokenizer(), tiny_split(32)
    kw = dict(
        loss="all",
        batch_sampler="positives",
        per_device_train_batch_size=8,
        max_steps=6,
        save_strategy="steps",
        save_steps=3,
        knn_k=0,
    )

    def run(folder, resume=None):
        trainer = ContrastiveTrainer(
            model=tiny_encoder(tok),
            args=base_args(tmp_path / folder, **kw),
            train_dataset=train,
            data_collator=collator(tok),
        )
        trainer.train(resume_from_checkpoint=resume)
        return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}

    full = run("full")
    resumed = run("resumed", resume=str(tmp_path / "full" / "checkpoint-3"))
    assert {4, 5, 6} <= set(resumed)  # (steps 1-3 come back with the checkpoint's trainer state)
    assert len({round(full[s], 6) for s in (4, 5, 6)}) == 3  # the steps see different batches
    for step in (4, 5, 6):
        assert resumed[step] == pytest.approx(full[step], rel=1e-6), step


@pytest.mark.timeout(240)
def test_two_processes_resumed_in_a_later_epoch_get_that_epochs_batches(tmp_path):
    """A run of two processes resumed from step 6 (epoch 1) trains steps 7-8 on the batches the uninterrupted
    run trained there: the sampler's epoch is set under the wrapper that skips the trained batches, which
    accelerate's set_epoch does not reach (the resumed run replayed epoch 0's order)."""
    import json
    import os

    from _training_helpers import run_two_processes

    worker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_sampler_resume_worker.py")
    run_two_processes(worker, str(tmp_path), timeout=220)
    epoch_1 = []
    for rank in (0, 1):
        full = json.loads((tmp_path / f"rows-full-{rank}.json").read_text())
        resumed = json.loads((tmp_path / f"rows-resumed-{rank}.json").read_text())
        assert len(full) == 8 and resumed[-2:] == full[-2:], (rank, resumed, full)
        epoch_1 += [row for batch in full[4:] for row in batch]
    assert sorted(epoch_1) == list(range(32))  # every row once over the two processes


def test_data_seed_orders_the_positives_sampler(tmp_path):
    """Trainer's data_seed sets the data order apart from the model's seed; the sampler took args.seed."""
    trainer = lambda **kw: ContrastiveTrainer(  # noqa: E731
        model=tiny_encoder(tok),
        args=base_args(tmp_path, loss="all", batch_sampler="positives", **kw),
        train_dataset=tiny_split(32),
        data_collator=collator(tok),
    )
    tok = tiny_tokenizer()
    orders = [list(trainer(data_seed=s)._get_train_sampler()) for s in (1, 2, None)]
    assert orders[0] != orders[1] and orders[2] == list(trainer()._get_train_sampler())
    assert list(trainer(seed=5, data_seed=1)._get_train_sampler()) == orders[0]


@pytest.mark.parametrize(
    "loss_kwargs",
    [{"label_similarity_threshold": 0.3}, {"label_similarity": "jaccard", "label_similarity_threshold": 0.0}],
)
def test_positive_batches_are_refused_for_positives_by_weight_above_a_threshold(tmp_path, loss_kwargs):
    """A thresholded similarity makes a pair that shares a label no positive (Jaccard 1/4 <= 0.3): the sampler's
    grouping by a shared label cannot ensure one, so the combination is one line before training."""
    tok, train = tiny_tokenizer(), tiny_split(32)
    args = base_args(tmp_path, loss="sd", max_steps=2, batch_sampler="positives", loss_kwargs=loss_kwargs)
    with pytest.raises(ValueError, match=r"batch_sampler 'positives' .* need not be positives of .* > 0"):
        ContrastiveTrainer(
            model=tiny_encoder(tok), args=args, train_dataset=train, data_collator=collator(tok), num_labels=4
        )
    args = base_args(tmp_path, loss="sd", max_steps=1, batch_sampler="positives")  # shared labels: kept
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok), args=args, train_dataset=train, data_collator=collator(tok), num_labels=4
    )
    assert trainer.loss_fn.sampler_rule == "shared_label" and trainer.train().global_step == 1
