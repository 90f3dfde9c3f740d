"""The data-scale study (studies/scale.py): the epoch rule, one seeded training subset shared by every method
and seed, a cell folder per size, a finished cell skipped, choices per size, and run_all.sh's scale queue."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

STUDIES = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(STUDIES)
sys.path.insert(0, STUDIES)
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(STUDIES, f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_epoch_rule_keeps_the_full_recipes_steps_and_evaluates_evenly_over_them():
    scale = _module("scale")
    rule = scale.scaled_epochs
    assert rule(5, 6993, None) == 5 and rule(5, 6993, 6993) == 5  # the full size keeps its recipe
    assert rule(1, 6993, 2000) == 3  # 6,993 / 2,000 = 3.5 epochs of the same steps, rounded
    assert rule(1, 43410, 4000) == 11 and rule(5, 6993, 500) == 70 and rule(5, 43410, 1000) == 217
    assert rule(1, 6993, 5000) == 1  # 1.4 rounds to 1: never below the full recipe's epochs
    assert rule(5, 6993, 4000) == 9 and rule(5, 100, 95) == 5
    with pytest.raises(ValueError, match="positive number of rows"):
        rule(1, 100, 0)
    # 70 epochs of 16 steps (500 rows, batch 32, the last one partial): 1,120 steps, 10 evaluations
    assert scale.eval_every(70, 500, 32) == 112 and scale.eval_every(17, 2000, 32) == 108
    assert scale.eval_every(1, 5, 32) == 1 and scale.eval_every(3, 64, 32, evaluations=3) == 2
    # SetFit: as many steps of 64 texts as stage 1 at that size
    assert scale.setfit_steps("reuters21578", None) == 6993 // 64
    assert scale.setfit_steps("reuters21578", 500) == 14 * (500 // 64)
    assert scale.setfit_steps("goemotions_full", 4000) == 11 * (4000 // 64)


def test_cell_names_and_sizes():
    scale = _module("scale")
    assert scale.cell_name("bce_finetune-lr1e-4", 500) == "bce_finetune-lr1e-4-n500"
    assert scale.cell_name("sd_logistic", None) == "sd_logistic"
    assert scale.split_cell("bce_finetune-lr1e-4-n500") == ("bce_finetune-lr1e-4", 500)
    assert scale.split_cell("bce_finetune-lr1e-4") == ("bce_finetune-lr1e-4", None)
    assert scale.split_cell("sd_linear-positives") == ("sd_linear-positives", None)
    assert (
        scale.check_size("reuters21578", 2000) == 2000 and scale.check_size("goemotions_full", None) is None
    )
    for bad in (6993, 0):
        with pytest.raises(ValueError, match="6993 training rows"):
            scale.check_size("reuters21578", bad)
    assert all(n < scale.FULL_TRAIN[s] for s, sizes in scale.SIZES.items() for n in sizes)


@pytest.mark.parametrize("study", ["reuters21578", "goemotions_full"])
def test_full_train_matches_the_recorded_full_size_cells(study):
    """The epoch rule's full sizes are the training rows the full-size cells recorded."""
    scale = _module("scale")
    path = os.path.join(STUDIES, "results", study, "tfidf_logreg", "seed1", "metrics.json")
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)["data"]
    assert data["train"] == scale.FULL_TRAIN[study]
    assert (data["validation"], data["test"]) == scale.EVAL_ROWS[study]


@pytest.fixture()
def scale_env(tmp_path, monkeypatch):
    """run.py and the baselines on a synthetic corpus (300 / 40 / 40 rows) read through the real recipe and
    ``load_run_data``; training is replaced by fakes that record what each stage was given."""
    from datasets import DatasetDict

    import hf_mlcl.data
    import hf_mlcl.training.stages as stages
    from hf_mlcl.data import make_synthetic_corpus

    corpus = make_synthetic_corpus(
        num_labels=5, num_train=300, num_validation=40, num_test=40, min_words=5, max_words=12
    )
    # a new DatasetDict per call, as the real loader returns (load_run_data replaces its splits by the subsets)
    monkeypatch.setattr(hf_mlcl.data, "load_mlc_dataset", lambda *a, **k: DatasetDict(dict(corpus)))
    monkeypatch.chdir(tmp_path)  # run_cell changes into the repository: back after the test
    calls: list[dict] = []

    def train_contrastive(m_args, d_args, c_args, callbacks=None):
        data = stages.load_run_data(d_args)
        calls.append({"stage": "contrastive", "args": c_args, "train": list(data.dataset["train"]["text"])})
        os.makedirs(c_args.output_dir, exist_ok=True)
        with open(os.path.join(c_args.output_dir, "metrics.json"), "w", encoding="utf-8") as fh:
            json.dump({"train_loss": 1.0}, fh)

    def train_probe(m_args, d_args, p_args, encoder_path=None, callbacks=None):
        data = stages.load_run_data(d_args)
        ds = data.dataset
        calls.append(
            {
                "stage": "probe",
                "args": p_args,
                "encoder": encoder_path,
                "train": list(ds["train"]["text"]),
                "eval": (len(ds["validation"]), len(ds["test"])),
            }
        )
        truth = np.zeros((len(ds["test"]), 5), dtype=bool)
        for i, labels in enumerate(ds["test"]["labels"]):
            truth[i, labels] = True
        trainer = SimpleNamespace(
            train_dataset=ds["train"],
            state=SimpleNamespace(best_model_checkpoint=None, best_metric=0.5),
            callback_handler=SimpleNamespace(callbacks=callbacks or []),
        )
        metrics = {"threshold": 0.5, "test_micro_f1": 0.5, "test_macro_f1": 0.4, "validation_macro_f1": 0.3}
        scores = {"test": (truth.astype(float) * 0.8, truth)}
        return SimpleNamespace(trainer=trainer, metrics=metrics, scores=scores)

    monkeypatch.setattr(stages, "train_contrastive", train_contrastive)
    monkeypatch.setattr(stages, "train_probe", train_probe)
    run = _module("run")
    # cell_io is the one home of the cells' output roots, shared by every module of the study
    monkeypatch.setattr(run.paths, "RESULTS", str(tmp_path / "results"))
    monkeypatch.setattr(run.paths, "RUNS", str(tmp_path / "runs"))
    return SimpleNamespace(run=run, calls=calls, results=tmp_path / "results", runs=tmp_path / "runs")


