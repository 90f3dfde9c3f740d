"""The checksums of a checkpoint's files: written when its save completes, checked before a resume reads it.

A file whose size or CRC-32 differs from the record, or that is gone, makes the checkpoint damaged; a missing
RNG state only changes the random stream (data order, dropout) of the resumed run and is reported apart.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass, field

from hf_mlcl.files import atomic_write_json

__all__ = ["CHECKSUMS_FILE", "Damage", "check_checkpoint", "write_checksums"]

CHECKSUMS_FILE = "checksums.json"
_CHUNK = 16 << 20


def _crc32(path: str) -> int:
    value = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            value = zlib.crc32(chunk, value)
    return value


def _files(folder: str, skip: tuple[str, ...]) -> list[str]:
    """Relative paths of the regular files under ``folder`` (sorted), without ``skip`` names."""
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in files:
            if name in skip:
                continue
            path = os.path.join(root, name)
            if os.path.isfile(path) and not os.path.islink(path):
                out.append(os.path.relpath(path, folder))
    return sorted(out)


def write_checksums(folder: str, skip: tuple[str, ...] = ()) -> None:
    """Record the size and CRC-32 of every file of ``folder`` (but ``skip``) in ``folder/checksums.json``."""
    record = {
        rel: {"size": os.path.getsize(os.path.join(folder, rel)), "crc32": _crc32(os.path.join(folder, rel))}
        for rel in _files(folder, (CHECKSUMS_FILE, *skip))
    }
    atomic_write_json(os.path.join(folder, CHECKSUMS_FILE), {"files": record})


@dataclass
class Damage:
    """What :func:`check_checkpoint` found: damaged files (changed or gone) and missing RNG states."""

    damaged: list[str] = field(default_factory=list)
    missing_rng: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return ", ".join(self.damaged)


def check_checkpoint(folder: str) -> Damage:
    """Compare ``folder``'s files with its ``checksums.json`` (no record: nothing to compare, no damage). An
    unreadable record is damage too."""
    path = os.path.join(folder, CHECKSUMS_FILE)
    found = Damage()
    if not os.path.isfile(path):
        return found
    try:
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)["files"]
    except (OSError, ValueError, KeyError, TypeError):
        found.damaged.append(f"{CHECKSUMS_FILE} (unreadable)")
        return found
    for rel, want in sorted(record.items()):
        full = os.path.join(folder, rel)
        if not os.path.isfile(full):
            (found.missing_rng if _is_rng_state(rel) else found.damaged).append(f"{rel} (missing)")
        elif os.path.getsize(full) != want.get("size"):
            found.damaged.append(f"{rel} ({os.path.getsize(full)} bytes, {want.get('size')} saved)")
        elif _crc32(full) != want.get("crc32"):
            found.damaged.append(f"{rel} (its bytes changed)")
    return found


def _is_rng_state(rel: str) -> bool:
    name = os.path.basename(rel)
    return name.startswith("rng_state") and name.endswith(".pth")
