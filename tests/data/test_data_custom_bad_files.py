"""Own-data files a user gets wrong: a zero-byte CSV, an unreadable one, rows with empty text, a recipe's
loader options that belong to another dataset. Each is one clear line (or one counted warning), never a
traceback from deep inside ``datasets``."""

from __future__ import annotations

import logging

import pytest

from hf_mlcl.data import label_names, load_mlc_dataset


def test_a_zero_byte_csv_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / "my.csv"
    path.write_bytes(b"")
    with pytest.raises(
        ValueError, match=r"my\.csv' for split 'train' is empty \(0 bytes\); write a header row"
    ) as err:
        load_mlc_dataset(str(path))
    assert "\n" not in str(err.value)


def test_a_csv_the_reader_cannot_parse_is_one_line(tmp_path):
    path = tmp_path / "ragged.csv"
    path.write_text('text,labels\n"an unclosed quote,a\nb,c,d,e,f\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"could not read .*ragged\.csv.* \('train' split\) as csv: ") as err:
        load_mlc_dataset(str(path))
    assert "\n" not in str(err.value)


def test_rows_with_empty_text_are_dropped_with_one_counting_warning(tmp_path, caplog):
    train, test = tmp_path / "train.csv", tmp_path / "test.csv"
    train.write_text(
        "text,labels\ngoal match,sports\n,politics\n   ,science\nvote law,politics\natom,science\n"
        "team,sports\n",
        encoding="utf-8",
    )
    test.write_text("text,labels\nvote,politics\n\t,sports\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
        ds = load_mlc_dataset(
            "csv", data_files={"train": str(train), "test": str(test)}, validation_fraction=0.25
        )
    warnings = [r.getMessage() for r in caplog.records if "empty text" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "dropped 3 row(s) with empty text (train 2, test 1)" in warnings[0]
    assert len(ds["train"]) + len(ds["validation"]) == 4 and len(ds["test"]) == 1
    assert all(t.strip() for split in ds.values() for t in split["text"])
    assert label_names(ds) == ["politics", "science", "sports"]  # "science" still has a row with text


def test_a_label_seen_only_on_empty_rows_does_not_enter_the_label_space(tmp_path):
    path = tmp_path / "my.csv"
    path.write_text("text,labels\ngoal,sports\nvote,politics\n,ghost\nteam,sports\n", encoding="utf-8")
    ds = load_mlc_dataset(str(path), validation_fraction=0.25)
    assert label_names(ds) == ["politics", "sports"]


def test_options_of_another_loader_are_one_line_for_own_data(tmp_path):
    path = tmp_path / "my.csv"
    path.write_text("text,labels\ngoal,sports\nvote,politics\nteam,sports\n", encoding="utf-8")
    with pytest.raises(
        ValueError, match=r"options \['min_words', 'num_labels'\] do not apply to your own data"
    ):
        load_mlc_dataset(str(path), num_labels=10, min_words=3)


def test_an_unquoted_comma_list_names_the_line_and_the_fix(tmp_path):
    """'hello world,a,b' under the header text,labels: pandas would take the texts as the index and every
    document's text would become its first label; the load stops in one line instead, before any work."""
    from hf_mlcl.data import load_mlc_dataset

    path = tmp_path / "data.csv"
    path.write_text("text,labels\n" + "".join(f"document {i},a\n" for i in range(8)) + "hello world,a,b\n")
    with pytest.raises(
        ValueError, match=r"line 10 has 3 fields but the header \['text', 'labels'\] has 2.*quote"
    ):
        load_mlc_dataset(str(path))
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "train.csv").write_text("text,labels\nhello world,a,b\n")
    with pytest.raises(ValueError, match="line 2 has 3 fields"):
        load_mlc_dataset(str(folder))


def test_a_csv_text_longer_than_the_csv_modules_default_field_limit_loads(tmp_path):
    """A document of 200,000 characters (over the csv module's 131,072) is read, and the process-wide field
    limit is left as it was."""
    import csv

    path = tmp_path / "long.csv"
    long_text = "word " * 40_000
    path.write_text(f'text,labels\n"{long_text}",a\nshort,b\nother,a\nmore,b\n', encoding="utf-8")
    before = csv.field_size_limit()
    ds = load_mlc_dataset(str(path), validation_fraction=0.25, split_seed=0)
    assert csv.field_size_limit() == before
    texts = [t for split in ds.values() for t in split["text"]]
    assert any(t.strip() == long_text.strip() for t in texts)


def test_a_carved_split_that_takes_every_row_of_a_label_is_named_in_a_warning(tmp_path, caplog):
    path = tmp_path / "my.csv"
    rows = [("goal", "sports"), ("vote", "politics")] * 5 + [("comet", "rare")]
    path.write_text("text,labels\n" + "".join(f"{t} {i},{lab}\n" for i, (t, lab) in enumerate(rows)))
    for seed in range(20):  # a seed whose random carve takes the one "rare" row
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
            ds = load_mlc_dataset(str(path), validation_fraction=0.3, split_seed=seed)
        rare = label_names(ds).index("rare")
        if any(rare in r for r in ds["validation"]["labels"]):
            break
    else:
        pytest.fail("no seed carved the rare row into validation")
    assert not any(rare in r for r in ds["train"]["labels"])
    said = [r.getMessage() for r in caplog.records if "only in the carved validation split" in r.getMessage()]
    assert len(said) == 1 and "(rare)" in said[0] and "never trains on them" in said[0], said


def test_names_with_a_comma_split_by_the_detected_separator_are_named_in_a_warning(caplog):
    """A single-label column whose names hold a comma reads as delimited by ','; the labels that never occur apart
    are named, labels that also occur alone are not."""
    from datasets import Dataset

    def warned(cells):
        caplog.clear()
        data = Dataset.from_dict({"text": [f"text {i}" for i in range(len(cells))], "labels": cells})
        with caplog.at_level(logging.WARNING, logger="hf_mlcl.data.custom"):
            load_mlc_dataset(data, validation_fraction=0.25, split_seed=0)
        return [r.getMessage() for r in caplog.records if "never occur apart" in r.getMessage()]

    said = warned(["Clothing, Shoes & Jewelry", "Books", "Toys"] * 4)
    assert len(said) == 1 and "'Clothing, Shoes & Jewelry'" in said[0] and "label_format='names'" in said[0]
    assert warned(["sports, politics", "sports", "politics", "arts"] * 3) == []
