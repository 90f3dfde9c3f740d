"""Regenerate the tables (and the per-label F1 plots) of docs/RESULTS.md from the run outputs.

    python studies/make_tables.py            # rewrites the blocks between <!-- TABLE:x --> markers
    python studies/make_tables.py --print    # only print the tables

Reads studies/results/<dataset>/<loss>_<probe>/seed<S>/metrics.json (written by studies/run.py).
Cells with 3 seeds show mean ± sample standard deviation (ddof = 1); others show the value and n.

Protocol: docs/study.md, "The tables (studies/make_tables.py)".
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import sys
from collections import defaultdict

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bce_choice  # noqa: E402  (studies/bce_choice.py: the BCE baseline's learning rate and budget)
import loss_choice  # noqa: E402  (studies/loss_choice.py: the losses that get GoEmotions runs and seeds)
import lr_grid  # noqa: E402  (studies/lr_grid.py: the BCE learning-rate grid)
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
import scale_table  # noqa: E402  (studies/scale_table.py: the data-scale and joint-objective tables)
from bce_choice import LONG_BUDGET as LONG_BCE  # noqa: E402  (the studies with a longer-budget BCE run)

REPO = paths.REPO
HERE = paths.RESULTS  # the per-cell outputs (studies/results/<study>/<cell>/seed<S>/)
RESULTS_MD = os.path.join(REPO, "docs", "RESULTS.md")
FIGURES = os.path.join(REPO, "docs", "figures")  # the plots RESULTS.md shows
PERFORMANCE_MD = os.path.join(REPO, "docs", "PERFORMANCE.md")  # its last part: the cost of the study's cells
GPU_DIR = "gpu_bf16"  # run_gpu.sh's results tree inside this folder (the study on one GPU, bf16)
ORDER = ["bce", "pretrained", "all", "any", "mulsupcon", "sd", "jaccard", "msc", "ws_mulsupcon", "hbl"]
NAMES = {
    "bce": "BCE fine-tuning (no stage 1)",
    "pretrained": "none: pretrained MiniLM, frozen",
    "hbl": "mulsupcon + hbl",
    "sd": "sd (similarity-dissimilarity)",
}
CONTRASTIVE = [x for x in ORDER if x not in ("bce", "pretrained")]
FULL_STUDIES = ("reuters21578", "goemotions_full")
FULL_PROBES = {
    "logistic": "logistic probe (ABALONE)",
    "linear": "linear probe (SD paper)",
    "finetune": "fine-tune",
}
NOT_RUN = "not yet run"
# published figures, printed above the measured rows of each full-data table
ANCHORS = {
    "reuters21578": [
        "| *published: KD-LSTM-reg distilled from BERT (Adhikari et al. 2019, DocBERT), ModApte R90* | | "
        "| 0.889 | | | | |",
    ],
    "goemotions_full": [
        "| *published: BERT-base fine-tuned (Demszky et al. 2020), 28 labels* | | | | 0.46 | | | |",
    ],
}


def _stage1_sampler(run: dict) -> str:
    """The batch sampler of a cell's stage 1: the record's ``batch_sampler``, else its stage-1 arguments'."""
    return run.get("batch_sampler") or (run.get("contrastive_args") or {}).get("batch_sampler") or "random"


def load(
    dataset: str, tagged: bool = False, batch_sampler: str = "random"
) -> dict[tuple[str, str], list[dict]]:
    """Runs by (loss, probe): the main grid, or (``tagged``) the stage-2 variants by (loss, probe-tag); those
    of stage 1 trained with ``batch_sampler`` (``run.py --batch-sampler``: every table but the sampler's
    reads the random batches). Whole training sets only: the data-scale study's subset cells (``-n<N>``,
    studies/scale.py) are no rows of these tables."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(HERE, dataset, "*", "seed*", "metrics.json"))):
        with open(path, encoding="utf-8") as fh:
            r = json.load(fh)
        if r.get("train_size") is not None:
            continue
        if _stage1_sampler(r) != batch_sampler:
            continue
        if batch_sampler != "random":
            r = {**r, "tag": r["tag"].removeprefix(batch_sampler).lstrip("-") or None}
        if bool(r.get("tag")) != tagged:
            continue
        cells[(r["loss"], r["probe"] + (f"-{r['tag']}" if tagged else ""))].append(r)
    return cells


def stage2_seconds(run: dict) -> tuple[float | None, bool]:
    """(stage-2 wall seconds, whether they are a lower bound). ``wall_s["probe_s"]`` times the process that
    finished the stage only; the epoch records (``timeline.jsonl``, kept across processes) time every finished
    epoch and evaluation. When they add up to more, the stage was resumed and their sum is reported as a lower
    bound (the killed part of an epoch, model loading and the final test pass are not in it)."""
    probe_s = run["wall_s"].get("probe_s")
    ep = run.get("epochs") or {}
    timed = sum(ep.get("epoch_s") or []) + sum(e.get("eval_s") or 0.0 for e in ep.get("evaluations") or [])
    if probe_s is None or timed > probe_s:
        return (round(timed, 1), True) if timed else (probe_s, False)
    return probe_s, False


def _lr_runs(cells, loss: str) -> dict[str, list[dict]]:
    """Fine-tuning runs of ``loss`` grouped by learning rate (tags ``lr<value>``)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for (lo, probe), rs in cells.items():
        if lo == loss and probe.startswith("finetune-lr"):
            out[probe[len("finetune-lr") :]] += rs
    return out


