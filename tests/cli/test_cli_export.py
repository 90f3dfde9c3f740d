"""`hf-mlcl export FOLDER --to onnx`: onnx/model.onnx beside the config, which onnxruntime runs without hf_mlcl and
with the PyTorch outputs, for a native classifier, a sentence-transformers encoder and a remote-code classifier."""

from __future__ import annotations

import os

import pytest
import torch
from _outside import run_outside

from hf_mlcl.cli import main
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
from hf_mlcl.modeling.native import to_native_classifier, to_sentence_transformers

TEXTS = ["the patient was admitted with chest pain and shortness of breath", "graph neural network", "joy"]

_ONNXRUNTIME = """
import numpy as np
import onnxruntime
from transformers import AutoTokenizer

for name, folder in SPEC["folders"].items():
    session = onnxruntime.InferenceSession(folder + "/onnx/model.onnx", providers=["CPUExecutionProvider"])
    batch = AutoTokenizer.from_pretrained(folder)(SPEC["texts"], padding=True, return_tensors="np")
    feeds = {i.name: batch[i.name] for i in session.get_inputs()}
    REPORT[name] = {o.name: v.tolist() for o, v in zip(session.get_outputs(), session.run(None, feeds))}
"""


def _batch(tokenizer):
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    return {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


@pytest.mark.slow  # the fast version: tests/cli/test_readme_use_your_model.py (README's export in onnxruntime)
def test_export_to_onnx_runs_in_onnxruntime_without_hf_mlcl(
    tmp_path, tiny_bert_config, tiny_llama_config, bert_tokenizer, llama_tokenizer
):
    torch.manual_seed(0)
    folders, want = {}, {}
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=8).eval()
    encoder.save_pretrained(tmp_path / "encoder")
    assert to_sentence_transformers(str(tmp_path / "encoder"), 64, tokenizer=bert_tokenizer)
    with torch.no_grad():
        want["encoder"] = {"sentence_embedding": encoder(**_batch(bert_tokenizer)).pooled}
    for name, config, tok, head in (
        ("native", tiny_llama_config, llama_tokenizer, "native"),
        ("remote_code", tiny_bert_config, bert_tokenizer, "linear"),
    ):
        base = MLCLEncoder.from_backbone(config, pooling="last_token" if head == "native" else "mean")
        clf = MLCLForMultiLabelClassification.from_encoder(base, id2label=["a", "b", "c"], head=head).eval()
        with torch.no_grad():
            clf.classifier.weight.normal_(0, 1.0)
            want[name] = {"logits": clf(**_batch(tok)).logits}
        clf.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        if head == "native":
            assert to_native_classifier(str(tmp_path / name), tokenizer=tok)
    for name in want:
        folders[name] = str(tmp_path / name)
        assert main(["export", folders[name], "--to", "onnx"]) == 0
        assert os.path.isfile(os.path.join(folders[name], "onnx", "model.onnx"))
    report = run_outside(
        tmp_path / "child", _ONNXRUNTIME, {"folders": folders, "texts": TEXTS}, consumers=("onnxruntime",)
    )
    for name, outputs in want.items():
        for output, value in outputs.items():
            assert (torch.tensor(report[name][output]) - value).abs().max() <= 1e-4, (name, output)
    assert len(torch.tensor(report["encoder"]["last_hidden_state"]).shape) == 3


