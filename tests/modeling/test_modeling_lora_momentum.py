"""LoRA wrapping (only adapters + heads train; adapter + heads round-trip), pad-token helper,
momentum encoder EMA (trainable parameters only, frozen base shared) and the embedding queue."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from hf_mlcl.data.tokenizer import LLAMA3_PAD_TOKEN, ensure_pad_token
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora
from hf_mlcl.training.memory import EmbeddingQueue
from hf_mlcl.training.momentum import MomentumEncoder

TEXTS = ["heart failure kidney renal acute", "graph neural network", "joy anger sadness love fear surprise"]


def _batch(tokenizer, texts=TEXTS):
    enc = tokenizer(list(texts), padding=True, return_tensors="pt")
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def _is_adapter_or_head(name: str) -> bool:
    return "lora_" in name or ".modules_to_save." in name


# --------------------------------------------------------------------------------------------------
# LoRA
# --------------------------------------------------------------------------------------------------


def test_lora_only_adapters_and_heads_get_gradients(tiny_llama_config, llama_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", projection_dim=16)
    model = apply_lora(encoder, bf16=False)
    cfg = model.peft_config["default"]
    assert (cfg.r, cfg.lora_alpha, cfg.lora_dropout) == (16, 32, 0.1)
    assert set(cfg.target_modules) == {
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    }
    assert list(cfg.modules_to_save) == ["projection_head"]
    layers = [m for m in encoder.backbone.modules() if getattr(m, "gradient_checkpointing", False)]
    assert layers and all(m._gradient_checkpointing_func.keywords["use_reentrant"] is False for m in layers)
    model.train()
    out = model(**_batch(llama_tokenizer))
    assert out.embeddings.shape == (3, 16)
    out.embeddings.pow(2).sum().backward()
    with_grad = {n for n, p in model.named_parameters() if p.grad is not None}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert with_grad == trainable and with_grad
    assert all(_is_adapter_or_head(n) for n in with_grad)
    assert any("projection_head" in n for n in with_grad) and any("lora_B" in n for n in with_grad)
    # every projection in every layer carries an adapter
    assert sum("lora_A" in n for n in with_grad) == 7 * tiny_llama_config.num_hidden_layers


def test_lora_classifier_head_is_saved_module(tiny_llama_config, llama_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token")
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=3, freeze_encoder=False)
    model = apply_lora(clf, bf16=False, gradient_checkpointing=False)
    assert list(model.peft_config["default"].modules_to_save) == ["classifier"]
    out = model(**_batch(llama_tokenizer), labels=torch.ones(3, 3))
    out.loss.backward()
    assert all(_is_adapter_or_head(n) for n, p in model.named_parameters() if p.grad is not None)


def _lora_layers(model) -> list[str]:
    return sorted(
        n.removesuffix(".lora_A.default") for n, _ in model.named_modules() if n.endswith(".lora_A.default")
    )


@pytest.mark.parametrize("kind", ["bert", "roberta", "modernbert", "distilbert", "mpnet", "deberta-v2"])
def test_lora_default_targets_are_the_architectures_projections(kind):
    """Without target_modules every attention and feed-forward linear layer of the backbone gets an adapter:
    never the pooler nor our projection head (which trains in full, modules_to_save)."""
    from transformers import AutoConfig

    sizes = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)
    extra = {
        "distilbert": dict(dim=32, n_layers=2, n_heads=4, hidden_dim=64),
        "modernbert": {**sizes, **special},
    }
    cfg = AutoConfig.for_model(kind, vocab_size=64, **extra.get(kind, sizes))
    encoder = MLCLEncoder.from_backbone(cfg, projection_dim=8)
    projections = sorted(
        n
        for n, m in encoder.named_modules()
        if isinstance(m, nn.Linear) and n.startswith("backbone.") and "pooler" not in n
    )
    wrapped = apply_lora(encoder, bf16=False, gradient_checkpointing=False)
    assert [n.removeprefix("base_model.model.") for n in _lora_layers(wrapped)] == projections
    assert len(projections) >= 4 * 2  # at least q/k/v-or-fused, out, feed-forward per layer


def test_minilm_has_default_targets(minilm_path):
    """all-MiniLM-L6-v2 (installed offline by the dev extra) is a BertModel: use_lora needs no targets for it."""
    from transformers import AutoConfig

    from hf_mlcl.modeling import LORA_TARGETS_BY_MODEL_TYPE

    assert AutoConfig.from_pretrained(minilm_path).model_type in LORA_TARGETS_BY_MODEL_TYPE


def test_lora_unknown_architecture_or_targets_name_the_fix(tiny_bert_config):
    from hf_mlcl.modeling import default_lora_targets

    encoder = MLCLEncoder.from_backbone(tiny_bert_config)
    with pytest.raises(ValueError, match="none of the LoRA target modules"):
        apply_lora(encoder, target_modules=["q_proj"], bf16=False)
    with pytest.raises(
        ValueError, match=r"\['valeu'\] match no module of this backbone"
    ):  # beside a right one
        apply_lora(encoder, target_modules=["query", "valeu"], bf16=False)
    wrapped = apply_lora(encoder, target_modules=["query", "value"], bf16=False, gradient_checkpointing=False)
    assert len(_lora_layers(wrapped)) == 2 * tiny_bert_config.num_hidden_layers

    class Odd(nn.Module):
        config = type("C", (), {"model_type": "odd"})()

        def __init__(self):
            super().__init__()
            self.mix = nn.Linear(4, 4)

    with pytest.raises(ValueError, match=r"no default LoRA target modules for model type 'odd'.*\['mix'\]"):
        default_lora_targets(Odd())


def test_lora_adapter_and_heads_roundtrip(tmp_path, tiny_llama_config, llama_tokenizer):
    from peft import PeftModel

    base = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", projection_dim=16)
    base.save_pretrained(tmp_path / "base")
    llama_tokenizer.save_pretrained(tmp_path / "base")
    model = apply_lora(base, bf16=False)
    model.train()
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    batch = _batch(llama_tokenizer)
    for _ in range(2):  # make lora_B and the head differ from their initial values
        opt.zero_grad()
        model(**batch).embeddings.pow(2).mean().backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        expected = model(**batch).embeddings
    model.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(
        MLCLEncoder.from_pretrained(tmp_path / "base"), tmp_path / "adapter"
    ).eval()
    with torch.no_grad():
        got = reloaded(**batch).embeddings
        plain = MLCLEncoder.from_pretrained(tmp_path / "base").eval()(**batch).embeddings
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
    assert not torch.allclose(plain, expected, atol=1e-4)  # the adapter and head really changed the model


def test_ensure_pad_token(llama_tokenizer, tiny_llama_config):
    tok = copy.deepcopy(llama_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": [LLAMA3_PAD_TOKEN]})
    tok.pad_token = None
    assert tok.pad_token is None
    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token")
    pad = ensure_pad_token(tok, encoder)
    assert tok.pad_token == LLAMA3_PAD_TOKEN and pad == tok.convert_tokens_to_ids(LLAMA3_PAD_TOKEN)
    assert (
        encoder.backbone.config.pad_token_id == pad and encoder.config.backbone_config["pad_token_id"] == pad
    )
    tok2 = copy.deepcopy(llama_tokenizer)
    tok2.pad_token = None
    cfg = copy.deepcopy(tiny_llama_config)
    assert ensure_pad_token(tok2, cfg) == tok2.eos_token_id == cfg.pad_token_id
    # an existing pad token is kept
    assert ensure_pad_token(llama_tokenizer) == llama_tokenizer.convert_tokens_to_ids("<pad>")


# --------------------------------------------------------------------------------------------------
# momentum encoder
# --------------------------------------------------------------------------------------------------


def test_momentum_ema_arithmetic_and_sharing():
    online = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 3))
    online[0].requires_grad_(False)  # frozen part: must be shared, not copied
    mom = MomentumEncoder(online, momentum=0.9)
    assert mom.trainable_names == ["2.weight", "2.bias"]
    assert mom.module[0].weight is online[0].weight
    assert mom.module[0].weight.data_ptr() == online[0].weight.data_ptr()
    assert mom.module[2].weight.data_ptr() != online[2].weight.data_ptr()
    assert not any(p.requires_grad for p in mom.module.parameters() if p is not online[0].weight)
    key0 = mom.module[2].weight.detach().clone()
    with torch.no_grad():
        online[2].weight.add_(1.0)
    new = online[2].weight.detach().clone()
    mom.update(online)
    torch.testing.assert_close(mom.module[2].weight, 0.9 * key0 + 0.1 * new)
    mom.update(online)
    torch.testing.assert_close(mom.module[2].weight, 0.81 * key0 + 0.19 * new)
    x = torch.randn(2, 4, requires_grad=True)
    y = mom(x)
    assert isinstance(y, torch.Tensor) and not y.requires_grad
    state = mom.state_dict()
    assert set(state["params"]) == {"2.weight", "2.bias"}
    other = MomentumEncoder(online, momentum=0.5)
    other.load_state_dict(state)
    assert other.momentum == 0.9
    torch.testing.assert_close(other.module[2].weight, mom.module[2].weight)
    with pytest.raises(ValueError, match="momentum"):
        MomentumEncoder(online, momentum=1.0)


def test_momentum_bf16_uses_fp32_master():
    online = nn.Linear(3, 3, bias=False).to(torch.bfloat16)
    with torch.no_grad():
        online.weight.zero_()
    mom = MomentumEncoder(online, momentum=0.999)
    with torch.no_grad():
        online.weight.fill_(1.0)
    for _ in range(100):
        mom.update(online)
    expected = 1 - 0.999**100  # ~0.0952; a bf16-only EMA would stay at 0 (0.001 < bf16 resolution near 0)
    assert abs(float(mom.module.weight[0, 0]) - expected) < 1e-3
    assert mom.module.weight.dtype == torch.bfloat16


def test_momentum_with_lora_shares_frozen_base(tiny_llama_config, llama_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", projection_dim=16)
    model = apply_lora(encoder, bf16=False)
    mom = MomentumEncoder(model)
    online = dict(model.named_parameters())
    key = dict(mom.module.named_parameters())
    frozen = [n for n, p in online.items() if not p.requires_grad]
    trainable = [n for n, p in online.items() if p.requires_grad]
    assert frozen and trainable and set(mom.trainable_names) == set(trainable)
    assert all(key[n] is online[n] and key[n].data_ptr() == online[n].data_ptr() for n in frozen)
    assert all(key[n].data_ptr() != online[n].data_ptr() for n in trainable)
    # extra memory = trainable parameters only
    online_ptrs = {p.data_ptr() for p in online.values()}
    extra = sum(p.numel() for p in key.values() if p.data_ptr() not in online_ptrs)
    assert extra == sum(online[n].numel() for n in trainable)
    assert extra < 0.5 * sum(p.numel() for p in online.values())
    model.train()
    out = mom(**_batch(llama_tokenizer))
    assert type(out).__name__ == "MLCLEncoderOutput" and not out.embeddings.requires_grad
    with torch.no_grad():
        for n in trainable:
            online[n].add_(0.5)
    before = {n: key[n].detach().clone() for n in trainable}
    mom.update(model)
    for n in trainable:
        torch.testing.assert_close(key[n], 0.999 * before[n] + 0.001 * online[n].detach())


# --------------------------------------------------------------------------------------------------
# queue
# --------------------------------------------------------------------------------------------------


def _labels(rows, num_labels):
    out = torch.zeros(len(rows), num_labels)
    for i, row in enumerate(rows):
        out[i, row] = 1
    return out


@pytest.mark.parametrize("label_format", ["bool", "sparse"])
def test_queue_ring_buffer_wraps(label_format):
    q = EmbeddingQueue(size=5, dim=2, num_labels=6, label_format=label_format)
    assert len(q) == 0 and q.embeddings.shape == (0, 2)
    e1 = torch.arange(6, dtype=torch.float32).view(3, 2)
    q.enqueue(e1, _labels([[0], [1, 2], []], 6))
    assert len(q) == 3 and q.ptr == 3
    e2 = 100 + torch.arange(8, dtype=torch.float32).view(4, 2)
    q.enqueue(e2, _labels([[3], [4, 5, 0], [5], [1]], 6))
    assert len(q) == 5 and q.ptr == 2
    # slots 3, 4 <- first two rows of e2; slots 0, 1 <- last two (overwrite the oldest)
    expected_emb = torch.stack([e2[2], e2[3], e1[2], e2[0], e2[1]])
    torch.testing.assert_close(q.embeddings, expected_emb)
    labels = q.labels
    dense = labels.to_dense() if label_format == "sparse" else labels
    assert dense.dtype == torch.bool and (labels.is_sparse == (label_format == "sparse"))
    assert torch.equal(dense, _labels([[5], [1], [], [3], [4, 5, 0]], 6).bool())
    # a batch larger than the queue keeps the newest K rows
    big = torch.arange(14, dtype=torch.float32).view(7, 2)
    q.enqueue(big, _labels([[i % 6] for i in range(7)], 6))
    assert len(q) == 5
    assert sorted(q.embeddings[:, 0].tolist()) == [4.0, 6.0, 8.0, 10.0, 12.0]


def test_queue_sparse_matches_bool_and_accepts_sparse_input():
    torch.manual_seed(0)
    qb = EmbeddingQueue(16, 3, 40, label_format="bool")
    qs = EmbeddingQueue(16, 3, 40, label_format="sparse")
    for step in range(7):
        emb = torch.randn(5, 3)
        lab = torch.rand(5, 40) < (0.05 + 0.05 * step)
        qb.enqueue(emb, lab)
        qs.enqueue(emb, [lab, lab.float().to_sparse(), lab.float().to_sparse_csr()][step % 3])
    big_emb, big_lab = torch.randn(20, 3), torch.rand(20, 40) < 0.2  # larger than the queue, sparse input
    qb.enqueue(big_emb, big_lab)
    qs.enqueue(big_emb, big_lab.float().to_sparse())
    torch.testing.assert_close(qb.embeddings, qs.embeddings)
    assert torch.equal(qb.labels, qs.labels.to_dense())


def test_queue_large_label_space_is_compact():
    q = EmbeddingQueue(size=65536, dim=256, num_labels=25230)
    assert q.label_format == "sparse"
    assert q.memory_bytes() < 80 * 2**20  # a K x L float matrix would need 6.2 GB
    lab = torch.zeros(4, 25230, dtype=torch.bool)
    lab[0, [3, 25229]] = True
    lab[2, 17] = True
    q.enqueue(torch.randn(4, 256), lab)
    got = q.labels
    assert got.is_sparse and got.shape == (4, 25230)
    assert torch.equal(got.to_dense(), lab)


def test_queue_auto_format_follows_the_label_space_and_device():
    """ "auto": label rows on CPU beyond 256 labels (the loss reads them faster) or beyond 128 MB of bool;
    explicit formats are kept."""
    assert EmbeddingQueue(4096, 8, 90).label_format == "bool"  # Reuters R90, GoEmotions, AAPD ...
    assert EmbeddingQueue(4096, 8, 256).label_format == "bool"
    assert EmbeddingQueue(4096, 8, 257).label_format == "sparse"
    assert EmbeddingQueue(4096, 8, 8929, device="cpu").label_format == "sparse"
    assert EmbeddingQueue(4096, 8, 8929, device="meta").label_format == "bool"  # not CPU: size rule only
    assert EmbeddingQueue(65536, 8, 8929, device="meta").label_format == "sparse"  # 585 M bools > 2**27
    assert EmbeddingQueue(16, 8, 1000, label_format="bool").label_format == "bool"


def test_queue_auto_resumes_a_state_saved_in_the_other_format():
    """A checkpoint written when "auto" picked the other format resumes in that format; an explicit
    format that differs from the state still raises."""
    saved = EmbeddingQueue(6, 2, 300, label_format="bool")
    lab = torch.rand(4, 300) < 0.05
    saved.enqueue(torch.randn(4, 2), lab)
    state = saved.state_dict()
    auto = EmbeddingQueue(6, 2, 300)
    assert auto.label_format == "sparse"
    auto.load_state_dict(state)
    assert auto.label_format == "bool" and torch.equal(auto.labels, lab)
    auto.enqueue(torch.randn(1, 2), lab[:1])
    assert len(auto) == 5
    with pytest.raises(ValueError, match="label_format='auto'"):
        EmbeddingQueue(6, 2, 300, label_format="sparse").load_state_dict(state)


def test_queue_state_dict_resume():
    q = EmbeddingQueue(6, 2, 5, label_format="sparse")
    for _ in range(3):
        q.enqueue(torch.randn(4, 2), torch.rand(4, 5) < 0.4)
    state = q.state_dict()
    resumed = EmbeddingQueue(6, 2, 5, label_format="sparse")
    resumed.load_state_dict(state)
    assert (resumed.ptr, len(resumed)) == (q.ptr, len(q))
    emb, lab = torch.randn(3, 2), torch.rand(3, 5) < 0.5
    q.enqueue(emb, lab)
    resumed.enqueue(emb, lab)
    torch.testing.assert_close(resumed.embeddings, q.embeddings)
    assert torch.equal(resumed.labels.to_dense(), q.labels.to_dense())
    with pytest.raises(ValueError, match="size"):
        EmbeddingQueue(7, 2, 5, label_format="sparse").load_state_dict(state)
    with pytest.raises(ValueError, match="labels must be"):
        q.enqueue(torch.randn(2, 2), torch.zeros(2, 4))
    with pytest.raises(ValueError, match="embeddings must be"):
        q.enqueue(torch.randn(2, 3), torch.zeros(2, 5))


def test_lora_encoder_gets_peft_fsdp_wrap_policy(tiny_llama_config):
    """FSDP + LoRA: the trained model is a PeftModel, so Trainer installs PEFT's auto-wrap policy (every
    decoder layer and every trainable LoRA leaf in its own FSDP unit) before accelerator.prepare."""
    from peft.utils.other import fsdp_auto_wrap_policy
    from transformers.trainer import _is_peft_model

    encoder = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", projection_dim=16)
    model = apply_lora(encoder, bf16=False, gradient_checkpointing=False)
    assert _is_peft_model(model)
    policy = fsdp_auto_wrap_policy(model)
    layer = model.base_model.model.backbone.layers[0]
    lora_leaf = layer.self_attn.q_proj.lora_A["default"]
    assert policy(module=layer, recurse=False, nonwrapped_numel=0)
    assert policy(module=lora_leaf, recurse=False, nonwrapped_numel=0)
    frozen = layer.input_layernorm
    assert not policy(module=frozen, recurse=False, nonwrapped_numel=0)
