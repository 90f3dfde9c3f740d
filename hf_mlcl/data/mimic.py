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
    norm_id,
    normalize_splits,
    read_id_list,
    read_lines,
    register_dataset,
    require_dir,
    require_file,
)

_CSV_SPLIT = {"train": "train", "validation": "dev", "test": "test"}
_CHUNK = 5000
# Edin et al.'s document files by dataset ({variant} "full" / "50"); each has a split file "<name>_split"
_EDIN_NAMES = {
    "mimic3": ("mimiciii_{variant}", "mimiciii_clean"),
    "mimic4_icd9": ("mimiciv_icd9",),
    "mimic4_icd10": ("mimiciv_icd10",),
}

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


def _read_csv_docs(path: str):
    ids, texts, labels = [], [], []
    for rec in iter_csv(path):
        ids.append(str(get_field(rec, "HADM_ID", "hadm_id", "_id", path=path)).split(".")[0])
        texts.append(str(get_field(rec, "TEXT", "text", path=path)))
        labels.append(
            [c.strip() for c in split_labels(get_field(rec, "LABELS", "labels", "target", path=path), ";")]
        )
    return ids, texts, labels


def _without_dots(dataset: str, codes: Iterable[str]) -> dict[str, str]:
    """``{code: code without dots}``; ValueError when two dotted codes become one (ICD-9's ``11.49``, a
    procedure, and ``114.9``, a diagnosis): only their dots tell them apart. A code written with and without its
    dots (``E11.9`` / ``E119``) is one code and meets itself, which is what ``strip_dots`` is for."""
    mapping = {c: c.replace(".", "") for c in codes}
    dotted: dict[str, list[str]] = {}
    for code, bare in mapping.items():
        if "." in code:
            dotted.setdefault(bare, []).append(code)
    merged = sorted(sorted(v) for v in dotted.values() if len(v) > 1)
    if merged:
        raise ValueError(
            f"{dataset}: strip_dots=True would make {len(merged)} pairs of distinct codes one label (e.g. "
            f"{' and '.join(merged[0])}): ICD-9 codes need their dots; pass strip_dots=False"
        )
    return mapping


def _check_code_list(dataset: str, labels: list[list[str]], names: list[str], code_list: str) -> None:
    """The training codes ``code_list`` leaves out: ValueError when most of them are in it once dots are removed
    (the data and the list write the codes differently), else a warning counting them."""
    known = set(names)
    dropped = Counter(c for labs in labels for c in labs if c not in known)
    if not dropped:
        return
    total = sum(len(labs) for labs in labels)
    bare = {n.replace(".", "") for n in names}
    mismatched = sum(n for c, n in dropped.items() if c.replace(".", "") in bare)
    if 2 * mismatched > sum(dropped.values()):
        example = next(c for c in dropped if c.replace(".", "") in bare)
        raise ValueError(
            f"{dataset}: {mismatched} of the training split's {total} codes are in {code_list} only with their dots "
            f"written otherwise (e.g. {example!r}): write the codes alike in both (ICD-9 needs its dots), or pass "
            "strip_dots=True for ICD-10 codes"
        )
    logger.warning(
        "%s: %d of the training split's %d codes are not in %s (e.g. %s); they are dropped",
        dataset,
        sum(dropped.values()),
        total,
        code_list,
        [c for c, _ in dropped.most_common(3)],
    )


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


def _stem(path: str) -> str:
    return os.path.splitext(os.path.basename(path))[0]


def _pick_edin_file(
    cands: list[str], wanted: tuple[str, ...], others: set[str], what: str, option: str
) -> str:
    """The one file of ``cands`` for the dataset: the only candidate, else the one named as ``wanted``; ValueError
    for a file named as another dataset's (``others``) or a choice the names cannot make."""
    named = [f for f in cands if _stem(f) in wanted]
    if len(named) == 1:
        return named[0]
    if len(cands) == 1 and _stem(cands[0]) not in others:
        return cands[0]
    found = ", ".join(os.path.basename(f) for f in cands)
    raise ValueError(f"mimic: which {what}? {found} (expected {' or '.join(wanted)}): pass {option}=")


