"""Loaders on small fixture files written in the real formats, plus slow checks on ../shared/data."""

from __future__ import annotations

import csv
import json
import logging
import os

import numpy as np
import pytest
from conftest import SHARED_DATA
from datasets import ClassLabel

from hf_mlcl.data import (
    filter_by_hadm_ids,
    label_names,
    list_datasets,
    load_mlc_dataset,
    read_hadm_split_ids,
    train_frequency,
)
from hf_mlcl.data.registry import read_id_list


def _check_schema(dd, names):
    for ds in dd.values():
        assert ds.features["text"].dtype == "string"
        inner = ds.features["labels"].feature
        assert isinstance(inner, ClassLabel) and list(inner.names) == list(names)
    assert label_names(dd) == list(names)


def _write(path, text):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


# ---------------------------------------------------------------- registry
def test_registry_names_and_errors(tmp_path):
    assert list_datasets() == sorted(
        [
            "aapd",
            "rcv1",
            "uklex",
            "mimic3",
            "mimic4_icd9",
            "mimic4_icd10",
            "goemotions",
            "reuters21578",
            "synthetic",
        ]
    )
    with pytest.raises(ValueError, match="unknown dataset 'nope'.*aapd"):
        load_mlc_dataset("nope")
    with pytest.raises(ValueError, match="data_dir is required.*text_"):
        load_mlc_dataset("aapd")
    with pytest.raises(FileNotFoundError, match="not a folder"):
        load_mlc_dataset("aapd", data_dir=tmp_path / "missing")
    with pytest.raises(ValueError, match="unexpected keyword argument 'nonsense'"):
        load_mlc_dataset("synthetic", nonsense=1)
    with pytest.raises(ValueError, match="unexpected keyword argument 'colour'"):
        load_mlc_dataset("mimic3", data_dir=tmp_path, colour=1)
    with pytest.raises(ValueError, match="unknown split"):
        load_mlc_dataset("synthetic", splits=("training",))
    from datasets import Dataset

    with pytest.raises(ValueError, match="not Sequence\\(ClassLabel\\)"):
        label_names(Dataset.from_dict({"text": ["a"], "labels": [[0]]}))


# ---------------------------------------------------------------- AAPD
@pytest.fixture
def aapd_dir(tmp_path):
    d = tmp_path / "aapd"
    d.mkdir()
    data = {
        "train": (["a b c", "d e f", "g h"], ["cs.AI cs.LG", "math.IT", "cs.LG"]),
        "val": (["x y"], ["cs.AI"]),
        "test": (["z", "w v"], ["math.IT cs.AI", "cs.LG"]),
    }
    for s, (t, lab) in data.items():
        _write(d / f"text_{s}", "\n".join(t) + "\n")
        _write(d / f"label_{s}", "\n".join(lab) + "\n")
    return d


def test_aapd_fixture(aapd_dir):
    dd = load_mlc_dataset("aapd", data_dir=aapd_dir)
    names = ["cs.AI", "cs.LG", "math.IT"]  # sorted union of the label files
    _check_schema(dd, names)
    assert [len(dd[s]) for s in ("train", "validation", "test")] == [3, 1, 2]
    assert dd["train"][0] == {"text": "a b c", "labels": [0, 1]}
    assert dd["test"]["labels"] == [[0, 2], [1]]
    # labels.txt order wins when present
    _write(aapd_dir / "labels.txt", "math.IT\ncs.LG\ncs.AI\n")
    dd = load_mlc_dataset("aapd", data_dir=aapd_dir, splits="test")
    assert list(dd) == ["test"] and label_names(dd) == ["math.IT", "cs.LG", "cs.AI"]
    assert dd["test"]["labels"] == [[0, 2], [1]]


