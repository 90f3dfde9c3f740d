"""Multi-process launches in tests (``accelerate launch``, ``torchrun``) that never leave processes behind.

``subprocess.run(..., timeout=...)`` kills only the launcher when the time is up, and a pytest-timeout
interruption kills nothing; torchrun starts every worker in a session of its own, so the workers then live
on (a gloo worker blocked in a collective waits forever, holding the machine's cores for the tests after
it). :func:`run_launch` ends a launch that ran out of time or was interrupted with SIGTERM to the launcher,
which torchrun passes on to its workers, and SIGKILL if it is still there a minute later.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Mapping, Sequence


def stop_launch(proc: subprocess.Popen, grace_s: float = 60.0) -> None:
    """SIGTERM to the launcher (torchrun stops its workers), then SIGKILL after ``grace_s``."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.communicate(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()


def run_launch(
    cmd: Sequence[str], *, env: Mapping[str, str] | None = None, cwd: str | None = None, timeout: float
) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)`` for a launcher of several
    processes: on a timeout (``subprocess.TimeoutExpired``, raised again) or an interruption the launch is
    stopped with :func:`stop_launch` first."""
    proc = subprocess.Popen(
        list(cmd),
        env=None if env is None else dict(env),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException:  # TimeoutExpired, pytest-timeout's interruption, KeyboardInterrupt
        stop_launch(proc)
        raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)
