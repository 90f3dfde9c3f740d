"""Wall-time bookkeeping of one training run for docs/results/run.py: a ``transformers.TrainerCallback``
appending one JSON line per finished epoch and per evaluation to ``<output_dir>/timeline.jsonl``.

The file survives a resumed run (``resume_from_checkpoint``), so the per-epoch wall times of a cell that
spans several sessions are all kept; :func:`epoch_summary` keeps the latest record of each epoch (an
epoch redone after a resume replaces the interrupted one).
"""

from __future__ import annotations

import json
import os
import time

from transformers import TrainerCallback


class TimelineCallback(TrainerCallback):
    """Record ``epoch_s`` (training wall time of each epoch, evaluations inside it excluded) and
    ``eval_s`` with the evaluation metrics, as JSON lines in ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.run_start = time.time()
        self._epoch_t0: float | None = None
        self._eval_in_epoch = 0.0
        self._step_t0: float | None = None

    def _append(self, record: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"run_start": self.run_start, "time": time.time(), **record}, default=float) + "\n")

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_t0, self._eval_in_epoch = time.time(), 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self._step_t0 = time.time()  # an evaluation at this step starts now

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        eval_s = time.time() - self._step_t0 if self._step_t0 is not None else None
        if eval_s is not None and self._epoch_t0 is not None:
            self._eval_in_epoch += eval_s
        self._append({"event": "evaluate", "epoch": state.epoch, "global_step": state.global_step,
                      "eval_s": eval_s, "metrics": metrics or {}})  # fmt: skip

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._epoch_t0 is None:
            return
        epoch_s = time.time() - self._epoch_t0 - self._eval_in_epoch
        self._append({"event": "epoch", "epoch": round(float(state.epoch or 0.0), 4), "global_step": state.global_step,
                      "epoch_s": round(epoch_s, 1)})  # fmt: skip
        self._epoch_t0 = None


def read_timeline(path: str) -> list[dict]:
    """The records of ``timeline.jsonl`` (empty when the file does not exist)."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def epoch_summary(path: str) -> dict:
    """``{"epoch_s": [...], "evaluations": [...]}``: the latest record per epoch / per evaluation step."""
    epochs: dict[float, dict] = {}
    evals: dict[int, dict] = {}
    for rec in read_timeline(path):
        if rec["event"] == "epoch":
            epochs[round(rec["epoch"])] = rec
        elif rec["event"] == "evaluate":
            evals[int(rec["global_step"])] = rec
    return {
        "epoch_s": [epochs[k]["epoch_s"] for k in sorted(epochs)],
        "evaluations": [
            {"epoch": r["epoch"], "global_step": s, "eval_s": None if r["eval_s"] is None else round(r["eval_s"], 1),
             **{k: r["metrics"][k] for k in ("eval_micro_f1", "eval_macro_f1", "eval_loss") if k in r["metrics"]}}
            for s, r in sorted(evals.items())
        ],
    }
