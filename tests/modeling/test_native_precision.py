"""A model trained over a bf16 backbone keeps its adapter and heads in float32; hf_mlcl reloads that split, while
sentence-transformers (one dtype for every module) and peft (the head in the backbone's dtype) run parts of it
in bf16: their outputs equal the trained ones to bf16 rounding, and the card and a warning say so."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from _outside import run_outside
from transformers import LlamaModel

from hf_mlcl.hub.card_callback import ModelCardCallback, reduced_precision
from hf_mlcl.hub.model_card import CardData, render_model_card
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora
from hf_mlcl.modeling.lora import save_lora_adapter
from hf_mlcl.modeling.native import to_native_classifier, to_sentence_transformers

TEXTS = ["the patient was admitted with chest pain", "graph neural network learning theory", "joy anger"]
NAMES = ["a", "b", "c", "d"]

_ST = """
import torch
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(SPEC["folder"], device="cpu")
REPORT["dtypes"] = sorted({str(p.dtype) for p in model.parameters()})
REPORT["embeddings"] = model.encode(SPEC["texts"], convert_to_tensor=True).float().tolist()
"""


def _base(tmp_path, config, tokenizer, stored: torch.dtype = torch.bfloat16) -> str:
    """A tiny Llama saved in ``stored``: bfloat16 as Llama checkpoints are, or float32 that LoRA casts to bfloat16."""
    torch.manual_seed(0)
    base = tmp_path / "base"
    LlamaModel(config).to(stored).save_pretrained(base)
    tokenizer.save_pretrained(base)
    return str(base)


def _train_like(model) -> None:
    """Adapter and heads away from their initialisation, as training leaves them."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
            elif p.requires_grad and "lora_A" not in name:
                p.normal_(0, 0.3)


def _rel(got, want) -> float:
    got, want = torch.as_tensor(got, dtype=torch.float32), want.float()
    return float(((got - want).norm(dim=-1) / want.norm(dim=-1)).max())


def test_reduced_precision_names_a_bf16_backbone_beside_float32_heads(tiny_bert_config):
    mixed = MLCLEncoder.from_backbone(
        tiny_bert_config, pooling="mean", projection_dim=8, dtype=torch.bfloat16
    )
    assert reduced_precision(mixed) == "bfloat16"
    assert reduced_precision(MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean")) is None
    assert reduced_precision(mixed.to(torch.bfloat16)) is None  # one dtype throughout: loaders reproduce it


def test_lora_casts_the_parameters_and_keeps_the_rotary_frequencies(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    """bf16 LoRA casts the backbone's parameters; Llama's inv_freq stays float32, as loading in bfloat16 makes it
    (rounded to bfloat16, every rotary angle would differ from the reloaded model's)."""
    base = _base(tmp_path, tiny_llama_config, llama_tokenizer, torch.float32)
    encoder = MLCLEncoder.from_backbone(base, pooling="last_token", projection_dim=8)
    model = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=True)
    backbone = model.base_model.model.backbone
    assert {p.dtype for n, p in backbone.named_parameters() if "lora_" not in n} == {torch.bfloat16}
    loaded = LlamaModel.from_pretrained(base, dtype=torch.bfloat16)
    assert backbone.rotary_emb.inv_freq.dtype == loaded.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(backbone.rotary_emb.inv_freq, loaded.rotary_emb.inv_freq)


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32])
def test_a_bf16_lora_encoder_reloads_as_trained_and_in_sentence_transformers_within_bf16_rounding(
    tmp_path, tiny_llama_config, llama_tokenizer, caplog, stored
):
    """The base stored in bfloat16, or in float32 and cast for training: hf_mlcl reloads the trained model
    exactly (the base in the dtype it trained in, recorded in the folder); sentence-transformers loads the base in
    that dtype too (``model_args`` of sentence_bert_config.json) and runs every module in it."""
    base = _base(tmp_path, tiny_llama_config, llama_tokenizer, stored)
    encoder = MLCLEncoder.from_backbone(base, pooling="last_token", projection_dim=8)
    model = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=True)
    _train_like(model)
    model.eval()
    folder = tmp_path / "encoder"
    save_lora_adapter(model, str(folder), base)
    trained = model.base_model.model.encode(TEXTS, llama_tokenizer, max_length=32, output="pooled")
    hf_format = MLCLEncoder.from_pretrained(
        str(folder)
    )  # hf_mlcl's own adapter layout, before the conversion
    torch.testing.assert_close(
        hf_format.encode(TEXTS, llama_tokenizer, max_length=32, output="pooled"), trained
    )
    assert to_sentence_transformers(str(folder), max_seq_length=32, tokenizer=llama_tokenizer)
    reloaded = MLCLEncoder.from_pretrained(str(folder)).encode(
        TEXTS, llama_tokenizer, max_length=32, output="pooled"
    )
    torch.testing.assert_close(reloaded, trained, rtol=0, atol=0)  # hf_mlcl keeps the float32 adapter
    report = run_outside(
        tmp_path / "st",
        _ST,
        {"folder": str(folder), "texts": TEXTS},
        consumers=("sentence_transformers", "peft"),
    )
    rel = _rel(report["embeddings"], trained)
    print(
        f"bf16 LoRA encoder in sentence-transformers: {report['dtypes']}, max relative difference {rel:.2e}"
    )
    assert report["dtypes"] == ["torch.bfloat16"] and 0 < rel < 2e-2

    callback = ModelCardCallback(kind="encoder")
    callback._collect_model(model)
    with caplog.at_level(logging.WARNING, logger="hf_mlcl.hub.card_callback"):
        callback.save(str(folder))
    assert "bfloat16" in caplog.text and "from_pretrained as trained" in caplog.text
    card = (folder / "README.md").read_text()
    assert (
        "**Precision.** The backbone's weights are bfloat16 and the trained LoRA adapter and heads float32"
        in card
    )


