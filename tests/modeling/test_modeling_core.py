"""MLCLConfig / MLCLEncoder / MLCLForMultiLabelClassification: shapes, pooling, padding invariance,
segmented PLM-ICD path against a reference written from the paper's equations, errors, saving."""

from __future__ import annotations

import json
import os

import pytest
import torch

from hf_mlcl.modeling import (
    MLCLConfig,
    MLCLEncoder,
    MLCLEncoderOutput,
    MLCLForMultiLabelClassification,
    pool_states,
)
from hf_mlcl.modeling.modeling_mlcl import PREPARED_MASK_MODEL_TYPES

TEXTS = [
    "the patient was admitted with chest pain and shortness of breath",
    "graph neural network learning theory",
    "joy anger sadness love fear surprise admiration gratitude model training loss label text contrastive "
    "multi supervised encoder attention token document code diagnosis procedure heart failure kidney",
]


def _batch(tokenizer, texts=TEXTS, **kw):
    enc = tokenizer(list(texts), padding=True, return_tensors="pt", **kw)
    return {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def _pad_more(batch, extra, pad_id):
    """Right-pad every tensor of the batch by `extra` more positions."""
    out = {}
    for key, value in batch.items():
        fill = pad_id if key == "input_ids" else 0
        out[key] = torch.cat([value, torch.full((value.shape[0], extra), fill, dtype=value.dtype)], dim=1)
    return out


def _left_padded(right, pad_id):
    """The right-padded batch with each row's real tokens moved to the right end (left padding)."""
    left = {k: torch.zeros_like(v) for k, v in right.items()}
    left["input_ids"].fill_(pad_id)
    for i in range(right["input_ids"].shape[0]):
        n = int(right["attention_mask"][i].sum())
        for key in right:
            left[key][i, -n:] = right[key][i, :n]
    return left


@pytest.fixture
def configs(tiny_bert_config, tiny_roberta_config, tiny_llama_config):
    return {"bert": tiny_bert_config, "roberta": tiny_roberta_config, "llama": tiny_llama_config}


# --------------------------------------------------------------------------------------------------
# config
# --------------------------------------------------------------------------------------------------


def test_config_validation_errors(tiny_bert_config):
    with pytest.raises(ValueError, match="unknown pooling"):
        MLCLConfig(backbone_config=tiny_bert_config, pooling="max")
    with pytest.raises(ValueError, match="unknown pooling"):
        MLCLEncoder.from_backbone(tiny_bert_config, pooling="attention")
    with pytest.raises(ValueError, match="unknown head"):
        MLCLConfig(head="mlp")
    for bad in (0, -4):
        with pytest.raises(ValueError, match="chunk_size must be a positive"):
            MLCLConfig(backbone_config=tiny_bert_config, chunk_size=bad)
    with pytest.raises(ValueError, match="label-count mismatch"):
        MLCLConfig(num_labels=3, id2label={0: "a", 1: "b"})
    with pytest.raises(ValueError, match="model_type"):
        MLCLConfig(backbone_config={"hidden_size": 8})


def test_config_roundtrip_and_defaults(tmp_path, tiny_bert_config):
    cfg = MLCLConfig(backbone_config=tiny_bert_config, pooling="mean")
    assert cfg.projection_dim == 256 and cfg.chunk_size == 128 and cfg.head == "linear"
    assert cfg.problem_type == "multi_label_classification" and cfg.segmented is False
    assert MLCLConfig(backbone_config=tiny_bert_config, head="label_attention").segmented is True
    cfg.save_pretrained(tmp_path)
    again = MLCLConfig.from_pretrained(tmp_path)
    assert again.pooling == "mean" and again.backbone_config["model_type"] == "bert"
    rebuilt = again.get_backbone_config()
    assert type(rebuilt) is type(tiny_bert_config) and rebuilt.hidden_size == tiny_bert_config.hidden_size


# --------------------------------------------------------------------------------------------------
# encoder
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "arch,pooling",
    [("bert", "cls"), ("bert", "mean"), ("roberta", "mean"), ("llama", "last_token"), ("llama", "mean")],
)
def test_encoder_shapes_and_output_type(configs, bert_tokenizer, llama_tokenizer, arch, pooling):
    tok = llama_tokenizer if arch == "llama" else bert_tokenizer
    model = MLCLEncoder.from_backbone(configs[arch], pooling=pooling, projection_dim=24).eval()
    assert model.accepts_loss_kwargs is False
    out = model(**_batch(tok))
    assert isinstance(out, MLCLEncoderOutput)
    assert out.embeddings.shape == (3, 24) and out.pooled.shape == (3, 32)
    assert torch.isfinite(out.embeddings).all()
    # projection head = Linear(hidden, hidden) -> ReLU -> Linear(hidden, projection_dim)
    ph = model.projection_head
    assert ph.dense.weight.shape == (32, 32) and ph.out_proj.weight.shape == (24, 32)
    expected = ph.out_proj(torch.relu(ph.dense(out.pooled)))
    torch.testing.assert_close(out.embeddings, expected)
    emb, pooled = model(**_batch(tok), return_dict=False)
    torch.testing.assert_close(emb, out.embeddings)