def test_aapd_missing_and_misaligned(aapd_dir):
    os.remove(aapd_dir / "text_train")
    with pytest.raises(FileNotFoundError) as err:
        load_mlc_dataset("aapd", data_dir=aapd_dir)
    msg = str(err.value)
    assert "text_train" in msg and str(aapd_dir) in msg and "splits=" in msg
    dd = load_mlc_dataset("aapd", data_dir=aapd_dir, splits=("val", "test"))
    assert list(dd) == ["validation", "test"]
    assert label_names(dd) == ["cs.AI", "cs.LG", "math.IT"]  # label_train still counts
    _write(aapd_dir / "label_test", "cs.AI\n")
    with pytest.raises(ValueError, match="aligned"):
        load_mlc_dataset("aapd", data_dir=aapd_dir, splits=["test"])
    _write(aapd_dir / "labels.txt", "cs.AI\n")
    _write(aapd_dir / "label_test", "cs.AI\nunknown.X\n")
    with pytest.raises(ValueError, match="unknown.X"):
        load_mlc_dataset("aapd", data_dir=aapd_dir, splits=["test"])


# ---------------------------------------------------------------- GoEmotions
@pytest.fixture
def goemotions_dir(tmp_path):
    d = tmp_path / "ge"
    d.mkdir()
    _write(d / "emotions.txt", "admiration\njoy\nneutral\n")
    rows = {
        "train": [["I love it", "1", "c1"], ['He said "hi"\tand left', "0,2", "c2"], ["meh", "2", "c3"]],
        "dev": [["ok", "2", "c4"]],
        "test": [["wow, great", "0,1", "c5"]],
    }
    for name, rs in rows.items():
        with open(d / f"{name}.tsv", "w", encoding="utf-8", newline="") as f:
            csv.writer(f, delimiter="\t", lineterminator="\n").writerows(rs)
    return d


def test_goemotions_fixture_quoted(goemotions_dir):
    raw = (goemotions_dir / "train.tsv").read_text()
    assert '"He said ""hi""\tand left"' in raw  # the writer really quoted the field
    dd = load_mlc_dataset("goemotions", data_dir=goemotions_dir)
    _check_schema(dd, ["admiration", "joy", "neutral"])
    assert dd["train"][1] == {"text": 'He said "hi"\tand left', "labels": [0, 2], "id": "c2"}
    assert [len(dd[s]) for s in dd] == [3, 1, 1]
    _write(goemotions_dir / "test.tsv", "bad\t7\tc9\n")
    with pytest.raises(ValueError, match="out of range"):
        load_mlc_dataset("goemotions", data_dir=goemotions_dir, splits="test")
    _write(goemotions_dir / "test.tsv", "bad\tjoy\tc9\n")
    with pytest.raises(ValueError, match=r"test.tsv:1 labels 'joy' are not comma-separated label ids"):
        load_mlc_dataset("goemotions", data_dir=goemotions_dir, splits="test")


