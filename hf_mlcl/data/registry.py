"""Dataset registry and the helpers every loader shares.

Every loader returns a :class:`datasets.DatasetDict` with the splits it was asked for (default
``("train", "validation", "test")``) and at least two columns: ``text`` (str) and ``labels``, a list
of label *ids* stored as ``Sequence(ClassLabel(names=...))`` so the label names travel with the data.
Dense multi-hot vectors are never stored: the collator builds them per batch (MIMIC-IV ICD-10 has
25,230 labels). Loaders may add an ``id`` column (document / admission id) when the source has one.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets import Sequence as HFSequence

SPLITS: tuple[str, ...] = ("train", "validation", "test")
SPLIT_ALIASES = {
    "train": "train",
    "validation": "validation",
    "val": "validation",
    "dev": "validation",
    "valid": "validation",
    "test": "test",
}

# Filled by the loader modules' @register_dataset decorators; the package ``hf_mlcl.data`` imports every
# loader module, and Python runs it before this module, so the registry is complete whenever it is used.
_REGISTRY: dict[str, Callable[..., DatasetDict]] = {}
_ALIASES: dict[str, str] = {}
_HUB_IDS: dict[str, str] = {}  # canonical name -> the dataset's Hub id, where it has one


def register_dataset(
    name: str, *aliases: str, hub_id: str | None = None
) -> Callable[[Callable[..., DatasetDict]], Callable[..., DatasetDict]]:
    """Decorator: register ``fn(data_dir=None, **options) -> DatasetDict`` under ``name`` (+ aliases);
    ``hub_id``: the dataset's id on the Hub, where it has one (model cards name it in their metadata)."""

    def deco(fn: Callable[..., DatasetDict]) -> Callable[..., DatasetDict]:
        key = name.lower()
        if key in _REGISTRY or key in _ALIASES:
            raise ValueError(f"dataset name {name!r} is already registered")
        _REGISTRY[key] = fn
        for alias in aliases:
            _ALIASES[alias.lower()] = key
        if hub_id:
            _HUB_IDS[key] = hub_id
        return fn

    return deco


def registered_dataset(name: Any) -> str | None:
    """The canonical registered name of ``name`` (an alias too, in any case, ``-`` for ``_``), else None."""
    if not isinstance(name, str):
        return None
    key = name.lower().replace("-", "_")
    key = _ALIASES.get(key, _ALIASES.get(name.lower(), key))
    return key if key in _REGISTRY else None


def dataset_hub_id(name: str) -> str | None:
    """The Hub id of the registered dataset ``name``, None where it has none (or ``name`` is not registered)."""
    key = registered_dataset(name)
    return None if key is None else _HUB_IDS.get(key)


# Loaders for sources that are not registered names (files, folders, Hub ids, in-memory datasets):
# (accepts(source, data_files) -> bool, loader(source, data_dir=..., **options)), registered by
# hf_mlcl.data.custom with @register_source_loader, so this module imports no loader; with the options the
# loader takes (which a registered name refuses).
_SOURCE_LOADERS: list[tuple[Callable[..., bool], Callable[..., DatasetDict]]] = []
_SOURCE_OPTIONS: list[str] = []  # in the loader's order


def register_source_loader(
    accepts: Callable[..., bool], options: Sequence[str] = ()
) -> Callable[[Callable[..., DatasetDict]], Callable[..., DatasetDict]]:
    """Decorator: ``load_mlc_dataset`` hands a source that is no registered name to ``fn`` when
    ``accepts(source, data_files)`` is true (see :func:`hf_mlcl.data.custom.load_custom_dataset`); ``options``
    are the keywords ``fn`` takes beyond the source, which a registered dataset refuses."""

    def deco(fn: Callable[..., DatasetDict]) -> Callable[..., DatasetDict]:
        if all(fn is not f for _, f in _SOURCE_LOADERS):
            _SOURCE_LOADERS.append((accepts, fn))
            _SOURCE_OPTIONS.extend(o for o in options if o not in _SOURCE_OPTIONS)
        return fn

    return deco


def list_datasets() -> list[str]:
    """Canonical dataset names, sorted (aliases such as ``"mimic-iii"`` are accepted by the loader)."""
    return sorted(_REGISTRY)


