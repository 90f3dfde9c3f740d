"""tests/_launches.py: a launch stopped after its time leaves no worker behind (torchrun starts each worker in a
session of its own, so killing the launcher alone would orphan them), and run_launch stops a launch that runs
out of time."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from _launches import run_launch, stop_launch

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


def _wait(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.1)
    return condition()


@pytest.mark.timeout(120)
def test_a_stopped_torchrun_launch_leaves_no_worker_behind(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(worker),
        str(tmp_path),
    ]
    proc = subprocess.Popen(
        cmd,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    files = [tmp_path / f"worker{r}.pid" for r in (0, 1)]
    try:
        assert _wait(lambda: all(f.is_file() and f.read_text() for f in files), 60), (
            "the workers did not start"
        )
        pids = [int(f.read_text()) for f in files]
        stop_launch(proc)
        assert _wait(lambda: not any(_alive(p) for p in pids), 30)
    finally:
        if proc.poll() is None:
            proc.kill()


def test_run_launch_stops_a_launch_past_its_time():
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_launch([sys.executable, "-c", "import time; time.sleep(600)"], timeout=1)
    assert time.monotonic() - start < 30  # stopped (SIGTERM), not waited for
