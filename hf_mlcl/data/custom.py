"""Bring your own multi-label dataset: a Hub id, local files, or an in-memory ``Dataset`` / ``DatasetDict``.

:func:`load_custom_dataset` turns any of these into the registry's schema (``text`` + ``labels`` as
``Sequence(ClassLabel)``), carving missing validation / test splits (:func:`carve_split`) and recording it
(:func:`data_notes`).

References: iterative stratification, Sechidis et al. 2011.
Design: docs/design.md, "Your own dataset (hf_mlcl/data/custom.py)".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from hf_mlcl.data._io import check_csv_fields, check_utf8
from hf_mlcl.data.label_formats import (
    LABEL_FORMATS,
    UNKNOWN_LABELS,
    binary_columns,
    classlabel_names,
    column,
    column_np,
    detect_format,
    encode_rows,
    is_int_token,
    names_from_file,
    row_tokens,
    separators_in,
    superseded_label_keys,
)
from hf_mlcl.data.registry import (
    SPLIT_ALIASES,
    build_split,
    carve_validation,
    normalize_splits,
    register_source_loader,
)
from hf_mlcl.data.stratify import SPLIT_STRATEGIES, stratified_carve

logger = logging.getLogger(__name__)

FILE_FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_FORMAT_NAMES = {"csv", "tsv", "json", "jsonl", "parquet"}
_TEXT_FILES = (".csv", ".tsv", ".json", ".jsonl", ".txt")
_NOTE_PREFIX = "hf_mlcl: "

__all__ = [
    "CUSTOM_OPTIONS",
    "LABEL_FORMATS",
    "check_splits",
    "data_notes",
    "is_custom_source",
    "load_custom_dataset",
    "superseded_label_keys",
]


# ---------------------------------------------------------------------------------------------- sources
def is_custom_source(source: Any, data_files: Any = None) -> bool:
    """True for what :func:`load_custom_dataset` reads: a Dataset / DatasetDict, a path that exists,
    a format name with ``data_files``, or a Hub id (``owner/name``)."""
    if isinstance(source, (Dataset, DatasetDict, os.PathLike)):
        return True
    if not isinstance(source, str):
        return False
    return (
        data_files is not None
        or os.path.exists(source)
        or "/" in source
        or os.path.splitext(source)[1].lower() in FILE_FORMATS
    )


def _split_key(name: str) -> str | None:
    return SPLIT_ALIASES.get(str(name).lower())


def _normalise_dict(raw: Mapping[str, Dataset], what: str) -> DatasetDict:
    """Rename split aliases (dev/val -> validation); unknown split names are an error naming them."""
    out: dict[str, Dataset] = {}
    for name, ds in raw.items():
        key = _split_key(name)
        if key is None:
            raise ValueError(
                f"{what}: split {name!r} is not one of train / validation (val, dev, valid) / test; "
                f"rename it or pick the splits you need (splits: {list(raw)})"
            )
        if key in out:
            raise ValueError(f"{what}: splits {sorted(raw)} give two {key!r} splits; keep one")
        out[key] = ds
    return DatasetDict(out)


def _file_builder(path: str) -> tuple[str, dict[str, Any]]:
    ext = os.path.splitext(path)[1].lower()
    if ext not in FILE_FORMATS:
        raise ValueError(
            f"{path}: unsupported file type {ext or '(none)'!r}; use one of {sorted(FILE_FORMATS)}"
        )
    builder = FILE_FORMATS[ext]
    extra: dict[str, Any] = {}
    if builder == "csv":
        # na_filter=False: a text "NA" or "None" stays a string, an empty cell is "" (not NaN)
        extra = {"sep": "\t" if ext == ".tsv" else ",", "na_filter": False}
    return builder, extra


def _load_files(files: Mapping[str, str | Sequence[str]], base: str | None) -> DatasetDict:
    """One ``datasets.load_dataset(<csv|json|parquet>, data_files=...)`` call per split."""
    from datasets import load_dataset

    out: dict[str, Dataset] = {}
    for split, paths in files.items():
        paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
        paths = [os.fspath(p) if base is None or os.path.isabs(p) else os.path.join(base, p) for p in paths]
        builders = []
        for path in paths:
            if not os.path.isfile(path):
                raise FileNotFoundError(f"data file {path!r} for split {split!r} does not exist")
            if os.path.getsize(path) == 0:
                raise ValueError(
                    f"data file {path!r} for split {split!r} is empty (0 bytes); write a header row "
                    "(e.g. text,labels) and at least one data row"
                )
            builders.append(_file_builder(path))
            if path.lower().endswith(_TEXT_FILES):
                check_utf8(path)
            if builders[-1][0] == "csv":
                check_csv_fields(path, builders[-1][1]["sep"])
        if len({b for b, _ in builders}) > 1:
            raise ValueError(f"split {split!r} mixes file types {sorted(paths)}; use one format per split")
        builder, extra = builders[0]
        try:
            out[split] = load_dataset(builder, data_files={"train": paths}, split="train", **extra)
        except ValueError as err:
            if "no data" not in str(err):
                raise
            raise ValueError(
                f"data_files: split(s) [{split!r}] are empty ({paths} hold no rows); fix the files, or drop the "
                "split so it is carved from train (validation) or skipped (test)"
            ) from err
        except DatasetGenerationError as err:  # the reader's own error (a malformed row ...), in one line
            cause = err.__cause__ or err
            reason = " ".join(str(cause).split()) or type(cause).__name__
            raise ValueError(f"could not read {paths} ({split!r} split) as {builder}: {reason}") from err
    return _normalise_dict(out, "data_files")


def _load_folder_or_hub(source: str, config_name: str | None, revision: str | None) -> DatasetDict:
    """``datasets.load_dataset(source, config_name)``: a Hub id, or a local folder read the same way."""
    from datasets import load_dataset, load_from_disk

    if os.path.isdir(source):
        if any(os.path.isfile(os.path.join(source, f)) for f in ("dataset_dict.json", "state.json")):
            loaded = load_from_disk(source)
            return _normalise_dict(loaded if isinstance(loaded, DatasetDict) else {"train": loaded}, source)
        for dirpath, _dirs, files in os.walk(source):
            for f in files:
                if f.lower().endswith(_TEXT_FILES):
                    check_utf8(os.path.join(dirpath, f))
                if f.lower().endswith((".csv", ".tsv")):
                    check_csv_fields(os.path.join(dirpath, f), "\t" if f.lower().endswith(".tsv") else ",")
    try:
        loaded = load_dataset(source, config_name, revision=revision)
    except (FileNotFoundError, ValueError, ConnectionError) as err:
        where = "local folder" if os.path.isdir(source) else "Hub dataset"
        raise ValueError(
            f"could not load {where} {source!r}"
            + (f" (config {config_name!r})" if config_name else "")
            + f": {err}. For a Hub dataset check the id and config name and that the Hub is reachable "
            "(HF_HUB_OFFLINE / HF_DATASETS_OFFLINE unset) or cached; for local files pass the file path "
            "or data_files={'train': ..., 'test': ...}"
        ) from err
    if isinstance(loaded, Dataset):
        loaded = DatasetDict({"train": loaded})
    return _normalise_dict(loaded, source)


def _read_source(source, data_files, config_name, revision, data_dir) -> tuple[DatasetDict, str]:
    """The raw splits of ``source`` and a short description of where they came from."""
    if isinstance(source, DatasetDict):
        return _normalise_dict(source, "DatasetDict"), "an in-memory DatasetDict"
    if isinstance(source, Dataset):
        return DatasetDict({"train": source}), "an in-memory Dataset (train split)"
    source = os.fspath(source)
    if data_files is not None:
        if isinstance(data_files, (str, os.PathLike)) or (
            isinstance(data_files, Sequence) and not isinstance(data_files, Mapping)
        ):
            data_files = {"train": data_files}
        return _load_files(dict(data_files), data_dir), f"data_files {dict(data_files)}"
    path = source if os.path.isabs(source) or data_dir is None else os.path.join(data_dir, source)
    if os.path.isfile(path):
        return _load_files({"train": path}, None), f"file {source}"
    if source.lower() in _FORMAT_NAMES:
        raise ValueError(
            f"dataset {source!r} needs data_files, e.g. data_files={{'train': 'train.{source}'}}"
        )
    if os.path.splitext(source)[1].lower() in FILE_FORMATS and not os.path.exists(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    if os.path.isdir(path):
        return _load_folder_or_hub(path, config_name, revision), f"folder {source}"
    return _load_folder_or_hub(source, config_name, revision), f"Hub dataset {source}" + (
        f" ({config_name})" if config_name else ""
    )


# ---------------------------------------------------------------------------------------------- labels
def _drop_empty_texts(raw: DatasetDict, text_column: str, origin: str) -> DatasetDict:
    """The splits without the rows whose text is empty or blank (``""``, spaces, a missing cell): such a row
    gives the encoder nothing but its special tokens, so it is dropped, with one warning that counts the rows
    of every split (before any label is read, so a label seen only on such rows never enters the label space)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    out, dropped = {}, {}
    for split, ds in raw.items():
        if text_column not in ds.column_names or not len(ds):
            out[split] = ds
            continue
        col = ds.with_format("arrow")[text_column]
        if not (
            pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)
        ):
            out[split] = ds  # not text at all: the check below names the row
            continue
        blank = (
            pc.fill_null(pc.equal(pc.utf8_trim_whitespace(col), ""), True)
            if not pa.types.is_null(col.type)
            else pa.array([True] * len(col))
        )
        empty = np.flatnonzero(np.asarray(blank.to_numpy(zero_copy_only=False), dtype=bool))
        if len(empty):
            dropped[split] = len(empty)
            out[split] = ds.select(np.setdiff1d(np.arange(len(ds)), empty))
        else:
            out[split] = ds
    if dropped:
        counts = ", ".join(f"{split} {n}" for split, n in dropped.items())
        logger.warning(
            "%s: dropped %d row(s) with empty text (%s); fill in their text to keep them",
            origin,
            sum(dropped.values()),
            counts,
        )
    return DatasetDict(out)