def _saved(results, cell: str, seed: int = 1) -> dict:
    with open(results / "reuters21578" / cell / f"seed{seed}" / "metrics.json", encoding="utf-8") as fh:
        return json.load(fh)


def test_every_method_and_seed_trains_on_the_same_subset_in_its_own_cell_folder(scale_env, monkeypatch):
    run, calls, results = scale_env.run, scale_env.calls, scale_env.results
    run.run_cell("reuters21578", "bce", "finetune", 1, [], lr="1e-4", train_size=100)
    run.run_cell("reuters21578", "bce", "finetune", 2, [], lr="1e-4", train_size=100)
    run.run_cell("reuters21578", "sd", "logistic", 3, [], train_size=100)
    run.run_cell("reuters21578", "bce", "finetune", 1, [], lr="1e-4", train_size=200)
    run.run_cell("reuters21578", "bce", "finetune", 1, [], lr="1e-4")  # the full size: no subset
    bce1, bce2, stage1, sd_probe, bce200, full = calls
    assert stage1["stage"] == "contrastive" and sd_probe["encoder"].endswith(
        os.path.join("sd-n100", "seed3", "encoder")
    )
    assert (
        len(bce1["train"]) == 100 and bce1["train"] == bce2["train"] == stage1["train"] == sd_probe["train"]
    )
    assert len(bce200["train"]) == 200 and bce200["train"] != bce1["train"] and len(full["train"]) == 300
    assert bce1["eval"] == sd_probe["eval"] == bce200["eval"] == full["eval"] == (40, 40)  # whole splits
    # TF-IDF reads the same rows through the baselines' data path
    tfidf = _module("baseline_tfidf")
    monkeypatch.setattr(tfidf.cell_io.paths, "RESULTS", str(results))
    ds = tfidf.cell_io.labelled_data("reuters21578", tfidf.scale.subset_overrides(100))[0]
    assert list(ds["train"]["text"]) == bce1["train"]
    result = tfidf.run_cell("reuters21578", "logreg", 1, [], train_size=100)
    assert result["train_size"] == 100 and result["data"]["train"] == 100
    assert (results / "reuters21578" / "tfidf_logreg-n100" / "seed1" / "metrics.json").is_file()
    assert tfidf.run_cell("reuters21578", "logreg", 1, [], train_size=100) == {}  # finished: skipped
    # the epoch rule, evaluations evenly over the steps, and the record of the size
    assert bce1["args"].num_train_epochs == 350 and full["args"].num_train_epochs == 5  # 5 x 6,993 / 100
    assert str(getattr(bce1["args"].eval_strategy, "value", bce1["args"].eval_strategy)) == "steps"
    assert bce1["args"].eval_steps == bce1["args"].save_steps == 140  # 350 epochs of 4 steps, 10 evaluations
    assert str(getattr(full["args"].eval_strategy, "value", full["args"].eval_strategy)) == "epoch"
    assert stage1["args"].num_train_epochs == 70  # 6,993 / 100 epochs of stage 1
    rec = _saved(results, "bce_finetune-lr1e-4-n100")
    assert rec["train_size"] == 100 and rec["data"]["train"] == 100 and rec["data"]["subset_seed"] == 52
    assert _saved(results, "bce_finetune-lr1e-4")["train_size"] is None
    assert _saved(results, "bce_finetune-lr1e-4-n200")["data"]["train"] == 200
    assert _saved(results, "sd_logistic-n100", 3)["train_size"] == 100
    assert bce2["args"].output_dir == str(
        scale_env.runs / "reuters21578" / "bce-n100" / "seed2" / "finetune-lr1e-4"
    )
    assert full["args"].output_dir == str(
        scale_env.runs / "reuters21578" / "bce" / "seed1" / "finetune-lr1e-4"
    )


