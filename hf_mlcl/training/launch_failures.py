"""One process of a multi-process launch fails: every process of the launch stops, and says why.

Under ``accelerate launch`` (torchrun) the processes of a run learn of a peer's end only through the
process group. A peer that fails before the group is formed (a recipe or data file missing on one node)
leaves the others waiting in ``init_process_group`` until its timeout (30 minutes); one that fails later
shows on the others as a gloo "Connection closed by peer" traceback that does not say what went wrong.

:class:`LaunchFailures` uses the store that torchrun's agents already run for the launch (``MASTER_ADDR``
: ``MASTER_PORT`` with ``TORCHELASTIC_USE_AGENT_STORE``; it lives as long as the main node's launcher,
before, during and after the process group): a failing process writes its one-line error under a key of
this launch (:meth:`LaunchFailures.announce`, the first failure is kept); a watcher thread in every
process polls that key and, once a peer has set it, prints the error naming the failed process (once per
node) and ends its own process at once (``os._exit``: a process blocked inside a collective or in
``init_process_group`` cannot raise), so every node's launcher sees its workers end and exits. A process
that fails by itself meanwhile (the gloo error of the peer's lost connection) reports the peer's error
instead of its own consequence (:meth:`LaunchFailures.peer_failure`). Outside a torchrun launch of several
processes every method does nothing.
"""

from __future__ import annotations

import os
import sys
import threading
from datetime import timedelta
from typing import Any

__all__ = ["LaunchFailures", "PEER_FAILURE_EXIT"]

PEER_FAILURE_EXIT = 2  # the exit status of a process stopped because a peer failed (hf-mlcl's error status)
_KEY = "hf_mlcl/failed"


class LaunchFailures:
    """See the module docstring. ``prog`` prefixes the printed error (``"hf-mlcl run"``);
    ``poll_seconds``: how often the watcher reads the store; ``grace_seconds``: how long it lets this
    process end by itself (its own error path) before ending it."""

    def __init__(self, prog: str, poll_seconds: float = 0.5, grace_seconds: float = 2.0) -> None:
        env = os.environ
        self.prog = prog
        self.poll_seconds, self.grace_seconds = poll_seconds, grace_seconds
        self.rank, self.local_rank = int(env.get("RANK", "0")), int(env.get("LOCAL_RANK", "0"))
        self.machine = env.get("GROUP_RANK")  # torchrun's node rank (accelerate's --machine_rank)
        self._address = (env.get("MASTER_ADDR"), int(env.get("MASTER_PORT", "0") or 0))
        self.enabled = (
            int(env.get("WORLD_SIZE", "1") or 1) > 1
            and env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
            and bool(self._address[0])
            and self._address[1] > 0
        )
        # one key per (re)start of the workers: a restarted launch does not see the last attempt's failure
        self._key = f"{_KEY}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _store(self, timeout_seconds: float) -> Any:
        from torch.distributed import TCPStore

        host, port = self._address
        return TCPStore(host, port, is_master=False, timeout=timedelta(seconds=timeout_seconds))

    def start(self) -> LaunchFailures:
        """Start watching for a peer's failure (a daemon thread); returns self."""
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="hf_mlcl-launch-failures", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching: this process ends by itself (success, or its own error)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.poll_seconds + 5)

    def _watch(self) -> None:
        try:
            store = self._store(60)
        except Exception:  # no store to watch: the launch goes on as torchrun alone runs it
            return
        while not self._stop.wait(self.poll_seconds):
            try:
                if not store.check([self._key]):
                    continue
                message = store.get(self._key).decode()
            except Exception:  # the store is gone: the main node's launcher has ended
                return
            if self._stop.wait(self.grace_seconds):
                return  # this process reached its own end meanwhile
            if self.local_rank == 0:
                print(f"{self.prog}: error: {message}", file=sys.stderr, flush=True)
            os._exit(PEER_FAILURE_EXIT)

    def announce(self, error: str) -> None:
        """Tell every process of the launch that this one fails with ``error`` (one line), and stop watching.
        The first failure of the launch is kept."""
        self.stop()
        if not self.enabled:
            return
        where = f"process {self.rank}" + (f" (machine_rank {self.machine})" if self.machine is not None else "")
        try:
            self._store(10).compare_set(self._key, "", f"{where} failed: {error}")
        except Exception:  # the store is gone: nobody is left to tell
            pass

    def peer_failure(self) -> str | None:
        """The failure a peer announced, or None (none yet, or not in a torchrun launch)."""
        if not self.enabled:
            return None
        try:
            store = self._store(10)
            return store.get(self._key).decode() if store.check([self._key]) else None
        except Exception:
            return None
