"""The tail of each full-data study: the per-label F1 plot and its binned table (``<study>-tail``).

Per-label test F1 (per_label_f1.json, mean over the seeds) against training frequency: BCE fine-tuning at the
chosen learning rate (and with the longer budget once it has run), the contrastive cell with the highest
validation macro-F1 and the best baseline on validation; the table gives the plot's means per log-spaced bin
of training frequency, with the best contrastive cell's difference to each BCE run.
"""

from __future__ import annotations

import glob
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bce_choice  # noqa: E402  (studies/bce_choice.py: the longer-budget BCE cell)
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
from bce_choice import LONG_BUDGET as LONG_BCE  # noqa: E402  (the studies with a longer-budget BCE run)
from study_cells import (  # noqa: E402  (studies/study_cells.py: the cells and the names of the rows)
    BASELINES,
    CONTRASTIVE,
    FULL_PROBES,
    NAMES,
    chosen_lr,
    load,
    long_bce_runs,
)


def _per_label(study: str, cell: str) -> dict:
    """A cell's per-label test F1 over its seeds that wrote a per_label_f1.json: ``seeds_f1`` (one (L,) array a
    seed), ``test_f1`` (their mean, label by label), ``train_count`` (the same training set for every seed)."""
    records = []
    for path in sorted(glob.glob(os.path.join(paths.RESULTS, study, cell, "seed*", "per_label_f1.json"))):
        with open(path, encoding="utf-8") as fh:
            records.append(json.load(fh))
    if not records:
        raise FileNotFoundError(f"no per_label_f1.json under {os.path.join(paths.RESULTS, study, cell)}")
    if any(r["train_count"] != records[0]["train_count"] for r in records):
        raise ValueError(f"{study}/{cell}: the seeds' training label counts differ")
    seeds_f1 = [np.asarray(r["test_f1"], dtype=float) for r in records]
    return {**records[0], "seeds_f1": seeds_f1, "test_f1": np.mean(seeds_f1, axis=0).tolist()}


def _cell_label(loss: str, probe: str) -> str:
    """A contrastive cell in words: ``jaccard stage 1 + logistic probe (ABALONE)``, ``... + fine-tune, lr 1e-4``."""
    kind, _, lr = probe.partition("-lr")
    return f"{NAMES.get(loss, loss)} stage 1 + {FULL_PROBES[kind]}" + (f", lr {lr}" if lr else "")


def _tail_series(study: str) -> list[tuple[str, dict]] | None:
    """Per-label results (per_label_f1.json, seed 1), in plotting order: the BCE fine-tune at the chosen learning
    rate, the same with the longer budget once it has run (LONG_BCE), and the contrastive cell with the highest
    validation macro-F1 (labelled by ``_cell_label``); None until BCE and a contrastive cell exist."""
    lr, tagged, plain = chosen_lr(study), load(study, tagged=True), load(study)
    if lr is None:
        return None
    scored = [
        (r["metrics"]["validation_macro_f1"], f"{loss}_{probe}", _cell_label(loss, probe))
        for (loss, probe), rs in {**plain, **tagged}.items()
        for r in rs
        if loss in CONTRASTIVE
        and r["seed"] == 1
        and (not probe.startswith("finetune") or probe == f"finetune-lr{lr}")
    ]
    if not scored:
        return None
    _, folder, label = max(scored)
    series = [("BCE fine-tuning", _per_label(study, f"bce_finetune-lr{lr}"))]
    if any(r["seed"] == 1 for r in long_bce_runs(study, tagged, lr)):
        series.append((f"BCE fine-tuning, {LONG_BCE[study]}", _per_label(study, bce_choice.long_cell(lr))))
    return [*series, (label, _per_label(study, folder))]


def best_baseline(study: str) -> tuple[str, str] | None:
    """The baseline (``BASELINES`` key: ("tfidf", "logreg"), ...) with the highest seed-1 validation macro-F1 of
    ``study``; None before any has run."""
    plain = load(study)
    scored = [
        (r["metrics"]["validation_macro_f1"], key)
        for key in BASELINES
        for r in plain.get(key, [])
        if r["seed"] == 1
    ]
    return max(scored)[1] if scored else None


