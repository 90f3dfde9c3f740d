"""Bring-your-own data through ``load_mlc_dataset``: every source (csv / tsv / json / jsonl / parquet
files, a Hub-shaped folder and a ``save_to_disk`` folder read with the Hub off, in-memory Dataset /
DatasetDict) and every label format (names, ids, delimited string, one 0/1 column per label), the
label-space rules, split carving, and the errors that must come before any training."""

from __future__ import annotations

import csv
import json
import logging
import os

import pytest
from conftest import SHARED_DATA
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets import Sequence as HFSequence

from hf_mlcl.data import data_notes, label_names, load_custom_dataset, load_mlc_dataset

ROWS = [  # (text, label names)
    ("graph neural networks for molecules", ["cs.LG", "q-bio"]),
    ("attention is all you need", ["cs.CL", "cs.LG"]),
    ("a theory of quantum gravity", ["hep-th"]),
    ("language models as knowledge bases", ["cs.CL"]),
    ("protein folding with deep learning", ["cs.LG", "q-bio"]),
    ("string theory and black holes", ["hep-th"]),
    ("parsing with transformers", ["cs.CL"]),
    ("optimisation of deep networks", ["cs.LG"]),
    ("gene regulatory networks", ["q-bio"]),
    ("machine translation for low resource languages", ["cs.CL", "cs.LG"]),
]
NAMES = sorted({lab for _, labs in ROWS for lab in labs})  # cs.CL, cs.LG, hep-th, q-bio


def _write_csv(path, rows, sep=",", label_fmt=lambda labs: ";".join(labs), header=("text", "labels")):
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter=sep)
        w.writerow(header)
        for text, labs in rows:
            w.writerow([text, label_fmt(labs)])
    return str(path)


def _as_names(dd):
    names = label_names(dd)
    return {s: [sorted(names[i] for i in row) for row in ds["labels"]] for s, ds in dd.items()}


def _expected(rows):
    return [sorted(labs) for _, labs in rows]


# ------------------------------------------------------------------------------------------ sources
def test_one_csv_with_delimited_labels_carves_a_seeded_validation_split(tmp_path, caplog):
    path = _write_csv(tmp_path / "my.csv", ROWS)
    with caplog.at_level(logging.INFO, logger="hf_mlcl.data.custom"):
        dd = load_mlc_dataset(path, validation_fraction=0.2, split_seed=3)
    assert set(dd) == {"train", "validation"} and len(dd["train"]) == 8 and len(dd["validation"]) == 2
    assert label_names(dd) == NAMES
    got = dict(
        zip(
            list(dd["train"]["text"]) + list(dd["validation"]["text"]),
            _as_names(dd)["train"] + _as_names(dd)["validation"],
        )
    )
    assert got == {t: sorted(labs) for t, labs in ROWS}  # every row once, labels intact
    notes = data_notes(dd)
    assert notes and "carved from train (2 of 10 rows, validation_fraction=0.2, seed=3)" in notes[0]
    assert "carved from train" in caplog.text
    again = load_mlc_dataset(path, validation_fraction=0.2, split_seed=3)
    assert list(again["validation"]["text"]) == list(dd["validation"]["text"])  # seeded
    other = load_mlc_dataset(path, validation_fraction=0.2, split_seed=4)
    assert list(other["validation"]["text"]) != list(dd["validation"]["text"])
    # a test split is carved only on request; without one there is none (no test metrics)
    three = load_mlc_dataset(path, validation_fraction=0.2, test_fraction=0.2)
    assert [len(three[s]) for s in ("train", "validation", "test")] == [6, 2, 2]
    # both fractions are shares of the train split as given (the test carve is not a share of what is left)
    half = load_mlc_dataset(path, validation_fraction=0.5, test_fraction=0.3)
    assert [len(half[s]) for s in ("train", "validation", "test")] == [2, 5, 3]


def test_tsv_per_split_with_a_dev_alias_and_id_labels_named_by_a_file(tmp_path):
    names_file = tmp_path / "labels.txt"
    names_file.write_text("\n".join(NAMES) + "\n", encoding="utf-8")
    ids = lambda labs: ",".join(str(NAMES.index(x)) for x in labs)  # noqa: E731
    files = {
        "train": _write_csv(tmp_path / "train.tsv", ROWS[:6], "\t", ids),
        "dev": _write_csv(tmp_path / "dev.tsv", ROWS[6:8], "\t", ids),
        "test": _write_csv(tmp_path / "test.tsv", ROWS[8:], "\t", ids),
    }
    dd = load_mlc_dataset("csv", data_files=files, label_names=str(names_file))
    assert list(dd) == ["train", "validation", "test"] and label_names(dd) == NAMES
    assert _as_names(dd) == {
        "train": _expected(ROWS[:6]),
        "validation": _expected(ROWS[6:8]),
        "test": _expected(ROWS[8:]),
    }
    assert data_notes(dd) == []  # nothing carved


def test_json_jsonl_and_parquet_with_name_lists_and_id_lists(tmp_path):
    records = [{"body": t, "tags": labs} for t, labs in ROWS]
    (tmp_path / "train.json").write_text(json.dumps(records[:8]), encoding="utf-8")
    with open(tmp_path / "test.jsonl", "w", encoding="utf-8") as f:
        for r in records[8:]:
            f.write(json.dumps(r) + "\n")
    dd = load_mlc_dataset(
        "json",
        data_files={"train": "train.json", "test": "test.jsonl"},
        data_dir=tmp_path,
        text_column="body",
        label_column="tags",
        label_format="names",
    )
    assert set(dd) == {"train", "validation", "test"} and label_names(dd) == NAMES
    assert _as_names(dd)["test"] == _expected(ROWS[8:])
    # parquet with integer id lists and no names: names are "0" .. max id of train
    ds = Dataset.from_dict(
        {"text": [t for t, _ in ROWS], "labels": [[NAMES.index(x) for x in labs] for _, labs in ROWS]}
    )
    ds.to_parquet(str(tmp_path / "ids.parquet"))
    dd = load_mlc_dataset(str(tmp_path / "ids.parquet"))
    assert label_names(dd) == ["0", "1", "2", "3"]
    assert sorted(sum((r for s in dd for r in list(dd[s]["labels"])), [])) == sorted(
        NAMES.index(x) for _, labs in ROWS for x in labs
    )


