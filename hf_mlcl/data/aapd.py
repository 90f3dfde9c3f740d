"""AAPD (Yang et al., COLING 2018, "SGM: Sequence Generation Model for Multi-label Classification").

Local format (SGM / Castor-data release), one folder with::

    text_train  text_val  text_test      one tokenised abstract per line
    label_train label_val label_test     space-separated arXiv subject codes, aligned line by line
    labels.txt                           optional: label vocabulary, one name per line

Canonical split: 53,840 / 1,000 / 1,000 documents, 54 labels.
"""

from __future__ import annotations

import os

from datasets import DatasetDict

from hf_mlcl.data.registry import (
    build_split,
    encode_label_lists,
    names_from_lists,
    normalize_splits,
    read_lines,
    register_dataset,
    require_dir,
    require_file,
)

_FILE_SUFFIX = {"train": "train", "validation": "val", "test": "test"}
_EXPECTED = "text_{train,val,test} and label_{train,val,test} (one example per line), optional labels.txt"


@register_dataset("aapd")
def load_aapd(data_dir=None, splits=None, label_names_file: str = "labels.txt") -> DatasetDict:
    """Load AAPD from SGM-format files in ``data_dir``.

    ``splits`` selects any subset of train / validation / test (a missing file of a requested split
    raises FileNotFoundError naming file, folder and fix). Label names come from ``labels.txt`` when
    present (its order defines the ids), else the sorted union of every ``label_*`` file in the folder.
    """
    data_dir = require_dir(data_dir, "aapd", _EXPECTED)
    splits = normalize_splits(splits)
    # Check every requested file first so the error names the first missing one before any work.
    paths = {
        s: (
            require_file(data_dir, f"text_{_FILE_SUFFIX[s]}", "aapd", s),
            require_file(data_dir, f"label_{_FILE_SUFFIX[s]}", "aapd", s),
        )
        for s in splits
    }
    names_path = os.path.join(data_dir, label_names_file)
    if os.path.isfile(names_path):
        names = [n.strip() for n in read_lines(names_path) if n.strip()]
    else:
        all_labels = []
        for suffix in _FILE_SUFFIX.values():
            p = os.path.join(data_dir, f"label_{suffix}")
            if os.path.isfile(p):
                all_labels.extend(line.split() for line in read_lines(p))
        names = names_from_lists(all_labels)
    out = {}
    for split, (text_path, label_path) in paths.items():
        texts = read_lines(text_path)
        labels = [line.split() for line in read_lines(label_path)]
        if len(texts) != len(labels):
            raise ValueError(
                f"aapd: {text_path} has {len(texts)} lines but {label_path} has {len(labels)}; "
                "the text and label files of a split must be aligned line by line"
            )
        ids = encode_label_lists(labels, names, drop_unknown=False, context=f"aapd {label_path}: ")
        out[split] = build_split(texts, ids, names)
    return DatasetDict(out)
