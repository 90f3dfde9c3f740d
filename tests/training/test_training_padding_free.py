"""``padding_free`` runs: stage 1 (a queue and its momentum encoder), the BCE fine-tune and a linear probe on cached
features of a LoRA Llama train step for step as on padded batches, and the settings that cannot take packed rows
stop before training."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from hf_mlcl.training import (
    ContrastiveTrainingArguments,
    DataArguments,
    ModelArguments,
    ProbingTrainingArguments,
    train_contrastive,
    train_probe,
)

LLAMA = {
    "model_type": "llama",
    "vocab_size": 150,
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 32,
    "max_position_embeddings": 64,
}


def _model_args(config: dict = LLAMA, **kw) -> ModelArguments:
    kw = {"pooling": "last_token", "projection_dim": 8, **kw}
    return ModelArguments(
        backbone_config=config, use_lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0, **kw
    )


def _data_args(padding_free: bool) -> DataArguments:
    opts = {
        "num_labels": 5,
        "num_train": 24,
        "num_validation": 8,
        "num_test": 8,
        "min_words": 3,
        "max_words": 14,
    }
    return DataArguments(
        dataset="synthetic", dataset_options=json.dumps(opts), max_length=20, padding_free=padding_free
    )


def _common(tmp_path, name: str) -> dict:
    return dict(
        output_dir=str(tmp_path / name),
        per_device_train_batch_size=8,
        max_steps=3,
        learning_rate=1e-2,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        save_strategy="no",
        seed=7,
    )


def _losses(trainer) -> list[float]:
    return [row["loss"] for row in trainer.state.log_history if "loss" in row]


def _trained(trainer) -> dict[str, torch.Tensor]:
    model = trainer.accelerator.unwrap_model(trainer.model)
    return {k: p.detach().clone() for k, p in model.named_parameters() if p.requires_grad}


def test_stage_one_with_a_queue_and_the_fine_tune_train_as_on_padded_batches(tmp_path):
    runs = {}
    for packed in (False, True):
        name = "packed" if packed else "padded"
        attention = {"attn_implementation": "eager"} if packed else {}  # the packed runs on another kernel
        args = ContrastiveTrainingArguments(
            **_common(tmp_path, f"{name}-enc"), loss="msc", queue_size=16, knn_k=0
        )
        stage1 = train_contrastive(_model_args(**attention), _data_args(packed), args).trainer
        pargs = ProbingTrainingArguments(**_common(tmp_path, f"{name}-clf"), probe="finetune", loss="bce")
        stage2 = train_probe(
            _model_args(**attention), _data_args(packed), pargs, str(tmp_path / f"{name}-enc")
        ).trainer
        # a frozen probe on cached features: the encoding pass reads padded rows, its training the features
        largs = ProbingTrainingArguments(
            **_common(tmp_path, f"{name}-lin"), probe="linear", cache_features=True
        )
        linear = train_probe(
            _model_args(**attention), _data_args(packed), largs, str(tmp_path / f"{name}-enc")
        ).trainer
        runs[packed] = (stage1, stage2, linear)
    for stage in (0, 1, 2):
        padded, packed = runs[False][stage], runs[True][stage]
        assert len(_losses(packed)) == 3
        assert _losses(packed) == pytest.approx(_losses(padded), rel=1e-4)
        ref = _trained(padded)
        for key, value in _trained(packed).items():
            torch.testing.assert_close(value, ref[key], rtol=1e-3, atol=1e-5)
    for trainer in runs[
        True
    ]:  # attn_implementation reaches the backbone built, and the one loaded in stage 2
        model = trainer.accelerator.unwrap_model(trainer.model)
        model = model.get_base_model() if hasattr(model, "get_base_model") else model  # a LoRA PeftModel
        assert model.backbone.config._attn_implementation == "eager"
    batch = next(iter(runs[True][0].get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 1 and batch["cu_seq_lens"].shape == (9,)


def test_padding_free_stops_before_loading_where_rows_cannot_be_packed(tmp_path, monkeypatch, bert_tokenizer):
    """The stage functions check the arguments and the backbone's family (read from its config) first."""
    from transformers import BertConfig, BertModel

    import hf_mlcl.training.classifier_stages as classifier_stages
    import hf_mlcl.training.encoder_stage as encoder_stage

    def no_loading(*args, **kwargs):
        raise AssertionError("the data were loaded before the check")

    monkeypatch.setattr(encoder_stage, "load_run_data", no_loading)
    monkeypatch.setattr(classifier_stages, "load_run_data", no_loading)
    gradcache = ContrastiveTrainingArguments(
        **_common(tmp_path, "gc"), loss="sd", gradcache_chunk_size=4, knn_k=0
    )
    with pytest.raises(ValueError, match="cannot be split into GradCache chunks"):
        train_contrastive(_model_args(), _data_args(True), gradcache)
    bert = {k: v for k, v in LLAMA.items() if k != "num_key_value_heads"} | {"model_type": "bert"}
    args = ContrastiveTrainingArguments(**_common(tmp_path, "bert"), loss="sd", knn_k=0)
    with pytest.raises(ValueError, match="need a decoder whose rows.*'bert' is not one"):
        train_contrastive(_model_args(bert, pooling="mean"), _data_args(True), args)
    saved = tmp_path / "bert-base"  # a backbone folder, read from its config.json in stage 2
    BertModel(
        BertConfig(
            vocab_size=len(bert_tokenizer),
            **{k: LLAMA[k] for k in ("hidden_size", "intermediate_size")},
            num_hidden_layers=1,
            num_attention_heads=2,
        )
    ).save_pretrained(saved)
    pargs = ProbingTrainingArguments(**_common(tmp_path, "clf"), probe="finetune", loss="bce")
    with pytest.raises(ValueError, match="'bert' is not one"):
        train_probe(_model_args(pooling="mean"), _data_args(True), pargs, str(saved))


def test_the_trainer_refuses_packed_batches_it_would_split_by_rows(tmp_path):
    """A ContrastiveTrainer built directly (no stage function) with a packing collator: GradCache would run one
    chunk of the whole batch, a queue with two views would slice an empty anchor batch."""
    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.modeling.builders import build_tokenizer_and_encoder
    from hf_mlcl.training import ContrastiveTrainer, load_run_data

    data = load_run_data(_data_args(True))
    tok, encoder = build_tokenizer_and_encoder(_model_args(), data.dataset["train"]["text"], 8)
    for extra, message in (
        ({"gradcache_chunk_size": 2}, "cannot be split into GradCache chunks"),
        ({"n_views": 2, "queue_size": 16}, "with a queue need n_views 1"),
    ):
        args = ContrastiveTrainingArguments(**_common(tmp_path, "direct"), loss="sd", knn_k=0, **extra)
        packing = MultiLabelCollator(tok, 5, n_views=args.n_views, padding_free=True)
        with pytest.raises(ValueError, match=message):
            ContrastiveTrainer(
                model=encoder, args=args, train_dataset=data.dataset["train"], data_collator=packing
            )


def test_length_grouped_batches_warn_that_they_change_the_contrast_sets(tmp_path):
    from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer

    from hf_mlcl.training import ContrastiveTrainer

    tok = tiny_tokenizer()
    for strategy, warned in (("group_by_length", True), ("random", False)):
        args = base_args(tmp_path, loss="sd", train_sampling_strategy=strategy)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            ContrastiveTrainer(
                model=tiny_encoder(tok), args=args, train_dataset=tiny_split(8), data_collator=collator(tok)
            )
        assert (
            any("contrast set then depends on the texts' lengths" in str(w.message) for w in seen) == warned
        )
