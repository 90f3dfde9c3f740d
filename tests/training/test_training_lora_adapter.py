"""LoRA runs save an adapter folder (LoRA matrices + heads + config + tokenizer + remote code) that
reloads onto the base model named in adapter_config.json, with the same embeddings, at a fraction of the
base model's size; ``merge_lora: true`` keeps the merged output; ``hf-mlcl push`` uploads the folder."""

from __future__ import annotations

import json
import os

import pytest
import torch
from _training_helpers import probe_args
from safetensors.torch import load_file
from torch import nn
from transformers import LlamaModel

from hf_mlcl.hub.push import files_to_push
from hf_mlcl.modeling import DEFAULT_LORA_TARGETS, MLCLEncoder
from hf_mlcl.training import ContrastiveTrainingArguments, DataArguments, ModelArguments, train_contrastive

R = 4
TEXTS = ["heart failure kidney renal acute", "graph neural network", "joy anger sadness love fear surprise"]
# a LoRA classifier: a PEFT adapter over its base and a sentence-transformers folder whose output is each label's
# probability (tests/modeling/test_native_linear_classifiers.py)
ADAPTER_FILES = {
    "adapter_config.json",
    "adapter_model.safetensors",
    "mlcl_config.json",
    "modules.json",
    "1_Pooling",
    "2_Dense",
    "sentence_bert_config.json",
    "tokenizer_config.json",
}
# a LoRA encoder: a PEFT adapter over its base and a sentence-transformers folder (tests/modeling/test_native_*)
ENCODER_FILES = {
    "adapter_config.json",
    "adapter_model.safetensors",
    "mlcl_config.json",
    "modules.json",
    "1_Pooling",
    "2_Dense",
    "3_Dense",
    "sentence_bert_config.json",
    "tokenizer_config.json",
}


@pytest.fixture
def base_model(tmp_path, tiny_llama_config, llama_tokenizer) -> str:
    """A tiny Llama built from a config and saved locally: the "base model id" of the adapter."""
    torch.manual_seed(0)
    path = tmp_path / "base"
    LlamaModel(tiny_llama_config).save_pretrained(path)
    llama_tokenizer.save_pretrained(path)
    return str(path)


def _data_args() -> DataArguments:
    opts = {
        "num_labels": 6,
        "num_train": 32,
        "num_validation": 16,
        "num_test": 16,
        "min_words": 4,
        "max_words": 12,
    }
    return DataArguments(dataset="synthetic", dataset_options=json.dumps(opts), max_length=16)


def _train(base: str, out, train_kw: dict | None = None, **model_kw):
    model_args = ModelArguments(
        model_name_or_path=base,
        use_lora=True,
        lora_r=R,
        lora_alpha=8,
        lora_dropout=0.0,
        pooling="last_token",
        projection_dim=8,
        **model_kw,
    )
    args = ContrastiveTrainingArguments(
        output_dir=str(out),
        loss="sd",
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        knn_k=0,
        **(train_kw or {}),
    )
    return train_contrastive(model_args, _data_args(), args)


def _lora_finetune(base: str, out, max_steps: int, encoder_path: str | None = None):
    """The `use_lora` BCE fine-tune (the Llama bce.yaml recipe's stage 2) on ``base`` or the encoder at
    ``encoder_path``, ``max_steps`` steps into ``out``: its StageResult."""
    from hf_mlcl.training import train_probe

    model_args = ModelArguments(
        model_name_or_path=base, use_lora=True, lora_r=R, lora_alpha=8, lora_dropout=0.0, pooling="last_token"
    )
    args = probe_args(out, probe="finetune", loss="bce", max_steps=max_steps, learning_rate=5e-2)
    return train_probe(model_args, _data_args(), args, encoder_path=encoder_path)


def _embed(model, tokenizer) -> torch.Tensor:
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).embeddings


def _tensor_bytes(path) -> int:
    """The bytes of a safetensors file's tensors: its size less the 8-byte length and the JSON header."""
    with open(path, "rb") as fh:
        header = int.from_bytes(fh.read(8), "little")
    return os.path.getsize(path) - 8 - header