def test_in_memory_dataset_and_dataset_dict_with_classlabel_names():
    names = ["anger", "joy", "zeal"]  # "zeal" never occurs: the ClassLabel keeps it
    feats = Features({"sentence": Value("string"), "emotions": HFSequence(ClassLabel(names=names))})
    train = Dataset.from_dict(
        {"sentence": ["grr", "yay", "grr yay", "meh yay"], "emotions": [[0], [1], [0, 1], [1]]},
        features=feats,
    )
    test = Dataset.from_dict({"sentence": ["so happy"], "emotions": [[1]]}, features=feats)
    dd = load_mlc_dataset(
        DatasetDict({"train": train, "val": train.select([0, 1]), "test": test}),
        text_column="sentence",
        label_column="emotions",
    )
    assert list(dd) == ["train", "validation", "test"] and label_names(dd) == names
    assert list(dd["train"]["labels"]) == [[0], [1], [0, 1], [1]] and list(dd["test"]["text"]) == ["so happy"]
    single = load_mlc_dataset(
        train, text_column="sentence", label_column="emotions", validation_fraction=0.25
    )
    assert len(single["train"]) == 3 and len(single["validation"]) == 1 and "carved" in data_notes(single)[0]
    # a single-label ClassLabel column is a list of one id
    one = Dataset.from_dict(
        {"text": ["a", "b", "c"], "label": [0, 1, 1]},
        features=Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])}),
    )
    dd = load_mlc_dataset(DatasetDict({"train": one, "validation": one}))
    assert list(dd["train"]["labels"]) == [[0], [1], [1]] and label_names(dd) == ["neg", "pos"]


def test_one_binary_column_per_label_detected_or_named(tmp_path):
    header = ["text", "rater_id", *NAMES]
    path = tmp_path / "wide.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for i, (text, labs) in enumerate(ROWS):
            w.writerow([text, 17 + i, *[int(n in labs) for n in NAMES]])
    auto = load_mlc_dataset(str(path))  # 0/1 columns detected; rater_id (17..26) is not one
    assert label_names(auto) == NAMES
    named = load_mlc_dataset(str(path), label_columns="q-bio,cs.CL", validation_fraction=0.2, split_seed=0)
    assert label_names(named) == ["q-bio", "cs.CL"]
    truth = {t: sorted(x for x in labs if x in ("q-bio", "cs.CL")) for t, labs in ROWS}
    for split in named:
        for text, row in zip(list(named[split]["text"]), _as_names(named)[split]):
            assert row == truth[text]
    with pytest.raises(ValueError, match=r"label columns \['rater_id'\].*other than 0/1"):
        load_mlc_dataset(str(path), label_columns=["rater_id"])


def _hub_shaped_folder(root):
    """A dataset repository as the Hub stores it: parquet shards per config and a README ``configs:``."""
    names = NAMES
    feats = Features({"text": Value("string"), "labels": HFSequence(ClassLabel(names=names))})
    for config, rows in (("simplified", ROWS), ("tiny", ROWS[:4])):
        for split, part in (("train", rows[:-2]), ("validation", rows[-2:])):
            ds = Dataset.from_dict(
                {
                    "text": [t for t, _ in part],
                    "labels": [[names.index(x) for x in labs] for _, labs in part],
                },
                features=feats,
            )
            os.makedirs(root / config, exist_ok=True)
            ds.to_parquet(str(root / config / f"{split}-00000-of-00001.parquet"))
    (root / "README.md").write_text(
        "---\nconfigs:\n"
        "- config_name: simplified\n  data_files:\n  - split: train\n    path: simplified/train-*\n"
        "  - split: validation\n    path: simplified/validation-*\n"
        "- config_name: tiny\n  data_files:\n  - split: train\n    path: tiny/train-*\n"
        "  - split: validation\n    path: tiny/validation-*\n---\n# a dataset\n",
        encoding="utf-8",
    )