def chosen_lr(study: str) -> str | None:
    """The BCE fine-tuning learning rate chosen on validation (run.py ``--lr best``), None before any has run."""
    try:
        return bce_choice.best_bce_lr(study, HERE)
    except ValueError:
        return None


def _epoch_times(epoch_records: list[dict]) -> str:
    """Mean wall time per epoch (seconds) over the runs' recorded epochs; an epoch a resumed run timed only
    in part counts by its whole-epoch estimate (``timeline.epoch_summary``) and marks the value "≈"."""
    v, scaled = [], False
    for e in epoch_records:  # an epoch cut by early stopping (None) is no measure of a whole one
        v += [x for x in (e.get("whole_epoch_s") or e.get("epoch_s", [])) if x is not None]
        scaled |= bool(e.get("resumed_epochs"))
    return f"{'≈' if scaled else ''}{np.mean(v):.0f}" if v else "—"


def _per_epoch(runs: list[dict]) -> str:
    """Mean training wall time per epoch of stage 2 (seconds)."""
    return _epoch_times([r.get("epochs") or {} for r in runs])


def _metric(runs: list[dict], key: str) -> str:
    return scale_table.summary(runs, key, missing="—")


def _best_epoch(runs: list[dict]) -> str:
    """Best evaluation (epoch) / evaluations run, per seed."""
    out = []
    for r in sorted(runs, key=lambda r: r["seed"]):
        evals = (r.get("epochs") or {}).get("evaluations", [])
        best = [e["epoch"] for e in evals if e.get("eval_macro_f1") == r.get("best_metric")]
        if evals:
            out.append(f"{best[0]:.2g}/{evals[-1]['epoch']:.2g}" if best else f"?/{evals[-1]['epoch']:.2g}")
    return ", ".join(out) or "—"


def _full_runs(plain, tagged, lr: str | None, loss: str, probe: str) -> list[dict]:
    """The runs of one full-study row (``plain`` / ``tagged``: :func:`load` of the study): the probes' cells,
    or the fine-tune at ``lr``, the learning rate BCE chose (:func:`chosen_lr`)."""
    if probe != "finetune":
        return plain.get((loss, probe), [])
    return _lr_runs(tagged, loss).get(lr, []) if lr else []


def long_bce_runs(study: str, tagged, lr: str | None) -> list[dict]:
    """The BCE fine-tune at the chosen learning rate with the longer budget (``run_all.sh``: studies in
    LONG_BCE, whose chosen BCE run was still improving at the end of its 5 epochs)."""
    return (
        tagged.get(("bce", bce_choice.long_cell(lr)[len("bce_") :]), []) if lr and study in LONG_BCE else []
    )


def _full_row(name: str, label: str, runs: list[dict], probe: str) -> str:
    """One row of a full table: validation and test metrics over the seeds, the best / last epoch of each seed,
    the seeds (the seconds are docs/PERFORMANCE.md's: :func:`cost_section`)."""
    if not runs:
        return f"| {name} | {label} | {NOT_RUN} | | | | | |"
    return (
        f"| {name} | {label} | {_metric(runs, 'validation_macro_f1')} | {_metric(runs, 'test_micro_f1')} "
        f"| {_metric(runs, 'test_macro_f1')} | {_metric(runs, 'test_p@1')} "
        f"| {_best_epoch(runs) if probe != 'logistic' else '—'} "
        f"| {','.join(str(r['seed']) for r in sorted(runs, key=lambda r: r['seed']))} |"
    )


def planned_losses(study: str, plain: dict) -> list[str]:
    """The contrastive losses a study's table lists: every loss on Reuters (where the two best are chosen), and
    elsewhere the two chosen there plus any loss with a finished cell (``run_all.sh``'s plan)."""
    if study == "reuters21578":
        return list(CONTRASTIVE)
    chosen = set(_chosen_on_reuters()) | {loss for loss, _ in plain}
    return [loss for loss in CONTRASTIVE if loss in chosen]


def _chosen_on_reuters() -> list[str]:
    """The two losses chosen on Reuters validation (``loss_choice.py``), [] until every loss has its probes."""
    try:
        return loss_choice.best_losses("reuters21578", 2, HERE)
    except ValueError:
        return []


