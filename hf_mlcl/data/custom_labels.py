"""How a custom dataset's labels are laid out and read: the label column(s), format and names, then label ids.

:func:`label_layout` finds the :class:`LabelLayout` of a source from its train split and the options;
:func:`label_ids` reads every split's rows as label ids in its label space. Used by
:func:`hf_mlcl.data.custom.load_custom_dataset`.

Design: docs/design.md, "Your own dataset (hf_mlcl/data/custom.py)".
"""

from __future__ import annotations

import collections
import logging
import os
import unicodedata
from dataclasses import dataclass
from typing import Any

import numpy as np
from datasets import Dataset, DatasetDict

from hf_mlcl.data.label_formats import (
    binary_columns,
    classlabel_names,
    column,
    columns_np,
    detect_format,
    encode_rows,
    is_int_token,
    joined_cell,
    multihot_widths,
    names_from_file,
    row_tokens,
    separators_in,
)

# the loader's own logger: what these helpers log reads as load_custom_dataset's
logger = logging.getLogger("hf_mlcl.data.custom")


@dataclass
class LabelLayout:
    """How the label column(s) of a source are read: the format (with its separator), the label column or
    the 0/1 label columns, and the label names with where they come from (None: the train union, later)."""

    fmt: str
    sep: str | None
    label_column: str | None
    label_columns: list[str] | None
    names: list[str] | None
    names_origin: str
    detected: bool = False  # the format was detected (label_format "auto") from the train cells


def label_layout(
    train: Dataset,
    origin: str,
    text_column: str,
    label_column: str | None,
    label_columns,
    label_format: str,
    label_separator: str | None,
    label_names,
) -> LabelLayout:
    """The :class:`LabelLayout` of a source from its train split and the options: the label names of a file /
    list (else a ClassLabel feature, else the 0/1 columns' names, else later the train union), the label column
    (``""``: one 0/1 column per label; default ``labels`` / ``label``), the format (``"auto"``:
    :func:`~hf_mlcl.data.label_formats.detect_format`)."""
    cols = list(train.column_names)
    names: list[str] | None = None
    names_origin = "the sorted union of the train labels"
    if isinstance(label_names, (str, os.PathLike)):
        names, names_origin = names_from_file(os.fspath(label_names)), f"label_names file {label_names}"
    elif label_names is not None:
        names, names_origin = [str(n) for n in label_names], "the given label_names"
    if names is not None:
        twice = sorted(n for n, count in collections.Counter(names).items() if count > 1)
        if twice:
            raise ValueError(f"{names_origin} names labels more than once: {twice[:5]}; each name once")
    if label_column == "":  # "no label column": one 0/1 column per label
        if label_format not in ("auto", "columns"):
            raise ValueError(
                f"label_column='' (no label column) reads one 0/1 column per label, but label_format is "
                f"{label_format!r}; pass label_format='columns' or name the label column"
            )
        label_column, label_format = None, "columns"
    if label_columns and label_format not in ("auto", "columns"):
        raise ValueError(
            f"label_columns= names one 0/1 column per label, but label_format is {label_format!r}; pass "
            "label_format='columns' or drop label_columns"
        )
    if label_column is None and label_format != "columns" and not label_columns:
        label_column = next((c for c in ("labels", "label") if c in cols), None)
        if label_column is None and label_format not in ("auto", "columns"):
            raise ValueError(f"{origin}: no 'labels'/'label' column (columns: {cols}); set label_column=")
    elif label_column is not None and label_column not in cols:
        raise ValueError(f"{origin}: no label column {label_column!r} (columns: {cols}); set label_column=")
    sep = label_separator
    fmt = label_format
    if label_format == "auto":
        fmt, sep = detect_format(train, label_column, label_columns, label_separator)
    if fmt == "columns":
        left_out: list[str] = []
        if not label_columns:
            if names is not None:
                label_columns = list(names)
            else:
                label_columns, left_out = binary_columns(train, {text_column})
            if not label_columns:
                flags = [n for n, f in train.features.items() if getattr(f, "dtype", None) == "bool"]
                if flags:  # True/False columns (pandas writes bools so) are read as flags unless named
                    raise ValueError(
                        f"{origin}: no 0/1 label columns, but True/False columns {flags[:10]}; True/False columns "
                        "are read as labels only when named: label_columns=" + ",".join(flags[:3])
                    )
                if label_format == "columns":  # asked for: a 'labels' column there is not one of them
                    raise ValueError(
                        f"{origin}: label_format='columns' reads one 0/1 column per label, and no column holds only "
                        f"0/1 values (columns: {cols}); name them with label_columns=, or read a label column with "
                        "label_column= and label_format 'auto'"
                    )
                raise ValueError(
                    f"{origin}: found no label column ('labels'/'label') and no 0/1 columns"
                    + (f" (left out: {', '.join(left_out[:5])})" if left_out else "")
                    + f"; set label_column= or label_columns= (columns: {cols})"
                )
            if names is None:
                shown = ", ".join(label_columns[:10]) + (
                    f", ... ({len(label_columns)} in all)" if len(label_columns) > 10 else ""
                )
                logger.warning(
                    "one 0/1 column per label, detected: %s%s",
                    shown,
                    f"; left out (name them in label_columns= if they are labels): {', '.join(left_out[:10])}"
                    if left_out
                    else "",
                )
        twice = sorted(c for c, count in collections.Counter(label_columns).items() if count > 1)
        if twice:
            raise ValueError(f"{origin}: label_columns names columns more than once: {twice[:5]}")
        missing = [c for c in label_columns if c not in cols]
        if missing:
            raise ValueError(f"{origin}: label columns {missing} are missing (columns: {cols})")
        names_origin = "the label columns" if label_names is None else names_origin
        names = [str(c) for c in label_columns] if names is None else names
    elif names is None:
        names = classlabel_names(train.features[label_column])
        if names is not None:
            names_origin = f"the ClassLabel feature of {label_column!r}"
    if fmt == "delimited" and sep is None:  # label_format="delimited" given, its separator not
        sep = next(iter(separators_in(column(train, label_column))), None)
    return LabelLayout(
        fmt,
        sep,
        label_column,
        list(label_columns) if label_columns else None,
        names,
        names_origin,
        detected=label_format == "auto",
    )


