"""UK-LEX (Chalkidis & Søgaard, 2022): UK legislation classified into 18 or 69 legal topics.

Local format (jsonl release): one or more ``*.jsonl`` files in ``data_dir`` (``uklex.jsonl`` is looked
for first; else every ``*.jsonl``), one act per line with

* ``title`` (str), ``body`` (str),
* ``labels``: the act's topics, either a list (of names, or ints into a names file) for the
  version you downloaded, or a dict holding both versions, e.g.
  ``{"uklex18": [...], "uklex69": [...]}`` / ``{"level_1": [...], "level_2": [...]}``; fields named
  ``labels_18`` / ``labels_69`` (or ``uklex18`` / ``uklex69``) at the top level also work,
* ``data_type``: ``train``, ``validation`` (or ``dev``/``val``) or ``test``.

Label names: ``labels_18.txt`` / ``labels_69.txt`` (or ``uklex18.txt`` / ``uklex69.txt``) one per line
when present (their order defines the ids, and integer labels index into them), else the sorted union
of the labels found in the files.
"""

from __future__ import annotations

import glob
import os

from datasets import DatasetDict

from hf_mlcl.data._io import iter_jsonl, split_labels
from hf_mlcl.data.registry import (
    SPLIT_ALIASES,
    build_split,
    encode_label_lists,
    names_from_lists,
    normalize_splits,
    read_lines,
    register_dataset,
    require_dir,
)

_EXPECTED = "uklex.jsonl (or *.jsonl) with fields title, body, labels, data_type; optional labels_{18,69}.txt"
_VERSION_KEYS = {
    18: ("uklex18", "uklex_18", "uk-lex18", "labels_18", "18", "level_1", "level1", "l1"),
    69: ("uklex69", "uklex_69", "uk-lex69", "labels_69", "69", "level_2", "level2", "l2"),
}


def _pick_labels(rec: dict, version: int, path: str):
    for key in _VERSION_KEYS[version]:
        if key in rec:
            return rec[key]
    lab = rec.get("labels")
    if isinstance(lab, dict):
        for key in _VERSION_KEYS[version]:
            if key in lab:
                return lab[key]
        raise ValueError(
            f"uklex: {path}: 'labels' dict has no key for the {version}-label version "
            f"(looked for {_VERSION_KEYS[version]}; has {list(lab)})"
        )
    if lab is None:
        raise ValueError(f"uklex: {path}: record has no 'labels' field (has {list(rec)})")
    return lab


@register_dataset("uklex", "uk_lex", "uk-lex")
def load_uklex(
    data_dir=None,
    splits=None,
    version: int = 18,
    sep_token: str = " [SEP] ",
    text_fields: tuple[str, ...] = ("title", "body"),
) -> DatasetDict:
    """Load UK-LEX (``version`` 18 or 69 labels); text = ``title + sep_token + body`` by default.

    Use ``sep_token=tokenizer.sep_token`` padded with spaces for non-BERT tokenizers, or
    ``text_fields=("body",)`` for the body only."""
    if version not in _VERSION_KEYS:
        raise ValueError(f"uklex: version must be 18 or 69, got {version!r}")
    data_dir = require_dir(data_dir, "uklex", _EXPECTED)
    splits = normalize_splits(splits)
    main = os.path.join(data_dir, "uklex.jsonl")
    files = [main] if os.path.isfile(main) else sorted(glob.glob(os.path.join(data_dir, "*.jsonl")))
    if not files:
        raise FileNotFoundError(
            f"uklex: no .jsonl file in folder {data_dir!r}. To fix: place {_EXPECTED} there."
        )
    names = None
    for cand in (f"labels_{version}.txt", f"uklex{version}.txt", f"uklex{version}_labels.txt"):
        p = os.path.join(data_dir, cand)
        if os.path.isfile(p):
            names = [n.strip() for n in read_lines(p) if n.strip()]
            break

    rows: dict[str, tuple[list[str], list[list[str]]]] = {
        s: ([], []) for s in ("train", "validation", "test")
    }
    for path in files:
        for rec in iter_jsonl(path):
            dtype = SPLIT_ALIASES.get(str(rec.get("data_type", "")).lower())
            if dtype is None:
                raise ValueError(
                    f"uklex: {path}: data_type {rec.get('data_type')!r} is not train/validation/test"
                )
            parts = [str(rec.get(f) or "") for f in text_fields]
            labs = _pick_labels(rec, version, path)
            if (
                names is not None
                and isinstance(labs, list)
                and labs
                and all(isinstance(x, int) for x in labs)
            ):
                if min(labs) < 0 or max(labs) >= len(names):
                    raise ValueError(
                        f"uklex: {path}: label ids {labs} lie outside the {len(names)} label names"
                    )
                labs = [names[x] for x in labs]
            rows[dtype][0].append(sep_token.join(p for p in parts if p) if len(parts) > 1 else parts[0])
            rows[dtype][1].append(split_labels(labs))
    missing = [s for s in splits if not rows[s][0]]
    if missing:
        raise ValueError(f"uklex: no records with data_type in {missing} in {files}; request other splits=")
    if names is None:
        names = names_from_lists(labs for s in rows.values() for labs in s[1])
    out = {}
    for split in splits:
        texts, labs = rows[split]
        out[split] = build_split(
            texts, encode_label_lists(labs, names, drop_unknown=False, context="uklex: "), names
        )
    return DatasetDict(out)
