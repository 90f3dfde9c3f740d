"""Hub loading without hf_mlcl: save_pretrained(dir) -> a fresh Python in which importing hf_mlcl fails
loads identical weights with AutoModel / AutoModelForSequenceClassification (trust_remote_code=True) and
pipeline("text-classification", top_k=None) returns every label by name with sigmoid scores."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _outside import run_outside

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification

TEXTS = [
    "the patient was admitted with chest pain and shortness of breath",
    "graph neural network learning theory quantum physics",
]

# Loads the saved folders with remote code in a fresh interpreter where hf_mlcl and the extras are absent.
_CHILD = """
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, pipeline

if SPEC.get("encoder_dir"):
    enc = AutoModel.from_pretrained(SPEC["encoder_dir"], trust_remote_code=True).eval()
    ref = torch.load(SPEC["encoder_state"])
    got = enc.state_dict()
    REPORT["encoder_class"] = type(enc).__module__ + "." + type(enc).__name__
    REPORT["encoder_weights_equal"] = set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
    tok = AutoTokenizer.from_pretrained(SPEC["encoder_dir"])
    batch = tok(SPEC["texts"], padding=True, return_tensors="pt")
    with torch.no_grad():
        REPORT["embeddings"] = enc(**batch).embeddings.tolist()
REPORT["classifiers"] = []
for item in SPEC["classifiers"]:
    clf = AutoModelForSequenceClassification.from_pretrained(item["dir"], trust_remote_code=True).eval()
    ref = torch.load(item["state"])
    got = clf.state_dict()
    pipe = pipeline("text-classification", model=item["dir"], top_k=None, trust_remote_code=True)
    REPORT["classifiers"].append(
        {
            "class": type(clf).__module__ + "." + type(clf).__name__,
            "weights_equal": set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref),
            "pipeline": pipe(SPEC["texts"]),
        }
    )
"""


def run_without_hf_mlcl(tmp_path, spec: dict) -> dict:
    """Run the loading script in a subprocess where hf_mlcl and the optional extras cannot be imported."""
    return run_outside(tmp_path / "child", _CHILD, spec)


def _save_all(tmp_path, encoder, classifiers, tokenizer):
    enc_dir = tmp_path / "encoder"
    encoder.save_pretrained(enc_dir)
    tokenizer.save_pretrained(enc_dir)
    torch.save(encoder.state_dict(), tmp_path / "encoder_state.pt")
    spec = {
        "encoder_dir": str(enc_dir),
        "encoder_state": str(tmp_path / "encoder_state.pt"),
        "texts": TEXTS,
        "classifiers": [],
    }
    for i, classifier in enumerate(classifiers):
        clf_dir = tmp_path / f"classifier{i}"
        classifier.save_pretrained(clf_dir)
        tokenizer.save_pretrained(clf_dir)
        torch.save(classifier.state_dict(), tmp_path / f"classifier{i}_state.pt")
        spec["classifiers"].append({"dir": str(clf_dir), "state": str(tmp_path / f"classifier{i}_state.pt")})
    return spec


def _check_report(report, encoder, classifiers, tokenizer):
    assert report["encoder_class"].startswith("transformers_modules.") and report["encoder_class"].endswith(
        "modeling_mlcl.MLCLEncoder"
    )
    assert report["encoder_weights_equal"]
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    encoder.eval()
    with torch.no_grad():
        emb = encoder(**batch).embeddings
    torch.testing.assert_close(torch.tensor(report["embeddings"]), emb, atol=1e-5, rtol=1e-5)
    assert len(report["classifiers"]) == len(classifiers)
    for classifier, loaded in zip(classifiers, report["classifiers"]):
        assert loaded["class"].startswith("transformers_modules.")
        assert loaded["class"].endswith("modeling_mlcl.MLCLForMultiLabelClassification")
        assert loaded["weights_equal"]
        classifier.eval()
        with torch.no_grad():
            probs = torch.sigmoid(classifier(**batch).logits)
        names = classifier.config.id2label
        for i, result in enumerate(loaded["pipeline"]):
            assert sorted(r["label"] for r in result) == sorted(names.values())  # every label, by name
            by_name = {r["label"]: r["score"] for r in result}
            got = torch.tensor([by_name[names[k]] for k in range(len(names))])
            torch.testing.assert_close(got, probs[i], atol=1e-5, rtol=1e-5)  # sigmoid, not softmax


def test_hub_roundtrip_without_hf_mlcl(tmp_path, tiny_bert_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=16)
    names = ["cardio", "renal", "neuro", "onco"]
    classifiers = []
    for head in ("linear", "label_attention"):
        clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=names, head=head, chunk_size=8)
        with torch.no_grad():  # non-trivial head weights
            for p in clf.classifier.parameters():
                p.normal_(0, 0.5)
        classifiers.append(clf)
    spec = _save_all(tmp_path, encoder, classifiers, bert_tokenizer)
    report = run_without_hf_mlcl(tmp_path, spec)
    _check_report(report, encoder, classifiers, bert_tokenizer)
    for item, head in zip(spec["classifiers"], ("linear", "label_attention")):
        cfg = json.load(open(os.path.join(item["dir"], "config.json")))
        assert cfg["problem_type"] == "multi_label_classification" and cfg["head"] == head
        assert cfg["id2label"] == {str(i): n for i, n in enumerate(names)}


@pytest.mark.slow
def test_minilm_trains_and_roundtrips(tmp_path, minilm_path):
    """The real all-MiniLM-L6-v2 as backbone: a few contrastive steps, then save / load / pipeline."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    encoder = MLCLEncoder.from_backbone(minilm_path, pooling="mean", projection_dim=32)
    plain = AutoModel.from_pretrained(minilm_path)
    for key, value in plain.state_dict().items():  # pretrained weights kept (not re-initialised)
        assert torch.equal(value, encoder.backbone.state_dict()[key]), key
    texts = TEXTS * 2 + ["heart failure with kidney disease", "quantum field theory of learning"]
    labels = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1], [1, 0], [0, 1]], dtype=torch.float32)
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    opt = torch.optim.AdamW(encoder.parameters(), lr=5e-5)
    encoder.train()
    losses = []
    for _ in range(4):  # SupCon-style loss written out (losses live in another package)
        z = torch.nn.functional.normalize(encoder(**batch).embeddings, dim=-1)
        sim = z @ z.T / 0.1
        eye = torch.eye(len(texts), dtype=torch.bool)
        pos = ((labels @ labels.T) > 0) & ~eye
        log_prob = sim.masked_fill(eye, -1e9).log_softmax(-1)
        loss = -(log_prob * pos).sum(1).div(pos.sum(1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    classifier = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=["medical", "science"])
    spec = _save_all(tmp_path, encoder, [classifier], tokenizer)
    assert (
        json.load(open(os.path.join(spec["encoder_dir"], "config.json")))["backbone_name_or_path"]
        == minilm_path
    )
    report = run_without_hf_mlcl(tmp_path, spec)
    _check_report(report, encoder, [classifier], tokenizer)