# ---------------------------------------------------------------------------------------------- splits
def _note(ds: Dataset, text: str) -> None:
    ds.info.description = (ds.info.description or "") + _NOTE_PREFIX + text + "\n"


def data_notes(dataset: DatasetDict | Dataset) -> list[str]:
    """The provenance notes hf_mlcl recorded on the splits (e.g. "validation: carved from train ...")."""
    parts = dataset.values() if isinstance(dataset, DatasetDict) else [dataset]
    notes = []
    for ds in parts:
        for line in (ds.info.description or "").splitlines():
            if line.startswith(_NOTE_PREFIX) and line[len(_NOTE_PREFIX) :] not in notes:
                notes.append(line[len(_NOTE_PREFIX) :])
    return notes


def carve_split(
    dd: DatasetDict, new: str, fraction: float, seed: int, strategy: str = "random"
) -> DatasetDict:
    """Move a seeded ``fraction`` of train into split ``new`` (logged and recorded with the split): rows
    drawn at random, or by iterative stratification of the labels (``strategy="stratified"``)."""
    if strategy not in SPLIT_STRATEGIES:
        raise ValueError(f"split_strategy must be one of {SPLIT_STRATEGIES}; got {strategy!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(
            f"{new}_fraction must lie in (0, 1) to carve a {new} split from train; got {fraction}"
        )
    train = dd["train"]
    n_new = int(round(len(train) * fraction))
    if n_new < 1 or len(train) - n_new < 1:
        raise ValueError(
            f"cannot carve a {new} split ({fraction:.0%}) from a train split of {len(train)} rows; "
            f"add a {new} file/split or more training rows"
        )
    if strategy == "stratified":
        rows = train.with_format("arrow")["labels"].to_pylist()
        keep, carved = stratified_carve(rows, fraction, seed, len(train.features["labels"].feature.names))
        n_new = len(carved)
        if n_new < 1 or len(keep) < 1:
            raise ValueError(
                f"the stratified carve of a {new} split ({fraction:.0%}) from {len(train)} train rows leaves one side "
                f"empty; add a {new} file/split or more training rows, or use split_strategy='random'"
            )
        how = ", stratified by label (iterative stratification)"
    else:
        keep, carved = carve_validation(
            len(train), n_new, seed, f"{new} split"
        )  # the registry's seeded carve
        how = ""
    text = (
        f"{new}: carved from train ({n_new} of {len(train)} rows, {new}_fraction={fraction}, "
        f"seed={seed}{how}); train keeps {len(train) - n_new} rows"
    )
    logger.info("no %s split: %s", new, text)
    out = dict(dd)
    out["train"], out[new] = train.select(keep), train.select(carved)  # file order kept in both
    _note(out[new], text)
    _note(out["train"], text)
    return DatasetDict(out)