def test_projection_sizes_configurable(tiny_bert_config, bert_tokenizer):
    model = MLCLEncoder.from_backbone(tiny_bert_config, projection_dim=8, projection_hidden_dim=48).eval()
    assert model.projection_head.dense.weight.shape == (48, 32)
    assert model(**_batch(bert_tokenizer)).embeddings.shape == (3, 8)
    assert model.config.projection_hidden_dim == 48


def test_pooling_values(tiny_bert_config, bert_tokenizer):
    """pooled equals the first token / masked mean of the backbone's own last_hidden_state."""
    batch = _batch(bert_tokenizer)
    for pooling in ("cls", "mean", "last_token"):
        model = MLCLEncoder.from_backbone(tiny_bert_config, pooling=pooling).eval()
        with torch.no_grad():
            states = model.backbone(**batch).last_hidden_state
            pooled = model(**batch).pooled
        mask = batch["attention_mask"]
        for i in range(3):
            n = int(mask[i].sum())
            ref = {"cls": states[i, 0], "mean": states[i, :n].mean(0), "last_token": states[i, n - 1]}[
                pooling
            ]
            torch.testing.assert_close(pooled[i], ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "arch,pooling", [("bert", "cls"), ("bert", "mean"), ("roberta", "mean"), ("llama", "last_token")]
)
def test_encoder_padding_invariance(configs, bert_tokenizer, llama_tokenizer, arch, pooling):
    tok = llama_tokenizer if arch == "llama" else bert_tokenizer
    model = MLCLEncoder.from_backbone(configs[arch], pooling=pooling).eval()
    batch = _batch(tok)
    with torch.no_grad():
        a = model(**batch).embeddings
        b = model(**_pad_more(batch, 17, tok.pad_token_id)).embeddings
        single = model(**_batch(tok, TEXTS[:1])).embeddings
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(a[:1], single, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "arch,pooling", [("bert", "cls"), ("bert", "mean"), ("roberta", "mean"), ("llama", "last_token")]
)
def test_a_batch_without_a_mask_pools_as_with_an_all_ones_mask(
    configs, bert_tokenizer, llama_tokenizer, arch, pooling
):
    """What MultiLabelCollator hands over for a batch without padding: no attention_mask. The embeddings are
    those of the all-ones mask, pooled without mask arithmetic."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from hf_mlcl.modeling.layers_mlcl import pool_states

    class Ops(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Ops.count += 1
            return func(*args, **(kwargs or {}))

    tok = llama_tokenizer if arch == "llama" else bert_tokenizer
    model = MLCLEncoder.from_backbone(configs[arch], pooling=pooling).eval()
    ids = _batch(tok, [TEXTS[2]] * 3, truncation=True, max_length=12)["input_ids"]  # three rows, no padding
    with torch.no_grad():
        ones = model(input_ids=ids, attention_mask=torch.ones_like(ids))
        absent = model(input_ids=ids)
    torch.testing.assert_close(absent.pooled, ones.pooled, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(absent.embeddings, ones.embeddings, atol=1e-6, rtol=1e-6)
    states = torch.randn(3, 12, 8)
    with Ops():
        pool_states(states, None, pooling)
    without, Ops.count = Ops.count, 0
    with Ops():
        pool_states(states, torch.ones(3, 12, dtype=torch.long), pooling)
    assert without == 1 and (pooling == "cls" or Ops.count > 1), (without, Ops.count)


def test_label_attention_without_a_mask_equals_an_all_ones_mask():
    from hf_mlcl.modeling.layers_mlcl import LabelAttentionHead

    head = LabelAttentionHead(hidden_size=8, attention_dim=4, num_labels=5)
    states = torch.randn(2, 6, 8)
    torch.testing.assert_close(head(states, None), head(states, torch.ones(2, 6, dtype=torch.long)))


@pytest.mark.parametrize("arch", sorted(PREPARED_MASK_MODEL_TYPES))
def test_a_prepared_mask_encodes_as_the_backbone_with_its_own_mask_and_reads_nothing(bert_tokenizer, arch):
    """bert / roberta / xlm-roberta under SDPA get the padding mask as (B, 1, 1, T) booleans: the same
    token states as transformers' own 2-D mask path, and no host read (transformers' ``padding_mask.all()``
    check is what the 2-D mask costs)."""
    from transformers import AutoConfig

    from hf_mlcl.host_sync import HostSyncCounter
    from hf_mlcl.labels.host_reads import accelerator_path

    config = AutoConfig.for_model(
        arch,
        vocab_size=len(bert_tokenizer),
        pad_token_id=bert_tokenizer.pad_token_id,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=37,
        max_position_embeddings=520,
    )
    model = MLCLEncoder.from_backbone(config, pooling="mean").eval()
    assert model.backbone.config._attn_implementation == "sdpa"
    batch = _batch(bert_tokenizer)
    assert not bool(batch["attention_mask"].all())  # the batch holds padding
    with torch.no_grad():
        with accelerator_path(), HostSyncCounter() as counter:
            states, mask, _ = model.encode_tokens(**batch)
        reference = model.backbone(**batch).last_hidden_state  # transformers builds the mask itself
    assert counter.count == 0, counter.report()
    real = batch["attention_mask"].bool()
    assert mask is batch["attention_mask"]
    torch.testing.assert_close(states[real], reference[real], atol=1e-6, rtol=1e-6)
    with (
        accelerator_path(),
        HostSyncCounter() as counter,
    ):  # the 2-D path the prepared mask replaces makes exactly the one read
        with torch.no_grad():
            model.backbone(**batch)
    assert counter.count == 1


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_the_two_dimensional_mask_goes_to_other_attentions_and_backbones(
    tiny_bert_config, tiny_llama_config, bert_tokenizer, implementation
):
    """Eager attention adds the mask to the scores and a decoder needs its causal mask: both get the
    2-D padding mask and build their own (so the prepared mask never reaches them)."""
    bert = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean").eval()
    bert.backbone.set_attn_implementation(implementation)
    llama = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token").eval()
    mask = _batch(bert_tokenizer)["attention_mask"]
    assert bert._backbone_mask(mask).ndim == (4 if implementation == "sdpa" else 2)
    assert llama._backbone_mask(mask) is mask
    assert bert._backbone_mask(None) is None


def test_last_token_left_padding_equals_right_padding(tiny_llama_config, llama_tokenizer):
    model = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token").eval()
    right = _batch(llama_tokenizer)
    left = _left_padded(right, llama_tokenizer.pad_token_id)
    with torch.no_grad():
        torch.testing.assert_close(model(**right).embeddings, model(**left).embeddings, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "mean", "last_token"])
@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_left_padding_leaves_every_pooling_unchanged_with_absolute_positions(
    tiny_bert_config, bert_tokenizer, family, pooling
):
    """BERT's and GPT-2's position embeddings are absolute: left padding shifted every real token's position
    under cls and mean pooling (differences near 2), as it did under last_token before its positions counted
    real tokens only."""
    from transformers import AutoConfig

    config = tiny_bert_config
    if family == "gpt2":
        config = AutoConfig.for_model(
            "gpt2", vocab_size=config.vocab_size, n_embd=32, n_layer=2, n_head=2, n_positions=128
        )
    model = MLCLEncoder.from_backbone(config, pooling=pooling).eval()
    right = _batch(bert_tokenizer)
    left = _left_padded(right, bert_tokenizer.pad_token_id)
    with torch.no_grad():
        alone = torch.cat(
            [
                model(
                    **{k: v[i : i + 1, : int(right["attention_mask"][i].sum())] for k, v in right.items()}
                ).embeddings
                for i in range(right["input_ids"].shape[0])
            ]
        )
        torch.testing.assert_close(model(**right).embeddings, alone, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(**left).embeddings, alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["roberta", "mpnet", "longformer"])
def test_last_token_keeps_the_positions_of_a_backbone_that_numbers_them(
    tiny_roberta_config, bert_tokenizer, family
):
    """RoBERTa, MPNet and Longformer number real tokens from padding_idx + 1 themselves: last_token pooling passes
    no position ids from 0, so the pooled state is the backbone's own state at the last real token, for either
    padding side."""
    from transformers import AutoConfig

    config = tiny_roberta_config
    if family != "roberta":
        shape = {
            k: getattr(config, k) for k in ("vocab_size", "pad_token_id", "hidden_size", "num_hidden_layers")
        }
        shape.update(
            num_attention_heads=config.num_attention_heads, intermediate_size=config.intermediate_size
        )
        extra = {"attention_window": 4} if family == "longformer" else {}
        config = AutoConfig.for_model(family, max_position_embeddings=520, **shape, **extra)
    model = MLCLEncoder.from_backbone(config, pooling="last_token").eval()
    right = _batch(bert_tokenizer)
    left = _left_padded(right, bert_tokenizer.pad_token_id)
    with torch.no_grad():
        states = model.backbone(**right).last_hidden_state
        last = right["attention_mask"].sum(-1) - 1
        ref = states[torch.arange(states.shape[0]), last]
        torch.testing.assert_close(model(**right).pooled, ref, atol=1e-5, rtol=1e-5)
        own_left = model.backbone(**left).last_hidden_state[:, -1]  # MPNet's own states change with the side
        torch.testing.assert_close(model(**left).pooled, own_left, atol=1e-5, rtol=1e-5)
        if family == "roberta":
            torch.testing.assert_close(own_left, ref, atol=1e-5, rtol=1e-5)


def test_cls_pooling_reads_the_first_real_token_under_left_padding():
    states = torch.randn(3, 5, 4)
    right = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]])
    left = right.flip(-1)
    torch.testing.assert_close(pool_states(states, right, "cls"), states[:, 0])
    torch.testing.assert_close(
        pool_states(states, left, "cls"), states[torch.arange(3), torch.tensor([2, 0, 4])]
    )


def test_segmented_encoder_is_masked_mean_over_segment_tokens(tiny_roberta_config, bert_tokenizer):
    model = MLCLEncoder.from_backbone(
        tiny_roberta_config, pooling="mean", segmented=True, chunk_size=8
    ).eval()
    batch = _batch(bert_tokenizer)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    with torch.no_grad():
        out = model(**batch)
        refs = []
        for i in range(ids.shape[0]):
            n = int(mask[i].sum())
            states = []
            for start in range(0, n, 8):  # each segment encoded on its own, states concatenated
                seg = ids[i : i + 1, start : min(start + 8, n)]
                states.append(model.backbone(input_ids=seg).last_hidden_state[0])
            refs.append(torch.cat(states).mean(0))
        ref = torch.stack(refs)
        torch.testing.assert_close(out.pooled, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out.embeddings, model.projection_head(ref), atol=1e-5, rtol=1e-5)
        padded = model(**_pad_more(batch, 29, bert_tokenizer.pad_token_id))
        torch.testing.assert_close(out.embeddings, padded.embeddings, atol=1e-5, rtol=1e-5)


def test_encode_convenience(tiny_bert_config, bert_tokenizer):
    model = MLCLEncoder.from_backbone(tiny_bert_config, projection_dim=12)
    model.train()
    emb = model.encode(TEXTS, bert_tokenizer, batch_size=2)
    assert emb.shape == (3, 12) and emb.dtype == torch.float32 and model.training
    pooled = model.encode(TEXTS, bert_tokenizer, output="pooled", normalize=True)
    assert pooled.shape == (3, 32)
    torch.testing.assert_close(pooled.norm(dim=-1), torch.ones(3))
    model.eval()
    with torch.no_grad():
        torch.testing.assert_close(emb, model(**_batch(bert_tokenizer)).embeddings, atol=1e-5, rtol=1e-5)


def test_encoder_save_load_roundtrip_atomic(tmp_path, tiny_bert_config, bert_tokenizer):
    model = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=16).eval()
    target = tmp_path / "enc"
    model.save_pretrained(target)
    files = set(os.listdir(target))
    assert {"config.json", "model.safetensors", "configuration_mlcl.py", "modeling_mlcl.py"} <= files
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".enc.tmp-")]  # temp folder renamed away
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(target).st_mode & 0o777 == 0o777 & ~umask
    cfg = json.load(open(target / "config.json"))
    assert cfg["auto_map"] == {
        "AutoConfig": "configuration_mlcl.MLCLConfig",
        "AutoModel": "modeling_mlcl.MLCLEncoder",
    }
    assert cfg["backbone_config"]["model_type"] == "bert"
    # two code files beside the weights (the package's modeling modules bundled into one), never importing hf_mlcl
    assert sorted(n for n in files if n.endswith(".py")) == ["configuration_mlcl.py", "modeling_mlcl.py"]
    for name in ("configuration_mlcl.py", "modeling_mlcl.py"):
        assert "hf_mlcl" not in "".join(
            line for line in open(target / name) if line.lstrip().startswith(("import ", "from "))
        )
    loaded = MLCLEncoder.from_pretrained(target).eval()
    for key, value in model.state_dict().items():
        assert torch.equal(value, loaded.state_dict()[key]), key
    batch = _batch(bert_tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).embeddings, loaded(**batch).embeddings)
    # saving into an existing folder keeps foreign files and replaces ours file by file
    (target / "trainer_state.json").write_text("{}")
    (target / "model-00001-of-00002.safetensors").write_text("stale shard")
    model.save_pretrained(target)
    files = set(os.listdir(target))
    assert "trainer_state.json" in files and "model-00001-of-00002.safetensors" not in files
    # hf_mlcl registers the auto classes locally, so plain AutoModel works when hf_mlcl is imported
    from transformers import AutoModel

    assert type(AutoModel.from_pretrained(target)) is MLCLEncoder
    with pytest.raises(ValueError, match="saved hf_mlcl model"):
        MLCLEncoder.from_backbone(str(target))
    # an explicit attention implementation reaches the backbone rebuilt from the stored config
    eager = MLCLEncoder.from_pretrained(target, attn_implementation="eager")
    assert eager.backbone.config._attn_implementation == "eager"


# --------------------------------------------------------------------------------------------------
# classifier
# --------------------------------------------------------------------------------------------------


def _reference_plm_icd(model: MLCLForMultiLabelClassification, ids, mask, chunk):
    """PLM-ICD (Huang et al. 2022) spelled out: segments encoded one by one, per-label loops."""
    head = model.classifier
    w1, w2 = head.first_linear.weight, head.second_linear.weight
    w3, b3 = head.third_linear.weight, head.third_linear.bias
    logits = torch.zeros(ids.shape[0], w3.shape[0])
    for i in range(ids.shape[0]):
        n = int(mask[i].sum())
        parts = []
        for start in range(0, n, chunk):
            seg = ids[i : i + 1, start : min(start + chunk, n)]
            parts.append(model.backbone(input_ids=seg).last_hidden_state[0])
        h = torch.cat(parts)  # (n, hidden): real tokens only
        z = torch.tanh(h @ w1.T)  # Z = tanh(H W1)
        for k in range(w3.shape[0]):
            a = torch.softmax(z @ w2[k], dim=0)  # attention of label k over the tokens
            v = a @ h  # V_k = A_k H
            logits[i, k] = w3[k] @ v + b3[k]  # logit_k = w3_k . V_k + b_k
    return logits


def test_a_named_writer_saves_on_a_process_other_than_global_rank_0(tmp_path, tiny_bert_config, monkeypatch):
    """transformers 5 writes model files on global rank 0 only, whatever ``is_main_process`` says; with
    ``save_on_each_node`` the Trainer names each node's main process the writer (``is_main_process=True`` on
    global rank 1 here), and that folder must get its config and weights. Without ``is_main_process``
    transformers' rank-0 rule stands; ``is_main_process=False`` writes nothing."""
    import transformers.distributed.mixin as mixin

    model = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=16).eval()
    monkeypatch.setattr(mixin, "_is_torch_distributed_initialized", lambda: True)
    monkeypatch.setattr(mixin, "_get_torch_distributed_rank", lambda: 1)  # the main process of node 1
    model.save_pretrained(tmp_path / "named", is_main_process=True)
    assert {"config.json", "model.safetensors", "modeling_mlcl.py"} <= set(os.listdir(tmp_path / "named"))
    loaded = MLCLEncoder.from_pretrained(tmp_path / "named").state_dict()
    assert all(torch.equal(loaded[k], v) for k, v in model.state_dict().items())
    for name, kwargs in (("unnamed", {}), ("not_main", {"is_main_process": False})):
        model.save_pretrained(tmp_path / name, **kwargs)
        assert not os.path.exists(tmp_path / name / "model.safetensors"), name
    assert not getattr(model, "_writer_named", False)  # the flag lives for one call


