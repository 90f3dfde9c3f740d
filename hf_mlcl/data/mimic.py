"""MIMIC-III and MIMIC-IV (ICD-9 / ICD-10) discharge summaries for ICD coding, from local files only.

MIMIC is credentialed (PhysioNet), so nothing is downloaded. Three layouts are read (``format="auto"`` picks
by the files present): ``caml`` (CAML / PLM-ICD csv files, and Nguyen et al.'s MIMIC-IV in the same layout),
``edin`` (Edin et al.'s feather files) and ``ids`` (one csv re-split by HADM id lists). The label space is the
sorted set of training codes, or the codes of ``code_list``. Each split keeps the HADM id in ``id``, so
:func:`filter_by_hadm_ids` can re-split or subset it. File names and columns: docs/usage.md, "Files the
shipped loaders read".
"""

from __future__ import annotations

import glob
import logging
import os
from collections import Counter
from collections.abc import Iterable

from datasets import Dataset, DatasetDict, concatenate_datasets

from hf_mlcl.data._io import get_field, iter_csv, split_labels
from hf_mlcl.data.registry import (
    SPLIT_ALIASES,
    build_split,
    encode_label_lists,
    filter_by_ids,
    normalize_splits,
    read_id_list,
    read_lines,
    register_dataset,
    require_dir,
    require_file,
)

_CSV_SPLIT = {"train": "train", "validation": "dev", "test": "test"}
_CHUNK = 5000

logger = logging.getLogger(__name__)


def read_hadm_split_ids(split_ids_dir: str | os.PathLike, variant: str = "full") -> dict[str, list[str]]:
    """Read CAML-style id lists ``{train,dev,test}_{variant}_hadm_ids.csv`` -> {split: [HADM ids]}."""
    split_ids_dir = os.fspath(split_ids_dir)
    return {
        split: read_id_list(require_file(split_ids_dir, f"{pre}_{variant}_hadm_ids.csv", "mimic", split))
        for split, pre in _CSV_SPLIT.items()
    }


def filter_by_hadm_ids(
    dataset: Dataset, hadm_ids: str | os.PathLike | Iterable, id_column: str = "id"
) -> Dataset:
    """Keep the admissions of ``dataset`` whose HADM id is listed in ``hadm_ids`` (a path to a
    one-id-per-line file such as ``train_50_hadm_ids.csv``, or an iterable of ids)."""
    if isinstance(hadm_ids, (str, os.PathLike)):
        hadm_ids = read_id_list(hadm_ids)
    return filter_by_ids(dataset, hadm_ids, id_column=id_column)


def _norm_code(code: str, strip_dots: bool) -> str:
    code = code.strip()
    return code.replace(".", "") if strip_dots else code


def _read_csv_docs(path: str, strip_dots: bool):
    ids, texts, labels = [], [], []
    for rec in iter_csv(path):
        ids.append(str(get_field(rec, "HADM_ID", "hadm_id", "_id", path=path)).split(".")[0])
        texts.append(str(get_field(rec, "TEXT", "text", path=path)))
        labels.append(
            [
                _norm_code(c, strip_dots)
                for c in split_labels(get_field(rec, "LABELS", "labels", "target", path=path), ";")
            ]
        )
    return ids, texts, labels


def _build_chunked(ids, texts, label_ids, names) -> Dataset:
    # Chunks keep the python -> arrow conversion's peak memory small for long clinical notes.
    parts = [
        build_split(texts[i : i + _CHUNK], label_ids[i : i + _CHUNK], names, ids[i : i + _CHUNK])
        for i in range(0, max(len(texts), 1), _CHUNK)
    ]
    return parts[0] if len(parts) == 1 else concatenate_datasets(parts)


def _detect_format(data_dir: str, variant: str, split_ids_dir) -> str:
    if split_ids_dir is not None:
        return "ids"
    if glob.glob(os.path.join(data_dir, "*.feather")):
        if not any(os.path.isfile(os.path.join(data_dir, f"{p}_{variant}.csv")) for p in _CSV_SPLIT.values()):
            return "edin"
    return "caml"


