"""A resumed run restores EarlyStoppingCallback's patience counter (``restore_callback_states_from_checkpoint``,
True in hf_mlcl's arguments, False in transformers'), so it stops at the same step as the uninterrupted run."""

from __future__ import annotations

import shutil

import pytest
from _training_helpers import collator, probe_args, tiny_encoder, tiny_split, tiny_tokenizer
from transformers import EarlyStoppingCallback

from hf_mlcl.modeling import MLCLForMultiLabelClassification
from hf_mlcl.training import ContrastiveTrainingArguments, ProbingTrainer, ProbingTrainingArguments

STEPS_PER_EPOCH = 6  # 24 rows, batch 4


def _run(out, tok, resume=None, **kw) -> ProbingTrainer:
    enc = tiny_encoder(tok, seed=0)
    clf = MLCLForMultiLabelClassification.from_encoder(enc, num_labels=4, freeze_encoder=True)
    # learning rate 0: the head never changes, so eval_loss never improves after the first evaluation and
    # early stopping (patience 2) ends the run at a step known in advance
    args = probe_args(
        out,
        probe="linear",
        cache_features=True,
        per_device_train_batch_size=4,
        learning_rate=0.0,
        max_steps=-1,
        num_train_epochs=10,
        eval_strategy="epoch",
        save_strategy="epoch",
        load_best_model_at_end=True,
        metric_for_best_model="eval_loss",
        **kw,
    )
    tr = ProbingTrainer(
        model=clf,
        args=args,
        train_dataset=tiny_split(24),
        eval_dataset=tiny_split(16, 1),
        data_collator=collator(tok),
        callbacks=[EarlyStoppingCallback(early_stopping_patience=2)],
    )
    tr.train(resume_from_checkpoint=resume)
    return tr


def _counter(tr) -> int:
    cb = next(c for c in tr.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback))
    return cb.early_stopping_patience_counter


@pytest.mark.parametrize("cls", [ProbingTrainingArguments, ContrastiveTrainingArguments])
def test_callback_states_are_restored_by_default(cls, tmp_path):
    assert (
        cls(output_dir=str(tmp_path), use_cpu=True, report_to=[]).restore_callback_states_from_checkpoint
        is True
    )


def test_a_resumed_run_stops_where_the_uninterrupted_one_does(tmp_path):
    tok = tiny_tokenizer()
    full = _run(tmp_path / "full", tok)
    stop = full.state.global_step
    assert stop < 10 * STEPS_PER_EPOCH and _counter(full) == 2  # stopped early by the counter
    # a run killed after epoch 2 (counter 1 in its checkpoint) and resumed from there
    killed = tmp_path / "killed"
    killed.mkdir()
    shutil.copytree(
        tmp_path / "full" / f"checkpoint-{2 * STEPS_PER_EPOCH}", killed / f"checkpoint-{2 * STEPS_PER_EPOCH}"
    )
    resumed = _run(killed, tok, resume=True)
    assert resumed.state.global_step == stop
    # transformers' default forgets the counter and trains past the stop (what this test guards against)
    forgetful = tmp_path / "forgetful"
    shutil.copytree(
        killed / f"checkpoint-{2 * STEPS_PER_EPOCH}", forgetful / f"checkpoint-{2 * STEPS_PER_EPOCH}"
    )
    later = _run(forgetful, tok, resume=True, restore_callback_states_from_checkpoint=False)
    assert later.state.global_step > stop
