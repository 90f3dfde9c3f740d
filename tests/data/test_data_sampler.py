"""The positives sampler (hf_mlcl.data.sampler): every row once per epoch, an order that follows the seed and
the epoch only, and batches in which every anchor has a positive under the loss's rule as far as the data
allows, also in each process's share of the batches. Positives are counted here by plain loops."""

from __future__ import annotations

import random

import pytest

from hf_mlcl.data.sampler import PositiveEnsuredSampler
from hf_mlcl.losses import get_loss
from hf_mlcl.losses.registry import list_contrastive_losses


def _long_tail(n: int = 600, num_labels: int = 12, seed: int = 0) -> list[list[int]]:
    """Label sets of 1-3 labels with Zipf-like label frequencies, some rows without labels."""
    rng = random.Random(seed)
    weights = [1 / (k + 1) for k in range(num_labels)]
    rows = []
    for _ in range(n):
        if rng.random() < 0.03:
            rows.append([])
            continue
        size = rng.choice([1, 1, 1, 2, 2, 3])
        rows.append(sorted(set(rng.choices(range(num_labels), weights, k=size))))
    return rows


def _is_positive(rule: str, a: list[int], b: list[int]) -> bool:
    if rule == "same_label_set":
        return set(a) == set(b)
    return bool(set(a) & set(b)) or (not a and not b)


def _wasted(rows: list[list[int]], order: list[int], batch_size: int, rule: str) -> int:
    """Anchors (rows of a full batch) with no positive among the other rows of their batch."""
    wasted = 0
    for start in range(0, len(order) - batch_size + 1, batch_size):
        batch = order[start : start + batch_size]
        for i in batch:
            if not any(_is_positive(rule, rows[i], rows[j]) for j in batch if j != i):
                wasted += 1
    return wasted


def test_every_row_once_and_the_order_follows_the_seed_and_the_epoch():
    rows = _long_tail()
    sampler = PositiveEnsuredSampler(rows, 16, "shared_label", seed=3)
    first = list(sampler)
    assert sorted(first) == list(range(len(rows))) and len(sampler) == len(rows)
    assert (
        list(PositiveEnsuredSampler(rows, 16, "shared_label", seed=3)) == first
    )  # every process, a resumed run
    sampler.set_epoch(1)
    second = list(sampler)
    assert sorted(second) == list(range(len(rows))) and second != first
    assert list(PositiveEnsuredSampler(rows, 16, "shared_label", seed=4)) != first


@pytest.mark.parametrize("rule", ["same_label_set", "shared_label"])
def test_batches_give_every_anchor_a_positive_as_far_as_the_data_allows(rule):
    rows = _long_tail()
    # rows that cannot have a positive in any batch: a label set no other row has (same_label_set)
    sets = [tuple(r) for r in rows]
    impossible = sum(sets.count(s) == 1 for s in sets) if rule == "same_label_set" else 0
    for batch_size in (8, 15, 32):
        order = PositiveEnsuredSampler(rows, batch_size, rule, seed=0).order()
        shuffled = list(range(len(rows)))
        random.Random(0).shuffle(shuffled)
        random_wasted = _wasted(rows, shuffled, batch_size, rule)
        full = len(rows) // batch_size * batch_size
        wasted = _wasted(rows, order, batch_size, rule)
        # an odd batch size has an odd gap in every batch: when no unit of one row is left, a pair is split
        share = 0.01 if batch_size % 2 == 0 else 0.03
        assert wasted <= impossible + share * full, (batch_size, wasted, impossible)
        assert random_wasted > 2 * wasted + 0.02 * full  # random batches of the same rows waste far more


def test_rows_of_the_rarest_labels_find_their_partner_first():
    # label 0 is carried by rows 0 and 3 only; row 0 also carries label 1, which rows 1 and 2 carry. Pairing
    # row 0 with row 1 or 2 through label 1 would leave row 3 alone: the rarest label is served first.
    rows = [[0, 1], [1], [1], [0]]
    for seed in range(20):
        order = PositiveEnsuredSampler(rows, 2, "shared_label", seed=seed).order()
        assert _wasted(rows, order, 2, "shared_label") == 0, (seed, order)


def test_each_process_gets_whole_batches_with_their_positives():
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    rows = [[k % 7] for k in range(7 * 12)]  # every label set repeats: no anchor needs to be wasted
    sampler = PositiveEnsuredSampler(rows, 6, "same_label_set", seed=0)
    seen = []
    for rank in (0, 1):
        batches = list(
            BatchSamplerShard(BatchSampler(sampler, 6, drop_last=True), num_processes=2, process_index=rank)
        )
        assert all(len(b) == 6 for b in batches)
        assert _wasted(rows, [i for b in batches for i in b], 6, "same_label_set") == 0
        seen += [i for b in batches for i in b]
    assert sorted(seen) == list(range(len(rows)))


def test_loss_rules_and_bad_settings():
    """Each contrastive loss states its sampler rule beside its positive rule: ``all`` pairs equal label sets,
    every other loss rows sharing a label."""
    from hf_mlcl.losses.registry import get_loss_class

    rules = {name: get_loss_class(name).sampler_rule for name in list_contrastive_losses()}
    assert rules.pop("all") == "same_label_set"
    assert set(rules.values()) == {"shared_label"} and {"any", "msc", "hbl"} <= set(rules)
    assert get_loss("sd").sampler_rule == "shared_label"
    with pytest.raises(ValueError, match="rule must be one of"):
        PositiveEnsuredSampler([[0], [0]], 2, "exact")
    with pytest.raises(ValueError, match="at least 2 rows"):
        PositiveEnsuredSampler([[0], [0]], 1)
