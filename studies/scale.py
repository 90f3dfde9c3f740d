"""The data-scale study (issue 52): training subsets, the epoch rule, the cells' names and their cost plan.

Reuters-21578 at 500 and 2,000 training documents, GoEmotions at 1,000 and 4,000: seeded subsets
(``SUBSET_SEED``) every method shares, cells ``<cell>-n<N>``. Epoch rule (:func:`scaled_epochs`): a trained
stage keeps the full-size recipe's number of optimizer steps, never fewer epochs than that recipe.

    python studies/scale.py plan     # each cell's estimated minutes (from the full-size cells' wall times),
                                     # its finished runs and the hours left
    python studies/scale.py sizes reuters21578     # "500 2000" (run_all.sh's scale phases)

Protocol: docs/study.md, "The data-scale study (studies/scale.py)".
"""

from __future__ import annotations

import glob
import json
import math
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)

SIZES = {"reuters21578": (500, 2000), "goemotions_full": (1000, 4000)}  # the sizes below "all"
FULL_TRAIN = {"reuters21578": 6993, "goemotions_full": 43410}  # training rows of the full-size recipes
EVAL_ROWS = {"reuters21578": (777, 3019), "goemotions_full": (5426, 5427)}  # validation, test (whole)
SUBSET_SEED = 52  # draws the subsets; not a training seed (1-3), so every seed trains on the same rows
EVALUATIONS = 10  # validation passes of a subset's fine-tune, evenly spaced over its steps
STAGE1_BATCH = 64  # stage 1's batch (studies/recipes/full_minilm.yaml), SetFit's texts per step
PHASES = {"reuters21578": "scale-reuters", "goemotions_full": "scale-goemotions"}  # run_all.sh's queues
_SUFFIX = re.compile(r"^(?P<base>.+)-n(?P<n>[0-9]+)$")


def scaled_epochs(full_epochs: float, full_size: int, size: int | None) -> float:
    """Epochs of a stage trained on ``size`` rows whose full-size recipe runs ``full_epochs`` over ``full_size``
    rows: the full recipe's optimizer steps kept (``full_epochs * full_size / size``, rounded to whole epochs),
    never below ``full_epochs``; ``size`` None (all) keeps ``full_epochs``."""
    if size is None or size >= full_size:
        return full_epochs
    if size <= 0:
        raise ValueError(f"a training size is a positive number of rows; got {size}")
    return max(full_epochs, round(full_epochs * full_size / size))


def eval_every(epochs: float, size: int, batch: int, evaluations: int = EVALUATIONS) -> int:
    """Optimizer steps between the validation passes of a stage of ``epochs`` over ``size`` rows in batches
    of ``batch`` (the last partial batch is a step): ``evaluations`` passes evenly over its steps."""
    steps = math.ceil(epochs * math.ceil(size / batch))
    return max(1, math.ceil(steps / evaluations))


def check_size(study: str, size: int | None) -> int | None:
    """``size`` when it is a subset size of ``study`` (below its full training split), else ValueError."""
    if size is None:
        return None
    if study not in FULL_TRAIN:
        raise ValueError(
            f"--train-size: no data-scale study for {study!r} (studies: {', '.join(FULL_TRAIN)})"
        )
    if not 0 < size < FULL_TRAIN[study]:
        raise ValueError(
            f"--train-size {size}: {study} has {FULL_TRAIN[study]} training rows; a subset is smaller "
            "(the full-size cells are the 'all' rows: leave --train-size out)"
        )
    return size


def cell_name(base: str, size: int | None) -> str:
    """The cell folder of ``base`` (``<loss>_<probe>[-<tag>]``) at ``size`` rows: ``<base>-n<size>``."""
    return base if size is None else f"{base}-n{size}"


def split_cell(cell: str) -> tuple[str, int | None]:
    """(``base``, size) of a cell folder name; size None for a full-size cell."""
    found = _SUFFIX.match(cell)
    return (cell, None) if found is None else (found["base"], int(found["n"]))


