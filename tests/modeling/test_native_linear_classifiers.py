"""Classifiers with a linear head (any pooling, full or LoRA) save as sentence-transformers folders whose output is
each label's probability: SentenceTransformer loads them without hf_mlcl or remote code and gives hf_mlcl's
probabilities; hf_mlcl reads them back bit for bit; a PLM-ICD classifier keeps hf_mlcl's format."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from _outside import run_outside
from transformers import LlamaModel

from hf_mlcl.hub.model_card import CardData, render_model_card
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora, save_native
from hf_mlcl.modeling.builders import folder_layout
from hf_mlcl.modeling.lora import save_lora_adapter
from hf_mlcl.modeling.native import to_native_classifier

TEXTS = [
    "the patient was admitted with chest pain and shortness of breath",
    "graph neural network learning theory quantum physics",
    "joy anger",
]
NAMES = ["cardio", "renal", "neuro"]

_ST = """
import json
from sentence_transformers import SentenceTransformer

for name, folder in SPEC["folders"].items():
    model = SentenceTransformer(folder, trust_remote_code=False, device="cpu")
    settings = json.load(open(folder + "/mlcl_config.json"))
    probs = model.encode(SPEC["texts"], convert_to_tensor=True)
    names = [settings["id2label"][str(j)] for j in range(probs.shape[1])]
    labels = [[names[j] for j in row.nonzero().flatten().tolist()] for row in probs > settings["decision_threshold"]]
    REPORT[name] = {"probs": probs.float().tolist(), "labels": labels,
                    "adapter": any("lora_" in n for n, _ in model.named_parameters())}
