"""Bring your own multi-label dataset: a Hub id, local files, or an in-memory ``Dataset`` / ``DatasetDict``.

:func:`load_custom_dataset` turns any of these into the registry's schema (``text`` + ``labels`` as
``Sequence(ClassLabel)``), carving missing validation / test splits (:func:`carve_split`) and recording it
(:func:`data_notes`); how the label column(s) are read into label ids is :mod:`hf_mlcl.data.custom_labels`.

References: iterative stratification, Sechidis et al. 2011.
Design: docs/design.md, "Your own dataset (hf_mlcl/data/custom.py)".
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from datasets import Dataset, DatasetDict
from datasets.exceptions import DatasetGenerationError

from hf_mlcl.data._io import check_csv_fields, check_utf8
from hf_mlcl.data.custom_labels import label_ids, label_layout
from hf_mlcl.data.label_formats import (
    LABEL_FORMATS,
    UNKNOWN_LABELS,
    column,
    superseded_label_keys,
)
from hf_mlcl.data.registry import (
    SPLIT_ALIASES,
    build_split,
    carve_validation,
    normalize_splits,
    register_source_loader,
)
from hf_mlcl.data.stratify import check_split_strategy, stratified_carve

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

    extra: dict[str, Any] = {}
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
        data = [
            f.lower()
            for _, _, files in os.walk(source)
            for f in files
            if f.lower().endswith(tuple(FILE_FORMATS))
        ]
        if data and all(f.endswith((".csv", ".tsv")) for f in data):
            extra["na_filter"] = False  # as for a single file: a text "NA" or "None" stays a string
    try:
        loaded = load_dataset(source, config_name, revision=revision, **extra)
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
        # relative files: below data_dir, else below a folder given as the source
        base = data_dir if data_dir is not None else (source if os.path.isdir(source) else None)
        folder = os.path.isdir(source) or (
            data_dir is not None and os.path.isdir(os.path.join(data_dir, source))
        )
        if not folder and source.lower() not in _FORMAT_NAMES:
            raise ValueError(
                f"dataset {source!r} is neither a file format ({', '.join(sorted(_FORMAT_NAMES))}) nor a folder, "
                "and data_files names the files to read, so it would be ignored (and named on the model card): "
                "pass the files' format as the dataset (e.g. 'csv') with data_files, or drop data_files (a Hub "
                "dataset is read by its id alone)"
            )
        return _load_files(dict(data_files), base), f"data_files {dict(data_files)}"
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
    dd: DatasetDict,
    new: str,
    fraction: float,
    seed: int,
    strategy: str = "random",
    of_rows: int | None = None,
) -> DatasetDict:
    """Move a seeded ``fraction`` of train into split ``new`` (logged and recorded with the split): rows
    drawn at random, or by iterative stratification of the labels (``strategy="stratified"``). ``of_rows``: the
    row count the fraction is a share of (default: train's; the train split as given, before an earlier carve)."""
    check_split_strategy(strategy)
    if not 0.0 < fraction < 1.0:
        raise ValueError(
            f"{new}_fraction must lie in (0, 1) to carve a {new} split from train; got {fraction}"
        )
    train = dd["train"]
    n_new = int(round((len(train) if of_rows is None else of_rows) * fraction))
    if n_new < 1 or len(train) - n_new < 1:
        raise ValueError(
            f"cannot carve a {new} split ({fraction:.0%}) from a train split of {len(train)} rows; "
            f"add a {new} file/split or more training rows"
        )
    if strategy == "stratified":
        rows = train.with_format("arrow")["labels"].to_pylist()
        share = n_new / len(train)
        keep, carved = stratified_carve(rows, share, seed, len(train.features["labels"].feature.names))
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
    _warn_labels_missing(out["train"], out[new], new, strategy)
    _note(out[new], text)
    _note(out["train"], text)
    return DatasetDict(out)


def _warn_labels_missing(train: Dataset, carved: Dataset, new: str, strategy: str) -> None:
    """Warnings naming the labels of ``train`` that no row of the carved split has (a split macro-F1 counts their
    F1 as 0 whatever the model predicts), and the labels whose every row the carve took (never trained on)."""
    names = getattr(getattr(train.features.get("labels"), "feature", None), "names", None)
    if names is None:  # labels not stored as label ids with names
        return
    seen = {i for row in carved.with_format("arrow")["labels"].to_pylist() for i in row}
    trained = {i for row in train.with_format("arrow")["labels"].to_pylist() for i in row}
    random = strategy == "random"
    for ids, what, hint in (
        (
            seen - trained,
            f"labels have rows only in the carved {new} split (%s); the model never trains on them",
            "keeps them in train",
        ),
        (
            trained - seen,
            f"labels of train have no {new} row (%s); their F1 counts 0 in the {new} macro-F1 whatever the model "
            "predicts",
            "spreads the labels over both",
        ),
    ):
        if ids:
            ids = sorted(ids)
            shown = ", ".join(str(names[i]) for i in ids[:5]) + (" ..." if len(ids) > 5 else "")
            tail = f"; split_strategy='stratified' {hint}" if random else ""
            logger.warning(f"{new}: {len(ids)} " + what % shown + tail)


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
    check_split_strategy(split_strategy)
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
    layout = label_layout(
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
    encoded, names, names_origin = label_ids(raw, order, layout, origin, text_column, unknown_labels)
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
    dd = _carved_and_selected(
        dd, origin, validation_fraction, test_fraction, split_seed, split_strategy, splits
    )
    _warn_texts_in_train(dd, origin)
    return dd


def _warn_texts_in_train(dd: DatasetDict, origin: str) -> None:
    """A warning counting the validation / test rows whose text is also a train text (duplicated rows, or a
    carve of a file with duplicates): their scores are optimistic, and a validation choice leans on them."""
    if "train" not in dd:
        return
    seen = set(column(dd["train"], "text"))
    shared = {}
    for split in ("validation", "test"):
        if split in dd and len(dd[split]):
            count = sum(t in seen for t in column(dd[split], "text"))
            if count:
                shared[split] = f"{count} of {len(dd[split])}"
    if shared:
        logger.warning(
            "%s: rows whose text is also in train: %s; their scores are optimistic (remove the duplicates "
            "from the data to measure on unseen texts)",
            origin,
            ", ".join(f"{split} {n}" for split, n in shared.items()),
        )


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
    exist). Both fractions are shares of the train split as given: 1,000 rows with 0.1 and 0.2 give 700 / 100
    / 200."""
    wanted = normalize_splits(splits) if splits is not None else None
    given = len(dd["train"]) if "train" in dd else None  # both fractions are shares of it
    if "validation" not in dd and (wanted is None or "validation" in wanted):
        dd = carve_split(dd, "validation", validation_fraction, split_seed, split_strategy)
    if "test" not in dd and test_fraction and (wanted is None or "test" in wanted):
        dd = carve_split(dd, "test", test_fraction, split_seed, split_strategy, of_rows=given)
    if wanted is not None:
        absent = [s for s in wanted if s not in dd]
        if absent:
            raise ValueError(f"{origin}: no {absent} split(s) (splits: {list(dd)})")
        dd = DatasetDict({s: dd[s] for s in wanted})
    return dd
