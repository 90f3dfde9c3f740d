"""Two processes (torchrun, gloo on CPU) == one process on the concatenated batch: loss and gradients,
for the in-batch contrast set and every MoCo contrast set (keys / queries+queue / queries+keys) with a
queue that joins at the second step, and for the joint objective (each part of its loss)."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from _training_helpers import LABELS, max_rel_diff, run_two_processes, tiny_encoder, tiny_tokenizer

from hf_mlcl.modeling import MLCLForMultiLabelClassification

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_ddp_worker.py")


@pytest.mark.timeout(240)
def test_two_processes_match_one_process_on_concatenated_batch(tmp_path):
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    tiny_encoder(tok, dropout=0.0).save_pretrained(tmp_path / "init")
    torch.manual_seed(1)
    encoder = tiny_encoder(tok, dropout=0.0, pooling="mean")  # rows apart: a contrastive term far from flat
    joint = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=LABELS, freeze_encoder=False)
    joint.save_pretrained(tmp_path / "joint-init")
    run_two_processes(WORKER, str(tmp_path), "4", timeout=220)
    # the single-process reference: same init, same 8 rows in one batch
    sys.path.insert(0, HERE)
    from _ddp_worker import configs, joint_configs, run, run_joint

    # logged loss parts: the mean over the processes, a part one process lacks counted as 0 there
    for rank in (0, 1):
        assert torch.load(tmp_path / f"window-{rank}.pt") == {"loss_only_0": 2.0, "loss_shared": 1.5}

    for name, kw in joint_configs().items():  # the joint objective: both parts gathered or averaged right
        two = torch.load(tmp_path / f"{name}-2.pt", weights_only=False)
        one = run_joint(str(tmp_path), name, kw, per_device=8)
        assert (two["world"], one["world"]) == (2, 1)
        for part, value in one["loss"].items():
            assert two["loss"][part] == pytest.approx(value, rel=1e-6), (name, part)
        assert max_rel_diff(two["grads"], one["grads"]) < 1e-6, name
        assert any(k.startswith("projection.") for k in one["grads"]) == ("projection" in name)

    # a loss's parameters and the key encoder that start apart on the ranks train as rank 0's, as the model does
    zero, one_rank = torch.load(tmp_path / "rank-start.pt", weights_only=False)
    assert len(zero) == len(one_rank) > 2  # the prototypes and the key encoder's averaged parameters
    assert all(torch.equal(a, b) for a, b in zip(zero, one_rank))

    for name, kw in configs().items():
        two = torch.load(tmp_path / f"{name}-2.pt", weights_only=False)
        assert two["world"] == 2
        one = run(str(tmp_path), name, kw, per_device=8)
        assert one["world"] == 1
        assert two["loss"] == pytest.approx(one["loss"], rel=1e-6), name
        assert max_rel_diff(two["grads"], one["grads"]) < 1e-6, name
        if one["queue"] is not None:  # every rank's queue holds the keys of both processes, in rank order
            assert two["queue"].shape[0] == one["queue"].shape[0] == 8
            assert torch.allclose(two["queue"], one["queue"], rtol=1e-6, atol=1e-9), name
