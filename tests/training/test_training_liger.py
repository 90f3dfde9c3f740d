"""``use_liger_kernel``: the hf_mlcl trainers hand Liger-Kernel the backbone (Trainer alone would pass the
wrapper, whose model type Liger has no kernels for), with the language-model head's kernels off."""

from __future__ import annotations

import sys
import types

import pytest
import transformers.integrations.liger as hf_liger
from _training_helpers import base_args, collator, tiny_split, tiny_tokenizer
from transformers import LlamaConfig

from hf_mlcl.modeling import MLCLEncoder
from hf_mlcl.modeling.lora import apply_lora
from hf_mlcl.training import ContrastiveTrainer


def _llama_encoder(tok) -> MLCLEncoder:
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=32,
        pad_token_id=tok.pad_token_id,
    )
    return MLCLEncoder.from_backbone(config, pooling="last_token", projection_dim=8)


@pytest.mark.parametrize("lora", [False, True])
def test_liger_gets_the_backbone_with_the_head_kernels_off(tmp_path, monkeypatch, lora):
    calls = []
    stub = types.ModuleType("liger_kernel.transformers")
    stub._apply_liger_kernel_to_instance = lambda model, **kw: calls.append((model, kw))
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", stub)
    monkeypatch.setattr(hf_liger, "is_liger_kernel_available", lambda: True)
    tok = tiny_tokenizer()
    encoder = _llama_encoder(tok)
    model = apply_lora(encoder, r=2, alpha=4) if lora else encoder
    args = base_args(tmp_path, loss="sd", use_liger_kernel=True, liger_kernel_config={"rope": False})
    ContrastiveTrainer(model=model, args=args, train_dataset=tiny_split(8), data_collator=collator(tok))
    assert len(calls) == 1
    patched, options = calls[0]
    assert patched is encoder.backbone and type(patched).__name__ == "LlamaModel"
    assert options == {"rope": False, "fused_linear_cross_entropy": False, "cross_entropy": False}


def test_liger_missing_stops_before_training(tmp_path):
    if hf_liger.is_liger_kernel_available():
        pytest.skip("liger-kernel is installed here")
    tok = tiny_tokenizer()
    args = base_args(tmp_path, loss="sd", use_liger_kernel=True)
    with pytest.raises(ImportError, match="liger-kernel"):
        ContrastiveTrainer(
            model=_llama_encoder(tok), args=args, train_dataset=tiny_split(8), data_collator=collator(tok)
        )
