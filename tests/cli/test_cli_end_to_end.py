"""`hf-mlcl` end to end on the synthetic corpus with a tiny random BERT: run (both stages + evaluation +
cards), evaluate, push (mocked Hub), the demo with tiny sizes (its BCE baseline's budget included), typo
errors, and `python -m hf_mlcl.cli`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hf_mlcl.cli import main

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
DEMO_DATA = {
    "num_labels": 6,
    "num_train": 96,
    "num_validation": 32,
    "num_test": 32,
    "min_words": 8,
    "max_words": 20,
}
TINY_DATA = json.dumps(
    {"num_labels": 6, "num_train": 64, "num_validation": 32, "num_test": 32, "min_words": 8, "max_words": 20}
)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("run"))
    rc = main(
        [
            "run",
            RECIPE,
            "--output_dir",
            out,
            "--max_steps",
            "3",
            "--dataset_options",
            TINY_DATA,
            "--probe.learning_rate",
            "5.0e-2",
            "--disable_tqdm",
            "true",
        ]
    )
    assert rc == 0
    return out


def test_run_writes_both_stages_cards_metrics_and_plots(run_dir):
    enc, clf = os.path.join(run_dir, "encoder"), os.path.join(run_dir, "classifier")
    for folder in (enc, clf):
        for name in (
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "README.md",
            "card_data.json",
            "metrics.json",
        ):
            assert os.path.isfile(os.path.join(folder, name)), (folder, name)
    assert os.path.isfile(os.path.join(clf, "plots", "f1_vs_frequency_test.png"))
    results = json.load(open(os.path.join(run_dir, "results.json")))
    assert set(results) == {"contrastive", "probe"}
    assert 0.0 <= results["probe"]["test_micro_f1"] <= 1.0
    # the card carries what the run measured and the overrides that were applied
    enc_card = json.load(open(os.path.join(enc, "card_data.json")))
    clf_card = json.load(open(os.path.join(clf, "card_data.json")))
    assert enc_card["loss"] == "similarity_dissimilarity" and enc_card["hyperparameters"]["max_steps"] == 3
    assert clf_card["contrastive_loss"] == "similarity_dissimilarity" and clf_card["encoder_path"] == enc
    assert clf_card["hyperparameters"]["learning_rate"] == 5e-2 and clf_card["num_labels"] == 6
    assert clf_card["metrics"]["test_micro_f1"] == pytest.approx(results["probe"]["test_micro_f1"])
    readme = open(os.path.join(clf, "README.md")).read()
    assert "model-index" in readme and "arXiv:2410.13439" in readme
    # eval_test.json (written by the evaluation step) agrees with the probe's own test metrics
    evaluated = json.load(open(os.path.join(clf, "eval_test.json")))
    assert evaluated["test_micro_f1"] == pytest.approx(results["probe"]["test_micro_f1"], abs=1e-6)
    # every tokenizer the run saved names a class transformers 4.x loads too (not 5.x's "TokenizersBackend")
    saved = [d for d, _, files in os.walk(run_dir) if "tokenizer_config.json" in files]
    assert {enc, clf} <= set(saved)
    for folder in saved:
        assert json.load(open(os.path.join(folder, "tokenizer_config.json")))["tokenizer_class"] == (
            "PreTrainedTokenizerFast"
        ), folder


def test_classifier_loads_in_sentence_transformers_without_remote_code(run_dir):
    from sentence_transformers import SentenceTransformer

    clf = os.path.join(run_dir, "classifier")
    assert not os.path.exists(os.path.join(clf, "modeling_mlcl.py"))
    probs = SentenceTransformer(clf, device="cpu").encode(["the patient was admitted with chest pain"])
    assert probs.shape == (1, 6) and ((probs >= 0.0) & (probs <= 1.0)).all()
    settings = json.load(open(os.path.join(clf, "mlcl_config.json")))
    assert len(settings["id2label"]) == 6 and settings["decision_threshold"] is not None


def test_evaluate_command_on_the_validation_split(run_dir, tmp_path, capsys):
    rc = main(
        [
            "evaluate",
            os.path.join(run_dir, "classifier"),
            RECIPE,
            "--split",
            "validation",
            "--dataset_options",
            TINY_DATA,
            "--output-dir",
            str(tmp_path),
        ]
    )
    assert rc == 0
    metrics = json.load(open(tmp_path / "eval_validation.json"))
    assert {"validation_micro_f1", "validation_macro_f1", "validation_p@1"} <= set(metrics)
    assert (tmp_path / "plots" / "f1_vs_frequency_validation.png").is_file()
    assert "| classifier |" in capsys.readouterr().out


def test_evaluate_without_a_recipe_reads_the_data_arguments_from_the_checkpoint(run_dir, tmp_path):
    # the run used TINY_DATA (6 labels), not the recipe's 10-label corpus: the card says so
    rc = main(["evaluate", os.path.join(run_dir, "classifier"), "--output-dir", str(tmp_path), "--no-plots"])
    assert rc == 0
    metrics = json.load(open(tmp_path / "eval_test.json"))
    results = json.load(open(os.path.join(run_dir, "results.json")))
    assert metrics["test_micro_f1"] == pytest.approx(results["probe"]["test_micro_f1"], abs=1e-6)


def test_evaluate_refuses_a_different_label_space(run_dir, capsys, tmp_path):
    other = json.dumps({**json.loads(TINY_DATA), "num_labels": 7})
    rc = main(
        [
            "evaluate",
            os.path.join(run_dir, "classifier"),
            RECIPE,
            "--dataset_options",
            other,
            "--no-plots",
            "--output_dir",
            str(tmp_path),
        ]
    )
    assert rc == 2 and "labels differ" in capsys.readouterr().err


def test_evaluate_on_other_data_keeps_the_runs_own_scores_unless_told_where(run_dir, capsys, tmp_path):
    """The classifier's folder holds the scores of its own data: evaluating other data there would replace them
    (and push would publish them), so that needs --output_dir; its own data may be scored there again."""
    clf = os.path.join(run_dir, "classifier")
    own = open(os.path.join(clf, "eval_test.json")).read()
    other = json.dumps({**json.loads(TINY_DATA), "seed": 5})
    evaluate = ["evaluate", clf, RECIPE, "--dataset_options", other, "--no-plots"]
    assert main(evaluate) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "these differ (the test split's rows); pass another --output_dir" in err[0], err
    assert open(os.path.join(clf, "eval_test.json")).read() == own
    assert main([*evaluate, "--output_dir", clf + os.sep]) == 2  # the folder itself, named as --output_dir
    assert "these differ" in capsys.readouterr().err
    assert open(os.path.join(clf, "eval_test.json")).read() == own
    assert main([*evaluate, "--output_dir", str(tmp_path)]) == 0
    assert json.load(open(tmp_path / "eval_test.json")) != json.loads(own)
    assert main(["evaluate", clf, RECIPE, "--dataset_options", TINY_DATA, "--no-plots"]) == 0  # its own data
    assert json.loads(open(os.path.join(clf, "eval_test.json")).read()) == json.loads(own)
    assert main(["evaluate", clf, "--no-plots"]) == 0  # its own data, read from its card
    capped = [
        "evaluate",
        clf,
        RECIPE,
        "--dataset_options",
        TINY_DATA,
        "--max_train_samples",
        "16",
        "--no-plots",
    ]
    assert main(capped) == 0  # the same test rows: a cap on train changes no score
    assert (
        main(["evaluate", clf, RECIPE, "--dataset_options", TINY_DATA, "--max_length", "8", "--no-plots"])
        == 2
    )
    assert "max_length" in capsys.readouterr().err
    assert json.loads(open(os.path.join(clf, "eval_test.json")).read()) == json.loads(own)


def test_push_command_with_a_mocked_hub(run_dir, monkeypatch, capsys):
    import huggingface_hub

    import hf_mlcl.hub.locate as locate

    calls = {}

    class FakeApi:
        def __init__(self, token=None):
            calls["token"] = token

        def whoami(self, token=None):
            return {"name": "me", "orgs": [], "auth": {"accessToken": {"role": "write"}}}

        def create_repo(self, **kw):
            calls["create_repo"] = kw

        def create_branch(self, **kw):
            calls["create_branch"] = kw

        def create_commit(self, **kw):
            calls["create_commit"] = kw
            return "https://huggingface.co/me/tiny/commit/abc"

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # the push checks: a token, the Hub reachable
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    monkeypatch.setattr(locate, "hub_reachable", lambda timeout=3.0: True)
    clf = os.path.join(run_dir, "classifier")
    assert main(["push", clf, "--repo-id", "me/tiny", "--private"]) == 0
    assert calls["create_repo"]["repo_id"] == "me/tiny" and calls["create_repo"]["private"] is True
    operations = {op.path_in_repo: op for op in calls["create_commit"]["operations"]}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "README.md",
        "metrics.json",
        "modules.json",
        "mlcl_config.json",
        "2_Dense/model.safetensors",
        "plots/f1_vs_frequency_test.png",
    } <= set(operations)
    assert "training_args.bin" not in operations
    assert (
        b'SentenceTransformer("me/tiny")' in operations["README.md"].path_or_fileobj
    )  # the card names the repo it goes to
    assert "pushed" in capsys.readouterr().out
    assert "create_branch" not in calls and calls["create_commit"]["revision"] is None
    # a branch that does not exist yet is created before the commit (create_commit alone would refuse it)
    assert main(["push", clf, "--repo_id", "me/tiny", "--revision", "v2", "--commit_message", "second"]) == 0
    assert calls["create_branch"] == {
        "repo_id": "me/tiny",
        "branch": "v2",
        "repo_type": "model",
        "exist_ok": True,
        "token": None,
    }
    assert calls["create_commit"]["revision"] == "v2" and calls["create_commit"]["commit_message"] == "second"


def test_probe_command_reuses_the_recipes_encoder(run_dir, tmp_path):
    rc = main(
        [
            "probe",
            RECIPE,
            "--encoder-path",
            os.path.join(run_dir, "encoder"),
            "--output_dir",
            str(tmp_path),
            "--max_steps",
            "2",
            "--dataset_options",
            TINY_DATA,
            "--disable_tqdm",
            "true",
        ]
    )
    assert rc == 0
    card = json.load(open(tmp_path / "card_data.json"))
    assert card["kind"] == "classifier" and card["contrastive_loss"] == "similarity_dissimilarity"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["train", RECIPE, "--lerning_rate", "1e-3"], "unknown key 'lerning_rate'"),
        (["train", RECIPE, "--probe.queue_size", "3"], "unknown key 'queue_size'"),
        (["train", "does/not/exist.yaml"], "recipe file not found"),
        (["demo", "--losses", "nope"], "nope"),
        (["demo", "--losses", "zlpr"], "'zlpr' is a supervised loss"),
        (["demo", "--losses", "sd,similarity_dissimilarity"], "names one loss twice"),  # trained it twice
        (["demo", "--model", "no/such-model-here"], "--model 'no/such-model-here'"),
    ],
)
def test_bad_input_exits_2_with_the_reason(argv, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a demo's default output folder goes there, and must stay empty
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert os.listdir(tmp_path) == []


def test_a_bad_argument_is_one_line_naming_help(capsys):
    """argparse printed its usage block before the error: seven lines for ``demo --epochs 0``."""
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--epochs", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and len(err) == 1, err
    assert (
        err[0]
        == "hf-mlcl demo: error: argument --epochs: expected a positive number; got '0' (see hf-mlcl demo --help)"
    )


def test_module_entry_point_for_accelerate_launch(capsys):
    """`accelerate launch -m hf_mlcl.cli ...` runs the module: it must parse and dispatch as the script."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = subprocess.run(
        [sys.executable, "-m", "hf_mlcl.cli", "run", "--help"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
    )
    assert out.returncode == 0 and "--push_to" in out.stdout
    from hf_mlcl.cli import main  # the same parser in this process: an unknown command is a usage error

    with pytest.raises(SystemExit) as bad:
        main(["nonsense"])
    assert bad.value.code == 2 and "invalid choice" in capsys.readouterr().err