def _read_edin(data_dir: str, feather_file: str | None, split_file: str | None, strip_dots: bool):
    import pandas as pd

    if feather_file is None:
        cands = [
            f
            for f in sorted(glob.glob(os.path.join(data_dir, "*.feather")))
            if "split" not in os.path.basename(f)
        ]
        if not cands:
            raise FileNotFoundError(f"mimic: no document .feather file in {data_dir!r}; pass feather_file=")
        feather_file = cands[0]
    elif not os.path.isabs(feather_file):
        feather_file = require_file(data_dir, feather_file, "mimic")
    if split_file is None:
        cands = sorted(
            glob.glob(os.path.join(data_dir, "*split*.feather"))
            + glob.glob(os.path.join(data_dir, "*split*.csv"))
        )
        if not cands:
            raise FileNotFoundError(
                f"mimic: no split file (*split*.feather / *split*.csv with columns _id,split) in folder {data_dir!r}; "
                "place Edin et al.'s split file there or pass split_file="
            )
        split_file = cands[0]
    elif not os.path.isabs(split_file):
        split_file = require_file(data_dir, split_file, "mimic")
    docs = pd.read_feather(feather_file)
    for col in ("_id", "text", "target"):
        if col not in docs.columns:
            raise ValueError(f"mimic: {feather_file} has no column {col!r} (columns: {list(docs.columns)})")
    sp = pd.read_feather(split_file) if split_file.endswith(".feather") else pd.read_csv(split_file)
    if not {"_id", "split"} <= set(sp.columns):
        raise ValueError(f"mimic: split file {split_file} needs columns _id,split (has {list(sp.columns)})")
    split_of = dict(zip(sp["_id"].astype(str), sp["split"].astype(str).str.lower()))
    unknown = sorted(set(split_of.values()) - set(SPLIT_ALIASES))
    if unknown:
        logger.warning(
            "mimic: split file %s names splits %s besides %s; their admissions are left out",
            split_file,
            unknown,
            sorted(SPLIT_ALIASES),
        )
    out: dict[str, tuple[list, list, list]] = {
        "train": ([], [], []),
        "validation": ([], [], []),
        "test": ([], [], []),
    }
    for _id, text, target in zip(docs["_id"].astype(str), docs["text"], docs["target"]):
        split = SPLIT_ALIASES.get(split_of.get(_id, ""))
        if split is None:  # an admission the split file does not list: in no split
            continue
        out[split][0].append(_id)
        out[split][1].append(str(text))
        out[split][2].append([_norm_code(c, strip_dots) for c in split_labels(target, ";")])
    return out


