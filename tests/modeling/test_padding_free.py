"""Batches without padding: rows packed into one row give the padded batch's outputs and gradients."""

from __future__ import annotations

import pytest
import torch

from hf_mlcl.data import MultiLabelCollator
from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
from hf_mlcl.modeling.base_mlcl import PACKED_ROW_MODEL_TYPES

TEXTS = [  # rows of different lengths
    "the patient was admitted with chest pain",
    "graph neural network",
    "joy anger sadness love fear surprise admiration gratitude model training loss label text",
    "renal acute chronic kidney failure of the heart",
    "quantum",
    "contrastive multi supervised encoder attention token document code",
]


def _examples(n: int = 6) -> list[dict]:
    return [{"text": t, "labels": [i % 3, 3]} for i, t in enumerate(TEXTS[:n])]


def _batches(tokenizer, **kw) -> tuple[dict, dict]:
    padded = MultiLabelCollator(tokenizer, 4, max_length=24, **kw)(_examples())
    packed = MultiLabelCollator(tokenizer, 4, max_length=24, padding_free=True, **kw)(_examples())
    return padded, packed


def test_collator_packs_rows_without_padding(llama_tokenizer):
    padded, packed = _batches(llama_tokenizer, drop_unpadded_attention_mask=False)
    lengths = padded["attention_mask"].sum(1)
    assert list(packed) == ["labels", "input_ids", "position_ids", "cu_seq_lens", "max_seq_len"]
    assert packed["input_ids"].shape == (1, int(lengths.sum()))
    assert packed["input_ids"][0].tolist() == padded["input_ids"][padded["attention_mask"].bool()].tolist()
    assert packed["cu_seq_lens"].dtype == torch.int32
    assert packed["cu_seq_lens"].tolist() == [0, *lengths.cumsum(0).tolist()]
    assert packed["max_seq_len"] == int(lengths.max())
    expected = torch.cat([torch.arange(int(n)) for n in lengths])
    assert torch.equal(packed["position_ids"][0], expected)
    assert torch.equal(packed["labels"], padded["labels"])


def test_collator_packs_left_padded_and_pretokenized_rows(llama_tokenizer):
    import copy

    left = copy.deepcopy(llama_tokenizer)
    left.padding_side = "left"
    rows = [{"input_ids": llama_tokenizer(t)["input_ids"], "labels": [0]} for t in TEXTS]
    right = MultiLabelCollator(llama_tokenizer, 4, padding_free=True)(rows)
    for tokenizer in (left, llama_tokenizer):
        packed = MultiLabelCollator(tokenizer, 4, padding_free=True)(_examples())
        assert torch.equal(packed["input_ids"], right["input_ids"])
        assert torch.equal(packed["position_ids"], right["position_ids"])


def test_collator_refuses_an_empty_row(llama_tokenizer):
    rows = [{"input_ids": [5, 6], "labels": [0]}, {"input_ids": [], "labels": [1]}]
    with pytest.raises(ValueError, match="at least one token in every row"):
        MultiLabelCollator(llama_tokenizer, 4, padding_free=True)(rows)


@pytest.mark.parametrize("pooling", ["last_token", "mean", "cls"])
def test_packed_rows_give_the_padded_outputs_and_gradients(tiny_llama_config, llama_tokenizer, pooling):
    tiny_llama_config._attn_implementation = "sdpa"
    model = MLCLEncoder.from_backbone(tiny_llama_config, pooling=pooling, projection_dim=8)
    model.train()  # dropout is 0 in the tiny Llama: both passes draw nothing
    padded, packed = _batches(llama_tokenizer)
    outputs, grads = [], []
    for batch in (padded, packed):
        model.zero_grad()
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        out = model(**inputs)
        (out.embeddings.square().sum() + out.pooled.sum()).backward()
        outputs.append(out.embeddings.detach())
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert outputs[1].shape == (len(TEXTS), 8)
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-5)


def test_packed_rows_in_the_classifier(tiny_llama_config, llama_tokenizer):
    model = MLCLForMultiLabelClassification.from_backbone(
        tiny_llama_config, pooling="last_token", num_labels=4
    ).eval()
    padded, packed = _batches(llama_tokenizer)
    with torch.no_grad():
        a, b = model(**padded), model(**packed)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(b.loss, a.loss)


def test_packed_rows_never_attend_to_each_other(tiny_llama_config, llama_tokenizer):
    """A row's embedding does not change when the rows packed before it change."""
    model = MLCLEncoder.from_backbone(tiny_llama_config, pooling="mean", projection_dim=8).eval()
    collator = MultiLabelCollator(llama_tokenizer, 4, padding_free=True)
    last = {"text": TEXTS[0], "labels": [0]}
    with torch.no_grad():
        one = model(
            **{k: v for k, v in collator([{"text": TEXTS[1], "labels": [1]}, last]).items() if k != "labels"}
        )
        two = model(
            **{k: v for k, v in collator([{"text": TEXTS[4], "labels": [2]}, last]).items() if k != "labels"}
        )
    torch.testing.assert_close(one.embeddings[1], two.embeddings[1], rtol=1e-5, atol=1e-6)
    assert not torch.allclose(one.embeddings[0], two.embeddings[0])