def test_export_of_a_missing_folder_is_one_line(tmp_path, capsys):
    assert main(["export", str(tmp_path / "nothing")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no model folder" in err[0]


def test_export_of_a_projected_encoder_outputs_its_projected_embedding(
    tmp_path, tiny_bert_config, bert_tokenizer
):
    """A sentence-transformers folder saved with the projected embedding exports that embedding, not the pooled one."""
    import onnxruntime

    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=8).eval()
    encoder.save_pretrained(tmp_path)
    assert to_sentence_transformers(str(tmp_path), 64, embedding="projected", tokenizer=bert_tokenizer)
    assert main(["export", str(tmp_path), "--to", "onnx"]) == 0
    session = onnxruntime.InferenceSession(
        str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    batch = bert_tokenizer(TEXTS, padding=True, return_tensors="np")
    got = dict(
        zip(
            [o.name for o in session.get_outputs()],
            session.run(None, {i.name: batch[i.name] for i in session.get_inputs()}),
        )
    )
    with torch.no_grad():
        want = encoder(**_batch(bert_tokenizer)).embeddings
    assert got["sentence_embedding"].shape == (3, 8)
    assert (torch.from_numpy(got["sentence_embedding"]) - want).abs().max() <= 1e-4


def test_export_of_a_segmented_model_is_one_line(tmp_path, tiny_roberta_config, bert_tokenizer, capsys):
    MLCLEncoder.from_backbone(tiny_roberta_config, segmented=True, chunk_size=8).save_pretrained(tmp_path)
    bert_tokenizer.save_pretrained(tmp_path)
    capsys.readouterr()
    assert main(["export", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "segmented" in err[0]
    assert not os.path.exists(tmp_path / "onnx")


def test_export_of_a_folder_without_its_tokenizer_is_one_line(tmp_path, tiny_bert_config, capsys):
    """Without a tokenizer transformers makes an empty one from the model type, whose inputs (BERT's
    token_type_ids) the model's own tokenizer may never produce: the graph could not be fed."""
    MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean").save_pretrained(tmp_path)
    capsys.readouterr()
    assert main(["export", str(tmp_path), "--to", "onnx"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("hf-mlcl")]
    assert len(err) == 1 and "holds no tokenizer" in err[0], err
    assert not (tmp_path / "onnx").exists()


def test_a_model_over_two_gigabytes_keeps_its_data_file_under_the_name_the_model_reads(tmp_path):
    """torch.onnx writes the weights of a model over 2 GB to '<model file name>.data' and records that name in
    the model: both land in onnx/ under those names, with no temporary file left, nor one a killed export left."""
    from hf_mlcl.onnx_export import _save

    class Program:
        def save(self, path):
            with open(path + ".data", "w") as fh:
                fh.write("weights")
            with open(path, "w") as fh:
                fh.write("graph naming " + os.path.basename(path) + ".data")

    folder = tmp_path / "onnx"
    (folder / ".tmp-killed").mkdir(parents=True)  # the staging folder of an export killed while saving
    (folder / ".tmp-killed" / "model.onnx").write_text("half")
    _save(Program(), str(folder / "model.onnx"))
    assert sorted(os.listdir(folder)) == ["model.onnx", "model.onnx.data"]
    assert (folder / "model.onnx").read_text() == "graph naming model.onnx.data"


def test_a_sentence_transformers_classifier_exports_the_token_states_its_onnx_backend_reads(
    tmp_path, tiny_bert_config, bert_tokenizer
):
    """sentence-transformers' ONNX backend reads ``last_hidden_state`` from onnx/model.onnx and runs the folder's
    Pooling and Dense modules on it: done here with the folder's own modules, it gives the folder's probabilities;
    ``logits`` stays the last output for onnxruntime users."""
    import onnxruntime
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(0)
    base = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean")
    clf = MLCLForMultiLabelClassification.from_encoder(base, id2label=["a", "b", "c"], head="linear").eval()
    with torch.no_grad():
        clf.classifier.weight.normal_(0, 1.0)
    clf.save_pretrained(tmp_path)
    bert_tokenizer.save_pretrained(tmp_path)
    assert to_native_classifier(str(tmp_path), tokenizer=bert_tokenizer)
    assert main(["export", str(tmp_path), "--to", "onnx"]) == 0
    session = onnxruntime.InferenceSession(
        str(tmp_path / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    assert [o.name for o in session.get_outputs()] == ["last_hidden_state", "logits"]
    model = SentenceTransformer(str(tmp_path), device="cpu")
    batch = bert_tokenizer(TEXTS, padding=True, return_tensors="np")
    states, logits = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})
    features = {
        "token_embeddings": torch.from_numpy(states),
        "attention_mask": torch.from_numpy(batch["attention_mask"]),
    }
    with torch.no_grad():
        for module in list(model)[1:]:  # Pooling, then the head as a Dense module with a sigmoid
            features = module(features)
    want = model.encode(TEXTS, convert_to_tensor=True)
    assert (features["sentence_embedding"] - want).abs().max() <= 1e-4
    assert (torch.sigmoid(torch.from_numpy(logits)) - want).abs().max() <= 1e-4


def test_an_opset_the_exporter_cannot_write_is_one_line_and_writes_nothing(
    tmp_path, tiny_bert_config, bert_tokenizer, capsys
):
    """torch exports at its own opset and converts; a conversion that fails kept its own opset with exit 0."""
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=8).eval()
    encoder.save_pretrained(tmp_path)
    assert to_sentence_transformers(str(tmp_path), 64, tokenizer=bert_tokenizer)
    capsys.readouterr()
    assert main(["export", str(tmp_path), "--to", "onnx", "--opset", "3"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("hf-mlcl")]
    assert len(err) == 1 and "--opset 3: torch's ONNX exporter could only write opset 18" in err[0], err
    assert not (tmp_path / "onnx" / "model.onnx").exists()
    # an opset newer than the installed onnx knows is refused before the model is loaded
    assert main(["export", str(tmp_path), "--to", "onnx", "--opset", "999"]) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if line.startswith("hf-mlcl")]
    assert len(err) == 1 and "--opset 999: the installed onnx knows opsets 1 to" in err[0], err
    assert not (tmp_path / "onnx").exists() or not any((tmp_path / "onnx").iterdir())
