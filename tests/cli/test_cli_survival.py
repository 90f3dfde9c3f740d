"""Runs that survive and never mix: resume after a kill -9 in the middle of a checkpoint save, resume
of a `run` that skips the finished stage, the re-run guard, Ctrl-C's resume hint, file permissions."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys

import pytest
import torch

from hf_mlcl import cli
from hf_mlcl.cli import main
from hf_mlcl.training.checkpoints import SAVING_MARKER, is_complete_checkpoint, last_complete_checkpoint

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
TINY_DATA = json.dumps(
    {"num_labels": 6, "num_train": 64, "num_validation": 32, "num_test": 32, "min_words": 8, "max_words": 20}
)
TRAIN = [
    "train",
    RECIPE,
    "--dataset_options",
    TINY_DATA,
    "--max_steps",
    "6",
    "--save_strategy",
    "steps",
    "--save_steps",
    "2",
    "--per_device_train_batch_size",
    "16",
    "--disable_tqdm",
    "true",
    "--keep_checkpoints",
    "true",
]

# the child trains, and SIGKILLs itself inside the save of checkpoint-4: after the weights and the
# optimizer are written, before the RNG state and trainer_state.json
KILLER = """
import os, signal, sys
from transformers import Trainer
orig = Trainer._save_rng_state
def killing(self, output_dir):
    if self.state.global_step == 4:
        os.kill(os.getpid(), signal.SIGKILL)
    return orig(self, output_dir)
Trainer._save_rng_state = killing
from hf_mlcl.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _weights(folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(os.path.join(folder, "model.safetensors"))


@pytest.mark.timeout(600)
def test_resume_after_kill_9_mid_save_takes_the_last_complete_checkpoint(tmp_path, capsys):
    from transformers.trainer_utils import get_last_checkpoint

    out = str(tmp_path / "killed")
    proc = subprocess.run(
        [sys.executable, "-c", KILLER, *TRAIN, "--output_dir", out],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == -9, proc.stderr[-3000:]
    half = os.path.join(out, "checkpoint-4")
    assert os.path.isfile(os.path.join(half, SAVING_MARKER)) and not is_complete_checkpoint(half)
    assert get_last_checkpoint(out) == half  # what the Trainer alone would have resumed from
    assert last_complete_checkpoint(out) == os.path.join(out, "checkpoint-2")
    # what a kill inside a model save leaves: its hidden temp folder, inside output_dir (a checkpoint's) or
    # beside it (the stage's final save)
    leftovers = [os.path.join(out, ".checkpoint-4.tmp-k1ll3d"), str(tmp_path / ".killed.tmp-k1ll3d")]
    for folder in leftovers:
        os.makedirs(folder)
        open(os.path.join(folder, "model.safetensors"), "wb").write(b"half")
    (tmp_path / ".tmp-someone-elses").write_text("not the run's")  # beside the run: never deleted
    capsys.readouterr()

    assert main([*TRAIN, "--output_dir", out, "--resume_from_checkpoint", "true"]) == 0
    assert f"resuming from {os.path.join(out, 'checkpoint-2')}" in capsys.readouterr().out
    assert not any(os.path.exists(folder) for folder in leftovers)
    assert (tmp_path / ".tmp-someone-elses").read_text() == "not the run's"
    for step in (2, 4, 6):
        assert is_complete_checkpoint(os.path.join(out, f"checkpoint-{step}")), step
    assert json.load(open(os.path.join(out, "trainer_state.json")))["global_step"] == 6
    # the resumed run ends where an uninterrupted one does, and its train_loss is over all 6 steps
    ref = str(tmp_path / "uninterrupted")
    assert main([*TRAIN, "--output_dir", ref]) == 0
    resumed, straight = _weights(out), _weights(ref)
    assert resumed.keys() == straight.keys()
    for name in straight:
        torch.testing.assert_close(resumed[name], straight[name], rtol=0, atol=1e-6, msg=name)
    losses = [json.load(open(os.path.join(folder, "metrics.json")))["train_loss"] for folder in (out, ref)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)


def _mode(path: str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.mark.timeout(600)
def test_rerun_guard_resume_skips_the_finished_stage_and_overwrite(tmp_path, capsys):
    out = str(tmp_path / "run")
    run = [
        "run",
        RECIPE,
        "--output_dir",
        out,
        "--dataset_options",
        TINY_DATA,
        "--max_steps",
        "2",
        "--disable_tqdm",
        "true",
        "--no-plots",
    ]
    assert main(run) == 0
    enc, clf = os.path.join(out, "encoder"), os.path.join(out, "classifier")
    umask = os.umask(0)
    os.umask(umask)
    for path in (
        os.path.join(enc, "README.md"),
        os.path.join(enc, "card_data.json"),
        os.path.join(clf, "README.md"),
        os.path.join(out, "results.json"),
    ):
        assert _mode(path) == 0o666 & ~umask, (path, oct(_mode(path)))
    capsys.readouterr()

    # a second run into the same folder stops before any work and says what to do
    weights = os.path.join(enc, "model.safetensors")
    before = os.stat(weights).st_mtime_ns
    assert main(run) == 2
    err = capsys.readouterr().err
    assert (
        "already holds a run" in err
        and "--overwrite_output_dir true" in err
        and "--resume_from_checkpoint" in err
    )
    assert os.stat(weights).st_mtime_ns == before

    # stage 2 "interrupted" (its card never written): resuming redoes stage 2 only
    os.unlink(os.path.join(clf, "card_data.json"))
    assert main([*run, "--resume_from_checkpoint", "true"]) == 0
    assert f"{enc} is finished" in capsys.readouterr().out
    assert os.stat(weights).st_mtime_ns == before
    assert os.path.isfile(os.path.join(clf, "card_data.json"))

    # --overwrite_output_dir true replaces the run, and its old checkpoints go with it; so does everything of the
    # old model: a native head's classifier keeps no sentence-transformers head of the linear one, no ONNX export
    # or evaluation of the old weights (they would load or be pushed with the new model); other files stay
    os.makedirs(os.path.join(enc, "checkpoint-1"))
    open(os.path.join(enc, "checkpoint-1", "trainer_state.json"), "w").write("{}")
    assert os.path.isfile(os.path.join(clf, "modules.json")) and os.path.isdir(os.path.join(clf, "2_Dense"))
    os.makedirs(os.path.join(clf, "onnx"))
    for name in ("onnx/model.onnx", "eval_validation.json", "notes.txt", "0123abcd.safetensors"):
        open(os.path.join(clf, name), "w").write("of the old run")
    assert main([*run, "--overwrite_output_dir", "true", "--head", "native", "--pooling", "cls"]) == 0
    assert os.stat(weights).st_mtime_ns != before
    assert not os.path.exists(os.path.join(enc, "checkpoint-1"))
    left = sorted(os.listdir(clf))
    for name in (
        "modules.json",
        "2_Dense",
        "1_Pooling",
        "sentence_bert_config.json",
        "onnx",
        "eval_validation.json",
    ):
        assert name not in left, left
    assert (
        "notes.txt" in left and "0123abcd.safetensors" in left and "config.json" in left
    )  # a feature cache stays
    from transformers import AutoModelForSequenceClassification

    assert (
        type(AutoModelForSequenceClassification.from_pretrained(clf)).__name__
        == "BertForSequenceClassification"
    )


def _files(folder) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
        for d, _, names in os.walk(folder)
        for f in names
    }


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--dataset", "{tmp}/my_dta.csv", "--dataset_options", "{}"], "my_dta.csv' does not exist"),
        (
            ["--dataset", "{tmp}/no_labels.csv", "--dataset_options", "{}"],
            "found no label column",
        ),  # while loading
        (["--model_name_or_path", "{tmp}/no_model"], "no such folder"),
        (["--push_to", "bad id"], "invalid Hub repo_id"),
        (["--lerning_rate", "0.1"], "did you mean 'learning_rate'"),
    ],
)
def test_overwrite_keeps_the_old_run_until_the_new_inputs_are_checked(tmp_path, capsys, bad, message):
    """--overwrite_output_dir true with a typo in the data, model, recipe key or push target: the
    interrupted run's resumable checkpoints (both stages) are all still there."""
    out = tmp_path / "run"
    for stage in ("encoder", "classifier"):
        ckpt = out / stage / "checkpoint-4"
        ckpt.mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text('{"global_step": 4}')
        (ckpt / "model.safetensors").write_bytes(b"weights of step 4")
    (tmp_path / "no_labels.csv").write_text(
        "text,source\nsome words,web\nmore words,news\n", encoding="utf-8"
    )
    before = _files(out)
    args = [a.replace("{tmp}", str(tmp_path)) for a in bad]
    rc = main(
        [
            "run",
            RECIPE,
            "--output_dir",
            str(out),
            "--overwrite_output_dir",
            "true",
            "--max_steps",
            "2",
            "--disable_tqdm",
            "true",
            *args,
        ]
    )
    assert rc == 2
    assert message in capsys.readouterr().err
    assert _files(out) == before


