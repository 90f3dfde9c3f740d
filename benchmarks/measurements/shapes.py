"""The model shapes the measurements and benchmarks/memory_plan.py build from (published configs, toy sizes),
torch-free so that the memory model imports them without a framework; and a decoder block's linear layers."""

from __future__ import annotations

from typing import Any

# Llama-3.1-8B (Grattafiori et al., 2024; the config of meta-llama/Llama-3.1-8B).
LLAMA_31_8B: dict[str, Any] = dict(
    hidden_size=4096,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    intermediate_size=14336,
    vocab_size=128256,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    bos_token_id=128000,
    eos_token_id=128001,
    pad_token_id=128004,
    rope_scaling={
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
)
LLAMA_TINY: dict[str, Any] = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=1000,
    max_position_embeddings=4096,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# all-MiniLM-L6-v2's BERT (sentence-transformers/all-MiniLM-L6-v2 config.json).
MINILM_L6: dict[str, Any] = dict(
    model_type="bert",
    vocab_size=30522,
    hidden_size=384,
    num_hidden_layers=6,
    num_attention_heads=12,
    intermediate_size=1536,
    max_position_embeddings=512,
)
# FacebookAI/roberta-base config.json.
ROBERTA_BASE: dict[str, Any] = dict(
    model_type="roberta",
    vocab_size=50265,
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=514,
    type_vocab_size=1,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    layer_norm_eps=1e-5,
)
BERT_TINY: dict[str, Any] = dict(
    model_type="bert",
    vocab_size=1000,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=512,
)


def decoder_linears(shape: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of one Llama-family block, by module name."""
    h, inter = shape["hidden_size"], shape["intermediate_size"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    return {
        "q_proj": (h, h),
        "k_proj": (h, kv),
        "v_proj": (h, kv),
        "o_proj": (h, h),
        "gate_proj": (h, inter),
        "up_proj": (h, inter),
        "down_proj": (inter, h),
    }