def load_mlc_dataset(name, data_dir: str | os.PathLike | None = None, **options) -> DatasetDict:
    """Load a multi-label text-classification dataset: a registered name, a Hub id, local files, or data.

    ``name`` is one of :func:`list_datasets` (aapd, rcv1, uklex, mimic3, mimic4_icd9, mimic4_icd10,
    goemotions, reuters21578, synthetic) with ``data_dir`` the local folder with its files (see each loader's
    docstring); or anything :func:`hf_mlcl.data.custom.load_custom_dataset` reads — a Hub dataset id
    (``"owner/name"``, ``config_name=``), a local csv / tsv / json / jsonl / parquet file or folder
    (``data_files=`` for one file per split), an in-memory ``Dataset`` / ``DatasetDict`` — with the
    options ``text_column``, ``label_column``, ``label_columns``, ``label_format``, ``label_names``,
    ``unknown_labels``, ``validation_fraction`` ... listed in ``hf_mlcl.data.custom.CUSTOM_OPTIONS``.
    ``options`` go to the loader (all accept ``splits=``).
    Returns a DatasetDict with ``text`` and ``labels`` (``Sequence(ClassLabel)``) columns.
    """
    key = registered_dataset(name)
    if key is None:
        for accepts, loader in _SOURCE_LOADERS:
            if accepts(name, options.get("data_files")):
                unknown = sorted(set(options) - set(_SOURCE_OPTIONS) - {"splits"})
                if unknown:
                    raise ValueError(
                        f"{name}: options {unknown} do not apply to your own data (a file, folder, Hub id or Dataset), "
                        f"which takes {_SOURCE_OPTIONS}; remove them (e.g. --dataset_options '{{}}')"
                    )
                return loader(name, data_dir=data_dir, **options)
        if not isinstance(name, str):
            raise ValueError(
                f"dataset must be a name, a path, a Hub id or a datasets.Dataset/DatasetDict; got {type(name).__name__}"
            )
        raise ValueError(
            f"unknown dataset {name!r}; choose one of {list_datasets()}, a Hub dataset id ('owner/name'), "
            "or a local csv/tsv/json/jsonl/parquet file or folder"
        )
    custom = sorted(k for k in options if k in _SOURCE_OPTIONS)
    if custom:
        raise ValueError(
            f"{key}: options {custom} apply to your own data (a file, folder, Hub id or Dataset), not to the "
            "registered dataset; remove them"
        )
    try:
        return _REGISTRY[key](data_dir=data_dir, **options)
    except UnicodeDecodeError:
        if data_dir is not None and os.path.isdir(data_dir):
            from hf_mlcl.data._io import first_non_utf8

            first_non_utf8(os.fspath(data_dir))  # raises naming the file and line
        raise
    except TypeError as err:
        if "unexpected keyword argument" not in str(err):
            raise
        known = loader_options(_REGISTRY[key])
        raise ValueError(
            f"{key}: {err}{f'; its options are {known}' if known else ''}. See "
            f"help(hf_mlcl.data.{_REGISTRY[key].__module__.rsplit('.', 1)[-1]})"
        ) from err


def loader_options(loader: Callable) -> list[str] | None:
    """The keyword options a registered loader takes (its parameters but ``data_dir``); None for one that
    passes ``**options`` on (its docstring lists them)."""
    import inspect

    params = inspect.signature(loader).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in params if p.kind in kinds and p.name != "data_dir"]


def label_names(dataset) -> list[str]:
    """Label names of a Dataset / DatasetDict, read from its ``labels`` ``Sequence(ClassLabel)`` feature."""
    if isinstance(dataset, DatasetDict):
        if not dataset:
            raise ValueError("label_names: the DatasetDict has no splits")
        dataset = next(iter(dataset.values()))
    features = dataset.features
    if "labels" not in features:
        raise ValueError(f"label_names: no 'labels' column (columns: {list(features)})")
    feat = features["labels"]
    inner = getattr(feat, "feature", feat)
    if not isinstance(inner, ClassLabel):
        raise ValueError(
            f"label_names: the 'labels' column is {feat!r}, not Sequence(ClassLabel); load it with "
            "hf_mlcl.data.load_mlc_dataset or cast it with make_features(names)"
        )
    return list(inner.names)


# ----------------------------------------------------------------------------------------------
# helpers shared by the loaders
# ----------------------------------------------------------------------------------------------