def test_lora_run_saves_an_adapter_that_reloads_to_the_same_embeddings(tmp_path, base_model, llama_tokenizer):
    out = tmp_path / "encoder"
    trainer = _train(base_model, out).trainer
    assert ENCODER_FILES <= set(os.listdir(out)), sorted(os.listdir(out))
    assert not {"config.json", "model.safetensors", "modeling_mlcl.py"} & set(
        os.listdir(out)
    )  # no base override
    adapter_config = json.loads((out / "adapter_config.json").read_text())
    assert adapter_config["base_model_name_or_path"] == base_model and adapter_config["r"] == R
    adapter = load_file(out / "adapter_model.safetensors")
    assert all("lora_" in k for k in adapter) and any(
        t.abs().sum() > 0 for k, t in adapter.items() if "lora_B" in k
    )

    trained = _embed(trainer.accelerator.unwrap_model(trainer.model).eval(), llama_tokenizer)
    loaded = MLCLEncoder.from_pretrained(out)
    torch.testing.assert_close(_embed(loaded, llama_tokenizer), trained, rtol=1e-5, atol=1e-5)
    plain = MLCLEncoder.from_backbone(base_model, pooling="last_token", projection_dim=8)
    plain.projection_head.load_state_dict(loaded.projection_head.state_dict())
    assert not torch.allclose(
        _embed(plain.eval(), llama_tokenizer), trained, atol=1e-4
    )  # the adapter matters

    # size: LoRA matrices r * (in + out) per adapted linear layer, plus the projection head (the Dense modules),
    # against the base's weights; compared on the tensor bytes of the safetensors files (their JSON headers, a
    # few hundred bytes per tensor, dominate files this tiny), everything float32
    base = LlamaModel.from_pretrained(base_model)
    lora = sum(
        R * (m.in_features + m.out_features)
        for n, m in base.named_modules()
        if isinstance(m, nn.Linear) and n.rsplit(".", 1)[-1] in DEFAULT_LORA_TARGETS
    )
    heads = sum(p.numel() for p in loaded.projection_head.parameters())
    base_params = sum(p.numel() for p in base.parameters())
    saved = [
        out / "adapter_model.safetensors",
        out / "2_Dense" / "model.safetensors",
        out / "3_Dense" / "model.safetensors",
    ]
    base_file = os.path.join(base_model, "model.safetensors")
    assert sum(_tensor_bytes(p) for p in saved) == 4 * (lora + heads)
    assert _tensor_bytes(base_file) == 4 * base_params
    measured = sum(_tensor_bytes(p) for p in saved) / _tensor_bytes(base_file)
    files = sum(os.path.getsize(p) for p in saved) / os.path.getsize(base_file)
    print(
        f"adapter / base: tensor bytes {measured:.4f} (expected {(lora + heads) / base_params:.4f}), files {files:.4f}"
    )
    assert measured == pytest.approx((lora + heads) / base_params) and files < 0.25

    pushed = set(files_to_push(str(out)))  # hf-mlcl push uploads the adapter folder as is
    assert ENCODER_FILES <= {f.split("/")[0] for f in pushed} and "2_Dense/model.safetensors" in pushed


def test_a_compiled_run_saves_an_adapter_that_reloads_to_its_embeddings(
    tmp_path, base_model, llama_tokenizer
):
    """``torch_compile`` wraps the model in ``torch.compile``'s module (``_orig_mod.`` keys): the adapter and
    heads are still found, saved under their own names and reload to the trained embeddings. The eager backend
    traces with dynamo without generating kernels (the wrapper is the same)."""
    out = tmp_path / "compiled"
    trainer = _train(base_model, out, {"torch_compile": True, "torch_compile_backend": "eager"}).trainer
    assert type(trainer.model_wrapped).__name__ == "OptimizedModule"
    assert ENCODER_FILES <= set(os.listdir(out))
    saved = load_file(out / "adapter_model.safetensors")
    assert saved and all(k.startswith("base_model.model.layers.") and "lora_" in k for k in saved)
    loaded = MLCLEncoder.from_pretrained(out)
    trained = trainer.accelerator.unwrap_model(trainer.model).eval()
    torch.testing.assert_close(
        _embed(loaded, llama_tokenizer), _embed(trained, llama_tokenizer), atol=1e-5, rtol=1e-5
    )


def test_merge_lora_keeps_the_merged_output(tmp_path, base_model, llama_tokenizer):
    out = tmp_path / "merged"
    _train(base_model, out, merge_lora=True)
    assert "adapter_config.json" not in os.listdir(out)
    weights = load_file(out / "model.safetensors")
    assert any(k.startswith("layers.") for k in weights) and not any(
        "lora_" in k for k in weights
    )  # LlamaModel's own
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaModel"]
    assert _embed(MLCLEncoder.from_pretrained(out), llama_tokenizer).shape == (len(TEXTS), 8)