@pytest.mark.parametrize("arch", ["roberta", "bert"])
def test_label_attention_matches_reference_and_is_padding_invariant(configs, bert_tokenizer, arch):
    encoder = MLCLEncoder.from_backbone(configs[arch], pooling="mean")
    model = MLCLForMultiLabelClassification.from_encoder(
        encoder, num_labels=5, head="label_attention", chunk_size=8, label_attention_dim=16
    ).eval()
    assert model.config.segmented and model.classifier.first_linear.weight.shape == (16, 32)
    batch = _batch(bert_tokenizer)
    with torch.no_grad():
        logits = model(**batch).logits
        ref = _reference_plm_icd(model, batch["input_ids"], batch["attention_mask"], 8)
        padded = model(**_pad_more(batch, 37, bert_tokenizer.pad_token_id)).logits
    assert logits.shape == (3, 5)
    torch.testing.assert_close(logits, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(logits, padded, atol=1e-5, rtol=1e-5)


def test_label_attention_long_document_3072_tokens(tiny_bert_config):
    tiny_bert_config.max_position_embeddings = 128
    encoder = MLCLEncoder.from_backbone(tiny_bert_config)
    model = MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=4, head="label_attention").eval()
    ids = torch.randint(5, tiny_bert_config.vocab_size, (2, 3072))
    mask = torch.ones_like(ids)
    mask[1, 1000:] = 0
    ids[1, 1000:] = 0
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask)
        short = model(input_ids=ids[1:, :1000], attention_mask=mask[1:, :1000])
    assert out.logits.shape == (2, 4) and torch.isfinite(out.logits).all()
    torch.testing.assert_close(out.logits[1:], short.logits, atol=1e-5, rtol=1e-5)


