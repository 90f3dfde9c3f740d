"""Two processes (torchrun, gloo on CPU) == one process on the concatenated batch: loss and gradients,
for the in-batch contrast set and every MoCo contrast set (keys / queries+queue / queries+keys) with a
queue that joins at the second step."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from _training_helpers import free_port, max_rel_diff, tiny_encoder, tiny_tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_ddp_worker.py")


@pytest.mark.timeout(240)
def test_two_processes_match_one_process_on_concatenated_batch(tmp_path):
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    tiny_encoder(tok, dropout=0.0).save_pretrained(tmp_path / "init")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([HERE, os.getcwd()])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
           "--master_port", str(free_port()), WORKER, str(tmp_path), "4"]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=220)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # the single-process reference: same init, same 8 rows in one batch
    sys.path.insert(0, HERE)
    from _ddp_worker import configs, run

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
