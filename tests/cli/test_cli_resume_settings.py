"""A resume with other settings than the run's stops and lists them (a checkpoint mid-stage, or a finished stage
that would be skipped and its old results reported), unless --overwrite_output_dir true lets the new ones win."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from hf_mlcl.cli import main
from hf_mlcl.training.run_settings import RUN_SETTINGS_FILE

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
TINY_DATA = json.dumps(
    {"num_labels": 6, "num_train": 64, "num_validation": 32, "num_test": 32, "min_words": 8, "max_words": 20}
)
COMMON = ["--dataset_options", TINY_DATA, "--disable_tqdm", "true", "--per_device_train_batch_size", "16"]


def test_a_checkpoint_resumed_with_another_learning_rate_stops_listing_it(tmp_path, capsys):
    out = str(tmp_path / "encoder")
    train = ["train", RECIPE, "--output_dir", out, *COMMON, "--save_strategy", "steps", "--save_steps", "2"]
    assert main([*train, "--max_steps", "2", "--keep_checkpoints", "true"]) == 0
    stored = json.load(open(os.path.join(out, "checkpoint-2", RUN_SETTINGS_FILE)))
    assert stored["loss"] == "similarity_dissimilarity" and stored["max_steps"] == 2
    os.remove(os.path.join(out, "metrics.json"))  # the stage looks interrupted after its checkpoint
    capsys.readouterr()
    resume = [*train, "--max_steps", "4", "--resume_from_checkpoint", "true"]
    assert main([*resume, "--learning_rate", "5e-3"]) == 2
    err = capsys.readouterr().err
    assert "was trained with other settings" in err and "learning_rate 0.001 -> 0.005" in err
    assert "max_steps 2 -> 4" in err and "--overwrite_output_dir true" in err
    assert main([*resume, "--learning_rate", "5e-3", "--overwrite_output_dir", "true"]) == 0
    state = json.load(open(os.path.join(out, "trainer_state.json")))
    assert state["global_step"] == 4  # resumed at step 2 with the new settings
    assert json.load(open(os.path.join(out, RUN_SETTINGS_FILE)))["learning_rate"] == 5e-3


def test_a_finished_stage_with_another_loss_is_not_reported_as_done(tmp_path, capsys):
    out = str(tmp_path / "run")
    run = ["run", RECIPE, "--output_dir", out, *COMMON, "--max_steps", "2", "--no-plots"]
    assert main(run) == 0
    first = json.load(open(os.path.join(out, "encoder", "metrics.json")))
    capsys.readouterr()
    assert main([*run, "--resume_from_checkpoint", "true"]) == 0  # the same settings: both stages skipped
    out_text = capsys.readouterr().out
    assert "encoder is finished" in out_text and "saved to" not in out_text
    assert f"encoder kept in {os.path.join(out, 'encoder')} (finished earlier" in out_text
    assert f"classifier kept in {os.path.join(out, 'classifier')} (finished earlier" in out_text
    changed = [*run, "--resume_from_checkpoint", "true", "--contrastive.loss", "msc"]
    assert main(changed) == 2
    assert "loss 'similarity_dissimilarity' -> 'msc'" in capsys.readouterr().err
    assert json.load(open(os.path.join(out, "encoder", "metrics.json"))) == first
    assert main([*changed, "--overwrite_output_dir", "true"]) == 0  # trained again with msc
    assert json.load(open(os.path.join(out, "encoder", "metrics.json")))["loss"] == "msc"
    probe = json.load(open(os.path.join(out, "classifier", RUN_SETTINGS_FILE)))
    assert probe["encoder"]["loss"] == "msc"  # the probe was trained again on the new encoder
    capsys.readouterr()
    # stage 1 trained again on its own: the probe of the old encoder is not reported as done
    train = ["train", RECIPE, "--output_dir", os.path.join(out, "encoder"), *COMMON, "--max_steps", "2"]
    assert main([*train, "--loss", "sd", "--overwrite_output_dir", "true"]) == 0
    capsys.readouterr()
    assert main([*run, "--resume_from_checkpoint", "true", "--contrastive.loss", "sd"]) == 2
    assert "encoder.loss 'msc' -> 'similarity_dissimilarity'" in capsys.readouterr().err


def test_a_classifier_stage_does_not_depend_on_the_projection_head(tmp_path):
    """The projection head shapes stage 1 only: a probe or joint fine-tune records no projection_dim, and a
    checkpoint that stored a key its stage no longer depends on resumes without a difference."""
    from hf_mlcl.training.arguments import (
        ContrastiveTrainingArguments,
        JointTrainingArguments,
        ModelArguments,
        ProbingTrainingArguments,
    )
    from hf_mlcl.training.run_settings import check_resume_settings, stage_settings

    model = ModelArguments(model_name_or_path="m", projection_dim=64)
    out = str(tmp_path)
    assert stage_settings(ContrastiveTrainingArguments(output_dir=out), model)["projection_dim"] == 64
    for args in (ProbingTrainingArguments(output_dir=out), JointTrainingArguments(output_dir=out)):
        assert "projection_dim" not in stage_settings(args, model)
    joint = stage_settings(JointTrainingArguments(output_dir=out), model)
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps({**joint, "projection_dim": 256}))
    check_resume_settings(out, joint, overwrite=False)  # no difference: nothing raised
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps({**joint, "learning_rate": 1.0}))
    with pytest.raises(ValueError, match=r"learning_rate 1.0 -> 5e-05"):
        check_resume_settings(out, joint, overwrite=False)


def test_a_checkpoint_older_than_an_option_resumes_when_the_option_keeps_its_default(tmp_path):
    """A run stored before an option existed (its run_settings.json lacks the key) ran as the option's default
    does: resuming with the default is no difference, with another value it is."""
    from hf_mlcl.training.arguments import JointTrainingArguments, ModelArguments
    from hf_mlcl.training.run_settings import check_resume_settings, stage_settings

    out, model = str(tmp_path), ModelArguments(model_name_or_path="m")
    joint = stage_settings(JointTrainingArguments(output_dir=out), model)
    older = {k: v for k, v in joint.items() if k != "contrastive_projection_dim"}
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps(older))
    check_resume_settings(out, joint, overwrite=False)  # the default, 0: nothing raised
    projected = stage_settings(JointTrainingArguments(output_dir=out, contrastive_projection_dim=8), model)
    with pytest.raises(ValueError, match=r"contrastive_projection_dim None -> 8"):
        check_resume_settings(out, projected, overwrite=False)
    # a key whose stages disagree on its default (loss: sd in stage 1, bce in the probe) stays a difference
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps({k: v for k, v in joint.items() if k != "loss"}))
    with pytest.raises(ValueError, match=r"loss None -> "):
        check_resume_settings(out, joint, overwrite=False)


def test_a_finished_stage_trained_again_starts_from_scratch_not_from_its_kept_checkpoint(tmp_path, caplog):
    """--overwrite_output_dir true on a finished stage resumed with another learning rate: it trains again from
    the start; its kept final checkpoint (keep_checkpoints) would leave the old weights under the new settings."""
    from safetensors.torch import load_file

    out = str(tmp_path / "encoder")
    train = ["train", RECIPE, "--output_dir", out, *COMMON, "--max_steps", "2", "--keep_checkpoints", "true"]
    train += ["--save_strategy", "steps", "--save_steps", "2"]
    assert main(train) == 0
    old = load_file(os.path.join(out, "model.safetensors"))
    again = [
        *train,
        "--resume_from_checkpoint",
        "true",
        "--overwrite_output_dir",
        "true",
        "--learning_rate",
        "5e-2",
    ]
    assert main(again) == 0
    new = load_file(os.path.join(out, "model.safetensors"))
    assert any(not torch.equal(old[k], new[k]) for k in old)
    state = json.load(open(os.path.join(out, "trainer_state.json")))
    assert state["global_step"] == 2 and state["log_history"][0]["learning_rate"] > 1e-2
    assert json.load(open(os.path.join(out, RUN_SETTINGS_FILE)))["learning_rate"] == 5e-2
    assert "(learning_rate 0.001 -> 0.05); --overwrite_output_dir true: trained again" in caplog.text


def test_an_interrupted_overwrite_is_not_resumed_as_the_old_finished_run(tmp_path, capsys, monkeypatch):
    """--overwrite_output_dir true stops in training: the old run's finished files are gone with its checkpoints,
    so a resume trains the new run instead of reporting the old one's metrics."""
    from hf_mlcl.training import ContrastiveTrainer

    out = str(tmp_path / "encoder")
    train = ["train", RECIPE, "--output_dir", out, *COMMON, "--max_steps", "2"]
    assert main(train) == 0
    with monkeypatch.context() as patch:
        patch.setattr(ContrastiveTrainer, "train", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt))
        assert main([*train, "--overwrite_output_dir", "true"]) == 130
    assert not any(os.path.exists(os.path.join(out, n)) for n in ("metrics.json", "card_data.json"))
    capsys.readouterr()
    assert main([*train, "--resume_from_checkpoint", "true"]) == 0
    assert "is finished" not in capsys.readouterr().out
    assert json.load(open(os.path.join(out, "trainer_state.json")))["global_step"] == 2