def test_demo_with_tiny_sizes(tmp_path, capsys):
    from hf_mlcl.demo import run_demo

    result = run_demo(
        output_dir=str(tmp_path),
        losses=["sd"],
        epochs=1,
        probe_epochs=1,
        max_length=32,
        synthetic_options=DEMO_DATA,
    )
    assert [r["method"] for r in result["rows"]] == ["sd", "bce (fine-tuned)"]
    for name in (
        "results.md",
        "results.json",
        "plots/f1_vs_frequency.png",
        "plots/embeddings_sd.png",
        "tokenizer/tokenizer.json",
        "sd/encoder/README.md",
        "sd/classifier/README.md",
        "bce/classifier/README.md",
    ):
        assert (tmp_path / name).is_file(), name
    printed = capsys.readouterr().out
    assert "| method | micro_f1 | macro_f1 | p@1 | p@5 | silhouette |" in printed and "| sd |" in printed
    # a tiny random BERT: the BCE baseline trains at the demo's rate for stage 1's epochs (logistic probe)
    assert result["baseline"] == {"learning_rate": 1e-3, "num_train_epochs": 1.0}
    assert "baseline: BCE fine-tuning, 1 epochs at lr 0.001" in printed
    _assert_trained_as_claimed(tmp_path / "bce" / "classifier", 1e-3, 1.0)


