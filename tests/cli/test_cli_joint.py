"""`hf-mlcl run` of a joint-objective recipe (stages: [joint]): one classifier trained with (1 - w) * BCE +
w * contrastive, its metrics and card naming w and both losses, loaded natively where hf_mlcl is absent."""

from __future__ import annotations

import json
import os

import pytest
from _outside import run_outside

from hf_mlcl.cli import main
from hf_mlcl.recipes import RecipeError, validate_recipe

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TINY = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
RECIPE = f"""_base_: {TINY}
stages: [joint]
head: native
dataset_options: {{num_labels: 6, num_train: 64, num_validation: 24, num_test: 24, min_words: 8, max_words: 20}}
joint:
  loss: mulsupcon
  contrastive_weight: 0.4
  supervised_loss: bce
  learning_rate: 5.0e-3
  max_steps: 4
  per_device_train_batch_size: 16
  per_device_eval_batch_size: 16
  save_strategy: "no"
  logging_steps: 1
  report_to: none
"""


@pytest.fixture(scope="module")
def joint_run(tmp_path_factory):
    import contextlib
    import io

    work = tmp_path_factory.mktemp("joint")
    recipe = work / "joint.yaml"
    recipe.write_text(RECIPE, encoding="utf-8")
    out = str(work / "out")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(["run", str(recipe), "--output_dir", out, "--disable_tqdm", "true"]) == 0
    header = "stage 1/1: joint fine-tune of encoder and head ((1 - w) bce + w mulsupcon, w = 0.4)"
    assert header in printed.getvalue()
    return work, out


def test_the_joint_stage_writes_one_classifier_with_both_losses_on_record(joint_run):
    _, out = joint_run
    clf = os.path.join(out, "classifier")
    assert not os.path.exists(os.path.join(out, "encoder"))
    results = json.load(open(os.path.join(out, "results.json")))
    assert set(results) == {"joint"}
    metrics = json.load(open(os.path.join(clf, "metrics.json")))
    assert metrics["contrastive_weight"] == 0.4 and metrics["contrastive_loss"] == "mulsupcon"
    assert metrics["loss"] == "bce" and 0.0 <= metrics["test_micro_f1"] <= 1.0
    state = json.load(open(os.path.join(clf, "trainer_state.json")))
    logged = [h for h in state["log_history"] if "loss" in h]
    assert len(logged) == 4 and all(h["loss_supervised"] > 0 and h["loss_contrastive"] > 0 for h in logged)
    card = json.load(open(os.path.join(clf, "card_data.json")))
    assert card["probe"] == "joint" and card["loss"] == "bce" and card["contrastive_loss"] == "mulsupcon"
    assert card["hyperparameters"]["contrastive_weight"] == 0.4
    readme = open(os.path.join(clf, "README.md"), encoding="utf-8").read()
    assert "joint objective" in readme and "w = 0.4" in readme
    assert os.path.isfile(os.path.join(clf, "eval_test.json"))


def test_the_joint_classifier_loads_natively_without_hf_mlcl(joint_run, tmp_path):
    _, out = joint_run
    from transformers import AutoTokenizer

    from hf_mlcl.modeling import MLCLForMultiLabelClassification

    clf = os.path.join(out, "classifier")
    texts = ["a short document", "another one with more words in it"]
    tok = AutoTokenizer.from_pretrained(clf)
    model = MLCLForMultiLabelClassification.from_pretrained(clf).eval()
    import torch

    with torch.no_grad():
        ours = model(**tok(texts, padding=True, return_tensors="pt")).logits.tolist()
    script = """
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
tok = AutoTokenizer.from_pretrained(SPEC["folder"])
model = AutoModelForSequenceClassification.from_pretrained(SPEC["folder"]).eval()
with torch.no_grad():
    REPORT["logits"] = model(**tok(SPEC["texts"], padding=True, return_tensors="pt")).logits.tolist()
REPORT["class"] = type(model).__name__
"""
    report = run_outside(tmp_path, script, {"folder": clf, "texts": texts})
    assert report["class"] == "BertForSequenceClassification"
    assert torch.allclose(torch.tensor(report["logits"]), torch.tensor(ours), atol=1e-5)


def test_a_recipe_with_two_classifier_stages_stops_in_one_line():
    with pytest.raises(RecipeError, match="two classifiers into one folder"):
        validate_recipe({"stages": ["contrastive", "probe", "joint"]}, "r.yaml")


def test_the_joint_stage_fine_tunes_stage_1s_encoder(tmp_path):
    """stages: [contrastive, joint]: the joint fine-tune starts from the encoder stage 1 saved."""
    recipe = tmp_path / "two.yaml"
    body = RECIPE.replace("stages: [joint]", "stages: [contrastive, joint]").replace(
        "max_steps: 4", "max_steps: 2"
    )
    stage1 = "contrastive:\n  max_steps: 2\n  per_device_train_batch_size: 16\n  save_strategy: 'no'\n  report_to: none\n"
    recipe.write_text(body + stage1, encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(recipe), "--output_dir", str(out), "--disable_tqdm", "true"]) == 0
    assert set(json.load(open(out / "results.json"))) == {"contrastive", "joint"}
    card = json.load(open(out / "classifier" / "card_data.json"))
    assert card["encoder_path"] == str(out / "encoder") and card["probe"] == "joint"
    assert os.path.isfile(out / "encoder" / "metrics.json")


@pytest.mark.parametrize(
    "flag, value", [("--joint.supervised_loss_kwargs", '{"gama": 2}'), ("--joint.loss_kwargs", '{"tau": 1}')]
)
def test_a_joint_loss_keyword_no_loss_takes_stops_before_training(tmp_path, capsys, flag, value):
    recipe = tmp_path / "joint.yaml"
    recipe.write_text(RECIPE.replace("supervised_loss: bce", "supervised_loss: focal"), encoding="utf-8")
    out = tmp_path / "out"
    assert main(["run", str(recipe), "--output_dir", str(out), flag, value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cannot build" in err[0] and ("gama" in err[0] or "tau" in err[0]), err
    assert not out.exists() or os.listdir(out) == []