@pytest.mark.parametrize("stored", [torch.bfloat16, torch.float32])
def test_the_peft_card_snippet_runs_on_a_bf16_native_lora_classifier(
    tmp_path, tiny_llama_config, llama_tokenizer, stored
):
    """The PEFT-layout card's snippet, verbatim and without hf_mlcl, on a bf16-trained base: peft loads the head
    in bf16, which the snippet turns to float32 for numpy; the probabilities are hf_mlcl's to bf16 rounding, and
    hf_mlcl reads the folder back to the trained probabilities exactly (the head as saved, in float32)."""
    base = _base(tmp_path, tiny_llama_config, llama_tokenizer, stored)
    encoder = MLCLEncoder.from_backbone(base, pooling="last_token")
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=NAMES, head="native")
    clf.config.decision_threshold = 0.4
    model = apply_lora(clf, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=True)
    _train_like(model)
    model.eval()
    saved, folder = tmp_path / "saved", tmp_path / "classifier"
    save_lora_adapter(model, str(saved), base)
    assert to_native_classifier(str(saved), tokenizer=llama_tokenizer, target=str(folder), max_seq_length=32)
    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        trained = torch.sigmoid(model.base_model.model(**batch).logits)
        reloaded = torch.sigmoid(MLCLForMultiLabelClassification.from_pretrained(str(folder))(**batch).logits)
    torch.testing.assert_close(reloaded, trained, rtol=0, atol=0)
    card = CardData(
        kind="classifier",
        dataset="synthetic",
        loss="bce",
        probe="finetune",
        layout="peft",
        folder=str(folder),
        hyperparameters={"max_length": 32},
        reduced_precision=reduced_precision(model),
    )
    text = str(render_model_card(card))
    assert "peft keeps the LoRA matrices in float32 but loads the head in the backbone's dtype" in text
    snippet = re.findall(r"```python\n(.*?)```", text.split("## How to use", 1)[1].split("\n## ", 1)[0], re.S)
    report = run_outside(
        tmp_path / "card",
        snippet[0]
        + "\nREPORT['probs'] = probs.tolist()\nREPORT['head'] = str(model.score.modules_to_save.default.weight.dtype)\n",
        {},
        consumers=("peft",),
    )
    batch = llama_tokenizer(["a document to label"], return_tensors="pt")
    with torch.no_grad():
        want = torch.sigmoid(model.base_model.model(**batch).logits).float()
    diff = float((torch.tensor(report["probs"]) - want).abs().max())
    print(f"bf16 native LoRA classifier through peft: head {report['head']}, max abs difference {diff:.2e}")
    assert report["head"] == "torch.bfloat16" and diff < 1e-2