def test_linear_probe_on_an_adapter_encoder_saves_an_adapter_classifier(
    tmp_path, base_model, llama_tokenizer
):

    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.training import ProbingTrainingArguments, train_probe

    encoder = tmp_path / "encoder"
    _train(base_model, encoder)
    clf = tmp_path / "classifier"
    args = ProbingTrainingArguments(
        output_dir=str(clf),
        probe="linear",
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=5e-2,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    result = train_probe(ModelArguments(), _data_args(), args, encoder_path=str(encoder))
    trainer = result.trainer
    assert ADAPTER_FILES <= set(os.listdir(clf))
    assert (clf / "adapter_model.safetensors").read_bytes() == (
        encoder / "adapter_model.safetensors"
    ).read_bytes()
    assert not {"config.json", "model.safetensors", "modeling_mlcl.py"} & set(os.listdir(clf))

    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        trained = trainer.accelerator.unwrap_model(trainer.model).eval()(**inputs).logits
        loaded = MLCLForMultiLabelClassification.from_pretrained(clf)(**inputs).logits
    torch.testing.assert_close(loaded, trained, rtol=1e-5, atol=1e-5)
    from sentence_transformers import SentenceTransformer

    got = SentenceTransformer(str(clf), device="cpu").encode(TEXTS, convert_to_tensor=True)
    short = llama_tokenizer(TEXTS, padding=True, truncation=True, max_length=16, return_tensors="pt")
    with torch.no_grad():  # the folder truncates at the length it was trained at
        logits = trainer.accelerator.unwrap_model(trainer.model)(
            input_ids=short["input_ids"], attention_mask=short["attention_mask"]
        ).logits
    want = torch.sigmoid(logits)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _checkpointed_layers(model) -> list[int]:
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [
        int(m.gradient_checkpointing) for m in model.modules() if isinstance(m, GradientCheckpointingLayer)
    ]


def test_activation_checkpointing_with_lora_and_momentum_encoder_keeps_the_losses(tmp_path, base_model):
    """`activation_checkpointing: true` (the Llama recipe's) reaches the LoRA backbone, on every layer or, with
    `activation_checkpointing_kwargs: {every_n_layers: 2}` (the lever that trades memory for speed), on every
    second one; with the momentum encoder and queue (MoCo, mulsupcon's `keys` contrast set) the logged losses
    equal a run without it."""
    losses = {}
    for flag, every in ((False, 1), (True, 1), (True, 2)):
        model_args = ModelArguments(
            model_name_or_path=base_model,
            use_lora=True,
            lora_r=R,
            lora_alpha=8,
            lora_dropout=0.0,
            pooling="last_token",
            projection_dim=8,
        )
        args = ContrastiveTrainingArguments(
            output_dir=str(tmp_path / f"gc{int(flag)}-{every}"),
            loss="mulsupcon",
            queue_size=16,
            momentum=0.9,
            per_device_train_batch_size=8,
            max_steps=3,
            logging_steps=1,
            learning_rate=1e-2,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            save_strategy="no",
            knn_k=0,
            activation_checkpointing=flag,
            activation_checkpointing_kwargs={"every_n_layers": every} if every > 1 else None,
        )
        result = train_contrastive(model_args, _data_args(), args)
        trainer = result.trainer
        layers = _checkpointed_layers(trainer.accelerator.unwrap_model(trainer.model))
        assert layers == [int(flag and i % every == 0) for i in range(len(layers))] and len(layers) >= 2
        assert len(trainer.queue) == 16  # the momentum keys were enqueued
        losses[flag, every] = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses[True, 1]) == 3
    for setting in ((True, 1), (True, 2)):
        torch.testing.assert_close(
            torch.tensor(losses[setting]), torch.tensor(losses[False, 1]), rtol=1e-4, atol=1e-6
        )


