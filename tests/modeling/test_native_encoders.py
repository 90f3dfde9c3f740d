"""Encoders saved as sentence-transformers folders load in sentence-transformers without hf_mlcl or remote code
and give hf_mlcl's embeddings; a LoRA encoder loads as a PEFT adapter over its base, unmerged, so a bf16 base
keeps updates below its resolution; hf_mlcl reads every such folder back."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _outside import run_outside
from transformers import LlamaModel

from hf_mlcl.modeling import MLCLEncoder, apply_lora
from hf_mlcl.modeling.lora import save_lora_adapter
from hf_mlcl.modeling.native import to_sentence_transformers

TEXTS = [
    "the patient was admitted with chest pain and shortness of breath",
    "graph neural network learning theory quantum physics",
    "joy anger",
]

_SENTENCE_TRANSFORMERS = """
import torch
from sentence_transformers import SentenceTransformer

for name, folder in SPEC["folders"].items():
    model = SentenceTransformer(folder, trust_remote_code=False, device="cpu")
    REPORT[name] = {"embeddings": model.encode(SPEC["texts"], convert_to_tensor=True).tolist(),
                    "max_seq_length": model.max_seq_length, "modules": [type(m).__name__ for m in model]}
"""


def _save_native(encoder, tokenizer, folder, embedding="pooled", max_seq_length=64) -> str:
    encoder.save_pretrained(folder)
    assert to_sentence_transformers(str(folder), max_seq_length, embedding, tokenizer=tokenizer)
    return str(folder)


def _close(got, want) -> None:
    got, want = torch.as_tensor(got, dtype=torch.float32), want.float()
    assert torch.nn.functional.cosine_similarity(got, want).min() >= 0.99999
    assert (got - want).abs().max() <= 1e-5


def _randomise(module) -> None:
    with torch.no_grad():  # heads away from their initialisation, so a lost weight shows
        for p in module.parameters():
            p.normal_(0, 0.3)


@pytest.fixture
def encoders(tiny_bert_config, tiny_llama_config):
    torch.manual_seed(0)
    made = {
        "bert_cls": MLCLEncoder.from_backbone(tiny_bert_config, pooling="cls", projection_dim=8),
        "bert_mean": MLCLEncoder.from_backbone(
            tiny_bert_config, pooling="mean", projection_dim=8, id2label=["a", "b"]
        ),
        "llama_last": MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", projection_dim=8),
    }
    for encoder in made.values():
        _randomise(encoder.projection_head)
        encoder.eval()
    return made


def test_encoders_load_in_sentence_transformers_without_hf_mlcl(
    tmp_path, encoders, bert_tokenizer, llama_tokenizer
):
    folders, want = {}, {}
    for name, encoder in encoders.items():
        tok = llama_tokenizer if name.startswith("llama") else bert_tokenizer
        folders[name] = _save_native(encoder, tok, tmp_path / name)
        want[name] = encoder.encode(TEXTS, tok, output="pooled")
    folders["bert_projected"] = _save_native(
        encoders["bert_mean"], bert_tokenizer, tmp_path / "p", "projected"
    )
    want["bert_projected"] = encoders["bert_mean"].encode(TEXTS, bert_tokenizer)
    report = run_outside(
        tmp_path / "child",
        _SENTENCE_TRANSFORMERS,
        {"folders": folders, "texts": TEXTS},
        consumers=("sentence_transformers",),
    )
    for name, got in report.items():
        _close(got["embeddings"], want[name])
        assert got["max_seq_length"] == 64  # truncated where it was trained
    assert report["bert_cls"]["modules"] == ["Transformer", "Pooling"]
    assert report["bert_projected"]["modules"] == ["Transformer", "Pooling", "Dense", "Dense"]
    config = json.loads(open(os.path.join(folders["bert_mean"], "config.json")).read())
    assert (
        config["model_type"] == "bert"
        and config["architectures"] == ["BertModel"]
        and "auto_map" not in config
    )
    assert not any(f.endswith(".py") for f in os.listdir(folders["bert_mean"]))


def test_hf_mlcl_reads_its_native_encoders_back(tmp_path, encoders, bert_tokenizer, llama_tokenizer):
    for name, encoder in encoders.items():
        tok = llama_tokenizer if name.startswith("llama") else bert_tokenizer
        folder = _save_native(encoder, tok, tmp_path / name)
        loaded = MLCLEncoder.from_pretrained(folder)
        assert (
            loaded.config.pooling == encoder.config.pooling
            and loaded.config.id2label == encoder.config.id2label
        )
        for key, value in encoder.state_dict().items():
            assert torch.equal(loaded.state_dict()[key], value), key
    with pytest.raises(ValueError, match="is an encoder"):
        from hf_mlcl.modeling import MLCLForMultiLabelClassification

        MLCLForMultiLabelClassification.from_pretrained(folder)


def test_encode_truncates_where_the_saved_folder_was_trained(tmp_path, encoders, bert_tokenizer):
    """A folder saved at max_seq_length 16: its tokenizer, hence MLCLEncoder.encode by default, cuts at 16 tokens,
    as sentence-transformers does (encode cut at 512 before)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    folder = _save_native(encoders["bert_mean"], bert_tokenizer, tmp_path / "enc", max_seq_length=16)
    texts = [" ".join(["word"] * 40), "short text"]
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.model_max_length == 16
    got = MLCLEncoder.from_pretrained(folder).encode(texts, tok, output="pooled")
    want = SentenceTransformer(folder, device="cpu").encode(texts, convert_to_tensor=True)
    assert (got - want).abs().max() <= 1e-5
    longer = MLCLEncoder.from_pretrained(folder).encode(texts, tok, output="pooled", max_length=64)
    assert (longer[0] - got[0]).abs().max() > 1e-3  # the long text was cut
    tok.model_max_length = int(1e30)  # a tokenizer that sets no limit: cut at 512, as before
    unlimited = MLCLEncoder.from_pretrained(folder).encode([" ".join(["word"] * 600)], tok, output="pooled")
    assert unlimited.shape[0] == 1