def full_table(study: str) -> str:
    """Every planned row of a full-data study (:func:`planned_losses`); rows without a metrics.json say "not yet
    run". Outside Reuters only the two losses chosen there are fine-tuned (``run_all.sh``): another loss with
    probe cells lists its fine-tune row once that has run."""
    plain, tagged = load(study), load(study, tagged=True)
    lr = chosen_lr(study)
    planned = planned_losses(study, {**plain, **tagged})
    fine_tuned = set(CONTRASTIVE) if study == "reuters21578" else set(_chosen_on_reuters())
    head = (
        "| stage 1 | stage 2 | validation macro-F1 | test micro-F1 | test macro-F1 | test P@1 | best / last epoch "
        "| seeds |\n|---|---|---|---|---|---|---|---|"
    )
    rows = [head, *ANCHORS.get(study, [])]
    for loss in [x for x in ORDER if x not in CONTRASTIVE or x in planned]:
        for probe in ("finetune",) if loss == "bce" else ("logistic", "linear", "finetune"):
            if loss == "pretrained" and probe == "finetune":
                continue  # that is the BCE row
            runs = _full_runs(plain, tagged, lr, loss, probe)
            if probe == "finetune" and loss in CONTRASTIVE and loss not in fine_tuned and not runs:
                continue  # not in the plan of this study
            if probe == "finetune":
                label = "fine-tune"
                if lr:
                    done, planned = len(_lr_runs(tagged, "bce")), 1 + len(lr_grid.FIRST)
                    label = (
                        f"fine-tune, lr {lr} (chosen on validation)"
                        if done >= planned
                        else f"fine-tune, lr {lr} (best on validation of {done} of {planned} learning rates so far)"
                    )
            else:
                label = FULL_PROBES[probe]
            name = NAMES.get(loss, loss) if loss != "bce" else "none (BCE fine-tuning baseline)"
            if loss == "pretrained":
                name = "none: pretrained MiniLM, frozen"
            rows.append(_full_row(name, label, runs, probe))
            if loss == "bce" and study in LONG_BCE:
                label = f"fine-tune, lr {lr or '(chosen)'}, {LONG_BCE[study]}"
                rows.append(_full_row(name, label, long_bce_runs(study, tagged, lr), probe))
    return "\n".join(rows)


_delta = scale_table.seed_delta  # (mean difference, seed-spread verdict) of two groups of seeds


def _signed(delta: tuple[float, str] | None, missing: str = "—") -> str:
    return f"{delta[0]:+.3f}" if delta else missing


def _vs_long(delta: tuple[float, str] | None, budget: str | None) -> str:
    """The two comparison cells against the longer-budget BCE run: difference, seed-spread verdict (none
    where ``bce_choice.py`` kept the 5-epoch run as the bar)."""
    verdict = "not the bar (lower on validation)" if budget == "base" else delta[1] if delta else NOT_RUN
    return f" {_signed(delta, NOT_RUN)} | {verdict} |"


def _bar_note(study: str, budget: str | None, bce: list[dict], long_bce: list[dict]) -> str:
    """Which BCE run is the bar of a study with a longer-budget run (``budget``: ``bce_choice.bce_budget``, None
    before it can be chosen), with the two validation scores it was chosen on."""
    if budget is None:
        return (
            f"The bar: the 5-epoch BCE run until the run with {LONG_BCE[study]} has finished; then the one "
            "with the higher seed-1 validation macro-F1 (`bce_choice.py`)."
        )
    bar = f"BCE with {LONG_BCE[study]}" if budget == "long" else "BCE with 5 epochs"
    base, long = ([r for r in runs if r["seed"] == 1] for runs in (bce, long_bce))
    return (
        f"The bar (`bce_choice.py`; seed-1 validation macro-F1 {_metric(base, 'validation_macro_f1')} with 5 "
        f"epochs, {_metric(long, 'validation_macro_f1')} with {LONG_BCE[study]}): **{bar}**; a loss helps where "
        "its seed-spread verdict against that run says yes."
    )


