"""The BCE fine-tuning learning rates of the full-data studies (docs/RESULTS.md) and the rule for the third.

The grid starts at 5e-5 and 1e-4. Its third point is chosen on validation, after the first two have run:
it extends the grid on the side of the better of them (2e-4 when 1e-4 has the higher validation macro-F1,
2e-5 otherwise), because a best value at the edge of a grid says the optimum may lie beyond that edge.
Test numbers are never read. ``studies/run.py --lr extend`` runs that third point and
``make_tables.py`` labels the grid with it.
"""

from __future__ import annotations

FIRST = ("5e-5", "1e-4")
ABOVE, BELOW = "2e-4", "2e-5"


def third_lr(validation_macro_f1: dict[str, float]) -> str | None:
    """The third learning rate from the first two's seed-1 validation macro-F1 (None until both have run)."""
    if any(lr not in validation_macro_f1 for lr in FIRST):
        return None
    return ABOVE if validation_macro_f1[FIRST[1]] >= validation_macro_f1[FIRST[0]] else BELOW


def planned_lrs(validation_macro_f1: dict[str, float]) -> tuple[str, ...]:
    """The grid as far as it is decided: the first two, and the third once they have run."""
    third = third_lr(validation_macro_f1)
    return FIRST if third is None else (*FIRST, third)