def test_the_sentence_embedding_of_a_written_encoder_folder_can_be_switched(
    tmp_path, encoders, bert_tokenizer
):
    """A folder already in its sentence-transformers form (what a run writes) gets the projected embedding, and
    back, without being converted again; an hf_mlcl-format folder or an unknown embedding is refused."""
    from sentence_transformers import SentenceTransformer

    from hf_mlcl.modeling.native import set_sentence_embedding

    encoder = encoders["bert_mean"]
    folder = _save_native(encoder, bert_tokenizer, tmp_path / "enc")
    texts = ["a short text", "another text to embed"]
    set_sentence_embedding(folder, "projected")
    projected = SentenceTransformer(folder, device="cpu").encode(texts, convert_to_tensor=True)
    _close(projected, encoder.encode(texts, bert_tokenizer, output="embeddings"))
    assert json.loads((tmp_path / "enc" / "mlcl_config.json").read_text())["embedding"] == "projected"
    assert MLCLEncoder.from_pretrained(folder).config.projection_dim == encoder.config.projection_dim
    set_sentence_embedding(folder, "pooled")
    pooled = SentenceTransformer(folder, device="cpu").encode(texts, convert_to_tensor=True)
    _close(pooled, encoder.encode(texts, bert_tokenizer, output="pooled"))
    with pytest.raises(ValueError, match="embedding must be one of"):
        set_sentence_embedding(folder, "cls")
    encoder.save_pretrained(tmp_path / "mlcl_format")
    with pytest.raises(ValueError, match="holds no sentence-transformers encoder hf_mlcl wrote"):
        set_sentence_embedding(str(tmp_path / "mlcl_format"), "projected")