def _read_edin(dataset: str, variant: str, data_dir: str, feather_file: str | None, split_file: str | None):
    import pandas as pd

    names = tuple(n.format(variant=variant) for n in _EDIN_NAMES[dataset])
    others = {n.format(variant=v) for d, ns in _EDIN_NAMES.items() for n in ns for v in ("full", "50")} - set(
        names
    )
    if feather_file is None:
        cands = [
            f
            for f in sorted(glob.glob(os.path.join(data_dir, "*.feather")))
            if "split" not in os.path.basename(f)
        ]
        if not cands:
            raise FileNotFoundError(f"mimic: no document .feather file in {data_dir!r}; pass feather_file=")
        feather_file = _pick_edin_file(
            cands, names, others, f"document file for {dataset} ({variant})", "feather_file"
        )
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
        split_names = (f"{_stem(feather_file)}_split",)
        split_others = {f"{n}_split" for n in others | set(names)} - set(split_names)
        split_file = _pick_edin_file(
            cands, split_names, split_others, f"split file for {os.path.basename(feather_file)}", "split_file"
        )
    elif not os.path.isabs(split_file):
        split_file = require_file(data_dir, split_file, "mimic")
    docs = pd.read_feather(feather_file)
    for col in ("_id", "text", "target"):
        if col not in docs.columns:
            raise ValueError(f"mimic: {feather_file} has no column {col!r} (columns: {list(docs.columns)})")
    sp = pd.read_feather(split_file) if split_file.endswith(".feather") else pd.read_csv(split_file)
    if not {"_id", "split"} <= set(sp.columns):
        raise ValueError(f"mimic: split file {split_file} needs columns _id,split (has {list(sp.columns)})")
    split_of = dict(zip(map(norm_id, sp["_id"]), sp["split"].astype(str).str.lower()))
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
    unlisted = no_text = 0
    for _id, text, target in zip(map(norm_id, docs["_id"]), docs["text"], docs["target"]):
        split = SPLIT_ALIASES.get(split_of.get(_id, ""))
        if split is None:  # an admission the split file does not list (or puts in another split): in no split
            unlisted += _id not in split_of
            continue
        if not isinstance(text, str):  # a missing text (None, NaN) is no note to read
            no_text += 1
            continue
        out[split][0].append(_id)
        out[split][1].append(text)
        out[split][2].append([c.strip() for c in split_labels(target, ";")])
    if unlisted == len(docs):
        raise ValueError(
            f"mimic: {split_file} lists none of the {len(docs)} admissions of {feather_file} (their _id: "
            f"{list(map(norm_id, docs['_id'][:2]))}, the split file's: {list(split_of)[:2]})"
        )
    for count, why in ((unlisted, f"are not listed in {split_file}"), (no_text, "have no text")):
        if count:
            logger.warning(
                "mimic: %d of the %d admissions of %s %s; they are left out",
                count,
                len(docs),
                feather_file,
                why,
            )
    return out


def _refuse_shared_admissions(dataset: str, raw: dict) -> None:
    """A one-line error when two splits hold the same HADM id: a validation or test score on admissions the
    model trained on (the published splits are disjoint)."""
    seen: dict[str, str] = {}
    for split, (ids, _, _) in raw.items():
        shared = {h for h in ids if seen.get(h, split) != split}
        if shared:
            other = sorted({seen[h] for h in shared})
            raise ValueError(
                f"{dataset}: {len(shared)} HADM ids of the {split} split are also in {' and '.join(other)} "
                f"(first: {sorted(shared)[:3]}); the splits must not share admissions"
            )
        seen.update(dict.fromkeys(ids, split))


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
        raw = {s: _read_csv_docs(p) for s, p in paths.items()}
    elif fmt == "ids":
        if file is None or split_ids_dir is None:
            raise ValueError(
                f"{dataset}: format='ids' needs file= (one csv of all admissions) and split_ids_dir="
            )
        path = file if os.path.isabs(file) else require_file(data_dir, file, dataset)
        split_ids = read_hadm_split_ids(split_ids_dir, variant)
        ids, texts, labels = _read_csv_docs(path)
        pos = {h: i for i, h in enumerate(ids)}
        if not any(h in pos for lst in split_ids.values() for h in lst):
            raise ValueError(
                f"{dataset}: the HADM id lists of {split_ids_dir} name none of the {len(ids)} admissions of "
                f"{path} (their HADM_ID: {ids[:2]}, the lists': {[lst[:1] for lst in split_ids.values()]})"
            )
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
        raw = _read_edin(dataset, variant, data_dir, feather_file, split_file)
    _refuse_shared_admissions(dataset, raw)

    listed = [c.strip() for c in read_lines(cl_path) if c.strip()] if cl_path is not None else []
    if strip_dots:
        bare = _without_dots(
            dataset, {c for part in raw.values() for labs in part[2] for c in labs} | set(listed)
        )
        raw = {s: (i, t, [[bare[c] for c in labs] for labs in ls]) for s, (i, t, ls) in raw.items()}
        listed = [bare[c] for c in listed]
    if cl_path is not None:
        names = list(dict.fromkeys(listed))
        if "train" in raw:
            _check_code_list(dataset, raw["train"][2], names, os.path.basename(cl_path))
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