def test_ctrl_c_prints_one_resume_line(monkeypatch, capsys):
    def interrupted(ns, overrides):
        raise KeyboardInterrupt

    monkeypatch.setitem(cli.COMMANDS, "run", interrupted)
    rc = main(["run", RECIPE, "--output_dir", "x y", "--resume_from_checkpoint", "false", "--max_steps", "3"])
    assert rc == 130
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1
    assert err.endswith(
        f"Resume with: hf-mlcl run {RECIPE} --output_dir 'x y' --max_steps 3 --resume_from_checkpoint true"
    )


def test_sigterm_prints_the_resume_line_and_no_token(monkeypatch, capsys):
    """SIGTERM (pre-emption, kill) stops a command as Ctrl-C does, exit 143, with the resume line, which never
    echoes a token given on the command line."""
    import signal

    def terminated(ns, overrides):
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setitem(cli.COMMANDS, "run", terminated)
    before = signal.getsignal(signal.SIGTERM)
    rc = main(
        ["run", RECIPE, "--output_dir", "out", "--hub_token", "hf_SECRET", "--probe.hub_token=hf_OTHER"]
    )
    assert rc == 143 and signal.getsignal(signal.SIGTERM) is before  # the handler is restored
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1 and "terminated." in err
    assert "hf_SECRET" not in err and "hf_OTHER" not in err
    assert err.endswith(
        f"Resume with: hf-mlcl run {RECIPE} --output_dir out --hub_token ... --probe.hub_token=... "
        "--resume_from_checkpoint true"
    )
