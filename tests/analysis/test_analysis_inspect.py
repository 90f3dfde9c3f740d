"""hf_mlcl.analysis (``hf-mlcl inspect``): relation shares, positives, wasted anchors and HBL's gate against a
brute-force count over Python sets on small sampled batches; the CLI writes the table, JSON and PNGs."""

from __future__ import annotations

import json
import os
import random

import numpy as np
import pytest
import torch
from conftest import SHARED_DATA

from hf_mlcl.analysis import batch_pair_statistics, format_report, inspect_labels
from hf_mlcl.cli import main


def random_labels(n: int, num_labels: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    protos = [sorted(rng.sample(range(num_labels), rng.randint(1, 3))) for _ in range(4)]
    rows = []
    for _ in range(n):
        u = rng.random()
        if u < 0.1:
            rows.append([])
        elif u < 0.5:
            rows.append(list(rng.choice(protos)))
        elif u < 0.75:
            rows.append([rng.randrange(num_labels)])
        else:
            rows.append(sorted(rng.sample(range(num_labels), rng.randint(1, 4))))
    return rows


def relation(s: set, t: set) -> str:
    if not s & t:
        return "R1"
    if s == t:
        return "R2"
    if t < s:
        return "R4"
    if s < t:
        return "R5"
    return "R3"


def brute_force(rows, batch, queue, k_min):
    """Loops over (anchor, candidate) pairs with Python sets: the numbers `at_queue_size` must hold."""
    counts = {r: 0 for r in ("R1", "R2", "R3", "R4", "R5")}
    labelled = pos_all = pos_any = wasted_all = wasted_any = gate = pairs = pairs_wasted = 0
    cands = list(batch) + list(queue)
    for pos_i, i in enumerate(batch):
        s = set(rows[i])
        others = [set(rows[a]) for pos_a, a in enumerate(cands) if pos_a != pos_i]
        for lab in s:
            pairs += 1
            pairs_wasted += not any(lab in t for t in others)
        if not s:
            continue
        labelled += 1
        for t in others:
            counts[relation(s, t)] += 1
        p_all = sum(t == s for t in others)
        positives = [len(s & t) / len(s | t) for t in others if s & t]
        pos_all += p_all
        pos_any += len(positives)
        wasted_all += p_all == 0
        wasted_any += not positives
        if len(positives) >= k_min:
            theta = float(np.median(positives))
            gate += any(j < theta for j in positives)
    total = sum(counts.values())
    return {
        "relations": {r: c / total for r, c in counts.items()},
        "pos_all": pos_all / labelled,
        "pos_any": pos_any / labelled,
        "wasted_all": wasted_all / labelled,
        "wasted_any": wasted_any / labelled,
        "gate": gate / labelled,
        "pairs_wasted": pairs_wasted / pairs,
    }


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("queue", [0, 9])
def test_report_matches_brute_force_count(seed, queue):
    n, num_labels, batch, k_min = 40, 7, 12, 4
    rows = random_labels(n, num_labels, seed)
    rep = inspect_labels(
        rows,
        num_labels,
        batch_size=batch,
        queue_size=queue,
        n_batches=1,
        k_min=k_min,
        seed=seed,
        queue_grid=(0, 8),
    )
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()  # the report's sampling
    want = brute_force(rows, order[:batch], order[n - queue :] if queue else [], k_min)
    got = rep["at_queue_size"]
    assert got["queue_size"] == queue
    for r, share in want["relations"].items():
        assert got["relation_shares"][r] == pytest.approx(share, abs=1e-12), r
    assert got["positives_per_anchor"]["all"] == pytest.approx(want["pos_all"])
    assert got["positives_per_anchor"]["any"] == pytest.approx(want["pos_any"])
    assert got["wasted_anchors"]["all"] == pytest.approx(want["wasted_all"])
    assert got["wasted_anchors"]["any"] == pytest.approx(want["wasted_any"])
    assert got["wasted_anchors"]["mulsupcon_pairs"] == pytest.approx(want["pairs_wasted"])
    assert got["hbl_gate_open"] == pytest.approx(want["gate"])
    assert 0 < want["gate"] or queue == 0  # the gate check is not vacuous with a queue


def test_label_summary_and_recommendation():
    rows = [[0], [0], [0, 1], [2], [1, 2], [1]] * 10 + [[3]]
    rep = inspect_labels(rows, 5, batch_size=8, n_batches=5, k_min=2, queue_grid=(0, 16, 40))
    assert rep["cardinality"]["mean"] == pytest.approx(sum(map(len, rows)) / len(rows))
    assert rep["label_sets"] == {"distinct": 6, "unique_sample_share": pytest.approx(1 / 61)}
    assert (
        rep["label_frequency"]["sorted_counts"][:2] == [30, 30]
        and rep["label_frequency"]["labels_never_seen"] == 1
    )
    assert [s["queue_size"] for s in rep["queue_sweep"]] == [0, 16, 40]
    assert rep["recommendation"]["queue_size"] in (16, 40)
    with pytest.raises(ValueError, match="outside"):
        inspect_labels([[0], [7]], 3, batch_size=1)
    with pytest.raises(ValueError, match="none of the 20 rows has a label"):  # it reported 0 % wasted anchors
        inspect_labels([[]] * 20, 3, batch_size=4, n_batches=2, queue_grid=(0,))
    # a repeated id is one label: [1, 1] is the set {1}, as the cardinality counts it (it was a fifth set)
    dup = inspect_labels(
        [[1, 1], [1], [2], [2, 0], [0, 2], []] * 10, 4, batch_size=4, n_batches=3, queue_grid=(0,)
    )
    assert dup["label_sets"]["distinct"] == 4 and dup["cardinality"]["mean"] == pytest.approx(7 / 6)
    # a per-process batch of 1 (a global one of 4) has no sampler comparison, not an error
    one = inspect_labels(rows, 5, batch_size=1, num_processes=4, n_batches=3, queue_grid=(0,))
    assert one["wasted_anchors_with_positives_sampler"] == {}
    assert "batch_sampler=positives (each loss's rule): - (it needs" in format_report(one)


def test_report_counts_the_wasted_anchors_with_the_positives_sampler():
    """``all`` and ``any`` wasted anchors with batch_sampler=positives: the same count as the plain loop of
    test_report_matches_brute_force_count over the sampler's order, and far below the random order's."""
    from hf_mlcl.data.sampler import PositiveEnsuredSampler

    g = torch.Generator().manual_seed(0)
    rows = [
        sorted(set(torch.randint(0, 6, (int(torch.randint(1, 3, (1,), generator=g)),), generator=g).tolist()))
        for _ in range(200)
    ]
    rep = inspect_labels(rows, 6, batch_size=8, n_batches=20, queue_grid=(0,))
    got = rep["wasted_anchors_with_positives_sampler"]
    for loss, rule, same in (
        ("all", "same_label_set", lambda a, b: a == b),
        ("any", "shared_label", lambda a, b: bool(set(a) & set(b))),
    ):
        order = PositiveEnsuredSampler(rows, 8, rule, seed=0).order()
        wasted = sum(
            not any(same(rows[i], rows[j]) for j in order[b * 8 : b * 8 + 8] if j != i)
            for b in range(20)
            for i in order[b * 8 : b * 8 + 8]
        )
        assert got[loss] == pytest.approx(wasted / 160)
        assert got[loss] < rep["at_queue_size"]["wasted_anchors"][loss] / 3
    assert "batch_sampler=positives" in format_report(rep)


@pytest.mark.slow
def test_goemotions_positives_sampler_meets_the_wasted_anchor_goals():
    """GoEmotions train at batch 32: random batches waste about 40 % of the anchors for ``all`` and 15 % for
    ``any``; the positives sampler at most 10 % and 2 %."""
    from hf_mlcl.analysis import inspect_dataset

    data = os.path.join(SHARED_DATA, "goemotions")
    if not os.path.isdir(data):
        pytest.skip("../shared/data/goemotions is not here")
    rep = inspect_dataset("goemotions", data, batch_size=32, n_batches=200, queue_grid=(0,))
    random_, sampler = rep["at_queue_size"]["wasted_anchors"], rep["wasted_anchors_with_positives_sampler"]
    assert random_["all"] > 0.3 and random_["any"] > 0.1
    assert sampler["all"] <= 0.10 and sampler["any"] <= 0.02


def test_pair_statistics_excludes_self_and_counts_empty_candidates_as_r1():
    y = torch.tensor([[1, 0], [1, 0], [0, 0]], dtype=torch.bool)
    st = batch_pair_statistics(y, y, self_index=True, k_min=1)
    assert st["R2"].tolist() == [1, 1, 0] and st["R1"].tolist() == [1, 1, 2]
    assert st["healthy_positives"].tolist() == [1, 1, 0]


def test_cli_inspect_writes_table_json_and_plots(tmp_path, capsys):
    out = tmp_path / "insp"
    rc = main(
        [
            "inspect",
            "synthetic",
            "--option",
            "num_train=120",
            "--option",
            "num_labels=12",
            "--batch-size",
            "8",
            "--batches",
            "3",
            "--output-dir",
            str(out),
        ]
    )
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| all |" in printed and "recommended queue size" in printed
    report = json.loads((out / "synthetic.json").read_text())
    assert report["settings"]["batch_size"] == 8 and report["dataset"]["splits"] == ["train"]
    for name in ("synthetic_label_frequency.png", "synthetic_relations.png", "synthetic_queue_sweep.png"):
        assert (out / name).read_bytes()[:4] == b"\x89PNG"
    assert main(["inspect", "synthetic", "--option", "oops"]) == 2
    capsys.readouterr()
    # a prefix that is a path stops before the report is computed (it was printed, then refused)
    assert main(["inspect", "synthetic", "--prefix", "../x", "--output-dir", str(out)]) == 2
    captured = capsys.readouterr()
    assert "must be a plain name" in captured.err and "| all |" not in captured.out


def test_cli_inspect_of_a_data_file_writes_into_output_dir_only(tmp_path, capsys):
    """A dataset given as a file path names the report by its file name, inside --output_dir: nothing is
    written beside the data."""
    import csv

    data = tmp_path / "data" / "my_data.csv"
    data.parent.mkdir()
    with open(data, "w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["text", "labels"])
        for i in range(60):
            writer.writerow([f"document number {i}", ["a;b", "b", "c;a"][i % 3]])
    out = tmp_path / "insp"
    assert main(["inspect", str(data), "--batch_size", "8", "--batches", "2", "--output_dir", str(out)]) == 0
    assert sorted(os.listdir(data.parent)) == ["my_data.csv"]
    assert (out / "my_data.json").is_file() and (out / "my_data_queue_sweep.png").is_file()


@pytest.mark.parametrize("name", ["all", "any", "similarity_dissimilarity", "jaccard"])
@pytest.mark.parametrize("keys", [False, True])
def test_each_loss_trains_on_the_positive_rule_inspect_reads(name, keys):
    """The candidates a loss gives a positive weight are exactly those its ``positives`` rule marks, the
    rule batch_pair_statistics counts: one definition for the loss and for ``hf-mlcl inspect``."""
    from hf_mlcl.losses import get_loss

    g = torch.Generator().manual_seed(3)
    y = (torch.rand(12, 5, generator=g) < 0.35).float()
    yk = (torch.rand(7, 5, generator=g) < 0.35).float() if keys else None
    loss = get_loss(name)
    ctx = loss.prepare(torch.randn(12, 8), y, torch.randn(7, 8) if keys else None, yk)
    positive = loss.positives(ctx)
    assert torch.equal(loss.build_terms(ctx).weights > 0, positive)
    stats = batch_pair_statistics(y.bool(), torch.cat([y, yk]).bool() if keys else y.bool(), self_index=True)
    assert torch.equal(stats["pos_all" if name == "all" else "pos_any"], positive.sum(1))
