"""The BCE fine-tuning learning rates of the full-data studies (docs/RESULTS.md) and the rule that extends a grid.

The grid starts at 5e-5 and 1e-4. Its third point is chosen on validation, after the first two have run:
it extends the grid on the side of the better of them (2e-4 when 1e-4 has the higher validation macro-F1,
2e-5 otherwise), because a best value at the edge of a grid says the optimum may lie beyond that edge.
A second extension (``extend2``, the data-scale study) applies the same rule to the three points: a fourth
one step further along ``LADDER`` when the third is the best, none when the best lies inside the grid.
Test numbers are never read. ``studies/run.py --lr extend`` / ``extend2`` runs those points and
``make_tables.py`` labels the grid with them. The joint objective's grid of w extends by the same rule
(:func:`extend_grid`; its points: ``bce_choice.JOINT_WEIGHTS`` and ``JOINT_LADDER``).
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


def extend_grid(
    scores: dict[str, float],
    first: tuple[str, ...],
    ladder: tuple[str, ...],
    k: int = 1,
    what: str = "points",
) -> str | None:
    """A grid's ``k``-th extension: one ``ladder`` step past the edge holding the best validation macro-F1 in
    ``scores`` (a tie goes to the larger value), None when the best lies inside the grid or the ladder ends
    there; NotReady (naming the ``what`` missing) until every point it is chosen from has run (``first``, then
    each earlier extension)."""
    grid = list(first)
    for _ in range(k):
        missing = [point for point in grid if point not in scores]
        if missing:
            raise NotReady(f"the {what} {', '.join(missing)} have not run")
        ranked = sorted(grid, key=float)
        best = max(ranked, key=lambda point: (scores[point], float(point)))
        step = 1 if best == ranked[-1] else -1 if best == ranked[0] else 0
        at = ladder.index(best) + step
        if step == 0 or not 0 <= at < len(ladder):
            return None
        grid.append(ladder[at])
    return grid[-1]


def extension_lr(validation_macro_f1: dict[str, float], k: int = 1) -> str | None:
    """The BCE grid's ``k``-th extension (:func:`extend_grid` over ``FIRST`` and ``LADDER``)."""
    return extend_grid(validation_macro_f1, FIRST, LADDER, k, "learning rates")


def grid_complete(
    scores: dict[str, float], first: tuple[str, ...], ladder: tuple[str, ...], extensions: int
) -> bool:
    """Whether every point of the grid has a score: ``first`` and each of up to ``extensions`` extensions
    (:func:`extend_grid`) that validation asks for; a best point inside the grid asks for none further."""
    try:
        for k in range(1, extensions + 1):
            point = extend_grid(scores, first, ladder, k)
            if point is None:
                return True
            if point not in scores:
                return False
    except NotReady:
        return False
    return True