def test_the_evaluation_caps_and_the_best_model_choice_are_settings(tmp_path):
    """A finished classifier evaluated on other caps, or a stage choosing its saved model otherwise, is not the
    run asked for; a run stored before these were recorded resumes whatever their value."""
    from hf_mlcl.training.arguments import DataArguments, ModelArguments, ProbingTrainingArguments
    from hf_mlcl.training.run_settings import check_resume_settings, stage_settings

    out, model = str(tmp_path), ModelArguments(model_name_or_path="m")
    args = ProbingTrainingArguments(output_dir=out)
    stored = stage_settings(args, model, DataArguments(dataset="aapd", max_test_samples=100))
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps(stored))
    now = stage_settings(args, model, DataArguments(dataset="aapd", max_test_samples=200))
    with pytest.raises(ValueError, match="max_test_samples 100 -> 200"):
        check_resume_settings(out, now, overwrite=False)
    best = ProbingTrainingArguments(
        output_dir=out, load_best_model_at_end=True, eval_strategy="epoch", save_strategy="epoch"
    )
    with pytest.raises(ValueError, match="load_best_model_at_end False -> True"):
        check_resume_settings(
            out,
            stage_settings(best, model, DataArguments(dataset="aapd", max_test_samples=100)),
            overwrite=False,
        )
    later = ("max_eval_samples", "max_test_samples", "load_best_model_at_end", "metric_for_best_model")
    older = {k: v for k, v in stored.items() if k not in later}
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps(older))
    check_resume_settings(
        out, stage_settings(best, model, DataArguments(dataset="aapd", max_test_samples=200)), overwrite=False
    )