def test_a_hub_shaped_folder_goes_through_load_dataset_with_its_config_and_the_hub_off(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    _hub_shaped_folder(tmp_path / "repo")
    calls = []
    real = datasets.load_dataset

    def spy(path, name=None, **kw):
        calls.append((path, name))
        return real(path, name, **kw)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    dd = load_mlc_dataset(str(tmp_path / "repo"), config_name="simplified")
    assert calls == [(str(tmp_path / "repo"), "simplified")]  # the call a Hub id makes
    assert len(dd["train"]) == 8 and len(dd["validation"]) == 2 and label_names(dd) == NAMES
    tiny = load_mlc_dataset(str(tmp_path / "repo"), config_name="tiny")
    assert len(tiny["train"]) == 2
    # an id that is neither cached nor reachable fails with one clear message
    with pytest.raises(ValueError, match="could not load Hub dataset 'nobody/no-such-dataset'"):
        load_mlc_dataset("nobody/no-such-dataset")
    # a save_to_disk folder
    dd.save_to_disk(str(tmp_path / "saved"))
    again = load_mlc_dataset(str(tmp_path / "saved"))
    assert list(again["train"]["text"]) == list(dd["train"]["text"]) and label_names(again) == NAMES


def test_data_files_are_read_below_a_folder_given_as_the_source_and_label_options_that_clash_stop(tmp_path):
    """load_mlc_dataset(folder, data_files={"train": "train.csv"}) reads folder/train.csv (not ./train.csv);
    label_columns with label_format='ids' is one line naming both options."""
    folder = tmp_path / "mine"
    folder.mkdir()
    _write_csv(folder / "train.csv", ROWS)
    dd = load_mlc_dataset(str(folder), data_files={"train": "train.csv"}, validation_fraction=0.2)
    assert len(dd["train"]) + len(dd["validation"]) == len(ROWS)
    with pytest.raises(
        ValueError, match="label_columns= names one 0/1 column per label, but label_format is 'ids'"
    ):
        load_mlc_dataset(str(folder / "train.csv"), label_columns=["a", "b"], label_format="ids")


def test_a_folder_of_csv_files_keeps_na_and_none_cells_as_text_as_one_file_does(tmp_path):
    """A text "None" and a label "NA" are strings in a folder of per-split CSV files, as in a single CSV file."""
    rows = [("None", "NA;sports"), ("a match", "sports"), ("a vote", "politics"), ("a lab", "NA")] * 5
    folder = tmp_path / "mine"
    folder.mkdir()
    for split in ("train", "validation", "test"):
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(["text", "labels"])
            writer.writerows(rows)
    from_folder = load_mlc_dataset(str(folder), label_column="labels", label_format="delimited")
    from_file = load_mlc_dataset(str(folder / "train.csv"), label_column="labels", label_format="delimited")
    assert len(from_folder["train"]) == len(rows) and "None" in from_folder["train"]["text"]
    assert label_names(from_folder) == label_names(from_file) == ["NA", "politics", "sports"]


# ------------------------------------------------------------------------------------------ label rules
def test_labels_seen_only_outside_train_are_named_or_dropped(tmp_path, caplog):
    train = _write_csv(tmp_path / "train.csv", ROWS[:6])
    test = _write_csv(tmp_path / "test.csv", [("new topic", ["astro-ph", "cs.LG"]), ("old", ["cs.CL"])])
    with pytest.raises(ValueError, match=r"labels seen only outside train: \{'test': \['astro-ph'\]\}"):
        load_mlc_dataset("csv", data_files={"train": train, "test": test})
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        dd = load_mlc_dataset("csv", data_files={"train": train, "test": test}, unknown_labels="drop")
    assert "astro-ph" in caplog.text and "astro-ph" not in label_names(dd)
    assert _as_names(dd)["test"] == [["cs.LG"], ["cs.CL"]]
    # a given label list is binding for train too
    with pytest.raises(ValueError, match=r"split 'train' has labels not in the label space.*'q-bio'"):
        load_mlc_dataset(train, label_names=["cs.CL", "cs.LG", "hep-th"])


def test_names_are_the_sorted_union_of_train_and_single_names_work(tmp_path):
    rows = [("a", ["zeta"]), ("b", ["alpha"]), ("c", ["mid"]), ("d", ["alpha"])]
    path = _write_csv(tmp_path / "single.csv", rows, label_fmt=lambda labs: labs[0])
    dd = load_mlc_dataset(path, validation_fraction=0.25)
    assert label_names(dd) == ["alpha", "mid", "zeta"]
    piped = _write_csv(tmp_path / "pipe.csv", ROWS, label_fmt=lambda labs: " | ".join(labs))
    assert label_names(load_mlc_dataset(piped)) == NAMES
    comma = _write_csv(tmp_path / "comma.csv", ROWS, label_fmt=lambda labs: ",".join(labs))
    assert label_names(load_mlc_dataset(comma, label_format="delimited", label_separator=",")) == NAMES


def test_list_cells_in_a_csv_are_read_as_lists_of_ids_or_names(tmp_path):
    """``[8, 20]`` in a CSV cell is two ids (auto and label_format='ids' alike), ``['cs.LG', 'q-bio']``
    (Python) or ``["cs.LG", "q-bio"]`` (JSON) two names: never names such as '[8' or "'q-bio'"."""
    ids = _write_csv(tmp_path / "ids.csv", ROWS, label_fmt=lambda labs: str([NAMES.index(x) for x in labs]))
    assert '"[1, 3]"' in open(ids, encoding="utf-8").read()  # what pandas / csv write for a list of ints
    truth = {t: sorted(NAMES.index(x) for x in labs) for t, labs in ROWS}
    for fmt in ("auto", "ids"):
        dd = load_mlc_dataset(ids, label_format=fmt)
        assert label_names(dd) == ["0", "1", "2", "3"], fmt
        got = {t: row for s in dd for t, row in zip(list(dd[s]["text"]), list(dd[s]["labels"]))}
        assert got == truth, fmt
    # "8;20" under label_format='ids' is two ids as well
    plain = _write_csv(
        tmp_path / "plain_ids.csv", ROWS, label_fmt=lambda labs: ";".join(str(NAMES.index(x)) for x in labs)
    )
    dd = load_mlc_dataset(plain, label_format="ids")
    assert {t: row for s in dd for t, row in zip(list(dd[s]["text"]), list(dd[s]["labels"]))} == truth
    for writer in (str, json.dumps):  # Python repr and JSON lists of names
        path = _write_csv(tmp_path / "names.csv", ROWS, label_fmt=lambda labs, w=writer: w(list(labs)))
        dd = load_mlc_dataset(path)
        assert label_names(dd) == NAMES, writer
        got = {t: row for s in dd for t, row in zip(list(dd[s]["text"]), _as_names(dd)[s])}
        assert got == {t: sorted(labs) for t, labs in ROWS}, writer


@pytest.mark.parametrize(
    "cells, message",
    [
        (["cs.LG;q-bio", "cs.CL,cs.LG"], r"both ';' and ','.*label_separator=';'.*label_separator=','"),
        (
            ["[1, 3]", "cs.CL;cs.LG"],
            r"mixes list cells.*'\[1, 3\]'.*plain cells.*'cs.CL;cs.LG'.*label_format=",
        ),
        (["[1, 'cs.CL']", "[2]"], r"mixes ids and names.*label_format='ids'.*label_format='names'"),
        (
            ["[cs.LG, q-bio]", "[cs.CL]"],
            r"'\[cs.LG, q-bio\]'.*not a list.*\[\"cs.LG\", \"q-bio\"\].*label_format=",
        ),
        (
            ["'cs.LG';'q-bio'", "'cs.CL'"],
            r"label names such as \"'cs.CL'\".*quotes or brackets.*label_format=",
        ),
    ],
)
def test_ambiguous_label_cells_stop_and_name_the_choices(tmp_path, cells, message):
    rows = [(text, [cells[i % len(cells)]]) for i, (text, _) in enumerate(ROWS)]
    path = _write_csv(tmp_path / "odd.csv", rows, label_fmt=lambda labs: labs[0])
    with pytest.raises(ValueError, match=message):
        load_mlc_dataset(path)


# ------------------------------------------------------------------------------------------ errors
def test_empty_split_missing_columns_and_bad_options_fail_before_training(tmp_path):
    train = _write_csv(tmp_path / "train.csv", ROWS)
    empty = _write_csv(tmp_path / "empty.csv", [])
    with pytest.raises(ValueError, match=r"split\(s\) \['validation'\] are empty"):
        load_mlc_dataset("csv", data_files={"train": train, "validation": empty})
    with pytest.raises(ValueError, match="no text column 'body'.*columns: \\['text', 'labels'\\]"):
        load_mlc_dataset(train, text_column="body")
    with pytest.raises(ValueError, match="no label column 'tags'"):
        load_mlc_dataset(train, label_column="tags")
    with pytest.raises(ValueError, match="label_format must be one of"):
        load_mlc_dataset(train, label_format="multi-hot")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_mlc_dataset(str(tmp_path / "nope.csv"))
    with pytest.raises(ValueError, match="cannot carve a validation split"):
        load_mlc_dataset(_write_csv(tmp_path / "one.csv", ROWS[:1]))
    with pytest.raises(ValueError, match="unknown dataset 'goemtions'.*Hub dataset id"):
        load_mlc_dataset("goemtions")
    with pytest.raises(ValueError, match=r"options \['text_column'\] apply to your own data"):
        load_mlc_dataset("synthetic", text_column="body")


def test_non_utf8_bytes_name_the_file_and_line(tmp_path):
    path = tmp_path / "latin1.csv"
    path.write_bytes("text,labels\nfine,a\ncaf\u00e9 au lait,b\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1\.csv:3: byte 0xe9 at column 4 is not UTF-8.*iconv"):
        load_mlc_dataset(str(path))
    # a registered loader's files too (GoEmotions tsv)
    gdir = tmp_path / "goemo"
    gdir.mkdir()
    (gdir / "emotions.txt").write_text("joy\nanger\n", encoding="utf-8")
    for name in ("dev.tsv", "test.tsv"):
        (gdir / name).write_text("ok\t0\tid1\n", encoding="utf-8")
    (gdir / "train.tsv").write_bytes("ok\t0\tid1\nna\u00efve\t1\tid2\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train\.tsv:2: byte 0xef"):
        load_mlc_dataset("goemotions", data_dir=gdir)


# ------------------------------------------------------------------------------------------ arguments
def test_data_arguments_carry_the_options_to_the_loader_and_the_card(tmp_path):
    from hf_mlcl.recipes import parse_stage
    from hf_mlcl.training.arguments import DataArguments
    from hf_mlcl.training.stages import load_run_data

    path = _write_csv(
        tmp_path / "my.csv", ROWS, label_fmt=lambda labs: "|".join(labs), header=("body", "tags")
    )
    assert DataArguments().loader_options() == {}  # a registered name gets nothing extra
    args = DataArguments(dataset=path, text_column="body", label_column="tags", validation_fraction=0.3)
    assert args.loader_options() == {
        "text_column": "body",
        "label_column": "tags",
        "validation_fraction": 0.3,
    }
    data = load_run_data(args)
    ds, names = data.dataset, data.label_names
    assert names == NAMES and len(ds["validation"]) == 3 and "test" not in ds
    assert data.notes and "validation_fraction=0.3" in data.notes[0]
    with pytest.raises(ValueError, match="unknown_labels must be one of"):
        DataArguments(dataset=path, unknown_labels="keep")
    with pytest.raises(ValueError, match="validation_fraction must lie in"):
        DataArguments(dataset=path, validation_fraction=1.5)
    # the same keys come from a recipe and from the command line
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        f"dataset: {path}\ntext_column: body\nlabel_column: tags\n"
        "data_files: {train: a.csv, test: b.csv}\ncontrastive: {report_to: none}\n",
        encoding="utf-8",
    )
    from hf_mlcl.recipes import load_recipe, split_overrides

    _, data_args, _ = parse_stage(
        load_recipe(str(recipe)),
        "contrastive",
        split_overrides(["--label_format", "delimited", "--split_seed", "7"], ["contrastive"]),
        output_dir=str(tmp_path / "out"),
    )
    assert data_args.data_files == {"train": "a.csv", "test": "b.csv"}
    assert (data_args.label_format, data_args.split_seed, data_args.text_column) == ("delimited", 7, "body")


