"""One run per output folder: the run lock a stage's writer holds, a second holder refused in one line naming the
first, the lock of a killed run taken over, and two CLI runs into one folder never both finishing."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from hf_mlcl.training.preflight import InputError
from hf_mlcl.training.run_lock import LOCK_NAME, RunLock

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_a_second_holder_is_refused_and_the_lock_goes_with_its_holder(tmp_path):
    folder = str(tmp_path / "run")
    with RunLock(folder):
        assert os.path.isfile(os.path.join(folder, LOCK_NAME))
        with pytest.raises(InputError, match=rf"in use by another run \(process {os.getpid()} on host"):
            RunLock(folder).acquire()
    assert not os.path.exists(os.path.join(folder, LOCK_NAME))  # removed by its holder
    (tmp_path / "run" / LOCK_NAME).write_text('{"pid": 1, "host": "gone", "since": "then"}')  # a killed run's
    with RunLock(folder):
        pass  # nobody holds it: taken over


def test_two_runs_into_one_folder_never_both_finish(tmp_path):
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
        "--contrastive.max_steps",
        "4",
        "--overwrite_output_dir",
        "true",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    runs = [
        subprocess.Popen(
            cmd, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=240), p.stderr.read()) for p in runs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 2], results
    refused = next(err for rc, err in results if rc == 2)
    assert "is in use by another run" in refused and "Traceback" not in refused