def _tail_baseline(study: str) -> tuple[str, dict] | None:
    """(label, per-label results) of :func:`best_baseline`; None before any baseline has run, or while that one
    has no per_label_f1.json (run_all.sh tail-seeds writes it): another baseline is never shown in its place."""
    key = best_baseline(study)
    if key is None:
        return None
    cell = f"{key[0]}_{key[1]}"
    if not os.path.isfile(os.path.join(paths.RESULTS, study, cell, "seed1", "per_label_f1.json")):
        return None
    return BASELINES[key], _per_label(study, cell)


def full_f1_plot(study: str, out: str) -> str | None:
    """Per-label test F1 against training frequency: BCE fine-tuning (chosen lr; also the longer budget once it
    has run) vs the contrastive cell with the highest validation macro-F1 (each the mean over its seeds). Writes
    a PNG at ``out`` (folders created) and returns it, None before those cells exist."""
    from hf_mlcl.evaluation import plot_f1_vs_frequency

    series = _tail_series(study)
    if series is None:
        return None
    series += [x for x in (_tail_baseline(study),) if x]
    os.makedirs(os.path.dirname(out), exist_ok=True)
    plot_f1_vs_frequency(
        {label: np.asarray(r["test_f1"]) for label, r in series},
        np.asarray(series[0][1]["train_count"]),
        out,
        title=f"{study}: per-label test F1 vs training frequency (mean over the seeds)",
    )
    return out


def _edge(v: float) -> str:
    """A bin edge in training documents: three significant digits, no exponent."""
    return f"{v:.3g}" if v < 100 else f"{v:.0f}"


def tail_table(study: str) -> str:
    """The plot's binned means as a table: mean per-label test F1 of BCE (and of BCE with the longer budget, once
    it has run), of the best contrastive cell and of the best baseline (:func:`_tail_baseline`) in each
    log-spaced bin of training frequency, with the best contrastive cell's difference to each BCE run. A column
    with several seeds gives their mean ± sample standard deviation of the bin's mean F1 (n in its header)."""
    from hf_mlcl.evaluation import f1_by_frequency_bin

    series = _tail_series(study)
    if series is None:
        return "Written once the BCE baseline and a contrastive row have finished."
    (best_label, _), bces = series[-1], series[:-1]
    series += [x for x in (_tail_baseline(study),) if x]  # the best baseline on validation, for reference
    counts = series[0][1]["train_count"]
    per_seed = {(label, k): f1 for label, r in series for k, f1 in enumerate(r["seeds_f1"])}
    bins = f1_by_frequency_bin(per_seed, np.asarray(counts))
    diffs = [f"difference to {label}" for label, _ in bces]
    heads = [label + (f" (n={len(r['seeds_f1'])})" if len(r["seeds_f1"]) > 1 else "") for label, r in series]
    rows = [
        f"| training documents per label (bin) | labels | {' | '.join(heads)} | {' | '.join(diffs)} |",
        "|---|---|" + "---|" * (len(series) + len(bces)),
    ]
    for x in bins:
        seeds = {label: [x["mean_f1"][(label, k)] for k in range(len(r["seeds_f1"]))] for label, r in series}
        means = {label: float(np.mean(v)) for label, v in seeds.items()}
        cells = [
            f"{means[label]:.2f}"
            + (f" ± {np.std(seeds[label], ddof=1):.2f}" if len(seeds[label]) > 1 else "")
            for label, _ in series
        ]
        cells += [f"{means[best_label] - means[label]:+.2f}" for label, _ in bces]
        rows.append(f"| {_edge(x['low'])}-{_edge(x['high'])} | {x['n_labels']} | {' | '.join(cells)} |")
    unseen = int(sum(c == 0 for c in counts))
    if unseen:
        rows.append(
            f"| 0 (unseen in training, not in the plot) | {unseen} |" + " |" * (len(series) + len(bces))
        )
    return "\n".join(rows)


# python studies/tail_table.py STUDY: the tail table's baseline ("tfidf logreg"), if any
if __name__ == "__main__":
    chosen = best_baseline(sys.argv[1])
    print("" if chosen is None else " ".join(chosen))