def _load_mimic(
    dataset: str,
    data_dir,
    splits=None,
    variant: str = "full",
    code_list: str | None = None,
    format: str = "auto",
    file: str | None = None,
    split_ids_dir: str | None = None,
    feather_file: str | None = None,
    split_file: str | None = None,
    strip_dots: bool = False,
    drop_unlabeled: bool | None = None,
    file_template: str = "{split}_{variant}.csv",
) -> DatasetDict:
    variant = str(variant)
    if variant not in ("full", "50"):
        raise ValueError(f"{dataset}: variant must be 'full' or '50', got {variant!r}")
    expected = (
        f"{{train,dev,test}}_{variant}.csv (SUBJECT_ID,HADM_ID,TEXT,LABELS with ';'-joined codes), or Edin et al. "
        "*.feather + *split*.feather, or file= plus split_ids_dir= with HADM id lists. MIMIC is credentialed: "
        "build these files locally from PhysioNet MIMIC with the CAML / PLM-ICD / Nguyen et al. / Edin et al. scripts"
    )
    data_dir = require_dir(data_dir, dataset, expected)
    splits = normalize_splits(splits)
    fmt = _detect_format(data_dir, variant, split_ids_dir) if format == "auto" else format
    if fmt not in ("caml", "edin", "ids"):
        raise ValueError(f"{dataset}: format must be auto, caml, edin or ids, got {format!r}")

    cl_path = None  # the files named are checked before the (long) reads
    if code_list is not None:
        cl_path = code_list if os.path.isabs(code_list) else require_file(data_dir, code_list, dataset)
    raw: dict[str, tuple[list, list, list]] = {}
    if fmt == "caml":
        need = list(splits) + (["train"] if code_list is None and "train" not in splits else [])
        fname = {s: file_template.format(split=_CSV_SPLIT[s], variant=variant) for s in need}
        paths = {
            s: require_file(
                data_dir,
                fname[s],
                dataset,
                s,
                hint=(
                    f"place {fname[s]} in {data_dir!r} (or set file_template=, default '{{split}}_{{variant}}.csv' with "
                    "split in train/dev/test), request other splits=, or (for the label space without the training "
                    "file) pass code_list="
                ),
            )
            for s in need
        }
        raw = {s: _read_csv_docs(p, strip_dots) for s, p in paths.items()}
    elif fmt == "ids":
        if file is None or split_ids_dir is None:
            raise ValueError(
                f"{dataset}: format='ids' needs file= (one csv of all admissions) and split_ids_dir="
            )
        path = file if os.path.isabs(file) else require_file(data_dir, file, dataset)
        split_ids = read_hadm_split_ids(split_ids_dir, variant)
        ids, texts, labels = _read_csv_docs(path, strip_dots)
        pos = {h: i for i, h in enumerate(ids)}
        for s, lst in split_ids.items():
            absent = [h for h in lst if h not in pos]
            if absent:
                logger.warning(
                    "%s: %d of the %d HADM ids of the %s split are not in %s (first: %s); they are left out",
                    dataset,
                    len(absent),
                    len(lst),
                    s,
                    path,
                    absent[:3],
                )
            idx = [pos[h] for h in lst if h in pos]
            raw[s] = ([ids[i] for i in idx], [texts[i] for i in idx], [labels[i] for i in idx])
    else:
        raw = _read_edin(data_dir, feather_file, split_file, strip_dots)

    if cl_path is not None:
        names = list(dict.fromkeys(_norm_code(c, strip_dots) for c in read_lines(cl_path) if c.strip()))
    else:
        counts = Counter(c for labs in raw["train"][2] for c in set(labs))
        if variant == "50" and fmt != "caml":
            names = sorted(c for c, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:50])
        else:
            names = sorted(counts)
    if drop_unlabeled is None:
        drop_unlabeled = variant == "50"
    out = {}
    for split in splits:
        ids, texts, labels = raw[split]
        label_ids = encode_label_lists(labels, names, drop_unknown=True)
        if drop_unlabeled:
            keep = [i for i, labs in enumerate(label_ids) if labs]
            ids, texts, label_ids = (
                [ids[i] for i in keep],
                [texts[i] for i in keep],
                [label_ids[i] for i in keep],
            )
        out[split] = _build_chunked(ids, texts, label_ids, names)
    return DatasetDict(out)


@register_dataset("mimic3", "mimic_iii", "mimic-iii", "mimiciii")
def load_mimic3(data_dir=None, **options) -> DatasetDict:
    """MIMIC-III ICD-9 coding (CAML splits: full 47,723 / 1,631 / 3,372; top-50 8,066 / 1,573 / 1,729).

    Options: ``variant`` "full" | "50", ``code_list`` (e.g. "ALL_CODES_plmicd.txt"), ``splits``,
    ``format`` ("auto" | "caml" | "edin" | "ids"), ``file_template``, ``file`` + ``split_ids_dir`` (re-split by HADM id lists),
    ``feather_file`` / ``split_file`` (Edin et al.), ``drop_unlabeled`` (default True for "50")."""
    return _load_mimic("mimic3", data_dir, **options)


@register_dataset("mimic4_icd9", "mimic_iv_icd9", "mimic-iv-icd9", "mimiciv_icd9")
def load_mimic4_icd9(data_dir=None, **options) -> DatasetDict:
    """MIMIC-IV ICD-9 (Nguyen et al. 2023 csv or Edin et al. 2023 feather); options as :func:`load_mimic3`."""
    return _load_mimic("mimic4_icd9", data_dir, **options)


@register_dataset("mimic4_icd10", "mimic_iv_icd10", "mimic-iv-icd10", "mimiciv_icd10")
def load_mimic4_icd10(data_dir=None, strip_dots: bool = True, **options) -> DatasetDict:
    """MIMIC-IV ICD-10 (Nguyen et al. 2023 csv or Edin et al. 2023 feather). Codes are compared without
    dots (``strip_dots=True``) so a dotted code list matches the dot-less csv codes."""
    return _load_mimic("mimic4_icd10", data_dir, strip_dots=strip_dots, **options)
