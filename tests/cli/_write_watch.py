"""How many times each file under a folder was written while a command ran, seen by the kernel (inotify).

A file counts one write each time it is closed after being opened for writing (``IN_CLOSE_WRITE``) or
moved into place under its name (``IN_MOVED_TO``: the temp-file-and-rename of an atomic write); a folder
moved into place (``save_pretrained``'s atomic folder) counts one write for every file it holds. Any
writer counts (Python, the Rust writers of safetensors and tokenizers, torch.save), in any process, so two
processes writing one file show as 2, unless their events follow each other unread (the kernel merges two
identical unread events into one). Folders created during the run are watched as they appear (when the watcher's thread reads their
creation); a file already in such a folder when it is listed is counted once, merged with its next event
(the event of that write, if it comes later), so a count is never inflated by the watch starting late; the
price: writes of a file before its new folder is listed, and the first one after, count as one
(:meth:`WriteWatch.listed` says when a folder's files count by their own events).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import select
import struct
import threading
from collections import Counter

IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100
IN_ISDIR, IN_Q_OVERFLOW, IN_IGNORED = 0x40000000, 0x4000, 0x8000
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class WriteWatch:
    """Start with ``WriteWatch(folder)``; :meth:`stop` returns ``{path: writes}`` of the files that exist
    under ``folder`` at the end. ``OSError`` when the kernel offers no inotify."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        os.makedirs(self.root, exist_ok=True)
        self._libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = self._libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1 failed")
        self._folders: dict[int, str] = {}
        self._writes: Counter[str] = Counter()
        self._scanned: set[str] = (
            set()
        )  # counted by a scan; their event, if it still comes, is the same write
        self.overflow = False  # the kernel queue overflowed: counts are incomplete
        self._listed: set[str] = set()  # folders watched and listed
        self._stop = threading.Event()
        self._watch_tree(self.root, count=None)
        self._thread = threading.Thread(target=self._run, name="write-watch", daemon=True)
        self._thread.start()

    def _watch_tree(self, path: str, count: str | None) -> None:
        """Watch ``path`` and its sub-folders; ``count``: None (files there before the run), "scanned" (a
        new folder: files may still be written) or "moved" (a folder moved into place: files are done).

        Each folder is watched before it is listed, so a file is listed, seen by an event, or both (which
        counts once); a folder reached twice (by its event and by a listing: one inode, one watch) is
        walked once."""
        wd = self._libc.inotify_add_watch(
            self._fd, os.fsencode(path), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE
        )
        if wd >= 0:
            if self._folders.get(wd) == path:  # this folder (inode and name) is walked already
                return
            self._folders[wd] = path
        try:
            entries = list(os.scandir(path))
        except OSError:  # gone again
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                self._watch_tree(entry.path, count)
            elif count:
                self._writes[entry.path] += 1
                if count == "scanned":
                    self._scanned.add(entry.path)
        self._listed.add(path)

    def seen(self, path: str) -> int:
        """The writes of ``path`` counted so far (the kernel merges two identical events not yet read, so a test
        that writes a file twice waits for the first to be seen)."""
        return self._writes[os.path.abspath(path)]

    def listed(self, path: str) -> bool:
        """True once ``path`` is watched and listed: from then on each write there counts by its own event."""
        return os.path.abspath(path) in self._listed

    def _run(self) -> None:
        while not self._stop.is_set():
            if select.select([self._fd], [], [], 0.05)[0]:
                self._drain()
        self._drain()

    def _drain(self) -> None:
        while True:
            try:
                data = os.read(self._fd, 1 << 16)
            except BlockingIOError:
                return
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _EVENT.unpack_from(data, offset)
                start = offset + _EVENT.size
                name = data[start : start + length].rstrip(b"\0").decode()
                offset = start + length
                if mask & IN_Q_OVERFLOW:
                    self.overflow = True
                if mask & IN_IGNORED:  # the folder is gone; its watch number may be given again
                    self._folders.pop(wd, None)
                folder = self._folders.get(wd)
                if folder is None or mask & (IN_IGNORED | IN_Q_OVERFLOW):
                    continue
                path = os.path.join(folder, name)
                if mask & IN_ISDIR:
                    if mask & (IN_CREATE | IN_MOVED_TO):
                        self._watch_tree(path, "moved" if mask & IN_MOVED_TO else "scanned")
                elif mask & (IN_CLOSE_WRITE | IN_MOVED_TO):
                    if path in self._scanned:
                        self._scanned.discard(path)
                    else:
                        self._writes[path] += 1

    def stop(self) -> dict[str, int]:
        """Stop watching; the write count of every file under the folder now (0: never written while watched)."""
        self._stop.set()
        self._thread.join()
        os.close(self._fd)
        found = {}
        for folder, _, files in os.walk(self.root):
            for name in files:
                path = os.path.join(folder, name)
                found[path] = self._writes.get(path, 0)
        return found