def check_splits(dd: DatasetDict, what: str = "dataset") -> None:
    """ValueError naming every empty split (before any training starts)."""
    empty = [s for s, ds in dd.items() if len(ds) == 0]
    if empty:
        raise ValueError(
            f"{what}: split(s) {empty} are empty (sizes: { {s: len(ds) for s, ds in dd.items()} }); "
            "fix the files, or drop the split so it is carved from train (validation) or skipped (test)"
        )


# ---------------------------------------------------------------------------------------------- main
# the options of load_custom_dataset beyond the source (the one list: the registry refuses them for a registered
# name, DataArguments hands them over, hf-mlcl's --key flags spell them)
CUSTOM_OPTIONS = (
    "data_files",
    "config_name",
    "revision",
    "text_column",
    "label_column",
    "label_columns",
    "label_format",
    "label_separator",
    "label_names",
    "unknown_labels",
    "validation_fraction",
    "test_fraction",
    "split_seed",
    "split_strategy",
)


@dataclass
class _Layout:
    """How the label column(s) of a source are read: the format (with its separator), the label column or
    the 0/1 label columns, and the label names with where they come from (None: the train union, later)."""

    fmt: str
    sep: str | None
    label_column: str | None
    label_columns: list[str] | None
    names: list[str] | None
    names_origin: str


