"""One device call of ``benchmarks/gpu_suite.py`` within a time budget: which cells, in which order.

    python benchmarks/device_plan.py                  # the plan of a 540 s call (bash benchmarks/device_run.sh --plan)
    python benchmarks/device_plan.py --write          # ... and write .device/plan.json, which travels with the call
    python benchmarks/device_plan.py --run --since T  # on the device (bash benchmarks/device_run.sh): run it

Method: docs/benchmarks.md, "Planning a device call (benchmarks/device_plan.py)"
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import cell_sources as S  # noqa: E402

BUDGET_S = 540.0  # one call's command: 9 minutes of a 10-minute limit
STARTUP_S = 45.0  # before the first cell: installing the carried wheels, the import check, the runner's start
TAIL_S = 10.0  # after the last cell: packing the results into $OUT
DEFAULT_CELL_S = 120.0  # a cell with no recorded duration on any GPU
MARGIN = 1.1  # expected = recorded seconds x 1.1
LLAMA_BASE_S = 30.0  # the call's first llama_lora cell first makes the random 8B base (16 GB written)
TARGET = "nvidia-h200"
PLAN_FILE = os.path.join(REPO, ".device", "plan.json")
RESULTS = os.path.join(HERE, "results")


@dataclass(frozen=True)
class Goal:
    short: str
    text: str
    measurement: str
    cells: tuple[str, ...]
    met: Callable[[dict[str, Any]], bool]  # on a cell's figures


GOALS = (
    Goal(
        "MFU >= 40 %",
        "Llama-3.1-8B + LoRA stage 1, sd and msc with a 4,096 queue, at >= 40 % MFU",
        "llama_lora",
        (
            "msc-plain-fit141",
            "sd-plain-fit141",
            "msc-plain-fit80",
            "sd-plain-fit80",
            "msc-plain-fit141-liger",
            "sd-plain-fit141-liger",
            "msc-plain",
            "msc-plain-direct",
            "sd-plain",
            "sd-plain-direct",
        ),
        lambda f: f["mfu"] >= 0.40,
    ),
    Goal(
        "ZeRO-3 reload",
        "ZeRO-3 sd / msc / BCE save, and the adapter reloads within 1e-3",
        "llama_lora",
        ("sd-deepspeed", "msc-deepspeed", "bce-deepspeed"),
        lambda f: f["reload"]["max_abs_diff"] <= 1e-3,
    ),
    Goal(
        "trainer ratios",
        "ContrastiveTrainer >= 0.95x Trainer + BCE and >= 1.0x SentenceTransformerTrainer, 0 host reads",
        "throughput",
        ("minilm", "roberta-base"),
        lambda f: (
            f["ratios"]["contrastive_over_trainer_bce"] >= 0.95
            and f["ratios"]["contrastive_over_st_mlcl"] >= 1.0
            and max(f["rows"]["contrastive"]["syncs_per_step"]) == 0
        ),
    ),
    Goal(
        "losses vs SupCon",
        "every loss <= 1.0x the plain SupCon (eager; compiled for the costly ones)",
        "losses",
        ("in-batch-fp32", "in-batch-bf16", "in-batch-compiled"),
        lambda f: f.get("worst_over_plain", f.get("worst_compiled_over_plain")) <= 1.0,
    ),
    Goal(
        "dense vs sparse",
        "dense labels <= 1.1x sparse at L 25,230",
        "losses",
        ("keys-fp32", "keys-bf16"),
        lambda f: f["worst_dense_over_sparse_at_max_labels"] <= 1.1,
    ),
)


def goal_of(measurement: str, cell: str) -> int:
    """The rank of the goal a cell can move (its index in ``GOALS``), ``len(GOALS)`` for none."""
    return next(
        (i for i, g in enumerate(GOALS) if g.measurement == measurement and cell in g.cells), len(GOALS)
    )


def met(rank: int, entry: dict[str, Any]) -> bool:
    """Whether a recorded cell meets its goal (a cell of no goal: whether it was measured)."""
    if entry.get("status") != "ok" or not entry.get("figures"):
        return False
    if rank == len(GOALS):
        return True
    try:
        return bool(GOALS[rank].met(entry["figures"]))
    except (KeyError, TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Item:
    measurement: str
    cell: str
    tier: int
    goal: int
    need: str  # why it is measured
    expected_s: float
    estimate: str  # where expected_s comes from

    @property
    def key(self) -> str:
        return f"{self.measurement}/{self.cell}"


# --------------------------------------------------------------------------------------- pure functions
def load_results(root: str = RESULTS) -> dict[str, dict[str, dict[str, Any]]]:
    """{measurement: {device folder: results}} of every ``<root>/<device>/<measurement>.json``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for folder in sorted(os.listdir(root)) if os.path.isdir(root) else []:
        for name in sorted(os.listdir(os.path.join(root, folder))):
            if name.endswith(".json"):
                with open(os.path.join(root, folder, name), encoding="utf-8") as fh:
                    data = json.load(fh)
                out.setdefault(data["measurement"], {})[folder] = data
    return out