def test_linear_probe_from_encoder(tiny_bert_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=16)
    names = ["cardio", "renal", "neuro"]
    model = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=names)
    cfg = model.config
    assert cfg.problem_type == "multi_label_classification" and cfg.num_labels == 3
    assert cfg.id2label == {0: "cardio", 1: "renal", 2: "neuro"} and cfg.label2id["renal"] == 1
    assert not hasattr(model, "projection_head") and "auto_map" not in cfg.to_dict()
    assert model.backbone is encoder.backbone  # projection dropped, backbone taken over
    model.train()
    assert not model.backbone.training  # frozen encoder stays in eval mode (no dropout)
    batch = _batch(bert_tokenizer)
    labels = torch.tensor([[1, 0, 1], [0, 0, 0], [1, 1, 1]], dtype=torch.float32)
    out = model(**batch, labels=labels)
    expected = torch.nn.functional.binary_cross_entropy_with_logits(out.logits, labels)
    torch.testing.assert_close(out.loss, expected)
    out.loss.backward()
    assert all(p.grad is None for p in model.backbone.parameters())
    assert model.classifier.weight.grad is not None
    # pooled features are the encoder's (projection dropped)
    model.eval()
    encoder.eval()
    with torch.no_grad():
        pooled = encoder(**batch).pooled
        torch.testing.assert_close(model(**batch).logits, model.classifier(pooled), atol=1e-5, rtol=1e-5)
        # the head alone on pooled features (a cached linear probe) is the forward after pooling
        from_pooled = model(pooled_features=pooled, labels=labels)
        torch.testing.assert_close(from_pooled.logits, model(**batch).logits, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(from_pooled.logits, model.logits_from_pooled(pooled))
        torch.testing.assert_close(from_pooled.loss, model(**batch, labels=labels).loss, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="input_ids or pooled_features"):
        model(**batch, pooled_features=pooled)
    # classifier dropout applies to pooled features in training mode, exactly as in forward
    dropped = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=names, classifier_dropout=0.5
    ).train()
    torch.manual_seed(3)
    a = dropped(pooled_features=pooled).logits
    torch.manual_seed(3)
    b = dropped(**batch).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a, dropped.classifier(pooled), atol=1e-3)
    # sparse labels give the same loss
    sparse = model(**batch, labels=labels.to_sparse()).loss
    torch.testing.assert_close(sparse, model(**batch, labels=labels).loss)