def test_the_process_count_and_the_optimizer_options_are_settings(tmp_path):
    """A checkpoint of a 1-process run resumed by 2 processes trains other batches (each process contrasts its
    own); the scheduler's and Adam's options and a dropped last batch change the run too. A run stored before
    these were recorded resumes whatever their value."""
    from hf_mlcl.training.arguments import ContrastiveTrainingArguments, DataArguments, ModelArguments
    from hf_mlcl.training.run_settings import check_resume_settings, stage_settings

    out, model, data = str(tmp_path), ModelArguments(model_name_or_path="m"), DataArguments(dataset="aapd")
    stored = stage_settings(ContrastiveTrainingArguments(output_dir=out), model, data)
    assert stored["world_size"] == 1
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps(stored))
    two = dict(stage_settings(ContrastiveTrainingArguments(output_dir=out), model, data), world_size=2)
    with pytest.raises(ValueError, match="world_size 1 -> 2"):
        check_resume_settings(out, two, overwrite=False)
    for changed, message in (
        ({"lr_scheduler_kwargs": {"num_cycles": 2}}, "lr_scheduler_kwargs None -> {'num_cycles': 2}"),
        ({"adam_beta2": 0.9}, "adam_beta2 0.999 -> 0.9"),
        ({"adam_epsilon": 1e-6}, "adam_epsilon 1e-08 -> 1e-06"),
        ({"dataloader_drop_last": False}, "dataloader_drop_last True -> False"),
        ({"data_seed": 5}, "data_seed None -> 5"),  # the batches' order
    ):
        now = stage_settings(ContrastiveTrainingArguments(output_dir=out, **changed), model, data)
        with pytest.raises(ValueError, match=re.escape(message)):
            check_resume_settings(out, now, overwrite=False)
    other_tokens = ModelArguments(model_name_or_path="m", tokenizer_name_or_path="t")
    with pytest.raises(ValueError, match=re.escape("tokenizer_name_or_path None -> 't'")):
        check_resume_settings(
            out, stage_settings(ContrastiveTrainingArguments(output_dir=out), other_tokens, data), False
        )
    # a finished adapter run resumed with merge_lora true was kept as adapters, "with these settings"
    merged = ModelArguments(model_name_or_path="m", use_lora=True, merge_lora=True)
    lora = stage_settings(ContrastiveTrainingArguments(output_dir=out), merged, data)
    with pytest.raises(ValueError, match=re.escape("merge_lora False -> True")):
        check_resume_settings(out, dict(lora, use_lora=False), overwrite=False)
    later = ("lr_scheduler_kwargs", "adam_beta2", "world_size", "dataloader_drop_last", "data_seed")
    later += ("tokenizer_name_or_path", "merge_lora")
    (tmp_path / RUN_SETTINGS_FILE).write_text(json.dumps({k: v for k, v in stored.items() if k not in later}))
    check_resume_settings(out, two, overwrite=False)
    check_resume_settings(
        out, dict(two, data_seed=5, tokenizer_name_or_path="t", merge_lora=True), overwrite=False
    )  # recorded since: an old folder says nothing of them


