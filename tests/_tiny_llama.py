"""The tiny random Llama base that the sharded-launch tests (FSDP, ZeRO-3) save and load from a folder."""

from __future__ import annotations

import os

import torch
from transformers import LlamaConfig, LlamaModel


def save_tiny_llama(folder, tokenizer, seed: int = 0) -> LlamaConfig:
    """Save a 2-layer random Llama (hidden size 64, grouped-query attention) drawn from ``seed`` with
    ``tokenizer`` to ``folder``; returns its config. Torch's global generator stays where the draw left it."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
    )
    LlamaModel(config).save_pretrained(os.fspath(folder))
    tokenizer.save_pretrained(os.fspath(folder))
    return config