def test_goemotions_offline_message(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    with pytest.raises(ValueError, match="offline.*train.tsv.*emotions.txt"):
        load_mlc_dataset("goemotions")


# ---------------------------------------------------------------- RCV1
_HIER = """parent: None       child: Root       child-description: Root
parent: Root       child: CCAT       child-description: CORPORATE/INDUSTRIAL
parent: CCAT       child: C15        child-description: PERFORMANCE
parent: C15        child: C151       child-description: ACCOUNTS/EARNINGS
parent: Root       child: GCAT       child-description: GOVERNMENT/SOCIAL
parent: GCAT       child: GSPO       child-description: SPORTS
"""


@pytest.fixture
def rcv1_dir(tmp_path):
    d = tmp_path / "rcv1"
    d.mkdir()
    _write(d / "rcv1.topics.hier.orig", _HIER)
    rng = np.random.default_rng(0)
    recs = []
    for i in range(40):
        doc_id = 2286 + i * 1000  # ids 2286..41286: first 24 are LYRL train (<= 26150)
        topics = ["CCAT", "C15", "C151"] if i % 2 else ["GCAT", "GSPO"]
        if i % 7 == 0:
            topics = ["CCAT"]
        recs.append(
            {"id": doc_id, "text": f"doc {i} " + " ".join(rng.choice(list("abcdef"), 5)), "topics": topics}
        )
    rng.shuffle(recs)
    with open(d / "rcv1.jsonl", "w") as f:
        for r in recs:
            f.write(json.dumps(r) + "\n")
    return d, recs


def test_rcv1_fixture(rcv1_dir):
    d, recs = rcv1_dir
    dd = load_mlc_dataset("rcv1", data_dir=d, validation_size=4, seed=3)
    _check_schema(dd, ["CCAT", "C15", "C151", "GCAT", "GSPO"])
    assert (len(dd["train"]), len(dd["validation"]), len(dd["test"])) == (20, 4, 16)
    train_ids = {int(x) for x in list(dd["train"]["id"]) + list(dd["validation"]["id"])}
    assert max(train_ids) <= 26150 and min(int(x) for x in dd["test"]["id"]) > 26150
    assert not set(dd["train"]["id"]) & set(dd["validation"]["id"])
    again = load_mlc_dataset("rcv1", data_dir=d, validation_size=4, seed=3)
    assert again["validation"]["id"] == dd["validation"]["id"]  # fixed seed -> same carve-out
    other = load_mlc_dataset("rcv1", data_dir=d, validation_size=4, seed=4)
    assert other["validation"]["id"] != dd["validation"]["id"]
    by_id = {str(r["id"]): r for r in recs}
    names = label_names(dd)
    for row in dd["test"]:
        assert sorted(names[i] for i in row["labels"]) == sorted(by_id[row["id"]]["topics"])
    with pytest.raises(FileNotFoundError, match="my_topics.hier"):  # a hierarchy named but absent
        load_mlc_dataset("rcv1", data_dir=d, hierarchy_file="my_topics.hier")


def test_rcv1_min_count_ancestors_and_csv(rcv1_dir):
    d, recs = rcv1_dir
    # In the 24 LYRL training docs (i = 0..23): CCAT 14 (odd i, and i % 7 == 0), C15/C151/GCAT/GSPO 10 each.
    dd = load_mlc_dataset("rcv1", data_dir=d, validation_size=0.25, min_label_count=10)
    assert label_names(dd) == ["CCAT", "C15", "C151", "GCAT", "GSPO"]
    assert len(dd["validation"]) == 6
    dd = load_mlc_dataset("rcv1", data_dir=d, min_label_count=11)
    assert label_names(dd) == ["CCAT"] and sum(len(x) == 0 for x in dd["test"]["labels"]) == 7
    dd2 = load_mlc_dataset("rcv1", data_dir=d, min_label_count=11, drop_unlabeled=True)
    assert all(len(x) > 0 for s in dd2.values() for x in s["labels"]) and len(dd2["test"]) == 9
    # csv with topic strings, leaves only -> ancestors added from the hierarchy
    os.remove(d / "rcv1.jsonl")
    with open(d / "rcv1.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text", "topics"])
        w.writerow([100, "early, train doc", "C151"])
        w.writerow([30000, "test doc", "GSPO"])
    dd = load_mlc_dataset("rcv1", data_dir=d, validation_size=0, add_ancestors=True)
    names = label_names(dd)
    assert sorted(names[i] for i in dd["train"][0]["labels"]) == ["C15", "C151", "CCAT"]
    assert sorted(names[i] for i in dd["test"][0]["labels"]) == ["GCAT", "GSPO"]
    os.remove(d / "rcv1.csv")
    with pytest.raises(FileNotFoundError, match="rcv1.jsonl"):
        load_mlc_dataset("rcv1", data_dir=d)


