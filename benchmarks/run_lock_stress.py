"""Two runs into one folder, N tries: never both exit 0 (the stage folders' run lock, hf_mlcl.training.run_lock).

Run B starts into run A's folder at a seeded random offset; the result is written as JSON
(benchmarks/cpu_results/run_lock_stress.json). Exit 1 when a try had both runs exit 0, a run failed otherwise
than by a one-line refusal (exit 2), or a stage folder was trained by both runs.

    nice -n 19 python benchmarks/run_lock_stress.py              # 20 tries
    python benchmarks/run_lock_stress.py --tries 4 --max-offset 2 (a quick check)

Method: docs/benchmarks.md, "Run lock stress test (benchmarks/run_lock_stress.py)"
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "recipes", "demo", "tiny_synthetic.yaml")
OUT = os.path.join(REPO, "benchmarks", "cpu_results", "run_lock_stress.json")
DATA = {
    "num_labels": 6,
    "num_train": 64,
    "num_validation": 32,
    "num_test": 32,
    "min_words": 8,
    "max_words": 20,
}
KINDS = ("run", "run-resume", "train", "train-resume")
LOCK_ERROR = "is in use by another run"
FOLDER_ERROR = "already holds a run"
# A's output lines that open a phase (a run's stage headers and saves); the phase before the first is "startup"
MARKERS = (
    ("stage 1", re.compile(r"^=== hf-mlcl run: stage 1/")),
    ("between stages", re.compile(r"^encoder saved to ")),
    ("stage 2", re.compile(r"^=== hf-mlcl run: stage 2/")),
    ("evaluation", re.compile(r"^classifier saved to ")),
)
SAVED = re.compile(r"^(encoder|classifier) saved to ")
SKIPPED = re.compile(r" is finished; resuming after it$")  # a finished stage a resumed run does not redo
EVENTS = re.compile(
    r"^=== hf-mlcl |^(encoder|classifier) saved to | is finished; resuming after it$|^results: "
)


def plan(
    tries: int,
    seed: int,
    max_offset: float,
    at_once: int,
    kinds: tuple[str, ...] = KINDS,
    min_offset: float = 0.0,
) -> list[tuple[str, float]]:
    """(kind of run B, its start offset in s) per try: the kinds in turn; the first ``at_once`` tries at 0."""
    rng = random.Random(seed)
    rows = []
    for k in range(tries):
        offset = rng.uniform(min_offset, max_offset)
        rows.append((kinds[k % len(kinds)], 0.0 if k < at_once else round(offset, 3)))
    return rows


def classify(rc: int | None, stderr: str) -> str:
    """How a run ended: "ok", "lock" / "folder" (refused in one line, exit 2), "timeout" or "other"."""
    if rc == 0:
        return "ok"
    if rc is None:
        return "timeout"
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if rc != 2 or "Traceback" in stderr or not last.startswith("hf-mlcl "):
        return "other"
    if LOCK_ERROR in last:
        return "lock"
    if FOLDER_ERROR in last:
        return "folder"
    return "other"


def last_line(stderr: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def holder_pid(error: str) -> int | None:
    """The process id the lock's error names, if any."""
    m = re.search(r"in use by another run \(process (\d+) ", error)
    return int(m.group(1)) if m else None


def phase_at(
    lines: list[tuple[float, str]], end: float | None, t: float | None, first: str = "startup"
) -> str:
    """A run's phase at time ``t`` from its timestamped output lines (``MARKERS``) and its end time; ``first``:
    the phase before the first marker ("stage 1" for ``hf-mlcl train``, which prints no stage header)."""
    if end is None or t is None:
        return ""
    if t >= end:
        return "ended"
    phase = first
    for when, text in lines:
        if when > t:
            break
        for name, pattern in MARKERS:
            if pattern.match(text):
                phase = name
    return phase