@register_source_loader(is_custom_source, options=CUSTOM_OPTIONS)
def load_custom_dataset(
    source: Any,
    *,
    data_files: Any = None,
    data_dir: str | os.PathLike | None = None,
    config_name: str | None = None,
    revision: str | None = None,
    text_column: str = "text",
    label_column: str | None = None,
    label_columns: Sequence[str] | str | None = None,
    label_format: str = "auto",
    label_separator: str | None = None,
    label_names: Sequence[str] | str | None = None,
    unknown_labels: str = "error",
    validation_fraction: float = 0.1,
    test_fraction: float = 0.0,
    split_seed: int = 42,
    split_strategy: str = "random",
    splits: Sequence[str] | str | None = None,
) -> DatasetDict:
    """Load any multi-label text dataset into ``text`` + ``labels`` (``Sequence(ClassLabel)``) splits.

    See the module docstring for the sources and the split rules, :mod:`hf_mlcl.data.label_formats` for the
    label formats. ``label_column`` defaults to ``"labels"`` or ``"label"`` (whichever exists; none, or ``""``
    -> one 0/1 column per label); ``label_columns`` may be a list or a comma-separated string. ``splits``
    keeps only those splits (default: every split present, with validation carved when missing). Takes the
    options of :data:`CUSTOM_OPTIONS`.
    """
    if label_format not in LABEL_FORMATS:
        raise ValueError(f"label_format must be one of {LABEL_FORMATS}; got {label_format!r}")
    if unknown_labels not in UNKNOWN_LABELS:
        raise ValueError(f"unknown_labels must be one of {UNKNOWN_LABELS}; got {unknown_labels!r}")
    if split_strategy not in SPLIT_STRATEGIES:
        raise ValueError(f"split_strategy must be one of {SPLIT_STRATEGIES}; got {split_strategy!r}")
    if isinstance(label_columns, str):
        label_columns = [c.strip() for c in label_columns.split(",") if c.strip()]
    data_dir = os.fspath(data_dir) if data_dir is not None else None
    raw, origin = _read_source(source, data_files, config_name, revision, data_dir)
    if "train" not in raw:
        raise ValueError(f"{origin} has no train split (splits: {list(raw)}); name one file/split 'train'")
    cols = list(raw["train"].column_names)
    if text_column not in cols:
        raise ValueError(f"{origin}: no text column {text_column!r} (columns: {cols}); set text_column=")
    raw = _drop_empty_texts(raw, text_column, origin)
    layout = _label_layout(
        raw["train"],
        origin,
        text_column,
        label_column,
        label_columns,
        label_format,
        label_separator,
        label_names,
    )
    order = ["train"] + [s for s in ("validation", "test") if s in raw]
    encoded, names, names_origin = _label_ids(raw, order, layout, origin, text_column, unknown_labels)
    out = {}
    for split in order:
        texts = column(raw[split], text_column)
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"{origin}: split {split!r} row {bad} has text {texts[bad]!r}, not a string")
        out[split] = build_split(texts, encoded[split], names)
    dd = DatasetDict(out)
    logger.info(
        "loaded %s: %s, %d labels from %s (format %s)",
        origin,
        {s: len(d) for s, d in dd.items()},
        len(names),
        names_origin,
        layout.fmt,
    )
    check_splits(dd, origin)
    return _carved_and_selected(
        dd, origin, validation_fraction, test_fraction, split_seed, split_strategy, splits
    )