def label_ids(
    raw: DatasetDict,
    order: list[str],
    layout: LabelLayout,
    origin: str,
    text_column: str,
    unknown_labels: str,
) -> tuple[dict[str, list[list[int]]], list[str], str]:
    """Every split's rows as label ids, the label names and where they come from. One 0/1 column per label:
    the columns' non-zeros; a label column: its tokens (:func:`~hf_mlcl.data.label_formats.row_tokens`) in
    the label space, which is the train union when no names were given (a label seen only outside train is
    an error naming it, or dropped with ``unknown_labels="drop"``)."""
    encoded: dict[str, list[list[int]]] = {}
    tokens: dict[str, list[list[Any]]] = {}
    widths: dict[str, set[int]] = {}  # multihot: each split's vector widths
    for split in order:
        ds = raw[split]
        if text_column not in ds.column_names:
            raise ValueError(f"{origin}: split {split!r} has no text column {text_column!r}")
        if layout.fmt == "columns":
            encoded[split] = _column_label_ids(ds, layout.label_columns, origin, split)
        else:
            if layout.label_column not in ds.column_names:
                raise ValueError(f"{origin}: split {split!r} has no label column {layout.label_column!r}")
            cells = column(ds, layout.label_column)
            if layout.fmt == "multihot":
                widths[split] = multihot_widths(cells)
            if split != "train" and layout.detected and layout.fmt in ("names", "ids"):
                _check_written_as_train(cells, origin, split)
            tokens[split] = row_tokens(cells, layout.fmt, layout.sep)
            own = classlabel_names(ds.features[layout.label_column]) if layout.fmt == "ids" else None
            if own is not None:  # a ClassLabel's ids name its own labels: read by name, whatever the order
                tokens[split] = [[own[t] if 0 <= t < len(own) else t for t in r] for r in tokens[split]]
    for split, rows in tokens.items():
        empty = sum(not r for r in rows)
        if empty:
            logger.warning(
                "%s: %d of %d rows of split %r have no label (empty, None or NaN cells); they train as rows "
                "without a positive",
                origin,
                empty,
                len(rows),
                split,
            )
    names, names_origin = layout.names, layout.names_origin
    if layout.fmt == "columns":
        return encoded, names, names_origin
    if layout.fmt == "multihot":
        names, names_origin = _multihot_space(widths, layout, names, names_origin, origin)
    if names is not None and layout.fmt == "delimited":
        tokens = _ids_of_given_names(tokens, names)
    if names is None:
        names, names_origin = _train_label_space(tokens, origin, unknown_labels)
        if layout.fmt == "delimited" and layout.sep is None:  # plain cells in which no separator was found
            _check_joined_names(names, origin)
        if layout.fmt == "delimited" and layout.detected and layout.sep == ",":
            _warn_inseparable(tokens["train"], origin)
    for split, rows in tokens.items():
        encoded[split], _ = encode_rows(rows, names, split, unknown_labels, names_origin)
    return encoded, names, names_origin