def estimate(measurement: str, cell: str, results: dict, target: str = TARGET) -> tuple[float, str]:
    """(expected seconds, where from): the cell's recorded seconds on ``target`` x ``MARGIN``; for a cell
    that failed before its figures, at least the longest finished cell of its launcher there; else its
    seconds on another GPU; else ``DEFAULT_CELL_S``."""
    gpu = {f: d for f, d in results.get(measurement, {}).items() if d["device"]["kind"] == "cuda"}
    own = gpu.get(target, {}).get("cells", {}).get(cell)
    if own and own.get("seconds"):
        seconds = float(own["seconds"])
        if own.get("cut_at_deadline") or own.get("cut_at_deadline_s"):
            cut = max(seconds, float(own.get("cut_at_deadline_s") or 0))
            return 1.5 * cut, f"stopped at a deadline after {cut:.0f} s on {target}: 1.5x that"
        if own.get("figures"):
            return MARGIN * seconds, f"{seconds:.0f} s recorded on {target}"
        peers = [
            float(e["seconds"])
            for e in gpu[target]["cells"].values()
            if e.get("figures") and e.get("launcher") == own.get("launcher") and e.get("seconds")
        ]
        why = f"failed after {seconds:.0f} s on {target}"
        if peers and max(peers) > seconds:
            seconds, why = max(peers), f"{why}; its launcher's longest cell there"
        return MARGIN * seconds, why
    for folder, data in sorted(gpu.items()):
        entry = data.get("cells", {}).get(cell)
        if entry and entry.get("figures") and entry.get("seconds"):
            return MARGIN * float(entry["seconds"]), f"{entry['seconds']:.0f} s recorded on {folder}"
    sibling = re.sub(r"-fit[0-9]+(-liger)?$", "-direct", cell)  # the same run without GradCache
    if sibling != cell:
        seconds, why = estimate(measurement, sibling, results, target)
        return seconds, f"as {sibling}: {why}"
    return DEFAULT_CELL_S, f"no GPU record: default {DEFAULT_CELL_S:.0f} s"