def _label_layout(
    train: Dataset,
    origin: str,
    text_column: str,
    label_column: str | None,
    label_columns,
    label_format: str,
    label_separator: str | None,
    label_names,
) -> _Layout:
    """The :class:`_Layout` of a source from its train split and the options: the label names of a file / list
    (else a ClassLabel feature, else the 0/1 columns' names, else later the train union), the label column
    (``""``: one 0/1 column per label; default ``labels`` / ``label``), the format (``"auto"``:
    :func:`~hf_mlcl.data.label_formats.detect_format`)."""
    cols = list(train.column_names)
    names: list[str] | None = None
    names_origin = "the sorted union of the train labels"
    if isinstance(label_names, (str, os.PathLike)):
        names, names_origin = names_from_file(os.fspath(label_names)), f"label_names file {label_names}"
    elif label_names is not None:
        names, names_origin = [str(n) for n in label_names], "the given label_names"
    if label_column == "":  # "no label column": one 0/1 column per label
        if label_format not in ("auto", "columns"):
            raise ValueError(
                f"label_column='' (no label column) reads one 0/1 column per label, but label_format is "
                f"{label_format!r}; pass label_format='columns' or name the label column"
            )
        label_column, label_format = None, "columns"
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
        if not label_columns:
            label_columns = list(names) if names is not None else binary_columns(train, {text_column})
            if not label_columns:
                raise ValueError(
                    f"{origin}: found no label column ('labels'/'label') and no 0/1 columns; "
                    f"set label_column= or label_columns= (columns: {cols})"
                )
            if names is None:
                logger.warning("one 0/1 column per label, detected: %s", label_columns)
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
    return _Layout(
        fmt, sep, label_column, list(label_columns) if label_columns else None, names, names_origin
    )