def test_a_finished_cell_is_skipped_and_an_explicit_epoch_count_wins(scale_env, capsys):
    run, calls = scale_env.run, scale_env.calls
    run.run_cell(
        "reuters21578", "bce", "finetune", 1, ["--probe.num_train_epochs", "1"], lr="5e-5", train_size=100
    )
    assert calls[0]["args"].num_train_epochs == 1  # a smoke run's cap on the command line overrides the rule
    again = run.run_cell("reuters21578", "bce", "finetune", 1, [], lr="5e-5", train_size=100)
    assert len(calls) == 1 and again["train_size"] == 100
    assert "SKIP reuters21578 bce_finetune-lr5e-5-n100 seed1" in capsys.readouterr().out
    run.run_cell("reuters21578", "bce", "finetune", 1, [], lr="5e-5", train_size=200)  # another size: runs
    assert len(calls) == 2


def test_the_learning_rate_is_chosen_on_each_sizes_own_validation_cells(tmp_path):
    choice = _module("bce_choice")

    def cell(name: str, val: float) -> None:
        path = tmp_path / "reuters21578" / name / "seed1" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"metrics": {"validation_macro_f1": val}}))

    cell("bce_finetune-lr5e-5", 0.30)
    cell("bce_finetune-lr1e-4", 0.20)
    cell("bce_finetune-lr5e-5-n500", 0.10)
    cell("bce_finetune-lr1e-4-n500", 0.40)
    assert choice.bce_validation_scores("reuters21578", str(tmp_path)) == {"5e-5": 0.30, "1e-4": 0.20}
    assert choice.best_bce_lr("reuters21578", str(tmp_path)) == "5e-5"
    assert choice.best_bce_lr("reuters21578", str(tmp_path), 500) == "1e-4"
    with pytest.raises(ValueError, match="at --train-size 2000"):
        choice.best_bce_lr("reuters21578", str(tmp_path), 2000)
    # a run that trains at the choice (run.py --lr best) waits for the grid's extensions: 2e-5 on the whole
    # set (5e-5 at the lower edge), 2e-4 then 5e-4 at 500 (1e-4, then 2e-4, at the upper edge)
    with pytest.raises(
        ValueError, match=r"grid of reuters21578 is not complete \(ran: 1e-4, 5e-5\); run --lr extend first"
    ):
        choice.best_bce_lr("reuters21578", str(tmp_path), complete=True)
    cell("bce_finetune-lr2e-5", 0.25)
    assert choice.best_bce_lr("reuters21578", str(tmp_path), complete=True) == "5e-5"
    cell("bce_finetune-lr2e-4-n500", 0.45)
    with pytest.raises(ValueError, match="at --train-size 500 is not complete .* extend and extend2 first"):
        choice.best_bce_lr("reuters21578", str(tmp_path), 500, complete=True)
    assert choice.best_bce_lr("reuters21578", str(tmp_path), 500) == "2e-4"  # provisional, as tables label it
    cell("bce_finetune-lr5e-4-n500", 0.05)
    assert choice.best_bce_lr("reuters21578", str(tmp_path), 500, complete=True) == "2e-4"


def test_tables_of_the_full_study_leave_the_subset_cells_out(tmp_path, monkeypatch):
    cells = _module("study_cells")
    monkeypatch.setattr(cells.paths, "RESULTS", str(tmp_path))  # the one home of the cells' outputs
    for cell, size in (("sd_logistic", None), ("sd_logistic-n500", 500)):
        path = tmp_path / "reuters21578" / cell / "seed1" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"loss": "sd", "probe": "logistic", "tag": None, "train_size": size}))
    assert {k: len(v) for k, v in cells.load("reuters21578").items()} == {("sd", "logistic"): 1}


