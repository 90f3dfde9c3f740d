"""Reuters-21578, Distribution 1.0 (Lewis), read from the original SGML files, ModApte split.

:func:`load_reuters21578` (registered as ``reuters21578``) with its split, category, validation, text and
encoding choices; :func:`read_reuters_sgml` / :func:`parse_sgml` read the ``reut2-*.sgm`` files.

References: ModApte, Apte et al. 1994.
Design: docs/design.md, "Reuters-21578 (hf_mlcl/data/reuters21578.py)".
"""

from __future__ import annotations

import glob
import html
import os
import re
from collections import Counter
from collections.abc import Sequence

from datasets import DatasetDict

from hf_mlcl.data.registry import (
    build_split,
    carve_validation,
    check_validation_size,
    encode_label_lists,
    normalize_splits,
    register_dataset,
    require_dir,
)

FILE_GLOB = "reut2-*.sgm"
CATEGORY_SETS = ("r90", "r10", "all")
_EXPECTED = "the original SGML files reut2-000.sgm ... reut2-021.sgm of Reuters-21578 Distribution 1.0"

_DOC_RE = re.compile(r"<REUTERS\b([^>]*)>(.*?)</REUTERS>", re.S | re.I)
_ATTR_RE = re.compile(r'(\w+)="([^"]*)"')
_TOPICS_RE = re.compile(r"<TOPICS>(.*?)</TOPICS>", re.S | re.I)
_D_RE = re.compile(r"<D>(.*?)</D>", re.S | re.I)
_TEXT_RE = re.compile(r"<TEXT\b([^>]*)>(.*?)</TEXT>", re.S | re.I)
_TITLE_RE = re.compile(r"<TITLE>(.*?)</TITLE>", re.S | re.I)
_BODY_RE = re.compile(r"<BODY>(.*?)</BODY>", re.S | re.I)
_TAG_RE = re.compile(r"<[^>]+>")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_SPACE_RE = re.compile(r"\s+")


def clean_sgml_text(raw: str) -> str:
    """Decode SGML entities, drop control characters and stray tags, collapse whitespace."""
    text = html.unescape(_TAG_RE.sub(" ", raw))
    text = _CONTROL_RE.sub(" ", text)
    return _SPACE_RE.sub(" ", text).strip()


def parse_sgml(raw: str) -> list[dict]:
    """Every ``<REUTERS>`` document of one SGML file's text as a dict: ``id`` (NEWID), ``topics_attr``
    (YES/NO/BYPASS), ``lewissplit``, ``topics`` (list of names), ``text`` (title + body, cleaned)."""
    docs = []
    for attrs_raw, inner in _DOC_RE.findall(raw):
        attrs = {k.upper(): v for k, v in _ATTR_RE.findall(attrs_raw)}
        if "NEWID" not in attrs:
            raise ValueError(
                f"reuters21578: a <REUTERS> element has no NEWID attribute: <REUTERS{attrs_raw}>"
            )
        tm = _TOPICS_RE.search(inner)
        topics = [t.strip() for t in _D_RE.findall(tm.group(1))] if tm else []
        text = ""
        xm = _TEXT_RE.search(inner)
        if xm:
            text_type = dict((k.upper(), v.upper()) for k, v in _ATTR_RE.findall(xm.group(1))).get(
                "TYPE", "NORM"
            )
            content = xm.group(2)
            if text_type == "UNPROC":
                text = clean_sgml_text(content)
            else:
                title = _TITLE_RE.search(content)
                body = _BODY_RE.search(content) if text_type != "BRIEF" else None
                parts = [clean_sgml_text(m.group(1)) for m in (title, body) if m]
                text = "\n".join(p for p in parts if p)
        docs.append(
            {
                "id": attrs["NEWID"],
                "topics_attr": attrs.get("TOPICS", "").upper(),
                "lewissplit": attrs.get("LEWISSPLIT", "").upper(),
                "topics": [t for t in topics if t],
                "text": text,
            }
        )
    return docs


def read_reuters_sgml(data_dir: str) -> list[dict]:
    """Parse every ``reut2-*.sgm`` in ``data_dir`` (file order), bytes decoded as latin-1."""
    files = sorted(glob.glob(os.path.join(data_dir, FILE_GLOB)))
    if not files:
        present = sorted(os.listdir(data_dir))
        raise FileNotFoundError(
            f"reuters21578: no {FILE_GLOB} file in folder {data_dir!r} (folder has: {present[:20]}). "
            f"To fix: pass the folder holding {_EXPECTED}."
        )
    docs: list[dict] = []
    for path in files:
        with open(path, "rb") as f:
            docs.extend(parse_sgml(f.read().decode("latin-1")))
    return docs


