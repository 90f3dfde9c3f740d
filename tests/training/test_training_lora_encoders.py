"""``use_lora`` on encoder backbones (BERT / MiniLM, RoBERTa, ModernBERT) with no ``lora_target_modules``:
the architecture's default targets, stage 1 and the fine-tune saved as adapter folders (as for Llama) that
reload onto the locally saved base to the trained outputs, the base weights untouched."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from hf_mlcl.modeling import LORA_TARGETS_BY_MODEL_TYPE, MLCLEncoder, MLCLForMultiLabelClassification
from hf_mlcl.training import (
    ContrastiveTrainingArguments,
    DataArguments,
    ModelArguments,
    ProbingTrainingArguments,
    train_contrastive,
    train_probe,
)

TEXTS = ["heart failure kidney renal acute", "graph neural network", "joy anger sadness love fear surprise"]
SIZES = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def _config(kind: str, tok):
    from transformers import BertConfig, ModernBertConfig, RobertaConfig

    ids = dict(pad_token_id=tok.pad_token_id)
    if kind == "bert":  # also the architecture of MiniLM (all-MiniLM-L6-v2 is a 6-layer BertModel)
        return BertConfig(vocab_size=len(tok), max_position_embeddings=64, **ids, **SIZES)
    if kind == "roberta":
        return RobertaConfig(vocab_size=len(tok), max_position_embeddings=72, **ids, **SIZES)
    cls, sep = tok.cls_token_id, tok.sep_token_id
    return ModernBertConfig(
        vocab_size=len(tok),
        max_position_embeddings=64,
        global_attn_every_n_layers=1,
        local_attention=16,
        bos_token_id=cls,
        eos_token_id=sep,
        cls_token_id=cls,
        sep_token_id=sep,
        **ids,
        **SIZES,
    )


# RoBERTa's layers carry BERT's names (its default targets are checked in tests/modeling): end to end it is slow
@pytest.fixture(params=["bert", pytest.param("roberta", marks=pytest.mark.slow), "modernbert"])
def base(request, tmp_path, bert_tokenizer):
    """(kind, folder): a tiny backbone built from a config and saved locally, the adapters' base model."""
    torch.manual_seed(0)
    path = tmp_path / f"base-{request.param}"
    AutoModel.from_config(_config(request.param, bert_tokenizer)).save_pretrained(path)
    bert_tokenizer.save_pretrained(path)
    return request.param, str(path)


def _data_args() -> DataArguments:
    opts = {
        "num_labels": 5,
        "num_train": 24,
        "num_validation": 8,
        "num_test": 8,
        "min_words": 4,
        "max_words": 10,
    }
    return DataArguments(dataset="synthetic", dataset_options=json.dumps(opts), max_length=16)


def _inputs(tok):
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def test_stage_one_and_finetune_save_adapters_that_reload(tmp_path, base, bert_tokenizer):
    kind, path = base
    model_args = ModelArguments(
        model_name_or_path=path,
        use_lora=True,
        lora_r=4,
        lora_alpha=8,
        lora_dropout=0.0,
        pooling="mean",
        projection_dim=8,
    )
    enc_dir = tmp_path / "encoder"
    args = ContrastiveTrainingArguments(
        output_dir=str(enc_dir),
        loss="sd",
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        knn_k=0,
    )
    trainer = train_contrastive(model_args, _data_args(), args).trainer
    config = json.loads((enc_dir / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == path
    assert sorted(config["target_modules"]) == sorted(LORA_TARGETS_BY_MODEL_TYPE[kind])
    adapter = load_file(enc_dir / "adapter_model.safetensors")
    layers = SIZES["num_hidden_layers"]
    per_layer = {"bert": 6, "roberta": 6, "modernbert": 4}[
        kind
    ]  # q, k, v, 3 dense / Wqkv, attn.Wo, Wi, mlp.Wo
    assert sum(k.endswith("lora_A.weight") for k in adapter) == per_layer * layers
    assert not any("pooler" in k or "projection_head" in k for k in adapter)
    inputs = _inputs(bert_tokenizer)
    with torch.no_grad():
        trained = trainer.accelerator.unwrap_model(trainer.model).eval()(**inputs).embeddings
        loaded = MLCLEncoder.from_pretrained(enc_dir)(**inputs).embeddings
    torch.testing.assert_close(loaded, trained, rtol=1e-5, atol=1e-5)

    clf_dir = tmp_path / "classifier"
    pargs = ProbingTrainingArguments(
        output_dir=str(clf_dir),
        probe="finetune",
        loss="bce",
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=5e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        seed=0,
    )
    ptrainer = train_probe(model_args, _data_args(), pargs).trainer
    model = ptrainer.accelerator.unwrap_model(ptrainer.model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert all("lora_" in n or ".classifier.modules_to_save." in n for n in trainable), sorted(trainable)
    base_state = AutoModel.from_pretrained(path).state_dict()
    frozen = {
        n.removeprefix("base_model.model.backbone.").replace(".base_layer.", "."): p
        for n, p in model.named_parameters()
        if n.startswith("base_model.model.backbone.") and n not in trainable
    }
    assert frozen.keys() <= base_state.keys() and all(torch.equal(frozen[k], base_state[k]) for k in frozen)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= set(os.listdir(clf_dir))
    assert sorted(load_file(clf_dir / "2_Dense" / "model.safetensors")) == ["linear.bias", "linear.weight"]
    with torch.no_grad():
        want = model.eval()(**inputs).logits
        got = MLCLForMultiLabelClassification.from_pretrained(clf_dir)(**inputs).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