"""


def _linear(config, pooling: str) -> MLCLForMultiLabelClassification:
    encoder = MLCLEncoder.from_backbone(config, pooling=pooling, projection_dim=8)
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES)
    with torch.no_grad():
        clf.classifier.weight.normal_(0, 0.5)
        clf.classifier.bias.normal_(0, 0.5)
    clf.config.decision_threshold = 0.4
    return clf.eval()


def _probs(clf, tokenizer, max_length: int = 32) -> torch.Tensor:
    batch = tokenizer(TEXTS, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    batch = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad():
        return torch.sigmoid(clf(**batch).logits)


def _close(got, want) -> None:
    got = torch.as_tensor(got, dtype=torch.float32)
    cosine = torch.nn.functional.cosine_similarity(got, want).min()
    assert cosine >= 0.99999 and (got - want).abs().max() <= 1e-5, (cosine, (got - want).abs().max())


def test_linear_classifiers_load_in_sentence_transformers_without_hf_mlcl(
    tmp_path, tiny_bert_config, tiny_roberta_config, tiny_llama_config, bert_tokenizer, llama_tokenizer
):
    torch.manual_seed(0)
    folders, want, made = {}, {}, {}
    for name, config, tokenizer, pooling in (
        ("bert_mean", tiny_bert_config, bert_tokenizer, "mean"),
        ("roberta_cls", tiny_roberta_config, bert_tokenizer, "cls"),
        ("llama_last", tiny_llama_config, llama_tokenizer, "last_token"),
    ):
        clf = _linear(config, pooling)
        folder = tmp_path / name
        assert save_native(clf, str(folder), tokenizer=tokenizer, max_seq_length=32)
        assert folder_layout(str(folder)) == "sentence-transformers"
        assert not any(f.endswith(".py") for f in os.listdir(folder))
        assert json.loads((folder / "config.json").read_text())["model_type"] != "mlcl"
        folders[name], want[name], made[name] = str(folder), _probs(clf, tokenizer), clf
    report = run_outside(
        tmp_path / "child", _ST, {"folders": folders, "texts": TEXTS}, consumers=("sentence_transformers",)
    )
    for name, got in report.items():
        if name == "loaded":
            continue
        _close(got["probs"], want[name])
        expected = [[NAMES[j] for j in row.nonzero().flatten().tolist()] for row in want[name] > 0.4]
        assert got["labels"] == expected and not got["adapter"]
    for name, folder in folders.items():  # hf_mlcl reads them back bit for bit
        loaded = MLCLForMultiLabelClassification.from_pretrained(folder)
        assert loaded.config.head == "linear" and loaded.config.decision_threshold == 0.4
        assert (
            loaded.config.id2label == dict(enumerate(NAMES))
            and loaded.config.pooling == made[name].config.pooling
        )
        for key, value in made[name].state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), (name, key)
    with pytest.raises(ValueError, match="is a classifier"):
        MLCLEncoder.from_pretrained(folders["bert_mean"])


def test_lora_classifier_loads_as_a_peft_adapter_in_sentence_transformers(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    torch.manual_seed(0)
    base = tmp_path / "base"
    LlamaModel(tiny_llama_config).save_pretrained(base)
    llama_tokenizer.save_pretrained(base)
    encoder = MLCLEncoder.from_backbone(str(base), pooling="last_token", projection_dim=8)
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES)
    clf.config.decision_threshold = 0.4
    model = apply_lora(clf, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=False)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name or "classifier" in name:
                p.normal_(0, 0.3)
    model.eval()
    saved = tmp_path / "saved"
    save_lora_adapter(model, str(saved), str(base))
    folder = tmp_path / "classifier"
    assert to_native_classifier(str(saved), tokenizer=llama_tokenizer, target=str(folder), max_seq_length=32)
    names = set(os.listdir(folder))
    assert {"adapter_config.json", "adapter_model.safetensors", "modules.json", "mlcl_config.json"} <= names
    assert {"1_Pooling", "2_Dense"} <= names and not any(n.endswith(".py") for n in names)
    assert not (folder / "config.json").exists() and not (folder / "model.safetensors").exists()
    want = _probs(model.base_model.model, llama_tokenizer)
    report = run_outside(
        tmp_path / "child",
        _ST,
        {"folders": {"lora": str(folder)}, "texts": TEXTS},
        consumers=("sentence_transformers", "peft"),
    )
    assert report["lora"]["adapter"]  # applied as an adapter, not merged
    _close(report["lora"]["probs"], want)
    loaded = MLCLForMultiLabelClassification.from_pretrained(str(folder))
    _close(_probs(loaded, llama_tokenizer), want)


def test_a_plm_icd_classifier_keeps_the_hf_mlcl_format(tmp_path, tiny_bert_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", segmented=True, chunk_size=8)
    clf = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=NAMES, head="label_attention", label_attention_dim=8
    )
    assert not save_native(clf, str(tmp_path / "plm"), tokenizer=bert_tokenizer, max_seq_length=32)
    assert folder_layout(str(tmp_path / "plm")) == "hf_mlcl"
    assert (tmp_path / "plm" / "modeling_mlcl.py").is_file()


_PEFT_SEQ_CLS = """
import json
import torch
from peft import AutoPeftModelForSequenceClassification
from transformers import AutoTokenizer

folder = SPEC["folder"]
settings = json.load(open(folder + "/mlcl_config.json"))
id2label = {int(k): v for k, v in settings["id2label"].items()}
tokenizer = AutoTokenizer.from_pretrained(folder)
model = AutoPeftModelForSequenceClassification.from_pretrained(
    folder, id2label=id2label, pad_token_id=tokenizer.pad_token_id, problem_type="multi_label_classification"
).eval()
batch = tokenizer(SPEC["texts"], padding=True, truncation=True, max_length=32, return_tensors="pt")
with torch.no_grad():
    REPORT["probs"] = torch.sigmoid(model(**batch).logits).tolist()