def _label_ids(
    raw: DatasetDict, order: list[str], layout: _Layout, origin: str, text_column: str, unknown_labels: str
) -> tuple[dict[str, list[list[int]]], list[str], str]:
    """Every split's rows as label ids, the label names and where they come from. One 0/1 column per label:
    the columns' non-zeros; a label column: its tokens (:func:`~hf_mlcl.data.label_formats.row_tokens`) in
    the label space, which is the train union when no names were given (a label seen only outside train is
    an error naming it, or dropped with ``unknown_labels="drop"``)."""
    encoded: dict[str, list[list[int]]] = {}
    tokens: dict[str, list[list[Any]]] = {}
    for split in order:
        ds = raw[split]
        if text_column not in ds.column_names:
            raise ValueError(f"{origin}: split {split!r} has no text column {text_column!r}")
        if layout.fmt == "columns":
            encoded[split] = _column_label_ids(ds, layout.label_columns, origin, split)
        else:
            if layout.label_column not in ds.column_names:
                raise ValueError(f"{origin}: split {split!r} has no label column {layout.label_column!r}")
            tokens[split] = row_tokens(column(ds, layout.label_column), layout.fmt, layout.sep)
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
    if names is not None and layout.fmt == "delimited":
        tokens = _ids_of_given_names(tokens, names)
    if names is None:
        names, names_origin = _train_label_space(tokens, origin, unknown_labels)
    for split, rows in tokens.items():
        encoded[split], _ = encode_rows(rows, names, split, unknown_labels, names_origin)
    return encoded, names, names_origin


def _column_label_ids(ds: Dataset, label_columns: list[str], origin: str, split: str) -> list[list[int]]:
    """The label ids of every row of ``ds`` from its 0/1 label columns (ValueError naming other values)."""
    absent = [c for c in label_columns if c not in ds.column_names]
    if absent:
        raise ValueError(f"{origin}: split {split!r} lacks label columns {absent}")
    if not len(ds):
        return []
    mat = np.stack([column_np(ds, c) for c in label_columns], axis=1)
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
    """ValueError in one line when integer label ids span a range far larger than the labels they use (a stray
    id, or numeric codes that are names): the label space would be ``0 .. max id``."""
    largest, used = max(ids), len(set(ids))
    if largest + 1 > 2 * used + 1000:
        raise ValueError(
            f"{origin}: the label ids reach {largest} but only {used} distinct ids occur, so the label space would "
            f"hold {largest + 1} labels; if the numbers are label names (codes), use label_format='names' or "
            "'delimited', else pass label_names= (a list or file)"
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
            "pass label_names= (a list or file) to include them, or unknown_labels='drop' to drop them"
        )
    return names, names_origin


def _carved_and_selected(
    dd: DatasetDict,
    origin: str,
    validation_fraction: float,
    test_fraction: float,
    split_seed: int,
    split_strategy: str,
    splits,
) -> DatasetDict:
    """A missing validation split carved from train (a test split too with ``test_fraction``; at random or
    stratified, ``split_strategy``), then only the ``splits`` asked for (ValueError naming one that does not
    exist)."""
    wanted = normalize_splits(splits) if splits is not None else None
    if "validation" not in dd and (wanted is None or "validation" in wanted):
        dd = carve_split(dd, "validation", validation_fraction, split_seed, split_strategy)
    if "test" not in dd and test_fraction and (wanted is None or "test" in wanted):
        dd = carve_split(dd, "test", test_fraction, split_seed, split_strategy)
    if wanted is not None:
        absent = [s for s in wanted if s not in dd]
        if absent:
            raise ValueError(f"{origin}: no {absent} split(s) (splits: {list(dd)})")
        dd = DatasetDict({s: dd[s] for s in wanted})
    return dd
