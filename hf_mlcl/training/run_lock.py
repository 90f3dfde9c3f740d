"""One run per output folder: an advisory lock the process that writes a stage's folder holds while the stage
runs, so a second run, demo or resume into the same folder stops in one line naming the running one.

The lock is ``fcntl.flock`` on a hidden file beside the folder (``.<folder>.hf_mlcl.lock``, so taking it creates
nothing inside a folder that does not exist yet): the kernel releases it when its process ends, even by
``kill -9``, so a killed run's lock is taken over by the next run without any staleness rule.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

__all__ = ["LOCK_SUFFIX", "RunLock"]

LOCK_SUFFIX = ".hf_mlcl.lock"
# the lock files this process holds (a run's root while its stages lock their folders)
_HELD: set[str] = set()


class RunLock:
    """Hold the run lock of ``folder`` (a context manager; :meth:`acquire` / :meth:`release` otherwise).

    Raises:
        InputError: another process holds the folder's lock (it names its process id, host and start time).
    """

    def __init__(self, folder: str) -> None:
        self.folder = os.path.abspath(folder)
        self.path = os.path.join(
            os.path.dirname(self.folder), f".{os.path.basename(self.folder)}{LOCK_SUFFIX}"
        )
        self._fd: int | None = None
        self._created: list[str] = []

    def acquire(self) -> RunLock:
        try:
            import fcntl
        except ImportError:  # no advisory locks on this platform: nothing to hold
            return self
        from .preflight import InputError

        self._created = _missing_folders(os.path.dirname(self.path))
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise InputError(
                    f"{self.folder} is in use by another run ({holder}); wait for it to end, or choose another "
                    "--output_dir"
                ) from None
            try:  # the holder before us may have removed the file we opened: lock the one at the path
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.write(
            fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": time.ctime()}).encode()
        )
        self._fd = fd
        _HELD.add(self.path)
        enclosing = _held_by_another_above(self.folder)
        if enclosing is not None:  # e.g. a probe into the classifier/ of a run that is going on
            self.release()
            raise InputError(
                f"{self.folder} is inside {enclosing[0]}, which another run is using ({enclosing[1]}); wait for it "
                "to end, or choose another --output_dir"
            )
        return self

    def release(self) -> None:
        """Remove the lock file while still holding it (a later run then locks a new file), unlock, and remove
        the folders taking the lock created where they stayed empty (a stage that failed leaves nothing)."""
        if self._fd is None:
            return
        import fcntl

        _HELD.discard(self.path)

        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None
        for (
            folder
        ) in self._created:  # deepest first: the folders the lock made, where nothing else was written
            try:
                os.rmdir(folder)
            except OSError:
                break

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _held_by_another_above(folder: str) -> tuple[str, str] | None:
    """``(ancestor, holder)`` for the nearest folder above ``folder`` whose run lock another process holds (a
    ``run`` holds its root while its stages lock their own folders inside it: this process's locks, ``_HELD``, are
    no conflict)."""
    import fcntl

    current = folder
    while os.path.dirname(current) != current:
        current = os.path.dirname(current)
        path = os.path.join(os.path.dirname(current), f".{os.path.basename(current)}{LOCK_SUFFIX}")
        if path in _HELD:
            continue
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return current, _read_holder(fd)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return None


def _missing_folders(path: str) -> list[str]:
    """``path`` and its ancestors that do not exist yet, deepest first."""
    missing = []
    while path and not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return missing


def _read_holder(fd: int) -> str:
    """The holder a lock file names ("process 123 on host h since ..."), or what it holds when unreadable."""
    try:
        data = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return f"process {data['pid']} on host {data['host']} since {data['since']}"
    except (OSError, ValueError, KeyError):
        return "a process that has not written its name yet"
