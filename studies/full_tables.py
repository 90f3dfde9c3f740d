"""The full-data studies' own tables of docs/RESULTS.md: ``<study>-full``, ``-lr``, ``-vs-bce`` and ``summary``.

``<study>-full``: every planned row, "not yet run" where a cell has no metrics.json, the fine-tunes at the
learning rate BCE chose on validation; ``<study>-lr``: that choice, validation numbers only; ``<study>-vs-bce``:
each finished contrastive row minus BCE with its seed-spread verdict, and the losses ranked on validation;
``summary``: dataset x method, test metrics and the training seconds of one CPU run.
Cells with 3 seeds show mean ± sample standard deviation (ddof = 1); others show the value and n.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bce_choice  # noqa: E402  (studies/bce_choice.py: the BCE baseline's learning rate and budget)
import loss_choice  # noqa: E402  (studies/loss_choice.py: the losses that get GoEmotions runs and seeds)
import lr_grid  # noqa: E402  (studies/lr_grid.py: the BCE learning-rate grid)
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
import scale_table  # noqa: E402  (studies/scale_table.py: the seed-spread verdict)
from bce_choice import LONG_BUDGET as LONG_BCE  # noqa: E402  (the studies with a longer-budget BCE run)
from run_seconds import cost_cell, per_epoch  # noqa: E402  (studies/run_seconds.py: the runs' seconds)
from study_cells import (  # noqa: E402  (studies/study_cells.py: the cells and the names of the rows)
    BASELINES,
    CONTRASTIVE,
    CPU_DEVICE,
    FULL_PROBES,
    FULL_STUDIES,
    NAMES,
    NOT_RUN,
    ORDER,
    chosen_lr,
    chosen_on_reuters,
    chosen_weight,
    full_runs,
    load,
    long_bce_runs,
    lr_runs,
    metric,
)

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


def _best_epoch(runs: list[dict]) -> str:
    """Best evaluation (epoch) / evaluations run, per seed."""
    out = []
    for r in sorted(runs, key=lambda r: r["seed"]):
        evals = (r.get("epochs") or {}).get("evaluations", [])
        best = [e["epoch"] for e in evals if e.get("eval_macro_f1") == r.get("best_metric")]
        if evals:
            out.append(f"{best[0]:.2g}/{evals[-1]['epoch']:.2g}" if best else f"?/{evals[-1]['epoch']:.2g}")
    return ", ".join(out) or "—"


def _full_row(name: str, label: str, runs: list[dict], probe: str) -> str:
    """One row of a full table: validation and test metrics over the seeds, the best / last epoch of each seed,
    the seeds (the seconds are docs/PERFORMANCE.md's: ``cost_tables.cost_section``)."""
    if not runs:
        return f"| {name} | {label} | {NOT_RUN} | | | | | |"
    return (
        f"| {name} | {label} | {metric(runs, 'validation_macro_f1')} | {metric(runs, 'test_micro_f1')} "
        f"| {metric(runs, 'test_macro_f1')} | {metric(runs, 'test_p@1')} "
        f"| {_best_epoch(runs) if probe != 'logistic' else '—'} "
        f"| {','.join(str(r['seed']) for r in sorted(runs, key=lambda r: r['seed']))} |"
    )


def planned_losses(study: str, plain: dict) -> list[str]:
    """The contrastive losses a study's table lists: every loss on Reuters (where the two best are chosen), and
    elsewhere the two chosen there plus any loss with a finished cell (``run_all.sh``'s plan)."""
    if study == "reuters21578":
        return list(CONTRASTIVE)
    chosen = set(chosen_on_reuters()) | {loss for loss, _ in plain}
    return [loss for loss in CONTRASTIVE if loss in chosen]


def full_table(study: str) -> str:
    """Every planned row of a full-data study (:func:`planned_losses`); rows without a metrics.json say "not yet
    run". Outside Reuters only the two losses chosen there are fine-tuned (``run_all.sh``): another loss with
    probe cells lists its fine-tune row once that has run."""
    plain, tagged = load(study), load(study, tagged=True)
    lr = chosen_lr(study)
    planned = planned_losses(study, {**plain, **tagged})
    fine_tuned = set(CONTRASTIVE) if study == "reuters21578" else set(chosen_on_reuters())
    head = (
        "| stage 1 | stage 2 | validation macro-F1 | test micro-F1 | test macro-F1 | test P@1 | best / last epoch "
        "| seeds |\n|---|---|---|---|---|---|---|---|"
    )
    rows = [head, *ANCHORS.get(study, [])]
    for loss in [x for x in ORDER if x not in CONTRASTIVE or x in planned]:
        for probe in ("finetune",) if loss == "bce" else ("logistic", "linear", "finetune"):
            if loss == "pretrained" and probe == "finetune":
                continue  # that is the BCE row
            runs = full_runs(plain, tagged, lr, loss, probe)
            if probe == "finetune" and loss in CONTRASTIVE and loss not in fine_tuned and not runs:
                continue  # not in the plan of this study
            if probe == "finetune":
                label = "fine-tune"
                if lr:
                    done, planned = len(lr_runs(tagged, "bce")), 1 + len(lr_grid.FIRST)
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
        f"The bar (`bce_choice.py`; seed-1 validation macro-F1 {metric(base, 'validation_macro_f1')} with 5 "
        f"epochs, {metric(long, 'validation_macro_f1')} with {LONG_BCE[study]}): **{bar}**; a loss helps where "
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
    bce = full_runs(plain, tagged, lr, "bce", "finetune")
    long = study in LONG_BCE
    long_bce = long_bce_runs(study, tagged, lr)
    try:
        budget = bce_choice.bce_budget(study, paths.RESULTS)
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
            runs = full_runs(plain, tagged, lr, loss, probe)
            if not runs:
                continue
            macro, micro = _delta(runs, bce, "test_macro_f1"), _delta(runs, bce, "test_micro_f1")
            frozen = (
                None
                if probe == "finetune"
                else _delta(runs, plain.get(("pretrained", probe), []), "test_macro_f1")
            )
            rows.append(
                f"| {NAMES.get(loss, loss)} | {FULL_PROBES[probe]} | {metric(runs, 'validation_macro_f1')} "
                f"| {_signed(macro)} | {_signed(micro)} "
                f"| {macro[1] if macro else 'no BCE baseline yet'} "
                f"| {_signed(frozen)} |"
                + (_vs_long(_delta(runs, long_bce, "test_macro_f1"), budget) if long else "")
            )
    if len(rows) == 2:
        return "No contrastive row has finished yet."
    ranked = loss_choice.ranked(study, paths.RESULTS)
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
    runs = lr_runs(load(study, tagged=True), "bce")
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
            f"| {lr} | {metric(rs, 'validation_macro_f1')} | {metric(rs, 'validation_micro_f1')} "
            f"| {_best_epoch(rs)} | {per_epoch(rs)} |"
        )
    if len(lrs) == len(lr_grid.FIRST):
        rows.append(
            f"| third: {lr_grid.ABOVE} or {lr_grid.BELOW}, chosen on validation once "
            f"{' and '.join(lr_grid.FIRST)} have run | {NOT_RUN} | | | |"
        )
    return "\n".join(rows)