def _assert_trained_as_claimed(folder, learning_rate: float, epochs: float) -> int:
    """The BCE classifier in ``folder`` trained at ``learning_rate`` for ``epochs``; returns its steps."""
    card = json.load(open(folder / "card_data.json"))["hyperparameters"]
    assert card["learning_rate"] == learning_rate and card["num_train_epochs"] == epochs
    state = json.load(open(folder / "trainer_state.json"))
    assert state["epoch"] == epochs
    assert not list(folder.glob("checkpoint-*"))  # the best epoch's model is saved, its checkpoints removed
    return state["global_step"]


@pytest.mark.parametrize(
    "dataset, pretrained, epochs, probe, probe_epochs, want",
    [
        ("goemotions", True, 1.0, "logistic", 3.0, (1e-4, 5.0)),  # README's GoEmotions demo
        ("goemotions", True, 1.0, "linear", 3.0, (1e-4, 5.0)),
        ("reuters21578", True, 1.0, "logistic", 3.0, (2e-4, 5.0)),
        ("synthetic", True, 4.0, "linear", 3.0, (1e-4, 7.0)),  # never fewer than stage 1 + probe epochs
        ("synthetic", False, 10.0, "logistic", 5.0, (1e-3, 10.0)),
        ("synthetic", False, 10.0, "linear", 5.0, (1e-3, 15.0)),
    ],
)
def test_demo_bce_budget_is_the_studys(dataset, pretrained, epochs, probe, probe_epochs, want):
    """docs/RESULTS.md's BCE fine-tune of MiniLM: lr 1e-4 (GoEmotions) / 2e-4 (Reuters), up to 5 epochs."""
    from hf_mlcl.demo import _bce_budget

    assert _bce_budget(dataset, pretrained, 1e-3, epochs, probe, probe_epochs) == want


