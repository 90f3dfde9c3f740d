"""The shared pieces: on-the-fly tokenizers and the argument dataclasses."""

import json
import pickle

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


_VOCAB_SCRIPT = """
import json, sys
from hf_mlcl.data.tokenizer import train_tokenizer
texts = [f"patient {w} reports {v} pain in the {w}{v} region number {i}" for i, (w, v) in enumerate(
    zip(["chest", "lower", "upper", "left", "right", "acute"] * 40, ["mild", "severe", "chronic", "sharp"] * 60))]
tok = train_tokenizer(texts, vocab_size=120, style=sys.argv[1])
print(json.dumps(sorted(tok.get_vocab().items())))
"""


def test_bert_tokenizer_is_identical_across_processes():
    """Same texts -> same vocabulary *and ids* in separate processes of different hash orders (the
    `tokenizers` trainers break ties in per-process hash order; this corpus has many equally frequent words
    and pairs)."""
    import json
    import os
    import subprocess
    import sys

    runs = [
        subprocess.Popen(
            [sys.executable, "-c", _VOCAB_SCRIPT, "bert"],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        for seed in ("1", "2", "random")
    ]
    outputs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0, 0]
    vocabs = [json.loads(out) for out in outputs]
    assert len(vocabs[0]) == 120 and vocabs[0] == vocabs[1] == vocabs[2]


def test_bert_tokenizer_vocabulary_and_segmentation():
    texts = ["the quick brown fox", "the lazy dog", "the quick dog", "a fox"]
    tok = train_tokenizer(texts, vocab_size=60)
    vocab = tok.get_vocab()
    assert tok.convert_tokens_to_ids(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]) == [0, 1, 2, 3, 4]
    chars = sorted(set("thequickbrownfoxlazydoga"))
    assert all(c in vocab and f"##{c}" in vocab for c in chars)
    # words ranked by frequency, ties alphabetical: "the" (3), then "dog"/"fox"/"quick" (2), then the rest
    words = [
        t
        for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])
        if len(t) > 1 and not t.startswith(("#", "["))
    ]
    assert words == ["the", "dog", "fox", "quick", "brown", "lazy"]
    assert tok.tokenize("The quick FOX") == ["the", "quick", "fox"]
    assert tok.tokenize("bloat") == ["b", "##l", "##o", "##a", "##t"]  # unseen word: character pieces
    assert tok.tokenize("zebra!") == ["z", "##e", "##b", "##r", "##a", "[UNK]"]  # "!" never seen
    small = train_tokenizer(texts, vocab_size=50)  # 5 specials + 2 x 21 characters leave room for 3 words
    assert len(chars) == 21 and len(small.get_vocab()) == 50
    assert [w for w in ("the", "dog", "fox", "quick") if w in small.get_vocab()] == ["the", "dog", "fox"]


def test_tokenizer_bad_input():
    with pytest.raises(ValueError, match="style"):
        train_tokenizer(["a b"], style="gpt")
    with pytest.raises(ValueError, match="at least one text"):
        train_tokenizer([])


@pytest.mark.parametrize("style", ["bert", "llama"])
def test_tokenizers_save_under_a_class_name_transformers_4_reads(style, tmp_path):
    """transformers 5 writes its generic fast tokenizer as "TokenizersBackend", which transformers 4.x cannot load;
    hf_mlcl's tokenizers, trained or reloaded, save as "PreTrainedTokenizerFast" and reload to the same ids."""
    from transformers import AutoTokenizer

    from hf_mlcl.data.tokenizer import portable_tokenizer

    texts = ["chest pain and fever", "the patient was admitted"] * 4
    trained = train_tokenizer(texts, vocab_size=80, style=style)
    trained.save_pretrained(tmp_path / "first")
    reloaded = AutoTokenizer.from_pretrained(tmp_path / "first")
    assert type(reloaded).__name__ == "TokenizersBackend"  # what transformers 5 makes of the name
    portable_tokenizer(reloaded).save_pretrained(tmp_path / "second")
    for folder in ("first", "second"):
        config = json.loads((tmp_path / folder / "tokenizer_config.json").read_text())
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast", folder
    assert reloaded("chest pain")["input_ids"] == trained("chest pain")["input_ids"]
    assert pickle.loads(pickle.dumps(reloaded))("fever")["input_ids"] == trained("fever")["input_ids"]


def test_portable_tokenizer_leaves_a_family_class_alone():
    from transformers import BertTokenizer

    from hf_mlcl.data.tokenizer import portable_tokenizer

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "chest", "pain"])}
    family = BertTokenizer(vocab=vocab)
    assert type(portable_tokenizer(family)) is BertTokenizer


def test_arguments_from_dict_and_command_line(tmp_path):
    parser = HfArgumentParser((ModelArguments, DataArguments, ContrastiveTrainingArguments))
    _, data, args = parser.parse_dict(
        {
            "output_dir": str(tmp_path),
            "loss": "msc",
            "loss_kwargs": {"beta": 0.1},
            "dataset_options": {"top": 50},
        }
    )
    assert args.loss_kwargs == {"beta": 0.1} and data.dataset_options == {"top": 50}
    _, _, args = parser.parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--loss", "msc", "--loss_kwargs", '{"beta": 0.2}', "--n_views", "2"]
    )
    assert args.loss_kwargs == {"beta": 0.2} and args.n_views == 2


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n_views": 3}, "n_views"),
        ({"queue_size": -1}, "queue_size"),
        ({"loss_kwargs": "[1]"}, "JSON object"),
    ],
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