def select_categories(
    categories: str | Sequence[str],
    train_topics: Sequence[Sequence[str]],
    test_topics: Sequence[Sequence[str]],
) -> list[str]:
    """The label names for ``categories``: ``"r90"``, ``"r10"`` or ``"all"`` sorted, a list in its own order."""
    train_count = Counter(t for topics in train_topics for t in set(topics))
    test_count = Counter(t for topics in test_topics for t in set(topics))
    if isinstance(categories, str):
        key = categories.lower()
        if key == "r90":
            return sorted(t for t in train_count if test_count.get(t, 0) > 0)
        if key == "r10":
            top = sorted(train_count.items(), key=lambda kv: (-kv[1], kv[0]))[:10]
            return sorted(t for t, _ in top)
        if key == "all":
            return sorted(set(train_count) | set(test_count))
        raise ValueError(
            f"reuters21578: categories={categories!r} is not one of {CATEGORY_SETS}; pass one of them "
            "or a list of topic names"
        )
    names = list(dict.fromkeys(str(c) for c in categories))
    unknown = [n for n in names if n not in train_count and n not in test_count]
    if not names or unknown:
        raise ValueError(
            f"reuters21578: categories {unknown or names} do not occur in any ModApte document; "
            f"use {CATEGORY_SETS} or names from all-topics-strings.lc.txt that occur in ModApte"
        )
    return names


@register_dataset("reuters21578", "reuters", "reuters-21578", "reuters_21578")
def load_reuters21578(
    data_dir=None,
    splits=None,
    categories: str | Sequence[str] = "r90",
    validation_size: float | int = 0.1,
    seed: int = 42,
    keep_unlabeled: bool = False,
) -> DatasetDict:
    """Load Reuters-21578 (ModApte) from the original SGML files (choices in the module docstring).

    ``categories``: ``"r90"`` (default), ``"r10"``, ``"all"`` or a list of topic names.
    ``validation_size``: fraction (< 1) or number of the filtered ModApte train documents moved to
    validation, drawn with ``numpy.random.default_rng(seed)``. ``keep_unlabeled``: keep ModApte
    documents that have none of the selected topics (empty label lists).
    Real-file counts (R90, default options): 6,993 / 777 / 3,019 documents, 90 labels; the random carve moves
    the one training document of castor-oil and of sun-meal to validation, so 88 labels are seen in training
    (``validation_size=0`` keeps all 90 there).
    """
    data_dir = require_dir(data_dir, "reuters21578", _EXPECTED)
    splits = normalize_splits(splits)
    check_validation_size(validation_size, "reuters21578")  # before the files are read
    docs = [d for d in read_reuters_sgml(data_dir) if d["topics_attr"] == "YES"]
    train_docs = [d for d in docs if d["lewissplit"] == "TRAIN"]
    test_docs = [d for d in docs if d["lewissplit"] == "TEST"]
    if not train_docs or not test_docs:
        raise ValueError(
            f"reuters21578: {data_dir!r} has {len(train_docs)} ModApte train and {len(test_docs)} test documents "
            '(TOPICS="YES" with LEWISSPLIT TRAIN/TEST); both are needed to define the category set. '
            f"Pass the folder holding {_EXPECTED}."
        )
    names = select_categories(categories, [d["topics"] for d in train_docs], [d["topics"] for d in test_docs])

    def encoded(part: list[dict]) -> tuple[list[dict], list[list[int]]]:
        label_ids = encode_label_lists([d["topics"] for d in part], names, drop_unknown=True)
        keep = [i for i, ids in enumerate(label_ids) if ids or keep_unlabeled]
        return [part[i] for i in keep], [label_ids[i] for i in keep]

    train_docs, train_ids = encoded(train_docs)
    test_docs, test_ids = encoded(test_docs)
    train_idx, val_idx = carve_validation(len(train_docs), validation_size, seed, "reuters21578")
    parts = {
        "train": [(train_docs[i], train_ids[i]) for i in train_idx],
        "validation": [(train_docs[i], train_ids[i]) for i in val_idx],
        "test": list(zip(test_docs, test_ids)),
    }
    out = {}
    for split in splits:
        rows = parts[split]
        out[split] = build_split(
            [d["text"] for d, _ in rows], [ids for _, ids in rows], names, [d["id"] for d, _ in rows]
        )
    return DatasetDict(out)
