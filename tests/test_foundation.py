"""The shared pieces: on-the-fly tokenizers and the argument dataclasses."""

import pytest
from transformers import HfArgumentParser

from hf_mlcl.data.tokenizer import train_tokenizer
from hf_mlcl.training.arguments import (
    ContrastiveTrainingArguments,
    DataArguments,
    ModelArguments,
    ProbingTrainingArguments,
)


def test_bert_style_tokenizer_frames_with_cls_sep(bert_tokenizer):
    ids = bert_tokenizer("chest pain")["input_ids"]
    assert ids[0] == bert_tokenizer.cls_token_id and ids[-1] == bert_tokenizer.sep_token_id
    assert bert_tokenizer.pad_token_id == 0
    assert bert_tokenizer.decode(ids, skip_special_tokens=True) == "chest pain"


def test_llama_style_tokenizer_has_bos_and_distinct_pad(llama_tokenizer):
    ids = llama_tokenizer("chest pain")["input_ids"]
    assert ids[0] == llama_tokenizer.bos_token_id
    assert llama_tokenizer.pad_token_id not in ids
    assert llama_tokenizer.decode(ids, skip_special_tokens=True).strip() == "chest pain"


def test_tokenizer_bad_input():
    with pytest.raises(ValueError, match="style"):
        train_tokenizer(["a b"], style="gpt")
    with pytest.raises(ValueError, match="at least one text"):
        train_tokenizer([])


def test_arguments_from_dict_and_command_line(tmp_path):
    parser = HfArgumentParser((ModelArguments, DataArguments, ContrastiveTrainingArguments))
    _, data, args = parser.parse_dict(
        {"output_dir": str(tmp_path), "loss": "msc", "loss_kwargs": {"beta": 0.1}, "dataset_options": {"top": 50}}
    )
    assert args.loss_kwargs == {"beta": 0.1} and data.dataset_options == {"top": 50}
    _, _, args = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--loss_kwargs", '{"beta": 0.2}', "--n_views", "2"]
    )
    assert args.loss_kwargs == {"beta": 0.2} and args.n_views == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [({"n_views": 3}, "n_views"), ({"queue_size": -1}, "queue_size"), ({"loss_kwargs": "[1]"}, "JSON object")],
)
def test_contrastive_arguments_reject_bad_values(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        ContrastiveTrainingArguments(output_dir=str(tmp_path), **kwargs)


def test_probing_threshold_values(tmp_path):
    assert ProbingTrainingArguments(output_dir=str(tmp_path), threshold="0.3").fixed_threshold == 0.3
    assert ProbingTrainingArguments(output_dir=str(tmp_path), threshold="per_label").fixed_threshold is None
    with pytest.raises(ValueError, match="threshold"):
        ProbingTrainingArguments(output_dir=str(tmp_path), threshold="best")
    with pytest.raises(ValueError, match="probe"):
        ProbingTrainingArguments(output_dir=str(tmp_path), probe="svm")


def test_word_level_tokenizer_is_fixed_and_frames_like_bert():
    from hf_mlcl.data.tokenizer import word_level_tokenizer

    tok = word_level_tokenizer(["Heart", "kidney", "heart"])
    assert len(tok) == 5 + 2 and tok.pad_token_id == 0
    ids = tok("heart kidney lung")["input_ids"]
    assert ids == [tok.cls_token_id, 5, 6, tok.unk_token_id, tok.sep_token_id]
    assert word_level_tokenizer(["kidney", "heart"]).get_vocab() == tok.get_vocab()
    with pytest.raises(ValueError, match="at least one word"):
        word_level_tokenizer([])
