"""Reuters-21578 loader: a small SGML fixture in the real format, plus a slow check on the real files."""

from __future__ import annotations

import os

import numpy as np
import pytest
from conftest import SHARED_DATA

from hf_mlcl.data import label_names, load_mlc_dataset, train_frequency

_HEAD = '<!DOCTYPE lewis SYSTEM "lewis.dtd">\n'


def _doc(newid, topics, split, text, topics_attr="YES"):
    d = "".join(f"<D>{t}</D>" for t in topics)
    return (
        f'<REUTERS TOPICS="{topics_attr}" LEWISSPLIT="{split}" CGISPLIT="TRAINING-SET" OLDID="{5000 + newid}" '
        f'NEWID="{newid}">\n<DATE>26-FEB-1987 15:01:01.79</DATE>\n<TOPICS>{d}</TOPICS>\n'
        "<PLACES><D>usa</D></PLACES>\n<PEOPLE></PEOPLE>\n<ORGS></ORGS>\n<EXCHANGES></EXCHANGES>\n"
        "<COMPANIES></COMPANIES>\n<UNKNOWN> \n&#5;&#5;&#5;C T\n&#22;&#22;&#1;f0704&#31;reute\n"
        f"u f BC-DOC-{newid}   02-26 0105</UNKNOWN>\n{text}\n</REUTERS>\n"
    )


def _norm(title, body):
    return (
        f"<TEXT>&#2;\n<TITLE>{title}</TITLE>\n<DATELINE>    NEW YORK, Feb 26 - </DATELINE><BODY>{body}\n"
        " Reuter\n&#3;</BODY></TEXT>"
    )


def _write_fixture(d):
    """Two files; categories: earn (train 3, test 1), acq (train 2, test 1), grain (train 1, test 0),
    cocoa (train 0, test 1) -> R90-style set {acq, earn}; 'all' adds cocoa and grain."""
    docs0 = [
        _doc(
            1,
            ["earn"],
            "TRAIN",
            _norm("PROFIT &lt;XYZ&gt; UP", "Net shr 1.20 dlrs\nvs 1.10 dlrs &amp; more."),
        ),
        _doc(2, ["earn", "acq"], "TRAIN", _norm("MERGER AND EARNINGS", "Company said it\n  agreed to buy.")),
        _doc(
            3,
            ["grain"],
            "TRAIN",
            '<TEXT TYPE="BRIEF">&#2;\n******<TITLE>WHEAT CROP SEEN LOWER\n</TITLE>'
            "Blah blah blah.\n&#3;\n\n</TEXT>",
        ),
        _doc(4, [], "TRAIN", _norm("NO TOPIC HERE", "Body of a document without topics.")),  # no topics
        _doc(5, ["earn"], "NOT-USED", _norm("NOT USED", "Outside ModApte."), topics_attr="YES"),
        _doc(6, ["earn"], "TRAIN", _norm("BYPASSED", "TOPICS=BYPASS is not ModApte."), topics_attr="BYPASS"),
    ]
    docs1 = [
        _doc(
            7,
            ["acq"],
            "TRAIN",
            '<TEXT TYPE="UNPROC">&#2;\nFEDERAL RESERVE REPORT - FEB 26\n'
            " Net free reserves.....644 vs.....1,337\n&#3;</TEXT>",
        ),
        _doc(8, ["earn"], "TRAIN", _norm("CAF\xc9 PROFIT", "Non-UTF-8 byte here.")),
        _doc(9, ["earn"], "TEST", _norm("TEST EARN", "Test body.")),
        _doc(10, ["acq", "cocoa"], "TEST", _norm("TEST ACQ", "Test body two.")),
        _doc(11, ["cocoa"], "TEST", _norm("TEST COCOA", "Only cocoa.")),
    ]
    with open(d / "reut2-000.sgm", "wb") as f:
        f.write((_HEAD + "".join(docs0)).encode("ascii"))
    with open(d / "reut2-001.sgm", "wb") as f:
        f.write((_HEAD + "".join(docs1)).encode("latin-1"))  # 0xC9 is not valid UTF-8
    (d / "all-topics-strings.lc.txt").write_text("acq\ncocoa\nearn\ngrain\n")


