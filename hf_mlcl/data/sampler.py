"""Positive-ensured batches: an epoch order in which every anchor of a batch has a positive.

:class:`PositiveEnsuredSampler` groups rows into units of each other's positives under the loss's
``sampler_rule`` and lays the shuffled units out batch by batch, the same order on every process.

Design: docs/design.md, "Positive-ensured batches (hf_mlcl/data/sampler.py)".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

__all__ = ["RULES", "PositiveEnsuredSampler"]

RULES = ("same_label_set", "shared_label")
LOOKAHEAD = 64  # units searched for one that fits a batch's remaining space
MAX_UNIT = 4  # rows a unit grows to when a row left alone joins it


def _units_same_label_set(
    rows: Sequence[Sequence[int]], rng: np.random.Generator, batch_size: int
) -> list[list[int]]:
    groups: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for i, row in enumerate(rows):
        groups[tuple(sorted(set(row)))].append(i)
    units: list[list[int]] = []
    for members in groups.values():
        members = [members[k] for k in rng.permutation(len(members))]
        pairs = [members[k : k + 2] for k in range(0, len(members) - len(members) % 2, 2)]
        if len(members) % 2:
            if pairs:
                pairs[-1].append(members[-1])  # a triple: all three are each other's positives
            else:
                pairs.append(members[-1:])  # a label set no other row has
        units.extend(pairs)
    return units


def _units_shared_label(
    rows: Sequence[Sequence[int]], rng: np.random.Generator, batch_size: int
) -> list[list[int]]:
    keys = [sorted(set(row)) or [-1] for row in rows]  # -1: the rows without labels pair with each other
    pools: dict[int, list[int]] = defaultdict(list)
    for i in rng.permutation(len(rows)).tolist():
        for label in keys[i]:
            pools[label].append(i)
    size = {label: len(pool) for label, pool in pools.items()}
    for labels in keys:
        labels.sort(key=lambda label: size[label])
    # rows of the rarest labels look for a partner first; ties in the random order
    order = sorted(rng.permutation(len(rows)).tolist(), key=lambda i: size[keys[i][0]])
    next_in_pool = dict.fromkeys(pools, 0)
    taken = np.zeros(len(rows), dtype=bool)
    units: list[list[int]] = []
    for i in order:
        if taken[i]:
            continue
        taken[i] = True
        partner = None
        for label in keys[i]:
            pool, k = pools[label], next_in_pool[label]
            while k < len(pool) and taken[pool[k]]:
                k += 1
            next_in_pool[label] = k
            if k < len(pool):
                partner = pool[k]
                break
        if partner is None:
            units.append([i])
        else:
            taken[partner] = True
            units.append([i, partner])
    return _join_singles(units, keys, pools, cap=min(batch_size, MAX_UNIT))


def _join_singles(
    units: list[list[int]], keys: list[list[int]], pools: dict[int, list[int]], cap: int
) -> list[list[int]]:
    """A row left alone (its labels' other rows were paired first) joins the unit of a row it shares a label
    with, while that unit holds fewer than ``cap`` rows."""
    unit_of = {row: k for k, unit in enumerate(units) for row in unit}
    for k in [k for k, unit in enumerate(units) if len(unit) == 1]:
        (i,) = units[k]
        for label in keys[i]:
            host = next((unit_of[j] for j in pools[label] if j != i and len(units[unit_of[j]]) < cap), None)
            if host is not None:
                units[host].append(i)
                units[k] = []
                unit_of[i] = host
                break
    return [unit for unit in units if unit]


def _even_units(units: list[list[int]], batch_size: int) -> list[list[int]]:
    """With an even batch size, the odd-sized units two by two (in their order) as one unit: batches then
    fill with even-sized units only and no unit has to be split for a gap of one row."""
    if batch_size % 2:
        return units
    out: list[list[int]] = []
    waiting: list[int] | None = None
    for unit in units:
        if len(unit) % 2 == 0:
            out.append(unit)
        elif waiting is None:
            waiting = unit
        elif len(waiting) + len(unit) <= batch_size:
            out.append(waiting + unit)
            waiting = None
        else:
            out.append(waiting)
            waiting = unit
    return out + ([waiting] if waiting is not None else [])


def _pick(pending: list[list[int]], head: int, space: int) -> int | None:
    """Which of the next units goes into a batch with ``space`` rows left: the first that fills it exactly,
    else the first that leaves an even gap (which pairs can fill), else the first that fits."""
    window = [k for k in range(head, min(len(pending), head + LOOKAHEAD)) if len(pending[k]) <= space]
    for good in (lambda k: len(pending[k]) == space, lambda k: (space - len(pending[k])) % 2 == 0):
        chosen = next((k for k in window if good(k)), None)
        if chosen is not None:
            return chosen
    return window[0] if window else None


def _lay_out(units: list[list[int]], batch_size: int) -> list[int]:
    """The units in order, ``batch_size`` rows a batch (:func:`_pick`); a unit is split across two batches
    only when none of the next ones fits the space left."""
    order: list[int] = []
    pending = _even_units(units, batch_size)
    head, space = 0, batch_size
    while head < len(pending):
        chosen = _pick(pending, head, space)
        if chosen is None:  # nothing fits: this unit's first rows end the batch, the rest start the next
            unit, pending[head] = pending[head][:space], pending[head][space:]
        else:
            pending[head], pending[chosen] = pending[chosen], pending[head]
            unit = pending[head]
            head += 1
        order.extend(unit)
        space -= len(unit)
        if space == 0:
            space = batch_size
    return order


class PositiveEnsuredSampler(Sampler[int]):
    """An epoch order of the rows in which every anchor of a batch has a positive (module docstring).

    Args:
        labels: each row's label ids (a list per row; an empty list is a row without labels).
        batch_size: rows per batch of one process (``per_device_train_batch_size``).
        rule: ``"same_label_set"`` or ``"shared_label"``: the loss's ``sampler_rule``.
        seed: with the epoch, the only source of randomness.
    """

    def __init__(
        self, labels: Sequence[Sequence[int]], batch_size: int, rule: str = "shared_label", seed: int = 0
    ) -> None:
        if rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}; got {rule!r}")
        if batch_size < 2:
            raise ValueError(f"a batch with a positive needs at least 2 rows; got batch_size={batch_size}")
        self.labels = [list(row) for row in labels]
        self.batch_size = int(batch_size)
        self.rule = rule
        self.seed = int(seed)
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Draw the order of ``epoch`` next (``Trainer`` calls it at the start of every epoch)."""
        self.epoch = int(epoch)

    def order(self) -> list[int]:
        """This epoch's order of the row indices."""
        rng = np.random.default_rng([self.seed, self.epoch])
        build = _units_same_label_set if self.rule == "same_label_set" else _units_shared_label
        units = build(self.labels, rng, self.batch_size)
        units = [units[k] for k in rng.permutation(len(units))]
        return _lay_out(units, self.batch_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.order())

    def __len__(self) -> int:
        return len(self.labels)
