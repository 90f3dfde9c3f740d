"""Iterative stratification (Sechidis et al. 2011) and the stratified carve of a user's validation split."""

from __future__ import annotations

import numpy as np
import pytest

from hf_mlcl.data.stratify import iterative_stratification, stratified_carve


def algorithm_1(rows, proportions, seed, num_labels):
    """Sechidis et al.'s Algorithm 1 transcribed row by row (the reference): every assignment updates
    c_j^l of all the row's labels and the remaining sets are rescanned. Same random stream as the library
    (the rarest label's tie-break, the order of its rows, the tie-break among folds)."""
    rng = np.random.default_rng(seed)
    r = np.asarray(proportions, dtype=np.float64)
    k, n = len(r), len(rows)
    sets = [sorted(set(int(i) for i in row)) for row in rows]
    demand = [[r[j] * sum(1 for s in sets if lab in s) for lab in range(num_labels)] for j in range(k)]
    size = [r[j] * n for j in range(k)]
    fold = [-1] * n
    while True:
        remaining = [
            sum(1 for i, s in enumerate(sets) if fold[i] < 0 and lab in s) for lab in range(num_labels)
        ]
        live = [lab for lab in range(num_labels) if remaining[lab] > 0]
        if not live:
            break
        low = min(remaining[lab] for lab in live)
        rarest = [lab for lab in live if remaining[lab] == low]
        label = rarest[int(rng.integers(len(rarest)))]
        block = [i for i, s in enumerate(sets) if fold[i] < 0 and label in s]
        block = [block[i] for i in rng.permutation(len(block))]
        ties = rng.random((len(block), k))
        for t, i in enumerate(block):
            best = max(range(k), key=lambda j: (demand[j][label], size[j], ties[t, j]))
            fold[i] = best
            for lab in sets[i]:
                demand[best][lab] -= 1
            size[best] -= 1
    free = [i for i in range(n) if fold[i] < 0]
    counts = [0] * k
    for _ in free:
        j = max(range(k), key=lambda j: size[j])
        counts[j] += 1
        size[j] -= 1
    order = rng.permutation(len(free))
    targets = np.repeat(np.arange(k), counts)
    for pos, t in zip(order, targets):
        fold[free[pos]] = int(t)
    return np.asarray(fold)


def long_tailed(n=300, num_labels=12, seed=0):
    """Label l on about n / 2^(l/2) rows (labels 10-11 on a handful), some rows without labels."""
    rng = np.random.default_rng(seed)
    p = 0.5 ** (np.arange(num_labels) / 2 + 1)
    y = rng.random((n, num_labels)) < p
    y[rng.random(n) < 0.05] = False
    return [np.flatnonzero(row).tolist() for row in y], y


@pytest.mark.parametrize("proportions", [(0.9, 0.1), (0.7, 0.2, 0.1)])
@pytest.mark.parametrize("seed", [0, 1])
def test_block_vectorisation_equals_algorithm_1(proportions, seed):
    rows, _ = long_tailed(seed=seed)
    rows[3] = rows[3] + rows[3]  # a repeated id counts once
    got = iterative_stratification(rows, proportions, seed, num_labels=12)
    assert np.array_equal(got, algorithm_1(rows, proportions, seed, 12))


def test_stratified_carve_keeps_every_label_near_its_share_where_random_does_not():
    rows, y = long_tailed(n=2000, num_labels=12, seed=3)
    keep, val = stratified_carve(rows, 0.1, seed=7, num_labels=12)
    assert np.array_equal(np.sort(np.concatenate([keep, val])), np.arange(2000))
    assert abs(len(val) - 200) <= 2
    want = 0.1 * y.sum(0)
    strat_err = np.abs(y[val].sum(0) - want)
    assert strat_err.max() <= 1.0  # every label within one row of its share
    worst_random = max(
        np.abs(y[np.random.default_rng(s).permutation(2000)[:200]].sum(0) - want).max() for s in range(5)
    )
    assert worst_random > 2 * strat_err.max() + 1


def test_seeded_and_validated():
    rows, _ = long_tailed()
    a = stratified_carve(rows, 0.2, seed=1)[1]
    assert np.array_equal(a, stratified_carve(rows, 0.2, seed=1)[1])
    assert not np.array_equal(a, stratified_carve(rows, 0.2, seed=2)[1])
    with pytest.raises(ValueError, match="fraction"):
        stratified_carve(rows, 1.0, seed=0)
    with pytest.raises(ValueError, match="proportions"):
        iterative_stratification(rows, (0.5, 0.6), seed=0)
    with pytest.raises(ValueError, match=r"label ids must lie in \[0, 3\)"):
        iterative_stratification([[0], [5]], (0.5, 0.5), seed=0, num_labels=3)
    unlabeled = iterative_stratification([[]] * 10, (0.7, 0.3), seed=0)
    assert np.bincount(unlabeled).tolist() == [7, 3]


def test_own_data_carve_option_and_its_note(tmp_path):
    from hf_mlcl.data import load_mlc_dataset
    from hf_mlcl.data.custom import data_notes
    from hf_mlcl.training import DataArguments

    rows, _ = long_tailed(n=200, num_labels=12, seed=5)
    path = tmp_path / "mine.csv"
    lines = ["text,labels"] + [f"doc {i},{';'.join(f'l{j:02d}' for j in r)}" for i, r in enumerate(rows) if r]
    path.write_text("\n".join(lines) + "\n")
    dd = load_mlc_dataset(str(path), validation_fraction=0.1, split_strategy="stratified")
    notes = data_notes(dd["validation"])
    assert notes and "stratified by label (iterative stratification)" in notes[0]
    names = dd["train"].features["labels"].feature.names
    count = {s: np.bincount([j for r in dd[s]["labels"] for j in r], minlength=len(names)) for s in dd}
    total = count["train"] + count["validation"]
    assert np.abs(count["validation"] - 0.1 * total).max() <= 1.0
    args = DataArguments(dataset=str(path), split_strategy="stratified")
    assert args.loader_options() == {"split_strategy": "stratified"}
    with pytest.raises(ValueError, match="split_strategy must be one of"):
        DataArguments(dataset=str(path), split_strategy="balanced")
    with pytest.raises(ValueError, match="split_strategy must be one of"):
        load_mlc_dataset(str(path), split_strategy="balanced")
