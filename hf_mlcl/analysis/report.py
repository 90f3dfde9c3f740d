"""``inspect_labels`` / ``inspect_dataset``: how each contrastive loss will see a dataset, before training.

Sampled over real batches, the report gives label statistics, the R1-R5 pair relations, each loss's
positives and wasted anchors, HBL's gate and a queue-size recommendation (:func:`format_report`,
:func:`write_report`).

Design: docs/design.md, "Inspect report (hf_mlcl/analysis/report.py)".
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from hf_mlcl.data.sampler import PositiveEnsuredSampler
from hf_mlcl.labels.multihot import multi_hot_array
from hf_mlcl.losses.all_ import AllLoss
from hf_mlcl.losses.any_ import AnyLoss

from .pair_statistics import RELATIONS, batch_pair_statistics

__all__ = ["inspect_labels", "inspect_dataset", "format_report", "write_report", "QUEUE_GRID"]

QUEUE_GRID = (0, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)
ALL_TARGET, GATE_TARGET = 0.95, 0.5


def _sample(
    y: torch.Tensor,
    batch: int,
    queue: int,
    n_batches: int,
    k_min: int,
    seed: int,
    order: Tensor | None = None,
) -> dict[str, float]:
    """Statistics of ``n_batches`` sampled steps with a ``queue``-row queue (means over labelled anchors), the
    rows in a seeded random ``order`` unless one is given."""
    n = y.shape[0]
    if order is None:
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    sums: Counter = Counter()
    for b in range(n_batches):
        start = (b * batch) % n
        idx = order[(start + torch.arange(batch)) % n]
        q_idx = order[(start - queue + torch.arange(queue)) % n]
        cand = torch.cat([y[idx], y[q_idx]])
        st = batch_pair_statistics(y[idx], cand, self_index=True, k_min=k_min)
        labelled = st["sizes"] > 0
        single, multi, healthy = st["sizes"] == 1, st["sizes"] >= 2, st["sizes"] == 0
        sums["anchors"] += int(labelled.sum())
        sums["healthy_anchors"] += int(healthy.sum())
        sums["single_anchors"] += int(single.sum())
        sums["multi_anchors"] += int(multi.sum())
        for r in RELATIONS:
            sums[r] += int(st[r][labelled].sum())
        sums["pos_all"] += int(st["pos_all"][labelled].sum())
        sums["pos_any"] += int(st["pos_any"][labelled].sum())
        sums["wasted_all"] += int((labelled & (st["pos_all"] == 0)).sum())
        sums["wasted_any"] += int((labelled & (st["pos_any"] == 0)).sum())
        sums["wasted_single"] += int((single & (st["pos_any"] == 0)).sum())
        sums["wasted_multi"] += int((multi & (st["pos_any"] == 0)).sum())
        sums["wasted_healthy"] += int((healthy & (st["healthy_positives"] == 0)).sum())
        sums["pairs"] += int(st["pairs"].sum())
        sums["pairs_wasted"] += int(st["pairs_without_positive"].sum())
        sums["gate_open"] += int(st["gate_open"].sum())
    a = max(sums["anchors"], 1)
    total_pairs = max(sum(sums[r] for r in RELATIONS), 1)

    def share(key: str, denom_key: str) -> float | None:
        return sums[key] / sums[denom_key] if sums[denom_key] else None

    return {
        "queue_size": queue,
        "relation_shares": {r: sums[r] / total_pairs for r in RELATIONS},
        "positives_per_anchor": {"all": sums["pos_all"] / a, "any": sums["pos_any"] / a},
        "wasted_anchors": {
            "all": sums["wasted_all"] / a,
            "any": sums["wasted_any"] / a,
            "sd": sums["wasted_any"] / a,
            "jaccard": sums["wasted_any"] / a,
            "mulsupcon_pairs": sums["pairs_wasted"] / max(sums["pairs"], 1),
            "msc_samples": sums["wasted_any"]
            / a,  # its label prototypes are positives of every labelled anchor
            "ws_single": share("wasted_single", "single_anchors"),
            "ws_multi": share("wasted_multi", "multi_anchors"),
            "ws_healthy": share("wasted_healthy", "healthy_anchors"),
        },
        "hbl_gate_open": sums["gate_open"] / a,
        "labelled_anchors": sums["anchors"],
        "healthy_anchor_share": sums["healthy_anchors"] / max(sums["anchors"] + sums["healthy_anchors"], 1),
    }


def inspect_labels(
    labels: Sequence[Sequence[int]],
    num_labels: int,
    batch_size: int = 32,
    queue_size: int = 0,
    num_processes: int = 1,
    k_min: int = 128,
    n_batches: int = 50,
    seed: int = 0,
    queue_grid: Sequence[int] = QUEUE_GRID,
    label_names: Sequence[str] | None = None,
) -> dict[str, Any]:
    """The report of the module docstring for a list of label-id lists (one per sample).

    The counts are over the *other* samples an anchor meets: B - 1 in-batch samples (B = ``batch_size *
    num_processes``, gathered across processes) plus ``queue_size`` queued ones (in the ``keys`` contrast set,
    most losses' default with a queue, its own momentum key is one more positive, left out here: docs/inspect.md);
    queue sizes are capped at
    ``len(labels) - B`` (a queue cannot hold more *other* samples than the data has).
    Returns a JSON-serialisable dict.
    """
    n = len(labels)
    if batch_size <= 0 or num_processes <= 0 or queue_size < 0 or n_batches <= 0 or k_min < 0:
        raise ValueError(
            "batch_size, num_processes and n_batches must be positive; queue_size and k_min >= 0"
        )
    b = batch_size * num_processes
    if n < b + 1:
        raise ValueError(
            f"the data has {n} rows, fewer than one global batch of {b} plus one: lower the batch size"
        )
    bad = [j for r in labels for j in r if not 0 <= int(j) < num_labels]
    if bad:
        raise ValueError(
            f"label id {bad[0]} is outside [0, {num_labels}); pass num_labels = the label-space size"
        )
    y = torch.from_numpy(multi_hot_array(labels, num_labels))
    if not bool(y.any()):  # every share below is one of labelled anchors: none would read as a perfect 0 %
        raise ValueError(
            f"none of the {n} rows has a label: there is nothing to inspect; check the label column"
        )
    sizes = y.sum(1)
    freq = y.sum(0)
    sets = Counter(tuple(np.flatnonzero(row)) for row in y.numpy())  # sets: a repeated id counts once
    unique_rows = sum(c for c in sets.values() if c == 1)
    max_queue = n - b
    current = _sample(y, b, min(queue_size, max_queue), n_batches, k_min, seed)
    rules = (("all", AllLoss.sampler_rule), ("any", AnyLoss.sampler_rule))
    with_sampler = {}
    for loss, rule in rules if batch_size > 1 else ():  # the sampler needs two rows a batch for a positive
        order = torch.tensor(PositiveEnsuredSampler(labels, batch_size, rule, seed=seed).order())
        step = _sample(y, b, min(queue_size, max_queue), n_batches, k_min, seed, order=order)
        with_sampler[loss] = step["wasted_anchors"][loss]
    grid = sorted({min(q, max_queue) for q in queue_grid})
    sweep = [_sample(y, b, q, n_batches, k_min, seed) for q in grid]
    rec = next(
        (
            s["queue_size"]
            for s in sweep
            if 1 - s["wasted_anchors"]["all"] >= ALL_TARGET and s["hbl_gate_open"] > GATE_TARGET
        ),
        None,
    )
    order = torch.argsort(freq, descending=True)
    names = list(label_names) if label_names is not None else [str(i) for i in range(num_labels)]
    return {
        "samples": n,
        "num_labels": num_labels,
        "settings": {
            "batch_size": batch_size,
            "num_processes": num_processes,
            "global_batch": b,
            "queue_size": queue_size,
            "k_min": k_min,
            "n_batches": n_batches,
            "seed": seed,
        },
        "cardinality": {
            "mean": float(sizes.float().mean()),
            "max": int(sizes.max()),
            "share_empty": float((sizes == 0).float().mean()),
            "histogram": {str(k): int(v) for k, v in sorted(Counter(sizes.tolist()).items())},
        },
        "label_frequency": {
            "sorted_counts": freq[order].tolist(),
            "sorted_names": [names[i] for i in order.tolist()],
            "labels_never_seen": int((freq == 0).sum()),
            "head_share_top10pct": float(
                freq[order][: max(1, num_labels // 10)].sum() / max(int(freq.sum()), 1)
            ),
        },
        "label_sets": {"distinct": len(sets), "unique_sample_share": unique_rows / n},
        "at_queue_size": current,
        "wasted_anchors_with_positives_sampler": with_sampler,
        "queue_sweep": sweep,
        "recommendation": {
            "queue_size": rec,
            "rule": f">= {ALL_TARGET:.0%} of labelled anchors have an `all` positive and HBL's gate (k_min={k_min}) "
            f"opens for > {GATE_TARGET:.0%} of them",
            "note": None
            if rec is not None
            else "no queue size of the grid (capped at the data size) meets the rule",
        },
    }


def inspect_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    splits: Sequence[str] = ("train",),
    loader_options: dict | None = None,
    **kwargs: Any,
) -> dict[str, Any]:
    """:func:`inspect_labels` on the concatenated ``splits`` of ``load_mlc_dataset(name, data_dir)``."""
    from hf_mlcl.data import label_names, load_mlc_dataset

    ds = load_mlc_dataset(name, data_dir, splits=tuple(splits), **(loader_options or {}))
    names = label_names(ds)
    labels = [list(r) for s in splits for r in ds[s]["labels"]]
    report = inspect_labels(labels, len(names), label_names=names, **kwargs)
    report["dataset"] = {"name": name, "splits": list(splits)}
    return report


def format_report(report: dict[str, Any]) -> str:
    """The printed table: data summary, then one row per loss at the chosen queue size, then the sweep."""
    s, cur = report["settings"], report["at_queue_size"]
    card, sets = report["cardinality"], report["label_sets"]
    head = report.get("dataset", {})
    lines = [
        f"data: {head.get('name', '-')} {'+'.join(head.get('splits', []))}  samples={report['samples']}  "
        f"labels={report['num_labels']}  cardinality={card['mean']:.2f} (max {card['max']}, empty "
        f"{card['share_empty']:.1%})  distinct label sets={sets['distinct']}  samples with a unique set="
        f"{sets['unique_sample_share']:.1%}  top-10% labels hold {report['label_frequency']['head_share_top10pct']:.1%}"
        " of occurrences",
        f"step: global batch {s['global_batch']} ({s['batch_size']} x {s['num_processes']}), queue {cur['queue_size']}, "
        f"{s['n_batches']} sampled batches",
        "relations of (anchor, candidate) pairs: "
        + "  ".join(f"{r} {v:.1%}" for r, v in cur["relation_shares"].items()),
        "",
        "| loss | positives / anchor | wasted anchors |",
        "|---|---|---|",
    ]
    w, p = cur["wasted_anchors"], cur["positives_per_anchor"]

    def pct(v: float | None) -> str:
        return "-" if v is None else f"{v:.1%}"

    rows = [
        ("all", p["all"], w["all"]),
        ("any / sd / jaccard", p["any"], w["any"]),
        ("mulsupcon ((anchor, label) pairs)", p["any"], w["mulsupcon_pairs"]),
        ("msc (samples; prototypes always)", p["any"], w["msc_samples"]),
        ("ws single-label anchors", p["any"], w["ws_single"]),
        ("ws multi-label anchors", p["any"], w["ws_multi"]),
        ("ws healthy anchors", None, w["ws_healthy"]),
    ]
    for name, pos, wasted in rows:
        lines.append(f"| {name} | {'-' if pos is None else f'{pos:.2f}'} | {pct(wasted)} |")
    lines.append(f"| hbl gate open (k_min={s['k_min']}) | - | {pct(1 - cur['hbl_gate_open'])} closed |")
    ws = report["wasted_anchors_with_positives_sampler"]
    lines += [
        "",
        "wasted anchors with batch_sampler=positives (each loss's rule): "
        + (
            f"all {pct(ws['all'])} (random {pct(w['all'])}), any / sd / jaccard {pct(ws['any'])} "
            f"(random {pct(w['any'])})"
            if ws
            else "- (it needs a per-process batch of at least 2)"
        ),
    ]
    lines += [
        "",
        "| queue | all: anchors with a positive | any: positives / anchor | hbl gate open |",
        "|---|---|---|---|",
    ]
    for sw in report["queue_sweep"]:
        lines.append(
            f"| {sw['queue_size']} | {1 - sw['wasted_anchors']['all']:.1%} | "
            f"{sw['positives_per_anchor']['any']:.1f} | {sw['hbl_gate_open']:.1%} |"
        )
    rec = report["recommendation"]
    lines += [
        "",
        f"recommended queue size: {rec['queue_size'] if rec['queue_size'] is not None else 'none'} "
        f"({rec['rule']})" + (f"; {rec['note']}" if rec["note"] else ""),
    ]
    return "\n".join(lines)


def check_report_prefix(prefix: str) -> str:
    """``prefix``, or ValueError where it is a path (the report's files would land outside its folder)."""
    if not prefix or os.path.basename(prefix) != prefix or prefix in (".", ".."):
        raise ValueError(f"the report's file-name prefix must be a plain name, not a path; got {prefix!r}")
    return prefix


def write_report(
    report: dict[str, Any], output_dir: str | os.PathLike, prefix: str = "inspect"
) -> dict[str, str]:
    """Write ``<prefix>.json``, ``<prefix>.txt`` (the table) and three PNGs into ``output_dir``; returns their
    paths. ValueError for a ``prefix`` that is a path (the files would land outside ``output_dir``)."""
    check_report_prefix(prefix)
    os.makedirs(output_dir, exist_ok=True)
    paths = {
        k: os.path.join(output_dir, f"{prefix}{suffix}")
        for k, suffix in (
            ("json", ".json"),
            ("table", ".txt"),
            ("frequency", "_label_frequency.png"),
            ("relations", "_relations.png"),
            ("queue", "_queue_sweep.png"),
        )
    }
    with open(paths["json"], "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
    with open(paths["table"], "w", encoding="utf-8") as f:
        f.write(format_report(report) + "\n")
    from hf_mlcl.evaluation.plots import _new_figure as _figure  # the package's one Agg-figure helper

    title = report.get("dataset", {}).get("name", "")

    counts = np.asarray(report["label_frequency"]["sorted_counts"])
    fig = _figure((6, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(np.arange(1, len(counts) + 1), np.maximum(counts, 0.8), marker=".", lw=1)
    ax.set_yscale("log")
    ax.set_xlabel("label rank")
    ax.set_ylabel("samples carrying the label (log)")
    ax.set_title(f"{title} label frequency (cardinality {report['cardinality']['mean']:.2f})")
    fig.tight_layout()
    fig.savefig(paths["frequency"], dpi=110)

    rel = report["at_queue_size"]["relation_shares"]
    fig = _figure((5, 3.2))
    ax = fig.add_subplot(1, 1, 1)
    ax.bar(
        list(rel),
        [100 * v for v in rel.values()],
        color=["#999999", "#2a9d8f", "#e9c46a", "#f4a261", "#e76f51"],
    )
    ax.set_ylabel("% of (anchor, candidate) pairs")
    ax.set_yscale("log")
    ax.set_title(f"{title} relations R1-R5 (SD paper sec. 2.3)")
    fig.tight_layout()
    fig.savefig(paths["relations"], dpi=110)

    sweep = report["queue_sweep"]
    qs = [max(s["queue_size"], 1) for s in sweep]
    fig = _figure((6, 3.5))
    ax = fig.add_subplot(1, 1, 1)
    ax.plot(
        qs,
        [100 * (1 - s["wasted_anchors"]["all"]) for s in sweep],
        marker="o",
        label="anchors with an `all` positive",
    )
    ax.plot(
        qs,
        [100 * s["hbl_gate_open"] for s in sweep],
        marker="s",
        label=f"HBL gate open (k_min={report['settings']['k_min']})",
    )
    ax.plot(
        qs,
        [100 * (1 - s["wasted_anchors"]["mulsupcon_pairs"]) for s in sweep],
        marker="^",
        label="mulsupcon pairs with a positive",
    )
    ax.set_xscale("log")
    ax.set_xlabel("queue size (0 plotted at 1)")
    ax.set_ylabel("%")
    ax.set_ylim(0, 102)
    ax.legend(fontsize=8)
    ax.set_title(f"{title}: global batch {report['settings']['global_batch']}")
    fig.tight_layout()
    fig.savefig(paths["queue"], dpi=110)
    return paths