def candidates(
    cells: dict[str, list[str]], results: dict, changes: S.Changes, target: str = TARGET
) -> tuple[list[Item], list[str]]:
    """(the cells to measure, best first; the cells up to date). ``cells``: {measurement: cell names} in the
    suite's order; ``changes`` tells which recorded commits are stale."""
    ranked: list[tuple[tuple[int, int, int], Item]] = []
    up_to_date: list[str] = []
    order = 0
    for measurement, names in cells.items():
        data = results.get(measurement, {}).get(target) or {}
        for name in names:
            order += 1
            rank = goal_of(measurement, name)
            entry = data.get("cells", {}).get(name)
            need = ""
            if entry is None or entry.get("status") == "not_run":
                need = f"not measured on {target}"
            else:
                commit = entry.get("git_commit") or data.get("git_commit")
                state, hit = changes.freshness(commit, S.sources(measurement, name))
                if state == "stale":
                    more = f" +{len(hit) - 2}" if len(hit) > 2 else ""
                    need = f"stale: {', '.join(hit[:2])}{more} changed since {commit[:10]}"
                elif state == "unknown":
                    need = (
                        f"measured at {commit or 'an unrecorded commit'}: whether its code changed is unknown"
                    )
            reached = entry is not None and met(rank, entry)
            if need:
                tier = 0 if rank < len(GOALS) and not reached else 1
                if entry and entry.get("status") == "failed":
                    need = f"failed; {need}"
            elif not reached:
                tier = 2
                short = "failed" if entry.get("status") == "failed" else "short of its goal"
                need = f"fresh but {short}: measured again"
            else:
                up_to_date.append(f"{measurement}/{name}")
                continue
            seconds, source = estimate(measurement, name, results, target)
            ranked.append(((tier, rank, order), Item(measurement, name, tier, rank, need, seconds, source)))
    # tier 0 goes round the goals: each unmet goal's first cell, then each one's second, ... so that one call
    # moves every goal it can instead of spending its budget on the first goal's cells
    turn: dict[int, int] = {}
    keyed = []
    for (tier, rank, order), item in sorted(ranked, key=lambda r: r[0]):
        lap = 0
        if tier == 0:
            lap = turn[rank] = turn.get(rank, -1) + 1
        keyed.append(((tier, lap, rank, order), item))
    return [item for _, item in sorted(keyed, key=lambda r: r[0])], up_to_date


def cost(item: Item, base_made: bool) -> float:
    """An item's expected seconds in a call, the random 8B base included for the call's first llama cell."""
    return item.expected_s + (LLAMA_BASE_S if item.measurement == "llama_lora" and not base_made else 0.0)


def fit(
    items: list[Item], budget: float = BUDGET_S, startup: float = STARTUP_S, tail: float = TAIL_S
) -> tuple[list[tuple[Item, float, float]], list[tuple[Item, str]]]:
    """([(item, expected start, expected seconds)] that fit ``budget`` in order after ``startup`` and before
    ``tail``; [(item, why)] skipped because they do not fit what is left)."""
    chosen, skipped, t, base_made = [], [], startup, False
    for item in items:
        need = cost(item, base_made)
        if t + need <= budget - tail:
            chosen.append((item, t, need))
            t += need
            base_made = base_made or item.measurement == "llama_lora"
        else:
            skipped.append((item, f"needs {need:.0f} s, {max(0.0, budget - tail - t):.0f} s left"))
    return chosen, skipped


def execute(
    items: list[Item],
    deadline: float,
    run_cell: Callable[[Item, float], bool],
    clock: Callable[[], float] = time.time,
) -> tuple[list[tuple[Item, bool, float]], list[tuple[Item, str]]]:
    """Run ``items`` in order against ``deadline`` (``clock``'s time): a cell starts only if its expected
    seconds fit what is left, and ``run_cell(item, seconds left)`` must stop it by then. Returns ([(item,
    measured, seconds)] that ran; [(item, why)] skipped)."""
    ran, skipped, base_made = [], [], False
    for item in items:
        start = clock()
        left, need = deadline - start, cost(item, base_made)
        if need > left:
            skipped.append((item, f"needs {need:.0f} s, {max(0.0, left):.0f} s left"))
            continue
        ok = run_cell(item, left)
        ran.append((item, ok, clock() - start))
        base_made = base_made or item.measurement == "llama_lora"
    return ran, skipped


