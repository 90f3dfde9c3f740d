"""`hf-mlcl predict`: every input format, the stored per-label threshold applied, the order of the input kept,
and one-line errors before the model loads."""

from __future__ import annotations

import csv
import json

import numpy as np
import pandas as pd
import pytest
import torch

from hf_mlcl.cli import main
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
from hf_mlcl.modeling.native import to_native_classifier

NAMES = ["cardio", "renal", "neuro"]
TEXTS = ["heart failure", "graph neural network learning theory", "kidney", "joy anger sadness love fear"] * 3


@pytest.fixture
def classifier(tmp_path, tiny_bert_config, bert_tokenizer):
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="cls")
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, head="native").eval()
    with torch.no_grad():
        clf.classifier.weight.normal_(0, 2.0)
    clf.config.decision_threshold = [0.3, 0.5, 0.7]  # per label
    folder = tmp_path / "clf"
    clf.save_pretrained(folder)
    assert to_native_classifier(str(folder), tokenizer=bert_tokenizer)
    batch = bert_tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        probs = torch.sigmoid(clf(**batch).logits).numpy()
    return str(folder), probs


def _inputs(tmp_path) -> dict[str, str]:
    frame = pd.DataFrame({"id": [f"doc{i}" for i in range(len(TEXTS))], "text": TEXTS})
    paths = {s: str(tmp_path / f"in{s}") for s in (".csv", ".jsonl", ".parquet", ".txt")}
    frame.to_csv(paths[".csv"], index=False)
    frame.to_json(paths[".jsonl"], orient="records", lines=True)
    frame.to_parquet(paths[".parquet"])
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    return paths