def test_packed_rows_pass_the_flash_attention_offsets(tiny_llama_config, llama_tokenizer, monkeypatch):
    """Under flash attention the backbone also gets the rows' offsets for its variable-length kernel."""
    model = MLCLEncoder.from_backbone(tiny_llama_config, pooling="mean", projection_dim=8).eval()
    seen: dict = {}
    forward = model.backbone.forward

    def spy(input_ids=None, position_ids=None, use_cache=None, return_dict=None, **kwargs):
        kwargs.update(
            input_ids=input_ids, position_ids=position_ids, use_cache=use_cache, return_dict=return_dict
        )
        seen.update(kwargs)
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith(("cu_seq_lens", "max_length"))}
        return forward(**kwargs)

    monkeypatch.setattr(model.backbone, "forward", spy)
    monkeypatch.setattr(model, "_attention_is_flash", lambda: True)
    _, packed = _batches(llama_tokenizer)
    model(**{k: v for k, v in packed.items() if k != "labels"})
    assert torch.equal(seen["cu_seq_lens_q"], packed["cu_seq_lens"])
    assert seen["max_length_q"] == seen["max_length_k"] == packed["max_seq_len"]


def test_packed_rows_refused_where_rows_would_attend_to_each_other(tiny_bert_config, bert_tokenizer):
    model = MLCLEncoder.from_backbone(tiny_bert_config, pooling="mean", projection_dim=8)
    _, packed = _batches(bert_tokenizer)
    inputs = {k: v for k, v in packed.items() if k != "labels"}
    with pytest.raises(
        ValueError, match="need a decoder whose rows transformers keeps apart.*'bert' is not one"
    ):
        model(**inputs)


def _family(model_type: str, attention: str, **extra) -> MLCLEncoder:
    from transformers import AutoConfig

    sizes = dict(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8
    )
    config = AutoConfig.for_model(
        model_type,
        vocab_size=100,
        intermediate_size=64,
        pad_token_id=0,
        max_position_embeddings=64,
        **sizes,
        **extra,
    )
    torch.manual_seed(0)
    return MLCLEncoder.from_backbone(
        config, pooling="mean", projection_dim=8, attn_implementation=attention
    ).eval()


def _ragged_rows() -> tuple[dict, dict]:
    from hf_mlcl.data.collator import pack_rows

    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(3, 100, (n,), generator=g) for n in (5, 9, 3, 7)]
    ids = torch.zeros(4, 9, dtype=torch.long)
    mask = torch.zeros(4, 9, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)], mask[i, : len(row)] = row, 1
    padded = {"input_ids": ids, "attention_mask": mask}
    return padded, pack_rows(padded)


# transformers runs Gemma-2 with eager attention only
FAMILY_KERNELS = [
    (t, a) for t in sorted(PACKED_ROW_MODEL_TYPES) for a in ("sdpa", "eager") if (t, a) != ("gemma2", "sdpa")
]


@pytest.mark.parametrize("model_type,attention", FAMILY_KERNELS)
def test_every_family_named_for_packed_rows_keeps_them_apart(model_type, attention):
    model = _family(model_type, attention)
    padded, packed = _ragged_rows()
    with torch.no_grad():
        torch.testing.assert_close(model(**packed).pooled, model(**padded).pooled, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "model_type,extra,named",
    [("opt", {}, "'opt' is not one"), ("llama", {"is_causal": False}, "is_causal false")],
)
def test_decoders_whose_packed_rows_attend_to_each_other_are_refused(model_type, extra, named, monkeypatch):
    """OPT builds its mask without the position ids; a Llama with is_causal false gets a bidirectional mask:
    in both, packed rows would attend to each other (seen here with the check off), so they are refused."""
    model = _family(model_type, "sdpa", **extra)
    padded, packed = _ragged_rows()
    with torch.no_grad():
        reference = model(**padded).pooled
        with monkeypatch.context() as patch:
            patch.setattr(model, "check_padding_free", lambda: None)
            leaked = model(**packed).pooled
    assert not torch.allclose(leaked, reference, atol=1e-3)
    with pytest.raises(ValueError, match=named):
        model(**packed)


@pytest.mark.slow  # flex attention compiles its kernel first (tens of seconds on 2 cores)
def test_packed_rows_on_flex_attention_give_the_padded_outputs(tiny_llama_config, llama_tokenizer):
    """flex_attention (the kernel that attends row by row without flash-attn; forward only on a CPU)."""
    torch.manual_seed(0)
    padded_model = MLCLEncoder.from_backbone(tiny_llama_config, pooling="mean", projection_dim=8).eval()
    flex = MLCLEncoder.from_backbone(
        tiny_llama_config, pooling="mean", projection_dim=8, attn_implementation="flex_attention"
    ).eval()
    flex.load_state_dict(padded_model.state_dict())
    assert flex.backbone.config._attn_implementation == "flex_attention"
    padded, packed = _batches(llama_tokenizer)
    with torch.no_grad():
        a = padded_model(**{k: v for k, v in padded.items() if k != "labels"}).embeddings
        b = flex(**{k: v for k, v in packed.items() if k != "labels"}).embeddings
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
