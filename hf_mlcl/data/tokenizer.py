"""Train a small fast tokenizer on the fly (offline demo, tests, synthetic benchmarks).

Nothing here touches the Hub: the tokenizer is learned from the given texts with the `tokenizers`
library and wrapped in a `PreTrainedTokenizerFast`, so it saves and loads like any Hub tokenizer.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

_STYLES = ("bert", "llama")


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2000,
    style: str = "bert",
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """Learn a WordPiece (``style="bert"``) or byte-level BPE (``style="llama"``) tokenizer.

    ``bert``: lower-cased WordPiece with ``[CLS] text [SEP]`` framing and ``[PAD]`` id 0 (encoders
    with ``cls`` / ``mean`` pooling). ``llama``: byte-level BPE with a ``<s>`` prefix, no ``</s>``
    appended and a dedicated ``<pad>`` token, as decoder backbones with ``last_token`` pooling expect.
    """
    if style not in _STYLES:
        raise ValueError(f"unknown tokenizer style {style!r}; choose one of {_STYLES}")
    if vocab_size < 50:
        raise ValueError(f"vocab_size={vocab_size} is too small; use at least 50")
    texts = list(texts)
    if not texts:
        raise ValueError("train_tokenizer needs at least one text to learn a vocabulary from")

    if style == "bert":
        tok = _bert_tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=_BERT_SPECIALS)
        tok.train_from_iterator(texts, trainer=trainer)
        return _wrap_bert(tok, model_max_length)

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B:1", special_tokens=[("<s>", bos_id)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )


_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _bert_tokenizer(model: models.Model) -> Tokenizer:
    tok = Tokenizer(model)
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    return tok


def _wrap_bert(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    """``[CLS] text [SEP]`` framing and the HF wrapper with BERT's special tokens."""
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=model_max_length,
    )


def word_level_tokenizer(words: Iterable[str], model_max_length: int = 512) -> PreTrainedTokenizerFast:
    """A BERT-style tokenizer whose vocabulary is exactly ``words`` (lower-cased, sorted) plus the specials.

    Unlike :func:`train_tokenizer` — whose WordPiece trainer breaks frequency ties differently in every
    process, so the vocabulary (and every id) can change between runs on the same texts — this is fully
    deterministic: use it where runs must be reproducible bit for bit (tests, fixed-vocabulary corpora).
    """
    vocab_words = sorted({w.lower() for w in words} - set(_BERT_SPECIALS))
    if not vocab_words:
        raise ValueError("word_level_tokenizer needs at least one word")
    vocab = {tok: i for i, tok in enumerate([*_BERT_SPECIALS, *vocab_words])}
    return _wrap_bert(_bert_tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]")), model_max_length)