def test_predict_writes_labels_at_the_tuned_thresholds_for_every_input_format(tmp_path, classifier):
    folder, probs = classifier
    want = [[NAMES[j] for j in np.flatnonzero(row >= np.array([0.3, 0.5, 0.7]))] for row in probs]
    assert any(want) and not all(len(w) == len(NAMES) for w in want)  # the thresholds select
    for suffix, path in _inputs(tmp_path).items():
        out = tmp_path / f"out{suffix}.jsonl"
        assert main(["predict", folder, path, "--output", str(out), "--batch_size", "5"]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["labels"] for r in rows] == want, suffix  # input order kept (batches go by length)
        assert [r["text"] for r in rows] == TEXTS
        for row, p in zip(rows, probs):
            np.testing.assert_allclose(row["scores"], [p[NAMES.index(n)] for n in row["labels"]], atol=1e-5)
        if suffix != ".txt":
            assert [r["id"] for r in rows] == [
                f"doc{i}" for i in range(len(TEXTS))
            ]  # the input's columns kept
    out = tmp_path / "all.csv"
    assert main(["predict", folder, _inputs(tmp_path)[".csv"], "--output", str(out), "--all_scores"]) == 0
    with open(out, newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [r["labels"] for r in table] == [";".join(w) for w in want]
    np.testing.assert_allclose([[json.loads(r["scores"])[n] for n in NAMES] for r in table], probs, atol=1e-5)


def test_predict_errors_are_one_line_before_loading(tmp_path, classifier, capsys):
    folder, _ = classifier
    paths = _inputs(tmp_path)
    cases = [
        (
            [folder, paths[".csv"], "--output", str(tmp_path / "o.jsonl"), "--text_column", "body"],
            "no column 'body'",
        ),
        ([folder, str(tmp_path / "missing.csv"), "--output", str(tmp_path / "o.jsonl")], "no input file"),
        (
            [folder, str(tmp_path / "missing.csv"), "--output", paths[".jsonl"]],
            "no input file",
        ),  # the output exists (the input file of another case)
        ([folder, paths[".csv"], "--output", str(tmp_path / "o.xlsx")], "must end in .jsonl or .csv"),
        (
            [str(tmp_path / "nothing"), paths[".csv"], "--output", str(tmp_path / "o.jsonl")],
            "no classifier folder",
        ),
    ]
    gold = tmp_path / "gold.csv"
    pd.DataFrame({"text": TEXTS, "labels": ["cardio"] * len(TEXTS)}).to_csv(gold, index=False)
    cases.append(([folder, str(gold), "--output", str(tmp_path / "o.jsonl")], "has a column 'labels', which"))
    cases.append(([folder, paths[".csv"], "--output", paths[".csv"]], "is the input file"))
    (tmp_path / "empty").mkdir()
    cases.append(
        ([str(tmp_path / "empty"), paths[".csv"], "--output", str(tmp_path / "o.jsonl")], "holds no saved")
    )
    for argv, message in cases:
        assert main(["predict", *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    # a file with its gold labels: the predictions go beside them under the prefix the error names
    out = tmp_path / "beside.csv"
    assert (
        main(["predict", folder, str(gold), "--output", str(out), "--prediction_prefix", "predicted_"]) == 0
    )
    table = pd.read_csv(out)
    assert list(table.columns) == ["text", "labels", "predicted_labels", "predicted_scores"]
    assert (table["labels"] == "cardio").all()


def test_predict_keeps_the_input_columns_types_in_json_lines(tmp_path, classifier):
    """Numbers stay numbers, a missing value is null: the JSON lines are the input's rows plus the predictions."""
    folder, _ = classifier
    path = tmp_path / "in.jsonl"
    frame = pd.DataFrame({"id": range(len(TEXTS)), "text": TEXTS, "weight": [0.5, None] * (len(TEXTS) // 2)})
    frame.to_json(path, orient="records", lines=True)
    out = tmp_path / "out.jsonl"
    assert main(["predict", folder, str(path), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(len(TEXTS)))
    assert [r["weight"] for r in rows[:2]] == [0.5, None]


def test_rows_without_text_get_no_labels_and_a_warning(tmp_path, classifier, caplog):
    """An empty, blank or missing (JSON null) text is not scored (a null is not the text "nan" or "None"); the
    other rows get the scores they get alone."""
    folder, probs = classifier
    path = tmp_path / "in.jsonl"
    texts = [TEXTS[0], "", "   ", None, TEXTS[1]]
    pd.DataFrame({"id": range(5), "text": texts}).to_json(path, orient="records", lines=True)
    out = tmp_path / "out.jsonl"
    with caplog.at_level("WARNING", logger="hf_mlcl.prediction"):
        assert main(["predict", folder, str(path), "--output", str(out), "--all_scores"]) == 0
    assert "3 of 5 rows have no text" in caplog.text
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["labels"] for r in rows[1:4]] == [[], [], []]
    assert all(set(r["scores"].values()) == {None} for r in rows[1:4])
    assert rows[3]["text"] is None
    for row, p in zip((rows[0], rows[4]), probs[:2]):
        np.testing.assert_allclose([row["scores"][n] for n in NAMES], p, atol=1e-5)


def test_a_classifier_without_its_weights_is_one_line(tmp_path, classifier, capsys):
    import os
    import shutil

    folder = tmp_path / "broken"
    shutil.copytree(classifier[0], folder)
    os.remove(folder / "model.safetensors")
    path = _inputs(tmp_path)[".csv"]
    capsys.readouterr()
    assert main(["predict", str(folder), path, "--output", str(tmp_path / "o.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds no complete model" in err[0], err


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


def test_a_device_this_machine_lacks_or_an_output_folder_is_one_line(tmp_path, classifier, capsys):
    folder, _ = classifier
    source = _inputs(tmp_path)[".csv"]
    missing = "cuda" if not torch.cuda.is_available() else f"cuda:{torch.cuda.device_count()}"
    assert main(["predict", folder, source, "--output", str(tmp_path / "p.jsonl"), "--device", missing]) == 2
    assert f"--device {missing}: torch sees" in _one_line_error(capsys)
    assert main(["predict", folder, source, "--output", str(tmp_path / "p.jsonl"), "--device", "tpu9"]) == 2
    assert "--device 'tpu9'" in _one_line_error(capsys)
    (tmp_path / "out.jsonl").mkdir()
    assert main(["predict", folder, source, "--output", str(tmp_path / "out.jsonl")]) == 2
    assert "is a folder; name the file to write" in _one_line_error(capsys)
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.parametrize("flag", ["--max_length", "--batch_size"])
def test_a_length_or_batch_below_one_is_refused(tmp_path, classifier, capsys, flag):
    folder, _ = classifier
    with pytest.raises(SystemExit) as stop:
        main(["predict", folder, _inputs(tmp_path)[".csv"], "--output", str(tmp_path / "p.jsonl"), flag, "0"])
    assert stop.value.code == 2 and "expected a positive integer; got '0'" in capsys.readouterr().err


def test_a_json_array_file_and_list_cells_are_read_as_training_reads_them(tmp_path, classifier):
    """A `.json` file holding one array of records (training reads it) and a parquet list column passed through:
    the array was read as two columns and the list written as the string "['a' 'b']"."""
    folder, _ = classifier
    frame = pd.DataFrame({"text": TEXTS, "gold": [["cardio", "renal"], []] * (len(TEXTS) // 2)})
    frame["meta"] = [{"tags": ["a", "b"], "nested": [["x"], ["y", "z"]]}] * len(TEXTS)
    array = tmp_path / "in.json"
    array.write_text(json.dumps(frame.to_dict("records")), encoding="utf-8")
    frame.to_parquet(tmp_path / "in.parquet")
    for path in (array, tmp_path / "in.parquet"):
        out = tmp_path / f"out{path.suffix}.jsonl"
        assert main(["predict", folder, str(path), "--output", str(out)]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert [r["text"] for r in rows] == TEXTS
        assert [r["gold"] for r in rows] == frame["gold"].tolist(), path.suffix
        assert [r["meta"] for r in rows] == frame["meta"].tolist(), path.suffix


def test_predict_tells_apart_logits_that_float32_would_round_to_one(
    tmp_path, tiny_bert_config, bert_tokenizer
):
    """Logits 17, 18 and 20 (float32's sigmoid is 1 for all three) at a stored threshold between the first two:
    the label of logit 17 is below it, as in the float64 scores the threshold was tuned on."""
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="cls")
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, head="native").eval()
    with torch.no_grad():
        clf.classifier.weight.zero_()
        clf.classifier.bias.copy_(torch.tensor([17.0, 18.0, 20.0]))
    clf.config.decision_threshold = [1 / (1 + np.exp(-17.5)), 0.5, 0.5]
    folder = tmp_path / "confident"
    clf.save_pretrained(folder)
    assert to_native_classifier(str(folder), tokenizer=bert_tokenizer)
    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["predict", str(folder), str(tmp_path / "in.txt"), "--output", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["labels"] for r in rows] == [["renal", "neuro"]] * len(TEXTS)