# ---------------------------------------------------------------- UK-LEX
def test_uklex_fixture(tmp_path):
    d = tmp_path / "uklex"
    d.mkdir()
    recs = [
        {
            "title": "Finance Act",
            "body": "tax rules",
            "labels": {"uklex18": ["TAX"], "uklex69": ["INCOME TAX"]},
            "data_type": "train",
        },
        {
            "title": "Health Act",
            "body": "nhs",
            "labels": {"uklex18": ["HEALTH", "TAX"], "uklex69": ["NHS", "VAT"]},
            "data_type": "train",
        },
        {
            "title": "Roads Act",
            "body": "cars",
            "labels": {"uklex18": ["TRANSPORT"], "uklex69": ["ROADS"]},
            "data_type": "validation",
        },
        {
            "title": "Sea Act",
            "body": "",
            "labels": {"uklex18": ["TRANSPORT"], "uklex69": ["SHIPPING"]},
            "data_type": "test",
        },
    ]
    _write(d / "uklex.jsonl", "".join(json.dumps(r) + "\n" for r in recs))
    dd = load_mlc_dataset("uklex", data_dir=d)
    _check_schema(dd, ["HEALTH", "TAX", "TRANSPORT"])
    assert dd["train"][0] == {"text": "Finance Act [SEP] tax rules", "labels": [1]}
    assert dd["test"][0]["text"] == "Sea Act"
    dd69 = load_mlc_dataset("uklex", data_dir=d, version=69, sep_token=" </s> ")
    assert label_names(dd69) == ["INCOME TAX", "NHS", "ROADS", "SHIPPING", "VAT"]
    assert dd69["train"][1] == {"text": "Health Act </s> nhs", "labels": [1, 4]}
    with pytest.raises(ValueError, match="18 or 69"):
        load_mlc_dataset("uklex", data_dir=d, version=20)
    # flat list labels + a names file
    _write(
        d / "uklex.jsonl", "".join(json.dumps({**r, "labels": r["labels"]["uklex18"]}) + "\n" for r in recs)
    )
    _write(d / "labels_18.txt", "TRANSPORT\nTAX\nHEALTH\n")
    dd = load_mlc_dataset("uklex", data_dir=d, splits=["train"])
    assert label_names(dd) == ["TRANSPORT", "TAX", "HEALTH"] and dd["train"]["labels"] == [[1], [1, 2]]


# ---------------------------------------------------------------- MIMIC
_NOTE = 'Admission Date: [**2100-1-1**]\nchest pain, "quoted", dyspnea'


def _write_caml(d, rows_by_file, header=("SUBJECT_ID", "HADM_ID", "TEXT", "LABELS", "length")):
    for fname, rows in rows_by_file.items():
        with open(d / fname, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            for subj, hadm, text, labels in rows:
                w.writerow([subj, hadm, text, ";".join(labels), len(text.split())][: len(header)])


@pytest.fixture
def mimic3_dir(tmp_path):
    d = tmp_path / "mimic3"
    d.mkdir()
    full = {
        "train_full.csv": [
            (1, 101, _NOTE, ["401.9", "96.04"]),
            (2, 102, "note two", ["V58.61"]),
            (3, 103, "n3", ["401.9"]),
        ],
        "dev_full.csv": [(4, 104, "dev note", ["401.9", "999.9"])],
        "test_full.csv": [(5, 105, "test note", ["96.04"]), (6, 106, "t6", ["V58.61"])],
    }
    _write_caml(d, full)
    _write_caml(d, {k.replace("full", "50"): [r for r in v if "401.9" in r[3]] for k, v in full.items()})
    return d


def test_mimic3_caml_full_and_50(mimic3_dir):
    dd = load_mlc_dataset("mimic3", data_dir=mimic3_dir)
    names = ["401.9", "96.04", "V58.61"]  # label space = training codes (999.9 only in dev: dropped)
    _check_schema(dd, names)
    assert dd["train"][0] == {"text": _NOTE, "labels": [0, 1], "id": "101"}
    assert dd["validation"]["labels"] == [[0]]
    assert [len(dd[s]) for s in dd] == [3, 1, 2]
    dd50 = load_mlc_dataset("mimic3", data_dir=mimic3_dir, variant="50", splits=["train", "test"])
    assert [len(dd50[s]) for s in dd50] == [2, 0]
    (mimic3_dir / "codes.txt").write_text("96.04\n401.9\n999.9\n")
    ddc = load_mlc_dataset("mimic3", data_dir=mimic3_dir, code_list="codes.txt", splits=["validation"])
    assert label_names(ddc) == ["96.04", "401.9", "999.9"] and ddc["validation"]["labels"] == [[1, 2]]
    with pytest.raises(ValueError, match="variant"):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir, variant="100")
    os.remove(mimic3_dir / "test_full.csv")
    with pytest.raises(FileNotFoundError, match="test_full.csv.*credentialed|test_full.csv"):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir)


