"""hf_mlcl losses in a plain transformers.Trainer through `compute_loss_func`: the same training as
ContrastiveTrainer (with and without gradient accumulation), any model with pooled embeddings, and
errors that name the problem."""

from __future__ import annotations

import pytest
import torch
from _training_helpers import base_args, collator, tiny_encoder, tiny_split, tiny_tokenizer
from transformers import Trainer, TrainingArguments

from hf_mlcl.integrations.trainer import ContrastiveLossFunc
from hf_mlcl.training import ContrastiveTrainer


def _plain_args(tmp_path, **kw):
    a = base_args(tmp_path, **kw)
    keep = {
        k: getattr(a, k)
        for k in (
            "per_device_train_batch_size",
            "max_steps",
            "learning_rate",
            "logging_steps",
            "max_grad_norm",
            "train_sampling_strategy",
            "seed",
            "gradient_accumulation_steps",
            "dataloader_drop_last",
        )
    }
    return TrainingArguments(
        output_dir=str(tmp_path / "plain"),
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        **keep,
    )


@pytest.mark.parametrize("loss,accumulation", [("sd", 1), ("mulsupcon", 2)])
def test_plain_trainer_matches_contrastive_trainer(tmp_path, loss, accumulation):
    tok, train = tiny_tokenizer(), tiny_split(32)
    kw = dict(max_steps=3, gradient_accumulation_steps=accumulation, loss=loss)
    ref_model = tiny_encoder(tok, seed=0)
    ref = ContrastiveTrainer(
        model=ref_model,
        args=base_args(tmp_path / "ref", **kw),
        train_dataset=train,
        data_collator=collator(tok),
        processing_class=tok,
        num_labels=4,
    )
    ref_out = ref.train()
    model = tiny_encoder(tok, seed=0)
    kw.pop("loss")
    plain = Trainer(
        model=model,
        args=_plain_args(tmp_path, **kw),
        train_dataset=train,
        data_collator=collator(tok),
        compute_loss_func=ContrastiveLossFunc(loss, num_labels=4),
    )
    out = plain.train()
    assert out.global_step == ref_out.global_step == 3
    assert out.training_loss == pytest.approx(ref_out.training_loss, rel=1e-5)
    moved = 0
    init = tiny_encoder(tok, seed=0).state_dict()
    for (name, p), q in zip(model.state_dict().items(), ref_model.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(p, init[name])
    assert moved > 10  # the parameters did train


def test_any_model_with_pooled_embeddings_and_id_list_labels(tmp_path):
    from datasets import Dataset
    from transformers import BertConfig, BertModel

    tok = tiny_tokenizer()
    torch.manual_seed(0)
    model = BertModel(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=64,
            pad_token_id=tok.pad_token_id,
        )
    )
    split = tiny_split(16)
    width = max(len(r) for r in split["labels"])

    def collate(rows):  # a user's own collator: padded label-id lists
        enc = tok([r["text"] for r in rows], padding=True, return_tensors="pt")
        enc["labels"] = torch.tensor([r["labels"] + [-1] * (width - len(r["labels"])) for r in rows])
        return dict(enc)

    data = Dataset.from_dict({"text": list(split["text"]), "labels": list(split["labels"])})
    func = ContrastiveLossFunc("jaccard", num_labels=4, label_format="ids")
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        max_steps=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        remove_unused_columns=False,
        dataloader_num_workers=0,
    )
    out = Trainer(
        model=model, args=args, train_dataset=data, data_collator=collate, compute_loss_func=func
    ).train()
    assert torch.isfinite(torch.tensor(out.training_loss)) and out.training_loss > 0
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if "pooler" in n)
    # the value is the hf_mlcl loss of pooler_output
    batch = collate([data[i] for i in range(8)])
    labels = batch.pop("labels")
    with torch.no_grad():
        outputs = model(**batch)
        got = func(outputs, labels)
        from hf_mlcl.labels.multihot import ids_to_multihot
        from hf_mlcl.losses import get_loss

        want = get_loss("jaccard")(outputs.pooler_output, ids_to_multihot(labels, 4))
    assert got.item() == pytest.approx(want.item(), rel=1e-6)