# ------------------------------------------------------------------------------------------ real data
@pytest.mark.slow
def test_goemotions_raw_release_shape_one_column_per_label(tmp_path):
    """The raw GoEmotions release (goemotions_*.csv: text, id, metadata, example_very_unclear, then one
    0/1 column per emotion) rebuilt from ../shared/data/goemotions and read with the names file."""
    src = os.path.join(SHARED_DATA, "goemotions")
    if not os.path.isfile(os.path.join(src, "train.tsv")):
        pytest.skip("../shared/data/goemotions is not present")
    names = [n.strip() for n in open(os.path.join(src, "emotions.txt"), encoding="utf-8") if n.strip()]
    with open(os.path.join(src, "train.tsv"), encoding="utf-8", newline="") as f:
        rows = [r for r in csv.reader(f, delimiter="\t") if r]
    raw = tmp_path / "goemotions_1.csv"
    header = [
        "text",
        "id",
        "author",
        "subreddit",
        "link_id",
        "parent_id",
        "created_utc",
        "rater_id",
        "example_very_unclear",
        *names,
    ]
    with open(raw, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        for i, (text, labs, cid) in enumerate(rows):
            ids = {int(x) for x in labs.split(",")}
            w.writerow(
                [
                    text,
                    cid,
                    "someone",
                    "r/x",
                    "t3_x",
                    "t1_x",
                    1.5e9,
                    1 + i % 80,
                    "False",
                    *[int(j in ids) for j in range(len(names))],
                ]
            )
    names_file = tmp_path / "emotions.txt"
    names_file.write_text("\n".join(names) + "\n", encoding="utf-8")
    dd = load_mlc_dataset(str(raw), label_names=str(names_file), validation_fraction=0.1, split_seed=0)
    assert label_names(dd) == names
    assert len(dd["train"]) + len(dd["validation"]) == len(rows) == 43410
    truth = {cid: sorted(int(x) for x in labs.split(",")) for _, labs, cid in rows}
    by_text = {}
    for text, _labs, cid in rows:
        by_text.setdefault(text, set()).add(tuple(truth[cid]))
    for split in dd:
        for text, lab in zip(list(dd[split]["text"])[:2000], list(dd[split]["labels"])[:2000]):
            assert tuple(lab) in by_text[text]
    freq = sum(len(r) for s in dd for r in list(dd[s]["labels"]))
    assert freq == sum(len(v) for v in truth.values())
    # the same file with the 0/1 columns named explicitly, and auto-detection (example_very_unclear is
    # a "False"/"True" string column here, rater_id is not 0/1: neither is taken for a label)
    auto = load_mlc_dataset(str(raw), validation_fraction=0.1, split_seed=0)
    assert label_names(auto) == names


def test_the_own_data_options_are_listed_once_and_every_reader_follows_the_list():
    """CUSTOM_OPTIONS is the loader's keywords (beyond the source); the registry refuses exactly them for a
    registered name, and DataArguments hands each own-data field over under the loader's name."""
    import dataclasses
    import inspect

    from hf_mlcl.data.custom import CUSTOM_OPTIONS
    from hf_mlcl.training.arguments import DataArguments

    keywords = [
        p.name for p in inspect.signature(load_custom_dataset).parameters.values() if p.kind == p.KEYWORD_ONLY
    ]
    assert set(CUSTOM_OPTIONS) == set(keywords) - {"data_dir", "splits"}
    for option in CUSTOM_OPTIONS:
        with pytest.raises(ValueError, match=rf"options \['{option}'\] apply to your own data"):
            load_mlc_dataset("synthetic", **{option: None})
    fields = {f.name: f for f in dataclasses.fields(DataArguments)}
    changed = {
        "data_files": "a.csv",
        "dataset_config": "c",
        "text_column": "t",
        "label_column": "l",
        "label_columns": "a,b",
        "label_format": "ids",
        "label_separator": "|",
        "label_names_file": "n.txt",
        "unknown_labels": "drop",
        "validation_fraction": 0.2,
        "test_fraction": 0.1,
        "split_seed": 7,
        "split_strategy": "stratified",
    }
    assert set(changed) <= set(fields)
    options = DataArguments(**changed).loader_options()
    assert set(options) == set(CUSTOM_OPTIONS) - {"revision"}
    assert (options["config_name"], options["label_names"]) == ("c", "n.txt")
    # a field at its default is not handed over, so the loader's own default applies: the two must agree
    from hf_mlcl.training.model_data_arguments import _OPTION_FIELDS

    loader = inspect.signature(load_custom_dataset).parameters
    for option in CUSTOM_OPTIONS:
        name = _OPTION_FIELDS.get(option, option)
        if name in fields:
            assert fields[name].default == loader[option].default, option


def test_numeric_label_names_stay_names():
    """ICD-9 codes written as numbers are label names: '4019;25000' is two labels, not 25,001, and '0010', '010'
    and '10' are three labels."""
    from datasets import Dataset

    from hf_mlcl.data import label_names, load_mlc_dataset

    ds = load_mlc_dataset(Dataset.from_dict({"text": ["x y"] * 20, "labels": ["4019;25000", "0389"] * 10}))
    assert label_names(ds["train"]) == ["0389", "25000", "4019"]
    ds = load_mlc_dataset(Dataset.from_dict({"text": ["a b"] * 9, "labels": ["0010", "010", "10"] * 3}))
    assert label_names(ds["train"]) == ["0010", "010", "10"]


def test_delimited_ids_of_given_label_names_and_a_stray_id(tmp_path):
    from datasets import Dataset

    from hf_mlcl.data import label_names, load_mlc_dataset

    names = ["sports", "politics", "science"]
    ds = load_mlc_dataset(
        Dataset.from_dict({"text": ["a b"] * 12, "labels": ["0;2", "1"] * 6}), label_names=names
    )
    assert label_names(ds["train"]) == names and sorted({tuple(r) for r in ds["train"]["labels"]}) == [
        (0, 2),
        (1,),
    ]
    stray = {"text": ["a b"] * 240, "labels": [[i % 5] for i in range(239)] + [[1_000_000]]}
    with pytest.raises(ValueError, match="the label ids reach 1000000 but only 6 distinct ids occur"):
        load_mlc_dataset(Dataset.from_dict(stray))


def test_none_and_nan_label_cells_are_missing_labels_with_a_warning(tmp_path, caplog):
    """An empty, None or NaN label cell (a list cell holding None too) is a row without labels, counted in a
    warning, never a label named 'None' or 'nan'."""
    import logging

    import pandas as pd

    from hf_mlcl.data import label_names, load_mlc_dataset

    path = tmp_path / "data.parquet"
    pd.DataFrame({"text": ["x y"] * 20, "labels": [["a", "b"], None, ["b", None], []] * 5}).to_parquet(path)
    with caplog.at_level(logging.WARNING):
        ds = load_mlc_dataset(str(path))
    assert label_names(ds["train"]) == ["a", "b"]
    assert "rows of split 'train' have no label" in caplog.text
    csv = tmp_path / "data.csv"
    pd.DataFrame({"text": ["x y"] * 20, "labels": ["a;b", "", "b", None] * 5}).to_csv(csv, index=False)
    assert label_names(load_mlc_dataset(str(csv))["train"]) == ["a", "b"]


@pytest.mark.parametrize("char", ["/", " "])
def test_labels_joined_by_an_unknown_separator_are_an_error_not_labels_of_their_own(tmp_path, char):
    """Rows holding several labels joined by a character the detection does not know ('/' or a space) would
    train 'cs.LG/q-bio' as a label of its own: a one-line error names the separator to pass; passing it, or the
    label names, reads the file."""
    path = _write_csv(tmp_path / "my.csv", ROWS, label_fmt=char.join)
    with pytest.raises(
        ValueError, match=rf"'cs.CL{char}cs.LG' is the labels \['cs.CL', 'cs.LG'\] joined by '{char}'"
    ):
        load_mlc_dataset(path, validation_fraction=0.2, split_seed=3)
    dd = load_mlc_dataset(path, validation_fraction=0.2, split_seed=3, label_separator=char)
    assert label_names(dd) == NAMES
    combined = sorted({char.join(labs) for _, labs in ROWS})  # names given: each combination is a label
    names_file = tmp_path / "names.txt"
    names_file.write_text("\n".join(combined))
    assert (
        label_names(
            load_mlc_dataset(path, validation_fraction=0.2, split_seed=3, label_names=str(names_file))
        )
        == combined
    )
    as_names = load_mlc_dataset(path, validation_fraction=0.2, split_seed=3, label_format="names")
    assert label_names(as_names) == combined  # one label per cell, as asked


def test_multi_word_labels_beside_their_words_read_where_a_separator_or_lists_are_found(tmp_path):
    """MeSH-like label sets hold 'Breast', 'Neoplasms' and 'Breast Neoplasms': with ';' found in the cells, or
    list cells, every name is one label; only plain cells without any separator are checked."""
    rows = [("tumour of the breast", ["Breast", "Breast Neoplasms", "Neoplasms"]), ("skin", ["Skin"])] * 5
    path = _write_csv(tmp_path / "mesh.csv", rows)
    want = ["Breast", "Breast Neoplasms", "Neoplasms", "Skin"]
    assert label_names(load_mlc_dataset(path, validation_fraction=0.2, split_seed=3)) == want
    listed = tmp_path / "mesh.jsonl"
    listed.write_text("".join(json.dumps({"text": t, "labels": labs}) + "\n" for t, labs in rows))
    assert label_names(load_mlc_dataset(str(listed), validation_fraction=0.2, split_seed=3)) == want


def test_label_format_columns_on_a_label_column_names_what_it_reads(tmp_path):
    """label_format='columns' on a file with a 'labels' column: the error says that format reads 0/1 columns,
    not that there is no label column."""
    path = _write_csv(tmp_path / "my.csv", ROWS)
    with pytest.raises(ValueError, match="label_format='columns' reads one 0/1 column per label") as err:
        load_mlc_dataset(path, validation_fraction=0.2, split_seed=3, label_format="columns")
    assert "found no label column" not in str(err.value)


def test_a_carved_validation_split_without_some_labels_is_warned_about(tmp_path, caplog):
    """A label no validation row has scores F1 0 in validation macro-F1 whatever the model does: the carve says
    which labels, and how to spread them."""
    path = _write_csv(tmp_path / "my.csv", ROWS)
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        dd = load_mlc_dataset(path, validation_fraction=0.2, split_seed=3)
    names = label_names(dd)
    absent = sorted(set(names) - {names[i] for row in dd["validation"]["labels"] for i in row})
    assert absent  # 2 rows of validation cannot hold all 4 labels
    assert f"{len(absent)} labels of train have no validation row ({', '.join(absent)})" in caplog.text
    assert "split_strategy='stratified'" in caplog.text


def _wide(path, cells):
    """A CSV with a text column and one 0/1 column per name of NAMES; ``cells`` maps (row, name) to a cell."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", *NAMES])
        for i, (text, labs) in enumerate(ROWS):
            w.writerow([text, *[cells.get((i, n), int(n in labs)) for n in NAMES]])
    return str(path)


def test_a_detected_label_column_with_gaps_is_an_error_and_one_left_out_is_named(tmp_path, caplog):
    """An empty cell made its 0/1 column text and detection dropped that label (exit 0, fewer labels): such a
    column is an error naming it. A mostly-0/1 column with other values (a count, a label column with a 2) or 0/1
    stored as floats is left out, as before, and named in the detection's warning."""
    gap = _wide(tmp_path / "gap.csv", {(5, NAMES[2]): ""})  # row 5 is in train
    with pytest.raises(
        ValueError, match=rf"columns '{NAMES[2]}' \(1 empty\) hold 0/1 values with empty cells"
    ):
        load_mlc_dataset(gap, validation_fraction=0.2, split_seed=0)
    other = _wide(tmp_path / "other.csv", {(0, NAMES[1]): 2, (1, NAMES[3]): "1.0"})
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        dd = load_mlc_dataset(other, validation_fraction=0.2, split_seed=0)
    assert label_names(dd) == [NAMES[0], NAMES[2]]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert f"left out (name them in label_columns= if they are labels): '{NAMES[1]}' (also 2)" in warned
    assert f"'{NAMES[3]}' (0/1 stored as floats)" in warned
    named = load_mlc_dataset(other, label_columns=[NAMES[0], NAMES[3]], validation_fraction=0.2, split_seed=0)
    assert label_names(named) == [NAMES[0], NAMES[3]]
    with pytest.raises(ValueError, match=r"label_columns names columns more than once: \['cs.CL'\]"):
        load_mlc_dataset(other, label_columns="cs.CL,cs.CL,hep-th", split_seed=0)


def test_thousands_of_label_columns_are_read_in_one_pass(tmp_path, monkeypatch):
    """Each column read through its own format change, or its own access of `Dataset.features`, copied the
    features each time (quadratic): neither grows with the number of label columns."""
    names = [f"l{j}" for j in range(300)]
    path = tmp_path / "wide.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", *names])
        for i in range(40):
            w.writerow([f"text number {i}", *[int((i + j) % 7 == 0) for j in range(len(names))]])
    calls = []
    original = Dataset.with_format

    def counted(self, *args, **kwargs):
        calls.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Dataset, "with_format", counted)
    copies = []  # Dataset.features deep-copies the features at each access
    features = Dataset.features

    def counted_features(self):
        copies.append(1)
        return features.fget(self)

    monkeypatch.setattr(Dataset, "features", property(counted_features))
    dd = load_mlc_dataset(str(path), validation_fraction=0.2, split_seed=0)
    assert label_names(dd) == names
    assert len(calls) < 20, len(calls)
    assert len(copies) < 60, len(copies)


