"""One device call, planned on the CPU: benchmarks/device_plan.py orders the cells that need measuring
(unmet goals and stale figures first), fits them into the call's budget and skips at run time what no
longer fits; docs/PERFORMANCE.md names each figure's commit and marks the stale ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import cell_sources as S  # noqa: E402
import device_plan as P  # noqa: E402
import gpu_suite  # noqa: E402
import performance_doc  # noqa: E402

H200 = {"kind": "cuda", "name": "NVIDIA H200", "memory_gib": 139.8, "bf16_dense_peak_tflops": 989.4}


def _write(root, folder: str, measurement: str, cells: dict, commit: str = "new") -> None:
    path = root / folder / f"{measurement}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "measurement": measurement,
        "tiny": False,
        "device": H200,
        "versions": {"torch": "2.11.0"},
        "git_commit": commit,
        "command": "bash benchmarks/device_run.sh",
        "cells": cells,
    }
    path.write_text(json.dumps(data))


def _ok(seconds: float, commit: str, **figures) -> dict:
    return {"status": "ok", "launcher": "plain", "seconds": seconds, "git_commit": commit, "figures": figures}


def test_the_plan_of_the_recorded_results_fits_the_call_with_unmet_goals_and_stale_cells_first(capsys):
    results = P.load_results()
    items, up_to_date = P.candidates(P.suite_cells(), results, S.Changes(REPO, against=None), P.TARGET)
    assert [i.tier for i in items] == sorted(i.tier for i in items)
    assert items[0].tier == 0 and items[0].goal < len(P.GOALS)
    # tier 0 takes the goals in turns: each unmet goal's first cell before any goal's second
    first = [i for i in items if i.tier == 0]
    goals = sorted({i.goal for i in first})
    assert [i.goal for i in first[: len(goals)]] == goals
    assert all(
        ("not measured" in i.need or "stale" in i.need or "failed" in i.need) for i in items if i.tier < 2
    )
    chosen, skipped = P.fit(items)
    assert chosen
    assert {i.key for i, _, _ in chosen} | {i.key for i, _ in skipped} == {i.key for i in items}
    assert chosen[0][0] == items[0] and chosen[0][1] == P.STARTUP_S  # the first cell starts after start-up
    # the recorded durations let one call move every unmet goal: each one's first cell fits
    assert {i.key for i in first[: len(goals)]} <= {i.key for i, _, _ in chosen}
    end = chosen[-1][1] + chosen[-1][2]
    assert end == pytest.approx(P.STARTUP_S + sum(need for _, _, need in chosen))
    assert end + P.TAIL_S <= P.BUDGET_S == 540
    assert set(up_to_date).isdisjoint(i.key for i in items)
    assert P.main([]) == 0  # what `bash benchmarks/device_run.sh --plan` prints
    out = capsys.readouterr().out
    assert "One device call on nvidia-h200: 540 s" in out and chosen[0][0].key in out


def test_a_synthetic_record_orders_by_tier_and_goal_estimates_and_skips_what_does_not_fit(tmp_path):
    root = tmp_path / "results"
    # old: a loss file changed since; new: nothing measured changed since
    changes = S.Changes(known={"old": ["hf_mlcl/losses/core.py", "README.md"], "new": ["README.md"]})
    _write(
        root,
        "nvidia-h200",
        "losses",
        {
            "in-batch-fp32": _ok(20, "old", worst_over_plain=2.0),  # stale, goal not met
            "in-batch-bf16": _ok(10, "new", worst_over_plain=2.0),  # fresh, goal not met: a repeat
            "keys-fp32": _ok(30, "new", worst_dense_over_sparse_at_max_labels=1.0),  # fresh, met
            "keys-bf16": _ok(30, "old", worst_dense_over_sparse_at_max_labels=1.0),  # stale, met
        },  # in-batch-compiled: never measured anywhere
    )
    _write(
        root, "nvidia-h200", "gradcache", {"minilm-4096": {"status": "failed", "seconds": 10, "error": "x"}}
    )
    _write(root, "nvidia-h100-80gb-hbm3", "throughput", {"minilm": _ok(50, "old", ratios={})})
    cells = {
        "throughput": ["minilm"],
        "losses": ["in-batch-fp32", "in-batch-bf16", "keys-fp32", "keys-bf16", "in-batch-compiled"],
        "gradcache": ["minilm-4096"],
    }
    items, up_to_date = P.candidates(cells, P.load_results(str(root)), changes)
    assert [(i.key, i.tier) for i in items] == [
        ("throughput/minilm", 0),  # goal 3, not measured on the H200
        ("losses/in-batch-fp32", 0),  # goal 4, stale
        ("losses/in-batch-compiled", 0),  # goal 4, not measured
        ("losses/keys-bf16", 1),  # stale, its goal met
        ("losses/in-batch-bf16", 2),  # fresh and short of its goal
        ("gradcache/minilm-4096", 2),  # fresh and failed (no goal)
    ]
    assert up_to_date == ["losses/keys-fp32"]
    by = {i.key: i for i in items}
    assert "stale: hf_mlcl/losses/ changed since old" in by["losses/in-batch-fp32"].need
    assert by["losses/in-batch-compiled"].expected_s == P.DEFAULT_CELL_S == 120  # no record: the default
    assert "default 120 s" in by["losses/in-batch-compiled"].estimate
    assert by["throughput/minilm"].expected_s == pytest.approx(55)  # another GPU's record, x 1.1
    assert "nvidia-h100-80gb-hbm3" in by["throughput/minilm"].estimate
    assert by["losses/in-batch-fp32"].expected_s == pytest.approx(22)

    # 230 s: 45 s start-up and 10 s packing leave 175 s; the 120 s cell does not fit after 77 s of cells
    chosen, skipped = P.fit(items, budget=230)
    assert [(i.key, round(start), round(need)) for i, start, need in chosen] == [
        ("throughput/minilm", 45, 55),
        ("losses/in-batch-fp32", 100, 22),
        ("losses/keys-bf16", 122, 33),
        ("losses/in-batch-bf16", 155, 11),
        ("gradcache/minilm-4096", 166, 11),
    ]
    assert [(i.key, why) for i, why in skipped] == [("losses/in-batch-compiled", "needs 120 s, 98 s left")]

    # run time: in-batch-fp32 takes 80 s, not 22; each cell starts only if it fits what is left
    now, took, limits = [45.0], {"losses/in-batch-fp32": 80.0}, {}

    def run_cell(item, left):
        limits[item.key] = left
        now[0] += took.get(item.key, item.expected_s)
        return True

    ran, late = P.execute(items, deadline=220.0, run_cell=run_cell, clock=lambda: now[0])
    assert [i.key for i, _, _ in ran] == ["throughput/minilm", "losses/in-batch-fp32", "losses/keys-bf16"]
    assert limits == {"throughput/minilm": 175.0, "losses/in-batch-fp32": 120.0, "losses/keys-bf16": 40.0}
    assert [(i.key, why) for i, why in late] == [
        ("losses/in-batch-compiled", "needs 120 s, 40 s left"),
        ("losses/in-batch-bf16", "needs 11 s, 7 s left"),
        ("gradcache/minilm-4096", "needs 11 s, 7 s left"),
    ]


def test_unmet_goals_take_turns_so_that_a_short_call_moves_each_of_them(tmp_path):
    root = tmp_path / "results"
    _write(root, "nvidia-h200", "losses", {"in-batch-fp32": _ok(20, "old", worst_over_plain=2.0)})
    changes = S.Changes(known={"old": ["hf_mlcl/losses/core.py"]})
    cells = {
        "throughput": ["minilm", "roberta-base"],  # goal 3, neither measured
        "losses": ["in-batch-fp32", "in-batch-compiled", "keys-fp32"],  # goal 4 stale + unmeasured; goal 5
    }
    items, _ = P.candidates(cells, P.load_results(str(root)), changes)
    assert [(i.key, i.goal + 1) for i in items] == [
        ("throughput/minilm", 3),
        ("losses/in-batch-fp32", 4),
        ("losses/keys-fp32", 5),
        ("throughput/roberta-base", 3),  # the second lap
        ("losses/in-batch-compiled", 4),
    ]
    # the first lap: 45 s start-up + 120 + 22 + 120 s (no records: the default) + 10 s packing = 317 s; in
    # 420 s no 120 s cell of the second lap fits after it
    chosen, skipped = P.fit(items, budget=420)
    assert [i.key for i, _, _ in chosen] == [i.key for i in items[:3]]
    assert [i.key for i, _ in skipped] == [i.key for i in items[3:]]


def test_the_first_llama_cell_of_a_call_pays_for_the_base_and_a_failed_cell_for_its_peers(tmp_path):
    root = tmp_path / "results"
    failed = {"status": "failed", "launcher": "deepspeed", "seconds": 60, "git_commit": "new", "error": "x"}
    finished = {**failed, "seconds": 90, "figures": {"reload": {"max_abs_diff": 0.15}}}
    _write(root, "nvidia-h200", "llama_lora", {"sd-deepspeed": failed, "msc-deepspeed": finished})
    results = P.load_results(str(root))
    assert P.estimate("llama_lora", "sd-deepspeed", results)[0] == pytest.approx(99)  # its peer's 90 s x 1.1
    items, _ = P.candidates(
        {"llama_lora": ["sd-deepspeed", "msc-deepspeed"]}, results, S.Changes(known={"new": []})
    )
    assert [i.tier for i in items] == [2, 2]  # fresh failures of goal 2: measured again, last
    chosen, _ = P.fit(items, budget=1000)
    assert [round(need) for _, _, need in chosen] == [99 + P.LLAMA_BASE_S, 99]


def test_the_sources_of_a_cell_hold_its_recipe_and_bases_and_every_path_exists():
    paths = S.sources("llama_lora", "msc-deepspeed")
    assert "hf_mlcl/losses/" in paths and "recipes/aapd/llama-3.1-8b-lora/msc.yaml" in paths
    assert "recipes/base/losses/msc.yaml" in paths and "recipes/accelerate/deepspeed_zero3.yaml" in paths
    assert "hf_mlcl/losses/" not in S.sources("plm_icd", "bce-mimic4_icd10_full")
    for name in gpu_suite.MEASUREMENTS:
        for cell in P.suite_cells()[name]:
            for path in S.sources(name, cell):
                assert os.path.exists(os.path.join(REPO, path)), (name, cell, path)
    assert S.touches(["hf_mlcl/losses/core.py", "README.md"], ["hf_mlcl/losses/", "hf_mlcl/los"]) == [
        "hf_mlcl/losses/"
    ]


def test_a_figure_measured_at_an_old_commit_is_marked_stale(tmp_path):
    repo = tmp_path / "repo"
    (repo / "hf_mlcl" / "losses").mkdir(parents=True)

    def git(*args: str) -> str:
        cmd = [
            "git",
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "-c",
            "commit.gpgsign=false",
            *args,
        ]
        return subprocess.run(cmd, cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    commits = []
    for path, text in [
        ("hf_mlcl/losses/core.py", "a = 1\n"),
        ("hf_mlcl/losses/core.py", "a = 2\n"),
        ("README", "x\n"),
    ]:
        (repo / path).write_text(text)
        if not commits:
            git("init", "-q")
        git("add", ".")
        git("commit", "-qm", f"commit {len(commits)}")
        commits.append(git("rev-parse", "HEAD"))
    first, second, _ = commits  # core.py changed after the first; only README after the second
    root = tmp_path / "results"
    in_batch = {"table": "in-batch", "rows": [], "worst_over_plain": 2.0, "input_checks": False}
    keys = {"table": "keys", "rows": [], "worst_dense_over_sparse_at_max_labels": 1.0, "input_checks": False}
    cells = {
        "in-batch-fp32": _ok(20, first, **in_batch),
        "keys-fp32": _ok(30, second, **keys),
        "keys-bf16": {
            k: v for k, v in _ok(30, "x", **keys).items() if k != "git_commit"
        },  # the file's commit
    }
    _write(root, "nvidia-h200", "losses", cells, commit="0123456789abcdef")
    page = performance_doc.render(str(root), repo=str(repo))
    assert f"**in-batch-fp32** (ok at `{first[:10]}` **stale**)" in page
    assert f"**keys-fp32** (ok at `{second[:10]}`)" in page
    assert "**keys-bf16** (ok at `0123456789` (freshness unknown))" in page  # a commit outside the repository
    assert f"in-batch-fp32 (`{first[:10]}` **stale**): worst 2.00" in page  # in the goals table too
    assert "Sources (a figure is **stale** when one changed after its commit): `hf_mlcl/losses/`" in page


def test_check_compares_the_page_without_its_freshness_marks(tmp_path, monkeypatch):
    """A later commit ages figures without making the page wrong (and a clone may lack their commits)."""
    doc = tmp_path / "PERFORMANCE.md"
    monkeypatch.setattr(performance_doc, "DOC", str(doc))
    monkeypatch.setattr(performance_doc, "render", lambda: "| a | ok at `abc` **stale** |\n")
    doc.write_text("| a | ok at `abc` |\n")  # written while the figure was fresh
    assert performance_doc.main(["--check"]) == 0
    monkeypatch.setattr(performance_doc, "render", lambda: "| a | ok at `abc` (freshness unknown) |\n")
    doc.write_text("| a | ok at `abc` **stale** |\n")
    assert performance_doc.main(["--check"]) == 0  # a clone without that commit
    doc.write_text("| a | ok at `abd` **stale** |\n")  # another commit: the page is out of date
    assert performance_doc.main(["--check"]) == 1


def test_a_cell_stopped_at_the_deadline_keeps_its_earlier_result(tmp_path, monkeypatch):
    """The suite's cap on a cell's time kills the cell's whole process group (a launcher's workers too) and
    leaves an earlier result in place; a cell measured before cells named their commit keeps its file's."""
    from measurements.common import Cell

    fake = type(
        "Fake", (), {"DESCRIPTION": "fake", "cells": staticmethod(lambda tiny: [Cell("a"), Cell("b")])}
    )
    monkeypatch.setattr(gpu_suite, "measurement", lambda name: fake)
    monkeypatch.setattr(gpu_suite, "cell_command", lambda *args: ["bash", "-c", "sleep 30 & sleep 30"])
    monkeypatch.setenv("MLCL_GIT_COMMIT", "new")
    monkeypatch.delenv("MLCL_SUITE_MIRROR", raising=False)
    out = tmp_path / "out"
    earlier = {"status": "ok", "launcher": "plain", "seconds": 5.0, "figures": {"x": 1}}
    gpu_suite.write_results(
        str(out / "fake.json"), {"measurement": "fake", "git_commit": "old", "cells": {"a": earlier}}
    )
    t0 = time.monotonic()
    assert (
        gpu_suite.run_measurement("fake", False, True, str(out), str(tmp_path), "c", ["a", "b"], limit_s=1.0)
        is False
    )
    assert time.monotonic() - t0 < 10  # the background sleep died with its group
    data = json.loads((out / "fake.json").read_text())
    assert data["git_commit"] == "new"
    a, b = data["cells"]["a"], data["cells"]["b"]
    assert a["figures"] == {"x": 1} and a["git_commit"] == "old" and a["cut_at_deadline_s"] >= 1.0
    assert b["status"] == "failed" and b["cut_at_deadline"] and b["git_commit"] == "new"
    assert b["error"].startswith("stopped at the call's deadline after")
    assert P.estimate("fake", "b", {"fake": {"nvidia-h200": {**data, "device": H200}}})[1].startswith(
        "stopped"
    )