def make_features(names: Sequence[str], with_id: bool = False) -> Features:
    """``Features(text=string, labels=Sequence(ClassLabel(names)), [id=string])``."""
    feats = {"text": Value("string"), "labels": HFSequence(ClassLabel(names=list(names)))}
    if with_id:
        feats["id"] = Value("string")
    return Features(feats)


def normalize_splits(splits: Iterable[str] | str | None) -> tuple[str, ...]:
    """Map user split names (``val``/``dev`` -> ``validation``) and validate them."""
    if splits is None:
        return SPLITS
    if isinstance(splits, str):
        splits = (splits,)
    out = []
    for s in splits:
        key = SPLIT_ALIASES.get(str(s).lower())
        if key is None:
            raise ValueError(f"unknown split {s!r}; use any of {SPLITS} (aliases: val, dev)")
        if key not in out:
            out.append(key)
    if not out:
        raise ValueError(f"splits is empty; use any of {SPLITS}")
    return tuple(out)


def require_dir(data_dir, dataset: str, expected: str) -> str:
    """Check ``data_dir`` is given and exists; otherwise a ValueError that names the expected files."""
    if data_dir is None:
        raise ValueError(
            f"{dataset}: data_dir is required (no local folder given). Expected files: {expected}. "
            f"Pass load_mlc_dataset({dataset!r}, data_dir='/path/to/folder')."
        )
    data_dir = os.fspath(data_dir)
    if not os.path.isdir(data_dir):
        raise FileNotFoundError(
            f"{dataset}: data_dir {data_dir!r} is not a folder. Expected files: {expected}."
        )
    return data_dir


