#!/usr/bin/env python
"""How well a carved validation split keeps each label's share: the seeded random carve against iterative
stratification (``split_strategy="stratified"``, Sechidis et al. 2011), on a real train split.

    python benchmarks/carve_strata.py --dataset goemotions --data_dir ../shared/data/goemotions

For the 10 % (``--fraction``) carved from train it prints, per label (rarest first), the train count, the
wanted validation count (fraction x count) and what each carve gives, then a summary: the mean and largest
absolute deviation from the wanted count, the labels off by more than 20 % of their share, the labels the
carve leaves out of validation, Sechidis et al.'s label-distribution measure LD (mean over labels of the
absolute difference between the positive/negative ratio in the carved split and in the whole; 0 is
perfect) and the carve's time. Random carves are drawn with ``--seeds`` seeds and summarised by their mean.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from hf_mlcl.data import load_mlc_dataset
from hf_mlcl.data.registry import carve_validation, label_names
from hf_mlcl.data.stratify import stratified_carve


def summary(y: np.ndarray, carved: np.ndarray, fraction: float) -> dict[str, float]:
    total = y.sum(0)
    got = y[carved].sum(0)
    dev = np.abs(got - fraction * total)
    n, m = len(y), len(carved)
    ratio_all = total / np.maximum(n - total, 1)
    ratio_val = got / np.maximum(m - got, 1)
    return {
        "mean_dev": float(dev.mean()),
        "max_dev": float(dev.max()),
        "off_20pct": int((dev > 0.2 * fraction * total).sum()),
        "missing": int(((got == 0) & (total > 0)).sum()),
        "LD": float(np.abs(ratio_val - ratio_all).mean()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="goemotions")
    parser.add_argument("--data_dir", default="../shared/data/goemotions")
    parser.add_argument("--fraction", type=float, default=0.1)
    parser.add_argument("--seed", type=int, default=42, help="seed of the stratified carve")
    parser.add_argument("--seeds", type=int, default=10, help="number of random carves averaged")
    parser.add_argument("--rows", type=int, default=12, help="labels listed (the rarest)")
    args = parser.parse_args()

    train = load_mlc_dataset(args.dataset, data_dir=args.data_dir, splits=("train",))["train"]
    names = label_names(train)
    rows = train.with_format("arrow")["labels"].to_pylist()
    y = np.zeros((len(rows), len(names)), dtype=np.int64)
    for i, r in enumerate(rows):
        y[i, r] = 1
    n_val = int(round(args.fraction * len(rows)))

    start = time.perf_counter()
    _, strat = stratified_carve(rows, args.fraction, args.seed, len(names))
    seconds = time.perf_counter() - start
    randoms = [carve_validation(len(rows), n_val, seed, args.dataset)[1] for seed in range(args.seeds)]

    total = y.sum(0)
    order = np.argsort(total, kind="stable")
    print(
        f"{args.dataset} train: {len(rows)} rows, {len(names)} labels; carve {args.fraction:.0%} "
        f"(random: {n_val} rows, seeds 0..{args.seeds - 1}; stratified: {len(strat)} rows, seed {args.seed})"
    )
    print(
        f"{'label':<24}{'train':>7}{'wanted':>8}{'random (seed 0)':>17}{'random mean':>13}{'stratified':>12}"
    )
    for j in order[: args.rows]:
        rnd = [int(y[c, j].sum()) for c in randoms]
        print(
            f"{names[j][:23]:<24}{total[j]:>7}{args.fraction * total[j]:>8.1f}{rnd[0]:>17}"
            f"{np.mean(rnd):>13.1f}{int(y[strat, j].sum()):>12}"
        )
    s_rand = [summary(y, c, args.fraction) for c in randoms]
    s_strat = summary(y, strat, args.fraction)
    print(f"{'':<24}{'mean |dev|':>11}{'max |dev|':>11}{'off >20%':>10}{'missing':>9}{'LD':>10}")
    mean = {k: float(np.mean([s[k] for s in s_rand])) for k in s_strat}
    print(
        f"{'random (mean of seeds)':<24}{mean['mean_dev']:>11.2f}{mean['max_dev']:>11.2f}{mean['off_20pct']:>10.1f}"
        f"{mean['missing']:>9.1f}{mean['LD']:>10.5f}"
    )
    print(
        f"{'stratified':<24}{s_strat['mean_dev']:>11.2f}{s_strat['max_dev']:>11.2f}{s_strat['off_20pct']:>10d}"
        f"{s_strat['missing']:>9d}{s_strat['LD']:>10.5f}"
    )
    print(f"stratified carve: {seconds:.2f} s")


if __name__ == "__main__":
    main()
