"""Peak memory of a classifier's evaluation at a large label count: the streamed path against the dense one.

Each path (``stream``: ``MultiLabelAccumulator``; ``dense``: whole arrays, extrapolated) runs in its own
process; ``--trainer`` adds ``ProbingTrainer.predict_evaluation``. Results go to ``--out`` as JSON.

    python benchmarks/eval_memory.py --trainer             # the goal: 20,000 x 25,000, 10 labels a row
    python benchmarks/eval_memory.py --rows 2000 --dense-rows 500 --approx-rows 0   (a quick check)

Method: docs/benchmarks.md, "Evaluation memory at a large label count (benchmarks/eval_memory.py)"
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(REPO, "benchmarks", "cpu_results", "eval_memory.json")
MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def batches(rows: int, labels: int, per_row: int, batch_rows: int, signal: float, seed: int):
    """(logits float32 (b, L), labels float32 (b, L)) batches; the same data for every path."""
    rng = np.random.default_rng(seed)
    for r0 in range(0, rows, batch_rows):
        b = min(batch_rows, rows - r0)
        logits = rng.standard_normal((b, labels), dtype=np.float32)
        truth = np.zeros((b, labels), dtype=np.float32)
        cols = np.stack([rng.choice(labels, per_row, replace=False) for _ in range(b)])
        truth[np.arange(b)[:, None], cols] = 1.0
        logits[np.arange(b)[:, None], cols] += np.float32(signal)
        yield logits, truth


def _stream(args: argparse.Namespace, exact_cells: int | None = None) -> dict:
    from hf_mlcl.evaluation.streaming import EXACT_CELLS, MultiLabelAccumulator

    acc = MultiLabelAccumulator(args.labels, exact_cells=EXACT_CELLS if exact_cells is None else exact_cells)
    for logits, truth in batches(
        args.rows, args.labels, args.per_row, args.batch_rows, args.signal, args.seed
    ):
        acc.add_batch(logits, truth)
    out = {"exact": acc.exact}
    thr = acc.tune_global_threshold()
    out["global"] = {"threshold": thr, "metrics": acc.compute(thr)}
    per_label = acc.tune_per_label_thresholds()
    out["per_label"] = {
        "threshold_median": float(np.median(per_label)),
        "metrics": acc.compute(per_label),
    }
    out["per_label_f1_mean"] = float(acc.per_label_f1(thr).mean())
    out["bounds"] = acc.bounds()
    return out


def _trainer(args: argparse.Namespace) -> dict:
    """The same evaluation through ``ProbingTrainer.predict_evaluation`` (Trainer's loop with
    ``batch_eval_metrics``, torch loaded): a tiny frozen BERT with a random head of ``--labels`` outputs
    on random texts, each with ``--per-row`` random label ids (the collator builds the multi-hot)."""
    import tempfile

    import torch
    from transformers import BertConfig

    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.data.registry import build_split
    from hf_mlcl.data.tokenizer import word_level_tokenizer
    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
    from hf_mlcl.training import ProbingTrainer, ProbingTrainingArguments

    rng = np.random.default_rng(args.seed)
    words = [f"w{i}" for i in range(200)]
    tok = word_level_tokenizer(words)
    texts = [" ".join(rng.choice(words, 8)) for _ in range(args.rows)]
    labels = [sorted(rng.choice(args.labels, args.per_row, replace=False).tolist()) for _ in range(args.rows)]
    names = [f"label{i}" for i in range(args.labels)]
    data = build_split(texts, labels, names)
    torch.manual_seed(args.seed)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        pad_token_id=tok.pad_token_id,
    )
    model = MLCLForMultiLabelClassification.from_encoder(
        MLCLEncoder.from_backbone(cfg, projection_dim=16), num_labels=args.labels, freeze_encoder=True
    )
    with torch.no_grad():  # logits of a useful spread (a fresh head's are all near 0)
        model.classifier.weight.mul_(40.0)
    with tempfile.TemporaryDirectory() as out:
        trainer = ProbingTrainer(
            model=model,
            args=ProbingTrainingArguments(
                output_dir=out,
                probe="linear",
                per_device_eval_batch_size=args.batch_rows,
                use_cpu=True,
                report_to=[],
                disable_tqdm=True,
            ),
            train_dataset=data.select(range(8)),
            data_collator=MultiLabelCollator(tok, args.labels, max_length=16),
        )
        base = _rss_mib()
        acc = trainer.predict_evaluation(data)
        threshold = trainer.tune_threshold(acc)
        metrics = trainer.split_metrics(acc, None, None)
    out = {"exact": acc.exact, "trainer_baseline_rss_mib": round(base, 1)}
    out["global"] = {"threshold": threshold, "metrics": metrics}
    out["per_label_f1_mean"] = float(acc.per_label_f1(threshold).mean())
    out["bounds"] = acc.bounds()
    return out


def _dense(args: argparse.Namespace) -> dict:
    from hf_mlcl.evaluation import compute_multilabel_metrics, per_label_f1
    from hf_mlcl.evaluation.inputs import sigmoid
    from hf_mlcl.evaluation.thresholds import tune_global_threshold, tune_per_label_thresholds

    logits = np.empty((args.rows, args.labels), dtype=np.float32)  # Trainer.predict's predictions
    labels = np.empty((args.rows, args.labels), dtype=np.float32)  # and label_ids
    r0 = 0
    for lg, tr in batches(args.rows, args.labels, args.per_row, args.batch_rows, args.signal, args.seed):
        logits[r0 : r0 + len(lg)], labels[r0 : r0 + len(lg)] = lg, tr
        r0 += len(lg)
    scores = sigmoid(np.asarray(logits, dtype=np.float64))  # ClassifierEvaluation.predict_scores before
    truth = np.asarray(labels) > 0.5
    thr = tune_global_threshold(truth, scores)
    out = {"global": {"threshold": thr, "metrics": compute_multilabel_metrics(truth, scores, threshold=thr)}}
    per_label = tune_per_label_thresholds(truth, scores)
    out["per_label"] = {
        "threshold_median": float(np.median(per_label)),
        "metrics": compute_multilabel_metrics(truth, scores, threshold=per_label),
    }
    out["per_label_f1_mean"] = float(per_label_f1(truth, scores >= thr).mean())
    return out


def child(args: argparse.Namespace) -> None:
    import hf_mlcl.evaluation  # noqa: F401  (imports before the baseline)

    base = _rss_mib()
    t0 = time.perf_counter()
    if args.child == "dense":
        result = _dense(args)
    elif args.child == "exact":
        result = _stream(args, exact_cells=1 << 62)
    elif args.child == "trainer":
        result = _trainer(args)
    else:
        result = _stream(args)
    result.update(
        {
            "rows": args.rows,
            "labels": args.labels,
            "wall_s": round(time.perf_counter() - t0, 2),
            "baseline_rss_mib": round(base, 1),
            "peak_rss_mib": round(_rss_mib(), 1),
        }
    )
    print(json.dumps(result))


def _run(args: argparse.Namespace, path: str, rows: int, env: dict | None = None) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", path, "--rows", str(rows)]
    for name in ("labels", "per_row", "batch_rows", "signal", "seed"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env={**os.environ, **(env or {})})
    return json.loads(done.stdout.strip().splitlines()[-1])


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _line(name: str, r: dict) -> str:
    g = r["global"]["metrics"]
    return (
        f"{name:>8}: {r['rows']} x {r['labels']}  peak RSS {r['peak_rss_mib']:.0f} MiB "
        f"(baseline {r['baseline_rss_mib']:.0f})  wall {r['wall_s']:.1f} s  micro-F1 {g['micro_f1']:.4f} "
        f"macro-AUC {g['macro_auc']:.4f}"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--labels", type=int, default=25000)
    p.add_argument("--per-row", type=int, default=10)
    p.add_argument("--batch-rows", type=int, default=32)
    p.add_argument("--signal", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dense-rows", type=int, default=2000, help="rows of the dense run (0: skip it)")
    p.add_argument(
        "--approx-rows", type=int, default=2000, help="rows of the exact-vs-histogram run (0: skip)"
    )
    p.add_argument("--out", default=OUT)
    p.add_argument("--trainer", action="store_true", help="also through ProbingTrainer.predict_evaluation")
    p.add_argument("--child", choices=["stream", "dense", "exact", "trainer"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return 0

    cells = args.rows * args.labels
    result = {
        "measurement": "eval_memory",
        "git_commit": _commit(),
        "cpu_count": os.cpu_count(),
        "command": "python benchmarks/eval_memory.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            k: getattr(args, k)
            for k in (
                "rows",
                "labels",
                "per_row",
                "batch_rows",
                "signal",
                "seed",
                "dense_rows",
                "approx_rows",
                "trainer",
            )
        },
    }
    stream = _run(args, "stream", args.rows)
    print(_line("stream", stream), flush=True)
    result["stream"] = stream
    if args.trainer:  # glibc's default allocator, then its mmap threshold fixed (see the module docstring)
        result["trainer"] = _run(args, "trainer", args.rows)
        print(_line("trainer", result["trainer"]), flush=True)
        result["trainer_mmap_threshold"] = _run(args, "trainer", args.rows, {MMAP_ENV: "131072"})
        result["trainer_mmap_threshold"]["env"] = {MMAP_ENV: "131072"}
        print(_line("trainer*", result["trainer_mmap_threshold"]), flush=True)
    if args.dense_rows:
        dense = _run(args, "dense", args.dense_rows)
        per_cell = (
            (dense["peak_rss_mib"] - dense["baseline_rss_mib"]) * 2**20 / (args.dense_rows * args.labels)
        )
        dense["bytes_per_cell"] = round(per_cell, 2)
        dense["extrapolated_peak_rss_mib_at_rows"] = round(
            dense["baseline_rss_mib"] + per_cell * cells / 2**20
        )
        print(_line("dense", dense), flush=True)
        print(
            f"   dense: {per_cell:.1f} bytes a cell -> about {dense['extrapolated_peak_rss_mib_at_rows'] / 1024:.1f} "
            f"GiB at {args.rows} x {args.labels} (extrapolated)",
            flush=True,
        )
        result["dense"] = dense
    if args.approx_rows:
        exact = _run(args, "exact", args.approx_rows)
        approx = _run(args, "stream", args.approx_rows)
        diff = {}
        for strategy in ("global", "per_label"):
            e, a = exact[strategy]["metrics"], approx[strategy]["metrics"]
            diff[strategy] = {
                k: a[k] - e[k] for k in e if not (np.isnan(a[k]) or np.isnan(e[k])) and a[k] != e[k]
            }
        result["approximation"] = {"exact": exact, "histogram": approx, "histogram_minus_exact": diff}
        print(
            f"  approx: {args.approx_rows} rows, histogram minus exact (global threshold): {diff['global']}"
        )
        print(f"          (per-label thresholds): {diff['per_label']}", flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