def outcome(a: dict, b: dict) -> str:
    """ "both exit 0" when both runs exit 0 having trained a stage; a run that exits 0 having trained nothing
    (a resume that found every stage finished) is no second writer: "one exit 0, one found it finished"."""
    zeros = (a["rc"] == 0) + (b["rc"] == 0)
    if zeros == 2 and not (a["trained"] and b["trained"]):
        return "one exit 0, one found it finished"
    return {2: "both exit 0", 1: "one exit 0", 0: "none exit 0"}[zeros]


def trained_folders(lines: list[tuple[float, str]]) -> list[str]:
    """The stage folders a run trained and saved ("encoder", "classifier"): its "saved to" lines, less the
    stages it skipped as finished (their "is finished; resuming after it" line comes first)."""
    trained, skipped = [], False
    for _, text in lines:
        if SKIPPED.search(text):
            skipped = True
        elif m := SAVED.match(text):
            if not skipped:
                trained.append(m.group(1))
            skipped = False
    return trained


def summarize(rows: list[dict]) -> dict:
    both = [r["try"] for r in rows if r["outcome"] == "both exit 0"]
    one = [r["try"] for r in rows if r["outcome"].startswith("one exit 0")]
    none = [r["try"] for r in rows if r["outcome"] == "none exit 0"]
    bad = [r["try"] for r in rows if any(r[x]["end"] in ("other", "timeout") for x in ("a", "b"))]
    twice = [r["try"] for r in rows if r["written_twice"]]
    return {
        "tries": len(rows),
        "both_exit_0": both,
        "one_exit_0": len(one),
        "none_exit_0": none,
        "refusals": {
            kind: sum(r[x]["end"] == kind for r in rows for x in ("a", "b")) for kind in ("lock", "folder")
        },
        "unexpected_failures": bad,
        "written_twice": twice,
        "ok": not (both or bad or twice),
    }


def _command(kind: str, folder: str, exe: str, stage1_steps: int, probe_steps: int) -> list[str]:
    common = ["--use_cpu", "true", "--disable_tqdm", "true", "--report_to", "none"]
    common += ["--dataset_options", json.dumps(DATA), "--contrastive.max_steps", str(stage1_steps)]
    resume = ["--resume_from_checkpoint", "true"] if kind.endswith("-resume") else []
    if kind.startswith("train"):
        return [exe, "train", RECIPE, "--output_dir", os.path.join(folder, "encoder"), *common, *resume]
    cmd = [exe, "run", RECIPE, "--output_dir", folder, "--no_plots", *common]
    return [*cmd, "--probe.max_steps", str(probe_steps), *resume]