@pytest.fixture
def reuters_dir(tmp_path):
    d = tmp_path / "reuters21578"
    d.mkdir()
    _write_fixture(d)
    with pytest.raises(UnicodeDecodeError):  # the fixture really holds a non-UTF-8 byte
        (d / "reut2-001.sgm").read_bytes().decode("utf-8")
    return d


def test_reuters_modapte_r90_text_and_ids(reuters_dir):
    dd = load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=0)
    assert label_names(dd) == ["acq", "earn"]  # >= 1 train and >= 1 test doc
    train = dd["train"]
    # ModApte train with an R90 label: 1, 2, 7, 8 (3 has only grain, 4 no topics, 5 NOT-USED, 6 BYPASS)
    assert train["id"] == ["1", "2", "7", "8"]
    assert train["labels"] == [[1], [0, 1], [0], [1]]
    assert train["text"][0] == "PROFIT <XYZ> UP\nNet shr 1.20 dlrs vs 1.10 dlrs & more. Reuter"
    assert train["text"][1] == "MERGER AND EARNINGS\nCompany said it agreed to buy. Reuter"
    assert train["text"][2] == "FEDERAL RESERVE REPORT - FEB 26 Net free reserves.....644 vs.....1,337"
    assert train["text"][3] == "CAF\xc9 PROFIT\nNon-UTF-8 byte here. Reuter"
    assert len(dd["validation"]) == 0
    assert dd["test"]["id"] == ["9", "10"] and dd["test"]["labels"] == [[1], [0]]  # 11: cocoa only, dropped
    assert all(
        "&" not in t.replace("& more", "") and "\x02" not in t and "\x03" not in t for t in train["text"]
    )


def test_reuters_category_sets_brief_and_unlabeled(reuters_dir):
    dd = load_mlc_dataset("reuters", data_dir=reuters_dir, categories="all", validation_size=0)
    assert label_names(dd) == ["acq", "cocoa", "earn", "grain"]
    assert dd["train"]["id"] == ["1", "2", "3", "7", "8"]
    assert dd["train"]["text"][2] == "WHEAT CROP SEEN LOWER"  # BRIEF: title only, no "Blah blah blah."
    assert dd["test"]["labels"] == [[2], [0, 1], [1]]
    kept = load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=0, keep_unlabeled=True)
    assert kept["train"]["id"] == ["1", "2", "3", "4", "7", "8"]  # 3 (grain only) and 4 (no topics) kept
    assert kept["train"]["labels"][2] == [] and kept["train"]["labels"][3] == []
    assert kept["train"]["text"][3] == "NO TOPIC HERE\nBody of a document without topics. Reuter"
    r10 = load_mlc_dataset("reuters21578", data_dir=reuters_dir, categories="r10", validation_size=0)
    assert label_names(r10) == ["acq", "earn", "grain"]  # the fixture has only 3 train categories
    listed = load_mlc_dataset("reuters21578", data_dir=reuters_dir, categories=["grain"], validation_size=0)
    assert label_names(listed) == ["grain"] and listed["train"]["id"] == ["3"] and len(listed["test"]) == 0


def test_reuters_seeded_validation(reuters_dir):
    a = load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=2, seed=3)
    b = load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=0.5, seed=3)
    assert len(a["train"]) == 2 and len(a["validation"]) == 2
    assert a["validation"]["id"] == b["validation"]["id"]  # 0.5 of 4 == 2, same seed, same draw
    assert sorted(list(a["train"]["id"]) + list(a["validation"]["id"])) == ["1", "2", "7", "8"]
    draws = {
        tuple(
            load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=2, seed=s)["validation"][
                "id"
            ]
        )
        for s in range(8)
    }
    assert len(draws) > 1  # the seed changes the draw
    only = load_mlc_dataset("reuters21578", data_dir=reuters_dir, splits=("val",), validation_size=2, seed=3)
    assert list(only) == ["validation"] and only["validation"]["id"] == a["validation"]["id"]