def test_demo_bce_baseline_on_a_pretrained_encoder(tmp_path, capsys, tiny_bert_config, bert_tokenizer):
    """With ``--model`` the BCE row trains as the demo says: the study's rate, at least as many epochs and
    steps as a contrastive row's stage 1 + linear probe."""
    from transformers import BertModel

    from hf_mlcl.demo import STUDY_BCE_EPOCHS, STUDY_BCE_LR, run_demo

    model = tmp_path / "pretrained"
    BertModel(tiny_bert_config).save_pretrained(model)
    bert_tokenizer.save_pretrained(model)
    out = tmp_path / "demo"
    result = run_demo(
        output_dir=str(out),
        model=str(model),
        losses=["sd"],
        epochs=1,
        probe="linear",
        probe_epochs=1,
        max_length=32,
        synthetic_options=DEMO_DATA,
    )
    lr, epochs = STUDY_BCE_LR["goemotions"], STUDY_BCE_EPOCHS
    assert (lr, epochs) == (1e-4, 5.0)
    assert result["baseline"] == {"learning_rate": lr, "num_train_epochs": epochs}
    claim = "baseline: BCE fine-tuning, 5 epochs at lr 0.0001 (docs/RESULTS.md's BCE recipe)"
    printed = capsys.readouterr().out
    assert claim in printed and claim in (out / "results.md").read_text()
    # 96 rows at batch 32 for one epoch: the demo says its rows compare barely trained models
    assert "warning: stage 1 takes 3 optimizer step(s) (96 rows, batch 32, 1 epochs)" in printed
    bce_steps = _assert_trained_as_claimed(out / "bce" / "classifier", lr, epochs)
    sd_steps = sum(
        json.load(open(out / "sd" / stage / "trainer_state.json"))["global_step"]
        for stage in ("encoder", "classifier")
    )
    assert bce_steps >= sd_steps > 0