def test_mimic3_resplit_by_hadm_id_lists(mimic3_dir, tmp_path):
    ids_dir = tmp_path / "ids"
    ids_dir.mkdir()
    for name, ids in {"train": [101, 103, 105], "dev": [102], "test": [104, 106]}.items():
        (ids_dir / f"{name}_full_hadm_ids.csv").write_text("".join(f"{i}\n" for i in ids))
    # one csv with every admission
    rows = []
    for fname in ("train_full.csv", "dev_full.csv", "test_full.csv"):
        with open(mimic3_dir / fname, newline="") as f:
            rows += [
                (r["SUBJECT_ID"], r["HADM_ID"], r["TEXT"], r["LABELS"].split(";")) for r in csv.DictReader(f)
            ]
    _write_caml(mimic3_dir, {"notes_labeled.csv": rows})
    dd = load_mlc_dataset("mimic3", data_dir=mimic3_dir, file="notes_labeled.csv", split_ids_dir=ids_dir)
    assert dd["train"]["id"] == ["101", "103", "105"] and dd["validation"]["id"] == ["102"]
    assert dd["test"]["id"] == ["104", "106"]
    assert read_hadm_split_ids(ids_dir)["test"] == ["104", "106"]
    full = load_mlc_dataset("mimic3", data_dir=mimic3_dir)["train"]
    sub = filter_by_hadm_ids(full, ids_dir / "train_full_hadm_ids.csv")
    assert sub["id"] == ["101", "103"] and sub.features == full.features
    shuffled = full.shuffle(
        seed=0
    )  # rows mapped through indices: the filter reads the ids as the rows see them
    assert sorted(filter_by_hadm_ids(shuffled, ["101", "103"])["id"]) == ["101", "103"]
    assert filter_by_hadm_ids(full.select([1, 0]), ["101"])["id"] == ["101"]


def test_mimic3_split_lists_that_share_admissions_or_name_none_are_one_line_errors(mimic3_dir, tmp_path):
    """A validation list holding training admissions scored the model on what it trained on, and lists of
    other ids (a SUBJECT_ID list) gave three empty splits; both used to load without an error."""
    ids_dir = tmp_path / "ids"
    ids_dir.mkdir()

    def lists(train, dev, test):
        for name, ids in {"train": train, "dev": dev, "test": test}.items():
            (ids_dir / f"{name}_full_hadm_ids.csv").write_text("".join(f"{i}\n" for i in ids))

    lists([101, 103], [101, 102], [104])
    with pytest.raises(ValueError, match=r"1 HADM ids of the validation split are also in train .*'101'"):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir, file="train_full.csv", split_ids_dir=ids_dir)
    lists([1, 2], [3], [4])
    with pytest.raises(ValueError, match="name none of the 3 admissions"):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir, file="train_full.csv", split_ids_dir=ids_dir)
    # the CAML files are checked the same way
    _write_caml(mimic3_dir, {"dev_full.csv": [(3, 103, "n3", ["401.9"])]})
    with pytest.raises(ValueError, match="validation split are also in train"):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir)


def test_mimic4_icd10_nguyen_csv_strips_dots(tmp_path):
    d = tmp_path / "m4"
    d.mkdir()
    hdr = ("subject_id", "hadm_id", "text", "labels")
    _write_caml(
        d,
        {
            "train_full.csv": [(1, 201, "a", ["I10", "E119"]), (2, 202, "b", ["Z7901"])],
            "dev_full.csv": [(3, 203, "c", ["I10"])],
            "test_full.csv": [(4, 204, "d", ["E119", "Z7901"])],
        },
        header=hdr,
    )
    dd = load_mlc_dataset("mimic4_icd10", data_dir=d)
    _check_schema(dd, ["E119", "I10", "Z7901"])
    assert dd["test"]["labels"] == [[0, 2]]
    (d / "codes.txt").write_text("I10\nE11.9\nZ79.01\n")  # dotted list matches dot-less csv codes
    dd = load_mlc_dataset("mimic4_icd10", data_dir=d, code_list="codes.txt", splits=["test"])
    assert label_names(dd) == ["I10", "E119", "Z7901"] and dd["test"]["labels"] == [[1, 2]]
    for s in ("train", "dev", "test"):
        os.rename(d / f"{s}_full.csv", d / f"mimic4_icd10_{s}.csv")
    dd = load_mlc_dataset("mimic4_icd10", data_dir=d, file_template="mimic4_icd10_{split}.csv")
    assert [len(dd[s]) for s in dd] == [2, 1, 1]