def test_a_split_written_another_way_than_train_is_named(tmp_path):
    """Train as JSON lists, test as "a;b" text: each test cell read as one unknown label (the error then offered
    unknown_labels='drop', which loses those rows' labels). The two ways are named instead."""
    train = tmp_path / "train.jsonl"
    with open(train, "w", encoding="utf-8") as f:
        for text, labs in ROWS:
            f.write(json.dumps({"text": text, "labels": labs}) + "\n")
    test = _write_csv(tmp_path / "test.csv", ROWS[:4])
    files = {"train": str(train), "test": str(test)}
    with pytest.raises(
        ValueError, match=r"split 'test' writes its labels as plain text such as 'cs.LG;q-bio'"
    ):
        load_mlc_dataset("json", data_files=files, validation_fraction=0.2, split_seed=0)
    read = load_mlc_dataset(
        "json", data_files=files, label_format="delimited", label_separator=";", validation_fraction=0.2
    )
    assert _as_names(read)["test"] == [sorted(labs) for _, labs in ROWS[:4]]


def test_a_file_named_as_the_dataset_beside_data_files_is_an_error_not_ignored(tmp_path):
    """`--dataset my_data.csv --data_files {...}` read the data files and named my_data.csv on the card."""
    files = {"train": _write_csv(tmp_path / "train.csv", ROWS)}
    with pytest.raises(ValueError, match=r"dataset 'my_data.csv' is neither a file format .* nor a folder"):
        load_mlc_dataset("my_data.csv", data_files=files, validation_fraction=0.2, split_seed=0)
    assert (
        label_names(load_mlc_dataset("csv", data_files=files, validation_fraction=0.2, split_seed=0)) == NAMES
    )
    assert (
        label_names(load_mlc_dataset(str(tmp_path), data_files={"train": "train.csv"}, split_seed=0)) == NAMES
    )