def _scale_queue(tmp_path) -> list[list[str]]:
    """The cells ``run_all.sh scale-reuters`` starts (a fake python records run.py's and the baselines' calls and
    runs scale.py and loss_choice.py for real), with jaccard and mulsupcon the two best losses on validation, and
    mulsupcon's probe the better at 500 rows (mean of 3 seeds), jaccard's at 2,000."""
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\ncase "$1" in *run.py|*baseline_*) echo "$@" >> {calls}; echo "RESULT $*";; '
        f'*) exec {sys.executable} "$@";; esac\n'
    )
    fake.chmod(0o755)
    for loss, val in {"jaccard": 0.5, "mulsupcon": 0.45}.items():  # the rest: 0.1
        for probe in ("logistic", "linear"):
            path = tmp_path / "reuters21578" / f"{loss}_{probe}" / "seed1" / "metrics.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"metrics": {"validation_macro_f1": val}}))
    for loss in ("all", "any", "sd", "msc", "ws_mulsupcon", "hbl"):
        for probe in ("logistic", "linear"):
            path = tmp_path / "reuters21578" / f"{loss}_{probe}" / "seed1" / "metrics.json"
            path.parent.mkdir(parents=True)
            path.write_text(json.dumps({"metrics": {"validation_macro_f1": 0.1}}))
    for n, scores in {
        500: {"jaccard": (0.3, 0.3, 0.3), "mulsupcon": (0.2, 0.35, 0.4)},
        2000: {"jaccard": (0.5, 0.4, 0.45), "mulsupcon": (0.45, 0.45, 0.44)},
    }.items():
        for loss, seeds in scores.items():
            for s, val in enumerate(seeds, 1):
                path = tmp_path / "reuters21578" / f"{loss}_logistic-n{n}" / f"seed{s}" / "metrics.json"
                path.parent.mkdir(parents=True)
                path.write_text(json.dumps({"metrics": {"validation_macro_f1": val}}))
    env = {**os.environ, "PY": str(fake), "MLCL_RESULTS": str(tmp_path), "MLCL_RUNS": str(tmp_path / "runs")}
    proc = subprocess.run(
        ["bash", os.path.join(STUDIES, "run_all.sh"), "scale-reuters"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout + proc.stderr
    return [line.split() for line in calls.read_text().splitlines()]


def test_run_all_scale_runs_cheap_rows_first_at_every_size_and_seed(tmp_path):
    """run_all.sh scale-reuters: TF-IDF, the two best losses' probes, SetFit, the BCE grid and seeds, the joint
    objective (two w, then seeds 2-3 at the better), the fine-tune from stage 1 with the loss whose probe is better
    at that size; every cell with --train-size: the cheap rows over every size first, then each size's fine-tunes,
    smallest size first."""
    cells = _scale_queue(tmp_path)
    assert all(c[c.index("--train-size") + 1] in ("500", "2000") for c in cells)
    words = [" ".join(c) for c in cells]
    ft = "--probe finetune --lr {} --seed {} --patience 3 --train-size {}"
    expected = [
        f"studies/baseline_tfidf.py reuters21578 --model logreg --seed 1 --train-size {n}"
        for n in (500, 2000)
    ]
    for n in (500, 2000):
        expected += [
            f"studies/run.py cell reuters21578 --loss {loss} --probe logistic --seed {s} --train-size {n}"
            for s in (1, 2, 3)
            for loss in ("jaccard", "mulsupcon")
        ]
    for n in (500, 2000):
        expected += [
            f"studies/baseline_setfit.py reuters21578 --seed {s} --train-size {n}" for s in (1, 2, 3)
        ]
    joint = "studies/run.py cell reuters21578 --loss joint --probe finetune --lr best --weight {} --seed {} "
    for n, loss in ((500, "mulsupcon"), (2000, "jaccard")):  # each size's fine-tunes before the next size's
        expected += [
            "studies/run.py cell reuters21578 --loss bce " + ft.format(lr, 1, n)
            for lr in ("5e-5", "1e-4", "extend", "extend2")
        ]
        expected += ["studies/run.py cell reuters21578 --loss bce " + ft.format("best", s, n) for s in (2, 3)]
        expected += [
            joint.format(w, 1) + f"--patience 3 --train-size {n}"
            for w in ("0.2", "0.5", "extend", "extend2", "extend3")
        ]
        expected += [joint.format("best", s) + f"--patience 3 --train-size {n}" for s in (2, 3)]
        expected += [
            f"studies/run.py cell reuters21578 --loss {loss} " + ft.format("best", s, n) for s in (1, 2, 3)
        ]
    assert [w.split(" --data_dir")[0] for w in words] == expected


def test_the_cost_plan_counts_every_run_the_scale_queue_starts(tmp_path):
    """``scale.py plan`` states a cost for every cell of run_all.sh's scale queue: per size, its runs of each
    method equal the queue's (the joint objective included), from the recorded full-size cells' rates."""
    scale = _module("scale")

    def method(cell: list[str]) -> str:
        if "baseline_tfidf.py" in cell[0]:
            return "tfidf"
        if "baseline_setfit.py" in cell[0]:
            return "setfit"
        loss, probe = cell[cell.index("--loss") + 1], cell[cell.index("--probe") + 1]
        return loss if loss in ("bce", "joint") else f"<loss>_{probe}"

    queued: dict[tuple[int, str], int] = {}
    for cell in _scale_queue(tmp_path):
        key = (int(cell[cell.index("--train-size") + 1]), method(cell))
        queued[key] = queued.get(key, 0) + 1
    planned: dict[tuple[int, str], int] = {}
    for name, n, runs, seconds, _ in scale.plan("reuters21578", os.path.join(STUDIES, "results")):
        kind = name.split(",")[0].split(" ")[0].replace("_finetune", "").replace("_logreg", "")
        kind = {"setfit_logistic": "setfit", "<loss>": "<loss>_finetune"}.get(kind, kind)
        planned[n, kind] = runs
        assert seconds > 0, name
    assert planned == queued


def test_the_joint_weight_is_chosen_on_seed_1_validation_at_the_same_size(tmp_path, monkeypatch):
    import run

    monkeypatch.setattr(run.paths, "RESULTS", str(tmp_path))
    scores = {
        "joint_finetune-w0.2-lr1e-4-n500": 0.30,
        "joint_finetune-w0.5-lr1e-4-n500": 0.25,
        "joint_finetune-w0.8-lr5e-5-n500": 0.99,  # not BCE's learning rate at 500: never compared,
        "joint_finetune-w0.5-lr5e-5-n500": 0.99,  # nor extended from
        "joint_finetune-w0.2-lr2e-4": 0.40,  # the whole training set: another size
        "joint_finetune-w0.5-lr2e-4": 0.45,
        # BCE's complete grids: 1e-4 chosen at 500 (inside the grid), 2e-4 on the whole set (one extension)
        "bce_finetune-lr5e-5-n500": 0.1,
        "bce_finetune-lr1e-4-n500": 0.3,
        "bce_finetune-lr2e-4-n500": 0.2,
        "bce_finetune-lr5e-5": 0.1,
        "bce_finetune-lr1e-4": 0.2,
        "bce_finetune-lr2e-4": 0.3,
    }
    for cell, value in scores.items():
        path = tmp_path / "reuters21578" / cell / "seed1" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"metrics": {"validation_macro_f1": value}}))
    # the better w lies at the grid's edge: no choice until the extension past it has run
    for size in (500, None):
        with pytest.raises(ValueError, match="grid of reuters21578 at this size is not complete"):
            run.best_joint_weight("reuters21578", size)
    with pytest.raises(ValueError, match="no finished bce_finetune-lr"):
        run.best_joint_weight("reuters21578", 2000)
    with pytest.raises(ValueError, match="--loss joint fine-tunes"):
        run.run_cell("reuters21578", "joint", "logistic", 1, [], weight="0.5")
    # the grid extends past its better edge along bce_choice.JOINT_LADDER, as BCE's learning rates do
    assert run.extended_joint_weight("reuters21578", 500) == "0.05"  # 0.2 > 0.5: below 0.2
    assert run.extended_joint_weight("reuters21578", None) == "0.8"  # 0.5 > 0.2: above 0.5
    with pytest.raises(
        ValueError, match=r"--weight extend2: the weights 0.05 have not run \(seed 1 --train-size 500"
    ):
        run.extended_joint_weight("reuters21578", 500, k=2)
    with pytest.raises(ValueError, match="--lr best: no finished bce_finetune-lr"):  # BCE's rate first
        run.extended_joint_weight("reuters21578", 2000)
    for w, value in (("0.05", 0.35), ("0.01", 0.33)):  # 0.05 the best: one step further, then inside
        path = tmp_path / "reuters21578" / f"joint_finetune-w{w}-lr1e-4-n500" / "seed1" / "metrics.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"metrics": {"validation_macro_f1": value}}))
    assert run.extended_joint_weight("reuters21578", 500, k=2) == "0.01"
    assert run.extended_joint_weight("reuters21578", 500, k=3) is None  # 0.05 lies inside the grid now
    assert run.best_joint_weight("reuters21578", 500) == "0.05"
    with pytest.raises(ValueError, match="extends at most 3 times"):
        run.extended_joint_weight("reuters21578", 500, k=4)
    path = tmp_path / "reuters21578" / "joint_finetune-w0.8-lr2e-4" / "seed1" / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"metrics": {"validation_macro_f1": 0.45}}))  # a tie with 0.5: the larger w
    assert run.best_joint_weight("reuters21578", None) == "0.8"
    # a w grid whose best lies inside it runs no extension (run_all.sh's extend cells print SKIP)
    monkeypatch.setattr(run, "extended_joint_weight", lambda *a, **k: None)
    assert run.run_cell("reuters21578", "joint", "finetune", 1, [], weight="extend", train_size=500) == {}


