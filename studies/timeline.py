"""Wall-time bookkeeping of one training run for studies/run.py: a ``transformers.TrainerCallback``
appending one JSON line per finished epoch and per evaluation to ``<output_dir>/timeline.jsonl``.

The file survives a resumed run (``resume_from_checkpoint``), so the per-epoch wall times of a cell that
spans several processes are all kept; :func:`epoch_summary` keeps the latest record of each epoch (an
epoch redone after a resume replaces the interrupted one). An epoch record also says how many optimizer
steps it timed and how many a whole epoch has: a run resumed from a mid-epoch checkpoint times only the
rest of that epoch (the killed process never wrote its part), and the summary scales such an epoch to a
whole one from its time per step, naming it.
"""

from __future__ import annotations

import json
import math
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
        self._epoch_step0 = 0
        self._eval_in_epoch = 0.0
        self._step_t0: float | None = None

    def _append(self, record: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps({"run_start": self.run_start, "time": time.time(), **record}, default=float) + "\n"
            )

    def on_epoch_begin(self, args, state, control, **kwargs):
        self._epoch_t0, self._eval_in_epoch = time.time(), 0.0
        self._epoch_step0 = state.global_step  # > epoch start when resumed from a mid-epoch checkpoint

    def on_step_end(self, args, state, control, **kwargs):
        self._step_t0 = time.time()  # an evaluation at this step starts now

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        eval_s = time.time() - self._step_t0 if self._step_t0 is not None else None
        if eval_s is not None and self._epoch_t0 is not None:
            self._eval_in_epoch += eval_s
        self._append(
            {
                "event": "evaluate",
                "epoch": state.epoch,
                "global_step": state.global_step,
                "eval_s": eval_s,
                "metrics": metrics or {},
            }
        )

    def on_epoch_end(self, args, state, control, **kwargs):
        if self._epoch_t0 is None:
            return
        epoch_s = time.time() - self._epoch_t0 - self._eval_in_epoch
        self._append(
            {
                "event": "epoch",
                "epoch": round(float(state.epoch or 0.0), 4),
                "global_step": state.global_step,
                "epoch_s": round(epoch_s, 1),
                "start_step": self._epoch_step0,
                "steps": state.global_step - self._epoch_step0,
                "epoch_steps": _steps_per_epoch(args, state),
            }
        )
        self._epoch_t0 = None


def _steps_per_epoch(args, state) -> int | None:
    """Optimizer steps of a whole epoch: Trainer sets ``max_steps`` = epochs x steps per epoch when the run is
    sized in epochs (``args.max_steps`` <= 0); None when it is sized in steps."""
    epochs = getattr(args, "num_train_epochs", None)
    if not epochs or getattr(args, "max_steps", -1) > 0 or not getattr(state, "max_steps", 0):
        return None
    return round(state.max_steps / epochs)


def read_timeline(path: str) -> list[dict]:
    """The records of ``timeline.jsonl`` (empty when the file does not exist)."""
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def epoch_summary(path: str) -> dict:
    """``{"epoch_s": [...], "whole_epoch_s": [...], "resumed_epochs": [...], "evaluations": [...]}``: the latest
    record per epoch / per evaluation step. ``epoch_s`` is as timed; ``whole_epoch_s`` scales an epoch whose
    timing began inside it (resumed from a mid-epoch checkpoint) to a whole epoch by its time per step;
    ``resumed_epochs`` names those epochs; an epoch that ended inside itself (early stopping between epoch
    ends) has ``None`` there and is named in ``stopped_epochs``."""
    epochs: dict[float, dict] = {}
    evals: dict[int, dict] = {}
    for rec in read_timeline(path):
        if rec["event"] == "epoch":  # epoch 4.33 (an early stop a third into epoch 5) is epoch 5, not 4
            epochs[math.ceil(rec["epoch"] - 1e-6)] = rec
        elif rec["event"] == "evaluate":
            evals[int(rec["global_step"])] = rec
    whole, resumed, stopped = [], [], []
    for k in sorted(epochs):
        rec = epochs[k]
        steps, full, start = rec.get("steps"), rec.get("epoch_steps"), rec.get("start_step")
        if (
            abs(rec["epoch"] - round(rec["epoch"])) > 1e-3
        ):  # ended inside the epoch (early stop): no whole epoch
            whole.append(None)
            stopped.append(k)
        elif steps and full and start is not None and start % full and steps < full:
            # resumed: the timed part began inside the epoch
            whole.append(round(rec["epoch_s"] * full / steps, 1))
            resumed.append(k)
        else:
            whole.append(rec["epoch_s"])
    return {
        "epoch_s": [epochs[k]["epoch_s"] for k in sorted(epochs)],
        "whole_epoch_s": whole,
        "resumed_epochs": resumed,
        "stopped_epochs": stopped,
        "evaluations": [
            {
                "epoch": r["epoch"],
                "global_step": s,
                "eval_s": None if r["eval_s"] is None else round(r["eval_s"], 1),
                **{
                    k: r["metrics"][k]
                    for k in ("eval_micro_f1", "eval_macro_f1", "eval_loss")
                    if k in r["metrics"]
                },
            }
            for s, r in sorted(evals.items())
        ],
    }
