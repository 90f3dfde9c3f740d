"""`hf-mlcl` as a new user meets it (issue 12 part 4): argument parsing and error paths, no training."""

from __future__ import annotations

import os
import types

import pytest

from hf_mlcl import cli
from hf_mlcl.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")


def _no_training(monkeypatch):
    import hf_mlcl.training.stages as stages

    def boom(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(stages, "run_contrastive_stage", boom)
    monkeypatch.setattr(stages, "run_probe_stage", boom)


@pytest.mark.parametrize("repo_id", ["bad id", "a/b/c", "user/name-"])
def test_run_rejects_a_bad_push_to_before_training(monkeypatch, capsys, tmp_path, repo_id):
    _no_training(monkeypatch)
    rc = main(["run", RECIPE, "--push-to", repo_id, "--output_dir", str(tmp_path)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"invalid Hub repo_id {repo_id!r}" in err and "user/name" in err
    assert os.listdir(tmp_path) == []


def test_a_push_of_adapters_over_a_local_base_stops_before_training(monkeypatch, capsys, tmp_path):
    """An adapter naming a local base folder is refused by the push; the run used to train both stages first.
    With merge_lora true the run goes on to its stages."""
    import hf_mlcl.hub as hub

    _no_training(monkeypatch)
    monkeypatch.setattr(hub, "check_push_target", lambda repo_id, **kw: repo_id)
    base = tmp_path / "base"
    base.mkdir()
    lora = os.path.join(os.path.dirname(RECIPE), "tiny_llama_lora.yaml")
    argv = [
        "run",
        lora,
        "--model_name_or_path",
        str(base),
        "--push_to",
        "me/m",
        "--output_dir",
        str(tmp_path / "r"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sit on the local base model" in err[0] and "--merge_lora true" in err[0], err
    assert not (tmp_path / "r").exists()
    try:  # past this check: the empty base folder, or the stubbed training, stops it later
        main([*argv, "--merge_lora", "true"])
    except AssertionError:
        pass
    assert "sit on the local base model" not in capsys.readouterr().err


def test_run_prints_stage_headers_and_output_paths(monkeypatch, capsys, tmp_path):
    import hf_mlcl.training.stages as stages

    calls = []

    def contrastive(model_args, data_args, args, data=None, settings=None):
        calls.append("contrastive")
        return stages.StageResult(args.output_dir, {"train_loss": 1.0})

    def probe(model_args, data_args, args, encoder, loss, data=None, settings=None):
        calls.append(("probe", encoder, loss))
        trainer = types.SimpleNamespace(is_world_process_zero=lambda: True)
        return stages.StageResult(
            args.output_dir, {"test_micro_f1": 0.5, "test_macro_f1": 0.4}, trainer=trainer
        )

    monkeypatch.setattr(stages, "load_run_data", lambda data_args: None)  # no training: no data
    monkeypatch.setattr(stages, "run_contrastive_stage", contrastive)
    monkeypatch.setattr(stages, "run_probe_stage", probe)
    (tmp_path / ".tmp-k1ll3d-results.json").write_text('{"half')  # an earlier run killed writing results.json
    rc = main(["run", RECIPE, "--output_dir", str(tmp_path), "--no-plots"])
    assert rc == 0
    assert not (tmp_path / ".tmp-k1ll3d-results.json").exists()
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


@pytest.mark.parametrize("command", ["train", "run"])
@pytest.mark.parametrize("name", ["./no_such_model", "outputs/x/encoder", "/nonexistent/model"])
def test_missing_local_model_path_is_one_line_no_such_folder(monkeypatch, capsys, command, name):
    import hf_mlcl.hub.locate as locate

    _no_training(monkeypatch)
    monkeypatch.setattr(
        locate, "hub_reachable", lambda timeout=3.0: pytest.fail("a path must not ask the Hub")
    )
    rc = main([command, RECIPE, "--model_name_or_path", name])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert f"--model_name_or_path {name!r}: no such folder" in err


def test_missing_encoder_path_and_checkpoint_are_no_such_folder(monkeypatch, capsys):
    _no_training(monkeypatch)
    assert main(["probe", RECIPE, "--encoder-path", "runs/none/encoder"]) == 2
    assert "--encoder_path 'runs/none/encoder': no such folder" in capsys.readouterr().err
    assert main(["evaluate", "./no_classifier", RECIPE]) == 2
    assert "--checkpoint './no_classifier': no such folder" in capsys.readouterr().err


def test_unreachable_hub_is_one_line(monkeypatch, capsys):
    import hf_mlcl.hub.locate as locate

    _no_training(monkeypatch)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(locate, "_in_cache", lambda repo_id: False)
    monkeypatch.setattr(locate, "hub_reachable", lambda timeout=3.0: False)
    assert main(["train", RECIPE, "--model_name_or_path", "someone/some-model"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "the Hub is unreachable" in err and "'someone/some-model'" in err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train", RECIPE, "--model_name_or_path", "someone/some-model"]) == 2
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err


def test_probe_on_an_encoder_folder_with_its_tokenizer_needs_no_recipe_model(monkeypatch, tmp_path, capsys):
    """The recipe's model is not read when --encoder_path holds the encoder and its tokenizer: offline and
    uncached, the probe starts; an encoder folder without a tokenizer still needs the recipe's model."""
    import hf_mlcl.hub.locate as locate
    import hf_mlcl.training.stages as stages

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(locate, "_in_cache", lambda repo_id: False)
    started = []
    monkeypatch.setattr(stages, "run_probe_stage", lambda *a, **k: started.append(a[3]) or _Stopped.throw())
    encoder = tmp_path / "encoder"
    encoder.mkdir()
    (encoder / "config.json").write_text("{}")
    argv = ["probe", RECIPE, "--model_name_or_path", "someone/some-model", "--encoder_path", str(encoder)]
    assert main(argv) == 2
    assert "HF_HUB_OFFLINE=1" in capsys.readouterr().err and not started  # no tokenizer: the model is read
    (encoder / "tokenizer_config.json").write_text("{}")
    with pytest.raises(_Stopped):
        main([*argv, "--output_dir", str(tmp_path / "clf")])
    assert started == [str(encoder)]


class _Stopped(Exception):
    @classmethod
    def throw(cls):
        raise cls


def test_existing_folder_and_cached_or_reachable_hub_id_pass(monkeypatch, tmp_path):
    import hf_mlcl.hub.locate as locate

    locate.check_model_source(str(tmp_path))
    locate.check_model_source(None)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(locate, "_in_cache", lambda repo_id: False)
    monkeypatch.setattr(locate, "hub_reachable", lambda timeout=3.0: True)
    locate.check_model_source("someone/some-model")
    monkeypatch.setattr(locate, "_in_cache", lambda repo_id: True)
    monkeypatch.setattr(locate, "hub_reachable", lambda timeout=3.0: False)
    locate.check_model_source("someone/some-model")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="is a file"):
        locate.check_model_source(str(tmp_path / "weights.bin"))


def _fake_classifier(folder, **card):
    import json

    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "card_data.json").write_text(json.dumps({"kind": "classifier", **card}))
    return str(folder)


def _capture_evaluate(monkeypatch):
    import hf_mlcl.training.stages as stages

    seen = {}

    def fake(checkpoint, data_args, split="test", **kw):
        seen.update(checkpoint=checkpoint, data_args=data_args, split=split)
        return {f"{split}_micro_f1": 0.5}

    monkeypatch.setattr(stages, "evaluate_checkpoint", fake)
    return seen


def test_evaluate_without_recipe_uses_the_checkpoint_data_arguments(monkeypatch, tmp_path, capsys):
    options = {"num_labels": 6, "num_train": 64, "num_validation": 32, "num_test": 32}
    ckpt = _fake_classifier(
        tmp_path / "clf", dataset="synthetic", dataset_options=options, hyperparameters={"max_length": 112}
    )
    seen = _capture_evaluate(monkeypatch)
    assert main(["evaluate", ckpt, "--split", "validation"]) == 0
    data_args = seen["data_args"]
    assert (data_args.dataset, data_args.max_length, seen["split"]) == ("synthetic", 112, "validation")
    assert data_args.loader_options() == options
    assert "card_data.json" in capsys.readouterr().out
    # command-line keys still win; a user's --dataset drops the stored dataset options, not max_length
    assert main(["evaluate", ckpt, "--max_length", "64"]) == 0
    assert seen["data_args"].max_length == 64 and seen["data_args"].loader_options() == options
    assert main(["evaluate", ckpt, "--dataset", "goemotions"]) == 0
    assert seen["data_args"].dataset == "goemotions" and seen["data_args"].loader_options() == {}
    assert seen["data_args"].max_length == 112


def test_evaluate_with_a_recipe_uses_the_recipe(monkeypatch, tmp_path):
    ckpt = _fake_classifier(tmp_path / "clf", dataset="goemotions", hyperparameters={"max_length": 112})
    seen = _capture_evaluate(monkeypatch)
    assert main(["evaluate", ckpt, RECIPE]) == 0
    assert (seen["data_args"].dataset, seen["data_args"].max_length) == ("synthetic", 48)


def test_evaluate_on_an_encoder_folder_says_it_needs_a_classifier_and_writes_nothing(
    tmp_path, capsys, tiny_bert_config, bert_tokenizer
):
    import json

    from hf_mlcl.data import label_names, make_synthetic_corpus
    from hf_mlcl.modeling import MLCLEncoder

    options = {"num_labels": 6, "num_train": 32, "num_validation": 16, "num_test": 16}
    names = label_names(make_synthetic_corpus(**options))  # the encoder knows the data's labels
    enc = tmp_path / "encoder"
    MLCLEncoder.from_backbone(tiny_bert_config, id2label=names).save_pretrained(enc)
    bert_tokenizer.save_pretrained(enc)
    before = sorted(os.listdir(enc))
    capsys.readouterr()
    rc = main(
        [
            "evaluate",
            str(enc),
            "--dataset",
            "synthetic",
            "--dataset_options",
            json.dumps(options),
            "--split",
            "validation",
        ]
    )
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert f"{enc} is an encoder" in err and "needs a classifier" in err
    assert f"hf-mlcl probe RECIPE --encoder_path {enc}" in err
    assert sorted(os.listdir(enc)) == before  # no eval_*.json, no plots/
    # a folder without a model, or a classifier without its weights: one line, exit 2, not a traceback
    from hf_mlcl.modeling import MLCLForMultiLabelClassification

    (tmp_path / "empty").mkdir()
    clf = tmp_path / "no_weights"
    MLCLForMultiLabelClassification.from_encoder(
        MLCLEncoder.from_backbone(tiny_bert_config), id2label=names
    ).save_pretrained(clf)
    bert_tokenizer.save_pretrained(clf)
    os.remove(clf / "model.safetensors")
    data = ["--dataset", "synthetic", "--dataset_options", json.dumps(options), "--split", "validation"]
    from hf_mlcl.modeling.builders import require_a_model

    require_a_model("someone/classifier")  # a Hub id is left to its loader
    for folder, message in ((tmp_path / "empty", "holds no saved model"), (clf, "holds no complete model")):
        capsys.readouterr()
        assert main(["evaluate", str(folder), *data]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and message in err, err


def _help(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        main([*argv, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


@pytest.mark.parametrize(
    ("command", "stages"),
    [("train", ["contrastive"]), ("probe", ["probe"]), ("run", ["contrastive", "probe"]), ("evaluate", [])],
)
def test_subcommand_help_lists_the_overridable_keys(capsys, command, stages):
    from hf_mlcl.cli import HELP_MODEL_DATA_KEYS, HELP_TRAINING_KEYS
    from hf_mlcl.recipes import common_keys, stage_keys

    out = _help(capsys, command)
    assert set(HELP_MODEL_DATA_KEYS) <= common_keys()
    for key in (
        "model_name_or_path",
        "dataset",
        "dataset_options",
        "text_column",
        "label_column",
        "max_length",
    ):
        assert f"  --{key} " in out, key
    for stage in stages:
        assert set(HELP_TRAINING_KEYS[stage]) <= stage_keys(stage)
        assert f"{stage} stage training" in out
        for key in HELP_TRAINING_KEYS[stage]:
            assert f"  --{key} " in out, key
    if "contrastive" not in stages:
        assert "  --queue_size " not in out
    assert "All keys" in out and "docs/usage.md" in out
    assert ("transformers.TrainingArguments" in out) == bool(
        stages
    )  # evaluate takes model and data keys only
    assert max(len(line) for line in out.splitlines()) <= 100


def test_top_level_help_is_unchanged_by_the_key_list(capsys):
    out = _help(capsys)
    assert "COMMAND" in out and "recipe keys" not in out


@pytest.mark.parametrize(
    ("argv", "dest", "value"),
    [
        (["probe", "r.yaml", "--encoder-path", "E"], "encoder_path", "E"),
        (["probe", "r.yaml", "--encoder_path", "E"], "encoder_path", "E"),
        (["run", "r.yaml", "--push-to", "u/m"], "push_to", "u/m"),
        (["run", "r.yaml", "--push_to", "u/m"], "push_to", "u/m"),
        (["run", "r.yaml", "--no_plots"], "no_plots", True),
        (["evaluate", "c", "--output-dir", "D"], "output_dir", "D"),
        (["evaluate", "c", "--output_dir", "D"], "output_dir", "D"),
        (["evaluate", "c", "--batch_size", "8"], "batch_size", 8),
        (["push", "f", "--repo_id", "u/m"], "repo_id", "u/m"),
        (["demo", "--data_dir", "D"], "data_dir", "D"),
        (["demo", "--max-train-samples", "5"], "max_train_samples", 5),
        (["inspect", "aapd", "--queue_size", "64"], "queue_size", 64),
        (["--log_level", "error", "demo"], "log_level", "error"),
        (["--log-level", "error", "demo"], "log_level", "error"),
    ],
)
def test_both_flag_spellings_are_accepted(argv, dest, value):
    ns, rest = cli.build_parser().parse_known_args(argv)
    assert getattr(ns, dest) == value and rest == []


def test_help_documents_the_underscore_spelling(capsys):
    out = _help(capsys, "probe")
    assert "--encoder_path ENCODER_PATH" in out and "--encoder-path" not in out
    out = _help(capsys, "evaluate")
    assert "--output_dir OUTPUT_DIR" in out and "--output-dir" not in out and "--no_plots" in out


def test_overrides_accept_dashed_keys(monkeypatch, tmp_path):
    import hf_mlcl.training.stages as stages

    seen = {}

    def contrastive(model_args, data_args, args, data=None):
        seen.update(args=args, data_args=data_args)
        return stages.StageResult(args.output_dir, {})

    monkeypatch.setattr(stages, "run_contrastive_stage", contrastive)
    rc = main(
        [
            "train",
            RECIPE,
            "--output-dir",
            str(tmp_path / "enc"),
            "--learning-rate",
            "0.5",
            "--max_steps",
            "2",
            "--max-length",
            "16",
        ]
    )
    assert rc == 0
    args = seen["args"]
    assert (args.output_dir, args.learning_rate, args.max_steps) == (str(tmp_path / "enc"), 0.5, 2)
    assert seen["data_args"].max_length == 16


@pytest.fixture
def restore_logging():
    import logging

    import datasets
    import transformers

    root = logging.getLogger()
    saved = (
        root.level,
        transformers.utils.logging.get_verbosity(),
        datasets.utils.logging.get_verbosity(),
        transformers.utils.logging.is_progress_bar_enabled(),
        datasets.is_progress_bar_enabled(),
    )
    yield
    logging.captureWarnings(False)
    root.setLevel(saved[0])
    transformers.utils.logging.set_verbosity(saved[1])
    datasets.utils.logging.set_verbosity(saved[2])
    (
        transformers.utils.logging.enable_progress_bar
        if saved[3]
        else transformers.utils.logging.disable_progress_bar
    )()
    (datasets.enable_progress_bars if saved[4] else datasets.disable_progress_bars)()


@pytest.mark.usefixtures("restore_logging")
def test_log_level_routes_transformers_warnings_python_warnings_and_loading_bars(capsys):
    import logging
    import warnings

    import datasets
    import transformers

    cli.configure_logging("error")
    assert transformers.utils.logging.get_verbosity() == logging.ERROR
    assert datasets.utils.logging.get_verbosity() == logging.ERROR
    assert not transformers.utils.logging.is_progress_bar_enabled()  # the "Loading weights" bar
    assert not datasets.is_progress_bar_enabled()
    logging.getLogger().setLevel(logging.ERROR)  # basicConfig leaves pytest's root logger alone
    assert not logging.getLogger("transformers.trainer").isEnabledFor(logging.WARNING)  # pad-token warning
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        logging.captureWarnings(True)  # catch_warnings reset it: the CLI sets it once per process
        warnings.warn(
            "'pin_memory' argument is set as true but no accelerator is found", UserWarning, stacklevel=1
        )
    assert "pin_memory" not in capsys.readouterr().err
    cli.configure_logging("info")
    assert transformers.utils.logging.get_verbosity() == logging.INFO
    assert transformers.utils.logging.is_progress_bar_enabled() and datasets.is_progress_bar_enabled()


def test_log_level_error_leaves_stderr_empty_on_a_real_run(tmp_path):
    """At the default level this run prints transformers' PAD/BOS/EOS tokenizer warning and torch's
    pin_memory UserWarning (no GPU); --log_level error must silence both, and the stdout keeps the results."""
    import json
    import subprocess
    import sys

    tiny = json.dumps(
        {
            "num_labels": 4,
            "num_train": 32,
            "num_validation": 16,
            "num_test": 16,
            "min_words": 5,
            "max_words": 10,
        }
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_mlcl.cli",
            "--log_level",
            "error",
            "run",
            RECIPE,
            "--max_steps",
            "1",
            "--output_dir",
            str(tmp_path),
            "--no_plots",
            "--disable_tqdm",
            "true",
            "--dataset_options",
            tiny,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == ""
    assert "stage 2/2" in proc.stdout and "results:" in proc.stdout


def test_an_input_error_every_process_finds_is_printed_once(monkeypatch, capsys):
    """Under a multi-process launch every rank runs the same input checks: the main process of each node
    prints the line (node 1's main process is global rank 1, local rank 0), the others exit with the same
    status in silence; any other error is printed on every rank."""
    from hf_mlcl.training.preflight import InputError

    cases = (
        ("0", "0", InputError, True),
        ("1", "1", InputError, False),
        ("1", "0", InputError, True),
        ("1", "1", ValueError, True),
    )
    for rank, local_rank, error, printed in cases:

        def failing(ns, overrides, error=error):
            raise error("the train split has 9 rows, fewer than one batch of 32")

        monkeypatch.setitem(cli.COMMANDS, "train", failing)
        monkeypatch.setenv("RANK", rank)
        monkeypatch.setenv("LOCAL_RANK", local_rank)
        assert main(["train", RECIPE]) == 2
        err = capsys.readouterr().err
        assert (
            err == "hf-mlcl train: error: the train split has 9 rows, fewer than one batch of 32\n"
        ) is printed


@pytest.fixture
def no_saved_token(monkeypatch, tmp_path):
    """No HF_TOKEN and no token file: what a user who never ran `hf auth login` has."""
    import huggingface_hub.constants as constants

    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))


def _whoami(name="me", orgs=("lab",), role="write"):
    return lambda self, token=None: {
        "name": name,
        "orgs": [{"name": o} for o in orgs],
        "auth": {"accessToken": {"role": role}},
    }


@pytest.mark.usefixtures("no_saved_token")
def test_a_push_to_that_cannot_work_stops_in_one_line_before_training(monkeypatch, capsys, tmp_path):
    """--push_to is checked before any training: the Hub switched off, no token, no connection, a token the Hub
    refuses, a read-only token, a namespace the token cannot write to. No network call is made here: the
    connection and whoami are replaced, and each earlier check must stop before them."""
    import huggingface_hub

    import hf_mlcl.hub.locate as locate

    _no_training(monkeypatch)
    out = tmp_path / "run"

    def run_err(repo="you/model"):
        rc = main(["run", RECIPE, "--push_to", repo, "--output_dir", str(out)])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and len(err.splitlines()) == 1, err
        assert not out.exists()
        return err

    monkeypatch.setattr(
        locate, "hub_reachable", lambda timeout=3.0: pytest.fail("checked the network too early")
    )
    monkeypatch.setattr(
        huggingface_hub.HfApi, "whoami", lambda self, token=None: pytest.fail("whoami too early")
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "the Hub is switched off (HF_HUB_OFFLINE=1)" in run_err()
    monkeypatch.delenv("HF_HUB_OFFLINE")
    err = run_err()
    assert "cannot push to 'you/model': no Hugging Face token" in err and "`hf auth login`" in err
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.setattr(locate, "hub_reachable", lambda timeout=3.0: False)
    assert "the Hub is unreachable" in run_err()
    monkeypatch.setattr(locate, "hub_reachable", lambda timeout=3.0: True)

    def refused(self, token=None):
        from httpx2 import Request, Response
        from huggingface_hub.errors import HfHubHTTPError

        response = Response(401, request=Request("GET", "https://huggingface.co/api/whoami-v2"))
        raise HfHubHTTPError("401 Client Error: Unauthorized", response=response)

    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", refused)
    assert "the Hub refused the token (HfHubHTTPError)" in run_err()
    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", _whoami(role="read"))
    assert "the token is read-only" in run_err(repo="me/model")
    monkeypatch.setattr(huggingface_hub.HfApi, "whoami", _whoami())
    err = run_err(repo="you/model")
    assert "the token belongs to 'me', who cannot create repositories under 'you'" in err and "'lab'" in err
    for repo in ("me/model", "lab/model", "model"):  # a push that can work: training starts
        with pytest.raises(AssertionError, match="training started"):
            main(["run", RECIPE, "--push_to", repo, "--output_dir", str(out)])


@pytest.mark.usefixtures("no_saved_token")
def test_push_command_checks_the_folder_then_the_token(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert main(["push", str(tmp_path), "--repo_id", "me/model"]) == 2
    assert "has no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"w")
    (tmp_path / "README.md").write_text("card")
    assert main(["push", str(tmp_path), "--repo_id", "me/model"]) == 2
    assert "no Hugging Face token" in capsys.readouterr().err
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the push itself: no advice to train without --push_to
    assert main(["push", str(tmp_path), "--repo_id", "me/model"]) == 2
    err = capsys.readouterr().err
    assert "the Hub is switched off (HF_HUB_OFFLINE=1); unset it" in err and "--push_to" not in err, err


def test_a_recipe_for_another_dataset_runs_on_a_csv_given_with_dataset(tmp_path):
    """The tiny synthetic recipe's dataset_options ({num_labels: 10, ...}) belong to the synthetic corpus: a
    --dataset CSV on the command line replaces them (and data_dir / data_files) instead of reaching the CSV
    loader as unknown keywords."""
    import csv
    import json

    from hf_mlcl.recipes import load_recipe, parse_stage, split_overrides

    data = tmp_path / "my.csv"
    with open(data, "w", encoding="utf-8", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "labels"])
        for i in range(48):
            w.writerow([f"word{i % 7} word{i % 5} text", ["a", "b;c", "c"][i % 3]])
    recipe = load_recipe(RECIPE)
    recipe["data_dir"] = "data/synthetic"  # a registered dataset's folder must not be searched for the CSV
    ov = split_overrides(["--dataset", str(data)], ["contrastive"])
    _, data_args, _ = parse_stage(recipe, "contrastive", ov)
    assert data_args.loader_options() == {} and data_args.data_dir is None
    ov = split_overrides(["--dataset", "synthetic"], ["contrastive"])  # the same dataset keeps its options
    assert parse_stage(recipe, "contrastive", ov)[1].loader_options()["num_labels"] == 10
    out = tmp_path / "run"
    rc = main(
        [
            "run",
            RECIPE,
            "--dataset",
            str(data),
            "--output_dir",
            str(out),
            "--max_steps",
            "1",
            "--disable_tqdm",
            "true",
            "--no_plots",
        ]
    )
    assert rc == 0
    card = json.load(open(out / "classifier" / "card_data.json"))
    assert card["label_names"] == ["a", "b", "c"] and card["dataset_options"] == {}


def test_a_default_run_is_quiet_names_its_split_states_its_footprint_and_keeps_no_checkpoint(tmp_path):
    """At the default log level a tiny real run (checkpoints every step, save_total_limit 1) prints no
    library noise on stderr: no pin_memory warning (no GPU here), no PAD/BOS/EOS notice, no "mtime may not be
    reliable" notice. Its checkpoints are gone once each stage has finished unless asked for (here: the
    probe's), its safetensors follow the umask, and the run ends with the split its table reports and its
    size on disk."""
    import json
    import stat
    import subprocess
    import sys

    from hf_mlcl.files import folder_size, format_size

    tiny = json.dumps(
        {
            "num_labels": 4,
            "num_train": 64,
            "num_validation": 16,
            "num_test": 16,
            "min_words": 5,
            "max_words": 10,
        }
    )
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hf_mlcl.cli",
            "run",
            RECIPE,
            "--max_steps",
            "3",
            "--save_strategy",
            "steps",
            "--save_steps",
            "1",
            "--save_total_limit",
            "1",
            "--probe.keep_checkpoints",
            "true",
            "--output_dir",
            str(out),
            "--no_plots",
            "--disable_tqdm",
            "true",
            "--dataset_options",
            tiny,
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stderr.strip() == "", proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert "| run | split | micro_f1 | macro_f1 | p@1 | p@5 |" in lines and "| run | test |" in proc.stdout
    assert lines[-1] == f"{out}: {format_size(folder_size(str(out)))}"
    assert not [p for p in os.listdir(out / "encoder") if p.startswith("checkpoint-")]
    assert sorted(p for p in os.listdir(out / "classifier") if p.startswith("checkpoint-")) == [
        "checkpoint-3"
    ]
    umask = os.umask(0)
    os.umask(umask)
    for path in [*out.glob("*/model.safetensors"), *out.glob("classifier/checkpoint-3/*.safetensors")]:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask, path
    assert not [p for p in os.listdir(out) if p.startswith(".")]


def test_the_run_table_says_when_it_reports_validation():
    from hf_mlcl.evaluation.tables import format_table

    table = format_table(
        [{"run": "a", "validation_micro_f1": 0.5}, {"run": "b", "test_micro_f1": 0.25}],
        keys=("micro_f1",),
        show_split=True,
    )
    assert table.splitlines() == [
        "| run | split | micro_f1 |",
        "|---|---|---|",
        "| a | validation | 0.5000 |",
        "| b | test | 0.2500 |",
    ]


def test_probe_prints_its_metrics_and_footprint(tmp_path, capsys):
    import json

    tiny = json.dumps(
        {
            "num_labels": 4,
            "num_train": 48,
            "num_validation": 16,
            "num_test": 16,
            "min_words": 5,
            "max_words": 10,
        }
    )
    out = tmp_path / "clf"
    assert (
        main(
            [
                "probe",
                RECIPE,
                "--output_dir",
                str(out),
                "--max_steps",
                "1",
                "--disable_tqdm",
                "true",
                "--dataset_options",
                tiny,
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out.strip().splitlines()
    metrics = json.load(open(out / "metrics.json"))
    assert "| classifier | split | micro_f1 | macro_f1 | p@1 | p@5 |" in printed
    assert f"| clf | test | {metrics['test_micro_f1']:.4f} | {metrics['test_macro_f1']:.4f} |" in "\n".join(
        printed
    )
    assert printed[-1].startswith(f"{out}: ") and printed[-1].endswith("B")


def test_an_override_of_a_stage_the_command_does_not_run_is_an_error(tmp_path, capsys):
    """`train` runs stage 1 only: a probe option, prefixed or not, would do nothing, so it stops in one line that
    names the stage; a recipe without a classifier stage is not `run` (it would have gained a probe)."""
    out = str(tmp_path / "enc")
    for extra, message in (
        (["--probe.learning_rate", "0.5"], "--probe.learning_rate: an option of the probe stage, which this"),
        (
            ["--threshold", "0.3"],
            "--threshold: an option of the probe / joint stage, which this command does not",
        ),
    ):
        assert main(["train", RECIPE, "--output_dir", out, *extra]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0] and "(it runs contrastive)" in err[0], err
    for command in (["predict", str(tmp_path), "in.csv", "--output", "o.jsonl"], ["export", str(tmp_path)]):
        assert main([*command, "--learning_rate", "0.5"]) == 2  # no recipe keys: bad input, status 2
        assert "error: unexpected arguments ['--learning_rate', '0.5']" in capsys.readouterr().err
    assert main(["evaluate", str(tmp_path), "--learning_rate", "0.5"]) == 2  # evaluate trains nothing
    assert "--learning_rate: an option of the contrastive / probe / joint stage" in capsys.readouterr().err
    encoder_only = tmp_path / "encoder_only.yaml"
    encoder_only.write_text(f"_base_: {RECIPE}\nstages: [contrastive]\n", encoding="utf-8")
    assert main(["run", str(encoder_only), "--output_dir", str(tmp_path / "run")]) == 2
    assert "runs no classifier stage (stages: ['contrastive'])" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "run") and not os.path.exists(out)


@pytest.mark.parametrize(
    "flag, value, message",
    [
        ("--probe.learning_rate", "-1", "learning_rate must be a finite number >= 0; got -1.0"),
        ("--probe.learning_rate", "nan", "learning_rate must be a finite number >= 0; got nan"),
        ("--contrastive.adam_beta2", "1.0", "adam_beta2 must lie in [0, 1); got 1.0"),
        ("--probe.weight_decay", "-0.1", "weight_decay must be a finite number >= 0; got -0.1"),
    ],
)
def test_an_optimizer_value_torch_would_refuse_stops_before_the_first_stage(
    monkeypatch, capsys, tmp_path, flag, value, message
):
    """torch's optimizer refuses these only when a stage builds it: stage 2's, after stage 1 trained (and, with
    --overwrite_output_dir, replaced the saved encoder). They stop in one line before any stage."""
    _no_training(monkeypatch)
    rc = main(["run", RECIPE, "--output_dir", str(tmp_path), "--overwrite_output_dir", "true", flag, value])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_an_output_dir_where_a_file_stands_is_one_line(monkeypatch, capsys, tmp_path):
    _no_training(monkeypatch)
    afile = tmp_path / "afile"
    afile.write_text("mine")
    for argv in (
        ["run", RECIPE, "--output_dir", str(afile)],
        ["train", RECIPE, "--output_dir", str(afile / "encoder")],
        ["inspect", "synthetic", "--output_dir", str(afile)],
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"{afile} is a file, not a folder" in err[0], err
    assert afile.read_text() == "mine"


def test_a_run_folder_given_for_a_model_folder_names_the_model_folders_inside(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "encoder").mkdir(parents=True)
    (run / "encoder" / "config.json").write_text("{}")
    assert main(["export", str(run), "--to", "onnx"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"it is a run's folder: pass {run / 'encoder'}" in err[0], err
    assert main(["probe", RECIPE, "--encoder_path", str(run), "--output_dir", str(tmp_path / "p")]) == 2
    assert f"pass {run / 'encoder'}" in capsys.readouterr().err


def test_demo_refuses_an_empty_loss_name(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["demo", "--losses", ","])
    assert stop.value.code == 2 and "none empty; got ','" in capsys.readouterr().err


def test_run_and_demo_never_replace_each_others_results(monkeypatch, capsys, tmp_path):
    """A run's root holding a demo's table (a JSON list), or a results.json of the user's, and a demo folder holding
    a run, stop in one line before any work; a run's own results may be replaced with --overwrite_output_dir."""
    _no_training(monkeypatch)
    demo_folder, run_folder = tmp_path / "demo", tmp_path / "run"
    demo_folder.mkdir()
    (demo_folder / "results.json").write_text('[{"method": "sd"}]')
    assert main(["run", RECIPE, "--output_dir", str(demo_folder)]) == 2
    assert "not a run's results (a demo's table?)" in capsys.readouterr().err
    run_folder.mkdir()
    (run_folder / "results.json").write_text('{"probe": {}}')
    assert main(["run", RECIPE, "--output_dir", str(run_folder)]) == 2
    assert "holds another run's results" in capsys.readouterr().err
    (run_folder / "classifier").mkdir()
    assert main(["demo", "--output_dir", str(run_folder)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds a run's output (classifier), not a demo's" in err[0], err
    assert (demo_folder / "results.json").read_text() == '[{"method": "sd"}]'
    assert (run_folder / "results.json").read_text() == '{"probe": {}}'


def test_a_segmented_model_whose_length_is_no_multiple_of_its_segments_stops_before_any_work(
    capsys, tmp_path
):
    """head label_attention reads a text as chunk_size-token segments: a max_length that is no multiple of
    chunk_size failed at the first training step (the tokenizer refuses it); it stops before anything is written."""
    out = tmp_path / "run"
    argv = ["run", RECIPE, "--head", "label_attention", "--max_length", "48", "--output_dir", str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "max_length 48 is not a multiple of chunk_size 128" in err[0], err
    assert "--max_length 128" in err[0] and not out.exists()


def test_a_length_past_the_backbones_position_table_stops_before_any_work(capsys, tmp_path):
    """The tiny recipe's BERT has 64 positions: --max_length 10000 trained (short texts) and saved a length its
    classifier could not read (predict crashed on a long text)."""
    out = tmp_path / "run"
    assert main(["run", RECIPE, "--max_length", "10000", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "max_length 10000 is longer than the 64 positions the backbone (bert) has" in err[0]
    )
    assert not out.exists()


@pytest.mark.parametrize(
    "config, length, refused",
    [
        ({"model_type": "roberta", "max_position_embeddings": 514}, 512, False),
        ({"model_type": "roberta", "max_position_embeddings": 514}, 513, True),
        (
            {"model_type": "mpnet", "max_position_embeddings": 66},
            65,
            True,
        ),  # positions after the padding index
        (
            {"model_type": "deberta-v2", "max_position_embeddings": 512, "relative_attention": True},
            1024,
            False,
        ),
        ({"model_type": "llama", "max_position_embeddings": 64}, 128, False),  # rotary: no table to run past
        (
            {"model_type": "bert", "max_position_embeddings": 64, "position_embedding_type": "relative_key"},
            128,
            False,
        ),
    ],
)
def test_the_position_check_knows_which_families_have_a_learned_table(config, length, refused):
    from types import SimpleNamespace

    from hf_mlcl.training.preflight import InputError
    from hf_mlcl.training.stages import _check_positions

    model_args = SimpleNamespace(model_name_or_path=None, backbone_config=config, head="linear")
    check = lambda: _check_positions(model_args, SimpleNamespace(max_length=length), None)  # noqa: E731
    if refused:
        with pytest.raises(InputError, match=f"max_length {length} is longer than"):
            check()
    else:
        check()


@pytest.mark.parametrize(
    "error",
    [
        OSError(28, "No space left on device"),
        Exception("No space left on device (os error 28)"),  # safetensors' Rust io error
        RuntimeError(
            "[enforce fail at inline_container.cc:672] . unexpected pos 73792 vs 73680"
        ),  # torch's writer
    ],
)
def test_a_stage_save_on_a_full_device_is_one_line_naming_the_resume(monkeypatch, capsys, tmp_path, error):
    """A stage's final save failing for want of room: one line (it printed the writer's traceback, exit 1); the
    same error with room left on the folder's device is another failure and keeps its traceback."""
    import shutil
    from collections import namedtuple

    import hf_mlcl.training.stage_steps as steps

    def full(*args):
        raise error

    monkeypatch.setattr(steps, "_write_stage", full)
    run = ["run", RECIPE, "--max_steps", "1", "--no_plots", "--disable_tqdm", "true"]
    with pytest.raises(type(error)):  # room left: not a full device
        main([*run, "--output_dir", str(tmp_path / "roomy")])
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10, 10, 0))
    capsys.readouterr()
    assert main([*run, "--output_dir", str(tmp_path / "full")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no space left on the device while saving" in err[0], err
    assert "--resume_from_checkpoint true" in err[0]


def test_disk_full_needs_a_failed_write_and_no_room_on_the_folders_device(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from hf_mlcl.files import disk_full

    nospace = OSError(28, "No space left on device")  # also a full /dev/shm, an inotify limit
    assert not disk_full(nospace, str(tmp_path))  # room left on the folder's device: another device's
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10, 10, 0))
    chained = RuntimeError("writing failed")
    chained.__cause__ = nospace
    assert disk_full(nospace, str(tmp_path)) and disk_full(chained, str(tmp_path))
    assert not disk_full(OSError(2, "No such file"), str(tmp_path)) and not disk_full(
        ValueError("bad"), str(tmp_path)
    )


def test_a_demo_rerun_with_other_losses_names_the_earlier_demos_method_folders(monkeypatch, capsys, tmp_path):
    """A demo into an earlier demo's folder rewrites its own methods' folders; the earlier demo's other methods
    stay and are named before any work (the table would not list them)."""
    import hf_mlcl.demo as demo

    for method in ("all", "sd", "bce"):
        (tmp_path / method / "encoder").mkdir(parents=True)
    (tmp_path / "plots").mkdir()
    (tmp_path / "results.json").write_text('[{"method": "sd"}]')

    def stop(request):
        raise RuntimeError("planned")

    monkeypatch.setattr(demo, "_plan", stop)
    with pytest.raises(RuntimeError, match="planned"):
        demo.run_demo(output_dir=str(tmp_path), losses=["sd", "mulsupcon"])
    out = capsys.readouterr().out
    assert f"note: {tmp_path} keeps all from an earlier demo" in out, out
    with pytest.raises(RuntimeError, match="planned"):
        demo.run_demo(output_dir=str(tmp_path), losses=["sd", "all"])
    assert "earlier demo" not in capsys.readouterr().out
    assert (tmp_path / "all" / "encoder").is_dir()  # nothing removed


@pytest.mark.parametrize("module", ["hf_mlcl", "hf_mlcl.cli"])
def test_python_dash_m_exits_with_the_commands_status(module, tmp_path):
    """`python -m hf_mlcl` is the console script: a failed command exits 2, so `... && next step` stops."""
    import subprocess
    import sys

    missing = str(tmp_path / "no_such_recipe.yaml")
    done = subprocess.run([sys.executable, "-m", module, "run", missing], capture_output=True, text=True)
    assert done.returncode == 2, (done.returncode, done.stderr[-500:])
    assert "no_such_recipe.yaml" in done.stderr


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--probe.loss", "focal", "--probe.loss_kwargs", '{"gama": 2}'],
            "cannot build loss 'focal' with ['gama']",
        ),
        (["--contrastive.loss_kwargs", '{"tau": 2}'], "loss_kwargs: cannot build loss"),
    ],
)
def test_a_loss_keyword_no_loss_takes_stops_before_the_first_stage(
    monkeypatch, capsys, tmp_path, flags, message
):
    """The probe built its loss only in stage 2, after stage 1 trained and saved the encoder: the keywords of
    each stage's losses are checked with the other options, before any stage."""
    _no_training(monkeypatch)
    rc = main(["run", RECIPE, "--output_dir", str(tmp_path), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_a_model_argument_given_to_one_stage_says_where_it_belongs(capsys, tmp_path):
    assert main(["run", RECIPE, "--output_dir", str(tmp_path), "--probe.head", "native"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'head' in --probe.* is a model or data argument" in err[0], err
    assert "--head, without a stage prefix" in err[0]


@pytest.mark.parametrize(
    "argv, flag",
    [
        (["inspect", "synthetic", "--batches", "0"], "--batches"),
        (["inspect", "synthetic", "--batch_size", "0"], "--batch_size"),
        (["demo", "--epochs", "0"], "--epochs"),
        (["demo", "--epochs", "nan"], "--epochs"),
    ],
)
def test_demo_and_inspect_name_their_own_option_for_a_bad_number(capsys, argv, flag):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    err = capsys.readouterr().err
    assert stop.value.code == 2 and f"argument {flag}" in err and "expected a positive" in err, err


def test_a_model_folder_is_no_run_folder_and_a_probe_never_replaces_its_encoder(
    monkeypatch, capsys, tmp_path
):
    """``run --output_dir`` naming a saved model, and ``probe --output_dir`` naming the encoder it probes (even
    with --overwrite_output_dir), stop in one line before any work; the model's files stay."""
    _no_training(monkeypatch)
    model = tmp_path / "encoder"
    model.mkdir()
    (model / "config.json").write_text("{}")
    assert main(["run", RECIPE, "--output_dir", str(model)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--output_dir {model} holds a saved model" in err[0], err
    for extra, message in (
        ([], "already holds a run"),
        (["--overwrite_output_dir", "true"], "is the encoder being probed: the classifier would replace it"),
    ):
        argv = ["probe", RECIPE, "--encoder_path", str(model), "--output_dir", str(model) + "/", *extra]
        assert main(argv) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
    assert sorted(p.name for p in model.iterdir()) == ["config.json"]
    assert (model / "config.json").read_text() == "{}"


def test_a_run_inside_its_dataset_folder_stops_before_any_work(monkeypatch, capsys, tmp_path):
    """``--output_dir`` inside the ``--dataset`` folder (whose next load would read the run's JSON files as data)
    stops in one line for run, train and probe; the folder is left as it was."""
    _no_training(monkeypatch)
    data = tmp_path / "my_data"
    data.mkdir()
    (data / "train.csv").write_text("text,labels\ngoal,sports\nvote,politics\n")
    for command in ("run", "train", "probe"):
        argv = [command, RECIPE, "--dataset", str(data), "--output_dir", str(data / "runs" / command)]
        assert main(argv) == 2, command
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "lies inside the dataset folder" in err[0], (command, err)
    assert sorted(p.name for p in data.iterdir()) == ["train.csv"]
