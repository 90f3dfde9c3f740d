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
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=specials)
        tok.train_from_iterator(texts, trainer=trainer)
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
