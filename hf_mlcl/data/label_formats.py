"""How a dataset's label column is read: the label formats, their detection, and label ids from the cells.

:func:`detect_format` decides the format (``names``, ``ids``, ``delimited``, ``columns``, ``multihot``) under
``"auto"``, :func:`row_tokens` reads a cell, :func:`encode_rows` turns tokens into label ids and
:func:`superseded_label_keys` says which layout keys a later layout replaces.

Design: docs/design.md, "Label formats (hf_mlcl/data/label_formats.py)".
"""

from __future__ import annotations

import ast
import json
import logging
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from datasets import ClassLabel, Dataset, Value

from hf_mlcl.data._io import check_utf8, split_labels
from hf_mlcl.data.registry import read_lines

logger = logging.getLogger(__name__)

__all__ = [
    "LABEL_FORMATS",
    "UNKNOWN_LABELS",
    "binary_columns",
    "classlabel_names",
    "column",
    "columns_np",
    "detect_format",
    "encode_rows",
    "joined_cell",
    "multihot_widths",
    "names_from_file",
    "row_tokens",
    "separators_in",
    "superseded_label_keys",
]

LABEL_FORMATS = ("auto", "names", "ids", "delimited", "columns", "multihot")
UNKNOWN_LABELS = ("error", "drop")
_SEPARATORS = (";", "|", ",")
_ID_SPLIT = re.compile(r"[;|,\s]+")  # a plain cell of label_format="ids": "8;20", "8, 20", "8 20"


def _inner(feature):
    """The item feature of a list feature (``List`` / ``Sequence`` / ``[feature]``), else None."""
    if isinstance(feature, list):
        return feature[0] if feature else None
    return getattr(feature, "feature", None)


def classlabel_names(feature) -> list[str] | None:
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    inner = _inner(feature)
    return list(inner.names) if isinstance(inner, ClassLabel) else None


def column(ds: Dataset, name: str) -> list:
    """A column as a Python list, read through Arrow in one go (not row by row)."""
    return ds.with_format("arrow")[name].to_pylist()


