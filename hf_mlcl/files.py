"""Atomic file writes: a reader (or a crash) never sees a half-written file; and a folder's footprint.

The one home of "write to a unique temp file in the same folder, fsync, ``os.replace``" for every file
hf_mlcl writes itself: metrics, thresholds, results tables and model cards (:func:`atomic_write_text`,
:func:`atomic_write_json`), its own safetensors files (trainer state, cached features, LoRA adapters:
:func:`atomic_write_safetensors`), and the files other libraries write to a path we name (copied adapter
files: :func:`atomic_path`), each given the permissions the umask asks for (:func:`follow_umask`). A
folder's footprint: :func:`folder_size`, :func:`format_size`; whether a failed write found the device full:
:func:`disk_full`. Model folders are made atomic by
``MLCLPreTrainedModel.save_pretrained`` itself (that module ships as Hub remote code and must stay
self-contained).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "TMP_PREFIX",
    "atomic_path",
    "atomic_write_json",
    "atomic_write_safetensors",
    "atomic_write_text",
    "disk_full",
    "folder_size",
    "follow_umask",
    "format_size",
    "json_default",
    "move_into",
]

TMP_PREFIX = ".tmp-"  # temp files of an interrupted write start with this (cleaned on resume)
# how the writers hf_mlcl calls report a full device: Python's OSError, safetensors' Rust io error, torch's zip
# writer, which reports the short write it got as "unexpected pos"; each is read with the free space left
_FULL_MESSAGES = ("no space left on device", "os error 28", "unexpected pos")
_NEARLY_FULL = 1 << 20  # bytes


def disk_full(error: BaseException, folder: str) -> bool:
    """True when ``error`` (or an error it was raised from) reports a failed write (``ENOSPC``, or a writer's
    message for it) and ``folder``'s device has under 1 MiB free: another device's full (a shared-memory
    segment, an inotify limit, which also say ENOSPC) is not taken for the folder's."""
    import errno
    import shutil

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        message = str(error).lower()
        if (isinstance(error, OSError) and error.errno == errno.ENOSPC) or any(
            t in message for t in _FULL_MESSAGES
        ):
            try:
                return shutil.disk_usage(folder).free < _NEARLY_FULL
            except OSError:
                return False
        error = error.__cause__ or error.__context__
    return False


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def follow_umask(path: str) -> None:
    """Give ``path`` the permissions of any other output, ``0666 & ~umask`` (``mkstemp`` and safetensors'
    writer create files 0600, readable by their owner only)."""
    os.chmod(path, 0o666 & ~_umask())


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A unique temporary path beside ``path`` to write to; when the block ends without an error the file is
    flushed to disk (``fsync``), given the permissions of any other output (:func:`follow_umask`) and
    renamed onto ``path`` in one ``os.replace``. On an error the temporary file is removed and ``path`` is
    left as it was.

    Example::

        with atomic_path("out/state.safetensors") as tmp:
            safetensors.torch.save_file(tensors, tmp)

    The temporary name starts with :data:`TMP_PREFIX` and is unique (``mkstemp``), so two writers never
    share one, and a file an interrupted run left behind is recognised and removed on resume
    (:func:`hf_mlcl.training.checkpoints.remove_incomplete_checkpoints`).
    """
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX, suffix=os.path.basename(path))
    os.close(fd)
    try:
        yield tmp
        _fsync(tmp)
        follow_umask(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_safetensors(tensors: dict, path: str, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` of ``tensors`` to ``path`` atomically (:func:`atomic_path`)."""
    from safetensors.torch import save_file

    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata=metadata)


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


def move_into(source: str, target: str) -> None:
    """Move every entry of the folder ``source`` into ``target`` (created if needed), each by one ``os.replace``
    (same file system): a file replaces its namesake, a folder replaces its namesake whole."""
    import shutil

    os.makedirs(target, exist_ok=True)
    for name in sorted(os.listdir(source)):
        src, dst = os.path.join(source, name), os.path.join(target, name)
        if os.path.isdir(src) and os.path.isdir(dst):
            shutil.rmtree(dst)
        os.replace(src, dst)


def folder_size(path: str) -> int:
    """Bytes of the files under ``path`` (links not followed; 0 for a missing path)."""
    total = 0
    for folder, _dirs, files in os.walk(path):
        for name in files:
            full = os.path.join(folder, name)
            if not os.path.islink(full):
                total += os.path.getsize(full)
    return total


def format_size(num_bytes: int) -> str:
    """``12 MB``-style size (decimal units, as ``du --si`` and the Hub show them)."""
    size = float(num_bytes)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" or size >= 10 else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def json_default(obj: Any) -> Any:
    """JSON fallback for numpy / torch values (``tolist()``) and anything else (``str``)."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def atomic_write_json(path: str, data: Any, default: Any = json_default) -> None:
    """``data`` as indented, key-sorted JSON, written atomically (see :func:`atomic_path`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=default))


def file_in_the_way(path: str) -> str | None:
    """The existing file (not folder) at ``path`` or at the nearest of its parents that exists, which would stop a
    folder being made there; None when nothing is in the way."""
    current = os.path.abspath(path)
    while not os.path.exists(current) and os.path.dirname(current) != current:
        current = os.path.dirname(current)
    return None if os.path.isdir(current) else current


def json_shape(path: str) -> str | None:
    """``"object"``, ``"array"`` or ``"other"`` for the JSON file at ``path`` (``"other"`` also when it is no JSON);
    None where there is no such file."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return "other"
    return "object" if isinstance(data, dict) else "array" if isinstance(data, list) else "other"