def test_errors_name_the_problem():
    func = ContrastiveLossFunc("sd", num_labels=3)
    with pytest.raises(ValueError, match="has none of .*embeddings_key"):
        func({"last_hidden_state": torch.zeros(2, 4, 8)}, torch.ones(2, 3))
    with pytest.raises(ValueError, match="got no labels"):
        func({"embeddings": torch.zeros(2, 8)}, None)
    with pytest.raises(ValueError, match="must be \\(batch, dim\\)"):
        ContrastiveLossFunc("sd", embeddings_key="last_hidden_state")(
            {"last_hidden_state": torch.zeros(2, 4, 8)}, torch.ones(2, 3)
        )
    with pytest.raises(ValueError, match="unknown loss"):
        ContrastiveLossFunc("nope")
    # the accumulation contract: the loss is scaled by this micro-batch's share of the counted entries
    emb, y = torch.randn(4, 8), torch.tensor([[1, 0, 0], [1, 1, 0], [0, 1, 1], [0, 0, 1]]).float()
    full = func({"embeddings": emb}, y)
    assert func({"embeddings": emb}, y, num_items_in_batch=torch.tensor(24)).item() == pytest.approx(
        full.item() / 2
    )


def test_a_step_reads_nothing_on_the_host_with_the_nan_inf_filter_off(tmp_path):
    """With logging_nan_inf_filter=False (Trainer's filter reads every step's loss), a non-logging step of a
    plain Trainer with ContrastiveLossFunc on an MLCLEncoder makes no host read (the encoder hands its backbone
    the padding mask prepared); the label ids and values were checked on the first batch."""
    from hf_mlcl.host_sync import SyncCountingCallback
    from hf_mlcl.labels.host_reads import accelerator_path

    tok = tiny_tokenizer()
    for loss in ("sd", "msc"):
        args = _plain_args(tmp_path / loss, max_steps=3, logging_steps=100)
        args.logging_nan_inf_filter = False
        func = ContrastiveLossFunc(loss, num_labels=4, embedding_dim=16)
        callback = SyncCountingCallback(steps=[2])
        trainer = Trainer(
            model=tiny_encoder(tok),
            args=args,
            train_dataset=tiny_split(32),
            data_collator=collator(tok),
            compute_loss_func=func,
            callbacks=[callback],
        )
        with accelerator_path(), callback:
            trainer.train()
        counter = callback.counters[2]
        assert counter.count == 0, counter.report()
        assert not func._batch_loss.checks.pending  # the first batch was checked


@pytest.mark.parametrize(
    "loss,contrast_set", [("mulsupcon", None), ("sd", "queries+queue"), ("any", "queries+keys")]
)
def test_plain_trainer_with_a_queue_matches_contrastive_trainer_at_momentum_0(tmp_path, loss, contrast_set):
    """ContrastiveLossFunc(queue_size=8): the keys are the batch's embeddings without gradient, which is
    ContrastiveTrainer with momentum 0 on a model without dropout. Six steps of batch 4 (the queue fills
    after two, joins at once or after warm-up): the same loss at every step, the same queue and weights;
    a batch-mode run differs, so the queue is what is compared."""
    tok, train = tiny_tokenizer(), tiny_split(24)
    kw = dict(max_steps=6, learning_rate=5e-3)
    ref_model = tiny_encoder(tok, seed=0)
    ref = ContrastiveTrainer(
        model=ref_model,
        args=base_args(
            tmp_path / "ref", loss=loss, queue_size=8, momentum=0.0, contrast_set=contrast_set, **kw
        ),
        train_dataset=train,
        data_collator=collator(tok),
        processing_class=tok,
        num_labels=4,
    )
    ref.train()

    def plain_run(queue_size):
        model = tiny_encoder(tok, seed=0)
        func = ContrastiveLossFunc(
            loss, num_labels=4, queue_size=queue_size, contrast_set=contrast_set if queue_size else None
        )
        trainer = Trainer(
            model=model,
            args=_plain_args(tmp_path / f"plain{queue_size}", **kw),
            train_dataset=train,
            data_collator=collator(tok),
            compute_loss_func=func,
        )
        trainer.train()
        return model, func, [h["loss"] for h in trainer.state.log_history if "loss" in h]

    model, func, losses = plain_run(8)
    ref_losses = [h["loss"] for h in ref.state.log_history if "loss" in h]
    assert len(losses) == len(ref_losses) == 6
    assert losses == pytest.approx(ref_losses, rel=1e-4)
    assert abs(plain_run(0)[2][-1] - losses[-1]) > 1e-4  # the queue changed the training
    assert len(func.queue) == 8
    torch.testing.assert_close(func.queue.embeddings, ref.queue.embeddings, rtol=1e-4, atol=1e-5)
    assert torch.equal(func.queue.labels, ref.queue.labels)
    for (name, p), q in zip(model.state_dict().items(), ref_model.state_dict().values()):
        torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5, msg=name)


