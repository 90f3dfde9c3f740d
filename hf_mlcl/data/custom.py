"""Bring your own multi-label dataset: a Hub id, local files, or an in-memory ``Dataset`` / ``DatasetDict``.

:func:`load_custom_dataset` turns any of these into the registry's schema (``text`` + ``labels`` as
``Sequence(ClassLabel)``, see :mod:`hf_mlcl.data.registry`); ``load_mlc_dataset`` calls it for every
source that is not a registered name. Sources:

* an in-memory ``datasets.Dataset`` (taken as the train split) or ``DatasetDict``;
* a local file (``.csv`` / ``.tsv`` / ``.json`` / ``.jsonl`` / ``.parquet``: the train split, the
  validation split is carved from it), ``data_files={"train": ..., "validation": ..., "test": ...}``
  (one file per split; the source may then be the format name ``"csv"`` ...), a folder saved with
  ``save_to_disk``, or any other folder, which goes to ``datasets.load_dataset`` exactly like a Hub id
  (so a Hub-shaped folder — ``data/train-*.parquet``, README ``configs:`` — loads offline);
* a Hub dataset id (``"owner/name"``, with ``config_name``) through ``datasets.load_dataset``.

Label formats (``label_format``; ``"auto"`` detects them from the features and the train values):

* ``"names"``: a list of label names per row (or one name per row);
* ``"ids"``: a list of integer ids per row (or one id), indices into the label names;
* ``"delimited"``: one string per row, e.g. ``"cs.AI;cs.LG"`` (``label_separator``, default: the first
  of ``;`` ``|`` ``,`` found in the train values); tokens that are all integers are read as ids;
* ``"columns"``: one 0/1 column per label, as the raw GoEmotions release is (``label_columns``, or the
  ``label_names``, or every other integer column of the train split holding only 0 and 1; boolean
  columns — often flags such as GoEmotions' ``example_very_unclear`` — are taken only when named).

A text cell written as a list — ``[8, 20]``, ``["sports", "politics"]`` (JSON) or ``['sports', 'politics']``
(Python, as pandas writes lists into a CSV) — is read as that list in every format; ``"auto"`` reads a
string column whose cells are all lists as ids (integer items) or names (string items). Where the train
cells leave the format open (list and plain cells mixed, ids and names mixed, a ``[...]`` cell that is no
list, two separators in one column, names that would carry brackets or quotes), ``"auto"`` stops with a
ValueError naming the cell and the choices (:func:`_detect_format`, the one place the format is decided).

Label names come from a ``ClassLabel`` feature, from ``label_names`` (a list or a file with one name per
line), or are the sorted union of what the train split holds (for integer ids without names:
``"0" .. str(max id)``). A label seen only outside train — or outside the given names — is an error
that names it; ``unknown_labels="drop"`` drops it with a warning instead.

A missing validation split is carved from train (``validation_fraction``, seeded by ``split_seed``),
logged and recorded with the split (:func:`data_notes`) so the model card states it; a missing test
split stays missing (no test metrics) unless ``test_fraction`` > 0 carves one too. ``split_strategy``
chooses the carve: ``"random"`` (default, a seeded random share) or ``"stratified"`` (iterative
stratification, Sechidis et al. 2011, :mod:`hf_mlcl.data.stratify`: every label, rare ones included,
gets close to its share of rows in the carved split). Empty splits and
non-UTF-8 text files are clear errors that name the split or the file and line.
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
from datasets import ClassLabel, Dataset, DatasetDict, Value

from hf_mlcl.data._io import check_utf8, split_labels
from hf_mlcl.data.registry import (
    SPLIT_ALIASES,
    build_split,
    carve_validation,
    normalize_splits,
    read_lines,
    register_source_loader,
)
from hf_mlcl.data.stratify import SPLIT_STRATEGIES, stratified_carve

logger = logging.getLogger(__name__)

LABEL_FORMATS = ("auto", "names", "ids", "delimited", "columns")
UNKNOWN_LABELS = ("error", "drop")
FILE_FORMATS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}
_FORMAT_NAMES = {"csv", "tsv", "json", "jsonl", "parquet"}
_TEXT_FILES = (".csv", ".tsv", ".json", ".jsonl", ".txt")
_NOTE_PREFIX = "hf_mlcl: "
_SEPARATORS = (";", "|", ",")
_ID_SPLIT = re.compile(r"[;|,\s]+")  # a plain cell of label_format="ids": "8;20", "8, 20", "8 20"

__all__ = [
    "load_custom_dataset", "is_custom_source", "data_notes", "LABEL_FORMATS", "check_splits", "superseded_label_keys",
]  # fmt: skip


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
            builders.append(_file_builder(path))
            if path.lower().endswith(_TEXT_FILES):
                check_utf8(path)
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
        raise ValueError(f"dataset {source!r} needs data_files, e.g. data_files={{'train': 'train.{source}'}}")
    if os.path.splitext(source)[1].lower() in FILE_FORMATS and not os.path.exists(path):
        raise FileNotFoundError(f"data file {path!r} does not exist")
    if os.path.isdir(path):
        return _load_folder_or_hub(path, config_name, revision), f"folder {source}"
    return _load_folder_or_hub(source, config_name, revision), f"Hub dataset {source}" + (
        f" ({config_name})" if config_name else ""
    )


# ---------------------------------------------------------------------------------------------- labels
def _inner(feature):
    """The item feature of a list feature (``List`` / ``Sequence`` / ``[feature]``), else None."""
    if isinstance(feature, list):
        return feature[0] if feature else None
    return getattr(feature, "feature", None)


def _classlabel_names(feature) -> list[str] | None:
    if isinstance(feature, ClassLabel):
        return list(feature.names)
    inner = _inner(feature)
    return list(inner.names) if isinstance(inner, ClassLabel) else None


def _column(ds: Dataset, name: str) -> list:
    """A column as a Python list, read through Arrow in one go (not row by row)."""
    return ds.with_format("arrow")[name].to_pylist()


def _column_np(ds: Dataset, name: str) -> np.ndarray:
    return np.asarray(ds.with_format("arrow")[name].to_numpy())


def _binary_columns(ds: Dataset, exclude: set[str]) -> list[str]:
    cols = []
    for name, feat in ds.features.items():
        if name in exclude or not isinstance(feat, Value):
            continue
        if not feat.dtype.startswith(("int", "uint")):  # bool columns are usually flags: name them
            continue
        values = _column_np(ds, name)
        if values.size and np.isin(values, (0, 1)).all():
            cols.append(name)
    return cols


def _is_int(token: Any) -> bool:
    if isinstance(token, (bool, np.bool_)):
        return False
    if isinstance(token, (int, np.integer)):
        return True
    return isinstance(token, str) and token.strip().lstrip("-").isdigit()


def _looks_like_list(value: Any) -> bool:
    """A string cell written as a list: ``[8, 20]``, ``["sports", "politics"]``, ``['a', 'b']``."""
    return isinstance(value, str) and value.strip().startswith("[") and value.strip().endswith("]")


def _list_items(text: str) -> list[int | str] | None:
    """The items of a list cell read as JSON or as a Python literal (what ``str(list)`` and pandas
    write), or None when it is not a flat list of ids (int) and names (str)."""
    for parse in (json.loads, ast.literal_eval):
        try:
            items = parse(text.strip())
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        ok = isinstance(items, list) and all(isinstance(x, (int, str)) and not isinstance(x, bool) for x in items)
        return items if ok else None
    return None


def _stray(name: str) -> bool:
    """A label name that reads like a piece of a list or of a quoted string: a bracket, a leading or
    trailing quote, or an unbalanced parenthesis ("(chronic)" and "children's" are fine)."""
    return (
        any(c in name for c in "[]{}")
        or name[:1] in ("'", '"')
        or name[-1:] in ("'", '"')
        or name.count("(") != name.count(")")
    )


def _separators_in(cells) -> list[str]:
    """The label separators (``;`` ``|`` ``,``, in that order of preference) that occur in ``cells``."""
    cells = [c for c in cells if isinstance(c, str)]
    return [s for s in _SEPARATORS if any(s in c for c in cells)]


_CHOICES = ("label_format='names' (one label per cell), label_format='ids', or label_format='delimited' "
            "with label_separator")


def _detect_format(
    ds: Dataset, label_column: str | None, label_columns, label_separator: str | None
) -> tuple[str, str | None]:
    """The label format of ``label_column`` (and the separator of ``delimited``), from its feature type and,
    for a string column, its train cells: the one place ``label_format="auto"`` is decided.

    A string column is either list cells (every non-empty cell ``[...]``: ``ids`` when the items are
    integers, ``names`` when they are strings) or one delimited string per cell (the separator is the one
    of ``;`` ``|`` ``,`` that occurs). Where that is ambiguous — list and plain cells mixed, ids and names
    mixed, a ``[...]`` cell that is not a list, two separators in one column, or names that would carry
    brackets or quotes — a ValueError names the cell and the choices."""
    if label_columns or label_column is None:
        return "columns", None
    feat = ds.features[label_column]
    if _classlabel_names(feat) is not None:
        return "ids", None
    inner = _inner(feat)
    if inner is not None:  # a list column
        return ("ids" if isinstance(inner, Value) and inner.dtype.startswith(("int", "uint")) else "names"), None
    if isinstance(feat, Value) and feat.dtype.startswith(("int", "uint")):
        return "ids", None
    cells = _column(ds, label_column)
    where = f"label column {label_column!r}"
    listed = [i for i, v in enumerate(cells) if _looks_like_list(v)]
    plain = [i for i, v in enumerate(cells) if isinstance(v, str) and v.strip() and not _looks_like_list(v)]
    if listed and plain:
        i, j = listed[0], plain[0]
        raise ValueError(
            f"{where} mixes list cells such as {cells[i]!r} (row {i}) with plain cells such as {cells[j]!r} (row "
            f"{j}); write every cell one way, or choose: label_format='ids' or label_format='names' (a list cell "
            "is read as a list, a plain cell as one label), or label_format='delimited' with label_separator"
        )
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
        seen = _separators_in(cells[i] for i in plain)
        if len(seen) > 1:
            examples = " and ".join(repr(next(cells[i] for i in plain if s in cells[i])) for s in seen[:2])
            raise ValueError(
                f"{where} holds both {seen[0]!r} and {seen[1]!r} (e.g. {examples}), so the label separator is "
                "ambiguous; choose " + " or ".join(f"label_separator={s!r}" for s in seen)
                + ", or label_format='names' (one label per cell)"
            )
        sep = seen[0] if seen else None
    stray = sorted({t for r in _row_tokens(cells, "delimited", sep) for t in r if isinstance(t, str) and _stray(t)})
    if stray:
        raise ValueError(
            f"{where}: reading it as delimited text gives label names such as {stray[0]!r} that carry quotes or "
            'brackets; write list cells as JSON (["cs.LG", "q-bio"] or [8, 20]), or choose ' + _CHOICES
        )
    return "delimited", sep


def _row_tokens(values: Sequence[Any], fmt: str, sep: str | None) -> list[list[Any]]:
    """Per-row label tokens (names as str, ids as int) of one split's label column. A string cell
    written as a list (``[8, 20]``, ``["a", "b"]``) is read as that list in every format."""
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
    if fmt == "ids" or (fmt == "delimited" and rows and all(_is_int(t) for r in rows for t in r) and any(rows)):
        bad = sorted({t for r in rows for t in r if not _is_int(t)})
        if bad:
            raise ValueError(f"label_format='ids' but the label column holds non-integers such as {bad[:5]}")
        rows = [[int(t) for t in r] for r in rows]
    return rows


def _one_column_per_label(options: Mapping[str, Any]) -> bool:
    return (options.get("label_format") == "columns" or bool(options.get("label_columns"))
            or options.get("label_column") == "")  # fmt: skip


def _one_label_column(options: Mapping[str, Any]) -> bool:
    return (bool(options.get("label_column")) or bool(options.get("label_separator"))
            or options.get("label_format") in ("names", "ids", "delimited"))  # fmt: skip


def superseded_label_keys(earlier: Mapping[str, Any], later: Mapping[str, Any]) -> set[str]:
    """The label-layout keys of ``earlier`` (a recipe's, or a base recipe's) that ``later`` (the command
    line, or the recipe built on the base) contradicts, so they must be dropped for ``later`` to win.

    The layout is either one label column (``label_column``, ``label_separator``, ``label_format`` names /
    ids / delimited) or one 0/1 column per label (``label_format: columns``, ``label_columns``, or
    ``label_column: ""`` for "no label column"). A later choice of one drops the earlier keys of the other
    (e.g. ``--label_format columns`` over a recipe's ``label_column: labels``); keys the later side sets
    itself are replaced anyway, and compatible earlier keys stay."""
    drop: set[str] = set()
    if _one_column_per_label(later):
        drop |= {"label_column", "label_separator"}
        if earlier.get("label_format") not in (None, "auto", "columns"):
            drop.add("label_format")
    if _one_label_column(later):
        drop.add("label_columns")
        if earlier.get("label_format") == "columns":
            drop.add("label_format")
    return {k for k in drop if k in earlier and k not in later}


def _names_from_file(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise FileNotFoundError(f"label_names file {path!r} does not exist (one label name per line)")
    check_utf8(path)
    return [n.strip() for n in read_lines(path) if n.strip()]


def _encode(
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
        logger.warning("split %r: dropped labels outside the label space (%s): %s", split, names_origin,
                       sorted(missing, key=str)[:20])
    return out, missing


# ---------------------------------------------------------------------------------------------- splits
def _note(ds: Dataset, text: str) -> None:
    ds.info.description = (ds.info.description or "") + _NOTE_PREFIX + text + "\n"


def data_notes(dataset: DatasetDict | Dataset) -> list[str]:
    """The provenance notes hf_mlcl recorded on the splits (e.g. "validation: carved from train ...")."""
    parts = dataset.values() if isinstance(dataset, DatasetDict) else [dataset]
    notes = []
    for ds in parts:
        for line in (ds.info.description or "").splitlines():
            if line.startswith(_NOTE_PREFIX) and line[len(_NOTE_PREFIX):] not in notes:
                notes.append(line[len(_NOTE_PREFIX):])
    return notes


def carve_split(dd: DatasetDict, new: str, fraction: float, seed: int, strategy: str = "random") -> DatasetDict:
    """Move a seeded ``fraction`` of train into split ``new`` (logged and recorded with the split): rows
    drawn at random, or by iterative stratification of the labels (``strategy="stratified"``)."""
    if strategy not in SPLIT_STRATEGIES:
        raise ValueError(f"split_strategy must be one of {SPLIT_STRATEGIES}; got {strategy!r}")
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"{new}_fraction must lie in (0, 1) to carve a {new} split from train; got {fraction}")
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
        keep, carved = carve_validation(len(train), n_new, seed, f"{new} split")  # the registry's seeded carve
        how = ""
    text = (f"{new}: carved from train ({n_new} of {len(train)} rows, {new}_fraction={fraction}, "
            f"seed={seed}{how}); train keeps {len(train) - n_new} rows")
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
@register_source_loader(is_custom_source)
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

    See the module docstring for the sources, the label formats and the split rules. ``label_column``
    defaults to ``"labels"`` or ``"label"`` (whichever exists; none, or ``""`` -> one 0/1 column per label);
    ``label_columns`` may be a list or a comma-separated string. ``splits`` keeps only those splits
    (default: every split present, with validation carved when missing).
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
    train = raw["train"]
    cols = list(train.column_names)
    if text_column not in cols:
        raise ValueError(f"{origin}: no text column {text_column!r} (columns: {cols}); set text_column=")

    # label names: a file / list, else a ClassLabel feature, else the train union (below)
    names: list[str] | None = None
    names_origin = "the sorted union of the train labels"
    if isinstance(label_names, (str, os.PathLike)):
        names, names_origin = _names_from_file(os.fspath(label_names)), f"label_names file {label_names}"
    elif label_names is not None:
        names, names_origin = [str(n) for n in label_names], "the given label_names"

    if label_column == "":  # "no label column": one 0/1 column per label
        if label_format not in ("auto", "columns"):
            raise ValueError(f"label_column='' (no label column) reads one 0/1 column per label, but label_format is "
                             f"{label_format!r}; pass label_format='columns' or name the label column")
        label_column, label_format = None, "columns"
    if label_column is None and label_format != "columns" and not label_columns:
        label_column = next((c for c in ("labels", "label") if c in cols), None)
        if label_column is None and label_format not in ("auto", "columns"):
            raise ValueError(f"{origin}: no 'labels'/'label' column (columns: {cols}); set label_column=")
    elif label_column is not None and label_column not in cols:
        raise ValueError(f"{origin}: no label column {label_column!r} (columns: {cols}); set label_column=")
    sep = label_separator
    if label_format == "auto":
        fmt, sep = _detect_format(train, label_column, label_columns, label_separator)
    else:
        fmt = label_format
    if fmt == "columns":
        if not label_columns:
            label_columns = list(names) if names is not None else _binary_columns(train, {text_column})
            if not label_columns:
                raise ValueError(f"{origin}: found no label column ('labels'/'label') and no 0/1 columns; "
                                 f"set label_column= or label_columns= (columns: {cols})")
            if names is None:
                logger.warning("one 0/1 column per label, detected: %s", label_columns)
        missing = [c for c in label_columns if c not in cols]
        if missing:
            raise ValueError(f"{origin}: label columns {missing} are missing (columns: {cols})")
        names = [str(c) for c in label_columns] if names is None else names
        names_origin = "the label columns" if label_names is None else names_origin
    elif names is None:
        names = _classlabel_names(train.features[label_column])
        if names is not None:
            names_origin = f"the ClassLabel feature of {label_column!r}"

    if fmt == "delimited" and sep is None:  # label_format="delimited" given, its separator not
        sep = next(iter(_separators_in(_column(train, label_column))), None)

    wanted = normalize_splits(splits) if splits is not None else None
    out: dict[str, Dataset] = {}
    order = ["train"] + [s for s in ("validation", "test") if s in raw]
    encoded: dict[str, list[list[int]]] = {}
    tokens: dict[str, list[list[Any]]] = {}
    for split in order:
        ds = raw[split]
        if text_column not in ds.column_names:
            raise ValueError(f"{origin}: split {split!r} has no text column {text_column!r}")
        if fmt == "columns":
            absent = [c for c in label_columns if c not in ds.column_names]
            if absent:
                raise ValueError(f"{origin}: split {split!r} lacks label columns {absent}")
            mat = np.stack([_column_np(ds, c) for c in label_columns], axis=1) if len(ds) \
                else np.zeros((0, len(label_columns)))
            if mat.size and not np.isin(mat, (0, 1)).all():
                bad = [c for j, c in enumerate(label_columns) if not np.isin(mat[:, j], (0, 1)).all()]
                raise ValueError(f"{origin}: label columns {bad[:10]} of split {split!r} hold values other than 0/1")
            rows_idx, cols_idx = np.nonzero(mat.astype(bool))
            encoded[split] = [c.tolist() for c in np.split(cols_idx, np.searchsorted(rows_idx, np.arange(1, len(ds))))] \
                if len(ds) else []
        else:
            if label_column not in ds.column_names:
                raise ValueError(f"{origin}: split {split!r} has no label column {label_column!r}")
            tokens[split] = _row_tokens(_column(ds, label_column), fmt, sep)

    if fmt != "columns":
        if names is None:
            train_tokens = [t for r in tokens["train"] for t in r]
            if train_tokens and all(isinstance(t, int) for t in train_tokens):
                names = [str(i) for i in range(max(train_tokens) + 1)]
                names_origin = "the integer ids of the train split (0 .. max)"
            else:
                names = sorted({str(t) for t in train_tokens})
            if not names:
                raise ValueError(f"{origin}: the train split holds no labels; check label_column/label_format")
            known = set(names)

            def _unseen(t: Any) -> bool:
                return t >= len(names) if isinstance(t, int) else str(t) not in known

            outside = {s: sorted({t for r in rows for t in r if _unseen(t)}, key=str)
                       for s, rows in tokens.items() if s != "train"}
            outside = {s: v for s, v in outside.items() if v}
            if outside and unknown_labels == "error":
                raise ValueError(
                    f"labels seen only outside train: {outside}. The label space is the union of the train labels; "
                    "pass label_names= (a list or file) to include them, or unknown_labels='drop' to drop them"
                )
        for split, rows in tokens.items():
            encoded[split], _ = _encode(rows, names, split, unknown_labels, names_origin)

    for split in order:
        ds = raw[split]
        texts = _column(ds, text_column)
        bad = next((i for i, t in enumerate(texts) if not isinstance(t, str)), None)
        if bad is not None:
            raise ValueError(f"{origin}: split {split!r} row {bad} has text {texts[bad]!r}, not a string")
        out[split] = build_split(texts, encoded[split], names)
    dd = DatasetDict(out)
    logger.info("loaded %s: %s, %d labels from %s (format %s)", origin,
                {s: len(d) for s, d in dd.items()}, len(names), names_origin, fmt)
    check_splits(dd, origin)
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