def describe(
    chosen: list[tuple[Item, float, float]],
    skipped: list[tuple[Item, str]],
    up_to_date: list[str],
    target: str,
    budget: float,
    label: str | None,
) -> str:
    """The plan as text."""
    lines = [
        f"One device call on {target}: {budget:.0f} s = {STARTUP_S:.0f} s start-up + cells + {TAIL_S:.0f} s to "
        f"pack the results. It measures the tree at {label or 'an unknown commit'}.",
        "",
        "Goals, by priority: " + "; ".join(f"{i}. {g.text}" for i, g in enumerate(GOALS, 1)) + ".",
        "",
        f"{'#':>2} {'at s':>5} {'takes s':>7}  {'cell':<31} {'tier':>4}  {'goal':<19} why (estimate)",
    ]
    for i, (item, start, need) in enumerate(chosen, 1):
        goal = f"{item.goal + 1}. {GOALS[item.goal].short}" if item.goal < len(GOALS) else "-"
        base = " + the 8B base" if need > item.expected_s else ""
        lines.append(
            f"{i:>2} {start:>5.0f} {need:>7.0f}  {item.key:<31} {item.tier:>4}  {goal:<19} "
            f"{item.need} ({item.estimate}{base})"
        )
    end = chosen[-1][1] + chosen[-1][2] if chosen else STARTUP_S
    lines += ["", f"Cells end at {end:.0f} s, results packed by {end + TAIL_S:.0f} s of {budget:.0f} s."]
    if skipped:
        lines += ["", "Skipped, they do not fit what is left:"]
        lines += [f"   {item.key} (tier {item.tier}): {why}" for item, why in skipped]
    lines += ["", f"Up to date (fresh; goal met, or no goal): {', '.join(up_to_date) or 'none'}."]
    lines += [
        "",
        f"Expected seconds: recorded on {target} x {MARGIN} (a cell that failed early: at least its launcher's "
        f"longest cell there), else recorded on another GPU x {MARGIN}, else {DEFAULT_CELL_S:.0f} s; the call's "
        f"first llama_lora cell + {LLAMA_BASE_S:.0f} s to make the random 8B base.",
    ]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ I/O
def suite_cells() -> dict[str, list[str]]:
    """{measurement: cell names} of the suite at full size, in its priority order."""
    import gpu_suite

    return {m: [c.name for c in gpu_suite.measurement(m).cells(False)] for m in gpu_suite.MEASUREMENTS}


def recorded_commits(results: dict) -> set[str]:
    commits = set()
    for devices in results.values():
        for data in devices.values():
            commits.add(data.get("git_commit"))
            commits.update(e.get("git_commit") for e in data.get("cells", {}).values())
    return {c for c in commits if c and "+" not in c}


def commit_label(repo: str = REPO) -> tuple[str | None, str | None, list[str]]:
    """(HEAD, the label figures get: HEAD, or ``HEAD+uncommitted`` when the measured folders differ from it,
    those differences as ``git status`` lines)."""
    head = S.git("rev-parse", "HEAD", repo=repo)
    dirty = (S.git("status", "--porcelain", "--", *S.MEASURED_ROOTS, repo=repo) or "").splitlines()
    return head, (f"{head}+uncommitted" if dirty else head) if head else None, dirty


def prepare(results: dict, repo: str = REPO) -> dict[str, Any]:
    """What a call carries in .device/plan.json (git is asked here, against the working tree that travels):
    the commit, its label (``+uncommitted`` when the measured folders differ from it), the measured tree's
    digest, and the measured files changed since each recorded commit."""
    head, label, dirty = commit_label(repo)
    changes = S.Changes(repo, against=None)
    since = {c: changes.since(c) for c in sorted(recorded_commits(results))}
    roots = tuple(f"{r}/" for r in S.MEASURED_ROOTS)
    return {
        "commit": head,
        "label": label,
        "uncommitted": dirty,
        "digest": S.tree_digest(repo),
        "changed_since": {
            c: [p for p in ch if p.startswith(roots)] for c, ch in since.items() if ch is not None
        },
    }


def read_plan_file(path: str = PLAN_FILE) -> dict[str, Any]:
    if not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def context(plan_file: str) -> tuple[S.Changes, str | None, list[str]]:
    """(what changed since each commit, the label of the measured commit, warnings): from git here, else
    from the carried plan file, checked against the tree's digest."""
    head, label, dirty = commit_label()
    if head is not None:
        warn = [f"uncommitted changes in what is measured ({len(dirty)} paths): figures will read {label}"]
        return S.Changes(REPO, against=None), label, warn if dirty else []
    carried = read_plan_file(plan_file)
    if not carried:
        warn = f"no git and no {os.path.relpath(plan_file, REPO)}: every recorded figure counts as stale"
        return S.Changes(known={}), None, [warn]
    label, warnings = carried.get("label"), []
    if carried.get("digest") != S.tree_digest():
        label = f"{carried.get('commit')}+changed"
        warnings.append(
            f"{os.path.relpath(plan_file, REPO)} was written for another tree (hf_mlcl/ or recipes/ differ): "
            f"figures are recorded at {label}; run `python benchmarks/device_plan.py --write` before the call"
        )
    return S.Changes(known=carried.get("changed_since", {})), label, warnings