def test_queue_errors_name_the_problem():
    with pytest.raises(ValueError, match="queue_size must be >= 0"):
        ContrastiveLossFunc("sd", queue_size=-1)
    with pytest.raises(ValueError, match="needs queue_size > 0"):
        ContrastiveLossFunc("sd", contrast_set="keys")
    with pytest.raises(ValueError, match="contrast_set must be one of"):
        ContrastiveLossFunc("sd", queue_size=8, contrast_set="queue")


def _ids_collate(tok):
    def collate(rows):  # label ids padded with -1 to each batch's widest row
        enc = tok([r["text"] for r in rows], padding=True, return_tensors="pt")
        width = max(len(r["labels"]) for r in rows)
        enc["labels"] = torch.tensor([r["labels"] + [-1] * (width - len(r["labels"])) for r in rows])
        return dict(enc)

    return collate


def test_padded_ids_under_accumulation_are_refused_and_dense_labels_train(tmp_path):
    """Trainer counts a step's label entries over its micro-batches: -1-padded ids of varying width would weigh
    each micro-batch by its width, so the first step stops with an error naming dense labels."""
    from datasets import Dataset

    tok, split = tiny_tokenizer(), tiny_split(32)
    data = Dataset.from_dict({"text": list(split["text"]), "labels": list(split["labels"])})
    args = _plain_args(tmp_path, max_steps=2, gradient_accumulation_steps=2)
    trainer = Trainer(
        model=tiny_encoder(tok, seed=0),
        args=args,
        train_dataset=data,
        data_collator=_ids_collate(tok),
        compute_loss_func=ContrastiveLossFunc("any", num_labels=4, label_format="ids"),
    )
    with pytest.raises(ValueError, match="label ids padded with -1 under gradient accumulation"):
        trainer.train()
    dense = Trainer(
        model=tiny_encoder(tok, seed=0),
        args=args,
        train_dataset=split,
        data_collator=collator(tok),
        compute_loss_func=ContrastiveLossFunc("any", num_labels=4),
    )
    assert torch.isfinite(torch.tensor(dense.train().training_loss))


def test_evaluation_reports_the_loss_with_label_names_and_ws_mulsupcon_takes_statistics(tmp_path):
    """With label_names=['labels'] (the documented setting) evaluate() reports eval_loss for an MLCLEncoder;
    ws_mulsupcon gets its training-set statistics through the wrapper."""
    tok, split = tiny_tokenizer(), tiny_split(32)
    func = ContrastiveLossFunc("ws_mulsupcon", num_labels=4)
    rows = torch.zeros(len(split), 4)
    for i, labels in enumerate(split["labels"]):
        rows[i, labels] = 1.0
    func.set_label_statistics(rows)
    args = _plain_args(tmp_path, max_steps=2)
    args.label_names = ["labels"]
    trainer = Trainer(
        model=tiny_encoder(tok, seed=0),
        args=args,
        train_dataset=split,
        eval_dataset=tiny_split(16),
        data_collator=collator(tok),
        compute_loss_func=func,
    )
    assert torch.isfinite(torch.tensor(trainer.train().training_loss))
    metrics = trainer.evaluate()
    assert "eval_loss" in metrics and metrics["eval_loss"] > 0
    with pytest.raises(ValueError, match="takes no training-set label statistics"):
        ContrastiveLossFunc("sd", num_labels=4).set_label_statistics(rows)


def test_training_statistics_leave_the_batches_label_format_undecided():
    """An int64 multi-hot statistics matrix as wide as the label space must not make a later -1-padded id batch
    of that width read as multi-hot."""
    func = ContrastiveLossFunc("ws_mulsupcon", num_labels=4)
    func.set_label_statistics(torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 1, 0, 1]]))
    ids = torch.tensor([[0, 1, 2, 3], [0, -1, -1, -1], [1, 3, -1, -1], [2, -1, -1, -1]])
    multi_hot = torch.tensor([[1.0, 1, 1, 1], [1, 0, 0, 0], [0, 1, 0, 1], [0, 0, 1, 0]])
    emb = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    outputs = {"embeddings": emb}
    assert func(outputs, ids).item() == pytest.approx(func(outputs, multi_hot).item(), rel=1e-6)
