"""Small readers shared by the loaders (jsonl / csv with large fields, label-string splitting)."""

from __future__ import annotations

import csv
import json
import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

_SPLIT_RE = re.compile(r"[;,\s]+")


def _missing(value) -> bool:
    """None, or a NaN (what pandas gives an empty cell)."""
    return value is None or (isinstance(value, float) and value != value)


def split_labels(value, sep: str | None = None) -> list[str]:
    """A label field as a list of strings: a list stays a list; a string is split on ``sep``
    (default: any run of ``;``, ``,`` or whitespace). NaN / None / "" -> [] (missing labels, never a label
    named 'None' or 'nan'), also as items of a list."""
    if _missing(value):
        return []
    if isinstance(value, (list, tuple)):
        return [str(v).strip() for v in value if not _missing(v) and str(v).strip()]
    if hasattr(value, "tolist"):
        return split_labels(value.tolist(), sep)
    s = str(value).strip()
    if not s:
        return []
    parts = s.split(sep) if sep is not None else _SPLIT_RE.split(s)
    return [p.strip() for p in parts if p.strip()]


@contextmanager
def _large_csv_fields() -> Iterator[None]:
    """The csv module's field size limit raised for long cells (clinical notes, whole documents) while the
    block runs, then set back (the limit is process-wide)."""
    before = csv.field_size_limit(min(sys.maxsize, 2**31 - 1))
    try:
        yield
    finally:
        csv.field_size_limit(before)


def check_csv_fields(path: str, sep: str = ",") -> None:
    """ValueError naming the line when a row of the CSV / TSV ``path`` has more fields than its header: an
    unquoted cell holding the separator (``hello world,a,b``), which pandas would otherwise read by taking the
    first column as the index (every text replaced by its first label) or stop on with a tokenising error."""
    with _large_csv_fields(), open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter=sep)
        header = next(reader, None)
        if header is None:
            return
        for row in reader:
            if len(row) > len(header):
                shown = sep.join(row)
                raise ValueError(
                    f"{path} line {reader.line_num} has {len(row)} fields but the header {header} has "
                    f'{len(header)}: {shown[:80]!r}; quote a cell that holds {sep!r} (e.g. "a{sep}b") or '
                    "separate the labels with ';'"
                )


def check_utf8(path: str) -> None:
    """ValueError naming the file, line and byte when ``path`` is not valid UTF-8 (read line by line)."""
    with open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path}:{lineno}: byte 0x{line[err.start]:02x} at column {err.start + 1} is not UTF-8 "
                    f"({err.reason}). Re-save the file as UTF-8, e.g. `iconv -f latin1 -t utf-8 in > out`"
                ) from None


def first_non_utf8(folder: str) -> None:
    """Run :func:`check_utf8` on every text file under ``folder`` (sorted): the first bad one raises."""
    for dirpath, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files):
            if name.lower().endswith((".csv", ".tsv", ".json", ".jsonl", ".txt", ".sgm", ".xml")):
                check_utf8(os.path.join(dirpath, name))


def iter_jsonl(path: str) -> Iterator[dict]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({err})") from err


def iter_csv(path: str, delimiter: str = ",") -> Iterator[dict]:
    """Rows of a csv with a header, as dicts (field size limit raised for clinical notes)."""
    with _large_csv_fields(), open(path, encoding="utf-8", newline="") as f:
        yield from csv.DictReader(f, delimiter=delimiter)


def iter_records(path: str) -> Iterator[dict]:
    """jsonl (``.jsonl``/``.json``), tsv or csv rows as dicts, chosen by extension."""
    low = path.lower()
    if low.endswith((".jsonl", ".json")):
        return iter_jsonl(path)
    if low.endswith(".tsv"):
        return iter_csv(path, "\t")
    return iter_csv(path, ",")


def get_field(record: dict, *candidates: str, path: str = "", required: bool = True):
    """First present key among ``candidates`` (case-insensitive); ValueError naming them if absent."""
    lower = {k.lower(): k for k in record}
    for c in candidates:
        if c in record:
            return record[c]
        if c.lower() in lower:
            return record[lower[c.lower()]]
    if required:
        raise ValueError(
            f"{path}: record has no field {candidates[0]!r} (looked for {candidates}; has {list(record)})"
        )
    return None