def test_a_stage_loads_an_adapter_encoder_as_trained_and_a_fine_tune_on_its_stored_base(
    tmp_path, tiny_llama_config, llama_tokenizer, monkeypatch
):
    """A frozen probe reads a bf16-trained adapter encoder in bf16 (the features stage 1 computed); a fine-tune,
    which merges the adapter, loads the float32 base as stored so the merge keeps the whole update."""
    from hf_mlcl.modeling.builders import build_tokenizer_and_encoder
    from hf_mlcl.training import ModelArguments, classifier_stages

    base = _base(tmp_path, tiny_llama_config, llama_tokenizer, torch.float32)
    encoder = MLCLEncoder.from_backbone(base, pooling="last_token", projection_dim=8)
    model = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=True)
    _train_like(model)
    folder = tmp_path / "encoder"
    save_lora_adapter(model.eval(), str(folder), base)
    args = ModelArguments(model_name_or_path=base)
    dtypes = {}
    for dtype in (None, "auto"):
        _, loaded = build_tokenizer_and_encoder(args, None, source=str(folder), dtype=dtype)
        dtypes[dtype] = next(p.dtype for n, p in loaded.named_parameters() if "lora_" not in n)
    assert dtypes == {None: torch.bfloat16, "auto": torch.float32}

    asked = []
    monkeypatch.setattr(
        classifier_stages,
        "build_tokenizer_and_encoder",
        lambda *a, dtype=None, **k: asked.append(dtype) or (None, None),
    )
    monkeypatch.setattr(classifier_stages, "probe_model", lambda *a, **k: None)

    class Data:
        dataset = {"train": {"text": ["a"]}}
        label_names = NAMES

    for probe in ("linear", "logistic", "finetune"):
        classifier_stages._classifier_model(args, Data(), str(folder), probe)
    assert asked == [None, None, "auto"]


def test_a_merge_of_a_bf16_trained_adapter_keeps_its_float32_base(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    """save_lora_model(merge=True) in one process merges like a sharded save: onto the base as stored (float32
    here: the whole update kept), the live model left as it is."""
    from hf_mlcl.modeling.lora import save_lora_model

    base = _base(tmp_path, tiny_llama_config, llama_tokenizer, torch.float32)
    encoder = MLCLEncoder.from_backbone(base, pooling="last_token", projection_dim=8)
    model = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=True)
    _train_like(model)
    model.eval()
    save_lora_adapter(model, str(tmp_path / "adapter"), base)
    save_lora_model(model, str(tmp_path / "merged"), merge=True)
    merged = MLCLEncoder.from_pretrained(str(tmp_path / "merged"))
    assert {p.dtype for p in merged.backbone.parameters()} == {torch.float32}
    on_stored = MLCLEncoder.from_pretrained(str(tmp_path / "adapter"), dtype="auto")
    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(merged(**batch).pooled, on_stored(**batch).pooled, rtol=1e-5, atol=1e-5)
    assert any("lora_B" in name for name, _ in model.named_parameters())  # not merged in place
    assert to_sentence_transformers(
        str(tmp_path / "merged"), 32, tokenizer=llama_tokenizer
    )  # as stage 1 does
    callback = ModelCardCallback(kind="encoder")
    callback._collect_model(model)  # a bf16 backbone beside float32 heads, as trained
    callback.save(str(tmp_path / "merged"))
    assert "**Precision.**" not in (tmp_path / "merged" / "README.md").read_text()  # saved float32 throughout