def test_lora_bce_finetune_trains_adapters_and_head_only_and_saves_an_adapter_classifier(
    tmp_path, base_model, llama_tokenizer
):
    """`use_lora` with `probe: finetune` (the Llama bce.yaml recipe): LoRA adapters + the classifier head train,
    the base weights stay as loaded, and the adapter folder reloads to the same logits."""

    from hf_mlcl.modeling import MLCLForMultiLabelClassification

    out = tmp_path / "bce"
    result = _lora_finetune(base_model, out, max_steps=3)
    trainer, metrics = result.trainer, result.metrics
    model = trainer.accelerator.unwrap_model(trainer.model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or ".classifier.modules_to_save." in n for n in trainable), sorted(
        trainable
    )
    assert sum("lora_A" in n for n in trainable) == 7 * 2 and any("classifier" in n for n in trainable)
    # the frozen base is the loaded model, unchanged; the adapters moved
    base = LlamaModel.from_pretrained(base_model).state_dict()
    frozen = {
        n.removeprefix("base_model.model.backbone.").replace(".base_layer.", "."): p
        for n, p in model.named_parameters()
        if n.startswith("base_model.model.backbone.") and n not in trainable
    }
    assert frozen.keys() == base.keys()
    assert all(torch.equal(frozen[k], base[k]) for k in base)
    assert any(p.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)

    assert ADAPTER_FILES <= set(os.listdir(out)), sorted(os.listdir(out))
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == base_model
    assert sorted(load_file(out / "2_Dense" / "model.safetensors")) == ["linear.bias", "linear.weight"]
    config = json.loads((out / "mlcl_config.json").read_text())
    assert config["decision_threshold"] == metrics["threshold"] and len(config["id2label"]) == 6

    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        trained = model.eval()(**inputs).logits
        loaded = MLCLForMultiLabelClassification.from_pretrained(out)
        torch.testing.assert_close(loaded(**inputs).logits, trained, rtol=1e-5, atol=1e-5)


def test_lora_finetune_on_an_adapter_encoder_starts_from_the_encoders_outputs(
    tmp_path, base_model, llama_tokenizer
):
    """The encoder's adapter (loaded unmerged) is merged in before the fine-tune's new adapter: the classifier's
    pooled representation is the encoder's, not the base model's."""
    from hf_mlcl.modeling.builders import probe_model

    encoder_dir = tmp_path / "encoder"
    _train(base_model, encoder_dir)
    encoder = MLCLEncoder.from_pretrained(encoder_dir)
    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        want = encoder(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).pooled
        base = MLCLEncoder.from_backbone(base_model, pooling="last_token")(**batch).pooled
    model_args = ModelArguments(
        model_name_or_path=base_model, use_lora=True, lora_r=R, lora_alpha=8, lora_dropout=0.0
    )
    model = probe_model(encoder, model_args, ["a", "b"], "finetune").eval()
    inner = model.base_model.model
    assert not any(
        "lora_" in n for n, _ in inner.backbone.named_parameters() if ".default." in n and "base_layer" in n
    )
    with torch.no_grad():
        states, mask, segment = inner.encode_tokens(batch["input_ids"], batch["attention_mask"])
        got = inner.pool(states, mask, segment)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(want, base, atol=1e-4)


_REMOTE_CODE_WITHOUT_PEFT = """
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

model = AutoModelForSequenceClassification.from_pretrained(SPEC["folder"], trust_remote_code=True).eval()
batch = AutoTokenizer.from_pretrained(SPEC["folder"])(SPEC["texts"], padding=True, return_tensors="pt")
with torch.no_grad():
    REPORT["logits"] = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.tolist()
"""