def run_on_device(since: float, budget: float, plan_file: str) -> int:
    """Run the plan on this machine's GPU, ending by ``since + budget - TAIL_S``."""
    import gpu_suite
    from measurements.common import device_info, device_slug

    info = device_info()
    if info["kind"] != "cuda":
        print("no CUDA device: a device call needs a GPU", file=sys.stderr)
        return 2
    target = device_slug(info, False)
    results = load_results()
    changes, label, warnings = context(plan_file)
    for warn in warnings:
        print(f"WARNING: {warn}", flush=True)
    if label and not os.environ.get("MLCL_GIT_COMMIT"):
        os.environ["MLCL_GIT_COMMIT"] = label
    items, up_to_date = candidates(suite_cells(), results, changes, target)
    chosen, skipped = fit(items, budget, max(STARTUP_S, time.time() - since), TAIL_S)
    print(describe(chosen, skipped, up_to_date, target, budget, label))
    print(f"\n== running on {info['name']}, {time.time() - since:.0f} s after the call began", flush=True)
    out_dir = os.path.join(gpu_suite.RESULTS, target)
    cache_dir = os.path.join(tempfile.gettempdir(), "hf_mlcl_gpu_suite")
    os.makedirs(cache_dir, exist_ok=True)

    def run_cell(item: Item, left: float) -> bool:
        print(f"== {item.key} ({left:.0f} s left; expected {item.expected_s:.0f} s)", flush=True)
        return gpu_suite.run_measurement(
            item.measurement,
            False,
            True,
            out_dir,
            cache_dir,
            "bash benchmarks/device_run.sh",
            [item.cell],
            left,
        )

    ran, skipped = execute(items, since + budget - TAIL_S, run_cell)
    print(f"\n== {time.time() - since:.0f} s after the call began")
    for item, ok, seconds in ran:
        print(f"   {'measured' if ok else 'FAILED  '} {item.key} in {seconds:.0f} s")
    for item, why in skipped:
        print(f"   skipped  {item.key}: {why}")
    return 0 if all(ok for _, ok, _ in ran) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budget", type=float, default=float(os.environ.get("MLCL_DEVICE_BUDGET_S", BUDGET_S)))
    ap.add_argument("--device", default=TARGET, help="results folder of the device planned for")
    ap.add_argument("--results", default=RESULTS)
    ap.add_argument("--plan-file", default=PLAN_FILE)
    ap.add_argument("--write", action="store_true", help="write the plan file that travels with the call")
    ap.add_argument("--run", action="store_true", help="run the plan (on the device machine)")
    ap.add_argument("--since", type=float, help="with --run: when the call began (seconds since the epoch)")
    ap.add_argument("--label", action="store_true", help="print the commit label figures get, and stop")
    opts = ap.parse_args(argv)
    if opts.label:
        _, label, warnings = context(opts.plan_file)
        print(*warnings, sep="\n", file=sys.stderr)
        print(label or "")
        return 0
    if opts.run:
        return run_on_device(opts.since or time.time(), opts.budget, opts.plan_file)
    results = load_results(opts.results)
    if opts.write:
        prepared = prepare(results)
        os.makedirs(os.path.dirname(opts.plan_file), exist_ok=True)
        with open(opts.plan_file, "w", encoding="utf-8") as fh:
            json.dump(prepared, fh, indent=1)
        print(
            f"wrote {opts.plan_file}: {prepared['label']}, {len(prepared['changed_since'])} recorded commits"
        )
    changes, label, warnings = context(opts.plan_file)
    for warn in warnings:
        print(f"WARNING: {warn}")
    items, up_to_date = candidates(suite_cells(), results, changes, opts.device)
    chosen, skipped = fit(items, opts.budget)
    print(describe(chosen, skipped, up_to_date, opts.device, opts.budget, label))
    return 0


if __name__ == "__main__":
    sys.exit(main())