class _Proc:
    """A child process with its output lines timestamped (s since ``t0``) and its end time."""

    def __init__(self, cmd: list[str], cwd: str, env: dict, t0: float, timeout: float) -> None:
        self.t0, self.start = t0, time.monotonic() - t0
        self.p = subprocess.Popen(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.out: list[tuple[float, str]] = []
        self.err: list[tuple[float, str]] = []
        self.end: float | None = None
        self.rc: int | None = None
        self._threads = [
            threading.Thread(target=self._read, args=(self.p.stdout, self.out)),
            threading.Thread(target=self._read, args=(self.p.stderr, self.err)),
        ]
        for t in self._threads:
            t.start()
        self._timeout = timeout

    def _read(self, stream, into: list) -> None:
        for line in stream:
            into.append((time.monotonic() - self.t0, line.rstrip("\n")))

    def wait(self) -> None:
        try:
            self.rc = self.p.wait(timeout=max(1.0, self._timeout - (time.monotonic() - self.t0)))
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
            self.rc = None
        self.end = time.monotonic() - self.t0
        for t in self._threads:
            t.join()

    def record(self) -> dict:
        stderr = "\n".join(text for _, text in self.err)
        said = [when for when, text in self.err if text.strip()]
        return {
            "pid": self.p.pid,
            "rc": self.rc,
            "start_s": round(self.start, 3),
            "wall_s": round(self.end - self.start, 3),
            "end": classify(self.rc, stderr),
            "error": "" if self.rc == 0 else last_line(stderr),
            "error_at_s": round(said[-1], 3) if said and self.rc != 0 else None,  # when it printed its error
            "trained": trained_folders(self.out),
            "skipped": [
                os.path.basename(t.split(" is finished")[0]) for _, t in self.out if SKIPPED.search(t)
            ],
            "first_output_s": round(self.out[0][0], 3) if self.out else None,
            "events": [[round(when, 3), text] for when, text in self.out if EVENTS.search(text)],
            "stderr_tail": "" if self.rc == 0 else stderr[-2000:],
        }


def one_try(k: int, kind: str, offset: float, root: str, args) -> dict:
    folder = os.path.join(root, f"try{k}")
    exe = os.path.join(os.path.dirname(sys.executable), "hf-mlcl")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    t0 = time.monotonic()
    a = _Proc(_command("run", folder, exe, args.stage1_steps, args.probe_steps), root, env, t0, args.timeout)
    time.sleep(offset)
    b = _Proc(_command(kind, folder, exe, args.stage1_steps, args.probe_steps), root, env, t0, args.timeout)
    a.wait()
    b.wait()
    ra, rb = a.record(), b.record()
    refused = [(r, winner) for r, winner in ((ra, b), (rb, a)) if r["end"] in ("lock", "folder")]
    twice = sorted(set(ra["trained"]) & set(rb["trained"]))
    if kind.startswith("train"):  # B's own folder is the encoder: the classifier is A's alone
        twice = [f for f in twice if f == "encoder"]
    row = {
        "try": k,
        "kind": kind,
        "offset_s": offset,
        "a": ra,
        "b": rb,
        "outcome": outcome(ra, rb),
        "overlap_s": round(a.end - b.start, 3),  # B started this long before A ended (negative: after)
        "written_twice": twice,
        "holder_is_other_run": all(
            holder_pid(r["error"]) == w.p.pid for r, w in refused if r["end"] == "lock"
        ),
        # the winner's phase when the refused run printed its error
        "other_phase_at_refusal": (
            phase_at(
                refused[0][1].out,
                refused[0][1].end,
                refused[0][0]["error_at_s"],
                "stage 1" if refused[0][1] is b and kind.startswith("train") else "startup",
            )
            if refused
            else ""
        ),
        # A's phase when B first printed (past its folder check): B's folder check came at or before it
        "a_phase_at_b_output": phase_at(a.out, a.end, rb["first_output_s"]),
        # the classifier's model is older than the encoder's: the encoder it was trained on was replaced
        "encoder_newer_than_classifier": _newer(
            os.path.join(folder, "encoder", "model.safetensors"),
            os.path.join(folder, "classifier", "model.safetensors"),
        ),
        "finished_folders": [
            name
            for name in ("encoder", "classifier")
            if os.path.isfile(os.path.join(folder, name, "metrics.json"))
        ],
    }
    return row


def _newer(path: str, than: str) -> bool:
    try:
        return os.stat(path).st_mtime_ns > os.stat(than).st_mtime_ns
    except FileNotFoundError:
        return False


def _table(rows: list[dict]) -> str:
    head = (
        "| try | B | offset s | A rc | A s | B rc | B s | outcome | B trained | A at B's first line "
        "| winner at refusal | refused run's error |"
    )
    lines = [head, "|---" * (head.count("|") - 1) + "|"]
    for r in rows:
        err = next((r[x]["error"] for x in ("b", "a") if r[x]["rc"] != 0), "")
        err = re.sub(r"^hf-mlcl \w+: error: ", "", err)
        err = err if len(err) <= 90 else err[:87] + "..."
        lines.append(
            f"| {r['try']} | {r['kind']} | {r['offset_s']:.2f} | {r['a']['rc']} | {r['a']['wall_s']:.1f} "
            f"| {r['b']['rc']} | {r['b']['wall_s']:.1f} | {r['outcome']} | {' '.join(r['b']['trained']) or '-'} "
            f"| {r['a_phase_at_b_output']} | {r['other_phase_at_refusal']} | {err} |"
        )
    return "\n".join(lines)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tries", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-offset", type=float, default=4.0, help="B starts up to this many s after A")
    p.add_argument("--min-offset", type=float, default=0.0, help="and at least this many")
    p.add_argument("--at-once", type=int, default=2, help="the first tries start both runs together")
    p.add_argument("--stage1-steps", type=int, default=40)
    p.add_argument("--probe-steps", type=int, default=100)
    p.add_argument("--timeout", type=float, default=300.0, help="per try")
    p.add_argument("--kinds", default=",".join(KINDS), help="run B's kinds, taken in turn")
    p.add_argument("--out", default=OUT)
    args = p.parse_args(argv)
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        p.error(f"--kinds: one or more of {', '.join(KINDS)}")

    rows = []
    with tempfile.TemporaryDirectory() as root:
        for k, (kind, offset) in enumerate(
            plan(args.tries, args.seed, args.max_offset, args.at_once, kinds, args.min_offset)
        ):
            rows.append(one_try(k, kind, offset, root, args))
            r = rows[-1]
            print(
                f"try {k} ({kind}, +{offset:.2f} s): A {r['a']['rc']} ({r['a']['end']}), "
                f"B {r['b']['rc']} ({r['b']['end']})",
                flush=True,
            )
    summary = summarize(rows)
    print()
    print(_table(rows))
    print()
    for r in rows:  # anything but one exit 0 with a one-line refusal: both runs' stage lines and errors
        odd = (
            not r["outcome"].startswith("one exit 0")
            or r["written_twice"]
            or r["encoder_newer_than_classifier"]
        )
        if odd or not r["holder_is_other_run"] or r["a"]["end"] not in ("ok", "lock", "folder"):
            print(
                f"try {r['try']} ({r['kind']}): {r['outcome']}; trained by both: {r['written_twice'] or 'none'}; "
                f"encoder newer than classifier: {r['encoder_newer_than_classifier']}"
            )
            for x in ("a", "b"):
                print(f"  {x.upper()} (pid {r[x]['pid']}, rc {r[x]['rc']}, from {r[x]['start_s']:.2f} s):")
                for when, text in r[x]["events"]:
                    print(f"    {when:7.2f} {text[:150]}")
                if r[x]["rc"] != 0:
                    print(f"    {r[x]['error_at_s']:7.2f} {r[x]['error'][:150]}")
    print(
        f"tries {summary['tries']}: both exit 0 {len(summary['both_exit_0'])}, exactly one exit 0 "
        f"{summary['one_exit_0']}, none exit 0 {len(summary['none_exit_0'])}; refusals by the lock "
        f"{summary['refusals']['lock']}, by the folder check {summary['refusals']['folder']}; unexpected "
        f"failures {len(summary['unexpected_failures'])}; a stage folder trained by both runs "
        f"{len(summary['written_twice'])}"
    )
    result = {
        "measurement": "run_lock_stress",
        "git_commit": _commit(),
        "cpu_count": os.cpu_count(),
        "command": "python benchmarks/run_lock_stress.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "settings": {
            "tries": args.tries,
            "seed": args.seed,
            "min_offset_s": args.min_offset,
            "max_offset_s": args.max_offset,
            "at_once": args.at_once,
            "recipe": os.path.relpath(RECIPE, REPO),
            "dataset_options": DATA,
            "contrastive_max_steps": args.stage1_steps,
            "probe_max_steps": args.probe_steps,
            "kinds": list(kinds),
            "omp_num_threads": 1,
        },
        "summary": summary,
        "tries": rows,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(result, fh, indent=1)
        fh.write("\n")
    print(f"written: {args.out}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
