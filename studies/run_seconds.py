"""The seconds a cell's run recorded, as the tables count them: stage 2's, a run's training and its epochs'.

A stage resumed across processes, or a frozen probe that loaded its features instead of encoding them, gives
a lower bound; a table marks it "≥" (whole runs) or "≈" (epochs estimated whole from a resumed part).
"""

from __future__ import annotations

import numpy as np


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


def cost_cell(runs: list[dict]) -> str:
    """Mean training seconds of ``runs``: over the runs timed whole where there are any, else over the lower
    bounds, marked "≥"."""
    walls = [w for w in (train_seconds(r) for r in runs) if w[0] is not None]
    whole = [s for s, low in walls if not low]
    if whole:
        return f"{np.mean(whole):,.0f}"
    return f"≥{np.mean([s for s, _ in walls]):,.0f}" if walls else "—"


def whole_epochs(records: list[dict]) -> list[float]:
    """Every whole epoch's seconds in the epoch records: a resumed run's by their whole-epoch estimate
    (``timeline.epoch_summary``); an epoch cut by early stopping (None) is no measure of a whole one."""
    return [x for e in records for x in (e.get("whole_epoch_s") or e.get("epoch_s") or []) if x is not None]


def per_epoch(runs: list[dict]) -> str:
    """Mean training wall time per epoch of stage 2 (seconds) over the runs' recorded epochs; an epoch a
    resumed run timed only in part counts by its whole-epoch estimate and marks the value "≈"."""
    records = [r.get("epochs") or {} for r in runs]
    v = whole_epochs(records)
    scaled = any(bool(e.get("resumed_epochs")) for e in records)
    return f"{'≈' if scaled else ''}{np.mean(v):.0f}" if v else "—"