def _csv(path, seed: int) -> str:
    import random

    rng = random.Random(seed)
    words = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()
    rows = ["text,labels"] + [
        f"{' '.join(rng.choices(words, k=8))},{';'.join(rng.sample('abcd', k=rng.randint(1, 2)))}"
        for _ in range(96)
    ]
    path.write_text("\n".join(rows) + "\n")
    return str(path)


def test_a_data_file_replaced_between_a_kill_and_its_resume_stops_the_resume(tmp_path, capsys):
    """The same path with other rows trained the resumed steps on other data (exit 0, another encoder): each
    checkpoint records the fingerprints of the splits it trained on, and a resume compares them."""
    data, out = tmp_path / "d.csv", str(tmp_path / "encoder")
    train = ["train", RECIPE, "--dataset", _csv(data, 0), "--output_dir", out, "--disable_tqdm", "true"]
    train += ["--per_device_train_batch_size", "16", "--save_strategy", "steps", "--save_steps", "2"]
    assert main([*train, "--max_steps", "2", "--keep_checkpoints", "true"]) == 0
    stored = json.load(open(os.path.join(out, "checkpoint-2", RUN_SETTINGS_FILE)))
    assert set(stored["data_fingerprint"]) == {"train", "validation"}
    os.remove(os.path.join(out, "metrics.json"))  # the stage looks interrupted after its checkpoint
    _csv(data, 1)  # the same file name, other rows
    capsys.readouterr()
    assert main([*train, "--max_steps", "4", "--resume_from_checkpoint", "true"]) == 2
    err = capsys.readouterr().err
    assert "was trained with other settings" in err and "data_fingerprint" in err


def test_a_finished_run_resumed_on_other_rows_names_them_and_trains_again_when_told(tmp_path, capsys):
    """A finished stage that recorded its rows is compared on them at a resume: other rows are a changed setting
    (one line; --overwrite_output_dir true trains again), not a skipped stage whose final evaluation then fails."""
    data, out = tmp_path / "d.csv", str(tmp_path / "run")
    run = [
        "run",
        RECIPE,
        "--dataset",
        _csv(data, 0),
        "--output_dir",
        out,
        "--disable_tqdm",
        "true",
        "--no_plots",
    ]
    run += ["--per_device_train_batch_size", "16", "--max_steps", "2"]
    assert main(run) == 0
    _csv(data, 1)
    capsys.readouterr()
    assert main([*run, "--resume_from_checkpoint", "true"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was trained with other settings: data_fingerprint" in err[0], err
    assert main([*run, "--resume_from_checkpoint", "true", "--overwrite_output_dir", "true"]) == 0
    stored = json.load(open(os.path.join(out, "classifier", RUN_SETTINGS_FILE)))["data_fingerprint"]
    assert main([*run, "--resume_from_checkpoint", "true"]) == 0  # now finished on these rows
    assert json.load(open(os.path.join(out, "classifier", RUN_SETTINGS_FILE)))["data_fingerprint"] == stored


def test_train_resumed_on_a_finished_encoder_with_other_rows_names_them(tmp_path, capsys):
    """`hf-mlcl train` (one stage) compares a finished folder's recorded rows too, not only `run`."""
    data, out = tmp_path / "d.csv", str(tmp_path / "encoder")
    train = ["train", RECIPE, "--dataset", _csv(data, 0), "--output_dir", out, "--disable_tqdm", "true"]
    train += ["--per_device_train_batch_size", "16", "--max_steps", "2"]
    assert main(train) == 0
    _csv(data, 1)
    capsys.readouterr()
    assert main([*train, "--resume_from_checkpoint", "true"]) == 2
    assert "was trained with other settings: data_fingerprint" in capsys.readouterr().err
    _csv(data, 0)
    assert main([*train, "--resume_from_checkpoint", "true"]) == 0  # the same rows: finished, kept


def test_the_stages_of_one_run_hash_its_rows_once(tmp_path, monkeypatch):
    """Both stages record the fingerprints of the same loaded rows; the rows are hashed once per run."""
    import hf_mlcl.training.run_settings as run_settings

    calls = []
    digest = run_settings.split_fingerprints

    def counted(dataset):
        calls.append(sorted(dataset))
        return digest(dataset)

    monkeypatch.setattr(run_settings, "split_fingerprints", counted)
    out = str(tmp_path / "run")
    run = ["run", RECIPE, "--dataset", _csv(tmp_path / "d.csv", 0), "--output_dir", out, "--no_plots"]
    assert (
        main([*run, "--disable_tqdm", "true", "--per_device_train_batch_size", "16", "--max_steps", "2"]) == 0
    )
    assert len(calls) == 1, calls
    encoder, classifier = (
        json.load(open(os.path.join(out, stage, RUN_SETTINGS_FILE)))["data_fingerprint"]
        for stage in ("encoder", "classifier")
    )
    assert encoder == classifier and set(encoder) == set(calls[0])