def comparison_table(study: str) -> str:
    """Every finished contrastive row of a full study against the BCE baseline (chosen learning rate) and, for
    the probes, against the frozen pretrained MiniLM with the same probe: mean test differences (positive:
    the contrastive row is better), with the seed-spread verdict of :func:`_delta` on macro-F1 vs BCE and, in a
    study with a longer-budget BCE run (``bce_choice.LONG_BUDGET``), the difference and verdict against it; then
    the losses ranked by the rule of ``loss_choice.py`` (best seed-1 validation macro-F1 of a frozen probe),
    which picks the losses that run on GoEmotions and get 3 seeds."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    bce = _full_runs(plain, tagged, lr, "bce", "finetune")
    long = study in LONG_BCE
    long_bce = long_bce_runs(study, tagged, lr)
    try:
        budget = bce_choice.bce_budget(study, HERE)
    except ValueError:
        budget = None
    rows = [
        "| stage 1 | stage 2 | validation macro-F1 | test macro-F1 − BCE | test micro-F1 − BCE "
        "| beyond the seed spread (macro-F1 vs BCE)? | test macro-F1 − frozen pretrained, same probe |"
        + (
            f" test macro-F1 − BCE {LONG_BCE[study]} | beyond the seed spread (vs BCE {LONG_BCE[study]})? |"
            if long
            else ""
        ),
        "|---|---|---|---|---|---|---|" + ("---|---|" if long else ""),
    ]
    for loss in CONTRASTIVE:
        for probe in ("logistic", "linear", "finetune"):
            runs = _full_runs(plain, tagged, lr, loss, probe)
            if not runs:
                continue
            macro, micro = _delta(runs, bce, "test_macro_f1"), _delta(runs, bce, "test_micro_f1")
            frozen = (
                None
                if probe == "finetune"
                else _delta(runs, plain.get(("pretrained", probe), []), "test_macro_f1")
            )
            rows.append(
                f"| {NAMES.get(loss, loss)} | {FULL_PROBES[probe]} | {_metric(runs, 'validation_macro_f1')} "
                f"| {_signed(macro)} | {_signed(micro)} "
                f"| {macro[1] if macro else 'no BCE baseline yet'} "
                f"| {_signed(frozen)} |"
                + (_vs_long(_delta(runs, long_bce, "test_macro_f1"), budget) if long else "")
            )
    if len(rows) == 2:
        return "No contrastive row has finished yet."
    ranked = loss_choice.ranked(study, HERE)
    ranking = ", ".join(
        f"{NAMES.get(loss, loss)} {v:.3f} ({FULL_PROBES[probe]})" for loss, v, probe in ranked
    )
    return (
        "\n".join(rows)
        + (f"\n\n{_bar_note(study, budget, bce, long_bce)}" if long else "")
        + (
            f"\n\nLosses by their best validation macro-F1 of a frozen probe, seed 1 (`loss_choice.py`; "
            f"{len(ranked)} of {len(loss_choice.LOSSES)} losses have a probe row): {ranking or '—'}."
        )
    )


def lr_table(study: str) -> str:
    """The BCE learning-rate choice: validation numbers of each candidate (seed 1); test is not shown. The
    grid is lr_grid.py's: two fixed points and a third chosen on validation from them."""
    runs = _lr_runs(load(study, tagged=True), "bce")
    seed1 = {lr: r["metrics"]["validation_macro_f1"] for lr, rs in runs.items() for r in rs if r["seed"] == 1}
    lrs = lr_grid.planned_lrs(seed1)
    rows = [
        "| learning rate | validation macro-F1 | validation micro-F1 | best / last epoch | s per epoch |",
        "|---|---|---|---|---|",
    ]
    for lr in list(lrs) + sorted(set(runs) - set(lrs)):
        rs = [r for r in runs.get(lr, []) if r["seed"] == 1]
        if not rs:
            rows.append(f"| {lr} | {NOT_RUN} | | | |")
            continue
        rows.append(
            f"| {lr} | {_metric(rs, 'validation_macro_f1')} | {_metric(rs, 'validation_micro_f1')} "
            f"| {_best_epoch(rs)} | {_per_epoch(rs)} |"
        )
    if len(lrs) == len(lr_grid.FIRST):
        rows.append(
            f"| third: {lr_grid.ABOVE} or {lr_grid.BELOW}, chosen on validation once "
            f"{' and '.join(lr_grid.FIRST)} have run | {NOT_RUN} | | | |"
        )
    return "\n".join(rows)


def _per_label(study: str, cell: str) -> dict:
    """A cell's per-label test F1 over its seeds that wrote a per_label_f1.json: ``seeds_f1`` (one (L,) array a
    seed), ``test_f1`` (their mean, label by label), ``train_count`` (the same training set for every seed)."""
    records = []
    for path in sorted(glob.glob(os.path.join(HERE, study, cell, "seed*", "per_label_f1.json"))):
        with open(path, encoding="utf-8") as fh:
            records.append(json.load(fh))
    if not records:
        raise FileNotFoundError(f"no per_label_f1.json under {os.path.join(HERE, study, cell)}")
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


def _tail_baseline(study: str) -> tuple[str, dict] | None:
    """(label, per-label results) of the baseline (TF-IDF, SetFit) with the highest seed-1 validation macro-F1
    among those that wrote a per_label_f1.json; None before any has."""
    plain = load(study)
    scored = [
        (r["metrics"]["validation_macro_f1"], key)
        for key in BASELINES
        for r in plain.get(key, [])
        if r["seed"] == 1
        and os.path.isfile(os.path.join(HERE, study, f"{key[0]}_{key[1]}", "seed1", "per_label_f1.json"))
    ]
    if not scored:
        return None
    key = max(scored)[1]
    return BASELINES[key], _per_label(study, f"{key[0]}_{key[1]}")


def full_f1_plot(study: str) -> str | None:
    """Per-label test F1 against training frequency: BCE fine-tuning (chosen lr; also the longer budget once it
    has run) vs the contrastive cell with the highest validation macro-F1 (each the mean over its seeds)."""
    from hf_mlcl.evaluation import plot_f1_vs_frequency

    series = _tail_series(study)
    if series is None:
        return None
    series += [x for x in (_tail_baseline(study),) if x]
    out = os.path.join(FIGURES, study, "f1_vs_frequency.png")
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


@contextlib.contextmanager
def results_root(root: str):
    """Read another results tree with every table function (``run_gpu.sh``'s ``gpu_bf16``): the functions of
    this module and the choice rules they call (``bce_choice``, ``loss_choice``) read the folder ``HERE``."""
    global HERE
    saved, HERE = HERE, root
    try:
        yield
    finally:
        HERE = saved


