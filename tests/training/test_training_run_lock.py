"""One run per output folder: the run lock a stage's writer holds, a second holder refused in one line naming the
first, the lock of a killed run taken over, and two CLI runs into one folder never both finishing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hf_mlcl.training.preflight import InputError
from hf_mlcl.training.run_lock import RunLock

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_a_second_holder_is_refused_and_the_lock_goes_with_its_holder(tmp_path):
    folder = str(tmp_path / "run")
    lock_file = str(tmp_path / ".run.hf_mlcl.lock")  # beside the folder: nothing is created inside it
    with RunLock(folder):
        assert os.path.isfile(lock_file) and not os.path.exists(folder)
        with pytest.raises(InputError, match=rf"in use by another run \(process {os.getpid()} on host"):
            RunLock(folder).acquire()
    assert not os.path.exists(lock_file)  # removed by its holder
    (tmp_path / ".run.hf_mlcl.lock").write_text(
        '{"pid": 1, "host": "gone", "since": "then"}'
    )  # a killed run's
    with RunLock(folder):
        pass  # nobody holds it: taken over


def test_a_second_run_into_a_running_folder_stops_in_one_line(tmp_path):
    """While a run trains, its folder's lock is held: another holder is refused, and a second hf-mlcl run into
    the folder (resuming it) exits 2 with one line naming the first; the first run trains on undisturbed until
    it is stopped (SIGTERM: exit 143 with its resume hint), and its lock is free again."""
    import time

    recipe = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
    out = str(tmp_path / "out")
    cmd = [
        os.path.join(os.path.dirname(sys.executable), "hf-mlcl"),
        "train",
        recipe,
        "--output_dir",
        out,
        "--use_cpu",
        "true",
        "--disable_tqdm",
        "true",
        "--report_to",
        "none",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [*cmd, "--contrastive.max_steps", "1000"],
        cwd=str(tmp_path),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not os.path.exists(str(tmp_path / ".out.hf_mlcl.lock")) and time.monotonic() < deadline:
        assert first.poll() is None, first.stderr.read()
        time.sleep(0.01)
    with pytest.raises(InputError, match=f"in use by another run \\(process {first.pid} on host"):
        RunLock(out).acquire()
    second = subprocess.run(
        [*cmd, "--resume_from_checkpoint", "true"],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert first.poll() is None, (
        "the first run ended before the second reached the lock: the test proves nothing"
    )
    assert second.returncode == 2, second.stderr[-2000:]
    err = second.stderr.strip().splitlines()
    assert "is in use by another run" in err[-1] and "Traceback" not in second.stderr
    assert first.poll() is None  # still training: the refused second run left it alone
    first.send_signal(signal.SIGTERM)
    assert first.wait(timeout=240) == 143, first.stderr.read()[-2000:]
    assert "--resume_from_checkpoint" in first.stderr.read()
    with RunLock(out):
        pass  # released by the stopped run


def test_a_run_folder_is_held_for_all_its_stages_and_a_demo_folder_for_the_whole_demo(tmp_path, capsys):
    """`run` holds its root folder's lock from its first stage to results.json, so a second run or a resume into
    it stops at once rather than between two stages; the demo holds its folder the same way."""
    from hf_mlcl.cli import main
    from hf_mlcl.demo import run_demo

    recipe = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
    out = str(tmp_path / "out")
    with RunLock(out):
        assert (
            main(["run", recipe, "--output_dir", out, "--max_steps", "1", "--resume_from_checkpoint", "true"])
            == 2
        )
        assert "in use by another run" in capsys.readouterr().err
        with pytest.raises(InputError, match="in use by another run"):
            run_demo(output_dir=out, losses=["sd"])
    assert not os.path.exists(os.path.join(out, "encoder"))  # refused before any stage wrote


def test_train_resumed_on_a_finished_encoder_keeps_it(tmp_path, capsys):
    """`hf-mlcl train --resume_from_checkpoint true` into a finished stage (same settings) reports it and trains
    nothing: it used to train a new encoder over the finished one, under a classifier built on the old."""
    from hf_mlcl.cli import main

    recipe = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
    out = str(tmp_path / "encoder")
    train = ["train", recipe, "--output_dir", out, "--max_steps", "2", "--disable_tqdm", "true"]
    assert main(train) == 0
    weights = os.path.join(out, "model.safetensors")
    before = os.stat(weights).st_mtime_ns
    capsys.readouterr()
    assert main([*train, "--resume_from_checkpoint", "true"]) == 0
    assert f"{out} is finished" in capsys.readouterr().out
    assert os.stat(weights).st_mtime_ns == before


@pytest.mark.timeout(200)
def test_two_processes_stop_alike_when_another_run_holds_the_folder(tmp_path):
    """Two processes start stage 1 into a folder another run holds: the process that writes the folder finds
    the lock, and every process stops with its message (none waits for the other in a collective)."""
    from _training_helpers import run_two_processes

    held = RunLock(str(tmp_path / "encoder")).acquire()
    try:
        run_two_processes(
            os.path.join(os.path.dirname(__file__), "_lock_worker.py"), str(tmp_path), timeout=180
        )
    finally:
        held.release()
    for rank in (0, 1):
        assert "is in use by another run" in (tmp_path / f"rank{rank}.txt").read_text(), rank


def test_a_folder_inside_a_running_run_is_refused_but_the_runs_own_stages_take_theirs(tmp_path):
    """A probe into the classifier/ of a run that is going on wrote there, and the run then failed at its stage 2
    ("already holds a run"); the run's own stages lock their folders inside its root in the same process."""
    root = tmp_path / "run"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom hf_mlcl.training.run_lock import RunLock\n"
            f"RunLock({str(root)!r}).acquire(); print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(
            InputError, match=rf"is inside {root}, which another run is using \(process {holder.pid}"
        ):
            RunLock(str(root / "classifier")).acquire()
        assert not os.path.exists(tmp_path / "run" / ".classifier.hf_mlcl.lock")
    finally:
        holder.kill()
        holder.wait()
    with RunLock(str(root)), RunLock(str(root / "encoder")), RunLock(str(root / "classifier")):
        pass  # hf-mlcl run: the root held for the run, each stage's folder by the same process