def columns_np(ds: Dataset, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Columns as NumPy arrays, read through Arrow in one pass (one format change for all of them: a change per
    column copies the features each time, quadratic in thousands of label columns). Nulls become NaN."""
    if not names:
        return {}
    table = ds.select_columns(list(names)).with_format("arrow")[:]
    return {n: np.asarray(table.column(n).to_numpy()) for n in names}


# a column at least this share of whose cells are 0/1 may be a label column: one with missing cells is refused,
# one with other values is left out and named
_MOSTLY_BINARY = 0.5


def binary_columns(ds: Dataset, exclude: set[str]) -> tuple[list[str], list[str]]:
    """The integer columns holding only 0/1 values (one per label), in order, and the columns left out that may
    be label columns too (mostly 0/1 with other values, or 0/1 stored as floats or text), described for a
    warning. A column of 0/1 values with missing cells (empty, NaN) is a label column with gaps, not one to
    leave out silently: a ValueError names it (naming the label columns settles it)."""
    features = ds.features  # a deep copy at every access of the property: read once
    kinds = {
        name: ("number" if feat.dtype.startswith(("int", "uint", "float")) else "text")
        for name, feat in features.items()
        if name not in exclude
        and isinstance(feat, Value)
        and feat.dtype.startswith(("int", "uint", "float", "string", "large_string"))  # bools are flags
    }
    values = columns_np(ds, list(kinds))
    cols, maybe, gaps = [], [], []
    for name, kind in kinds.items():
        v = values[name]
        if not v.size:
            continue
        if kind == "number":
            binary = np.isin(v, (0, 1))
            missing = np.isnan(v.astype(np.float64))
            shown = sorted({f"{x:g}" for x in v[~binary & ~missing].astype(np.float64)})
        else:
            cells = np.array(["" if x is None else str(x).strip() for x in v], dtype=object)
            binary, missing = np.isin(cells, ("0", "1")), cells == ""
            shown = sorted({repr(x) for x in cells[~binary & ~missing]})
        if binary.all() and features[name].dtype.startswith(("int", "uint")):
            cols.append(name)
        elif binary.mean() < _MOSTLY_BINARY:
            continue
        elif (binary | missing).all() and missing.any():
            gaps.append(f"{name!r} ({int(missing.sum())} empty)")
        elif binary.all():
            maybe.append(f"{name!r} (0/1 stored as {'floats' if kind == 'number' else 'text'})")
        else:
            maybe.append(f"{name!r} (also {', '.join(shown[:3])})")
    maybe += [f"{n!r} (True/False)" for n, f in features.items() if getattr(f, "dtype", None) == "bool"]
    if gaps:
        raise ValueError(
            f"columns {', '.join(gaps[:5])} hold 0/1 values with empty cells, so they look like label columns with "
            "gaps; fill those cells (0 or 1), or name the label columns with label_columns="
        )
    return cols, maybe


def is_int_token(token: Any) -> bool:
    """True for an int, or a string of one (label ids written as text); never for a bool."""
    if isinstance(token, (bool, np.bool_)):
        return False
    if isinstance(token, (int, np.integer)):
        return True
    return isinstance(token, str) and token.strip().lstrip("-").isdigit()


def _looks_like_list(value: Any) -> bool:
    """A string cell written as a list: ``[8, 20]``, ``["sports", "politics"]``, ``['a', 'b']``."""
    return isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]")


def _parsed(text: str) -> Any:
    """A list cell read as JSON or, failing that, as a Python literal (what ``str(list)`` and pandas write); None
    when neither reads it."""
    for parse in (json.loads, ast.literal_eval):
        try:
            return parse(text.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return None


def _list_items(text: str) -> list[int | str] | None:
    """The items of a list cell (:func:`_parsed`), or None when it is not a flat list of ids (int) and names
    (str)."""
    items = _parsed(text)
    ok = isinstance(items, list) and all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in items)
    return items if ok else None


def _stray(name: str) -> bool:
    """A label name that reads like a piece of a list or of a quoted string: a bracket, a leading or
    trailing quote, or an unbalanced parenthesis ("(chronic)" and "children's" are fine)."""
    return (
        any(c in name for c in "[]{}")
        or name[:1] in ("'", '"')
        or name[-1:] in ("'", '"')
        or name.count("(") != name.count(")")
    )


def separators_in(cells) -> list[str]:
    """The label separators (``;`` ``|`` ``,``, in that order of preference) that occur in ``cells``."""
    cells = [c for c in cells if isinstance(c, str)]
    return [s for s in _SEPARATORS if any(s in c for c in cells)]


def _vector(value: Any) -> list | None:
    """A cell as a list of values: a list, tuple or array as it is, a string written as a list parsed; else None."""
    if _looks_like_list(value):
        value = _parsed(value)
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    return list(value) if isinstance(value, (list, tuple)) else None


def _binary(x: Any) -> bool:
    return isinstance(x, (bool, int, float, np.bool_, np.integer, np.floating)) and x in (0, 1)


def _empty(cell: Any) -> bool:
    return cell is None or (isinstance(cell, str) and not cell.strip())


def _multihot_cells(cells: Sequence[Any]) -> bool:
    """Every non-empty cell a 0/1 vector of one width of at least 2, and (since a list of the label ids 0 and 1 is
    also 0/1) some cell that no id list can be: one that repeats a value, or holds a float or a bool. Stops at
    the first cell that is no such vector (a column of label ids: its first cell)."""
    widths: set[int] = set()
    no_id_list = False
    for cell in cells:
        if _empty(cell):
            continue
        vector = _vector(cell)
        if vector is None or len(vector) < 2 or not all(map(_binary, vector)):
            return False
        widths.add(len(vector))
        if len(widths) > 1:
            return False
        no_id_list = no_id_list or len(set(vector)) < len(vector) or not all(map(is_int_token, vector))
    return no_id_list


def multihot_widths(cells: Sequence[Any]) -> set[int]:
    """The widths of the non-empty multi-hot cells of a split."""
    return {len(v) for v in map(_vector, cells) if v}


def _multihot_ids(value: Any) -> list[int]:
    """The positions of the ones of a multi-hot cell (ValueError for a value other than 0/1)."""
    vector = [] if _empty(value) else _vector(value)
    if vector is None or not all(map(_binary, vector)):
        raise ValueError(
            f"label_format='multihot' reads one 0/1 vector per cell, but a cell holds {str(value)[:60]!r}"
        )
    return [j for j, x in enumerate(vector) if x]


_CHOICES = (
    "label_format='names' (one label per cell), label_format='ids', or label_format='delimited' "
    "with label_separator"
)


def detect_format(
    ds: Dataset, label_column: str | None, label_columns, label_separator: str | None
) -> tuple[str, str | None]:
    """The label format of ``label_column`` (and the separator of ``delimited``), from its feature type and,
    for a string column, its train cells: the one place ``label_format="auto"`` is decided.

    A string column is either list cells (every non-empty cell ``[...]``: ``ids`` when the items are
    integers, ``names`` when they are strings) or one delimited string per cell (the separator is the one
    of ``;`` ``|`` ``,`` that occurs). A column of 0/1 vectors of one width is ``multihot`` (where no id list
    could be one: some vector repeats a value or holds floats or bools). Where that is ambiguous — list and
    plain cells mixed, ids and names mixed, a ``[...]`` cell that is not a list, two separators in one column,
    or names that would carry brackets or quotes — a ValueError names the cell and the choices."""
    if label_columns or label_column is None:
        return "columns", None
    feat = ds.features[label_column]
    if classlabel_names(feat) is not None:
        return "ids", None
    inner = _inner(feat)
    if inner is not None:  # a list column
        if isinstance(inner, Value) and inner.dtype.startswith(("int", "uint", "float", "bool")):
            if _multihot_cells(column(ds, label_column)):
                return "multihot", None
        return (
            "ids" if isinstance(inner, Value) and inner.dtype.startswith(("int", "uint")) else "names"
        ), None
    if isinstance(feat, Value) and feat.dtype.startswith(("int", "uint")):
        return "ids", None
    cells = column(ds, label_column)
    where = f"label column {label_column!r}"
    listed = [i for i, v in enumerate(cells) if _looks_like_list(v)]
    plain = [i for i, v in enumerate(cells) if _plain(v)]
    if listed and plain:
        i, j = listed[0], plain[0]
        raise ValueError(
            f"{where} mixes list cells such as {cells[i]!r} (row {i}) with plain cells such as {cells[j]!r} (row "
            f"{j}); write every cell one way, or choose: label_format='ids' or label_format='names' (a list cell "
            "is read as a list, a plain cell as one label), or label_format='delimited' with label_separator"
        )
    if listed and _multihot_cells(cells):  # "[0, 1, 0, 1]" written by pandas or str(list)
        return "multihot", None
    if listed:
        kinds: set[str] = set()
        for i in listed:
            items = _list_items(cells[i])
            if items is None:
                raise ValueError(
                    f"{where}: cell {cells[i]!r} (row {i}) looks like a list but is not a list of label names or "
                    'ids; write it as JSON, e.g. ["cs.LG", "q-bio"] or [8, 20], or choose ' + _CHOICES
                )
            kinds.update("id" if isinstance(x, int) else "name" for x in items)
        if len(kinds) > 1:
            raise ValueError(
                f"{where} mixes ids and names in its list cells; write one kind, or choose label_format='ids' "
                "(names must then be integers) or label_format='names' (ids are read as names)"
            )
        return ("ids" if kinds == {"id"} else "names"), None
    sep = label_separator
    if sep is None:
        seen = separators_in(cells[i] for i in plain)
        if len(seen) > 1:
            examples = " and ".join(repr(next(cells[i] for i in plain if s in cells[i])) for s in seen[:2])
            raise ValueError(
                f"{where} holds both {seen[0]!r} and {seen[1]!r} (e.g. {examples}), so the label separator is "
                "ambiguous; choose "
                + " or ".join(f"label_separator={s!r}" for s in seen)
                + ", or label_format='names' (one label per cell)"
            )
        sep = seen[0] if seen else None
    stray = sorted(
        {t for r in row_tokens(cells, "delimited", sep) for t in r if isinstance(t, str) and _stray(t)}
    )
    if stray:
        raise ValueError(
            f"{where}: reading it as delimited text gives label names such as {stray[0]!r} that carry quotes or "
            'brackets; write list cells as JSON (["cs.LG", "q-bio"] or [8, 20]), or choose ' + _CHOICES
        )
    return "delimited", sep


def _plain(value: Any) -> bool:
    """A non-empty string cell not written as a list (``"a;b"``, ``"sports"``)."""
    return isinstance(value, str) and bool(value.strip()) and not _looks_like_list(value)


def joined_cell(cells: Sequence[Any]) -> int | None:
    """The row of the first string cell not written as a list that holds a label separator (``"a;b"``)."""
    return next((i for i, v in enumerate(cells) if _plain(v) and any(c in v for c in _SEPARATORS)), None)


def row_tokens(values: Sequence[Any], fmt: str, sep: str | None) -> list[list[Any]]:
    """Per-row label tokens (names as str, ids as int) of one split's label column. A string cell
    written as a list (``[8, 20]``, ``["a", "b"]``) is read as that list in every format."""
    if fmt == "multihot":
        return [_multihot_ids(v) for v in values]
    rows: list[list[Any]] = []
    for v in values:
        items = _list_items(v) if _looks_like_list(v) else None
        if items is not None:
            toks = split_labels(items)
        elif fmt == "delimited":
            toks = split_labels(v, sep) if sep is not None else split_labels([v] if isinstance(v, str) else v)
        elif fmt == "ids" and isinstance(v, str):
            toks = split_labels(v, sep) if sep is not None else [t for t in _ID_SPLIT.split(v) if t]
        else:
            toks = split_labels(v if isinstance(v, (list, tuple)) or hasattr(v, "tolist") else [v])
        rows.append(toks)
    if fmt == "ids":  # delimited numbers stay names ("4019", "0010"): ids only where the user says so
        bad = sorted({t for r in rows for t in r if not is_int_token(t)})
        if bad:
            raise ValueError(f"label_format='ids' but the label column holds non-integers such as {bad[:5]}")
        rows = [[int(t) for t in r] for r in rows]
    return rows


def _one_column_per_label(options: Mapping[str, Any]) -> bool:
    return (
        options.get("label_format") == "columns"
        or bool(options.get("label_columns"))
        or options.get("label_column") == ""
    )


def _one_labelcolumn(options: Mapping[str, Any]) -> bool:
    return (
        bool(options.get("label_column"))
        or bool(options.get("label_separator"))
        or options.get("label_format") in ("names", "ids", "delimited", "multihot")
    )


def superseded_label_keys(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> set[str]:
    """The label-layout keys of ``earlier`` (a recipe's, or a base recipe's) that ``later`` (the command
    line, or the recipe built on the base) contradicts, so they must be dropped for ``later`` to win.

    The layout is either one label column (``label_column``, ``label_separator``, ``label_format`` names /
    ids / delimited / multihot) or one 0/1 column per label (``label_format: columns``, ``label_columns``, or
    ``label_column: ""`` for "no label column"). A later choice of one drops the earlier keys of the other
    (e.g. ``--label_format columns`` over a recipe's ``label_column: labels``); keys the later side sets
    itself are replaced anyway, and compatible earlier keys stay."""
    drop: set[str] = set()
    if _one_column_per_label(later):
        drop |= {"label_column", "label_separator"}
        if earlier.get("label_format") not in (None, "auto", "columns"):
            drop.add("label_format")
    if _one_labelcolumn(later):
        drop.add("label_columns")
        if earlier.get("label_format") == "columns":
            drop.add("label_format")
    return {k for k in drop if k in earlier and k not in later}


def names_from_file(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"label_names file {path!r} does not exist (one label name per line)")
    check_utf8(path)
    return [n.strip() for n in read_lines(path) if n.strip()]


def encode_rows(
    rows: list[list[Any]], names: list[str], split: str, unknown: str, names_origin: str
) -> tuple[list[list[int]], set]:
    index = {n: i for i, n in enumerate(names)}
    out, missing = [], set()
    for r in rows:
        ids = set()
        for t in r:
            if isinstance(t, int):
                if 0 <= t < len(names):
                    ids.add(t)
                else:
                    missing.add(t)
            elif t in index:
                ids.add(index[t])
            else:
                missing.add(t)
        out.append(sorted(ids))
    if missing and unknown == "error":
        shown = sorted(missing, key=str)
        raise ValueError(
            f"split {split!r} has labels not in the label space ({names_origin}): {shown[:20]}"
            + (" ..." if len(shown) > 20 else "")
            + ". Add them to label_names, or pass unknown_labels='drop' to drop them with a warning"
        )
    if missing:
        logger.warning(
            "split %r: dropped labels outside the label space (%s): %s",
            split,
            names_origin,
            sorted(missing, key=str)[:20],
        )
    return out, missing
