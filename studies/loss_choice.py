"""The rule that picks "the two best losses on validation" of the full-data studies (docs/RESULTS.md).

A loss is scored by the best seed-1 validation macro-F1 of its frozen probes (ABALONE's logistic
regressions, the SD paper's linear layer) on the Reuters study: those rows measure the representation
stage 1 produced, and every loss has them within an hour of its stage 1, while a fine-tune re-trains
the encoder with BCE and takes 1-2 h per loss. The choice waits until every contrastive loss has a
probe row of both kinds; test numbers are never read. ``run_all.sh`` calls it to name the losses that run on
GoEmotions and get seeds 2-3, and ``make_tables.py`` prints the same ranking. At a subset size of the
data-scale study, the fine-tune from stage 1 runs with one of those two: the one whose logistic probe has the
better validation macro-F1 there, mean over its 3 seeds (:func:`better_loss`).

    python studies/loss_choice.py reuters21578 2     # prints the two names, e.g. "mulsupcon any"
    python studies/loss_choice.py reuters21578 --train-size 500 jaccard mulsupcon   # the better at 500 rows
"""

from __future__ import annotations

import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cell_io import metrics_path, validation_macro_f1  # noqa: E402  (studies/cell_io.py: a cell's files)
from paths import RESULTS  # noqa: E402  (studies/paths.py: where the cells' outputs live)

LOSSES = (
    "all",
    "any",
    "mulsupcon",
    "sd",
    "jaccard",
    "msc",
    "ws_mulsupcon",
    "hbl",
)  # run_all.sh reads them (--losses)
PROBES = ("logistic", "linear")  # the frozen probes
SEEDS = (1, 2, 3)  # the training seeds of a cell


def _seed1_metrics(results: str, study: str, loss: str, probe: str) -> str:
    """Path of a probe cell's seed-1 metrics.json (written by run.py)."""
    return metrics_path(study, f"{loss}_{probe}", 1, results)


def probe_scores(study: str, results: str = RESULTS) -> dict[str, tuple[float, str]]:
    """{loss: (best seed-1 validation macro-F1 over the frozen probes, that probe)} of the finished cells."""
    best: dict[str, tuple[float, str]] = {}
    for loss in LOSSES:
        for probe in PROBES:
            path = _seed1_metrics(results, study, loss, probe)
            if not os.path.isfile(path):
                continue
            score = validation_macro_f1(path)
            if loss not in best or score > best[loss][0]:
                best[loss] = (score, probe)
    return best


def ranked(study: str, results: str = RESULTS) -> list[tuple[str, float, str]]:
    """(loss, score, probe) from the best to the worst validation score (ties: the order of LOSSES)."""
    scores = probe_scores(study, results)
    return sorted(((loss, *scores[loss]) for loss in LOSSES if loss in scores), key=lambda r: -r[1])


def best_losses(study: str, k: int = 2, results: str = RESULTS) -> list[str]:
    """The ``k`` losses with the best frozen-probe validation macro-F1; ValueError until every loss has both
    probe rows (so two queues asking at different times get the same answer)."""
    missing = [
        f"{loss} {probe}"
        for loss in LOSSES
        for probe in PROBES
        if not os.path.isfile(_seed1_metrics(results, study, loss, probe))
    ]
    if missing:
        raise ValueError(
            f"{study}: no seed-1 probe row yet for {', '.join(missing)}; the best losses are chosen once every "
            f"loss has both (run_all.sh full-reuters runs them first)"
        )
    return [loss for loss, _, _ in ranked(study, results)[:k]]


def better_loss(study: str, size: int, losses: list[str], results: str = RESULTS) -> str:
    """The one of ``losses`` whose stage 1 + logistic probe has the best validation macro-F1 at ``size`` training
    rows (studies/scale.py), mean over seeds 1-3 (ties: the earlier in ``losses``, the full-size ranking): the
    loss a subset's stage 1 + fine-tune runs with. ValueError until every seed of every loss has its probe cell."""
    from scale import cell_name  # studies/scale.py: a subset's cells end in -n<N>

    means, missing = {}, []
    for loss in losses:
        cell, scores = cell_name(f"{loss}_logistic", size), []
        for seed in SEEDS:
            path = metrics_path(study, cell, seed, results)
            if os.path.isfile(path):
                scores.append(validation_macro_f1(path))
            else:
                missing.append(f"{cell} seed {seed}")
        means[loss] = statistics.fmean(scores) if scores else None
    if missing or not losses:
        raise ValueError(
            f"{study} n{size}: the fine-tuned loss is chosen once every probe cell has run; missing: "
            f"{', '.join(missing) or 'no loss named'}"
        )
    return max(losses, key=lambda loss: (means[loss], -losses.index(loss)))


if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv == ["--losses"]:  # the study's losses, for run_all.sh
        print(" ".join(LOSSES))
        sys.exit(0)
    sized = len(argv) >= 4 and argv[1] == "--train-size" and argv[2].isdigit()
    if not sized and len(argv) not in (1, 2):
        sys.exit(
            "usage: python studies/loss_choice.py <study> [k] | <study> --train-size <N> <loss>... | --losses"
        )
    try:
        if sized:
            print(better_loss(argv[0], int(argv[2]), argv[3:]))
        else:
            print(" ".join(best_losses(argv[0], int(argv[1]) if len(argv) == 2 else 2)))
    except ValueError as err:
        sys.exit(f"error: {err}")