REPORT["class"] = type(model.base_model.model).__name__
"""


def _native_lora_classifier(tmp_path, config, tokenizer, bf16: bool):
    """A Llama LoRA classifier with head='native' (random adapter and head) and its PEFT-layout folder."""
    torch.manual_seed(0)
    base = tmp_path / "base"
    backbone = LlamaModel(config)
    (backbone.to(torch.bfloat16) if bf16 else backbone).save_pretrained(base)
    tokenizer.save_pretrained(base)
    encoder = MLCLEncoder.from_backbone(str(base), pooling="last_token")
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, head="native")
    clf.config.decision_threshold = 0.4
    model = apply_lora(clf, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=bf16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.fill_(1e-4) if bf16 else p.normal_(0, 0.3)  # bf16: updates below its resolution
            elif "classifier" in name:
                p.normal_(0, 0.5)
    model.eval()
    saved = tmp_path / "saved"
    save_lora_adapter(model, str(saved), str(base))
    folder = tmp_path / "classifier"
    assert to_native_classifier(str(saved), tokenizer=tokenizer, target=str(folder), max_seq_length=32)
    return model, folder


@pytest.mark.parametrize("bf16", [False, True])
def test_lora_classifier_with_a_native_head_is_a_peft_seq_cls_adapter(
    tmp_path, tiny_llama_config, llama_tokenizer, bf16
):
    """A Llama LoRA classifier with head='native' (the last token, a linear layer without bias) saves as a PEFT
    adapter of task type SEQ_CLS over LlamaForSequenceClassification; hf_mlcl reads it back unmerged (a bf16 base
    keeps its fp32 adapter)."""
    model, folder = _native_lora_classifier(tmp_path, tiny_llama_config, llama_tokenizer, bf16)
    assert folder_layout(str(folder)) == "peft"
    names = set(os.listdir(folder))
    assert {"adapter_config.json", "adapter_model.safetensors", "mlcl_config.json"} <= names
    assert not {"config.json", "model.safetensors", "modeling_mlcl.py"} & names
    adapter = json.loads((folder / "adapter_config.json").read_text())
    assert adapter["task_type"] == "SEQ_CLS" and adapter["modules_to_save"] == ["score"]
    want = _probs(model.base_model.model, llama_tokenizer).float()
    loaded = MLCLForMultiLabelClassification.from_pretrained(str(folder))
    assert loaded.config.head == "native" and loaded.config.decision_threshold == 0.4
    got = _probs(loaded, llama_tokenizer).float()
    torch.testing.assert_close(got, want, rtol=0, atol=0)  # the head read as saved, in float32


def test_the_card_snippet_of_a_peft_classifier_runs_without_hf_mlcl(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    """The model card's "How to use" snippet of a PEFT-layout classifier, verbatim, where hf_mlcl cannot be
    imported: peft loads the adapter and the snippet prints hf_mlcl's probabilities."""
    model, folder = _native_lora_classifier(tmp_path, tiny_llama_config, llama_tokenizer, bf16=False)
    card = CardData(
        kind="classifier",
        dataset="synthetic",
        loss="bce",
        probe="finetune",
        layout="peft",
        folder=str(folder),
        hyperparameters={"max_length": 32},
    )
    text = str(render_model_card(card))
    assert "library_name: peft" in text and "trust_remote_code" not in text
    snippet = re.findall(r"```python\n(.*?)```", text.split("## How to use", 1)[1].split("\n## ", 1)[0], re.S)
    assert len(snippet) == 1 and "AutoPeftModelForSequenceClassification" in snippet[0]
    report = run_outside(
        tmp_path / "card", snippet[0] + "\nREPORT['probs'] = probs.tolist()\n", {}, consumers=("peft",)
    )
    batch = llama_tokenizer(["a document to label"], return_tensors="pt")
    with torch.no_grad():
        doc = torch.sigmoid(model.base_model.model(**batch).logits)
    _close(report["probs"], doc)


# make test-slow: the default suite's peft load of such a folder outside hf_mlcl is the card's snippet above
@pytest.mark.slow
def test_peft_loads_a_native_lora_classifier_as_llama_for_sequence_classification(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    """peft's AutoPeftModelForSequenceClassification, without hf_mlcl, builds LlamaForSequenceClassification from
    the folder and gives hf_mlcl's probabilities on a padded batch."""
    model, folder = _native_lora_classifier(tmp_path, tiny_llama_config, llama_tokenizer, bf16=False)
    want = _probs(model.base_model.model, llama_tokenizer).float()
    report = run_outside(
        tmp_path / "child", _PEFT_SEQ_CLS, {"folder": str(folder), "texts": TEXTS}, consumers=("peft",)
    )
    assert report["class"] == "LlamaForSequenceClassification"
    _close(report["probs"], want)