def _row_runs(study: str) -> dict[tuple[str, str], list[dict]]:
    """Every full-table row's runs by (loss, probe) in the current results tree (fine-tunes at the tree's own
    chosen learning rate; ``("bce", "finetune-long")`` the longer-budget BCE run)."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    rows = {
        (loss, probe): _full_runs(plain, tagged, lr, loss, probe)
        for loss in ORDER
        for probe in ("logistic", "linear", "finetune")
    }
    rows[("bce", "finetune-long")] = long_bce_runs(study, tagged, lr)
    return {k: v for k, v in rows.items() if v}


def _lr_of(runs: list[dict]) -> str:
    """The fine-tuning learning rate of a row's cells, from their tags (``lr2e-4``, ``long-lr2e-4``)."""
    return "/".join(sorted({str(r.get("tag") or "").rpartition("lr")[2] for r in runs}))


def gpu_tables() -> dict[str, str]:
    """The tables of the GPU study (``studies/results/gpu_bf16``), none where that tree is absent."""
    root = os.path.join(HERE, GPU_DIR)
    if not os.path.isdir(root):
        return {}
    tables = {"gpu-summary": gpu_summary_table(root)}
    with results_root(root):
        for d in FULL_STUDIES:
            tables.update(
                {
                    f"gpu-{d}-full": full_table(d),
                    f"gpu-{d}-lr": lr_table(d),
                    f"gpu-{d}-vs-bce": comparison_table(d),
                }
            )
    return tables


# ---------------------------------------------------------------- the summary, the compute figure, the cost
BASELINES = {
    ("tfidf", "logreg"): "TF-IDF 1-2 grams + logistic regression",
    ("tfidf", "svm"): "TF-IDF 1-2 grams + linear SVM",
    ("setfit", "logistic"): "SetFit: MiniLM on any-overlap pairs + logistic head",
}
CPU_DEVICE = "2-core AMD EPYC CPU (fp32)"  # the device of every CPU cell (metrics.json "device": "cpu")


def features_loaded(run: dict) -> bool:
    """True for a frozen probe that loaded every split's features from the store: its seconds hold no pass of
    the encoder (the sibling probe that encoded them paid for it)."""
    return set((run.get("features") or {}).values()) == {"loaded"}


def train_seconds(run: dict) -> tuple[float | None, bool]:
    """(training wall seconds of one run, whether a lower bound): stage 1's seconds, if it has one, plus stage
    2's (:func:`stage2_seconds`; for the baselines their ``stage1_s`` / ``probe_s``). A lower bound: a stage
    resumed across processes, or features loaded instead of encoded (:func:`features_loaded`)."""
    s2, low = stage2_seconds(run)
    if s2 is None:
        return None, False
    return ((run.get("wall_s") or {}).get("stage1_s") or 0.0) + s2, low or features_loaded(run)


def _cost(runs: list[dict]) -> str:
    """Mean training seconds of ``runs``: over the runs timed whole where there are any, else over the lower
    bounds, marked "≥"."""
    walls = [w for w in (train_seconds(r) for r in runs) if w[0] is not None]
    whole = [s for s, low in walls if not low]
    if whole:
        return f"{np.mean(whole):,.0f}"
    return f"≥{np.mean([s for s, _ in walls]):,.0f}" if walls else "—"


def summary_rows(study: str) -> list[tuple[str, list[dict]]]:
    """(method, runs) of the summary table for one study: the BCE baselines, the TF-IDF and SetFit baselines,
    the frozen MiniLM's probes, and both probes and the fine-tune of the two losses chosen on validation."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    rows = [
        (
            f"BCE fine-tune, lr {lr or '?'} (chosen on validation), up to 5 epochs",
            _full_runs(plain, tagged, lr, "bce", "finetune"),
        )
    ]
    if study in LONG_BCE:
        rows.append((f"BCE fine-tune, lr {lr or '?'}, {LONG_BCE[study]}", long_bce_runs(study, tagged, lr)))
    rows += [(label, plain.get(key, [])) for key, label in BASELINES.items()]
    rows += [
        (f"frozen MiniLM + {FULL_PROBES[p]}", plain.get(("pretrained", p), []))
        for p in ("logistic", "linear")
    ]
    for loss in _chosen_on_reuters():
        rows += [
            (f"{NAMES.get(loss, loss)} stage 1 + {FULL_PROBES[p]}", _full_runs(plain, tagged, lr, loss, p))
            for p in ("logistic", "linear", "finetune")
        ]
    return rows


def summary_table() -> str:
    """Dataset x method: test micro-F1, macro-F1 and P@1 (mean ± sd over the seeds, n shown) and the training
    seconds of one run on the CPU; a method without a finished cell says "not yet run"."""
    rows = [
        f"| dataset | method | test micro-F1 | test macro-F1 | test P@1 | training s, {CPU_DEVICE} |",
        "|---|---|---|---|---|---|",
    ]
    for study in FULL_STUDIES:
        for label, runs in summary_rows(study):
            if not runs:
                rows.append(f"| {study} | {label} | {NOT_RUN} | | | |")
                continue
            rows.append(
                f"| {study} | {label} | {_metric(runs, 'test_micro_f1')} | {_metric(runs, 'test_macro_f1')} "
                f"| {_metric(runs, 'test_p@1')} | {_cost(runs)} |"
            )
    return "\n".join(rows)


def _loss_range(runs_by_loss: dict[str, list[dict]]) -> str:
    """min-max over losses of each loss's mean test macro-F1, and how many losses."""
    means = [
        np.mean([float(r["metrics"]["test_macro_f1"]) for r in rs]) for rs in runs_by_loss.values() if rs
    ]
    if not means:
        return "—"
    return (
        f"{min(means):.3f}-{max(means):.3f} ({len(means)} losses)"
        if len(means) > 1
        else f"{means[0]:.3f} (1 loss)"
    )


