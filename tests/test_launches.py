"""tests/_launches.py: a launch that runs out of time leaves no worker behind (torchrun starts each worker in a
session of its own, so killing the launcher alone would orphan them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _launches import run_launch

WORKER = """
import os, sys, time
open(os.path.join(sys.argv[1], f"worker{os.environ['RANK']}.pid"), "w").write(str(os.getpid()))
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie waits for its parent only
        return fh.read().split()[2] != "Z"


@pytest.mark.timeout(120)
def test_a_launch_past_its_time_leaves_no_worker_behind(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(worker),
           str(tmp_path)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with pytest.raises(subprocess.TimeoutExpired):
        run_launch(cmd, env=env, timeout=20)
    pids = [int((tmp_path / f"worker{r}.pid").read_text()) for r in (0, 1)]
    deadline = time.monotonic() + 30
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in pids)
