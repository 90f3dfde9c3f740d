"""RCV1-v2 (Lewis et al., JMLR 2004) with the LYRL2004 split, from local files.

One document file (``rcv1.jsonl``, csv or tsv: ``id``, ``text``, ``topics``): ids <= 26150 form the LYRL2004
training split (23,149 documents), larger ids the test split, and a seeded validation split is carved out of
training. The optional hierarchy ``rcv1.topics.hier.orig`` fixes the label vocabulary (its 103 topics, file
order) and enables ``add_ancestors``. File formats: docs/usage.md, "Files the shipped loaders read".
"""

from __future__ import annotations

import os
import re

import numpy as np
from datasets import DatasetDict

from hf_mlcl.data._io import get_field, iter_records, split_labels
from hf_mlcl.data.registry import (
    build_split,
    carve_validation,
    check_validation_size,
    encode_label_lists,
    names_from_lists,
    normalize_splits,
    read_lines,
    register_dataset,
    require_dir,
    require_file,
)

LYRL_TRAIN_MAX_ID = 26150
_DOC_FILES = ("rcv1.jsonl", "rcv1.json", "rcv1.csv", "rcv1.tsv")
_HIER_FILE = "rcv1.topics.hier.orig"
_HIER_RE = re.compile(r"parent:\s*(\S+)\s+child:\s*(\S+)(?:\s+child-description:\s*(.*))?", re.I)
_EXPECTED = f"one of {_DOC_FILES} (fields id, text, topics) and optionally {_HIER_FILE}"


def read_topic_hierarchy(path: str) -> tuple[list[str], dict[str, str], dict[str, str]]:
    """Parse ``rcv1.topics.hier.orig``: (topics in file order, child -> parent, child -> description).

    The root (``Root``/``None``) is not a topic."""
    topics, parent, desc = [], {}, {}
    for line in read_lines(path):
        m = _HIER_RE.search(line)
        if not m:
            continue
        par, child, d = m.group(1), m.group(2), (m.group(3) or "").strip()
        if child.lower() == "root":
            continue
        if child not in parent:
            topics.append(child)
        parent[child] = par
        desc[child] = d
    if not topics:
        raise ValueError(f"rcv1: {path} has no 'parent: X child: Y' lines")
    return topics, parent, desc


def _ancestors(topic: str, parent: dict[str, str]) -> list[str]:
    out = []
    while topic in parent and parent[topic] in parent:
        topic = parent[topic]
        out.append(topic)
    return out


@register_dataset("rcv1", "rcv1_v2", "rcv1-v2")
def load_rcv1(
    data_dir=None,
    splits=None,
    file: str | None = None,
    hierarchy_file: str | None = _HIER_FILE,
    min_label_count: int = 0,
    validation_size: float | int = 0.1,
    seed: int = 42,
    add_ancestors: bool = False,
    drop_unlabeled: bool = False,
    max_test_docs: int | None = None,
) -> DatasetDict:
    """Load RCV1-v2 / LYRL2004 from a local id,text,topics file (formats: docs/usage.md).

    ``min_label_count``: keep only labels with at least this many occurrences in the LYRL training
    split (Audibert et al. use 30); ``drop_unlabeled`` then drops documents left without labels.
    ``validation_size``: fraction (< 1) or number of LYRL training docs moved to validation, chosen
    with ``numpy.random.default_rng(seed)``. ``add_ancestors`` adds every ancestor topic of each
    label (needs the hierarchy). ``max_test_docs`` keeps the first N test docs (id order).
    """
    data_dir = require_dir(data_dir, "rcv1", _EXPECTED)
    splits = normalize_splits(splits)
    check_validation_size(validation_size, "rcv1")  # before the files are read
    if file is None:
        found = [f for f in _DOC_FILES if os.path.isfile(os.path.join(data_dir, f))]
        if not found:
            require_file(data_dir, _DOC_FILES[0], "rcv1", hint=f"put {_EXPECTED} there, or pass file='name'")
        file = found[0]
    path = require_file(data_dir, file, "rcv1")

    hier_topics, parent = None, {}
    if hierarchy_file not in (None, _HIER_FILE):  # a file named by the caller must be there
        require_file(data_dir, hierarchy_file, "rcv1", hint="hierarchy_file names the topic hierarchy")
    if hierarchy_file and os.path.isfile(os.path.join(data_dir, hierarchy_file)):
        hier_topics, parent, _ = read_topic_hierarchy(os.path.join(data_dir, hierarchy_file))
    elif add_ancestors:
        require_file(
            data_dir, hierarchy_file or _HIER_FILE, "rcv1", hint="add_ancestors needs the topic hierarchy"
        )

    ids, texts, topics = [], [], []
    for rec in iter_records(path):
        ids.append(int(float(get_field(rec, "id", "itemid", "doc_id", path=path))))
        texts.append(str(get_field(rec, "text", path=path)))
        labs = split_labels(get_field(rec, "topics", "labels", path=path))
        if add_ancestors:
            labs = labs + [a for lab in labs for a in _ancestors(lab, parent)]
        topics.append(labs)
    ids_arr = np.asarray(ids, dtype=np.int64)
    order = np.argsort(ids_arr, kind="stable")
    is_train = ids_arr[order] <= LYRL_TRAIN_MAX_ID
    train_idx, test_idx = order[is_train], order[~is_train]
    if max_test_docs is not None:
        test_idx = test_idx[:max_test_docs]

    names = list(hier_topics) if hier_topics is not None else names_from_lists(topics)
    if min_label_count > 0:
        counts: dict[str, int] = {}
        for i in train_idx:
            for lab in set(topics[i]):
                counts[lab] = counts.get(lab, 0) + 1
        names = [n for n in names if counts.get(n, 0) >= min_label_count]
        if not names:
            raise ValueError(
                f"rcv1: no label has >= {min_label_count} training occurrences; lower min_label_count"
            )
    label_ids = encode_label_lists(topics, names, drop_unknown=True)

    train_pos, val_pos = carve_validation(len(train_idx), validation_size, seed, "rcv1")
    train_idx, val_idx = train_idx[train_pos], train_idx[val_pos]
    parts = {"train": train_idx, "validation": val_idx, "test": test_idx}

    out = {}
    for split in splits:
        idx = parts[split]
        if drop_unlabeled:
            idx = np.asarray([i for i in idx if label_ids[i]], dtype=np.int64)
        out[split] = build_split(
            [texts[i] for i in idx], [label_ids[i] for i in idx], names, [ids[i] for i in idx]
        )
    return DatasetDict(out)
