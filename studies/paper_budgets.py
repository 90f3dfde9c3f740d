"""The stage-1 budgets of the papers the losses come from (../shared/papers): epochs, batch and MoCo queue,
for the study's rows "at the papers' budgets" (``run_gpu.sh papers``; they need a GPU).

    python studies/paper_budgets.py msc      # prints the recipe overrides of one loss

Each :class:`Budget` keeps the values used beside what its paper states; the learning rate, warm-up,
projection head and sequence length stay the study's.

Protocol: docs/study.md, "The papers' budgets (studies/paper_budgets.py)".
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass

NOT_STATED = "not stated"


@dataclass(frozen=True)
class Budget:
    """One loss's stage-1 budget: the values used and, for each, what its paper says."""

    paper: str
    epochs: int
    batch: int
    queue: int
    stated: str  # which of the three the paper states, in words
    loss_kwargs: dict | None = None  # the loss settings the CPU rows changed for want of a queue

    def overrides(self) -> list[str]:
        """Recipe overrides (``run.py cell ... <overrides>``) that give stage 1 this budget."""
        out = [
            "--contrastive.num_train_epochs",
            str(self.epochs),
            "--contrastive.per_device_train_batch_size",
            str(self.batch),
            "--contrastive.queue_size",
            str(self.queue),
        ]
        if self.loss_kwargs is not None:
            out += [
                "--contrastive.loss_kwargs",
                json.dumps(self.loss_kwargs, sort_keys=True, separators=(",", ":")),
            ]
        return out


_SD = dict(
    paper="SD",
    epochs=80,
    batch=128,
    queue=0,
    stated="batch 128 (earlier version, text); epochs not stated (ABALONE's 80); in-batch contrast",
)
_HBL = dict(
    paper="HBL",
    epochs=80,
    batch=128,
    queue=4096,
    stated="queue 4,096; batch searched in 32-256; epochs not stated (ABALONE's 80)",
)
BUDGETS: dict[str, Budget] = {
    "msc": Budget(
        paper="ABALONE", epochs=80, batch=32, queue=512, stated="all three (App. A); momentum 0.999"
    ),
    "jaccard": Budget(
        paper="ABALONE (its L_Base)",
        epochs=80,
        batch=32,
        queue=0,
        stated="ABALONE's setup for its baseline, without the queue",
    ),
    "sd": Budget(**_SD),
    "all": Budget(**{**_SD, "paper": "SD (its baseline)"}),
    "any": Budget(**{**_SD, "paper": "SD (its baseline)"}),
    "hbl": Budget(**_HBL, loss_kwargs={"base": "mulsupcon", "k_min": 128}),
    "mulsupcon": Budget(**{**_HBL, "paper": "HBL (its base loss)"}),
    "ws_mulsupcon": Budget(
        paper="ws-MulSupCon",
        epochs=100,
        batch=64,
        queue=4096,
        stated="epochs 100, batch 64; a queue (eq. 1) of unstated size (HBL's 4,096)",
    ),
}


def table() -> str:
    """The budgets as a markdown table (docs/RESULTS.md, ``papers-budgets``)."""
    rows = ["| loss | paper | epochs | batch | queue | what the paper states |", "|---|---|---|---|---|---|"]
    for loss, b in BUDGETS.items():
        queue = f"{b.queue:,}" if b.queue else "none (in-batch)"
        rows.append(f"| {loss} | {b.paper} | {b.epochs} | {b.batch} | {queue} | {b.stated} |")
    return "\n".join(rows)


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in BUDGETS:
        sys.exit(f"usage: python studies/paper_budgets.py {{{','.join(BUDGETS)}}}")
    print(" ".join(BUDGETS[sys.argv[1]].overrides()))