def _cell(root, cell: str, seed: int, val: float, test: float) -> None:
    folder = root / "reuters21578" / cell / f"seed{seed}"
    folder.mkdir(parents=True)
    metrics = {"validation_macro_f1": val, "test_macro_f1": test, "test_micro_f1": test + 0.5}
    (folder / "metrics.json").write_text(json.dumps({"seed": seed, "metrics": metrics}))


def test_scale_and_joint_tables_take_every_choice_on_validation_at_each_size(tmp_path):
    tables = _module("scale_table")
    _cell(tmp_path, "tfidf_logreg-n500", 1, 0.1, 0.18)
    _cell(tmp_path, "bce_finetune-lr5e-5-n500", 1, 0.10, 0.90)  # lower on validation: not the row
    _cell(tmp_path, "bce_finetune-lr2e-4-n500", 1, 0.15, 0.95)  # the extension: 1e-4 stays inside the grid
    for seed, test in ((1, 0.30), (2, 0.32), (3, 0.34)):
        _cell(tmp_path, "bce_finetune-lr1e-4-n500", seed, 0.20, test)
    _cell(tmp_path, "joint_finetune-w0.2-lr1e-4-n500", 1, 0.25, 0.40)
    _cell(tmp_path, "joint_finetune-w0.5-lr1e-4-n500", 1, 0.15, 0.99)
    # 0.2 at the grid's lower edge: the extension 0.05 runs, and is lower, so 0.2 lies inside the grid
    _cell(tmp_path, "joint_finetune-w0.05-lr1e-4-n500", 1, 0.20, 0.98)
    _cell(tmp_path, "bce_finetune-lr2e-4", 1, 0.35, 0.36)
    lines = tables.scale_table("reuters21578", str(tmp_path)).splitlines()
    assert lines[0] == "| method | 500 training texts | 2,000 training texts | all (6,993) |"
    rows = {line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:] for line in lines[2:]}
    assert rows["TF-IDF + logistic regression"][0] == "0.180 (n=1), -0.140 undecided"  # vs BCE at 500
    # the whole split's grid has one point of three: its choice, and the rows that follow it, wait
    assert rows["BCE fine-tune"] == ["0.320 ± 0.020 (n=3)", "choice pending", "choice pending |"]
    assert rows["joint: (1 - w) BCE + w jaccard"][0] == "0.400 (n=1), +0.080 undecided"
    assert rows["SetFit"] == ["not yet run"] * 2 + ["not yet run |"]
    joint = tables.joint_table(["reuters21578", "goemotions_full"], str(tmp_path)).splitlines()[2:]
    assert joint == [
        "| reuters21578 | 500 | 1e-4 | 0.05: 0.200 · 0.2: 0.250 · 0.5: 0.150 | 0.2 | 0.250 (n=1) | 0.400 (n=1) "
        "| 0.900 (n=1) | 0.200 ± 0.000 (n=3) | 0.320 ± 0.020 (n=3) |"
    ]
    # seeds 2-3 of the chosen w: its columns summarise the seeds, the grid keeps the seed-1 figures it chose on
    _cell(tmp_path, "joint_finetune-w0.2-lr1e-4-n500", 2, 0.35, 0.50)
    _cell(tmp_path, "joint_finetune-w0.2-lr1e-4-n500", 3, 0.45, 0.60)
    assert tables.joint_table(["reuters21578"], str(tmp_path)).splitlines()[2:] == [
        "| reuters21578 | 500 | 1e-4 | 0.05: 0.200 · 0.2: 0.250 · 0.5: 0.150 | 0.2 | 0.350 ± 0.100 (n=3) "
        "| 0.500 ± 0.100 (n=3) | 1.000 ± 0.100 (n=3) | 0.200 ± 0.000 (n=3) | 0.320 ± 0.020 (n=3) |"
    ]
    png = tmp_path / "figures" / "size.png"
    assert tables.scale_figure("reuters21578", str(tmp_path), str(png)) == str(png) and png.stat().st_size > 0
    assert tables.scale_figure("goemotions_full", str(tmp_path), str(tmp_path / "none.png")) is None
    # the extension past the better edge has not run: the choice waits for it
    (tmp_path / "reuters21578" / "joint_finetune-w0.05-lr1e-4-n500" / "seed1" / "metrics.json").unlink()
    assert "| joint: (1 - w) BCE + w jaccard | choice pending |" in tables.scale_table(
        "reuters21578", str(tmp_path)
    )
    (tmp_path / "reuters21578" / "joint_finetune-w0.5-lr1e-4-n500" / "seed1" / "metrics.json").unlink()
    pending = tables.joint_table(["reuters21578"], str(tmp_path)).splitlines()[2:]
    assert pending == [
        "| reuters21578 | 500 | 1e-4 | 0.2: 0.250 | choice pending |  |  |  | 0.200 ± 0.000 (n=3) "
        "| 0.320 ± 0.020 (n=3) |"
    ]
    assert "| joint: (1 - w) BCE + w jaccard | choice pending |" in tables.scale_table(
        "reuters21578", str(tmp_path)
    )
    # a complete grid at another learning rate: its row shows the w chosen in its own grid, whatever BCE's rate
    for w, val in (("0.2", 0.40), ("0.5", 0.50), ("0.8", 0.45)):
        _cell(tmp_path, f"joint_finetune-w{w}-lr5e-5-n500", 1, val, 0.7)
    other = [
        row for row in tables.joint_table(["reuters21578"], str(tmp_path)).splitlines() if "| 5e-5 |" in row
    ]
    assert other == [
        "| reuters21578 | 500 | 5e-5 | 0.2: 0.400 · 0.5: 0.500 · 0.8: 0.450 | 0.5 | 0.500 (n=1) | 0.700 (n=1) "
        "| 1.200 (n=1) | 0.100 (n=1) | 0.900 (n=1) |"
    ]


