"""Test scores after every epoch of a fine-tune (``run.py cell ... --test-each-epoch``): the points of the
compute figure of docs/RESULTS.md between a run's first epoch and its last.

Each epoch's model is read as a run stopped at that epoch: the global threshold is tuned on its validation
scores and its test split is scored once with it (``cell_io.scored_metrics``). The numbers describe the
curve only; no choice of the study reads them. The callback runs after the timeline's (``timeline.py``),
so the seconds it spends scoring are in no epoch's training time.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
from transformers import TrainerCallback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cell_io  # noqa: E402  (studies/cell_io.py: the protocol's scoring)

KEYS = (
    "threshold",
    "validation_macro_f1",
    "validation_micro_f1",
    "test_macro_f1",
    "test_micro_f1",
    "test_p@1",
)


class EpochTestCallback(TrainerCallback):
    """At every epoch end, score the validation and test splits (raw rows with ``text`` and ``labels``) with
    the current model and append one JSON line to ``path``."""

    def __init__(self, validation, test, num_labels: int, max_length: int, path: str, batch_size: int = 128):
        self.splits = {"validation": validation, "test": test}
        self.num_labels, self.max_length, self.path, self.batch_size = (
            num_labels,
            max_length,
            path,
            batch_size,
        )

    def scores(self, model, tokenizer, split) -> tuple[np.ndarray, np.ndarray]:
        """(sigmoid scores, multi-hot truth) of one split, in eval mode without gradient."""
        from hf_mlcl.data import MultiLabelCollator

        collate = MultiLabelCollator(tokenizer, self.num_labels, max_length=self.max_length)
        loader = torch.utils.data.DataLoader(split, batch_size=self.batch_size, collate_fn=collate)
        device = next(model.parameters()).device
        out, truth = [], []
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for batch in loader:
                labels = batch.pop("labels")
                logits = model(**{k: v.to(device) for k, v in batch.items()}).logits
                out.append(torch.sigmoid(logits.float()).cpu().numpy())
                truth.append(labels.numpy() > 0.5)
        model.train(was_training)
        return np.concatenate(out).astype(np.float64), np.concatenate(truth)

    def on_epoch_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not state.is_world_process_zero:
            return
        (vs, vt), (ts, tt) = (
            self.scores(model, processing_class, self.splits[s]) for s in ("validation", "test")
        )
        metrics = cell_io.scored_metrics(vt, vs, tt, ts)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(
                json.dumps(
                    {
                        "epoch": round(float(state.epoch or 0.0), 4),
                        "global_step": state.global_step,
                        **{k: metrics[k] for k in KEYS},
                    }
                )
                + "\n"
            )


def read_epoch_tests(path: str) -> list[dict]:
    """The records of ``path``, the latest per epoch (a resumed run redoes an epoch), in epoch order."""
    if not os.path.isfile(path):
        return []
    latest: dict[float, dict] = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                rec = json.loads(line)
                latest[rec["epoch"]] = rec
    return [latest[k] for k in sorted(latest)]
