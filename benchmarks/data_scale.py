"""Data pipeline at MIMIC-IV ICD-10 scale without a documents x labels dense matrix.

A synthetic MIMIC-IV-ICD10-shaped training set goes through Arrow shards, a WordPiece tokenizer,
``tokenize_dataset`` and ``MultiLabelCollator``; prints peak RSS and documents per second for each stage.
Usage::

    python benchmarks/data_scale.py                 # full size
    python benchmarks/data_scale.py --num-docs 2000 # quick run

Method: docs/benchmarks.md, "Data pipeline at MIMIC-IV scale (benchmarks/data_scale.py)"
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


def _rss_mb() -> tuple[float, float]:
    # Linux reports ru_maxrss in KiB.
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return own, kids


def _write_arrow(tables, features, path: str):
    """Stream pyarrow shards to one Arrow file (datasets' ArrowWriter) and memory-map it back."""
    from datasets import Dataset
    from datasets.arrow_writer import ArrowWriter

    with ArrowWriter(features=features, path=path) as writer:
        for table in tables:
            writer.write_table(table.cast(features.arrow_schema))
        writer.finalize()
    return Dataset.from_file(path)


def _cycled_tokens(ids_table, labels_table, num_docs: int, shard_size: int):
    """Full-size pre-tokenized shards: the tokenized subset's ids cycled (doc i gets subset row i % k),
    every document keeps its own labels. Built with numpy gathers, no per-document Python."""
    import pyarrow as pa

    ids = ids_table.column("input_ids").combine_chunks()
    id_off, id_val = ids.offsets.to_numpy().astype(np.int64), ids.values.to_numpy()
    k = len(id_off) - 1
    for start in range(0, num_docs, shard_size):
        stop = min(start + shard_size, num_docs)
        rows = np.arange(start, stop) % k
        lens = id_off[rows + 1] - id_off[rows]
        out_off = np.concatenate([[0], np.cumsum(lens)])
        src = np.repeat(id_off[rows] - out_off[:-1], lens) + np.arange(out_off[-1])
        input_ids = pa.ListArray.from_arrays(pa.array(out_off.astype(np.int32)), pa.array(id_val[src]))
        labels = labels_table.slice(start, stop - start).column("labels").combine_chunks()
        yield pa.table({"input_ids": input_ids, "labels": labels})


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--num-docs", type=int, default=110_442)
    p.add_argument("--num-labels", type=int, default=25_230)
    p.add_argument("--mean-labels", type=float, default=16.0)
    p.add_argument("--min-words", type=int, default=1000)
    p.add_argument("--max-words", type=int, default=2000)
    p.add_argument("--max-length", type=int, default=3072)
    p.add_argument("--chunk-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--tokenizer-sample", type=int, default=500)
    p.add_argument(
        "--tokenize-docs",
        type=int,
        default=None,
        help="tokenize only the first K docs with datasets.map (default: all); see module docstring",
    )
    p.add_argument("--num-proc", type=int, default=None, help="datasets.map processes for tokenization")
    p.add_argument("--shard-size", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--workdir", default=None, help="Arrow cache folder (default: a temp dir, removed at the end)"
    )
    p.add_argument(
        "--skip-tokenize",
        action="store_true",
        help="collate raw text on the fly (tokenize inside the collator) instead of datasets.map",
    )
    args = p.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader

    from hf_mlcl.data import MultiLabelCollator, make_features, tokenize_dataset, train_tokenizer
    from hf_mlcl.data.synthetic import SyntheticCorpusGenerator

    torch.set_num_threads(1)
    workdir = args.workdir or tempfile.mkdtemp(prefix="hf_mlcl_data_scale_")
    own_workdir = args.workdir is None
    gen_kwargs = dict(
        num_labels=args.num_labels,
        min_words=args.min_words,
        max_words=args.max_words,
        mean_labels=args.mean_labels,
        seed=args.seed,
    )
    names = SyntheticCorpusGenerator(**gen_kwargs).label_names
    n = args.num_docs
    print(
        f"documents={n:,} labels={args.num_labels:,} words/doc~U[{args.min_words},{args.max_words}] "
        f"mean labels/doc={args.mean_labels} max_length={args.max_length} batch={args.batch_size} "
        f"cpus={os.cpu_count()} workdir={workdir}",
        flush=True,
    )
    stats = {}
    try:
        t0 = time.perf_counter()
        ds = _write_arrow(
            SyntheticCorpusGenerator(**gen_kwargs).iter_tables("train", n, args.shard_size),
            make_features(names),
            os.path.join(workdir, "train.arrow"),
        )
        stats["generate+write arrow"] = time.perf_counter() - t0
        arrow_bytes = sum(os.path.getsize(f["filename"]) for f in ds.cache_files)
        lab_len = np.diff(ds.data.column("labels").combine_chunks().offsets.to_numpy())
        print(
            f"[generate] {len(ds):,} docs in {stats['generate+write arrow']:.1f}s "
            f"({len(ds) / stats['generate+write arrow']:.0f} docs/s), arrow {arrow_bytes / 2**30:.2f} GiB, "
            f"labels/doc {lab_len.mean():.2f}, RSS self/children {_rss_mb()[0]:.0f}/{_rss_mb()[1]:.0f} MiB",
            flush=True,
        )

        t0 = time.perf_counter()
        sample = ds.select(range(min(args.tokenizer_sample, n)))["text"]
        tok = train_tokenizer(
            sample, vocab_size=args.vocab_size, style="bert", model_max_length=args.max_length
        )
        del sample
        stats["train tokenizer"] = time.perf_counter() - t0
        print(
            f"[tokenizer] WordPiece vocab {len(tok):,} trained on {min(args.tokenizer_sample, n):,} docs in "
            f"{stats['train tokenizer']:.1f}s",
            flush=True,
        )

        k = n if args.tokenize_docs is None else min(args.tokenize_docs, n)
        if not args.skip_tokenize:
            t0 = time.perf_counter()
            subset = ds if k == n else ds.select(range(k))
            ds_tok = tokenize_dataset(
                subset,
                tok,
                max_length=args.max_length,
                num_proc=args.num_proc,
                batch_size=64,
                model_inputs=("input_ids",),
            )
            stats[f"tokenize {k} docs (datasets.map)"] = dt = time.perf_counter() - t0
            tok_bytes = sum(os.path.getsize(f["filename"]) for f in ds_tok.cache_files)
            print(
                f"[tokenize] {k:,} docs in {dt:.1f}s ({k / dt:.1f} docs/s"
                + (f", {n / (k / dt) / 60:.1f} min extrapolated for {n:,}" if k < n else "")
                + f"), token arrow {tok_bytes / 2**30:.3f} GiB, "
                f"RSS self/children {_rss_mb()[0]:.0f}/{_rss_mb()[1]:.0f} MiB",
                flush=True,
            )
            if k < n:
                from datasets import Features, Sequence, Value

                t0 = time.perf_counter()
                feats = Features({"input_ids": Sequence(Value("int32")), "labels": ds.features["labels"]})
                ds_tok = _write_arrow(
                    _cycled_tokens(
                        ds_tok.data.table, ds.select_columns(["labels"]).data.table, n, args.shard_size
                    ),
                    feats,
                    os.path.join(workdir, "tokens_full.arrow"),
                )
                stats["write full-size token arrow"] = time.perf_counter() - t0
                print(
                    f"[tokens full size] {len(ds_tok):,} pre-tokenized docs (ids of the {k:,} tokenized docs "
                    f"cycled, own labels) written in {stats['write full-size token arrow']:.1f}s, "
                    f"{sum(os.path.getsize(f['filename']) for f in ds_tok.cache_files) / 2**30:.2f} GiB",
                    flush=True,
                )
        else:
            ds_tok = ds

        collator = MultiLabelCollator(
            tok, num_labels=args.num_labels, max_length=args.max_length, pad_to_multiple_of=args.chunk_size
        )
        loader = DataLoader(ds_tok, batch_size=args.batch_size, collate_fn=collator, num_workers=0)
        t0 = time.perf_counter()
        n_batches = n_tokens = n_pos = 0
        max_label_elems = 0
        for batch in loader:
            n_batches += 1
            mask = batch.get("attention_mask")  # absent when no row of the batch is padded
            n_tokens += int(mask.sum()) if mask is not None else batch["input_ids"].numel()
            n_pos += int(batch["labels"].sum())
            max_label_elems = max(max_label_elems, batch["labels"].numel())
            assert batch["input_ids"].shape[1] % args.chunk_size == 0
        name = "collate (tokenized->tensors)" if not args.skip_tokenize else "collate (tokenize on the fly)"
        stats[name] = time.perf_counter() - t0
        print(
            f"[collate] {n_batches:,} batches of {args.batch_size} in {stats[name]:.1f}s "
            f"({len(ds_tok) / stats[name]:.0f} docs/s), {n_tokens / len(ds_tok):.0f} tokens/doc, "
            f"{n_pos / len(ds_tok):.2f} positives/doc, largest label tensor {max_label_elems:,} elements "
            f"(a dense docs x labels matrix would be {len(ds_tok) * args.num_labels:,})",
            flush=True,
        )
        del loader, ds_tok, ds
    finally:
        if own_workdir:
            shutil.rmtree(workdir, ignore_errors=True)

    total = sum(stats.values())
    own, kids = _rss_mb()
    print("---- summary ----")
    for name, v in stats.items():
        docs = (
            k
            if name.startswith("tokenize ")
            else (min(args.tokenizer_sample, n) if name == "train tokenizer" else n)
        )
        print(f"{name:36s} {v:8.1f} s  {docs:>8,} docs  {docs / v:10.1f} docs/s")
    print(f"{'total wall (all stages)':36s} {total:8.1f} s")
    print(
        f"peak RSS self {own:.0f} MiB, children {kids:.0f} MiB, max {max(own, kids) / 1024:.2f} GiB "
        f"(target < 4 GB: {'OK' if max(own, kids) * 2**20 < 4e9 else 'EXCEEDED'})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
