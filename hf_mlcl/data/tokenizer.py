"""Tokenizers: one trained on the fly (offline demo, tests, synthetic benchmarks), the pad-token policy, and the
class name tokenizers are saved under.

:func:`train_tokenizer` touches no Hub: the tokenizer is learned from the given texts with the
`tokenizers` library and wrapped in a `PreTrainedTokenizerFast`, so it saves and loads like any Hub
tokenizer. :func:`ensure_pad_token` is the one pad-token policy of hf_mlcl (decoder tokenizers have
none); the stages call it for every tokenizer. :func:`portable_tokenizer` makes a generic fast tokenizer save
under a class name every transformers version reads.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from torch import nn
from transformers import PreTrainedTokenizerFast

_STYLES = ("bert", "llama")
_GENERIC_FAST = PreTrainedTokenizerFast  # transformers 5 names this class TokenizersBackend
LLAMA3_PAD_TOKEN = "<|finetune_right_pad_id|>"


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2000,
    style: str = "bert",
    model_max_length: int = 512,
) -> PreTrainedTokenizerFast:
    """Learn a WordPiece (``style="bert"``) or byte-level BPE (``style="llama"``) tokenizer.

    ``bert``: lower-cased WordPiece with ``[CLS] text [SEP]`` framing and ``[PAD]`` id 0 (encoders
    with ``cls`` / ``mean`` pooling); its vocabulary is the characters plus the most frequent words
    (:func:`_wordpiece_vocab`), identical in every process for the same texts. ``llama``: byte-level
    BPE with a ``<s>`` prefix, no ``</s>`` appended and a dedicated ``<pad>`` token, as decoder
    backbones with ``last_token`` pooling expect.
    The ``llama`` vocabulary comes from the `tokenizers` BPE trainer, whose tie-breaking between equally
    frequent pairs may differ between processes.
    """
    if style not in _STYLES:
        raise ValueError(f"unknown tokenizer style {style!r}; choose one of {_STYLES}")
    if vocab_size < 50:
        raise ValueError(f"vocab_size={vocab_size} is too small; use at least 50")
    texts = list(texts)
    if not texts:
        raise ValueError("train_tokenizer needs at least one text to learn a vocabulary from")

    if style == "bert":
        return _wrap_bert(
            _bert_tokenizer(models.WordPiece(vocab=_wordpiece_vocab(texts, vocab_size), unk_token="[UNK]")),
            model_max_length,
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
    return PortableTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=model_max_length,
    )


_BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _wordpiece_vocab(texts: list[str], vocab_size: int) -> dict[str, int]:
    """A deterministic WordPiece vocabulary: specials, every character seen (word-initial and ``##``
    continuation), then the most frequent whole words (ties broken alphabetically) up to ``vocab_size``.

    The `tokenizers` WordPiece/BPE trainers break frequency ties in hash-map order, so the same texts give
    a different vocabulary in every process; this one is identical everywhere. Words outside the
    vocabulary fall back to character pieces (greedy longest match, as in BERT's WordPiece).
    """
    probe = _bert_tokenizer(models.WordPiece(vocab={"[UNK]": 0}, unk_token="[UNK]"))
    counts: Counter[str] = Counter()
    for text in texts:  # data preparation, once per run
        normalized = probe.normalizer.normalize_str(text)
        counts.update(word for word, _ in probe.pre_tokenizer.pre_tokenize_str(normalized))
    chars = sorted({c for word in counts for c in word})
    pieces = [*_BERT_SPECIALS, *chars, *(f"##{c}" for c in chars)]
    seen = set(pieces)
    budget = max(vocab_size - len(pieces), 0)
    ranked = sorted((w for w in counts if w not in seen), key=lambda w: (-counts[w], w))
    return {tok: i for i, tok in enumerate([*pieces, *ranked[:budget]])}


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
    return PortableTokenizerFast(
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

    Use it where the vocabulary must not depend on a training corpus at all (tests, fixed-vocabulary
    corpora); :func:`train_tokenizer` learns subwords from texts.
    """
    vocab_words = sorted({w.lower() for w in words} - set(_BERT_SPECIALS))
    if not vocab_words:
        raise ValueError("word_level_tokenizer needs at least one word")
    vocab = {tok: i for i, tok in enumerate([*_BERT_SPECIALS, *vocab_words])}
    return _wrap_bert(_bert_tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]")), model_max_length)


def ensure_pad_token(tokenizer: Any, config: Any = None) -> int:
    """Give ``tokenizer`` a pad token and write its id into ``config.pad_token_id``.

    Uses Llama-3.1's reserved ``<|finetune_right_pad_id|>`` when the vocabulary has it, else the EOS
    token (padding is masked, so the choice only has to be a valid id). ``config`` may be a backbone
    config, an ``MLCLConfig`` (its ``backbone_config`` dict is updated as well) or a model (its
    ``config`` and, for hf_mlcl models, its backbone's config are updated). Returns the pad id.
    """
    if tokenizer.pad_token is None:
        vocab = tokenizer.get_vocab()
        if LLAMA3_PAD_TOKEN in vocab:
            tokenizer.pad_token = LLAMA3_PAD_TOKEN
        elif tokenizer.eos_token is not None:
            tokenizer.pad_token = tokenizer.eos_token
        else:
            raise ValueError(
                "the tokenizer has no pad, no Llama-3 reserved pad and no EOS token; add one with "
                "tokenizer.add_special_tokens({'pad_token': '<pad>'}) and resize the embeddings"
            )
    pad_id = int(tokenizer.pad_token_id)
    if config is not None:
        targets = [config]
        if isinstance(config, nn.Module):
            targets = [config.config]
            backbone = getattr(config, "backbone", None)
            if backbone is not None:
                targets.append(backbone.config)
        for cfg in targets:
            cfg.pad_token_id = pad_id
            if isinstance(getattr(cfg, "backbone_config", None), dict):
                cfg.backbone_config["pad_token_id"] = pad_id
    return pad_id


class PortableTokenizerFast(_GENERIC_FAST):
    """The generic fast tokenizer, saved with ``"tokenizer_class": "PreTrainedTokenizerFast"``.

    transformers 5 writes the generic class as ``TokenizersBackend``, a name transformers 4.x cannot load; the
    older name loads in both (5.x keeps it as an alias). Only the name written by ``save_pretrained`` changes.
    """


PortableTokenizerFast.__name__ = "PreTrainedTokenizerFast"  # the class name save_pretrained writes


def portable_tokenizer(tokenizer: Any) -> Any:
    """``tokenizer``, saved from now on under a class name every transformers version reads: a generic fast
    tokenizer (what ``AutoTokenizer`` gives for Llama-3's or a tokenizer trained on the fly) becomes a
    :class:`PortableTokenizerFast`; a model family's own class is left as it is.

    Example::

        tok = portable_tokenizer(AutoTokenizer.from_pretrained("meta-llama/Llama-3.1-8B"))
        tok.save_pretrained("out")  # tokenizer_config.json: "tokenizer_class": "PreTrainedTokenizerFast"
    """
    if type(tokenizer) is _GENERIC_FAST:
        tokenizer.__class__ = PortableTokenizerFast
    return tokenizer