def test_mimic4_edin_feather(tmp_path):
    pd = pytest.importorskip("pandas")
    d = tmp_path / "edin"
    d.mkdir()
    docs = pd.DataFrame(
        {
            "_id": [301, 302, 303, 304, 305],
            "text": ["t1", "t2", "t3", "t4", "t5"],
            "target": [["250.00", "401.9"], ["401.9"], ["038.9"], ["401.9", "038.9"], ["999.0"]],
        }
    )
    docs.to_feather(d / "mimiciv_icd9.feather")
    pd.DataFrame(
        {"_id": [301, 302, 303, 304, 305], "split": ["train", "train", "val", "test", "test"]}
    ).to_feather(d / "mimiciv_icd9_split.feather")
    dd = load_mlc_dataset("mimic4_icd9", data_dir=d)
    _check_schema(dd, ["250.00", "401.9"])
    assert dd["train"]["id"] == ["301", "302"] and dd["validation"]["labels"] == [[]]
    assert dd["test"]["labels"] == [[1], []]
    freq = train_frequency(dd["train"])
    assert freq.tolist() == [1, 2]
    dd50 = load_mlc_dataset("mimic4_icd9", data_dir=d, variant="50")  # top-50 of 2 codes; unlabeled dropped
    assert len(dd50["validation"]) == 0 and len(dd50["test"]) == 1
    # every split name the loaders know ("valid" too) keeps its admissions
    pd.DataFrame(
        {"_id": [301, 302, 303, 304, 305], "split": ["train", "train", "valid", "test", "test"]}
    ).to_feather(d / "mimiciv_icd9_split.feather")
    assert load_mlc_dataset("mimic4_icd9", data_dir=d)["validation"]["id"] == ["303"]


def _edin(d, name, ids, texts, targets, split_ids=None, splits=None):
    pd = pytest.importorskip("pandas")
    pd.DataFrame({"_id": ids, "text": texts, "target": targets}).to_feather(d / f"{name}.feather")
    split_ids = ids if split_ids is None else split_ids
    splits = splits or ["train", "train", "val", "test"][: len(split_ids)]
    pd.DataFrame({"_id": split_ids, "split": splits}).to_feather(d / f"{name}_split.feather")


def test_edin_files_of_several_datasets_in_one_folder_are_told_apart(tmp_path, caplog):
    d = tmp_path / "edin"
    d.mkdir()
    _edin(
        d,
        "mimiciv_icd9",
        [1, 2, 3, 4],
        ["a9", "b9", "c9", "d9"],
        [["401.9"], ["401.9"], ["038.9"], ["401.9"]],
    )
    _edin(
        d, "mimiciv_icd10", [5, 6, 7, 8], ["a10", "b10", "c10", "d10"], [["I10"], ["E11.9"], ["I10"], ["I10"]]
    )
    assert load_mlc_dataset("mimic4_icd9", data_dir=d)["train"]["text"] == ["a9", "b9"]
    assert load_mlc_dataset("mimic4_icd10", data_dir=d)["train"]["text"] == ["a10", "b10"]
    with pytest.raises(ValueError, match="which document file for mimic3.*pass feather_file="):
        load_mlc_dataset("mimic3", data_dir=d)
    alone = tmp_path / "alone"
    alone.mkdir()
    _edin(alone, "mimiciv_icd10", [5, 6, 7, 8], ["a", "b", "c", "d"], [["I10"], ["I10"], ["I10"], ["I10"]])
    with pytest.raises(ValueError, match="mimiciv_icd10.feather \\(expected mimiciv_icd9\\)"):
        load_mlc_dataset("mimic4_icd9", data_dir=alone)  # another dataset's file is never read as this one
    m3 = tmp_path / "m3"
    m3.mkdir()
    _edin(m3, "mimiciii_50", [1, 2, 3, 4], ["f1", "f2", "f3", "f4"], [["401.9"]] * 4)
    _edin(m3, "mimiciii_full", [1, 2, 3, 4], ["F1", "F2", "F3", "F4"], [["401.9"]] * 4)
    assert load_mlc_dataset("mimic3", data_dir=m3, variant="full")["train"]["text"] == ["F1", "F2"]
    assert load_mlc_dataset("mimic3", data_dir=m3, variant="50")["train"]["text"] == ["f1", "f2"]


