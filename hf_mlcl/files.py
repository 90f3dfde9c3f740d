"""Atomic file writes: a reader (or a crash) never sees a half-written JSON, Markdown, card or tensor file.

The one home of "write to a temp file in the same folder, fsync, ``os.replace``" for every text file
hf_mlcl writes (metrics, thresholds, results tables, model cards) and for its own safetensors files
(trainer state, cached features, LoRA adapters), each given the permissions the umask asks for; and of
a folder's footprint (:func:`folder_size`, :func:`format_size`). Model folders are made atomic by
``MLCLPreTrainedModel.save_pretrained`` itself (that module ships as Hub remote code and must stay
self-contained).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from typing import Any

__all__ = ["TMP_PREFIX", "atomic_write_json", "atomic_write_safetensors", "atomic_write_text", "folder_size",
           "follow_umask", "format_size", "json_default"]

TMP_PREFIX = ".tmp-"  # temp files of an interrupted write start with this (cleaned on resume)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(path: str) -> None:
    """Give ``path`` the permissions of any other output, ``0666 & ~umask`` (``mkstemp`` and safetensors'
    writer create files 0600, readable by their owner only)."""
    os.chmod(path, 0o666 & ~_umask())


@contextlib.contextmanager
def _replacing(path: str) -> Iterator[tuple[int, str]]:
    """A unique temp file beside ``path`` (its descriptor and name) that replaces ``path``, with the usual
    permissions (:func:`follow_umask`), when the block ends; removed instead when the block raises."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX, suffix=os.path.basename(path))
    try:
        yield fd, tmp
        follow_umask(tmp)  # mkstemp and safetensors create 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_safetensors(tensors: dict, path: str, metadata: dict[str, str] | None = None) -> None:
    """``safetensors.torch.save_file`` through a unique temp file in the same folder and ``os.replace``, the
    file given the usual permissions (:func:`follow_umask`) first."""
    from safetensors.torch import save_file

    with _replacing(path) as (fd, tmp):
        os.close(fd)
        save_file(tensors, tmp, metadata=metadata)


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


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``; the file gets
    the permissions of any other output (``0666 & ~umask``), not ``mkstemp``'s 0600."""
    with _replacing(path) as (fd, _tmp), os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def json_default(obj: Any) -> Any:
    """JSON fallback for numpy / torch values (``tolist()``) and anything else (``str``)."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def atomic_write_json(path: str, data: Any, default: Any = json_default) -> None:
    """``data`` as indented, key-sorted JSON, written atomically (see :func:`atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=default))
