"""Damaged checkpoints are named and passed over: each file's size and CRC-32 are recorded when the save completes
and compared before a resume reads it; a missing RNG state is a warning; a full device is one line."""

from __future__ import annotations

import errno
import json
import logging
import os

import pytest
from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer

from hf_mlcl.training import ContrastiveTrainer
from hf_mlcl.training.checkpoints import CheckpointSaveError, checkpoint_folders, resolve_resume
from hf_mlcl.training.checksums import CHECKSUMS_FILE, check_checkpoint

KW = dict(loss="sd", max_steps=4, save_strategy="steps", save_steps=2, knn_k=0)


@pytest.fixture
def run(tmp_path):
    """A stage-1 run with checkpoints at steps 2 and 4."""
    tok = tiny_tokenizer()
    out = tmp_path / "run"
    ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=base_args(out, **KW),
        train_dataset=tiny_split(16),
        data_collator=collator(tok),
    ).train()
    assert [os.path.basename(p) for p in checkpoint_folders(str(out))] == ["checkpoint-2", "checkpoint-4"]
    return out


def _overwrite(path, offset: int = 100) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))  # same size, other bytes


def test_every_file_of_a_checkpoint_is_recorded(run):
    record = json.load(open(run / "checkpoint-4" / CHECKSUMS_FILE))["files"]
    assert {"model.safetensors", "trainer_state.json", "optimizer.pt", "rng_state.pth"} <= set(record)
    assert check_checkpoint(str(run / "checkpoint-4")).damaged == []


@pytest.mark.parametrize(
    "name, damage",
    [
        ("model.safetensors", "overwrite"),  # finite bytes changed: would load silently
        ("optimizer.pt", "truncate"),
        ("trainer_state.json", "truncate"),  # "Expecting value: line 1 column 1" before
    ],
)
def test_a_damaged_newest_checkpoint_is_named_and_the_previous_one_used(run, caplog, name, damage):
    path = run / "checkpoint-4" / name
    if damage == "overwrite":
        _overwrite(path)
    else:
        os.truncate(path, 0)
    with pytest.raises(ValueError, match=f"is damaged: {name}"):
        resolve_resume(str(run / "checkpoint-4"), str(run))
    with caplog.at_level(logging.WARNING, logger="hf_mlcl"):
        chosen = resolve_resume("true", str(run))
    assert chosen == str(run / "checkpoint-2")  # the damaged one goes: the resumed run writes step 4 again
    assert any("checkpoint-4 is damaged" in r.getMessage() and name in r.getMessage() for r in caplog.records)


def test_every_checkpoint_damaged_stops_the_resume(run):
    for step in (2, 4):
        os.truncate(run / f"checkpoint-{step}" / "model.safetensors", 10)
    with pytest.raises(
        ValueError, match="every checkpoint of .* is damaged .*checkpoint-4: model.safetensors"
    ):
        resolve_resume("true", str(run))


def test_a_missing_rng_state_is_a_warning(run, caplog):
    os.remove(run / "checkpoint-4" / "rng_state.pth")
    with caplog.at_level(logging.WARNING, logger="hf_mlcl"):
        assert resolve_resume("true", str(run)) == str(run / "checkpoint-4")
    assert any("lacks rng_state.pth (missing)" in r.getMessage() for r in caplog.records)


def test_a_full_device_while_saving_is_one_line_and_keeps_the_earlier_checkpoint(tmp_path, monkeypatch):
    from transformers import Trainer

    tok = tiny_tokenizer()
    out = tmp_path / "run"
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=base_args(out, **KW),
        train_dataset=tiny_split(16),
        data_collator=collator(tok),
    )
    real = Trainer._save_checkpoint

    def full_at_step_4(self, model, trial):
        if self.state.global_step == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, model, trial)

    monkeypatch.setattr(Trainer, "_save_checkpoint", full_at_step_4)
    import shutil
    from collections import namedtuple

    # the device is full (a write's ENOSPC counts as such only where the folder's device has no room left)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: namedtuple("usage", "total used free")(10, 10, 0))
    with pytest.raises(CheckpointSaveError, match="no space left on the device while writing .*checkpoint-4"):
        trainer.train()
    assert resolve_resume("true", str(out)) == str(out / "checkpoint-2")


def test_a_resume_at_max_steps_inside_an_epoch_takes_the_checkpoint_before_it(tmp_path):
    """Trainer resumed from the checkpoint at max_steps in the middle of an epoch trains a step past it (a
    wrong model with exit 0): the resume takes the checkpoint before and trains the last steps again, to
    the weights of the uninterrupted run."""
    import torch

    tok = tiny_tokenizer()
    out = tmp_path / "run"

    def trainer():
        torch.manual_seed(0)
        return ContrastiveTrainer(
            model=tiny_encoder(tok),
            args=base_args(out, **KW),  # 24 rows, batches of 4: max_steps 4 ends inside the first epoch
            train_dataset=tiny_split(24),
            data_collator=collator(tok),
        )

    full = trainer()
    full.train()
    want = {k: v.clone() for k, v in full.model.state_dict().items()}
    past = trainer()
    past.train(resume_from_checkpoint=str(out / "checkpoint-4"))
    assert past.state.global_step == 5  # what Trainer does with the checkpoint at max_steps
    chosen = resolve_resume(True, str(out), True, max_steps=4)
    assert chosen == str(out / "checkpoint-2")
    assert [os.path.basename(p) for p in checkpoint_folders(str(out))] == ["checkpoint-2"]
    again = trainer()
    again.train(resume_from_checkpoint=chosen)
    assert again.state.global_step == 4
    got = again.model.state_dict()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)
    assert resolve_resume(True, str(out), True) == str(out / "checkpoint-4")  # no max_steps: the newest
