"""One failing process stops every process of a launch (hf_mlcl.training.launch): the failure goes
into the launch's torchrun store; a peer blocked where it cannot raise is ended by its watcher, naming the
failed process; the first failure is the one reported; outside torchrun nothing happens."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from torch.distributed import TCPStore

from hf_mlcl.training import launch
from hf_mlcl.training.launch import PEER_FAILURE_EXIT, LaunchFailures

# a process blocked where it cannot raise (init_process_group waiting for a peer, a collective): only the
# watcher thread can end it. The module is loaded from its file: it needs torch and transformers, not the rest of hf_mlcl.
BLOCKED = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("launch", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.LaunchFailures("hf-mlcl run", poll_seconds=0.1, grace_seconds=0.2).start()
print("watching", flush=True)
time.sleep(120)
"""


def _launch_env(port: int, rank: int) -> dict[str, str]:
    """What torchrun gives process ``rank`` of two nodes of one process each."""
    return {
        "WORLD_SIZE": "2",
        "RANK": str(rank),
        "LOCAL_RANK": "0",
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TORCHELASTIC_USE_AGENT_STORE": "True",
        "TORCHELASTIC_RESTART_COUNT": "0",
    }


@pytest.fixture
def launch_store():
    """The store torchrun's main agent would host for the launch."""
    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_outside_a_torchrun_launch_nothing_happens(monkeypatch):
    for name in ("WORLD_SIZE", "TORCHELASTIC_USE_AGENT_STORE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    failures = LaunchFailures("hf-mlcl run").start()
    assert not failures.enabled and failures._thread is None
    failures.announce("data file 'data.csv' does not exist")
    assert failures.peer_failure() is None


def test_the_first_failure_of_the_launch_is_the_one_reported(monkeypatch, launch_store):
    monkeypatch.setattr(os, "environ", {**os.environ, **_launch_env(launch_store.port, 1)})
    LaunchFailures("hf-mlcl run").announce("data file 'data.csv' does not exist")
    monkeypatch.setattr(os, "environ", {**os.environ, **_launch_env(launch_store.port, 0)})
    main = LaunchFailures("hf-mlcl run")
    assert main.peer_failure() == "process 1 (machine_rank 1) failed: data file 'data.csv' does not exist"
    main.announce("Connection closed by peer")  # a consequence, later: does not replace the cause
    assert main.peer_failure() == "process 1 (machine_rank 1) failed: data file 'data.csv' does not exist"


@pytest.mark.timeout(120)
def test_a_peer_failure_ends_a_blocked_process_naming_the_failed_one(monkeypatch, launch_store):
    env = {**os.environ, **_launch_env(launch_store.port, 0)}
    blocked = subprocess.Popen(
        [sys.executable, "-c", BLOCKED, launch.__file__],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert blocked.stdout.readline().strip() == "watching"
        monkeypatch.setattr(os, "environ", {**os.environ, **_launch_env(launch_store.port, 1)})
        start = time.monotonic()
        LaunchFailures("hf-mlcl run").announce("recipe file not found: recipe.yaml")
        assert blocked.wait(timeout=60) == PEER_FAILURE_EXIT
        assert time.monotonic() - start < 30
        assert (
            "hf-mlcl run: error: process 1 (machine_rank 1) failed: recipe file not found: recipe.yaml"
            in blocked.stderr.read()
        )
    finally:
        if blocked.poll() is None:
            blocked.kill()
            blocked.wait()
