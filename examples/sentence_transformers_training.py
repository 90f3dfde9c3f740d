"""Train a SentenceTransformer with an hf_mlcl multi-label contrastive loss.

    python examples/sentence_transformers_training.py my_data.csv --model sentence-transformers/all-MiniLM-L6-v2

Loads the data with ``hf_mlcl.load_mlc_dataset`` (a CSV, any file, a Hub id or a registered name),
turns it into sentence-transformers' shape (``text`` + a ``label`` column of -1-padded label ids), and
trains with ``SentenceTransformerTrainer`` and ``MultiLabelContrastiveLoss`` (``--cached`` for the
GradCache variant). The saved model's card cites the loss's paper. ``--tiny`` builds a tiny random BERT
sentence encoder instead of ``--model`` (offline smoke runs). Needs ``pip install -e ".[sentence-transformers]"`` in the repository.
"""

from __future__ import annotations

import argparse
import os
import tempfile

from sentence_transformers import (
    SentenceTransformer,
    SentenceTransformerTrainer,
    SentenceTransformerTrainingArguments,
)

from hf_mlcl.data import label_names, load_mlc_dataset
from hf_mlcl.integrations.sentence_transformers import (
    CachedMultiLabelContrastiveLoss,
    MultiLabelContrastiveLoss,
    to_sentence_transformers_dataset,
)


def tiny_sentence_transformer(texts: list[str]) -> SentenceTransformer:
    """A random 2-layer BERT with a tokenizer trained on ``texts``, mean-pooled (no download)."""
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import BertConfig, BertModel

    from hf_mlcl.data import train_tokenizer

    tok = train_tokenizer(texts, vocab_size=500)
    folder = tempfile.mkdtemp(prefix="tiny_st_")
    BertModel(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=128,
            pad_token_id=tok.pad_token_id,
        )
    ).save_pretrained(folder)
    tok.save_pretrained(folder)
    word = Transformer(folder, max_seq_length=64)
    return SentenceTransformer(modules=[word, Pooling(word.get_embedding_dimension(), "mean")])


def main(argv: list[str] | None = None) -> SentenceTransformer:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="a CSV / json / parquet file, a Hub id, or a registered dataset name")
    p.add_argument("--data-dir", default=None, help="folder of a registered dataset")
    p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
    p.add_argument("--tiny", action="store_true", help="a tiny random sentence encoder (no download)")
    p.add_argument("--loss", default="sd", help="sd, mulsupcon, msc, jaccard, all, any, ws_mulsupcon, hbl")
    p.add_argument("--cached", action="store_true", help="GradCache: big contrast sets at mini-batch memory")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--epochs", type=float, default=1.0)
    p.add_argument("--output-dir", default="out/st_model")
    a = p.parse_args(argv)

    dd = load_mlc_dataset(a.data, data_dir=a.data_dir)
    num_labels = len(label_names(dd))
    train = to_sentence_transformers_dataset(dd["train"])  # columns: text, label (ids padded with -1)
    model = tiny_sentence_transformer(list(dd["train"]["text"])) if a.tiny else SentenceTransformer(a.model)
    loss_cls = CachedMultiLabelContrastiveLoss if a.cached else MultiLabelContrastiveLoss
    extra = {"mini_batch_size": max(1, a.batch_size // 4)} if a.cached else {}
    loss = loss_cls(model, a.loss, num_labels=num_labels, **extra)
    args = SentenceTransformerTrainingArguments(
        output_dir=a.output_dir,
        per_device_train_batch_size=a.batch_size,
        num_train_epochs=a.epochs,
        max_steps=a.max_steps,
        learning_rate=1e-3 if a.tiny else 5e-5,
        save_strategy="no",
        report_to="none",
        logging_steps=10,
        dataloader_drop_last=True,
        disable_tqdm=True,
    )
    result = SentenceTransformerTrainer(model=model, args=args, train_dataset=train, loss=loss).train()
    model.save(os.path.join(a.output_dir, "final"))
    print(
        f"trained {result.global_step} steps, mean loss {result.training_loss:.4f}; "
        f"saved to {os.path.join(a.output_dir, 'final')}"
    )
    return model


if __name__ == "__main__":
    main()