def summary_rows(study: str) -> list[tuple[str, list[dict]]]:
    """(method, runs) of the summary table for one study: the BCE baselines, the joint objective at the w chosen
    on validation, the TF-IDF and SetFit baselines, the frozen MiniLM's probes, and both probes and the
    fine-tune of the two losses chosen on validation."""
    plain, tagged, lr = load(study), load(study, tagged=True), chosen_lr(study)
    rows = [
        (
            f"BCE fine-tune, lr {lr or '?'} (chosen on validation), up to 5 epochs",
            full_runs(plain, tagged, lr, "bce", "finetune"),
        )
    ]
    if study in LONG_BCE:
        rows.append((f"BCE fine-tune, lr {lr or '?'}, {LONG_BCE[study]}", long_bce_runs(study, tagged, lr)))
    w = chosen_weight(study)
    rows.append(
        (
            f"joint (1 - w) BCE + w jaccard, w {w or '?'} (chosen on validation), lr {lr or '?'}, up to 5 epochs",
            tagged.get(("joint", f"finetune-w{w}-lr{lr}"), []) if w and lr else [],
        )
    )
    rows += [(label, plain.get(key, [])) for key, label in BASELINES.items()]
    rows += [
        (f"frozen MiniLM + {FULL_PROBES[p]}", plain.get(("pretrained", p), []))
        for p in ("logistic", "linear")
    ]
    for loss in chosen_on_reuters():
        rows += [
            (f"{NAMES.get(loss, loss)} stage 1 + {FULL_PROBES[p]}", full_runs(plain, tagged, lr, loss, p))
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
                f"| {study} | {label} | {metric(runs, 'test_micro_f1')} | {metric(runs, 'test_macro_f1')} "
                f"| {metric(runs, 'test_p@1')} | {cost_cell(runs)} |"
            )
    return "\n".join(rows)