def subset_overrides(size: int | None) -> list[str]:
    """The recipe overrides that keep ``size`` training rows drawn with ``SUBSET_SEED`` (none at full size)."""
    return [] if size is None else ["--max_train_samples", str(size), "--subset_seed", str(SUBSET_SEED)]


def setfit_steps(study: str, size: int | None, rows: int | None = None) -> int:
    """SetFit's pair-training steps at ``size`` (None: all): as many as stage 1 takes there, 64 texts a step, its
    one full-size epoch scaled by the epoch rule; ``rows``: the training rows when not ``size`` / the full size."""
    rows = rows or (FULL_TRAIN[study] if size is None else size)
    return int(scaled_epochs(1, FULL_TRAIN[study], size) * (rows // STAGE1_BATCH))


def _records(results: str, study: str) -> list[dict]:
    """The full-size cells' metrics.json records of ``study``."""
    out = []
    for path in sorted(glob.glob(os.path.join(results, study, "*", "seed*", "metrics.json"))):
        if split_cell(os.path.basename(os.path.dirname(os.path.dirname(path))))[1] is None:
            with open(path, encoding="utf-8") as fh:
                out.append(json.load(fh))
    return out


def rates(study: str, results: str) -> dict[str, float]:
    """Median wall seconds of the full-size cells, per unit of work: a fine-tune epoch and a stage-1 epoch per
    training row, one validation pass, a logistic probe that encodes per encoded row, TF-IDF + logistic
    regression per training row, a SetFit step, its head per training row and its scoring; a joint fine-tune's
    epoch per row from the full-size joint cells (a plain fine-tune's until one is recorded)."""
    recs, n = _records(results, study), FULL_TRAIN[study]
    med = statistics.median
    ft = [r for r in recs if r["probe"] == "finetune"]
    stage1 = {
        (r["loss"], r["seed"], r.get("batch_sampler")): r["wall_s"]["stage1_s"]
        for r in recs
        if r["loss"] != "setfit" and (r.get("wall_s") or {}).get("stage1_s")
    }
    logistic = [
        r["wall_s"]["probe_s"]
        for r in recs
        if r["probe"] == "logistic"
        and r["loss"] not in ("setfit", "pretrained")
        and (r.get("features") or {}).get("train") != "loaded"
    ]
    setfit = [r["wall_s"] for r in recs if r["loss"] == "setfit"]
    joint = [s for r in ft if r["loss"] == "joint" for s in r["epochs"]["epoch_s"]]
    ft_epoch_row = med(s for r in ft if r["loss"] != "joint" for s in r["epochs"]["epoch_s"]) / n
    return {
        "finetune_epoch_row": ft_epoch_row,
        "joint_epoch_row": med(joint) / n if joint else ft_epoch_row,
        "eval": med(e["eval_s"] for r in ft for e in r["epochs"]["evaluations"] if e.get("eval_s")),
        "stage1_epoch_row": med(stage1.values()) / n,
        "logistic_row": med(logistic) / (n + sum(EVAL_ROWS[study])),
        "tfidf_row": med(
            r["wall_s"]["probe_s"] for r in recs if r["loss"] == "tfidf" and r["probe"] == "logreg"
        )
        / n,
        "setfit_step": med(w["stage1_s"] for w in setfit) / setfit_steps(study, None),
        "setfit_head_row": med(w["probe_s"] for w in setfit) / n,
        "setfit_scoring": med(w["scoring_s"] for w in setfit),
    }


def plan(study: str, results: str) -> list[tuple[str, int, int, float, str]]:
    """(cell, size, number of runs, estimated seconds of one run, every step run, the pattern of its cells'
    names for :func:`finished_runs`) of the study's cells at each
    subset size, in run_all.sh's order: TF-IDF + logistic regression (one run: no seed changes it), stage 1 +
    logistic probe of the two best losses (seeds 1-3 each), SetFit (seeds 1-3), BCE fine-tunes (up to 4 learning
    rates on seed 1, then seeds 2-3), the joint objective (two w on seed 1, up to three more past the better edge,
    seeds 2-3 at the best), stage 1 + fine-tune of the better loss at that size (``loss_choice.better_loss``,
    seeds 1-3)."""
    r, full, rows = rates(study, results), FULL_TRAIN[study], []
    for n in SIZES[study]:
        e_ft, e_s1 = scaled_epochs(5, full, n), scaled_epochs(1, full, n)
        val, test = EVAL_ROWS[study]
        # every step, its evaluations, then the best model's validation and test scoring
        evals = (EVALUATIONS + (val + test) / val) * r["eval"]
        finetune = e_ft * n * r["finetune_epoch_row"] + evals
        stage1 = e_s1 * n * r["stage1_epoch_row"]
        logistic = (n + val + test) * r["logistic_row"]
        setfit = setfit_steps(study, n) * r["setfit_step"] + n * r["setfit_head_row"] + r["setfit_scoring"]
        rows += [
            ("tfidf_logreg", n, 1, n * r["tfidf_row"], f"tfidf_logreg-n{n}"),
            (
                f"<loss>_logistic (stage 1: {e_s1:g} epochs)",
                n,
                6,
                stage1 + logistic,
                rf"(?!setfit_|pretrained_)\w+_logistic-n{n}",
            ),
            (f"setfit_logistic, {setfit_steps(study, n)} steps", n, 3, setfit, f"setfit_logistic-n{n}"),
            (f"bce_finetune, {e_ft:g} epochs", n, 6, finetune, rf"bce_finetune-.+-n{n}"),
            (
                f"joint_finetune, {e_ft:g} epochs",
                n,
                7,
                e_ft * n * r["joint_epoch_row"] + evals,
                rf"joint_finetune-.+-n{n}",
            ),
            (f"<loss>_finetune, {e_ft:g} epochs", n, 3, finetune, rf"(?!bce_|joint_)\w+_finetune-.+-n{n}"),
        ]
    return rows


def finished_runs(study: str, results: str, pattern: str) -> int:
    """How many runs (cell x seed, a ``metrics.json`` each) of ``study`` have finished in cells whose name
    matches ``pattern`` (a :func:`plan` row's)."""
    return sum(
        1
        for path in glob.glob(os.path.join(results, study, "*", "seed*", "metrics.json"))
        if re.fullmatch(pattern, os.path.basename(os.path.dirname(os.path.dirname(path))))
    )


def main(argv: list[str]) -> None:
    here = paths.RESULTS
    if argv[:1] == ["sizes"] and len(argv) == 2 and argv[1] in SIZES:
        print(" ".join(str(n) for n in SIZES[argv[1]]))
    elif argv == ["plan"]:
        total = left = 0.0
        for study in SIZES:
            rows = plan(study, here)
            done = [finished_runs(study, here, pattern) for *_, pattern in rows]
            queue = sum(k * s for _, _, k, s, _ in rows)
            rest = sum(max(k - d, 0) * s for (_, _, k, s, _), d in zip(rows, done))
            total, left = total + queue, left + rest
            for (cell, n, k, s, _), d in zip(rows, done):
                print(f"{study} n{n}: {cell}: {k} x {s / 60:.0f} min, {d} done")
            print(
                f"{study}: {queue / 3600:.1f} h, {rest / 3600:.1f} h of it left (run_all.sh {PHASES[study]})"
            )
        print(
            f"both: {total / 3600:.1f} h at the full-size cells' median rates, every step run; "
            f"{left / 3600:.1f} h left at most (a best point inside a grid skips its extensions)"
        )
    else:
        sys.exit("usage: python studies/scale.py plan | sizes reuters21578|goemotions_full")


if __name__ == "__main__":
    main(sys.argv[1:])