def test_edin_ids_of_another_dtype_and_missing_texts(tmp_path, caplog):
    d = tmp_path / "edin"
    d.mkdir()
    # the split file's _id as floats, the documents' as ints; one admission unlisted, one without text
    _edin(
        d, "mimiciv_icd9", [1, 2, 3, 4, 5], ["a", None, "c", "d", "e"], [["401.9"]] * 5, [1.0, 2.0, 3.0, 4.0]
    )
    with caplog.at_level(logging.WARNING):
        dd = load_mlc_dataset("mimic4_icd9", data_dir=d)
    assert dd["train"]["id"] == ["1"] and dd["validation"]["id"] == ["3"] and dd["test"]["id"] == ["4"]
    assert "1 of the 5 admissions" in caplog.text and "are not listed" in caplog.text
    assert "have no text" in caplog.text and "'nan'" not in str(dd["train"]["text"])
    _edin(d, "mimiciv_icd9", [1, 2, 3, 4], list("abcd"), [["401.9"]] * 4, [11, 12, 13, 14])
    with pytest.raises(ValueError, match="lists none of the 4 admissions"):
        load_mlc_dataset("mimic4_icd9", data_dir=d)


def test_codes_written_with_other_dots_than_the_code_list_are_an_error(mimic3_dir, caplog):
    """ICD-9 codes written without dots beside a dotted code list matched only the dot-less codes and dropped
    the rest silently; strip_dots would merge distinct ICD-9 codes (11.49, a procedure; 114.9, a diagnosis)."""
    _write_caml(
        mimic3_dir,
        {
            "train_full.csv": [
                (1, 101, "a", ["4019", "9604"]),
                (2, 102, "b", ["4019"]),
                (3, 103, "c", ["311"]),
            ]
        },
    )
    (mimic3_dir / "codes.txt").write_text("401.9\n96.04\n311\n")
    with pytest.raises(
        ValueError, match="3 of the training split's 4 codes are in codes.txt only with their dots"
    ):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir, code_list="codes.txt")
    (mimic3_dir / "codes.txt").write_text("4019\n311\n")  # a smaller label space: a warning counts the rest
    with caplog.at_level(logging.WARNING):
        dd = load_mlc_dataset("mimic3", data_dir=mimic3_dir, code_list="codes.txt")
    assert (
        label_names(dd) == ["4019", "311"]
        and "1 of the training split's 4 codes are not in codes.txt" in caplog.text
    )
    (mimic3_dir / "codes.txt").write_text("11.49\n114.9\n401.9\n")
    with pytest.raises(
        ValueError, match="strip_dots=True would make 1 pairs of distinct codes one label.*11.49 and 114.9"
    ):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir, code_list="codes.txt", strip_dots=True)


@pytest.mark.parametrize(
    "content, match",
    [("SUBJECT_ID,HADM_ID\n1,101\n", "several columns"), ("ROW\n101\n", "its first line is 'ROW'")],
)
def test_a_hadm_id_list_of_another_shape_is_an_error(tmp_path, content, match):
    (tmp_path / "ids.csv").write_text(content)
    with pytest.raises(ValueError, match=match):
        read_id_list(tmp_path / "ids.csv")
    (tmp_path / "ids.csv").write_text("HADM_ID\n101\n102.0\n\n")
    assert read_id_list(tmp_path / "ids.csv") == ["101", "102"]