def _multihot_space(
    widths: dict[str, set[int]],
    layout: LabelLayout,
    names: list[str] | None,
    names_origin: str,
    origin: str,
) -> tuple[list[str], str]:
    """The label names of a multi-hot label column whose splits' vectors are ``widths`` wide: the given ones, one
    per position, else ``"0" .. W - 1`` for vectors W wide. ValueError in one line when the splits' vectors differ
    in width, or from the names."""
    every = sorted(set().union(*widths.values()))
    if len(every) > 1:
        shown = ", ".join(f"{split} {sorted(w)}" for split, w in widths.items() if w)
        raise ValueError(f"{origin}: the multi-hot label vectors differ in width ({shown}); write one width")
    if not every:
        raise ValueError(f"{origin}: the label column {layout.label_column!r} holds no multi-hot vector")
    width = every[0]
    if names is None:
        return [str(i) for i in range(width)], f"the positions of the multi-hot vectors (0 .. {width - 1})"
    if len(names) != width:
        raise ValueError(
            f"{origin}: the multi-hot label vectors are {width} wide but {names_origin} names {len(names)} labels; "
            "give one name per position"
        )
    return names, names_origin


def _check_written_as_train(cells: list, origin: str, split: str) -> None:
    """Train's label cells are lists (the format detected from them, so none of them is plain text): a split whose
    plain cells join labels (``"a;b"``) would read each as one unknown label; ValueError naming the two ways (a
    plain cell of one name reads as that name)."""
    row = joined_cell(cells)
    if row is None:
        return
    raise ValueError(
        f"{origin}: split {split!r} writes its labels as plain text such as {cells[row]!r} (row {row}) and train "
        "as lists; write every split one way, or choose label_format='delimited' with label_separator= (list "
        "cells are read as lists in every format)"
    )


def _column_label_ids(ds: Dataset, label_columns: list[str], origin: str, split: str) -> list[list[int]]:
    """The label ids of every row of ``ds`` from its 0/1 label columns (ValueError naming other values)."""
    absent = [c for c in label_columns if c not in ds.column_names]
    if absent:
        raise ValueError(f"{origin}: split {split!r} lacks label columns {absent}")
    if not len(ds):
        return []
    values = columns_np(ds, label_columns)
    mat = np.stack([values[c] for c in label_columns], axis=1)
    if mat.size and not np.isin(mat, (0, 1)).all():
        bad = [c for j, c in enumerate(label_columns) if not np.isin(mat[:, j], (0, 1)).all()]
        raise ValueError(f"{origin}: label columns {bad[:10]} of split {split!r} hold values other than 0/1")
    rows_idx, cols_idx = np.nonzero(mat.astype(bool))
    return [c.tolist() for c in np.split(cols_idx, np.searchsorted(rows_idx, np.arange(1, len(ds))))]


def _ids_of_given_names(tokens: dict[str, list[list[Any]]], names: list[str]) -> dict[str, list[list[Any]]]:
    """Delimited numbers read as ids of the given label names, where they are not names themselves and every
    one is an id of them (``0 <= id < len(names)``); else the tokens as they are (names)."""
    known = set(names)
    flat = [t for rows in tokens.values() for r in rows for t in r]
    if (
        not flat
        or all(t in known for t in flat)
        or not all(is_int_token(t) and 0 <= int(t) < len(names) for t in flat)
    ):
        return tokens
    return {s: [[int(t) for t in r] for r in rows] for s, rows in tokens.items()}


def _check_id_range(ids: list[int], origin: str) -> None:
    """ValueError in one line when fewer than half of the label ids ``0 .. max id`` occur in train (a stray id, or
    numeric codes that are names): most of the label space would be labels without a training row, each an F1
    of 0 in every macro average. A warning counts the ids without a row where at least half occur."""
    largest, used = max(ids), len(set(ids))
    if 2 * used < largest + 1:
        raise ValueError(
            f"{origin}: the label ids reach {largest} but only {used} distinct ids occur in train, so the label space "
            f"(0 .. {largest}) would be mostly labels without a row; if the numbers are label names (codes), use "
            "label_format='names' or 'delimited', else pass label_names= (a list or file; --label_names_file)"
        )
    if used < largest + 1:
        logger.warning(
            "%s: %d of the label ids 0 .. %d have no train row (%s); each counts an F1 of 0 in the macro averages",
            origin,
            largest + 1 - used,
            largest,
            ", ".join(map(str, sorted(set(range(largest + 1)) - set(ids))[:10])),
        )


