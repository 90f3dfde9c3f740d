"""Resuming reads no pickle: the trainer's extra state is safetensors, loaded without torch.load."""

from __future__ import annotations

import json
import os
import struct

import pytest
import torch
from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer

from hf_mlcl.training import ContrastiveTrainer
from hf_mlcl.training.state_file import STATE_FILE, load_state_file, save_state_file


def test_state_file_round_trips_nested_tensors_and_plain_values(tmp_path):
    state = {
        "loss": {"prototypes": torch.randn(3, 4)},
        "empty": {},
        "queue": {"size": 5, "label_format": "bool", "labels": torch.rand(5, 3) > 0.5, "ptr": 2},
        "momentum_encoder": {"momentum": 0.99, "params": {"backbone.layer.0.weight": torch.randn(2, 2)}},
    }
    path = str(tmp_path / STATE_FILE)
    save_state_file(state, path)
    back = load_state_file(path)
    assert back["empty"] == {} and back["queue"]["size"] == 5 and back["queue"]["label_format"] == "bool"
    assert back["momentum_encoder"]["momentum"] == 0.99 and back["queue"]["ptr"] == 2
    assert torch.equal(back["loss"]["prototypes"], state["loss"]["prototypes"])
    assert back["queue"]["labels"].dtype == torch.bool and torch.equal(
        back["queue"]["labels"], state["queue"]["labels"]
    )
    assert torch.equal(
        back["momentum_encoder"]["params"]["backbone.layer.0.weight"],
        state["momentum_encoder"]["params"]["backbone.layer.0.weight"],
    )
    # a safetensors file: 8-byte little-endian header length, then a JSON header (no pickle opcodes)
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert "prototypes" in str(json.loads(raw[8 : 8 + n]))


def test_state_file_loads_onto_an_indexed_cpu_device(tmp_path):
    """A process of a multi-process CPU launch has ``args.device == cpu:0`` (accelerate's device of a CPU
    process), which safetensors refuses ("device cpu:0 is invalid"): resuming such a run must still read
    the trainer state."""
    path = str(tmp_path / STATE_FILE)
    save_state_file({"loss": {"prototypes": torch.arange(6.0).reshape(2, 3)}}, path)
    for device in (torch.device("cpu", 0), "cpu:0", torch.device("cpu")):
        back = load_state_file(path, device=device)
        assert back["loss"]["prototypes"].device.type == "cpu"
        assert torch.equal(back["loss"]["prototypes"], torch.arange(6.0).reshape(2, 3))


def test_state_file_rejects_objects_and_foreign_files(tmp_path):
    with pytest.raises(ValueError, match="only tensors, dicts and plain values"):
        save_state_file({"loss": {"fn": object()}}, str(tmp_path / "x.safetensors"))
    from safetensors.torch import save_file

    save_file({"a": torch.zeros(1)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not an hf_mlcl trainer state"):
        load_state_file(str(tmp_path / "other.safetensors"))


def test_resume_reads_the_safetensors_state_without_torch_load(tmp_path, monkeypatch):
    tok = tiny_tokenizer()
    ds = tiny_split(16)
    kw = dict(
        loss="msc", queue_size=8, momentum=0.9, max_steps=2, save_strategy="steps", save_steps=2, knn_k=0
    )
    first = ContrastiveTrainer(
        model=tiny_encoder(tok),
        args=base_args(tmp_path / "a", **kw),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    first.train()
    ckpt = tmp_path / "a" / "checkpoint-2"
    assert os.path.isfile(ckpt / STATE_FILE) and not any(
        f.endswith(".pt") and "mlcl" in f for f in os.listdir(ckpt)
    )

    calls = []
    real_load = torch.load

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    resumed = ContrastiveTrainer(
        model=tiny_encoder(tok, seed=3),
        args=base_args(tmp_path / "b", **kw),
        train_dataset=ds,
        data_collator=collator(tok),
    )
    resumed._load_from_checkpoint(str(ckpt))
    assert all(flag is True for flag in calls), (
        calls
    )  # Trainer's own files: weights_only=True; ours: no torch.load
    assert torch.equal(resumed.queue.embeddings.cpu(), first.queue.embeddings.cpu())
    assert torch.equal(resumed.loss_fn.prototypes.detach().cpu(), first.loss_fn.prototypes.detach().cpu())
    assert (
        resumed.momentum_encoder.state_dict()["params"].keys()
        == first.momentum_encoder.state_dict()["params"].keys()
    )