def test_mimic_names_a_missing_code_list_or_split_folder_before_reading_the_notes(
    mimic3_dir, tmp_path, monkeypatch
):
    import hf_mlcl.data.mimic as mimic

    def no_reading(*args, **kwargs):
        raise AssertionError("the notes were read before the files named were checked")

    monkeypatch.setattr(mimic, "_read_csv_docs", no_reading)
    with pytest.raises(FileNotFoundError, match="no_codes.txt"):
        load_mlc_dataset("mimic3", data_dir=mimic3_dir, code_list="no_codes.txt")
    with pytest.raises(FileNotFoundError, match="train_full_hadm_ids.csv"):
        load_mlc_dataset(
            "mimic3", data_dir=mimic3_dir, file="train_full.csv", split_ids_dir=tmp_path / "none"
        )


# ---------------------------------------------------------------- real files (slow)
def _shared(name):
    path = os.path.join(SHARED_DATA, name)
    if not os.path.isdir(path):
        pytest.skip(f"{path} not present")
    return path


@pytest.mark.slow
def test_real_aapd():
    path = _shared("aapd")
    dd = load_mlc_dataset("aapd", data_dir=path, splits=("validation", "test"))
    assert len(dd["validation"]) == 1000 and len(dd["test"]) == 1000
    names = label_names(dd)
    assert len(names) == 54 and names[0] == "cmp-lg"
    assert all(len(x) >= 1 for x in dd["test"]["labels"])
    if not os.path.isfile(os.path.join(path, "text_train")):
        with pytest.raises(FileNotFoundError, match="text_train"):
            load_mlc_dataset("aapd", data_dir=path)
    else:
        assert len(load_mlc_dataset("aapd", data_dir=path, splits="train")["train"]) == 53840


@pytest.mark.slow
def test_real_goemotions():
    dd = load_mlc_dataset("goemotions", data_dir=_shared("goemotions"))
    assert [len(dd[s]) for s in ("train", "validation", "test")] == [43410, 5426, 5427]
    names = label_names(dd)
    assert len(names) == 28 and names[0] == "admiration" and names[27] == "neutral"
    freq = train_frequency(dd["train"])
    assert freq.min() == 77 and (freq > 0).all()
    card = np.mean([len(x) for x in dd["train"]["labels"]])
    assert 1.15 < card < 1.21
    assert sum(len(x) > 1 for x in dd["train"]["labels"]) == 7102


@pytest.mark.slow
def test_real_mimic3_caml_id_lists():
    from datasets import Dataset

    path = os.path.join(_shared("mimic_splits"), "mimic3_caml")
    full, top50 = read_hadm_split_ids(path, "full"), read_hadm_split_ids(path, "50")
    every = sorted({i for ids in full.values() for i in ids} | {i for ids in top50.values() for i in ids})
    # a stand-in dataset holding every admission id, filtered by the id files as a loader would be
    ds = Dataset.from_dict({"text": every, "labels": [[0]] * len(every), "id": every})
    got_full = {
        s: filter_by_hadm_ids(ds, os.path.join(path, f"{p}_full_hadm_ids.csv"))
        for s, p in (("train", "train"), ("validation", "dev"), ("test", "test"))
    }
    got_50 = {
        s: filter_by_hadm_ids(ds, os.path.join(path, f"{p}_50_hadm_ids.csv"))
        for s, p in (("train", "train"), ("validation", "dev"), ("test", "test"))
    }
    assert [len(got_full[s]) for s in ("train", "validation", "test")] == [47723, 1631, 3372]
    assert [len(got_50[s]) for s in ("train", "validation", "test")] == [8066, 1573, 1729]
    sets = {s: set(got_full[s]["id"]) for s in got_full}
    assert not sets["train"] & sets["validation"] and not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]
    for s in got_50:
        assert set(got_50[s]["id"]) <= sets[s]
    codes = open(os.path.join(path, "ALL_CODES_plmicd.txt")).read().split()
    codes50 = open(os.path.join(path, "ALL_CODES_50_plmicd.txt")).read().split()
    assert len(codes) == 8921 and len(codes50) == 50 and set(codes50) <= set(codes)
