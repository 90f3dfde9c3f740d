"""A PLM-ICD recipe (head: label_attention) must give a segmented contrastive encoder (DESIGN: the
document embedding is the masked mean over all segment tokens), and other heads a plain one."""

import pytest

from hf_mlcl.modeling.builders import build_tokenizer_and_encoder
from hf_mlcl.training.arguments import ModelArguments


@pytest.mark.parametrize("head, segmented", [("label_attention", True), ("linear", False)])
def test_head_decides_segmented_encoder(corpus, head, segmented):
    args = ModelArguments(
        backbone_config={
            "model_type": "bert",
            "hidden_size": 32,
            "num_hidden_layers": 1,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "vocab_size": 200,
        },
        head=head,
        chunk_size=16,
    )
    _, encoder = build_tokenizer_and_encoder(args, projection_dim=8, train_texts=corpus)
    assert bool(encoder.config.segmented) is segmented
    assert encoder.config.chunk_size == 16