def gpu_summary_table(gpu_root: str) -> str:
    """Test macro-F1 of the CPU study (fp32) and of the same cells on one GPU (bf16, ``gpu_root``): the BCE rows
    over their seeds, the stage-1 rows as the range over the losses both devices ran."""
    rows = ["| dataset | rows | test macro-F1, CPU fp32 | test macro-F1, GPU bf16 |", "|---|---|---|---|"]
    for study in FULL_STUDIES:
        cpu = _row_runs(study)
        with results_root(gpu_root):
            gpu = _row_runs(study)
        for key, budget in (
            (("bce", "finetune"), "up to 5 epochs"),
            (("bce", "finetune-long"), LONG_BCE.get(study)),
        ):
            if key in cpu and key in gpu:
                label = f"BCE fine-tune, lr {_lr_of(cpu[key])} / {_lr_of(gpu[key])} (CPU / GPU), {budget}"
                rows.append(
                    f"| {study} | {label} | {_metric(cpu[key], 'test_macro_f1')} "
                    f"| {_metric(gpu[key], 'test_macro_f1')} |"
                )
        for probe in ("logistic", "linear", "finetune"):
            both = [loss for loss in CONTRASTIVE if (loss, probe) in cpu and (loss, probe) in gpu]
            if both:
                rows.append(
                    f"| {study} | stage 1 + {FULL_PROBES[probe]}, per loss (mean over its seeds) "
                    f"| {_loss_range({lo: cpu[(lo, probe)] for lo in both})} "
                    f"| {_loss_range({lo: gpu[(lo, probe)] for lo in both})} |"
                )
    return "\n".join(rows) if len(rows) > 2 else "No row has run on a GPU yet."