def test_segmented_encoder_keeps_the_hf_mlcl_format(tmp_path, tiny_bert_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(
        tiny_bert_config, pooling="mean", projection_dim=8, segmented=True, chunk_size=8
    )
    encoder.save_pretrained(tmp_path / "seg")
    before = sorted(os.listdir(tmp_path / "seg"))
    assert to_sentence_transformers(str(tmp_path / "seg")) is False
    assert sorted(os.listdir(tmp_path / "seg")) == before and "modeling_mlcl.py" in before


def _bf16_lora_encoder(base: str) -> torch.nn.Module:
    """A LoRA encoder on a bf16 base whose every update B A s is below the resolution of the weight it adds to."""
    encoder = MLCLEncoder.from_backbone(base, pooling="last_token", projection_dim=8)
    peft_model = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=True)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_A" in name:
                p.normal_(0, 1.0)
            elif "lora_B" in name:
                p.fill_(1e-4)  # |B A s| ~ 1e-3 against weights ~ 2e-2, whose bf16 spacing is ~1e-4 to 2e-4
    return peft_model.eval()


def test_bf16_lora_encoder_reloads_unmerged_with_updates_below_bf16_resolution(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    torch.manual_seed(0)
    base = tmp_path / "base"
    LlamaModel(tiny_llama_config).to(torch.bfloat16).save_pretrained(base)
    llama_tokenizer.save_pretrained(base)
    model = _bf16_lora_encoder(str(base))
    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        trained = model(**inputs).pooled.float()
    folder = tmp_path / "encoder"
    save_lora_adapter(model, str(folder), str(base))
    assert to_sentence_transformers(str(folder), max_seq_length=32, tokenizer=llama_tokenizer)
    loaded = MLCLEncoder.from_pretrained(str(folder))
    assert loaded.backbone.dtype == torch.bfloat16
    trained_state = {k.removeprefix("base_model.model."): v for k, v in model.state_dict().items()}
    for key, value in loaded.backbone.state_dict().items():  # base bit for bit, the fp32 adapter as trained
        key = f"backbone.{key}"
        assert torch.equal(value, trained_state[key]) and value.dtype == trained_state[key].dtype, key
    layer = "backbone.layers.0.self_attn.q_proj"
    weight = model.get_submodule(f"base_model.model.{layer}").base_layer.weight
    with torch.no_grad():
        reloaded = loaded(**inputs).pooled.float()
        merged_model = model.merge_and_unload()  # what a merge into the bf16 weights keeps of the update
        merged = merged_model(**inputs).pooled.float()
    lost = (merged_model.get_submodule(layer).weight == weight).float().mean()
    cosine = torch.nn.functional.cosine_similarity(reloaded, trained)
    print(
        f"bf16 LoRA reload: min cosine {cosine.min():.6f}, max abs {(reloaded - trained).abs().max():.2e}; merged "
        f"into bf16: {lost:.0%} of a layer's updates rounded away, max abs {(merged - trained).abs().max():.2e}"
    )
    torch.testing.assert_close(reloaded, trained, rtol=0, atol=0)
    assert lost > 0.5  # the test's updates are below bf16 resolution: a merge would drop most of them


_PEFT_ADAPTER = """
import torch
from sentence_transformers import SentenceTransformer

model = SentenceTransformer(SPEC["folder"], trust_remote_code=False, device="cpu")
REPORT["embeddings"] = model.encode(SPEC["texts"], convert_to_tensor=True).float().tolist()
REPORT["adapter"] = any("lora_" in name for name, _ in model.named_parameters())
"""


def test_lora_encoder_loads_as_a_peft_adapter_in_sentence_transformers(
    tmp_path, tiny_llama_config, llama_tokenizer
):
    torch.manual_seed(0)
    base = tmp_path / "base"
    LlamaModel(tiny_llama_config).save_pretrained(base)
    llama_tokenizer.save_pretrained(base)
    encoder = MLCLEncoder.from_backbone(str(base), pooling="last_token", projection_dim=8)
    model = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=False)
    _randomise(model.base_model.model.projection_head)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    model.eval()
    folder = tmp_path / "encoder"
    save_lora_adapter(model, str(folder), str(base))
    assert to_sentence_transformers(str(folder), max_seq_length=32, tokenizer=llama_tokenizer)
    want = model.base_model.model.encode(TEXTS, llama_tokenizer, max_length=32, output="pooled")
    report = run_outside(
        tmp_path / "child",
        _PEFT_ADAPTER,
        {"folder": str(folder), "texts": TEXTS},
        consumers=("sentence_transformers", "peft"),
    )
    assert report["adapter"]
    _close(report["embeddings"], want)


