"""The BCE fine-tuning learning rates of the full-data studies (docs/RESULTS.md) and the rule for the third.

The grid starts at 5e-5 and 1e-4. Its third point is chosen on validation, after the first two have run:
it extends the grid on the side of the better of them (2e-4 when 1e-4 has the higher validation macro-F1,
2e-5 otherwise), because a best value at the edge of a grid says the optimum may lie beyond that edge.
A second extension (``extend2``, the data-scale study) applies the same rule to the three points: a fourth
one step further along ``LADDER`` when the third is the best, none when the best lies inside the grid.
Test numbers are never read. ``studies/run.py --lr extend`` / ``extend2`` runs those points and
``make_tables.py`` labels the grid with them.
"""

from __future__ import annotations

FIRST = ("5e-5", "1e-4")
ABOVE, BELOW = "2e-4", "2e-5"
LADDER = (
    "5e-6",
    "1e-5",
    "2e-5",
    "5e-5",
    "1e-4",
    "2e-4",
    "5e-4",
    "1e-3",
    "2e-3",
)  # the grid's possible points


def third_lr(validation_macro_f1: dict[str, float]) -> str | None:
    """The third learning rate from the first two's seed-1 validation macro-F1 (None until both have run)."""
    try:
        return extension_lr(validation_macro_f1, 1)
    except NotReady:
        return None


def planned_lrs(validation_macro_f1: dict[str, float]) -> tuple[str, ...]:
    """The grid as far as it is decided: the first two, and the third once they have run."""
    third = third_lr(validation_macro_f1)
    return FIRST if third is None else (*FIRST, third)


class NotReady(ValueError):
    """An extension asked for before the grid points it is chosen from have run."""


def extension_lr(validation_macro_f1: dict[str, float], k: int = 1) -> str | None:
    """The grid's ``k``-th extension: one ``LADDER`` step past the edge holding the best validation macro-F1
    (a tie goes to the larger rate), None when the best lies inside the grid or the ladder ends there;
    NotReady until every point it is chosen from has run (the first two, then each earlier extension)."""
    grid = list(FIRST)
    for _ in range(k):
        missing = [lr for lr in grid if lr not in validation_macro_f1]
        if missing:
            raise NotReady(f"the learning rates {', '.join(missing)} have not run")
        ranked = sorted(grid, key=float)
        best = max(ranked, key=lambda lr: (validation_macro_f1[lr], float(lr)))
        step = 1 if best == ranked[-1] else -1 if best == ranked[0] else 0
        at = LADDER.index(best) + step
        if step == 0 or not 0 <= at < len(LADDER):
            return None
        grid.append(LADDER[at])
    return grid[-1]