def compute_points(study: str) -> tuple[dict[str, list[tuple[float, float]]], dict[str, list[list]]]:
    """The compute figure's data for one study: {method: [(training seconds, test macro-F1) per run]} (probes
    that loaded their features are left out: their seconds hold no encoder pass) and {method: [per run, [(cumulative training seconds, test macro-F1) per epoch]]} for runs scored after each
    epoch (``run.py --test-each-epoch``)."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    groups: dict[str, list[dict]] = {
        "BCE fine-tune, up to 5 epochs": _full_runs(plain, tagged, lr, "bce", "finetune"),
        "BCE fine-tune, up to 20 epochs": long_bce_runs(study, tagged, lr),
    }
    groups["frozen MiniLM + probe"] = plain.get(("pretrained", "logistic"), []) + plain.get(
        ("pretrained", "linear"), []
    )
    for probe in ("logistic", "linear", "finetune"):
        groups[f"stage 1 + {probe.replace('finetune', 'fine-tune')}"] = [
            r for loss in CONTRASTIVE for r in _full_runs(plain, tagged, lr, loss, probe)
        ]
    groups.update(
        {
            label.split(":")[0].replace(" 1-2 grams", ""): plain.get(key, [])
            for key, label in BASELINES.items()
        }
    )
    points = {
        m: [
            (train_seconds(r)[0], float(r["metrics"]["test_macro_f1"]))
            for r in rs
            if train_seconds(r)[0] and not features_loaded(r)
        ]
        for m, rs in groups.items()
    }
    curves: dict[str, list[list]] = {}
    for (loss, _probe), rs in tagged.items():
        for r in rs:
            if loss == "bce" and r.get("epoch_test"):
                cum = np.cumsum((r.get("epochs") or {}).get("epoch_s") or [])
                run = [
                    (float(cum[int(round(e["epoch"])) - 1]), e["test_macro_f1"])
                    for e in r["epoch_test"]
                    if 0 < int(round(e["epoch"])) <= len(cum)
                ]
                curves.setdefault("BCE fine-tune, test after each epoch", []).append(run)
    return {m: p for m, p in points.items() if p}, curves


def compute_figure() -> str | None:
    """docs/figures/compute_vs_macro_f1.png from the CPU cells of both studies."""
    from compute_figure import plot_compute

    data = {s: compute_points(s) for s in FULL_STUDIES if os.path.isdir(os.path.join(HERE, s))}
    if not data:
        return None
    return plot_compute(
        {s: p for s, (p, _) in data.items()},
        {s: c for s, (_, c) in data.items()},
        os.path.join(FIGURES, "compute_vs_macro_f1.png"),
        CPU_DEVICE,
    )


def _spread(values: list[float]) -> str:
    """median (min-max; n) of seconds, or "—"."""
    if not values:
        return "—"
    lo, hi = min(values), max(values)
    rng = f"{lo:,.0f}-{hi:,.0f}; " if len(values) > 1 else ""
    return f"{np.median(values):,.0f} ({rng}{len(values)})"


def _whole_epochs(records: list[dict]) -> list[float]:
    return [x for e in records for x in (e.get("whole_epoch_s") or e.get("epoch_s") or []) if x is not None]


def cost_rows(study: str) -> list[tuple[str, list[float]]]:
    """(what, seconds of every cell that measured it) in the current results tree: epochs of the fine-tunes,
    of stage 1 (once per encoder) and of the linear probe on cached features, validation passes, the logistic
    probe's whole run, and the baselines' training."""
    runs = [r for cells in (load(study), load(study, tagged=True)) for rs in cells.values() for r in rs]
    ft = [r for r in runs if r["probe"] == "finetune"]
    stage1 = {
        (r["loss"], r["seed"]): (r.get("stage1") or {}).get("epochs") or {} for r in runs if r.get("stage1")
    }
    logistic = [r for r in runs if r["probe"] == "logistic" and r["loss"] not in ("setfit",)]
    by = {key: [r for r in runs if (r["loss"], r["probe"]) == key] for key in BASELINES}
    return [
        (
            "fine-tune (BCE, MiniLM + linear head), one epoch",
            _whole_epochs([r.get("epochs") or {} for r in ft]),
        ),
        (
            "fine-tune, one validation pass",
            [
                e["eval_s"]
                for r in ft
                for e in (r.get("epochs") or {}).get("evaluations") or []
                if e.get("eval_s")
            ],
        ),
        ("stage 1 (contrastive, batch 64), one epoch", _whole_epochs(list(stage1.values()))),
        (
            "linear probe on cached features, one epoch",
            _whole_epochs([r.get("epochs") or {} for r in runs if r["probe"] == "linear"]),
        ),
        (
            "logistic probe, whole: encoding train + validation + test, then the fits",
            [
                r["wall_s"]["probe_s"]
                for r in logistic
                if not features_loaded(r) and r["wall_s"].get("probe_s")
            ],
        ),
        (
            "logistic probe on stored features, whole: the fits",
            [r["wall_s"]["probe_s"] for r in logistic if features_loaded(r) and r["wall_s"].get("probe_s")],
        ),
        (
            "TF-IDF + logistic regression, features and the C grid",
            [r["wall_s"]["probe_s"] for r in by[("tfidf", "logreg")]],
        ),
        (
            "TF-IDF + linear SVM, features and the C grid",
            [r["wall_s"]["probe_s"] for r in by[("tfidf", "svm")]],
        ),
        ("SetFit, pair training", [r["wall_s"]["stage1_s"] for r in by[("setfit", "logistic")]]),
        (
            "SetFit, head (encoding the training set, then the fits)",
            [r["wall_s"]["probe_s"] for r in by[("setfit", "logistic")]],
        ),
    ]


def cost_section() -> str:
    """docs/PERFORMANCE.md's part on the results study: the seconds its cells recorded, on the CPU and on the
    GPU, per kind of work."""
    root = os.path.join(HERE, GPU_DIR)
    gpu_devices = (
        sorted({r.get("device", "?") for d in FULL_STUDIES for rs in load_tree(root, d).values() for r in rs})
        if os.path.isdir(root)
        else []
    )
    gpu_name = ", ".join(gpu_devices) or "GPU"
    lines = [
        "## Training cost of the results study",
        "",
        "Wall seconds the cells of docs/RESULTS.md recorded (`studies/results/`), per kind of work: median "
        "(min-max; number of measurements). Written by `python studies/make_tables.py`. "
        f"**CPU**: {CPU_DEVICE}, torch CPU build; each cell ran with one thread beside a second cell or with "
        "two threads alone, on cores shared with other processes, so the spread is mostly contention. "
        f"**GPU**: {gpu_name} in bf16 (`studies/run_gpu.sh`); most GPU cells ran several at a time on the "
        "one device, so their times include that sharing. MiniLM: all-MiniLM-L6-v2 (22.7 M parameters); "
        "Reuters-21578: 6,993 training documents at 128 tokens, fine-tune batch 32 (219 steps per epoch); "
        "GoEmotions: 43,410 comments at 64 tokens (1,357 steps). —: not measured on that device.",
        "",
    ]
    for study in FULL_STUDIES:
        cpu = cost_rows(study)
        if os.path.isdir(os.path.join(root, study)):
            with results_root(root):
                gpu = dict(cost_rows(study))
        else:
            gpu = {}
        lines += [f"### {study}", "", f"| work | s, {CPU_DEVICE} | s, {gpu_name} (bf16) |", "|---|---|---|"]
        lines += [f"| {what} | {_spread(v)} | {_spread(gpu.get(what, []))} |" for what, v in cpu]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def load_tree(root: str, study: str) -> dict[tuple[str, str], list[dict]]:
    """:func:`load` of ``study`` in another results tree."""
    with results_root(root):
        return load(study)


def write_cost_section() -> str:
    """Replace docs/PERFORMANCE.md's results-study part (from ``performance_doc.STUDY_MARK`` on) with
    :func:`cost_section`, keeping the part benchmarks/performance_doc.py writes."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from performance_doc import STUDY_MARK, split_generated

    with open(PERFORMANCE_MD, encoding="utf-8") as fh:
        own, _ = split_generated(fh.read())
    with open(PERFORMANCE_MD, "w", encoding="utf-8") as fh:
        fh.write(own.rstrip("\n") + "\n\n" + STUDY_MARK + "\n\n" + cost_section())
    return PERFORMANCE_MD


