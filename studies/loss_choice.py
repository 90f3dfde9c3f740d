"""The rule that picks "the two best losses on validation" of the full-data studies (docs/RESULTS.md).

A loss is scored by the best seed-1 validation macro-F1 of its frozen probes (ABALONE's logistic
regressions, the SD paper's linear layer) on the Reuters study: those rows measure the representation
stage 1 produced, and every loss has them within an hour of its stage 1, while a fine-tune re-trains
the encoder with BCE and takes 1-2 h per loss. The choice waits until every contrastive loss has a
probe row of both kinds; test numbers are never read. ``run_all.sh`` calls it to name the losses that run on
GoEmotions and get seeds 2-3, and ``make_tables.py`` prints the same ranking.

    python studies/loss_choice.py reuters21578 2     # prints the two names, e.g. "mulsupcon any"
"""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "results"
)  # studies/results: the study's cells
RESULTS = os.environ.get("MLCL_RESULTS", HERE)  # the per-cell outputs, as in run.py
LOSSES = ("all", "any", "mulsupcon", "sd", "jaccard", "msc", "ws_mulsupcon", "hbl")  # run_all.sh's LOSSES
PROBES = ("logistic", "linear")  # the frozen probes


def _seed1_metrics(results: str, study: str, loss: str, probe: str) -> str:
    """Path of a probe cell's seed-1 metrics.json (written by run.py)."""
    return os.path.join(results, study, f"{loss}_{probe}", "seed1", "metrics.json")


def probe_scores(study: str, results: str = RESULTS) -> dict[str, tuple[float, str]]:
    """{loss: (best seed-1 validation macro-F1 over the frozen probes, that probe)} of the finished cells."""
    best: dict[str, tuple[float, str]] = {}
    for loss in LOSSES:
        for probe in PROBES:
            path = _seed1_metrics(results, study, loss, probe)
            if not os.path.isfile(path):
                continue
            with open(path, encoding="utf-8") as fh:
                score = float(json.load(fh)["metrics"]["validation_macro_f1"])
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


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit("usage: python studies/loss_choice.py <study> [k]")
    try:
        print(" ".join(best_losses(sys.argv[1], int(sys.argv[2]) if len(sys.argv) == 3 else 2)))
    except ValueError as err:
        sys.exit(f"error: {err}")