def test_unfrozen_encoder_receives_gradients(tiny_bert_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_bert_config)
    model = MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=2, freeze_encoder=False)
    model.train()
    assert model.backbone.training
    out = model(**_batch(bert_tokenizer), labels=torch.ones(3, 2))
    out.loss.backward()
    assert model.backbone.get_input_embeddings().weight.grad is not None


def test_classifier_errors(tiny_bert_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_bert_config)
    with pytest.raises(ValueError, match="label-count mismatch"):
        MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=3, id2label=["a", "b"])
    with pytest.raises(ValueError, match="num_labels or id2label"):
        MLCLForMultiLabelClassification.from_encoder(encoder)
    with pytest.raises(ValueError, match="chunk_size"):
        MLCLForMultiLabelClassification.from_encoder(
            encoder, num_labels=2, head="label_attention", chunk_size=0
        )
    with pytest.raises(ValueError, match="unknown head"):
        MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=2, head="mlp")
    attention = MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=2, head="label_attention")
    with pytest.raises(ValueError, match="it classifies no pooled features"):
        attention(pooled_features=torch.zeros(3, 32))
    model = MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=2)
    with pytest.raises(ValueError, match="num_labels=2"):
        model(**_batch(bert_tokenizer), labels=torch.ones(3, 5))


