"""A plain ``transformers.Trainer`` training an encoder with an hf_mlcl loss via ``compute_loss_func``.

    python examples/trainer_compute_loss_func.py my_data.csv --model FacebookAI/roberta-base --loss mulsupcon

The model is an ``MLCLEncoder`` (backbone + pooling + projection head; any model whose output carries
pooled embeddings works, e.g. ``AutoModel``'s ``pooler_output``), the batches come from
``MultiLabelCollator`` (tokens + multi-hot ``labels``), and ``ContrastiveLossFunc`` computes the loss
from ``outputs.embeddings`` and the labels. ``--tiny`` builds a tiny random BERT and trains its tokenizer
on the data (offline smoke runs).
"""

from __future__ import annotations

import argparse

from transformers import AutoTokenizer, BertConfig, Trainer, TrainingArguments

from hf_mlcl.data import MultiLabelCollator, label_names, load_mlc_dataset, train_tokenizer
from hf_mlcl.integrations.trainer import ContrastiveLossFunc
from hf_mlcl.modeling import MLCLEncoder


def main(argv: list[str] | None = None) -> Trainer:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a CSV / json / parquet file, a Hub id, or a registered dataset name")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--tiny", action="store_true", help="a tiny random BERT (no download)")
    p.add_argument("--loss", default="sd")
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--output-dir", default="out/trainer_encoder")
    a = p.parse_args(argv)

    dd = load_mlc_dataset(a.data, data_dir=a.data_dir)
    num_labels = len(label_names(dd))
    if a.tiny:
        tokenizer = train_tokenizer(list(dd["train"]["text"]), vocab_size=500)
        model = MLCLEncoder.from_backbone(
            BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=32,
                num_hidden_layers=2,
                num_attention_heads=4,
                intermediate_size=64,
                max_position_embeddings=128,
                pad_token_id=tokenizer.pad_token_id,
            ),
            pooling="mean",
            projection_dim=32,
        )
    else:
        tokenizer = AutoTokenizer.from_pretrained(a.model)
        model = MLCLEncoder.from_backbone(a.model, pooling="mean", projection_dim=128)
    args = TrainingArguments(
        output_dir=a.output_dir,
        per_device_train_batch_size=16,
        num_train_epochs=a.epochs,
        max_steps=a.max_steps,
        learning_rate=1e-3 if a.tiny else 5e-5,
        remove_unused_columns=False,  # the collator reads `text`
        label_names=["labels"],  # the batch's labels: evaluate() then reports eval_loss
        dataloader_drop_last=True,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=dd["train"],
        data_collator=MultiLabelCollator(tokenizer, num_labels, max_length=128),
        compute_loss_func=ContrastiveLossFunc(a.loss, num_labels=num_labels),
    )
    result = trainer.train()
    trainer.save_model(a.output_dir)
    tokenizer.save_pretrained(a.output_dir)
    print(
        f"trained {result.global_step} steps with {a.loss}, mean loss {result.training_loss:.4f}; "
        f"encoder saved to {a.output_dir} (MLCLEncoder.from_pretrained)"
    )
    return trainer


if __name__ == "__main__":
    main()
