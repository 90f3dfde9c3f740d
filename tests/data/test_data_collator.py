"""MultiLabelCollator and tokenize_dataset."""

from __future__ import annotations

import copy

import pytest
import torch

from hf_mlcl.data import MultiLabelCollator, make_synthetic_corpus, tokenize_dataset

EXAMPLES = [
    {"text": "the patient was admitted with chest pain", "labels": [0, 3], "id": "a", "extra": 1.5},
    {"text": "graph neural network", "labels": [2], "id": "b", "extra": 2.5},
    {"text": "joy", "labels": [], "id": "c", "extra": 0.0},
]
DENSE = torch.tensor([[1, 0, 0, 1, 0], [0, 0, 1, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.float32)


def test_dense_labels_and_tokens(bert_tokenizer):
    batch = MultiLabelCollator(bert_tokenizer, num_labels=5)(EXAMPLES)
    assert (
        set(batch) >= {"input_ids", "attention_mask", "labels"} and "extra" not in batch and "id" not in batch
    )
    assert batch["labels"].dtype == torch.float32 and torch.equal(batch["labels"], DENSE)
    ref = bert_tokenizer([e["text"] for e in EXAMPLES], padding=True, return_tensors="pt")
    assert torch.equal(batch["input_ids"], ref["input_ids"])
    assert torch.equal(batch["attention_mask"], ref["attention_mask"])
    if "token_type_ids" in ref:
        assert torch.equal(batch["token_type_ids"], ref["token_type_ids"])


def test_sparse_labels_match_dense(bert_tokenizer):
    batch = MultiLabelCollator(bert_tokenizer, num_labels=5, label_format="sparse")(EXAMPLES)
    assert batch["labels"].is_sparse and batch["labels"].shape == (3, 5)
    assert torch.equal(batch["labels"].to_dense(), DENSE)


def test_id_labels_are_padded_ids_of_at_least_one_column(bert_tokenizer):
    batch = MultiLabelCollator(bert_tokenizer, num_labels=5, label_format="ids")(EXAMPLES)
    assert batch["labels"].dtype == torch.int64 and batch["labels"].tolist() == [[0, 3], [2, -1], [-1, -1]]
    none = MultiLabelCollator(bert_tokenizer, num_labels=5, label_format="ids")([EXAMPLES[2]])
    assert none["labels"].tolist() == [[-1]]  # no label in the batch: still one column
    rows = [{"text": "a b", "labels": [0.0, 1.0, 0.0, 1.0, 1.0]}, {"text": "c", "labels": [0.0] * 5}]
    floats = MultiLabelCollator(bert_tokenizer, num_labels=5, label_format="ids")(rows)
    assert floats["labels"].tolist() == [[1, 3, 4], [-1, -1, -1]]
    with pytest.raises(ValueError, match="label id 7"):
        MultiLabelCollator(bert_tokenizer, num_labels=5, label_format="ids")([{"text": "x", "labels": [7]}])
    with pytest.raises(ValueError, match="label_format must be one of"):
        MultiLabelCollator(bert_tokenizer, num_labels=5, label_format="csr")


@pytest.mark.parametrize("label_format", ["dense", "sparse"])
def test_two_views(bert_tokenizer, label_format):
    one = MultiLabelCollator(bert_tokenizer, num_labels=5)(EXAMPLES)
    two = MultiLabelCollator(bert_tokenizer, num_labels=5, n_views=2, label_format=label_format)(EXAMPLES)
    for key in one:
        assert two[key].shape[0] == 6
    labels = two["labels"].to_dense() if label_format == "sparse" else two["labels"]
    assert torch.equal(labels[:3], DENSE) and torch.equal(labels[3:], DENSE)
    assert torch.equal(two["input_ids"][:3], one["input_ids"]) and torch.equal(
        two["input_ids"][3:], one["input_ids"]
    )


def test_truncation_and_chunk_padding(bert_tokenizer):
    long_text = " ".join(["chest pain"] * 2000)  # > 3,072 tokens
    ex = [{"text": long_text, "labels": [1]}, {"text": "chest pain", "labels": [0]}]
    batch = MultiLabelCollator(bert_tokenizer, num_labels=2, max_length=3072, pad_to_multiple_of=128)(ex)
    assert batch["input_ids"].shape == (2, 3072)
    assert batch["attention_mask"][0].all() and batch["attention_mask"][1].sum() < 10
    short = MultiLabelCollator(bert_tokenizer, num_labels=2, max_length=3072, pad_to_multiple_of=128)(ex[1:])
    assert short["input_ids"].shape == (1, 128)
    mid = [{"text": " ".join(["chest pain"] * 100), "labels": [0]}]
    n = len(bert_tokenizer(mid[0]["text"])["input_ids"])
    assert 128 < n < 3072 and n % 128
    out = MultiLabelCollator(bert_tokenizer, 2, max_length=3072, pad_to_multiple_of=128)(mid)
    assert out["input_ids"].shape[1] == (n // 128 + 1) * 128 and out["attention_mask"].sum() == n
    static = MultiLabelCollator(bert_tokenizer, 2, max_length=256, padding="max_length")(ex)
    assert static["input_ids"].shape == (2, 256)
    with pytest.raises(ValueError, match="multiple"):
        MultiLabelCollator(bert_tokenizer, 2, max_length=300, padding="max_length", pad_to_multiple_of=128)
    with pytest.raises(ValueError, match="multiple"):  # the tokenizer refuses it too when padding the longest
        MultiLabelCollator(bert_tokenizer, 2, max_length=300, pad_to_multiple_of=128)


def test_pretokenized_inputs(bert_tokenizer, llama_tokenizer):
    for tok in (bert_tokenizer, llama_tokenizer):
        enc = tok([e["text"] for e in EXAMPLES])
        pre = [
            {"input_ids": enc["input_ids"][i], "labels": e["labels"], "text_unused": 1}
            for i, e in enumerate(EXAMPLES)
        ]
        n_short = len(enc["input_ids"][2])
        m = n_short + 2  # truncates the long first text, pads the short third one
        assert len(enc["input_ids"][0]) > m
        batch = MultiLabelCollator(tok, num_labels=5, max_length=m)(pre)
        assert batch["input_ids"].shape == (3, m) and torch.equal(batch["labels"], DENSE)
        # truncated as the tokenizer truncates the text (keeping BERT's final [SEP]), on either side
        assert (
            batch["input_ids"][0].tolist()
            == tok(EXAMPLES[0]["text"], truncation=True, max_length=m)["input_ids"]
        )
        side = copy.deepcopy(tok)
        side.truncation_side = "left"
        left = MultiLabelCollator(side, num_labels=5, max_length=m)(pre)["input_ids"][0].tolist()
        assert left == side(EXAMPLES[0]["text"], truncation=True, max_length=m)["input_ids"]
        assert batch["attention_mask"][2].tolist() == [1] * n_short + [0, 0]
        assert (batch["input_ids"][2, n_short:] == tok.pad_token_id).all()


def test_errors(bert_tokenizer):
    col = MultiLabelCollator(bert_tokenizer, num_labels=3)
    with pytest.raises(ValueError, match="label id 3 is outside \\[0, num_labels=3\\)"):
        col(EXAMPLES)
    with pytest.raises(ValueError, match="label column 'labels'"):
        col([{"text": "x"}])
    with pytest.raises(ValueError, match="neither 'text' nor 'input_ids'"):
        col([{"sentence": "x", "labels": [0]}])
    with pytest.raises(ValueError, match="empty batch"):
        col([])
    with pytest.raises(ValueError, match="label_format"):
        MultiLabelCollator(bert_tokenizer, 3, label_format="csr")
    with pytest.raises(ValueError, match="n_views"):
        MultiLabelCollator(bert_tokenizer, 3, n_views=0)
    unlabeled = MultiLabelCollator(bert_tokenizer, num_labels=3, label_column=None)([{"text": "x"}])
    assert "labels" not in unlabeled
    custom = MultiLabelCollator(bert_tokenizer, 5, text_column="sentence", label_column="y")(
        [{"sentence": "chest pain", "y": [4]}]
    )
    assert custom["labels"].tolist() == [[0, 0, 0, 0, 1]]


def test_tokenize_dataset_then_collate(bert_tokenizer, tmp_path):
    dd = make_synthetic_corpus(num_labels=6, num_train=40, num_validation=8, num_test=8, seed=3)
    tok = tokenize_dataset(dd, bert_tokenizer, max_length=16)
    assert set(tok["train"].column_names) == {"input_ids", "attention_mask", "labels"} | (
        {"token_type_ids"} if "token_type_ids" in tok["train"].column_names else set()
    )
    assert max(len(x) for x in tok["train"]["input_ids"]) == 16
    assert tok["train"].features["labels"] == dd["train"].features["labels"]
    batch = MultiLabelCollator(bert_tokenizer, num_labels=6, max_length=16)(
        [tok["train"][i] for i in range(4)]
    )
    on_the_fly = MultiLabelCollator(bert_tokenizer, num_labels=6, max_length=16)(
        [dd["train"][i] for i in range(4)]
    )
    for key in on_the_fly:
        assert torch.equal(batch[key], on_the_fly[key]), key
    kept = tokenize_dataset(dd["test"], bert_tokenizer, max_length=8, keep_text=True)
    assert "text" in kept.column_names
    with pytest.raises(ValueError, match="no text column 'body'"):
        tokenize_dataset(dd, bert_tokenizer, text_column="body")


def test_pretokenized_numpy_format_ids_only_and_left_padding(bert_tokenizer, llama_tokenizer):
    dd = make_synthetic_corpus(num_labels=6, num_train=12, num_validation=2, num_test=2, seed=4)
    ids_only = tokenize_dataset(dd["train"], bert_tokenizer, max_length=64, model_inputs=("input_ids",))
    assert ids_only.column_names == ["labels", "input_ids"] or set(ids_only.column_names) == {
        "labels",
        "input_ids",
    }
    col = MultiLabelCollator(bert_tokenizer, num_labels=6, max_length=64, pad_to_multiple_of=16)
    ref = col([dd["train"][i] for i in range(5)])
    for fmt in (None, "numpy", "torch"):
        rows = ids_only.with_format(fmt)
        got = col([rows[i] for i in range(5)])
        assert got.keys() == ref.keys() and got["input_ids"].shape[1] % 16 == 0
        for key in ref:
            assert torch.equal(got[key], ref[key]), key
    llama_tokenizer.padding_side = "left"
    try:
        enc = llama_tokenizer(["joy", "graph neural network learning"])
        pre = [{"input_ids": enc["input_ids"][i], "labels": [0]} for i in range(2)]
        out = MultiLabelCollator(llama_tokenizer, num_labels=1)(pre)
        ref = llama_tokenizer.pad({"input_ids": enc["input_ids"]}, return_tensors="pt")
        assert torch.equal(out["input_ids"], ref["input_ids"]) and torch.equal(
            out["attention_mask"], ref["attention_mask"]
        )
        assert out["attention_mask"][0, 0] == 0 and out["input_ids"][0, -1] != llama_tokenizer.pad_token_id
    finally:
        llama_tokenizer.padding_side = "right"


@pytest.mark.parametrize("pretokenized", [False, True])
def test_unpadded_batch_drops_the_attention_mask(bert_tokenizer, tiny_bert_config, pretokenized):
    from transformers import BertForSequenceClassification

    from hf_mlcl.host_sync import HostSyncCounter
    from hf_mlcl.labels.host_reads import accelerator_path

    long_text = " ".join(["chest pain"] * 50)
    rows = [{"text": long_text, "labels": [0]}, {"text": long_text + " joy", "labels": [1]}]
    if pretokenized:
        rows = [{"input_ids": bert_tokenizer(r["text"])["input_ids"], "labels": r["labels"]} for r in rows]
    col = MultiLabelCollator(bert_tokenizer, num_labels=2, max_length=16, n_views=2)
    unpadded = col(rows)  # both rows truncated at 16: no padding anywhere
    assert "attention_mask" not in unpadded and unpadded["input_ids"].shape == (4, 16)
    kept = MultiLabelCollator(
        bert_tokenizer, 2, max_length=16, n_views=2, drop_unpadded_attention_mask=False
    )(rows)
    assert kept["attention_mask"].shape == (4, 16) and bool(kept["attention_mask"].all())
    assert all(torch.equal(kept[k], unpadded[k]) for k in unpadded)
    padded = col(
        rows + [{"input_ids": [5, 6], "labels": [0]} if pretokenized else {"text": "joy", "labels": [0]}]
    )
    assert padded["attention_mask"].shape == padded["input_ids"].shape and not bool(
        padded["attention_mask"].all()
    )

    # the same logits without the mask, and without transformers' host read of it (padding_mask.all())
    model = BertForSequenceClassification(tiny_bert_config).eval()
    model.config._attn_implementation = "sdpa"
    inputs = {k: v for k, v in kept.items() if k != "labels"}
    with torch.no_grad(), accelerator_path(), HostSyncCounter() as with_mask:
        ref = model(**inputs).logits
    with torch.no_grad(), accelerator_path(), HostSyncCounter() as without_mask:
        got = model(**{k: v for k, v in unpadded.items() if k != "labels"}).logits
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-6)
    assert with_mask.count == 1 and without_mask.count == 0, (with_mask.report(), without_mask.report())


def test_float_and_bool_multi_hot_rows_are_multi_hot_not_ids(bert_tokenizer):
    """The form transformers users pass ([0., 1., 0., 1.]) is a multi-hot row, not the label ids {0, 1}."""
    import numpy as np
    import pytest

    from hf_mlcl.data import MultiLabelCollator

    want = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    for rows in (
        [[0.0, 1.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0]],
        [[False, True, False, True], [True, False, False, False]],
        [np.array([0, 1, 0, 1], dtype=np.float32), np.array([1, 0, 0, 0], dtype=np.float32)],
    ):
        examples = [{"text": "a b", "labels": r} for r in rows]
        for fmt in ("dense", "sparse"):
            labels = MultiLabelCollator(bert_tokenizer, 4, label_format=fmt)(examples)["labels"]
            assert torch.equal(labels.to_dense() if fmt == "sparse" else labels, want)
    ids = MultiLabelCollator(bert_tokenizer, 4)([{"text": "a", "labels": [0, 1]}])["labels"]
    assert ids.tolist() == [[1.0, 1.0, 0.0, 0.0]]  # integer lists stay ids
    # num_labels integers 0 / 1 repeating a value are no id list: [0, 1, 0, 1] used to become labels {0, 1}
    examples = [{"text": "a b", "labels": r} for r in ([0, 1, 0, 1], np.array([1, 0, 0, 0]))]
    for fmt in ("dense", "sparse"):
        labels = MultiLabelCollator(bert_tokenizer, 4, label_format=fmt)(examples)["labels"]
        assert torch.equal(labels.to_dense() if fmt == "sparse" else labels, want)
    three = MultiLabelCollator(bert_tokenizer, 4)([{"text": "a", "labels": [0, 1, 3, 2]}])["labels"]
    assert three.tolist() == [[1.0, 1.0, 1.0, 1.0]]  # four distinct ids: an id list
    with pytest.raises(ValueError, match="must have num_labels=4 values"):
        MultiLabelCollator(bert_tokenizer, 4)([{"text": "a", "labels": [0.0, 1.0]}])
    with pytest.raises(ValueError, match="only 0 and 1"):
        MultiLabelCollator(bert_tokenizer, 4)([{"text": "a", "labels": [0.0, 0.5, 0.0, 1.0]}])
