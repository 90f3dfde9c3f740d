"""Hub loading without hf_mlcl: save_pretrained(dir) -> a fresh Python in which importing hf_mlcl fails
loads identical weights with AutoModel / AutoModelForSequenceClassification (trust_remote_code=True) and
pipeline("text-classification", top_k=None) returns every label by name with sigmoid scores."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification

TEXTS = [
    "the patient was admitted with chest pain and shortness of breath",
    "graph neural network learning theory quantum physics",
]

# Runs in a fresh interpreter, cwd outside the repo, with an import blocker for hf_mlcl.
_CHILD = textwrap.dedent(
    r"""
    import importlib.abc, json, sys

    class _BlockHfMlcl(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "hf_mlcl" or name.startswith("hf_mlcl."):
                raise ImportError("hf_mlcl is blocked in this test environment")
            return None

    sys.meta_path.insert(0, _BlockHfMlcl())
    try:
        import hf_mlcl  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("hf_mlcl was importable; the test would prove nothing")

    import torch
    from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer, pipeline

    spec = json.load(open(sys.argv[1]))
    report = {}
    if spec.get("encoder_dir"):
        enc = AutoModel.from_pretrained(spec["encoder_dir"], trust_remote_code=True).eval()
        ref = torch.load(spec["encoder_state"])
        got = enc.state_dict()
        report["encoder_class"] = type(enc).__module__ + "." + type(enc).__name__
        report["encoder_weights_equal"] = set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref)
        tok = AutoTokenizer.from_pretrained(spec["encoder_dir"])
        batch = tok(spec["texts"], padding=True, return_tensors="pt")
        with torch.no_grad():
            report["embeddings"] = enc(**batch).embeddings.tolist()
    report["classifiers"] = []
    for item in spec["classifiers"]:
        clf = AutoModelForSequenceClassification.from_pretrained(item["dir"], trust_remote_code=True).eval()
        ref = torch.load(item["state"])
        got = clf.state_dict()
        pipe = pipeline("text-classification", model=item["dir"], top_k=None, trust_remote_code=True)
        report["classifiers"].append(
            {
                "class": type(clf).__module__ + "." + type(clf).__name__,
                "weights_equal": set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref),
                "pipeline": pipe(spec["texts"]),
            }
        )
    report["loaded_hf_mlcl"] = any(m == "hf_mlcl" or m.startswith("hf_mlcl.") for m in sys.modules)
    json.dump(report, open(sys.argv[2], "w"))
    """
)


def run_without_hf_mlcl(tmp_path, spec: dict) -> dict:
    """Run the loading script in a subprocess where hf_mlcl cannot be imported; return its report."""
    work = tmp_path / "child"
    (work / "fake" / "hf_mlcl").mkdir(parents=True)
    (work / "fake" / "hf_mlcl" / "__init__.py").write_text(
        "raise ImportError('hf_mlcl is not installed here')\n"
    )
    (work / "spec.json").write_text(json.dumps(spec))
    (work / "child.py").write_text(_CHILD)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHONPATH", "HF_", "TRANSFORMERS_", "PYTEST"))
    }
    env.update(
        PYTHONPATH=str(work / "fake"),
        HF_HUB_OFFLINE="1",
        HF_HOME=str(work / "hf_home"),
        HF_MODULES_CACHE=str(work / "modules"),
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
    )
    proc = subprocess.run(
        [sys.executable, str(work / "child.py"), str(work / "spec.json"), str(work / "report.json")],
        cwd=str(work),
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((work / "report.json").read_text())


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
    assert report["loaded_hf_mlcl"] is False
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