def test_classifier_save_load_roundtrip(tmp_path, tiny_roberta_config, bert_tokenizer):
    encoder = MLCLEncoder.from_backbone(tiny_roberta_config, pooling="mean")
    model = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=["a", "b", "c", "d"], head="label_attention", chunk_size=8
    ).eval()
    model.save_pretrained(tmp_path / "clf")
    cfg = json.load(open(tmp_path / "clf" / "config.json"))
    assert (
        cfg["auto_map"]["AutoModelForSequenceClassification"]
        == "modeling_mlcl.MLCLForMultiLabelClassification"
    )
    assert "AutoModel" not in cfg["auto_map"]
    from transformers import AutoModelForSequenceClassification

    loaded = AutoModelForSequenceClassification.from_pretrained(tmp_path / "clf").eval()
    assert type(loaded) is MLCLForMultiLabelClassification
    # a frozen encoder stays frozen on reload (transformers' loading makes loaded parameters trainable)
    assert loaded.config.freeze_encoder and not any(p.requires_grad for p in loaded.backbone.parameters())
    assert all(p.requires_grad for p in loaded.classifier.parameters())
    direct, info = MLCLForMultiLabelClassification.from_pretrained(tmp_path / "clf", output_loading_info=True)
    assert not info["missing_keys"] and not any(p.requires_grad for p in direct.backbone.parameters())
    assert loaded.config.id2label == model.config.id2label and loaded.config.chunk_size == 8
    batch = _batch(bert_tokenizer)
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, loaded(**batch).logits)
    # encoder folder -> probe, through the path form of from_encoder
    encoder.save_pretrained(tmp_path / "enc")
    probe = MLCLForMultiLabelClassification.from_encoder(str(tmp_path / "enc"), num_labels=2)
    for key, value in encoder.backbone.state_dict().items():
        assert torch.equal(value, probe.backbone.state_dict()[key])
    # the loader's keywords reach the encoder's from_pretrained
    encoder.save_pretrained(tmp_path / "repo" / "enc")
    half = MLCLForMultiLabelClassification.from_encoder(
        str(tmp_path / "repo"), num_labels=2, load_kwargs={"subfolder": "enc", "dtype": torch.float64}
    )
    assert half.backbone.dtype == torch.float64
    with pytest.raises(ValueError, match="load_kwargs apply to an encoder folder"):
        MLCLForMultiLabelClassification.from_encoder(
            encoder, num_labels=2, load_kwargs={"dtype": torch.float64}
        )