def _check_joined_names(names: list[str], origin: str) -> None:
    """ValueError in one line when a label of the train union, read from plain cells in which no separator was
    found, is other labels joined by one character (with labels ``a`` and ``b``, a label ``a/b`` or ``a b``):
    rows that hold several labels with a separator the detection does not know, which would otherwise train as
    labels of their own."""
    known = set(names)
    for name in names:
        for char in sorted({c for c in name if not (c.isalnum() or c in "-_.'")}):
            parts = [p.strip() for p in name.split(char)]
            if len(parts) > 1 and all(p in known for p in parts):
                raise ValueError(
                    f"{origin}: the label {name!r} is the labels {parts} joined by {char!r}; if rows hold several "
                    f"labels that way pass label_separator={char!r} (--label_separator), else label_format='names' "
                    "(one label per cell) or the labels with label_names= (a list or file; --label_names_file)"
                )


def _warn_inseparable(rows: list[list[Any]], origin: str) -> None:
    """A warning naming train cells that the detected ``,`` splits into labels which never occur apart (every
    row holding one holds all of them, and no other label): a name with a comma ("Clothing, Shoes & Jewelry")
    more likely than labels that always come together."""
    together: dict[Any, set[tuple]] = collections.defaultdict(set)
    for row in rows:
        for token in row:
            together[token].add(tuple(sorted(map(str, row))))
    inseparable = sorted(
        {group for groups in together.values() for group in groups if len(group) > 1}
        - {group for groups in together.values() if len(groups) > 1 for group in groups}
    )
    if inseparable:
        logger.warning(
            "%s: the label separator ',' (detected) splits cells such as %r into labels that never occur "
            "apart (%d combination%s of them); if such a cell is one label, pass label_format='names' (one label "
            "per cell) or another label_separator",
            origin,
            ", ".join(inseparable[0]),
            len(inseparable),
            "" if len(inseparable) == 1 else "s",
        )


def _warn_case_variants(names: list[str], origin: str) -> None:
    """A warning naming label names that differ only in case, surrounding spaces or Unicode form ("Sports" /
    "sports", "café" composed / decomposed): each is a label of its own, which a typo in the data usually is not
    meant to be."""
    groups = collections.defaultdict(list)
    for name in names:
        groups[unicodedata.normalize("NFKC", name).strip().casefold()].append(name)
    variants = [group for group in groups.values() if len(group) > 1]
    if variants:
        logger.warning(
            "%s: %d label names differ only in case, spaces or Unicode form, e.g. %s; each is a label of its own "
            "(fix the data, or pass label_names= to fix the label space)",
            origin,
            sum(len(g) for g in variants),
            " / ".join(map(repr, variants[0])),
        )


def _train_label_space(
    tokens: dict[str, list[list[Any]]], origin: str, unknown_labels: str
) -> tuple[list[str], str]:
    """The label names when none were given: ``"0" .. max id`` for integer ids, else the sorted union of the
    train labels; a label of another split outside it is a ValueError (unless ``unknown_labels="drop"``)."""
    train_tokens = [t for r in tokens["train"] for t in r]
    names_origin = "the sorted union of the train labels"
    if train_tokens and all(isinstance(t, int) for t in train_tokens):
        _check_id_range(train_tokens, origin)
        names = [str(i) for i in range(max(train_tokens) + 1)]
        names_origin = "the integer ids of the train split (0 .. max)"
    else:
        names = sorted({str(t) for t in train_tokens})
        _warn_case_variants(names, origin)
    if not names:
        raise ValueError(f"{origin}: the train split holds no labels; check label_column/label_format")
    known = set(names)

    def unseen(t: Any) -> bool:
        return t >= len(names) if isinstance(t, int) else str(t) not in known

    outside = {
        s: sorted({t for r in rows for t in r if unseen(t)}, key=str)
        for s, rows in tokens.items()
        if s != "train"
    }
    outside = {s: v for s, v in outside.items() if v}
    if outside and unknown_labels == "error":
        raise ValueError(
            f"labels seen only outside train: {outside}. The label space is the union of the train labels; "
            "pass label_names= (a list or file; --label_names_file) to include them, or unknown_labels='drop' "
            "(--unknown_labels drop) to drop them"
        )
    return names, names_origin
