"""The GPU suite: every figure of the mission's scale in one command, most valuable first.

    python benchmarks/gpu_suite.py                 # every measurement not yet measured on this GPU
    python benchmarks/gpu_suite.py --list          # the measurements and their cells, in priority order
    python benchmarks/gpu_suite.py --only llama_lora[,throughput] [--force]
    python benchmarks/gpu_suite.py --only llama_lora --cells '*-plain*'   # some cells (shell patterns)
    python benchmarks/gpu_suite.py --tiny          # every measurement at toy sizes on the CPU (a check)

Each measurement is ``benchmarks/measurements/<name>.py`` and writes
``benchmarks/results/<device>/<name>.json``, from which docs/PERFORMANCE.md is written. One device call
within a time budget: ``benchmarks/device_plan.py``.

Method: docs/benchmarks.md, "The GPU suite (benchmarks/gpu_suite.py)"
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(1, REPO)

MEASUREMENTS = ("llama_lora", "throughput", "plm_icd", "losses", "gradcache")
RESULTS = os.path.join(HERE, "results")


def measurement(name: str):
    """The module of one measurement (``benchmarks/measurements/<name>.py``)."""
    if name not in MEASUREMENTS:
        raise SystemExit(f"unknown measurement {name!r}; choose from {', '.join(MEASUREMENTS)} (see --list)")
    return importlib.import_module(f"measurements.{name}")


def git_commit() -> str | None:
    """The commit measured: ``MLCL_GIT_COMMIT`` when set (a copy of the tree without its .git), else git's."""
    if os.environ.get("MLCL_GIT_COMMIT"):
        return os.environ["MLCL_GIT_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_groups(cells: list, tiny: bool) -> list[list]:
    """The cells that share a child process, in plan order: each cell alone on a GPU (its own peak memory,
    and a crash or out-of-memory stops that cell only); under ``--tiny`` the plain cells together."""
    if not tiny:
        return [[c] for c in cells]
    plain = [c for c in cells if c.launcher == "plain"]
    return ([plain] if plain else []) + [[c] for c in cells if c.launcher != "plain"]


def cell_command(name: str, cells: list, tiny: bool, result_dir: str, cache_dir: str) -> list[str]:
    """The command that runs cells of one launcher in one child process, each writing
    ``<result_dir>/<cell>.json``."""
    cell = cells[0]
    own = [
        os.path.join(HERE, "gpu_suite.py"),
        "--cell",
        f"{name}/{','.join(c.name for c in cells)}",
        "--result",
        result_dir,
        "--cache-dir",
        cache_dir,
    ] + (["--tiny"] if tiny else [])
    if cell.launcher == "plain":
        return [sys.executable, *own]
    config = os.path.join(
        REPO,
        "recipes",
        "accelerate",
        {"fsdp": "fsdp_llama_lora.yaml", "deepspeed": "deepspeed_zero3.yaml"}[cell.launcher],
    )
    launch = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        config,
        "--num_processes",
        "1",
        "--main_process_port",
        str(free_port()),
    ]
    if tiny:
        launch += ["--mixed_precision", "no"]
    return [*launch, *own]


def child_env(tiny: bool) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["PYTHONUNBUFFERED"] = "1"
    if tiny:
        env["CUDA_VISIBLE_DEVICES"] = ""  # --tiny always runs on the CPU
    return env


_ERROR = re.compile(r"^(\[rank\d+\]: )?([A-Za-z_.]*(Error|Exception)|Killed)\b")


def first_error(lines: list[str]) -> str:
    """The line of a failed cell's log that names its error: the first exception raised by the cell
    itself (the launcher's own ChildFailedError comes after it), else the last line."""
    for line in lines:
        if _ERROR.search(line) and "ChildFailedError" not in line and "elastic" not in line:
            return line.removeprefix("[rank0]: ")
    return lines[-1] if lines else ""