def test_a_label_named_twice_in_the_names_file_is_named(tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("cs.CL\ncs.LG\nhep-th\nq-bio\ncs.LG\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"names labels more than once: \['cs.LG'\]"):
        load_mlc_dataset(_write_csv(tmp_path / "d.csv", ROWS), label_names=str(names), split_seed=0)


def test_true_false_columns_are_named_and_read_when_named(tmp_path):
    """pandas writes bool columns as True/False: they are flags unless named, and the error names them."""
    path = tmp_path / "bools.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", *NAMES])
        for text, labs in ROWS:
            w.writerow([text, *[str(n in labs) for n in NAMES]])
    with pytest.raises(ValueError, match=r"True/False columns \['cs.CL'"):
        load_mlc_dataset(str(path), label_format="columns", split_seed=0)
    named = load_mlc_dataset(str(path), label_columns=NAMES, validation_fraction=0.2, split_seed=0)
    assert sorted(sum(_as_names(named).values(), [])) == sorted(sorted(labs) for _, labs in ROWS)


def test_true_false_columns_beside_detected_ones_are_named_as_left_out(tmp_path, caplog):
    path = tmp_path / "flagged.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", "unclear", *NAMES])
        for i, (text, labs) in enumerate(ROWS):
            w.writerow([text, str(i % 3 == 0), *[int(n in labs) for n in NAMES]])
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        assert label_names(load_mlc_dataset(str(path), validation_fraction=0.2, split_seed=0)) == NAMES
    assert "'unclear' (True/False)" in " ".join(r.getMessage() for r in caplog.records)


