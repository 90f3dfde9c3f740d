"""Your own multi-label CSV -> contrastive encoder -> classifier, through the Python API.

    python examples/own_csv.py my_data.csv --model sentence-transformers/all-MiniLM-L6-v2 --output-dir out/my_csv

``my_data.csv`` has a ``text`` column and a ``labels`` column ("sports;politics"); see
``hf_mlcl.data.custom`` for other shapes (--text-column / --label-column / one 0/1 column per label).
Without a validation split 10 % of the rows are carved off (seeded); without a test split there are no
test metrics. ``--tiny`` swaps the pretrained model for a tiny random BERT (offline smoke runs).
"""

from __future__ import annotations

import argparse
import json
import os

from hf_mlcl.training import (
    ContrastiveTrainingArguments,
    DataArguments,
    ModelArguments,
    ProbingTrainingArguments,
    load_run_data,
    train_contrastive,
    train_probe,
)

TINY_BERT = {
    "model_type": "bert",
    "vocab_size": 500,
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 128,
}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", help="the CSV file (or any file / Hub id load_mlc_dataset reads)")
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2", help="backbone id or folder")
    p.add_argument("--tiny", action="store_true", help="a tiny random BERT instead of --model (no download)")
    p.add_argument("--text-column", default="text")
    p.add_argument("--label-column", default="labels")
    p.add_argument(
        "--loss", default="sd", help="an hf_mlcl contrastive loss: sd, mulsupcon, msc, jaccard, ..."
    )
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--output-dir", default="out/my_csv")
    a = p.parse_args(argv)

    model_args = ModelArguments(
        model_name_or_path=None if a.tiny else a.model,
        backbone_config=TINY_BERT if a.tiny else None,
        pooling="mean",
        projection_dim=64,
    )
    data_args = DataArguments(
        dataset=a.csv, text_column=a.text_column, label_column=a.label_column, max_length=128
    )
    common = dict(
        num_train_epochs=a.epochs,
        max_steps=a.max_steps,
        per_device_train_batch_size=16,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        disable_tqdm=True,
    )
    encoder_dir, classifier_dir = (
        os.path.join(a.output_dir, "encoder"),
        os.path.join(a.output_dir, "classifier"),
    )
    data = load_run_data(data_args)  # read once, for both stages
    # stage 1: label-aware contrastive training of the encoder
    stage1 = train_contrastive(
        model_args,
        data_args,
        ContrastiveTrainingArguments(
            encoder_dir,
            loss=a.loss,
            learning_rate=5e-5 if not a.tiny else 1e-3,
            remove_unused_columns=False,
            **common,
        ),
        data=data,
    )
    # stage 2: a linear probe on the frozen encoder; the threshold is tuned on validation
    stage2 = train_probe(
        model_args,
        data_args,
        ProbingTrainingArguments(
            classifier_dir,
            probe="linear",
            learning_rate=1e-3 if not a.tiny else 1e-2,
            remove_unused_columns=False,
            **common,
        ),
        encoder_path=encoder_dir,
        data=data,
    )
    print("data:", "; ".join(data.notes) or "splits as given")
    print(
        json.dumps(
            {k: v for k, v in stage2.metrics.items() if k.endswith(("micro_f1", "macro_f1"))}, indent=2
        )
    )
    print(
        f"classifier saved to {classifier_dir} (SentenceTransformer({classifier_dir!r}).encode(texts) gives each "
        "label's probability; label names and threshold in its mlcl_config.json)"
    )
    return {"contrastive": stage1.metrics, "probe": stage2.metrics}


if __name__ == "__main__":
    main()
