"""Complete-or-absent checkpoints cover the contrastive trainer's safetensors state, and resume parsing
goes through one helper (``hf_mlcl.training.checkpoints.parse_resume``)."""

from __future__ import annotations

import os

import pytest
from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer

import hf_mlcl.training.contrastive as contrastive_module
from hf_mlcl.training import ContrastiveTrainer
from hf_mlcl.training.checkpoints import (
    SAVING_MARKER,
    is_complete_checkpoint,
    last_complete_checkpoint,
    parse_resume,
    resolve_resume,
    wants_resume,
)
from hf_mlcl.training.state_file import STATE_FILE

KW = dict(loss="msc", queue_size=8, momentum=0.9, max_steps=4, save_strategy="steps", save_steps=2, knn_k=0)


@pytest.mark.parametrize(
    "value, parsed",
    [
        (None, False),
        (False, False),
        ("false", False),
        (" False ", False),
        ("", False),
        (True, True),
        ("true", True),
        ("TRUE", True),
        ("out/checkpoint-2", "out/checkpoint-2"),
    ],
)
def test_parse_resume_reads_every_spelling_once(value, parsed):
    assert parse_resume(value) == parsed
    assert wants_resume(value) is (parsed is not False)


def test_safetensors_state_is_written_inside_the_marked_window(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    seen = []
    real_save = contrastive_module.save_state_file

    def spy(state, path):
        folder = os.path.dirname(path)
        seen.append(
            (
                os.path.basename(folder),
                os.path.exists(os.path.join(folder, SAVING_MARKER)),
                is_complete_checkpoint(folder),
            )
        )
        real_save(state, path)

    monkeypatch.setattr(contrastive_module, "save_state_file", spy)
    out = tmp_path / "run"
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=base_args(out, **KW),
        train_dataset=tiny_split(16),
        data_collator=collator(tok),
    )
    trainer.train()
    assert seen == [("checkpoint-2", True, False), ("checkpoint-4", True, False)]
    for step in (2, 4):  # after the save: the marker is gone, the state is there
        folder = out / f"checkpoint-{step}"
        assert is_complete_checkpoint(str(folder)) and os.path.isfile(folder / STATE_FILE)


def test_a_save_interrupted_while_writing_the_state_is_never_resumed_from(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    real_save = contrastive_module.save_state_file

    def dies_at_step_4(state, path):
        if "checkpoint-4" in path:
            open(path + ".tmp", "wb").close()  # what safetensors leaves when killed mid-write
            raise KeyboardInterrupt
        real_save(state, path)

    monkeypatch.setattr(contrastive_module, "save_state_file", dies_at_step_4)
    out = tmp_path / "run"
    trainer = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=base_args(out, **KW),
        train_dataset=tiny_split(16),
        data_collator=collator(tok),
    )
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    half = out / "checkpoint-4"
    assert (half / "trainer_state.json").is_file() and (
        half / SAVING_MARKER
    ).is_file()  # looks finished, is not
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-2")
    assert resolve_resume("true", str(out)) == str(out / "checkpoint-2")
    assert not half.exists()  # the half-written checkpoint is cleaned
    with pytest.raises(ValueError, match="does not exist"):
        resolve_resume(str(half), str(out))


def test_a_resume_path_that_is_no_complete_checkpoint_says_why(tmp_path):
    """A missing folder, a save interrupted mid-way (its marker) and a folder that is no checkpoint at all."""
    with pytest.raises(ValueError, match="does not exist"):
        resolve_resume(str(tmp_path / "nowhere"), str(tmp_path))
    half = tmp_path / "checkpoint-4"
    half.mkdir()
    (half / SAVING_MARKER).write_text("")
    with pytest.raises(ValueError, match=r"is interrupted \(it holds"):
        resolve_resume(str(half), str(tmp_path))
    other = tmp_path / "my-model"
    other.mkdir()
    (other / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="is not a Trainer checkpoint .it holds no trainer_state.json"):
        resolve_resume(str(other), str(tmp_path))