def test_adapter_classifier_reloads_unmerged_in_bf16_and_merged_without_peft(
    tmp_path, base_model, llama_tokenizer
):
    """An adapter classifier (hf_mlcl's format) on a bf16 base reloads with its adapter unmerged (the trained
    logits); where peft is absent its remote code merges it (float32 base: the same logits)."""
    from _outside import run_outside

    from hf_mlcl.modeling import MLCLForMultiLabelClassification, apply_lora
    from hf_mlcl.modeling.lora import save_lora_adapter

    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    for bf16 in (True, False):
        base = tmp_path / f"base{int(bf16)}"
        backbone = LlamaModel.from_pretrained(base_model)
        (backbone.to(torch.bfloat16) if bf16 else backbone).save_pretrained(base)
        encoder = MLCLEncoder.from_backbone(str(base), pooling="last_token")
        clf = MLCLForMultiLabelClassification.from_encoder(
            encoder, id2label=["a", "b", "c"], freeze_encoder=False
        )
        model = apply_lora(clf, r=R, alpha=8, dropout=0.0, gradient_checkpointing=False, bf16=bf16)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.fill_(1e-4)
        model.eval()
        with torch.no_grad():
            trained = model(**inputs).logits.float()
        folder = tmp_path / f"clf{int(bf16)}"
        save_lora_adapter(model, str(folder), str(base))
        llama_tokenizer.save_pretrained(folder)
        loaded = MLCLForMultiLabelClassification.from_pretrained(str(folder))
        with torch.no_grad():
            reloaded = loaded(**inputs).logits.float()
        assert torch.nn.functional.cosine_similarity(reloaded, trained).min() >= 0.9999
        trained_state = {k.removeprefix("base_model.model."): v for k, v in model.state_dict().items()}
        lora = {k: v for k, v in loaded.state_dict().items() if "lora_" in k}
        assert lora and all(
            torch.equal(v, trained_state[k]) and v.dtype == torch.float32 for k, v in lora.items()
        )
        for key, value in loaded.backbone.state_dict().items():  # the base weights untouched (no merge)
            if "lora_" not in key:
                assert torch.equal(value, trained_state[f"backbone.{key}"]), key
    torch.testing.assert_close(reloaded, trained, rtol=1e-5, atol=1e-5)  # float32: exact to rounding
    report = run_outside(
        tmp_path / "child", _REMOTE_CODE_WITHOUT_PEFT, {"folder": str(folder), "texts": TEXTS}
    )
    torch.testing.assert_close(torch.tensor(report["logits"]), trained, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dropout, kind", [(0.0, nn.Identity), (0.1, nn.Dropout)])
def test_lora_dropout_0_leaves_peft_no_dropout_copy_of_the_input(tiny_llama_config, dropout, kind):
    """The fit cells' lever `lora_dropout: 0`: peft then puts an identity where its dropout would copy each
    adapted layer's input, so the adapter branch reads the layer's input as it is."""
    from hf_mlcl.modeling import apply_lora

    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", projection_dim=8)
    model = apply_lora(encoder, r=R, alpha=8, dropout=dropout, gradient_checkpointing=False)
    found = [m for name, m in model.named_modules() if name.endswith("lora_dropout.default")]
    assert found and all(type(m) is kind for m in found)


def test_an_adapter_trained_on_a_relative_base_path_loads_from_any_directory(
    tmp_path, base_model, llama_tokenizer, monkeypatch
):
    from hf_mlcl.modeling.builders import model_files_required

    monkeypatch.chdir(tmp_path)
    trainer = _train("base", "encoder").trainer  # the recipe names its local base relative to where it runs
    out = tmp_path / "encoder"
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == base_model
    trained = _embed(trainer.accelerator.unwrap_model(trainer.model).eval(), llama_tokenizer)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    torch.testing.assert_close(_embed(MLCLEncoder.from_pretrained(out), llama_tokenizer), trained)

    # a base that is gone: the one-line error names it, not only the Hub's connection message
    config = json.loads((out / "adapter_config.json").read_text())
    (out / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "gone/base"}))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(
        FileNotFoundError, match=r"adapter over the base model 'gone/base' \(adapter_config.json\)"
    ):
        with model_files_required(str(out)):
            MLCLEncoder.from_pretrained(out)


def test_a_lora_finetune_on_an_adapter_encoder_saves_the_model_it_trained(
    tmp_path, base_model, llama_tokenizer
):
    """The fine-tune's backbone is the base with stage 1's adapter merged in, then its own adapter: the saved
    classifier (merged) must hold both updates, not the fine-tune's adapter over the bare base."""
    from hf_mlcl.modeling import MLCLForMultiLabelClassification

    encoder_dir = tmp_path / "encoder"
    _train(base_model, encoder_dir)
    trainer = _lora_finetune(
        base_model, tmp_path / "classifier", max_steps=2, encoder_path=str(encoder_dir)
    ).trainer
    batch = llama_tokenizer(TEXTS, padding=True, return_tensors="pt")
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    with torch.no_grad():
        trained = trainer.accelerator.unwrap_model(trainer.model).eval()(**inputs).logits
        saved = MLCLForMultiLabelClassification.from_pretrained(str(tmp_path / "classifier"))(**inputs).logits
    torch.testing.assert_close(saved, trained, rtol=1e-5, atol=1e-5)