def test_the_device_run_takes_its_commit_and_staleness_from_the_carried_plan(tmp_path, monkeypatch, capsys):
    """On the device no .git travels: the plan file written here gives the commit the figures are recorded
    at (``+changed`` when the tree's digest is not the one it was written for) and what is stale."""
    import measurements.common as C

    carried = P.prepare(P.load_results())
    assert carried["digest"] == S.tree_digest() and carried["changed_since"]
    monkeypatch.setattr(S, "git", lambda *args, **kw: None)
    monkeypatch.setattr(C, "device_info", lambda: {**H200, "count": 1})
    monkeypatch.setenv("MLCL_GIT_COMMIT", "unset")
    monkeypatch.delenv("MLCL_GIT_COMMIT")
    calls = []

    def measure(name, tiny, force, out_dir, cache_dir, command, patterns, limit_s):
        calls.append((f"{name}/{patterns[0]}", os.environ["MLCL_GIT_COMMIT"], limit_s))
        return True

    monkeypatch.setattr(gpu_suite, "run_measurement", measure)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps({**carried, "label": "abc"}))
    assert P.run_on_device(time.time(), 540.0, str(plan_file)) == 0
    items, _ = P.candidates(
        P.suite_cells(), P.load_results(), S.Changes(known=carried["changed_since"]), "nvidia-h200"
    )
    assert [key for key, _, _ in calls] == [i.key for i in items]  # instant cells: every one fits
    assert {commit for _, commit, _ in calls} == {"abc"} and all(0 < left <= 530 for _, _, left in calls)

    calls.clear()
    monkeypatch.delenv("MLCL_GIT_COMMIT")
    plan_file.write_text(json.dumps({**carried, "digest": "another tree"}))
    assert P.run_on_device(time.time(), 540.0, str(plan_file)) == 0
    assert calls and {commit for _, commit, _ in calls} == {f"{carried['commit']}+changed"}
    assert "was written for another tree" in capsys.readouterr().out