def test_plain_single_names_beside_list_cells_of_train_read_as_names(tmp_path):
    """Only plain cells that join labels ("a;b") are refused beside list-written train cells; "cs.CL" is a name."""
    train = tmp_path / "train.jsonl"
    with open(train, "w", encoding="utf-8") as f:
        for text, labs in ROWS:
            f.write(json.dumps({"text": text, "labels": json.dumps(labs)}) + "\n")
    test = _write_csv(tmp_path / "test.csv", [(t, labs[:1]) for t, labs in ROWS[:4]])
    dd = load_mlc_dataset("json", data_files={"train": str(train), "test": test}, validation_fraction=0.2)
    assert _as_names(dd)["test"] == [labs[:1] for _, labs in ROWS[:4]]


def test_duplicated_texts_across_splits_and_label_names_differing_in_case_are_warned(tmp_path, caplog):
    cafe, decomposed = "caf\u00e9", "cafe\u0301"  # one name in its composed and decomposed Unicode forms
    rows = [
        *ROWS,
        (ROWS[0][0], ROWS[0][1]),
        ("a sports article", ["Sports"]),
        ("another one", ["sports"]),
        ("an espresso", [cafe]),
        ("a latte", [decomposed]),
    ]
    test = _write_csv(tmp_path / "test.csv", [ROWS[1], ("unseen text", ["cs.CL"])])
    files = {"train": _write_csv(tmp_path / "train.csv", rows), "test": test}
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        dd = load_mlc_dataset("csv", data_files=files, validation_fraction=0.2, split_seed=0)
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "4 label names differ only in case, spaces or Unicode form, e.g. 'Sports' / 'sports'" in warned
    assert "rows whose text is also in train:" in warned and "test 1 of 2" in warned
    in_train = set(dd["train"]["text"])
    carved = sum(t in in_train for t in dd["validation"]["text"])  # the duplicated row, if carved apart
    assert (f"validation {carved} of {len(dd['validation'])}" in warned) == (carved > 0)