def test_reuters_errors(reuters_dir, tmp_path):
    with pytest.raises(ValueError, match="data_dir is required.*reut2-000.sgm"):
        load_mlc_dataset("reuters21578")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no reut2-\\*.sgm file in folder"):
        load_mlc_dataset("reuters21578", data_dir=empty)
    with pytest.raises(ValueError, match="categories='r52' is not one of"):
        load_mlc_dataset("reuters21578", data_dir=reuters_dir, categories="r52")
    with pytest.raises(ValueError, match="'nope'.*do not occur"):
        load_mlc_dataset("reuters21578", data_dir=reuters_dir, categories=["earn", "nope"])
    with pytest.raises(ValueError, match="leaves no training documents"):
        load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=4)
    with pytest.raises(
        ValueError, match="unexpected keyword argument 'subset'; its options are .*'categories'"
    ):
        load_mlc_dataset("reuters21578", data_dir=reuters_dir, subset="r90")
    # 1.0, 2.5 and True carved 1, 2 and 1 documents: a fraction is a float below 1, a count a whole number
    for bad in (1.0, 2.5, True, -1, float("nan"), "0.1"):
        with pytest.raises(ValueError, match="fraction in \\[0, 1\\) or a whole count"):
            load_mlc_dataset("reuters21578", data_dir=reuters_dir, validation_size=bad)


@pytest.mark.slow
def test_real_reuters21578_counts():
    path = os.path.join(SHARED_DATA, "reuters21578")
    if not os.path.isdir(path):
        pytest.skip(f"{path} not present")
    every = load_mlc_dataset(
        "reuters21578", data_dir=path, categories="all", validation_size=0, keep_unlabeled=True
    )
    assert (len(every["train"]), len(every["test"])) == (9603, 3299)  # ModApte before category filtering
    dd = load_mlc_dataset("reuters21578", data_dir=path)
    names = label_names(dd)
    assert len(names) == 90 and "earn" in names and "acq" in names
    n_train, n_val, n_test = (len(dd[s]) for s in ("train", "validation", "test"))
    assert n_train + n_val == 7770 and n_test == 3019 and n_val == 777
    ids = [set(dd[s]["id"]) for s in ("train", "validation", "test")]
    assert not ids[0] & ids[1] and not ids[0] & ids[2] and not ids[1] & ids[2]
    labels = list(dd["train"]["labels"]) + list(dd["validation"]["labels"]) + list(dd["test"]["labels"])
    assert all(labs for labs in labels)
    card = np.mean([len(x) for x in labels])
    assert 1.2 < card < 1.3  # README: ~1.24 labels per document
    freq = train_frequency(dd["train"]) + train_frequency(dd["validation"])
    assert freq.min() >= 1 and names[int(freq.argmax())] == "earn"
    assert all(t and "&lt;" not in t and "&#" not in t and "\x03" not in t for t in dd["test"]["text"])
    r10 = load_mlc_dataset("reuters21578", data_dir=path, categories="r10")
    assert label_names(r10) == sorted(
        ["earn", "acq", "money-fx", "grain", "crude", "trade", "interest", "ship", "wheat", "corn"]
    )
    assert (len(r10["train"]) + len(r10["validation"]), len(r10["test"])) == (6490, 2545)
    alltopics = load_mlc_dataset("reuters21578", data_dir=path, categories="all")
    assert len(label_names(alltopics)) == 118
    assert (len(alltopics["train"]) + len(alltopics["validation"]), len(alltopics["test"])) == (7775, 3019)