def cut_middle(text: str, limit: int) -> str:
    """``text``, or when longer than ``limit`` its two ends around `` ... ``: the end of an error message (what
    failed) survives a long middle (a tensor's repr, say)."""
    half = limit // 2 - 2
    return text if len(text) <= limit else f"{text[:half]} ... {text[-half:]}"


def short_error(err: BaseException, limit: int = 400) -> str:
    """``Type: message``, a long message cut in its middle (:func:`cut_middle`)."""
    return cut_middle(f"{type(err).__name__}: {err}", limit)


def frames(err: BaseException, last: int = 30) -> list[str]:
    """Where an error was raised: ``file:line:function`` of the traceback's last frames, innermost last
    (a log's tail can be filled by one long message and keep none of them)."""
    return [
        f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in traceback.extract_tb(err.__traceback__)
    ][-last:]


def load_results(path: str) -> dict[str, Any]:
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    return {}


def write_results(path: str, data: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.write("\n")
    os.replace(tmp, path)


def save(path: str, data: dict[str, Any]) -> None:
    """Write a measurement's results; with ``MLCL_SUITE_MIRROR`` set, also a flat copy there
    (``<device>-<measurement>.json``), so a run stopped from outside still leaves every finished cell
    where it is collected (benchmarks/device_run.sh points it at the device tool's output folder)."""
    write_results(path, data)
    mirror = os.environ.get("MLCL_SUITE_MIRROR")
    if mirror:
        name = f"{os.path.basename(os.path.dirname(path))}-{os.path.basename(path)}"
        write_results(os.path.join(mirror, name), data)


def header(name: str, module, tiny: bool, command: str) -> dict[str, Any]:
    from measurements.common import device_info, versions

    if tiny:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    return {
        "measurement": name,
        "description": module.DESCRIPTION,
        "tiny": tiny,
        "device": device_info(),
        "versions": versions(),
        "git_commit": git_commit(),
        "command": command,
    }


def run_child(cmd: list[str], env: dict[str, str], timeout: float) -> tuple[int | str, str]:
    """(exit status or ``"timeout"``, stdout + stderr) of a child run in its own process group: at the
    timeout the whole group is killed (a launcher's workers too, so none keeps the GPU)."""
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        preexec_fn=os.setpgrp,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out + err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return "timeout", (out or "") + (err or "")


def run_group(
    name: str, group: list, tiny: bool, cache_dir: str, limit_s: float | None = None
) -> list[tuple[Any, dict[str, Any]]]:
    """Run cells in one child process under their launcher; each cell's results entry: its figures, or the
    check that failed, or its error and the log's tail. ``limit_s`` caps the cells' own timeout (a device
    call's deadline); a cell stopped by it says so (``cut_at_deadline``)."""
    result_dir = tempfile.mkdtemp(prefix=f"{name}-")
    cmd = cell_command(name, group, tiny, result_dir, cache_dir)
    label = f"{name}/{','.join(c.name for c in group)}"
    print(f"[{label}] {' '.join(cmd)}", flush=True)
    own_timeout = sum(c.timeout for c in group)
    timeout = own_timeout if limit_s is None else max(1.0, min(own_timeout, limit_s))
    t0 = time.perf_counter()
    rc, log = run_child(cmd, child_env(tiny), timeout)
    seconds = time.perf_counter() - t0
    command = " ".join(
        os.path.relpath(c, REPO) if c.startswith(REPO) else c
        for c in cmd
        if not c.startswith(tempfile.gettempdir())
    )
    entries = []
    for cell in group:
        result = os.path.join(result_dir, f"{cell.name}.json")
        figures = load_results(result)
        raised, own, where = (
            figures.pop("_raised", None),
            figures.pop("_seconds", None),
            figures.pop("_where", None),
        )
        entry: dict[str, Any] = {
            "launcher": cell.launcher,
            "params": cell.params,
            "command": command,
            "git_commit": git_commit(),
            "seconds": round(seconds if len(group) == 1 or own is None else own, 1),
        }
        if len(group) > 1:
            entry["process"] = f"shared by {len(group)} cells (--tiny)"
        # a cell alone needs its process to end cleanly; in a shared process, another cell's error is not its own
        finished = figures and not raised and (rc == 0 or len(group) > 1)
        failed_checks = [k for k, v in figures.get("checks", {}).items() if not v]
        if finished and not failed_checks:
            entry.update(status="ok", figures=figures)
            print(f"[{name}/{cell.name}] ok in {entry['seconds']:.0f} s", flush=True)
        elif finished:
            entry.update(status="failed", error=f"check failed: {', '.join(failed_checks)}", figures=figures)
            print(f"[{name}/{cell.name}] FAILED check {', '.join(failed_checks)}", flush=True)
        else:
            lines = [
                line.replace(REPO + os.sep, "") for line in log.splitlines() if line.strip()
            ]  # paths in the tree
            error = raised or first_error(lines)
            if rc == "timeout" and timeout < own_timeout:
                entry["cut_at_deadline"] = True
                error = f"stopped at the call's deadline after {seconds:.0f} s"
            entry.update(status="failed", returncode=rc, error=error.strip()[-500:], log_tail=lines[-40:])
            if where:
                entry["traceback"] = where
            print(f"[{name}/{cell.name}] FAILED ({rc}): {entry['error']}", flush=True)
        entries.append((cell, entry))
    shutil.rmtree(result_dir, ignore_errors=True)
    return entries


def run_measurement(
    name: str,
    tiny: bool,
    force: bool,
    out_dir: str,
    cache_dir: str,
    command: str,
    patterns: list[str] | None = None,
    limit_s: float | None = None,
) -> bool:
    """Run the pending cells of one measurement (those matching ``patterns``, when given); True when every
    cell that ran was measured. ``limit_s`` caps each cell's time (:func:`run_group`); a cell stopped by it
    keeps its earlier result, if any, noting the cut (``cut_at_deadline_s``)."""
    module = measurement(name)
    path = os.path.join(out_dir, f"{name}.json")
    data = load_results(path)
    for entry in data.get("cells", {}).values():  # a cell measured before cells named their own commit
        if data.get("git_commit") and "git_commit" not in entry and entry.get("status") != "not_run":
            entry["git_commit"] = data["git_commit"]
    data.update(header(name, module, tiny, command))
    cells = data.setdefault("cells", {})
    plan = module.cells(tiny)
    on_cpu = data["device"]["kind"] == "cpu"
    pending = []
    for cell in plan:
        if patterns and not any(fnmatch.fnmatchcase(cell.name, p) for p in patterns):
            continue
        done = cells.get(cell.name, {})
        if done.get("status") == "ok" and not force:
            print(f"[{name}/{cell.name}] measured already (--force to measure again)", flush=True)
            continue
        if on_cpu and cell.cpu_reason:
            cells[cell.name] = {"status": "not_run", "launcher": cell.launcher, "reason": cell.cpu_reason}
            print(f"[{name}/{cell.name}] not run on the CPU: {cell.cpu_reason}", flush=True)
            save(path, data)
            continue
        pending.append(cell)
    for group in launch_groups(pending, tiny):
        for cell, entry in run_group(name, group, tiny, cache_dir, limit_s):
            if entry.get("cut_at_deadline") and cell.name in cells:
                cells[cell.name]["cut_at_deadline_s"] = entry["seconds"]
                continue
            cells[cell.name] = entry
        data["complete"] = all(cells.get(c.name, {}).get("status") in ("ok", "not_run") for c in plan)
        save(path, data)
    data["complete"] = all(cells.get(c.name, {}).get("status") in ("ok", "not_run") for c in plan)
    save(path, data)
    ran = [c for c in plan if not patterns or any(fnmatch.fnmatchcase(c.name, p) for p in patterns)]
    return all(cells.get(c.name, {}).get("status") in ("ok", "not_run") for c in ran)


def run_cells(spec: str, tiny: bool, result_dir: str, cache_dir: str) -> int:
    """Child process: run the cells ``name/cell[,cell...]`` one after the other and write each one's figures
    to ``result_dir/<cell>.json`` (main process only). A cell that raises writes its error and the next one
    runs; the exit status is 1 when any raised."""
    name, _, cell_names = spec.partition("/")
    module = measurement(name)
    plan = {c.name: c for c in module.cells(tiny)}
    unknown = [c for c in cell_names.split(",") if c not in plan]
    if unknown:
        raise SystemExit(f"{name} has no cell {unknown[0]!r}")
    failed = 0
    for cell_name in cell_names.split(","):
        t0 = time.perf_counter()
        try:
            figures = module.run(plan[cell_name], tiny, cache_dir)
        except Exception as err:  # noqa: BLE001 - reported as this cell's error; the next cell still runs
            traceback.print_exc()
            figures, failed = {"_raised": short_error(err), "_where": frames(err)}, 1
        figures["_seconds"] = time.perf_counter() - t0
        if int(os.environ.get("RANK", "0")) == 0:
            write_results(os.path.join(result_dir, f"{cell_name}.json"), figures)
    try:
        from hf_mlcl.training import distributed as D

        D.shutdown()
    except Exception:  # noqa: BLE001 - a child that never started a process group has nothing to end
        pass
    return failed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--list", action="store_true", help="print the measurements and cells in priority order")
    ap.add_argument("--only", help="comma-separated measurement names")
    ap.add_argument("--cells", help="comma-separated shell patterns of cell names to run (default: all)")
    ap.add_argument("--force", action="store_true", help="measure again what is already measured")
    ap.add_argument("--tiny", action="store_true", help="toy sizes on the CPU (a check of the whole suite)")
    ap.add_argument("--out", help="results folder (default benchmarks/results/<device>)")
    ap.add_argument("--cache-dir", help="folder for generated base models (default: a temporary folder)")
    ap.add_argument("--cell", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    names = list(MEASUREMENTS) if not opts.only else [n.strip() for n in opts.only.split(",") if n.strip()]
    for n in names:
        measurement(n)
    cache_dir = opts.cache_dir or os.path.join(tempfile.gettempdir(), "hf_mlcl_gpu_suite")
    os.makedirs(cache_dir, exist_ok=True)
    if opts.cell:
        return run_cells(opts.cell, opts.tiny, opts.result, cache_dir)
    if opts.list:
        for i, n in enumerate(names, 1):
            module = measurement(n)
            print(f"{i}. {n}: {module.DESCRIPTION}")
            for cell in module.cells(opts.tiny):
                print(f"     {cell.name} ({cell.launcher})")
        return 0
    if opts.tiny:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import torch
    from measurements.common import device_info, device_slug

    if not opts.tiny and not torch.cuda.is_available():
        print(
            "no CUDA device: the suite's sizes need a GPU; `--tiny` runs every measurement at toy sizes on the CPU",
            file=sys.stderr,
        )
        return 2
    out_dir = opts.out or os.path.join(RESULTS, device_slug(device_info(), opts.tiny))
    command = (
        "python benchmarks/gpu_suite.py"
        + (f" --only {','.join(names)}" if opts.only else "")
        + (f" --cells '{opts.cells}'" if opts.cells else "")
        + (" --tiny" if opts.tiny else "")
    )
    ok = True
    for n in names:
        print(f"== {n}", flush=True)
        patterns = [p.strip() for p in opts.cells.split(",")] if opts.cells else None
        ok = run_measurement(n, opts.tiny, opts.force, out_dir, cache_dir, command, patterns) and ok
    print(
        f"results in {os.path.relpath(out_dir, REPO) if out_dir.startswith(REPO) else out_dir}"
        + ("" if ok else " (some cells failed)"),
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