def test_each_splits_classlabel_ids_are_read_by_their_own_names():
    """A split whose ClassLabel orders the names otherwise than train's, or a label_names list in another order,
    reads every id as the name its own feature gives it."""

    def split(names, rows):
        feats = Features({"text": Value("string"), "labels": HFSequence(ClassLabel(names=names))})
        texts = [f"text {i}" for i in range(len(rows))]
        return Dataset.from_dict(
            {"text": texts, "labels": [[names.index(x) for x in r] for r in rows]}, features=feats
        )

    truth = [["sports"], ["politics"], ["sports", "politics"], ["politics"]]
    dd = DatasetDict(
        {"train": split(["sports", "politics"], truth), "validation": split(["politics", "sports"], truth)}
    )
    loaded = load_mlc_dataset(dd)
    assert label_names(loaded) == ["sports", "politics"]
    assert _as_names(loaded)["validation"] == [sorted(r) for r in truth]
    given = load_mlc_dataset(dd, label_names=["politics", "sports", "arts"])
    assert label_names(given) == ["politics", "sports", "arts"]
    for name in ("train", "validation"):
        assert _as_names(given)[name] == [sorted(r) for r in truth], name


def test_integer_ids_with_most_of_their_range_unused_stop_and_a_few_unused_are_counted(caplog):
    codes = {"text": [f"t {i}" for i in range(9)], "labels": [100, 200, 300] * 3}  # codes, not ids
    with pytest.raises(
        ValueError, match=r"ids reach 300 but only 3 distinct ids occur in train.*label_format='names'"
    ):
        load_mlc_dataset(Dataset.from_dict(codes))
    assert label_names(load_mlc_dataset(Dataset.from_dict(codes), label_format="names")) == [
        "100",
        "200",
        "300",
    ]
    some = {"text": [f"t {i}" for i in range(12)], "labels": [[i % 4] for i in range(12)]}
    some["labels"][0] = [5]  # ids 0 .. 5, of which 4 never occurs
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        ds = load_mlc_dataset(Dataset.from_dict(some), validation_fraction=0.25, split_seed=0)
    assert label_names(ds) == [str(i) for i in range(6)]
    said = [r.getMessage() for r in caplog.records if "have no train row" in r.getMessage()]
    assert len(said) == 1 and "1 of the label ids 0 .. 5 have no train row (4)" in said[0], said


def test_a_column_of_multihot_vectors_is_read_as_one_position_per_label(tmp_path):
    """0/1 vectors (ints with a repeated value, floats, bools, or written into a CSV) are multi-hot rows, named by
    position or by the given names; an id list stays ids; widths that differ are one line."""
    vectors = [[1, 0, 1, 0], [0, 1, 0, 0], [0, 0, 0, 1], [1, 1, 0, 0]] * 3
    want = [[0, 2], [1], [3], [0, 1]] * 3
    texts = [f"text {i}" for i in range(len(vectors))]

    def loaded(cells, **kwargs):
        dd = load_mlc_dataset(
            DatasetDict({"train": Dataset.from_dict({"text": texts, "labels": cells})}),
            validation_fraction=0.25,
            split_seed=0,
            **kwargs,
        )
        rows = dict(zip(texts, want))
        for split in dd.values():
            assert [list(r) for r in split["labels"]] == [rows[t] for t in split["text"]]
        return label_names(dd)

    assert loaded(vectors) == ["0", "1", "2", "3"]
    assert loaded([[float(x) for x in v] for v in vectors], label_names=["a", "b", "c", "d"]) == [
        "a",
        "b",
        "c",
        "d",
    ]
    assert loaded([[bool(x) for x in v] for v in vectors]) == ["0", "1", "2", "3"]
    path = tmp_path / "vectors.csv"
    path.write_text(
        "text,labels\n" + "".join(f'{t},"{v}"\n' for t, v in zip(texts, vectors)), encoding="utf-8"
    )
    assert label_names(load_mlc_dataset(str(path), validation_fraction=0.25)) == ["0", "1", "2", "3"]
    ids = load_mlc_dataset(
        Dataset.from_dict({"text": texts[:4], "labels": [[0, 1], [1], [0], [0, 1]]}), validation_fraction=0.25
    )
    assert label_names(ids) == ["0", "1"]  # the ids 0 and 1: no vector repeats a value
    with pytest.raises(
        ValueError, match=r"multi-hot label vectors are 4 wide but the given label_names names 2"
    ):
        load_mlc_dataset(Dataset.from_dict({"text": texts, "labels": vectors}), label_names=["a", "b"])
    other = Dataset.from_dict({"text": ["x"], "labels": [[1.0, 0.0]]})
    train = Dataset.from_dict({"text": texts, "labels": [[float(x) for x in v] for v in vectors]})
    with pytest.raises(ValueError, match=r"vectors differ in width \(train \[4\], validation \[2\]\)"):
        load_mlc_dataset(DatasetDict({"train": train, "validation": other}))