PAPERS_DIR = "gpu_papers"  # run_gpu.sh papers: every loss at its paper's stage-1 budget


def _sampler_cell(old: list[dict], new: list[dict], key: str) -> str:
    """``random → positives (difference)`` of one metric of seed 1."""
    if not old:
        return "—"
    v0 = old[0]["metrics"][key]
    if not new:
        return f"{v0:.3f} → {NOT_RUN}"
    v1 = new[0]["metrics"][key]
    return f"{v0:.3f} → {v1:.3f} ({v1 - v0:+.3f})"


def sampler_table(study: str) -> str:
    """Stage 1 with positive-ensured batches (``run.py --batch-sampler positives``) against the same cell with
    random batches, seed 1: test macro-F1 of both frozen probes and validation macro-F1 of the logistic one."""
    plain, positives = load(study), load(study, batch_sampler="positives")
    rows = [
        "| stage 1 | logistic probe: test macro-F1, random → positives | linear probe: test macro-F1, random → "
        "positives | logistic probe: validation macro-F1 | logistic probe: test micro-F1 |",
        "|---|---|---|---|---|",
    ]
    for loss in CONTRASTIVE:
        cells = {
            p: (
                [r for r in plain.get((loss, p), []) if r["seed"] == 1],
                [r for r in positives.get((loss, p), []) if r["seed"] == 1],
            )
            for p in ("logistic", "linear")
        }
        if cells["logistic"][0] or cells["linear"][0]:
            rows.append(
                f"| {NAMES.get(loss, loss)} | {_sampler_cell(*cells['logistic'], 'test_macro_f1')} | "
                f"{_sampler_cell(*cells['linear'], 'test_macro_f1')} | "
                f"{_sampler_cell(*cells['logistic'], 'validation_macro_f1')} | "
                f"{_sampler_cell(*cells['logistic'], 'test_micro_f1')} |"
            )
    return "\n".join(rows)


def papers_table() -> str:
    """Each loss's stage-1 budget from its paper (``paper_budgets.py``) and, per study, the test macro-F1 of its
    logistic probe at that budget (``run_gpu.sh papers``), "not yet run" until the cell exists."""
    import paper_budgets

    root = os.path.join(HERE, PAPERS_DIR)
    done = {d: load_tree(root, d) if os.path.isdir(os.path.join(root, d)) else {} for d in FULL_STUDIES}
    rows = paper_budgets.table().splitlines()
    rows[0] += "".join(f" {d}: stage 1 + logistic probe, test macro-F1 |" for d in FULL_STUDIES)
    rows[1] += "---|" * len(FULL_STUDIES)
    for i, loss in enumerate(paper_budgets.BUDGETS, start=2):
        rows[i] += "".join(
            f" {_metric(done[d][(loss, 'logistic')], 'test_macro_f1') if (loss, 'logistic') in done[d] else NOT_RUN} |"
            for d in FULL_STUDIES
        )
    return "\n".join(rows)


def main(argv: list[str]) -> None:
    tables = {
        "summary": summary_table(),
        "papers-budgets": papers_table(),
        "reuters21578-sampler": sampler_table("reuters21578"),
    }
    tables.update({f"{d}-full": full_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-lr": lr_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-vs-bce": comparison_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-tail": tail_table(d) for d in FULL_STUDIES})
    tables.update({f"{d}-scale": scale_table.scale_table(d, HERE) for d in FULL_STUDIES})
    tables["joint"] = scale_table.joint_table(list(FULL_STUDIES), HERE)
    tables.update(gpu_tables())
    if "--print" in argv:
        for d, t in tables.items():
            print(f"## {d}\n{t}\n")
        print(f"## cost (docs/PERFORMANCE.md)\n{cost_section()}")
        return
    for d in FULL_STUDIES:
        if os.path.isdir(os.path.join(HERE, d)):
            print("plot:", full_f1_plot(d))
    print("plot:", compute_figure())
    for d in FULL_STUDIES:
        print("plot:", scale_table.scale_figure(d, HERE, os.path.join(FIGURES, d, "macro_f1_vs_size.png")))
    with open(RESULTS_MD, encoding="utf-8") as fh:
        text = fh.read()
    for d, t in tables.items():
        pattern = re.compile(rf"(<!-- TABLE:{d} -->\n)(?:.*?\n)?(<!-- /TABLE:{d} -->)", re.S)
        text = pattern.sub(lambda m, t=t: m.group(1) + t + "\n" + m.group(2), text)
    with open(RESULTS_MD, "w", encoding="utf-8") as fh:
        fh.write(text)
    print("updated", RESULTS_MD)
    print("updated", write_cost_section())


if __name__ == "__main__":
    main(sys.argv[1:])
