"""`hf-mlcl` as a new user meets it (issue 12 part 4): argument parsing and error paths, no training."""

from __future__ import annotations

import os
import types

import pytest

from hf_mlcl.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")


def _no_training(monkeypatch):
    import hf_mlcl.training.pipeline as pipeline

    def boom(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(pipeline, "run_contrastive_stage", boom)
    monkeypatch.setattr(pipeline, "run_probe_stage", boom)


@pytest.mark.parametrize("repo_id", ["bad id", "a/b/c", "user/name-"])
def test_run_rejects_a_bad_push_to_before_training(monkeypatch, capsys, tmp_path, repo_id):
    _no_training(monkeypatch)
    rc = main(["run", RECIPE, "--push-to", repo_id, "--output_dir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"invalid Hub repo_id {repo_id!r}" in err and "user/name" in err
    assert os.listdir(tmp_path) == []


def test_run_prints_stage_headers_and_output_paths(monkeypatch, capsys, tmp_path):
    import hf_mlcl.training.pipeline as pipeline

    calls = []

    def contrastive(model_args, data_args, args):
        calls.append("contrastive")
        return None, {"train_loss": 1.0}

    def probe(model_args, data_args, args, encoder, loss):
        calls.append(("probe", encoder, loss))
        trainer = types.SimpleNamespace(is_world_process_zero=lambda: True)
        return trainer, {"test_micro_f1": 0.5, "test_macro_f1": 0.4}

    monkeypatch.setattr(pipeline, "run_contrastive_stage", contrastive)
    monkeypatch.setattr(pipeline, "run_probe_stage", probe)
    rc = main(["run", RECIPE, "--output_dir", str(tmp_path), "--no-plots"])
    assert rc == 0
    out = capsys.readouterr().out
    enc, clf = os.path.join(str(tmp_path), "encoder"), os.path.join(str(tmp_path), "classifier")
    assert calls == ["contrastive", ("probe", enc, calls[1][2])]
    assert f"stage 1/2: contrastive training of the encoder (loss: {calls[1][2]}) -> {enc}" in out
    assert f"stage 2/2: multi-label head on the encoder -> {clf}" in out
    assert out.index("stage 1/2") < out.index(f"encoder saved to {enc}") < out.index("stage 2/2")
    assert f"classifier saved to {clf}" in out
    assert f"results: {os.path.join(str(tmp_path), 'results.json')}" in out
    assert os.path.isfile(os.path.join(str(tmp_path), "results.json"))


def test_check_repo_id_accepts_valid_ids():
    from hf_mlcl.hub import check_repo_id

    assert check_repo_id("user/my-model_1.0") == "user/my-model_1.0"
    assert check_repo_id("name") == "name"
    with pytest.raises(ValueError, match="empty Hub repo_id"):
        check_repo_id("")