def test_from_encoder_places_the_heads_and_leaves_the_backbone_where_it_is(tiny_bert_config):
    """A backbone spread over devices (a device_map) keeps its layout: only the heads move, to the device of its
    first parameter. On the CPU, a layer on the meta device stands for the second device."""
    encoder = MLCLEncoder.from_backbone(tiny_bert_config, projection_dim=8)
    encoder.backbone.encoder.layer[1].to("meta")
    model = MLCLForMultiLabelClassification.from_encoder(encoder, num_labels=3)
    assert model.classifier.weight.device.type == "cpu"
    assert next(model.backbone.encoder.layer[1].parameters()).device.type == "meta"
    assert next(model.backbone.encoder.layer[0].parameters()).device.type == "cpu"


def test_a_classifier_without_head_weights_is_an_error_not_a_random_head(tmp_path, tiny_bert_config):
    """An encoder folder, or a classifier folder whose head tensors are gone, does not load as a classifier
    (directly or through AutoModelForSequenceClassification with the saved remote code)."""
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForSequenceClassification

    def auto(path):
        return AutoModelForSequenceClassification.from_pretrained(path, trust_remote_code=True)

    encoder = MLCLEncoder.from_backbone(tiny_bert_config, id2label=["a", "b", "c"])
    encoder.save_pretrained(tmp_path / "enc")
    for load in (MLCLForMultiLabelClassification.from_pretrained, auto):
        with pytest.raises(
            ValueError, match=r"enc is an encoder \(MLCLEncoder\).*no classification head.*from_encoder"
        ):
            load(tmp_path / "enc")
    clf = MLCLForMultiLabelClassification.from_encoder(encoder, id2label=["a", "b", "c"])
    clf.save_pretrained(tmp_path / "clf")
    weights = str(tmp_path / "clf" / "model.safetensors")
    kept = {k: v for k, v in load_file(weights).items() if not k.startswith("classifier.")}
    save_file(kept, weights, metadata={"format": "pt"})
    for load in (MLCLForMultiLabelClassification.from_pretrained, auto):
        with pytest.raises(
            ValueError, match=r"clf holds no weights for .*classifier\.bias.*classifier\.weight"
        ):
            load(tmp_path / "clf")


