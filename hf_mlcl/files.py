"""Atomic file writes: a reader (or a crash) never sees a half-written file.

The one home of "write to a unique temp file in the same folder, fsync, ``os.replace``" for every file
hf_mlcl writes itself: metrics, thresholds, results tables and model cards (:func:`atomic_write_text`,
:func:`atomic_write_json`), and the files other libraries write to a path we name (safetensors states and
adapters, pooled features, copied adapter files: :func:`atomic_path`). Model folders are made atomic by
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

__all__ = ["TMP_PREFIX", "atomic_path", "atomic_write_json", "atomic_write_text", "json_default"]

TMP_PREFIX = ".tmp-"  # temp files of an interrupted write start with this (cleaned on resume)


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


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[str]:
    """A unique temporary path beside ``path`` to write to; when the block ends without an error the file is
    flushed to disk (``fsync``), given the permissions of any other output (``0666 & ~umask``, not
    ``mkstemp``'s 0600) and renamed onto ``path`` in one ``os.replace``. On an error the temporary file is
    removed and ``path`` is left as it was.

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
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (:func:`atomic_path`)."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)


def json_default(obj: Any) -> Any:
    """JSON fallback for numpy / torch values (``tolist()``) and anything else (``str``)."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def atomic_write_json(path: str, data: Any, default: Any = json_default) -> None:
    """``data`` as indented, key-sorted JSON, written atomically (see :func:`atomic_path`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=default))
