"""Two "nodes" on one machine, started the way users start them: one ``accelerate launch`` per node with
``--num_machines 2 --machine_rank i --main_process_ip 127.0.0.1 --main_process_port P`` and the repo's
cpu.yaml (accelerate's torchrun launcher, static rendezvous at the main process's address: torchrun's
``--nnodes 2 --node_rank i --master_addr --master_port``), one process per node, gloo.

Each node runs in its own working folder (the same relative ``--output_dir`` then names a shared folder
or one folder per node) and its own process group, which :func:`launch_two_nodes` kills whole when the
nodes have not both ended by the deadline: a hang fails the test instead of stalling the suite.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ACCELERATE = os.path.join(os.path.dirname(sys.executable), "accelerate")
CPU_CONFIG = os.path.join(ROOT, "recipes", "accelerate", "cpu.yaml")
# files a node creates get 0666 & ~umask: node 1's are group-writable, so the final files tell their writer
NODE_UMASKS = (0o022, 0o002)


def free_port() -> int:
    """A free port below the kernel's ephemeral range. The port is closed again before the launchers bind it,
    and a port the kernel handed out (port 0) could be taken meanwhile by any outgoing connection, e.g. a
    concurrent run's gloo socket; ports outside that range are only ever taken by name."""
    low = (
        int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
        if os.path.exists("/proc/sys/net/ipv4/ip_local_port_range")
        else 32768
    )
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port found below the ephemeral range")


@dataclass
class Node:
    """One node's launch: exit status (None: still running at the deadline, then killed), output, seconds."""

    rank: int
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float


def node_command(rank: int, port: int, cli_args: list[str], launch_flags: tuple[str, ...] = ()) -> list[str]:
    """``accelerate launch`` of ``hf_mlcl.cli`` as machine ``rank`` of two, one process each
    (``launch_flags``: more ``accelerate launch`` options)."""
    return [
        ACCELERATE,
        "launch",
        "--config_file",
        CPU_CONFIG,
        "--num_machines",
        "2",
        "--machine_rank",
        str(rank),
        "--main_process_ip",
        "127.0.0.1",
        "--main_process_port",
        str(port),
        "--num_processes",
        "2",
        *launch_flags,
        "-m",
        "hf_mlcl.cli",
        *cli_args,
    ]


def launch_two_nodes(
    cli_args: list[str], cwds: tuple[str, str], timeout: float, logs: str, launch_flags: tuple[str, ...] = ()
) -> list[Node]:
    """Start both nodes of ``hf-mlcl <cli_args>`` (node i in ``cwds[i]``, umask ``NODE_UMASKS[i]``), wait
    until both have ended or ``timeout`` seconds have passed, kill the process group of any node still
    running, and return both nodes' results (stdout / stderr kept in ``logs``)."""
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    os.makedirs(logs, exist_ok=True)
    procs, files = [], []
    start = time.monotonic()
    for rank, cwd in enumerate(cwds):
        out = open(os.path.join(logs, f"node{rank}.out"), "w+")
        err = open(os.path.join(logs, f"node{rank}.err"), "w+")
        files.append((out, err))
        procs.append(
            subprocess.Popen(
                node_command(rank, port, cli_args, launch_flags),
                cwd=cwd,
                env=env,
                stdout=out,
                stderr=err,
                start_new_session=True,
                umask=NODE_UMASKS[rank],
            )
        )
    ended: list[float | None] = [None, None]
    while None in ended and time.monotonic() - start < timeout:
        for rank, proc in enumerate(procs):
            if ended[rank] is None and proc.poll() is not None:
                ended[rank] = time.monotonic() - start
        time.sleep(0.1)
    for rank, proc in enumerate(procs):
        if ended[rank] is None:  # still running at the deadline: kill the node's whole process group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    nodes = []
    for rank, (proc, (out, err)) in enumerate(zip(procs, files)):
        out.seek(0)
        err.seek(0)
        seconds = ended[rank] if ended[rank] is not None else time.monotonic() - start
        nodes.append(
            Node(rank, proc.returncode if ended[rank] is not None else None, out.read(), err.read(), seconds)
        )
        out.close()
        err.close()
    return nodes


def describe(nodes: list[Node], tail: int = 3000) -> str:
    """Both nodes' status and the end of their stderr, for an assertion message."""
    return "\n".join(
        f"--- node {n.rank}: exit {n.returncode} after {n.seconds:.1f} s\n{n.stderr[-tail:]}" for n in nodes
    )
