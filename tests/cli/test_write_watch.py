"""The write counter the multi-node tests rely on: every write seen once, however late a watch starts."""

import os
import time

import _write_watch
import pytest
from _write_watch import WriteWatch


def _watch(folder) -> WriteWatch:
    try:
        return WriteWatch(str(folder))
    except OSError as err:  # not Linux
        pytest.skip(f"inotify is not available here: {err}")


def _write(path: str, text: str = "x") -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _settle() -> None:
    time.sleep(0.3)  # the watcher's thread reads the events of the writes above


def _until(done, what: str) -> None:
    """Wait for the watcher's thread (a loaded machine can delay it past any fixed sleep)."""
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, f"the watcher never {what}"
        time.sleep(0.01)


def test_writes_in_new_nested_folders_and_moved_folders_are_counted(tmp_path):
    _write(str(tmp_path / "before.txt"))
    watch = _watch(tmp_path)
    os.makedirs(tmp_path / "a" / "b")
    _write(str(tmp_path / "a" / "b" / "once.txt"))  # before or after the folder's listing: once either way
    # a new folder is watched when the thread reads its creation; writes before its listing count as one
    _until(
        lambda: watch.listed(str(tmp_path / "a")) and watch.listed(str(tmp_path / "a" / "b")), "listed a/b"
    )
    twice = str(tmp_path / "a" / "twice.txt")
    _write(twice)  # after the listing: each write counts by its own event
    _until(lambda: watch.seen(twice) == 1, "saw the first write")  # two unread identical events merge
    _write(twice)
    staging = tmp_path / "a" / ".staging"
    os.makedirs(staging)
    _write(str(staging / "moved.txt"))
    _settle()
    os.rename(staging, tmp_path / "final")
    _settle()
    writes = {os.path.relpath(p, tmp_path): n for p, n in watch.stop().items()}
    assert writes == {"before.txt": 0, "a/b/once.txt": 1, "a/twice.txt": 2, "final/moved.txt": 1}
    assert not watch.overflow


def test_a_file_written_while_its_new_folder_is_listed_counts_once(tmp_path, monkeypatch):
    """The folder's watch starts before its listing, so a file that lands right after the listing
    (and before the old order would have started the watch) is still seen by its event."""
    listed = []
    real_scandir = os.scandir

    def scandir_then_write(path):
        if os.path.basename(path) != "new" or listed:
            return real_scandir(path)
        entries = list(real_scandir(path))
        listed.append(path)
        _write(os.path.join(path, "late.txt"))
        return iter(entries)

    watch = _watch(tmp_path)
    monkeypatch.setattr(_write_watch.os, "scandir", scandir_then_write)
    os.makedirs(tmp_path / "new")
    _settle()
    writes = {os.path.relpath(p, tmp_path): n for p, n in watch.stop().items()}
    assert listed and writes == {"new/late.txt": 1}
