"""The pure parts of benchmarks/run_lock_stress.py (two runs into one folder): the seeded plan of tries, how a
run's end is classified, the phase of a run at a time, the summary, and a child's timestamped output (a
trivial process, no training)."""

from __future__ import annotations

import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import run_lock_stress as S  # noqa: E402


def test_the_plan_is_seeded_starts_the_first_tries_together_and_turns_through_the_kinds():
    rows = S.plan(8, seed=3, max_offset=4.0, at_once=2)
    assert rows == S.plan(8, seed=3, max_offset=4.0, at_once=2)
    assert [kind for kind, _ in rows] == list(S.KINDS) * 2
    assert [offset for _, offset in rows[:2]] == [0.0, 0.0]
    assert all(0.0 <= offset <= 4.0 for _, offset in rows) and len({o for _, o in rows[2:]}) == 6


def test_a_run_ends_ok_refused_in_one_line_or_otherwise():
    lock = "hf-mlcl run: error: /t/encoder is in use by another run (process 12 on host h since now); wait"
    folder = "hf-mlcl train: error: output_dir /t/encoder already holds a run (README.md); pass ..."
    assert S.classify(0, "") == "ok" and S.classify(None, "") == "timeout"
    assert S.classify(2, f"some warning\n{lock}\n") == "lock" and S.holder_pid(lock) == 12
    assert S.classify(2, folder) == "folder"
    assert S.classify(1, lock) == "other"  # not the refusal's exit status
    assert S.classify(2, f"Traceback (most recent call last):\n{lock}") == "other"
    assert S.classify(2, "hf-mlcl run: error: something else") == "other"


def test_the_phase_of_a_run_from_its_output_lines():
    lines = [
        (1.0, "=== hf-mlcl run: stage 1/2: contrastive training of the encoder -> /t/encoder"),
        (3.0, "encoder saved to /t/encoder"),
        (3.1, "=== hf-mlcl run: stage 2/2: multi-label head on the encoder -> /t/classifier"),
        (4.0, "classifier saved to /t/classifier"),
    ]
    phases = [S.phase_at(lines, 5.0, t) for t in (0.5, 2.0, 3.05, 3.5, 4.5, 5.0)]
    assert phases == ["startup", "stage 1", "between stages", "stage 2", "evaluation", "ended"]
    assert S.phase_at([], 5.0, 1.0, first="stage 1") == "stage 1"
    assert S.trained_folders(lines) == ["encoder", "classifier"]
    resumed = [(0.5, "/t/encoder is finished; resuming after it"), *lines[:4]]
    assert S.trained_folders(resumed) == ["classifier"]


def test_the_summary_fails_on_both_exit_0_an_unexpected_failure_or_a_folder_written_twice():
    def row(k, a, b, end_b="lock", twice=(), b_trained=("encoder",)):
        return {
            "try": k,
            "outcome": S.outcome({"rc": a, "trained": ["encoder"]}, {"rc": b, "trained": list(b_trained)}),
            "a": {"end": "ok" if a == 0 else "lock"},
            "b": {"end": "ok" if b == 0 else end_b},
            "written_twice": list(twice),
        }

    good = [row(0, 0, 2), row(1, 2, 0), row(2, 0, 2, "folder")]
    summary = S.summarize(good)
    assert summary["ok"] and summary["one_exit_0"] == 3 and summary["refusals"] == {"lock": 2, "folder": 1}
    assert not S.summarize([*good, row(3, 0, 0)])["ok"]
    assert S.summarize([*good, row(3, 0, 0)])["both_exit_0"] == [3]
    assert not S.summarize([*good, row(3, 0, 2, "other")])["ok"]
    assert not S.summarize([*good, row(3, 0, 2, twice=["encoder"])])["ok"]
    # a resume that found every stage finished and trained nothing is no second writer
    finished = S.summarize([*good, row(3, 0, 0, b_trained=())])
    assert finished["ok"] and finished["one_exit_0"] == 4


def test_a_child_s_output_is_timestamped_and_its_error_line_recorded(tmp_path):
    code = "import sys; print('encoder saved to x'); print('hf-mlcl run: error: x is in use by another run', file=sys.stderr); sys.exit(2)"
    proc = S._Proc(
        [sys.executable, "-c", code], str(tmp_path), dict(os.environ), time.monotonic(), timeout=60
    )
    proc.wait()
    rec = proc.record()
    assert rec["rc"] == 2 and rec["end"] == "lock" and rec["trained"] == ["encoder"]
    assert rec["error"].endswith("in use by another run") and rec["error_at_s"] is not None
