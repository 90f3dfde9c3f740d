"""GoEmotions (Demszky et al., ACL 2020), "simplified" configuration: 27 emotions + neutral.

Local format (google-research release): ``train.tsv``, ``dev.tsv``, ``test.tsv`` with no header and
three tab-separated fields ``text``, comma-separated label ids (0-based into ``emotions.txt``) and the
Reddit comment id; some fields use CSV quoting, so the files are read with ``csv.reader``.
``emotions.txt``: one emotion name per line (id order).
Without ``data_dir`` and with network access the Hub copy ``google-research-datasets/go_emotions``
("simplified") is used; offline (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE) that path raises an error
naming the expected local files.
"""

from __future__ import annotations

import csv

from datasets import DatasetDict

from hf_mlcl.data.registry import (
    build_split,
    hub_offline,
    make_features,
    normalize_splits,
    read_lines,
    register_dataset,
    require_dir,
    require_file,
)

HUB_ID = "google-research-datasets/go_emotions"
_FILES = {"train": "train.tsv", "validation": "dev.tsv", "test": "test.tsv"}
_EXPECTED = "train.tsv, dev.tsv, test.tsv (text<TAB>label ids<TAB>comment id) and emotions.txt"


def _read_tsv(path: str, num_labels: int) -> tuple[list[str], list[list[int]], list[str]]:
    texts, labels, ids = [], [], []
    with open(path, encoding="utf-8", newline="") as f:
        for lineno, row in enumerate(csv.reader(f, delimiter="\t"), start=1):
            if not row:
                continue
            if len(row) != 3:
                raise ValueError(
                    f"goemotions: {path}:{lineno} has {len(row)} fields, expected 3 (text, labels, id)"
                )
            text, labs, cid = row
            try:
                lab_ids = sorted({int(x) for x in labs.split(",") if x.strip()})
            except ValueError:
                raise ValueError(
                    f"goemotions: {path}:{lineno} labels {labs!r} are not comma-separated label ids"
                ) from None
            if lab_ids and (lab_ids[0] < 0 or lab_ids[-1] >= num_labels):
                raise ValueError(
                    f"goemotions: {path}:{lineno} label id out of range [0, {num_labels}): {labs}"
                )
            texts.append(text)
            labels.append(lab_ids)
            ids.append(cid)
    return texts, labels, ids


@register_dataset("goemotions", "go_emotions", hub_id=HUB_ID)
def load_goemotions(data_dir=None, splits=None) -> DatasetDict:
    """Load GoEmotions (simplified, 28 labels) from local tsv files (or the Hub when online, no data_dir)."""
    splits = normalize_splits(splits)
    if data_dir is None:
        if hub_offline():
            raise ValueError(
                f"goemotions: offline (HF_HUB_OFFLINE/HF_DATASETS_OFFLINE set) and no data_dir given. "
                f"Pass data_dir with {_EXPECTED}."
            )
        return _from_hub(splits)
    data_dir = require_dir(data_dir, "goemotions", _EXPECTED)
    names_file = "emotions.txt"
    names = [n.strip() for n in read_lines(require_file(data_dir, names_file, "goemotions")) if n.strip()]
    paths = {s: require_file(data_dir, _FILES[s], "goemotions", s) for s in splits}
    out = {}
    for split, path in paths.items():
        texts, labels, ids = _read_tsv(path, len(names))
        out[split] = build_split(texts, labels, names, ids)
    return DatasetDict(out)


def _from_hub(splits) -> DatasetDict:  # pragma: no cover - needs network
    from datasets import load_dataset

    try:
        raw = load_dataset(HUB_ID, "simplified")
    except Exception as err:
        raise ValueError(
            f"goemotions: could not load {HUB_ID} from the Hub ({err}); pass data_dir with {_EXPECTED}"
        ) from err
    names = list(raw["train"].features["labels"].feature.names)
    out = {}
    for split in splits:
        ds = raw[split].select_columns(["text", "labels", "id"])
        out[split] = ds.cast(make_features(names, with_id=True))
    return DatasetDict(out)