_MINILM_CONSUMERS = """
import numpy as np
import onnxruntime
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer, pipeline

REPORT["st"] = SentenceTransformer(SPEC["encoder"], device="cpu").encode(SPEC["texts"]).tolist()
REPORT["st_linear"] = SentenceTransformer(SPEC["linear"], device="cpu").encode(SPEC["texts"]).tolist()
for name in ("encoder", "classifier", "linear"):
    session = onnxruntime.InferenceSession(SPEC[name] + "/onnx/model.onnx", providers=["CPUExecutionProvider"])
    batch = AutoTokenizer.from_pretrained(SPEC[name])(SPEC["texts"], padding=True, truncation=True, max_length=128,
                                                      return_tensors="np")
    REPORT["onnx_" + name] = session.run(None, {i.name: batch[i.name] for i in session.get_inputs()})[-1].tolist()
rows = pipeline("text-classification", model=SPEC["classifier"], top_k=None)(SPEC["texts"])
REPORT["pipeline"] = [{r["label"]: r["score"] for r in row} for row in rows]
"""


@pytest.mark.slow
def test_minilm_encoder_and_native_classifier_in_every_consumer(tmp_path, minilm_path):
    """The real all-MiniLM-L6-v2 as an hf_mlcl encoder (mean pooling), a native classifier and a linear-head
    classifier on mean-pooled states (the custom-CSV recipe's): sentence-transformers, pipeline and onnxruntime
    without hf_mlcl give hf_mlcl's outputs (fp32: cosine >= 0.99999, max abs <= 1e-5; ONNX within 1e-4)."""
    from transformers import AutoTokenizer

    from hf_mlcl.cli import main
    from hf_mlcl.modeling import MLCLForMultiLabelClassification, save_native

    tokenizer = AutoTokenizer.from_pretrained(minilm_path)
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(minilm_path, pooling="mean", projection_dim=32).eval()
    names = [f"label_{i}" for i in range(5)]
    clf = MLCLForMultiLabelClassification.from_encoder(
        MLCLEncoder.from_backbone(minilm_path), id2label=names, head="native"
    ).eval()
    linear = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=names).eval()
    with torch.no_grad():
        clf.classifier.weight.normal_(0, 0.5)
        linear.classifier.weight.normal_(0, 0.5)
    folders = {name: str(tmp_path / name) for name in ("encoder", "classifier", "linear")}
    assert save_native(encoder, folders["encoder"], tokenizer=tokenizer, max_seq_length=128)
    assert save_native(clf, folders["classifier"], tokenizer=tokenizer)
    assert save_native(linear, folders["linear"], tokenizer=tokenizer, max_seq_length=128)
    for folder in folders.values():
        assert main(["export", folder, "--to", "onnx"]) == 0
    texts = TEXTS + ["a much longer document about renal failure, cardiology and quantum field theory " * 4]
    batch = tokenizer(texts, padding=True, truncation=True, max_length=128, return_tensors="pt")
    with torch.no_grad():
        pooled = encoder(**batch).pooled
        logits = clf(**batch).logits
        linear_logits = linear(**batch).logits
    report = run_outside(
        tmp_path / "child",
        _MINILM_CONSUMERS,
        {**folders, "texts": texts},
        consumers=("sentence_transformers", "onnxruntime"),
    )
    _close(report["st"], pooled)
    assert (torch.tensor(report["onnx_encoder"]) - pooled).abs().max() <= 1e-4
    assert (torch.tensor(report["onnx_classifier"]) - logits).abs().max() <= 1e-4
    _close([[row[n] for n in names] for row in report["pipeline"]], torch.sigmoid(logits))
    _close(report["st_linear"], torch.sigmoid(linear_logits))
    assert (torch.tensor(report["onnx_linear"]) - linear_logits).abs().max() <= 1e-4