def require_file(data_dir: str, filename: str, dataset: str, split: str | None = None, hint: str = "") -> str:
    """Path of ``data_dir/filename``; FileNotFoundError naming the file, the folder and the fix if absent."""
    path = os.path.join(data_dir, filename)
    if not os.path.isfile(path):
        present = sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else []
        what = f" for split {split!r}" if split else ""
        fix = hint or (
            f"place {filename!r} in {data_dir!r}"
            + (", or load only the available splits, e.g. splits=('validation', 'test')" if split else "")
        )
        raise FileNotFoundError(
            f"{dataset}: file {filename!r}{what} not found in folder {data_dir!r} (folder has: {present}). "
            f"To fix: {fix}."
        )
    return path


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set to a truthy value."""
    truthy = {"1", "true", "yes", "on"}
    return any(
        os.environ.get(v, "").strip().lower() in truthy for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def encode_label_lists(
    label_lists: Sequence[Sequence[str]], names: Sequence[str], drop_unknown: bool = True, context: str = ""
) -> list[list[int]]:
    """Map lists of label strings to sorted, de-duplicated id lists via ``names``.

    Unknown labels are dropped when ``drop_unknown`` (e.g. codes outside a top-50 label space),
    otherwise a ValueError names them.
    """
    index = {n: i for i, n in enumerate(names)}
    out: list[list[int]] = []
    unknown: set[str] = set()
    for labs in label_lists:
        ids = {index[lab] for lab in labs if lab in index}
        if not drop_unknown and len(ids) < len(set(labs)):
            unknown.update(lab for lab in labs if lab not in index)
        out.append(sorted(ids))
    if unknown:
        raise ValueError(f"{context}labels not in the label space: {sorted(unknown)[:10]} ...")
    return out


def names_from_lists(label_lists: Iterable[Sequence[str]]) -> list[str]:
    """Sorted union of label strings."""
    seen: set[str] = set()
    for labs in label_lists:
        seen.update(labs)
    return sorted(seen)


def build_split(
    texts: Sequence[str],
    label_ids: Sequence[Sequence[int]],
    names: Sequence[str],
    ids: Sequence[str] | None = None,
) -> Dataset:
    """A Dataset with ``text``/``labels`` (+ ``id``) and the ClassLabel names attached."""
    data = {"text": list(texts), "labels": [list(map(int, x)) for x in label_ids]}
    if ids is not None:
        data["id"] = [str(i) for i in ids]
    if len(data["text"]) != len(data["labels"]):
        raise ValueError(
            f"{len(data['text'])} texts but {len(data['labels'])} label rows: files are misaligned"
        )
    return Dataset.from_dict(data, features=make_features(names, with_id=ids is not None))


def train_frequency(dataset, num_labels: int | None = None) -> np.ndarray:
    """Per-label occurrence counts of a Dataset's ``labels`` column (vectorised with bincount).

    Reads the column through the dataset's row selection, so subsets made with ``select`` / ``shuffle``
    (which keep the full table plus an indices mapping) are counted correctly."""
    if num_labels is None:
        num_labels = len(label_names(dataset))
    col = dataset.with_format("arrow")["labels"].combine_chunks()
    flat = np.asarray(col.flatten(), dtype=np.int64) if len(col) else np.zeros(0, np.int64)
    return np.bincount(flat, minlength=num_labels)


def check_validation_size(validation_size: Any, dataset: str) -> None:
    """ValueError naming ``dataset`` unless ``validation_size`` is a fraction (a float in [0, 1)) or a count
    (a whole number >= 0): ``1.0``, ``2.5`` and ``True`` would carve 1, 2 and 1 rows."""
    fraction = isinstance(validation_size, numbers.Real) and not isinstance(validation_size, numbers.Integral)
    count = isinstance(validation_size, numbers.Integral) and not isinstance(validation_size, bool)
    if not ((fraction and 0 <= validation_size < 1) or (count and validation_size >= 0)):
        raise ValueError(
            f"{dataset}: validation_size must be a fraction in [0, 1) or a whole count of documents, got "
            f"{validation_size!r}"
        )


def carve_validation(
    n_train: int, validation_size: float | int, seed: int, dataset: str
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/validation carve for sources without a validation split.

    ``validation_size`` is a fraction (< 1) or a count of the ``n_train`` training rows
    (:func:`check_validation_size`); the rows are drawn with ``numpy.random.default_rng(seed).permutation``.
    Returns the sorted positions ``(train, validation)``; ValueError naming ``dataset`` when no training row
    would be left."""
    check_validation_size(validation_size, dataset)
    n_val = int(round(validation_size * n_train)) if validation_size < 1 else int(validation_size)
    if not 0 <= n_val < max(n_train, 1):
        raise ValueError(
            f"{dataset}: validation_size={validation_size} leaves no training documents ({n_train} training "
            "documents); use a smaller fraction or count"
        )
    perm = np.random.default_rng(seed).permutation(n_train)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def read_lines(path: str) -> list[str]:
    """Lines of a UTF-8 text file without the trailing newline."""
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def read_id_list(path: str | os.PathLike) -> list[str]:
    """One id per line (blank lines and a header ``HADM_ID`` / ``ID`` / ``_ID`` skipped). ValueError for a line
    of several columns or another header: a list of other ids (``SUBJECT_ID,HADM_ID``) would select nothing."""
    path = os.fspath(path)
    lines = [ln.strip() for ln in read_lines(path)]
    lines = [ln for ln in lines if ln]
    wide = next((ln for ln in lines if "," in ln.rstrip(",")), None)
    if wide is not None:
        raise ValueError(f"{path}: one id per line expected; a line holds several columns ({wide!r})")
    lines = [ln.rstrip(",") for ln in lines]
    if lines and not lines[0].replace(".", "").isdigit():
        if lines[0].upper() not in {"HADM_ID", "ID", "_ID"}:
            raise ValueError(
                f"{path}: one id per line expected; its first line is {lines[0]!r} (a header HADM_ID may lead)"
            )
        lines = lines[1:]
    return [norm_id(x) for x in lines]


def norm_id(x) -> str:
    """An id as text, a float's ``.0`` dropped (``101.0`` -> ``"101"``: ids read from a float column)."""
    s = str(x).strip()
    if s.endswith(".0") and s[:-2].isdigit():
        s = s[:-2]
    return s


def filter_by_ids(dataset: Dataset, ids: Iterable, id_column: str = "id") -> Dataset:
    """Keep the rows whose ``id_column`` value is in ``ids`` (vectorised with pyarrow ``is_in``)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if id_column not in dataset.column_names:
        raise ValueError(f"filter_by_ids: no {id_column!r} column (columns: {dataset.column_names})")
    wanted = pa.array(sorted({norm_id(i) for i in ids}), type=pa.string())
    # the column as the dataset's rows see it (a shuffled or selected dataset maps its rows through indices)
    col = dataset.with_format("arrow")[id_column].cast(pa.string())
    mask = pc.is_in(col, value_set=wanted).to_numpy(zero_copy_only=False)
    return dataset.select(np.flatnonzero(mask))
