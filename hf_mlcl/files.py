"""Atomic file writes: a reader (or a crash) never sees a half-written JSON, Markdown or card file.

The one home of "write to a temp file in the same folder, fsync, ``os.replace``" for every text file
hf_mlcl writes (metrics, thresholds, results tables, model cards). Model folders are made atomic by
``MLCLPreTrainedModel.save_pretrained`` itself (that module ships as Hub remote code and must stay
self-contained).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

__all__ = ["TMP_PREFIX", "atomic_write_json", "atomic_write_text", "json_default"]

TMP_PREFIX = ".tmp-"  # temp files of an interrupted write start with this (cleaned on resume)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``; the file gets
    the permissions of any other output (``0666 & ~umask``), not ``mkstemp``'s 0600."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=TMP_PREFIX, suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def json_default(obj: Any) -> Any:
    """JSON fallback for numpy / torch values (``tolist()``) and anything else (``str``)."""
    return obj.tolist() if hasattr(obj, "tolist") else str(obj)


def atomic_write_json(path: str, data: Any, default: Any = json_default) -> None:
    """``data`` as indented, key-sorted JSON, written atomically (see :func:`atomic_write_text`)."""
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, default=default))