def _fake_hub_cache(cache, repo_id: str, folder) -> None:
    """``folder`` as the main revision of ``repo_id`` in a Hub cache (the layout huggingface_hub reads offline)."""
    import shutil

    repo = cache / ("models--" + repo_id.replace("/", "--"))
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    shutil.copytree(folder, repo / "snapshots" / commit)


def test_a_native_encoder_and_an_adapter_load_from_a_subfolder(
    tmp_path, encoders, tiny_llama_config, bert_tokenizer, llama_tokenizer
):
    """``subfolder`` is followed for a sentence-transformers folder and a LoRA adapter, in a local folder and in a
    Hub repository (read from the cache, offline); a Hub adapter takes the Hub keywords (cache_dir, offline)."""
    repo, base = tmp_path / "repo", tmp_path / "base"
    _save_native(encoders["bert_mean"], bert_tokenizer, repo / "encoder")
    LlamaModel(tiny_llama_config).save_pretrained(base)
    encoder = MLCLEncoder.from_backbone(str(base), pooling="last_token", projection_dim=8)
    lora = apply_lora(encoder, r=4, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=False)
    with torch.no_grad():
        for name, param in lora.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    save_lora_adapter(lora.eval(), str(repo / "adapter"), str(base))
    _fake_hub_cache(tmp_path / "cache", "someone/models", repo)
    _fake_hub_cache(tmp_path / "cache", "someone/adapter", repo / "adapter")
    want = {
        "encoder": (encoders["bert_mean"], bert_tokenizer),
        "adapter": (lora.base_model.model, llama_tokenizer),
    }
    hub = {"cache_dir": str(tmp_path / "cache"), "local_files_only": True}
    for sub, (model, tokenizer) in want.items():
        ref = model.encode(TEXTS, tokenizer, output="pooled")
        for source, kwargs in ((str(repo), {}), ("someone/models", hub)):
            got = MLCLEncoder.from_pretrained(source, subfolder=sub, **kwargs).encode(
                TEXTS, tokenizer, output="pooled"
            )
            assert (got - ref).abs().max() <= 1e-5, (sub, source)
    got = MLCLEncoder.from_pretrained("someone/adapter", **hub).encode(
        TEXTS, llama_tokenizer, output="pooled"
    )
    assert (got - want["adapter"][0].encode(TEXTS, llama_tokenizer, output="pooled")).abs().max() <= 1e-5


def test_an_in_place_conversion_with_a_length_writes_it_into_the_saved_tokenizer(
    tmp_path, tiny_bert_config, bert_tokenizer
):
    """to_sentence_transformers(folder, max_seq_length=16) without a tokenizer left the saved one at its own
    model_max_length: hf_mlcl's encode of the folder then cut long texts later than sentence-transformers."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoTokenizer

    torch.manual_seed(0)
    MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean").save_pretrained(tmp_path)
    bert_tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length != 16
    assert to_sentence_transformers(str(tmp_path), max_seq_length=16)
    assert AutoTokenizer.from_pretrained(tmp_path).model_max_length == 16
    text = [" ".join(TEXTS * 4)]
    ours = MLCLEncoder.from_pretrained(tmp_path).encode(
        text, AutoTokenizer.from_pretrained(tmp_path), output="pooled"
    )
    theirs = SentenceTransformer(str(tmp_path), device="cpu").encode(text, convert_to_tensor=True)
    assert (ours - theirs).abs().max() <= 1e-5