def test_the_joint_grid_is_run_all_s():
    """run_all.sh takes the w grid from ``bce_choice.py --weights``, which prints ``JOINT_WEIGHTS``."""
    bce_choice = _module("bce_choice")
    line = next(x for x in open(os.path.join(STUDIES, "run_all.sh")) if x.startswith("JOINT_WEIGHTS="))
    assert line.startswith("JOINT_WEIGHTS=$($PY studies/bce_choice.py --weights) || exit 1"), line
    out = subprocess.run(
        [sys.executable, os.path.join(STUDIES, "bce_choice.py"), "--weights"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert tuple(out.split()) == bce_choice.JOINT_WEIGHTS == ("0.2", "0.5")


def test_a_subset_fine_tunes_from_the_loss_whose_probe_is_better_on_its_validation(tmp_path):
    """``loss_choice.better_loss``: the mean validation macro-F1 of seeds 1-3 of each loss's logistic probe at
    that size (never a test figure), a tie to the earlier loss (the full-size ranking), an error naming what has
    not run; the scale table fine-tunes that loss and marks the other's row."""
    loss_choice, tables = _module("loss_choice"), _module("scale_table")
    root = str(tmp_path)
    for loss in ("all", "any", "mulsupcon", "sd", "jaccard", "msc", "ws_mulsupcon", "hbl"):
        for probe in ("logistic", "linear"):  # the full-size choice: jaccard, then mulsupcon
            _cell(tmp_path, f"{loss}_{probe}", 1, {"jaccard": 0.5, "mulsupcon": 0.45}.get(loss, 0.1), 0.3)
    for seed, (j, m) in enumerate(((0.30, 0.20), (0.30, 0.35), (0.30, 0.40)), 1):
        _cell(tmp_path, "jaccard_logistic-n500", seed, j, 0.9)  # the higher test figures must not count
        _cell(tmp_path, "mulsupcon_logistic-n500", seed, m, 0.1)
    with pytest.raises(ValueError, match="missing: jaccard_logistic-n2000 seed 1, "):
        loss_choice.better_loss("reuters21578", 2000, ["jaccard", "mulsupcon"], root)
    # seed 1 alone would pick jaccard (0.30 > 0.20); the mean of three picks mulsupcon (0.317 > 0.300)
    assert loss_choice.better_loss("reuters21578", 500, ["jaccard", "mulsupcon"], root) == "mulsupcon"
    for seed in (1, 2, 3):
        _cell(tmp_path, "jaccard_logistic-n2000", seed, 0.4, 0.5)
        _cell(tmp_path, "mulsupcon_logistic-n2000", seed, 0.4, 0.5)
    assert (
        loss_choice.better_loss("reuters21578", 2000, ["mulsupcon", "jaccard"], root) == "mulsupcon"
    )  # a tie
    assert loss_choice.better_loss("reuters21578", 2000, ["jaccard", "mulsupcon"], root) == "jaccard"
    for lr, val in (("5e-5", 0.1), ("1e-4", 0.3), ("2e-4", 0.2)):  # 1e-4 inside the grid at 500
        _cell(tmp_path, f"bce_finetune-lr{lr}-n500", 1, val, 0.3)
    _cell(tmp_path, "mulsupcon_finetune-lr1e-4-n500", 1, 0.3, 0.42)
    rows = {
        line.split(" | ")[0].lstrip("| "): line.split(" | ")[1:]
        for line in tables.scale_table("reuters21578", root).splitlines()[2:]
    }
    assert rows["mulsupcon + fine-tune"][0] == "0.420 (n=1), +0.120 undecided"
    assert rows["jaccard + fine-tune"][0] == tables.NOT_CHOSEN
    # at 2,000 rows jaccard is chosen (the tie) and the learning rate is not yet; at full size both are fine-tuned
    assert rows["jaccard + fine-tune"][1:] == ["choice pending", "choice pending |"]
    assert rows["mulsupcon + fine-tune"][1:] == [tables.NOT_CHOSEN, "choice pending |"]


def test_the_plan_counts_each_row_s_finished_runs_and_no_other_s(tmp_path):
    """``scale.py plan`` says how many runs of each row have finished: a row's pattern takes its own cells at its
    own size only (SetFit and the frozen pretrained probe are not a loss's probe; BCE and the joint objective
    are not a loss's fine-tune)."""
    scale = _module("scale")
    finished = {
        "tfidf_logreg-n500": (1,),
        "jaccard_logistic-n500": (1, 2, 3),
        "mulsupcon_logistic-n500": (1,),
        "pretrained_logistic-n500": (1,),
        "setfit_logistic-n500": (1, 2),
        "bce_finetune-lr1e-4-n500": (1,),
        "bce_finetune-lr5e-5-n500": (1, 2),
        "joint_finetune-w0.2-lr1e-4-n500": (1,),
        "mulsupcon_finetune-lr1e-4-n500": (1,),
        "jaccard_logistic-n2000": (1,),
        "jaccard_logistic": (1, 2, 3),  # the whole training set: no subset row
    }
    for cell, seeds in finished.items():
        for seed in seeds:
            folder = tmp_path / "reuters21578" / cell / f"seed{seed}"
            folder.mkdir(parents=True)
            (folder / "metrics.json").write_text("{}")
    (tmp_path / "reuters21578" / "sd_logistic-n500" / "seed1").mkdir(parents=True)  # unfinished: no metrics
    rows = scale.plan("reuters21578", os.path.join(STUDIES, "results"))
    done = {
        (name.split(",")[0].split(" ")[0], n): scale.finished_runs("reuters21578", str(tmp_path), pattern)
        for name, n, _, _, pattern in rows
    }
    assert done == {
        ("tfidf_logreg", 500): 1,
        ("<loss>_logistic", 500): 4,
        ("setfit_logistic", 500): 2,
        ("bce_finetune", 500): 3,
        ("joint_finetune", 500): 1,
        ("<loss>_finetune", 500): 1,
        ("tfidf_logreg", 2000): 0,
        ("<loss>_logistic", 2000): 1,
        ("setfit_logistic", 2000): 0,
        ("bce_finetune", 2000): 0,
        ("joint_finetune", 2000): 0,
        ("<loss>_finetune", 2000): 0,
    }


def test_a_rerun_of_a_finished_cell_drops_that_runs_files_and_keeps_its_own(tmp_path):
    """A finished cell run again trains anew: the checkpoints and per-epoch records its finished run left (older
    than its metrics.json) go, so the rerun neither resumes from them nor appends its epochs to them; the rerun's
    own files (newer, an interrupted rerun) stay for its resume."""
    import cell_io

    folder, out_dir = tmp_path / "run", tmp_path / "results"
    folder.mkdir()
    out_dir.mkdir()
    (folder / "checkpoint-1095").mkdir()
    (folder / "timeline.jsonl").write_text('{"epoch": 1}\n')
    (folder / "epoch_test.jsonl").write_text('{"epoch": 1}\n')
    (folder / "notes.txt").write_text("a user's file")
    (out_dir / "metrics.json").write_text("{}")
    (folder / "checkpoint-657").mkdir()
    for old in ("checkpoint-1095", "timeline.jsonl", "epoch_test.jsonl", "notes.txt"):
        os.utime(folder / old, (1_000, 1_000))  # the finished run's, before its metrics
    os.utime(out_dir / "metrics.json", (2_000, 2_000))
    os.utime(folder / "checkpoint-657", (3_000, 3_000))  # the rerun's own
    assert cell_io.drop_finished_run_files(str(folder), str(out_dir)) == [
        str(folder / "checkpoint-1095"),
        str(folder / "epoch_test.jsonl"),
        str(folder / "timeline.jsonl"),
    ]
    assert sorted(os.listdir(folder)) == ["checkpoint-657", "notes.txt"]
    (folder / "timeline.jsonl").write_text(
        '{"epoch": 1}\n'
    )  # the rerun's first epoch, then a kill and resume
    assert cell_io.drop_finished_run_files(str(folder), str(out_dir)) == []
    assert cell_io.drop_finished_run_files(str(folder), str(tmp_path / "none")) == []  # not finished


def test_cells_record_the_digest_of_the_encoder_they_stood_on_and_a_retrained_one_is_reported(
    scale_env, monkeypatch
):
    """Each cell of a stage 1 records the digest of the encoder weights its stage 2 loaded; cells of one group
    that stood on differently trained encoders are reported, the others not."""
    import torch
    from safetensors.torch import save_file

    run, results = scale_env.run, scale_env.results
    identity = _module("encoder_identity")
    encoder = scale_env.runs / "reuters21578" / "sd-n100" / "seed1" / "encoder"

    def weights(value: float) -> None:
        save_file({"w": torch.full((3,), value)}, str(encoder / "model.safetensors"))

    fake = sys.modules["hf_mlcl.training.stages"].train_contrastive

    def train_contrastive(m_args, d_args, c_args, callbacks=None):
        fake(m_args, d_args, c_args, callbacks)
        weights(1.0)

    monkeypatch.setattr(sys.modules["hf_mlcl.training.stages"], "train_contrastive", train_contrastive)
    first = run.run_cell("reuters21578", "sd", "logistic", 1, [], train_size=100)
    digest = first["stage1"]["weights_sha256"]
    assert digest == identity.weights_digest(str(encoder)) and len(digest) == 64
    second = run.run_cell("reuters21578", "sd", "linear", 1, [], train_size=100)  # the same encoder
    assert second["stage1"]["weights_sha256"] == digest
    assert identity.disagreements(str(results)) == []
    weights(2.0)  # the encoder is trained again, to other weights, before the fine-tune loads it
    run.run_cell("reuters21578", "sd", "finetune", 1, [], lr="1e-4", train_size=100)
    (group, cells), *more = identity.disagreements(str(results))
    assert not more and group[0] == "reuters21578" and group[1] == "sd" and group[3] == 100
    assert sorted(c for c, _ in cells) == ["sd_finetune-lr1e-4-n100", "sd_linear-n100", "sd_logistic-n100"]
    assert "within 1 of 1 groups" in identity.report(str(results))
    # a stage's checkpoints are not the encoder: their weights change no digest
    digest2 = identity.weights_digest(str(encoder))
    os.makedirs(encoder / "checkpoint-5")
    save_file({"w": torch.zeros(3)}, str(encoder / "checkpoint-5" / "model.safetensors"))
    assert identity.weights_digest(str(encoder)) == digest2 != digest
    assert identity.weights_digest(str(results)) is None  # no weights


def test_a_cell_recorded_before_the_digest_is_compared_on_the_training_loss(tmp_path):
    """A group holding a cell recorded before the digest and one recorded after it compares them on what both
    recorded, the stage-1 training loss: equal losses are one training, unequal ones two."""
    identity = _module("encoder_identity")

    def cell(name: str, stage1: dict) -> None:
        folder = tmp_path / "reuters21578" / name / "seed2"
        folder.mkdir(parents=True)
        record = {
            "loss": "mulsupcon",
            "train_size": 500,
            "contrastive_args": {"epochs": 14},
            "stage1": stage1,
        }
        (folder / "metrics.json").write_text(json.dumps(record))

    cell("mulsupcon_logistic-n500", {"train_loss": 2.5216127901661154})
    cell("mulsupcon_finetune-lr2e-4-n500", {"train_loss": 2.5216127901661154, "weights_sha256": "ab" * 32})
    assert identity.disagreements(str(tmp_path)) == []
    assert "within 0 of 1 groups" in identity.report(str(tmp_path))
    cell("mulsupcon_linear-n500", {"train_loss": 2.6, "weights_sha256": "ab" * 32})
    (_, cells), *more = identity.disagreements(str(tmp_path))
    assert not more and sorted(ident for _, ident in cells) == [
        ("train_loss", 2.5216127901661154),
        ("train_loss", 2.5216127901661154),
        ("train_loss", 2.6),
    ]
    assert "training losses 2.5216 to 2.6000" in identity.report(str(tmp_path))