def test_from_backbone_hands_dtype_to_the_backbone_loader(tmp_path, tiny_llama_config):
    """``dtype`` is a PreTrainedConfig field too: it must reach AutoModel (both a config and a saved
    folder), never end up in the MLCLConfig with the backbone left in the checkpoint's dtype."""
    from transformers import AutoModel

    AutoModel.from_config(tiny_llama_config, dtype=torch.bfloat16).save_pretrained(tmp_path / "bf16")
    loaded = MLCLEncoder.from_backbone(str(tmp_path / "bf16"), pooling="last_token", dtype=torch.float32)
    assert {p.dtype for p in loaded.backbone.parameters()} == {torch.float32}
    built = MLCLEncoder.from_backbone(tiny_llama_config, pooling="last_token", dtype=torch.bfloat16)
    assert {p.dtype for p in built.backbone.parameters()} == {torch.bfloat16}
    kept = MLCLEncoder.from_backbone(str(tmp_path / "bf16"), pooling="last_token")
    assert {p.dtype for p in kept.backbone.parameters()} == {torch.bfloat16}  # the checkpoint's own dtype
    assert kept.projection_head.dense.weight.dtype == torch.float32  # heads stay fp32


def test_code_bundle_inlines_the_copied_siblings_once_and_refuses_a_name_clash(tmp_path):
    """bundle_code_files: the siblings a saved modeling_mlcl.py imports (at the top and inside functions, directly
    or through each other) are inlined before its own code, each after the modules it imports, and their files
    removed, the kept configuration_mlcl.py stays imported; a bundle saved again is left as it is; two modules
    defining one name stop with the name, modules importing each other in a cycle with the cycle."""
    import importlib.util
    import sys

    from hf_mlcl.modeling.folders_mlcl import bundle_code_files

    def folder(name, **files):
        path = tmp_path / name
        path.mkdir()
        for module, text in files.items():
            (path / f"{module}.py").write_text(text)
        return path

    good = folder(
        "good",
        configuration_mlcl='"""config"""\nfrom __future__ import annotations\nSIZE = 3\n',
        layers_mlcl='"""layers"""\nfrom __future__ import annotations\n\nimport math\n\n\ndef double(x):\n    return 2 * x\n',
        folders_mlcl='"""folders"""\nfrom __future__ import annotations\n\nfrom .layers_mlcl import double\n\n\n'
        'def name():\n    return "f" + str(double(1))\n',
        modeling_mlcl='"""modeling"""\nfrom __future__ import annotations\n\nfrom .configuration_mlcl import SIZE\n'
        "from .layers_mlcl import (\n    double,\n)\n\n\ndef run():\n    from .folders_mlcl import name\n\n"
        "    return double(SIZE), name()\n",
    )
    bundle_code_files(str(good))
    assert sorted(p.name for p in good.iterdir()) == ["configuration_mlcl.py", "modeling_mlcl.py"]
    text = (good / "modeling_mlcl.py").read_text()
    assert text.startswith('"""modeling"""\n\nfrom __future__ import annotations\n')
    assert (
        text.count("from __future__") == 1
        and "from .layers_mlcl" not in text
        and "from .folders_mlcl" not in text
    )
    assert text.index("# ---- layers_mlcl.py") < text.index(
        "# ---- folders_mlcl.py"
    )  # a module after its imports
    assert "from .configuration_mlcl import SIZE" in text
    (good / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location(
        "bundled_pkg", good / "__init__.py", submodule_search_locations=[str(good)]
    )
    sys.modules["bundled_pkg"] = importlib.util.module_from_spec(spec)
    try:
        from bundled_pkg.modeling_mlcl import run  # noqa: PLC0415

        assert run() == (6, "f2")
    finally:
        for key in [k for k in sys.modules if k.startswith("bundled_pkg")]:
            del sys.modules[key]
    bundle_code_files(str(good))  # saved again: nothing left to inline
    assert (good / "modeling_mlcl.py").read_text() == text

    clash = folder(
        "clash",
        layers_mlcl="def helper():\n    return 1\n",
        modeling_mlcl="from .layers_mlcl import helper\n\n\ndef helper():\n    return 2\n",
    )
    with pytest.raises(ValueError, match="helper is defined in both layers_mlcl.py and modeling_mlcl.py"):
        bundle_code_files(str(clash))
    assert (clash / "layers_mlcl.py").is_file()  # nothing written
    cycle = folder(
        "cycle",
        a_mlcl="from .b_mlcl import y\nx = 1\n",
        b_mlcl="from .a_mlcl import x\ny = 2\n",
        modeling_mlcl="from .a_mlcl import x\n",
    )
    with pytest.raises(ValueError, match="cycle: modeling_mlcl -> a_mlcl -> b_mlcl -> a_mlcl"):
        bundle_code_files(str(cycle))
