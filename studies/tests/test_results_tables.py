"""studies/make_tables.py and the table modules it assembles turn per-run metrics.json files into the RESULTS.md
tables."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "studies"))
import cost_tables  # noqa: E402  (studies/cost_tables.py: the cost section and the compute figure's data)
import full_tables  # noqa: E402  (studies/full_tables.py: the full-data studies' own tables)
import gpu_tables  # noqa: E402  (studies/gpu_tables.py: the study on one GPU)
import lr_grid  # noqa: E402  (studies/lr_grid.py: the BCE learning-rate grid)
import paths  # noqa: E402  (studies/paths.py: the one home of the cells' outputs)
import run_seconds  # noqa: E402  (studies/run_seconds.py: the seconds a run recorded)
import study_cells  # noqa: E402  (studies/study_cells.py: the cells as the tables read them)
import tail_table  # noqa: E402  (studies/tail_table.py: the per-label tail)
import variant_tables  # noqa: E402  (studies/variant_tables.py: the stage-1 variants' tables)


@pytest.fixture()
def results(tmp_path, monkeypatch):
    """The cells' outputs under tmp_path: every table module reads ``paths.RESULTS`` at each call."""
    monkeypatch.setattr(paths, "RESULTS", str(tmp_path))
    return tmp_path


@pytest.fixture()
def tables(results, tmp_path, monkeypatch):
    """make_tables, the command, reading and writing under tmp_path only."""
    spec = importlib.util.spec_from_file_location(
        "make_tables", os.path.join(ROOT, "studies", "make_tables.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "FIGURES", str(tmp_path / "figures"))  # never the repository's docs/figures
    (tmp_path / "PERFORMANCE.md").write_text("# Performance\n")
    monkeypatch.setattr(
        mod, "PERFORMANCE_MD", str(tmp_path / "PERFORMANCE.md")
    )  # nor its docs/PERFORMANCE.md
    return mod


def test_main_rewrites_only_the_marked_blocks(tables, tmp_path, monkeypatch):
    _full_run(tmp_path, "pretrained", "logistic", 1, 0.30, 0.25)
    md = tmp_path / "RESULTS.md"
    md.write_text(
        "intro\n<!-- TABLE:reuters21578-full -->\nold table\n<!-- /TABLE:reuters21578-full -->\noutro\n"
    )
    monkeypatch.setattr(tables, "RESULTS_MD", str(md))
    tables.main([])
    text = md.read_text()
    assert text.startswith("intro\n<!-- TABLE:reuters21578-full -->\n| stage 1 | stage 2 |")
    assert text.endswith("<!-- /TABLE:reuters21578-full -->\noutro\n")
    assert "old table" not in text and "| 0.300 (n=1) |" in text
    performance = (
        tmp_path / "PERFORMANCE.md"
    ).read_text()  # the cost of the cells follows the page's own part
    assert performance.startswith("# Performance\n\n<!-- studies/make_tables.py writes the rest")
    assert "## Training cost of the results study" in performance
    assert (tmp_path / "figures" / "compute_vs_macro_f1.png").is_file()


def _full_run(
    root,
    loss,
    probe,
    seed,
    val_macro,
    test_macro,
    tag=None,
    epochs=None,
    best=None,
    replace=False,
    study="reuters21578",
    **extra,
):
    cell = f"{loss}_{probe}" + (f"-{tag}" if tag else "")
    folder = root / study / cell / f"seed{seed}"
    folder.mkdir(parents=True, exist_ok=replace)
    record = {
        "loss": loss,
        "probe": probe,
        "seed": seed,
        "tag": tag,
        "overrides": [],
        "wall_s": extra.pop("wall_s", {"probe_s": 50.0}),
        "metrics": {
            "validation_macro_f1": val_macro,
            "validation_micro_f1": 0.8,
            "test_micro_f1": 0.9,
            "test_macro_f1": test_macro,
            "test_p@1": 0.95,
        },
        **({"epochs": epochs, "best_metric": best} if epochs else {}),
        **extra,
    }
    (folder / "metrics.json").write_text(json.dumps(record))


def test_full_study_tables_choose_the_lr_on_validation(results, tmp_path):
    curve = {
        "epoch_s": [100.0, 120.0],
        "evaluations": [{"epoch": 1.0, "eval_macro_f1": 0.3}, {"epoch": 2.0, "eval_macro_f1": 0.2}],
    }
    # lr 1e-4 has the better validation macro-F1 but the worse test macro-F1: the choice must follow validation
    _full_run(tmp_path, "bce", "finetune", 1, 0.40, 0.10, tag="lr5e-5", epochs=curve, best=0.3)
    _full_run(tmp_path, "bce", "finetune", 1, 0.50, 0.05, tag="lr1e-4", epochs=curve, best=0.3)
    _full_run(tmp_path, "pretrained", "logistic", 1, 0.30, 0.25)
    assert study_cells.chosen_lr("reuters21578") == "1e-4"
    full = full_tables.full_table("reuters21578").splitlines()
    bce = next(line for line in full if line.startswith("| none (BCE"))
    # two of the three learning rates have run: the label says the choice is provisional
    assert "lr 1e-4 (best on validation of 2 of 3 learning rates so far)" in bce
    assert "| 0.500 (n=1) | 0.900 (n=1) | 0.050 (n=1) | 0.950 (n=1) |" in bce
    assert bce.endswith("| 1/2 | 1 |")  # best epoch / last epoch, seeds (the seconds are PERFORMANCE.md's)
    logistic = next(line for line in full if "pretrained" in line and "logistic" in line)
    assert "| 0.300 (n=1) |" in logistic and logistic.endswith("| — | 1 |")
    linear = next(line for line in full if "pretrained" in line and "linear probe" in line)
    assert "not yet run" in linear
    # pretrained linear, BCE with the longer budget (Reuters) and every loss x 3
    assert sum("not yet run" in line for line in full) == 2 + 3 * 8
    lr = full_tables.lr_table("reuters21578")
    # the third point extends the grid past the better of the first two on validation: 1e-4 -> 2e-4
    assert "| 1e-4 | 0.500 (n=1) | 0.800 (n=1) | 1/2 | 110 |" in lr and "| 2e-4 | not yet run |" in lr
    assert "2e-5" not in lr and "third:" not in lr
    assert "0.050" not in lr  # test numbers are not part of the learning-rate choice
    _full_run(tmp_path, "bce", "finetune", 1, 0.45, 0.30, tag="lr2e-4", epochs=curve, best=0.3)
    bce = next(
        line for line in full_tables.full_table("reuters21578").splitlines() if line.startswith("| none (BCE")
    )
    assert "lr 1e-4 (chosen on validation)" in bce  # all three have run: the choice is final


def test_gpu_study_gets_its_own_choices_and_a_row_beside_each_cpu_row(results, tmp_path):
    """run_gpu.sh's tree (gpu_bf16): its tables make their own choices on its own validation numbers, the
    side-by-side summary pairs the rows both devices ran, and the tree is never read as a small-subset study."""

    def curve(*secs):
        return {
            "epoch_s": list(secs),
            "evaluations": [{"epoch": 1.0, "eval_macro_f1": 0.3}, {"epoch": 2.0, "eval_macro_f1": 0.4}],
        }

    _full_run(tmp_path, "bce", "finetune", 1, 0.40, 0.30, tag="lr1e-4", epochs=curve(900.0, 1000.0), best=0.4)
    _full_run(tmp_path, "jaccard", "linear", 1, 0.45, 0.50)
    gpu = tmp_path / "gpu_bf16"
    # on the GPU 2e-4 wins on validation although 1e-4 scores higher on test: the GPU rows follow validation
    _full_run(
        gpu, "bce", "finetune", 1, 0.45, 0.33, tag="lr2e-4", epochs=curve(14.0, 16.0), best=0.4, device="H100"
    )
    _full_run(
        gpu, "bce", "finetune", 1, 0.40, 0.60, tag="lr1e-4", epochs=curve(15.0, 15.0), best=0.4, device="H100"
    )
    _full_run(gpu, "jaccard", "logistic", 1, 0.50, 0.52, device="H100")  # no CPU row: not side by side
    got = gpu_tables.gpu_tables()
    assert paths.RESULTS == str(tmp_path)  # results_root gave the CPU tree back
    rows = [line for line in got["gpu-summary"].splitlines() if line.startswith("| reuters21578")]
    assert rows == [
        "| reuters21578 | BCE fine-tune, lr 1e-4 / 2e-4 (CPU / GPU), up to 5 epochs "
        "| 0.300 (n=1) | 0.330 (n=1) |"
    ]
    gpu_bce = next(
        line for line in got["gpu-reuters21578-full"].splitlines() if line.startswith("| none (BCE")
    )
    cpu_bce = next(
        line for line in full_tables.full_table("reuters21578").splitlines() if line.startswith("| none (BCE")
    )
    assert "lr 2e-4" in gpu_bce and "| 0.330 (n=1) |" in gpu_bce and "lr 1e-4" in cpu_bce
    jaccard_logistic = "| jaccard | logistic probe"
    assert jaccard_logistic in got[
        "gpu-reuters21578-vs-bce"
    ] and jaccard_logistic not in full_tables.comparison_table("reuters21578")
    assert "| 2e-4 | 0.450 (n=1) |" in got["gpu-reuters21578-lr"]
    (tmp_path / "gpu_bf16").rename(tmp_path / "elsewhere")
    assert gpu_tables.gpu_tables() == {}  # no GPU tree, no GPU tables


def test_lr_grid_third_point_is_chosen_on_validation(results, tmp_path):
    """lr_grid: the third learning rate lies beyond the better of 5e-5 / 1e-4 (validation macro-F1), and
    the lr table announces it as undecided until both have run."""
    grid = lr_grid
    assert grid.third_lr({"5e-5": 0.2}) is None and grid.planned_lrs({}) == ("5e-5", "1e-4")
    assert grid.third_lr({"5e-5": 0.2, "1e-4": 0.3}) == "2e-4"
    assert grid.third_lr({"5e-5": 0.3, "1e-4": 0.2}) == "2e-5"
    # the second extension: one ladder step further when the third is the best, none inside the grid
    scores = {"5e-5": 0.2, "1e-4": 0.3, "2e-4": 0.4}
    assert grid.extension_lr(scores, 2) == "5e-4" and grid.extension_lr({**scores, "2e-4": 0.25}, 2) is None
    assert grid.extension_lr({"5e-5": 0.3, "1e-4": 0.2, "2e-5": 0.4}, 2) == "1e-5"
    assert grid.extension_lr({"5e-5": 0.3, "1e-4": 0.3}, 1) == "2e-4"  # a tie goes to the larger rate
    with pytest.raises(grid.NotReady, match="2e-4"):
        grid.extension_lr({"5e-5": 0.2, "1e-4": 0.3}, 2)
    curve = {"epoch_s": [100.0], "evaluations": [{"epoch": 1.0, "eval_macro_f1": 0.3}]}
    _full_run(tmp_path, "bce", "finetune", 1, 0.40, 0.10, tag="lr5e-5", epochs=curve, best=0.3)
    lr = full_tables.lr_table("reuters21578")
    assert (
        "| 1e-4 | not yet run |" in lr
        and "| third: 2e-4 or 2e-5, chosen on validation once 5e-5 and 1e-4 have run |" in lr
    )


def test_timeline_keeps_the_latest_record_of_each_epoch(tmp_path):
    spec = importlib.util.spec_from_file_location("timeline", os.path.join(ROOT, "studies", "timeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    path = tmp_path / "timeline.jsonl"
    lines = [
        {"run_start": 1, "time": 2, "event": "epoch", "epoch": 1.0, "global_step": 10, "epoch_s": 100.0},
        {
            "run_start": 1,
            "time": 3,
            "event": "evaluate",
            "epoch": 1.0,
            "global_step": 10,
            "eval_s": 5.0,
            "metrics": {"eval_macro_f1": 0.3, "eval_runtime": 5},
        },
        {"run_start": 1, "time": 4, "event": "epoch", "epoch": 2.0, "global_step": 20, "epoch_s": 90.0},
        # killed before the epoch-2 checkpoint: the resumed run redoes epoch 2
        {"run_start": 9, "time": 10, "event": "epoch", "epoch": 2.0, "global_step": 20, "epoch_s": 95.0},
        {
            "run_start": 9,
            "time": 11,
            "event": "evaluate",
            "epoch": 2.0,
            "global_step": 20,
            "eval_s": 6.0,
            "metrics": {"eval_macro_f1": 0.4},
        },
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = mod.epoch_summary(str(path))
    assert summary["epoch_s"] == summary["whole_epoch_s"] == [100.0, 95.0] and summary["resumed_epochs"] == []
    assert summary["evaluations"] == [
        {"epoch": 1.0, "global_step": 10, "eval_s": 5.0, "eval_macro_f1": 0.3},
        {"epoch": 2.0, "global_step": 20, "eval_s": 6.0, "eval_macro_f1": 0.4},
    ]
    assert mod.epoch_summary(str(tmp_path / "absent.jsonl")) == {
        "epoch_s": [],
        "whole_epoch_s": [],
        "resumed_epochs": [],
        "stopped_epochs": [],
        "evaluations": [],
    }
    # killed in epoch 3 after its step-24 checkpoint: the resumed run times steps 25-30 only
    with open(path, "a") as fh:
        fh.write(
            json.dumps(
                {
                    "run_start": 20,
                    "time": 21,
                    "event": "epoch",
                    "epoch": 3.0,
                    "global_step": 30,
                    "epoch_s": 60.0,
                    "start_step": 24,
                    "steps": 6,
                    "epoch_steps": 10,
                }
            )
            + "\n"
        )
        # an early stop half-way through epoch 4 (epoch 3.5): its own epoch, no measure of a whole one
        fh.write(
            json.dumps(
                {
                    "run_start": 20,
                    "time": 22,
                    "event": "epoch",
                    "epoch": 3.5,
                    "global_step": 35,
                    "epoch_s": 40.0,
                    "start_step": 30,
                    "steps": 5,
                    "epoch_steps": 10,
                }
            )
            + "\n"
        )
    summary = mod.epoch_summary(str(path))
    assert summary["epoch_s"] == [100.0, 95.0, 60.0, 40.0]
    assert summary["whole_epoch_s"] == [100.0, 95.0, 100.0, None] and summary["resumed_epochs"] == [3]
    assert summary["stopped_epochs"] == [4]
    # the same early stop a third into epoch 5 must not replace epoch 4's record (round(4.33) == 4)
    lines = [
        {"run_start": 1, "time": 1, "event": "epoch", "epoch": 4.0, "global_step": 40, "epoch_s": 90.0},
        {"run_start": 1, "time": 2, "event": "epoch", "epoch": 4.3301, "global_step": 43, "epoch_s": 30.0},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    summary = mod.epoch_summary(str(path))
    assert summary["epoch_s"] == [90.0, 30.0] and summary["whole_epoch_s"] == [90.0, None]


def test_timeline_callback_excludes_in_epoch_evaluations(tmp_path, monkeypatch):
    from types import SimpleNamespace

    spec = importlib.util.spec_from_file_location("timeline", os.path.join(ROOT, "studies", "timeline.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    clock = iter([0.0, 0.0, 10.0, 14.0, 20.0, 21.0, 30.0, 31.0, 38.0, 39.0])  # time.time() calls, in order
    monkeypatch.setattr(mod.time, "time", lambda: next(clock))
    cb = mod.TimelineCallback(str(tmp_path / "t" / "timeline.jsonl"))  # run_start = 0
    args = SimpleNamespace(num_train_epochs=2, max_steps=-1)  # sized in epochs: 2 x 10 steps
    st = SimpleNamespace(epoch=0.5, global_step=5, max_steps=20)  # resumed from the step-5 checkpoint
    cb.on_epoch_begin(args, st, None)  # t0 = 0
    cb.on_step_end(args, st, None)  # eval starts at 10
    cb.on_evaluate(args, st, None, metrics={"eval_macro_f1": 0.2})  # ends at 14 (4 s), record stamped 20
    st.epoch, st.global_step = 1.0, 10
    cb.on_epoch_end(args, st, None)  # 21 - 0 - 4 = 17 s of training for steps 6-10, record stamped 30
    cb.on_step_end(args, st, None)  # 31: an epoch-end evaluation, outside the epoch
    cb.on_evaluate(args, st, None, metrics={"eval_macro_f1": 0.3})  # 38 - 31 = 7 s
    summary = mod.epoch_summary(str(tmp_path / "t" / "timeline.jsonl"))
    assert (
        summary["epoch_s"] == [17.0]
        and summary["whole_epoch_s"] == [34.0]
        and summary["resumed_epochs"] == [1]
    )
    assert (
        mod._steps_per_epoch(SimpleNamespace(num_train_epochs=2, max_steps=7), st) is None
    )  # sized in steps
    assert [(e["global_step"], e["eval_s"], e["eval_macro_f1"]) for e in summary["evaluations"]] == [
        (5, 4.0, 0.2),
        (10, 7.0, 0.3),
    ]


def test_runner_resolves_lr_extend_and_best_from_validation(tmp_path, monkeypatch):
    """run.py --lr extend / best read the finished BCE cells' validation macro-F1 only."""
    spec = importlib.util.spec_from_file_location("study_run", os.path.join(ROOT, "studies", "run.py"))
    run = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run)
    monkeypatch.setattr(run.paths, "RESULTS", str(tmp_path))  # the one home of the cells' outputs
    with pytest.raises(ValueError, match="5e-5, 1e-4 have not run .*run them first"):
        run.extended_bce_lr("reuters21578")
    _full_run(tmp_path, "bce", "finetune", 1, 0.30, 0.50, tag="lr5e-5")  # the better test score: ignored
    _full_run(tmp_path, "bce", "finetune", 1, 0.20, 0.10, tag="lr1e-4")
    assert run.extended_bce_lr("reuters21578") == "2e-5"  # 5e-5 is better on validation: extend below
    with pytest.raises(ValueError, match="extend2: the learning rates 2e-5 have not run"):
        run.extended_bce_lr("reuters21578", k=2)
    _full_run(tmp_path, "bce", "finetune", 1, 0.25, 0.60, tag="lr2e-5")
    assert run.extended_bce_lr("reuters21578", k=2) is None  # 5e-5 is the best, inside the grid
    assert run.best_bce_lr("reuters21578") == "5e-5"
    _full_run(tmp_path, "bce", "finetune", 1, 0.90, 0.90, tag="long-lr1e-4")  # a budget variant, not an lr
    assert run.best_bce_lr("reuters21578") == "5e-5"


def test_comparison_table_gives_differences_to_bce_and_a_seed_spread_verdict(results, tmp_path):
    assert full_tables.comparison_table("reuters21578") == "No contrastive row has finished yet."
    curve = {"epoch_s": [100.0], "evaluations": [{"epoch": 1.0, "eval_macro_f1": 0.3}]}
    for lr, val in (("5e-5", 0.40), ("1e-4", 0.45), ("2e-4", 0.42)):  # 1e-4 chosen on validation
        _full_run(tmp_path, "bce", "finetune", 1, val, 0.30, tag=f"lr{lr}", epochs=curve, best=0.3)
    _full_run(tmp_path, "bce", "finetune", 2, 0.44, 0.32, tag="lr1e-4", epochs=curve, best=0.3)  # mean 0.31
    _full_run(
        tmp_path, "bce", "finetune", 2, 0.99, 0.99, tag="lr5e-5", epochs=curve, best=0.3
    )  # not the chosen lr
    _full_run(tmp_path, "pretrained", "logistic", 1, 0.30, 0.25)
    _full_run(tmp_path, "jaccard", "logistic", 1, 0.50, 0.40)
    _full_run(
        tmp_path, "jaccard", "logistic", 2, 0.48, 0.42
    )  # mean 0.41: +0.100 vs BCE, spread 0.014 + 0.014
    _full_run(tmp_path, "hbl", "linear", 1, 0.47, 0.30)  # one seed: no verdict
    table = full_tables.comparison_table("reuters21578")
    assert "| +0.160 | not yet run | not yet run |" in table  # no longer-budget BCE row yet
    _full_run(tmp_path, "bce", "finetune", 1, 0.47, 0.37, tag="long-lr1e-4", epochs=curve, best=0.3)
    _full_run(
        tmp_path, "bce", "finetune", 1, 0.99, 0.99, tag="long-lr5e-5", epochs=curve, best=0.3
    )  # not the chosen lr
    assert (
        study_cells.chosen_lr("reuters21578") == "1e-4"
    )  # the longer budget is no learning rate of the grid
    full = full_tables.full_table("reuters21578")
    assert (
        "| fine-tune, lr 1e-4, up to 20 epochs (patience 3) | 0.470 (n=1) | 0.900 (n=1) | 0.370 (n=1) |"
        in full
    )
    table = full_tables.comparison_table("reuters21578")
    jac = next(line for line in table.splitlines() if line.startswith("| jaccard | logistic"))
    assert (
        "| 0.490 ± 0.014 (n=2) | +0.100 | +0.000 | yes: 0.100 > 0.028 | +0.160 | +0.040 | undecided: seeds 2 vs 1 |"
        in jac
    )
    hbl = next(line for line in table.splitlines() if line.startswith("| mulsupcon + hbl | linear"))
    assert (
        "| -0.010 | +0.000 | undecided: seeds 1 vs 2 | — | -0.070 | undecided: seeds 1 vs 1 |" in hbl
    )  # no frozen linear row
    _full_run(
        tmp_path, "bce", "finetune", 2, 0.46, 0.39, tag="long-lr1e-4", epochs=curve, best=0.3
    )  # its seeds 2-3
    table = full_tables.comparison_table("reuters21578")
    jac = next(line for line in table.splitlines() if line.startswith("| jaccard | logistic"))
    assert "| +0.160 | +0.030 | yes: 0.030 > 0.028 |" in jac  # 0.41 vs 0.38 (0.014 + 0.014)
    assert (
        "The bar (`bce_choice.py`; seed-1 validation macro-F1 0.450 (n=1) with 5 epochs, 0.470 (n=1) with up to "
        "20 epochs (patience 3)): **BCE with up to 20 epochs (patience 3)**;"
    ) in table
    _full_run(
        tmp_path, "bce", "finetune", 1, 0.44, 0.37, tag="long-lr1e-4", epochs=curve, best=0.3, replace=True
    )
    table = full_tables.comparison_table(
        "reuters21578"
    )  # the longer run lost on validation: the 5 epochs stay the bar
    jac = next(line for line in table.splitlines() if line.startswith("| jaccard | logistic"))
    assert jac.endswith("| +0.160 | +0.030 | not the bar (lower on validation) |")
    assert "**BCE with 5 epochs**" in table
    # ranked on the frozen probes' seed-1 validation macro-F1 (never on test), as loss_choice.py ranks them
    assert table.endswith(
        "(`loss_choice.py`; 2 of 8 losses have a probe row): jaccard 0.500 (logistic probe "
        "(ABALONE)), mulsupcon + hbl 0.470 (linear probe (SD paper))."
    )


def _loss_choice():
    spec = importlib.util.spec_from_file_location(
        "loss_choice", os.path.join(ROOT, "studies", "loss_choice.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _recording_python(tmp_path, calls, runners: str = "*run.py"):
    """A stand-in for run_all.sh's ``$PY``: the runner scripts matching ``runners`` (a shell case pattern) append
    their arguments to ``calls`` and print a RESULT line; every other script (the choices) runs for real."""
    import sys

    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\ncase "$1" in {runners}) echo "$@" >> {calls}; echo "RESULT $*";; '
        f'*) exec {sys.executable} "$@";; esac\n'
    )
    fake.chmod(0o755)
    return fake


def _probe_rows(root, scores: dict[str, float]) -> None:
    """A seed-1 logistic probe row per loss with the given validation macro-F1 (test inverted)."""
    for loss, val in scores.items():
        _full_run(root, loss, "logistic", 1, val, 1.0 - val)


SCORES = {
    "all": 0.41,
    "any": 0.47,
    "mulsupcon": 0.43,
    "sd": 0.40,
    "jaccard": 0.39,
    "msc": 0.30,
    "ws_mulsupcon": 0.44,
}


def test_loss_choice_ranks_frozen_probes_on_validation_once_every_loss_has_one(tmp_path):
    choice = _loss_choice()
    results = str(tmp_path)
    _probe_rows(tmp_path, SCORES)
    with pytest.raises(ValueError, match="no seed-1 probe row yet for all linear, any linear"):
        choice.best_losses("reuters21578", 2, results)
    for loss, val in SCORES.items():
        _full_run(tmp_path, loss, "linear", 1, val - 0.05, 0.9)
    _full_run(tmp_path, "hbl", "logistic", 1, 0.42, 0.9)
    with pytest.raises(ValueError, match="no seed-1 probe row yet for hbl linear;"):  # both kinds, every loss
        choice.best_losses("reuters21578", 2, results)
    _full_run(tmp_path, "hbl", "linear", 1, 0.46, 0.2)  # a loss counts with its better probe
    _full_run(tmp_path, "msc", "finetune", 1, 0.99, 0.99, tag="lr2e-4")  # fine-tunes do not count
    _full_run(tmp_path, "jaccard", "linear", 2, 0.99, 0.99)  # nor do other seeds
    assert choice.best_losses("reuters21578", 2, results) == ["any", "hbl"]
    assert choice.best_losses("reuters21578", 3, results) == ["any", "hbl", "ws_mulsupcon"]
    assert choice.ranked("reuters21578", results)[1] == ("hbl", 0.46, "linear")
    assert sorted(choice.LOSSES) == sorted(choice_order())  # the losses run_all.sh runs


def test_goemotions_table_lists_fine_tunes_of_the_losses_chosen_on_reuters_only(results, tmp_path):
    """Outside Reuters only the two losses chosen there are fine-tuned: their missing fine-tune says "not yet
    run"; another loss with probe rows gets no fine-tune row until one has run."""
    for loss, val in {**SCORES, "hbl": 0.35}.items():
        for probe in ("logistic", "linear"):
            _full_run(tmp_path, loss, probe, 1, val, 0.5)
    assert study_cells.chosen_on_reuters() == ["any", "ws_mulsupcon"]
    for loss in ("any", "msc"):
        _full_run(tmp_path, loss, "logistic", 1, 0.4, 0.3, study="goemotions_full")
    rows = full_tables.full_table("goemotions_full").splitlines()
    fine_tunes = [r.split(" | ")[0].lstrip("| ") for r in rows if "| fine-tune" in r and "BCE" not in r]
    assert fine_tunes == ["any", "ws_mulsupcon"]
    assert all(
        "not yet run" in r for r in rows if r.startswith(("| any | fine-tune", "| ws_mulsupcon | fine-tune"))
    )
    assert any(r.startswith("| msc | logistic probe") for r in rows)
    for lr, val in (("5e-5", 0.3), ("1e-4", 0.5)):
        _full_run(tmp_path, "bce", "finetune", 1, val, 0.3, tag=f"lr{lr}", study="goemotions_full")
    _full_run(tmp_path, "msc", "finetune", 1, 0.4, 0.3, tag="lr1e-4", study="goemotions_full")
    msc = [
        r for r in full_tables.full_table("goemotions_full").splitlines() if r.startswith("| msc | fine-tune")
    ]
    assert len(msc) == 1 and "| 0.300 (n=1) |" in msc[0]  # a finished cell is always listed


def choice_order() -> list[str]:
    """run_all.sh's LOSSES, in its order: the shell script takes them from ``loss_choice.py --losses``."""
    with open(os.path.join(ROOT, "studies", "run_all.sh"), encoding="utf-8") as fh:
        line = next(x for x in fh if x.startswith("LOSSES="))
    assert line.startswith("LOSSES=$($PY studies/loss_choice.py --losses) || exit 1"), line
    out = subprocess.run(
        [sys.executable, os.path.join(ROOT, "studies", "loss_choice.py"), "--losses"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.split()


def _bce_choice():
    spec = importlib.util.spec_from_file_location(
        "bce_choice", os.path.join(ROOT, "studies", "bce_choice.py")
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_bce_choice_takes_the_longer_budget_only_when_it_wins_on_validation(tmp_path):
    choice, results = _bce_choice(), str(tmp_path)
    with pytest.raises(
        ValueError, match="no study 'reuters' under"
    ):  # a typo is no study without a longer run
        choice.bce_budget("reuters", results)
    (tmp_path / "goemotions_full").mkdir()
    assert choice.bce_budget("goemotions_full", results) == "base"  # no longer run planned there
    (tmp_path / "reuters21578").mkdir()
    with pytest.raises(ValueError, match="no finished bce_finetune-lr"):
        choice.bce_budget("reuters21578", results)
    _full_run(tmp_path, "bce", "finetune", 1, 0.30, 0.10, tag="lr1e-4")
    _full_run(tmp_path, "bce", "finetune", 1, 0.40, 0.10, tag="lr2e-4")  # chosen
    _full_run(tmp_path, "bce", "finetune", 1, 0.90, 0.90, tag="long-lr1e-4")  # not the chosen learning rate
    assert choice.bce_validation_scores("reuters21578", results) == {"1e-4": 0.30, "2e-4": 0.40}
    with pytest.raises(ValueError, match="up to 20 epochs .patience 3. at lr 2e-4 .seed 1. has not finished"):
        choice.bce_budget("reuters21578", results)
    _full_run(
        tmp_path, "bce", "finetune", 1, 0.40, 0.99, tag="long-lr2e-4"
    )  # a tie on validation: test is not read
    assert choice.bce_budget("reuters21578", results) == "base"
    _full_run(tmp_path, "bce", "finetune", 1, 0.41, 0.0, tag="long-lr2e-4", replace=True)
    assert choice.bce_budget("reuters21578", results) == "long"
    _full_run(tmp_path, "bce", "finetune", 2, 0.50, 0.10, tag="lr2e-4")  # other seeds do not count
    _full_run(tmp_path, "bce", "finetune", 2, 0.10, 0.10, tag="long-lr2e-4")
    assert choice.bce_budget("reuters21578", results) == "long"


def test_run_all_runs_seeds_probes_first_with_the_chosen_losses(tmp_path):
    """run_all.sh full-seeds without names: loss_choice.py names the losses, then seeds 2-3 run probes, BCE, fine-tunes."""
    import subprocess

    calls = tmp_path / "calls.txt"
    # records the runner's cells, runs everything else (loss_choice.py) for real
    fake = _recording_python(tmp_path, calls)
    env = {**os.environ, "PY": str(fake), "MLCL_RESULTS": str(tmp_path), "MLCL_RUNS": str(tmp_path / "runs")}
    script = os.path.join(ROOT, "studies", "run_all.sh")
    _probe_rows(tmp_path, SCORES)
    for loss, val in SCORES.items():
        _full_run(tmp_path, loss, "linear", 1, val - 0.05, 0.5)
    _full_run(tmp_path, "hbl", "logistic", 1, 0.45, 0.5)  # hbl has no linear row yet: nothing may run
    proc = subprocess.run(
        ["bash", script, "full-seeds", "reuters21578"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 1 and "no seed-1 probe row yet for hbl linear" in proc.stderr
    assert not calls.exists()
    _full_run(tmp_path, "hbl", "linear", 1, 0.40, 0.5)
    proc = subprocess.run(
        ["bash", script, "full-seeds", "reuters21578"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    cells = [
        " ".join(line.split()[3:]) for line in calls.read_text().splitlines()
    ]  # after "run.py cell <study>"
    lin = "--probe.num_train_epochs 50 --patience 5"
    expected = []
    for s in (2, 3):
        expected += [
            f"--loss pretrained --probe logistic --seed {s}",
            f"--loss pretrained --probe linear --seed {s} {lin}",
        ]
        for loss in ("any", "hbl"):
            expected += [
                f"--loss {loss} --probe logistic --seed {s}",
                f"--loss {loss} --probe linear --seed {s} {lin}",
            ]
    expected += [f"--loss bce --probe finetune --lr best --seed {s} --patience 2" for s in (2, 3)]
    expected += [
        f"--loss {loss} --probe finetune --lr best --seed {s} --patience 2"
        for s in (2, 3)
        for loss in ("any", "hbl")
    ]
    assert cells == expected
    # the Reuters queue: every loss's probes, the longer-budget BCE, every fine-tune, then the same seeds
    calls.unlink()
    proc = subprocess.run(["bash", script, "full-reuters"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cells = [" ".join(line.split()[3:]) for line in calls.read_text().splitlines()]
    long = (
        "--loss bce --probe finetune --lr best --seed 1 --patience 3 --tag long --probe.num_train_epochs 20"
    )
    assert cells[:16:2] == [f"--loss {loss} --probe logistic --seed 1" for loss in choice_order()]
    assert cells[16] == long and cells[17:25] == [
        f"--loss {loss} --probe finetune --lr best --seed 1 --patience 2" for loss in choice_order()
    ]
    assert cells[25:] == expected  # the fake ran no BCE cell, so no budget is chosen: no longer-budget seeds
    assert "FAILED: bce_choice.py reuters21578" in proc.stderr
    # the longer budget won on validation: its seeds 2-3 run after the 5-epoch BCE seeds, before the fine-tunes
    _full_run(tmp_path, "bce", "finetune", 1, 0.30, 0.1, tag="lr2e-4")
    _full_run(tmp_path, "bce", "finetune", 1, 0.35, 0.1, tag="long-lr2e-4")
    calls.unlink()
    proc = subprocess.run(
        ["bash", script, "full-seeds", "reuters21578"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "FAILED" not in proc.stderr, proc.stderr
    cells = [" ".join(line.split()[3:]) for line in calls.read_text().splitlines()]
    n_bce = expected.index("--loss any --probe finetune --lr best --seed 2 --patience 2")
    assert (
        cells
        == expected[:n_bce] + [long.replace("--seed 1", f"--seed {s}") for s in (2, 3)] + expected[n_bce:]
    )
    assert (
        "### BCE budget of reuters21578 chosen on validation: long" in proc.stderr
    )  # the queue log records it
    # the longer budget lost on validation: the 5-epoch run stays the bar, and no longer-budget seeds run
    _full_run(tmp_path, "bce", "finetune", 1, 0.29, 0.1, tag="long-lr2e-4", replace=True)
    calls.unlink()
    proc = subprocess.run(
        ["bash", script, "full-seeds", "reuters21578"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0 and "chosen on validation: base" in proc.stderr, proc.stderr
    assert [" ".join(line.split()[3:]) for line in calls.read_text().splitlines()] == expected


def test_tail_table_bins_bce_against_the_best_contrastive_cell_on_validation(results, tmp_path):
    assert tail_table.tail_table("reuters21578").startswith("Written once")
    curve = {"epoch_s": [100.0], "evaluations": [{"epoch": 1.0, "eval_macro_f1": 0.3}]}
    counts = [1, 3, 5, 7, 0, 3]

    def per_label(cell, f1):
        (tmp_path / "reuters21578" / cell / "seed1" / "per_label_f1.json").write_text(
            json.dumps({"test_f1": f1, "train_count": counts})
        )

    _full_run(tmp_path, "bce", "finetune", 1, 0.45, 0.30, tag="lr1e-4", epochs=curve, best=0.3)
    per_label("bce_finetune-lr1e-4", [0.1, 0.2, 0.3, 0.4, 0.9, 0.6])
    _full_run(tmp_path, "jaccard", "logistic", 1, 0.50, 0.10)  # best on validation, worse on test
    per_label("jaccard_logistic", [0.5, 0.5, 0.5, 0.5, 0.5, 0.5])
    _full_run(tmp_path, "sd", "linear", 1, 0.40, 0.90)
    per_label("sd_linear", [1.0] * 6)
    rows = tail_table.tail_table("reuters21578").splitlines()
    assert rows[0] == (
        "| training documents per label (bin) | labels | BCE fine-tuning | jaccard stage 1 + logistic probe "
        "(ABALONE) | difference to BCE fine-tuning |"
    )  # chosen on validation, not on test
    # the bins of hf_mlcl.evaluation.f1_by_frequency_bin: 8 log-spaced edges from 1 to 7, 4 bins non-empty
    assert rows[2:] == [
        "| 1-1.28 | 1 | 0.10 | 0.50 | +0.40 |",
        "| 2.65-3.37 | 2 | 0.40 | 0.50 | +0.10 |",
        "| 4.3-5.49 | 1 | 0.30 | 0.50 | +0.20 |",
        "| 5.49-7 | 1 | 0.40 | 0.50 | +0.10 |",
        "| 0 (unseen in training, not in the plot) | 1 | | | |",
    ]
    # the longer-budget BCE run joins as a second bar, with the best cell's difference to it
    _full_run(tmp_path, "bce", "finetune", 1, 0.47, 0.35, tag="long-lr1e-4", epochs=curve, best=0.3)
    per_label("bce_finetune-long-lr1e-4", [0.3, 0.6, 0.3, 0.2, 0.9, 0.6])
    rows = tail_table.tail_table("reuters21578").splitlines()
    assert rows[0] == (
        "| training documents per label (bin) | labels | BCE fine-tuning | BCE fine-tuning, up to 20 epochs "
        "(patience 3) | jaccard stage 1 + logistic probe (ABALONE) | difference to BCE fine-tuning | difference to BCE "
        "fine-tuning, up to 20 epochs "
        "(patience 3) |"
    )
    assert rows[2:4] == [
        "| 1-1.28 | 1 | 0.10 | 0.30 | 0.50 | +0.40 | +0.20 |",
        "| 2.65-3.37 | 2 | 0.40 | 0.60 | 0.50 | +0.10 | -0.10 |",
    ]
    assert rows[-1] == "| 0 (unseen in training, not in the plot) | 1 | | | | | |"
    # the baseline with the best validation macro-F1 joins as a reference column (no difference columns)
    _full_run(tmp_path, "tfidf", "svm", 1, 0.44, 0.40)
    per_label("tfidf_svm", [0.2, 0.2, 0.2, 0.2, 0.2, 0.2])
    _full_run(tmp_path, "tfidf", "logreg", 1, 0.30, 0.99)  # higher test, lower validation: not shown
    per_label("tfidf_logreg", [0.9] * 6)
    rows = tail_table.tail_table("reuters21578").splitlines()
    assert rows[0].split(" | ")[4:6] == [
        "jaccard stage 1 + logistic probe (ABALONE)",
        "TF-IDF 1-2 grams + linear SVM",
    ]
    assert rows[2] == "| 1-1.28 | 1 | 0.10 | 0.30 | 0.50 | 0.20 | +0.40 | +0.20 |"
    plot = tail_table.full_f1_plot("reuters21578", str(tmp_path / "figures" / "f1.png"))
    assert plot is not None and os.path.getsize(plot) > 0
    # a second seed of the best contrastive cell: its column gives mean ± sd of the bin over the seeds, and the
    # differences use the mean
    (tmp_path / "reuters21578" / "jaccard_logistic" / "seed2").mkdir()
    (tmp_path / "reuters21578" / "jaccard_logistic" / "seed2" / "per_label_f1.json").write_text(
        json.dumps({"test_f1": [0.7] * 6, "train_count": counts})
    )
    rows = tail_table.tail_table("reuters21578").splitlines()
    assert rows[0].split(" | ")[4] == "jaccard stage 1 + logistic probe (ABALONE) (n=2)"
    assert rows[2] == "| 1-1.28 | 1 | 0.10 | 0.30 | 0.60 ± 0.14 | 0.20 | +0.50 | +0.30 |"
    # a baseline better on validation without its per-label file: no baseline column until it has one (never
    # the next best in its place)
    _full_run(tmp_path, "setfit", "logistic", 1, 0.46, 0.10)
    assert "SetFit" not in tail_table.tail_table("reuters21578") and "TF-IDF" not in tail_table.tail_table(
        "reuters21578"
    )
    per_label("setfit_logistic", [0.3] * 6)
    assert "SetFit" in tail_table.tail_table("reuters21578").splitlines()[0]
    # a fine-tune cell is named by its stage 1 and learning rate, not by its folder
    assert tail_table._cell_label("hbl", "finetune-lr1e-4") == "mulsupcon + hbl stage 1 + fine-tune, lr 1e-4"


def test_epoch_times_count_a_resumed_epoch_by_its_whole_epoch_estimate():
    resumed = {"epochs": {"epoch_s": [50.0, 90.0], "whole_epoch_s": [100.0, 90.0], "resumed_epochs": [1]}}
    assert run_seconds.per_epoch([resumed]) == "≈95"
    assert (
        run_seconds.per_epoch([{"epochs": {"epoch_s": [80.0, 90.0]}}]) == "85"
    )  # records from before the field
    assert run_seconds.per_epoch([{}]) == "—"
    assert (
        run_seconds.per_epoch([{"epochs": {"epoch_s": [80.0, 20.0], "whole_epoch_s": [80.0, None]}}]) == "80"
    )


def test_run_all_goemotions_queue_waits_for_the_reuters_probe_rows(tmp_path):
    """full-goemotions runs beside full-reuters: it polls loss_choice.py until every Reuters probe row exists."""
    import subprocess
    import time

    calls = tmp_path / "calls.txt"
    fake = _recording_python(tmp_path, calls)
    env = {
        **os.environ,
        "PY": str(fake),
        "MLCL_RESULTS": str(tmp_path),
        "MLCL_RUNS": str(tmp_path / "runs"),
        "PICK_POLL_S": "0.2",
    }
    _probe_rows(tmp_path, SCORES)
    for loss, val in SCORES.items():
        _full_run(tmp_path, loss, "linear", 1, val - 0.05, 0.5)
    script = os.path.join(ROOT, "studies", "run_all.sh")
    proc = subprocess.Popen(
        ["bash", script, "full-goemotions"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 60
    while (not calls.exists() or len(calls.read_text().splitlines()) < 5) and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # five polls
    assert proc.poll() is None  # still waiting: hbl has no probe row, so nothing past the base rows can run
    cells = [" ".join(line.split()[2:]) for line in calls.read_text().splitlines()]
    assert (
        all("--loss bce" in c or "--loss pretrained" in c for c in cells) and len(cells) == 5
    )  # the base rows
    _full_run(tmp_path, "hbl", "logistic", 1, 0.45, 0.5)
    _full_run(tmp_path, "hbl", "linear", 1, 0.40, 0.5)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    cells = [" ".join(line.split()[2:]) for line in calls.read_text().splitlines()]
    assert (
        cells[5] == "goemotions_full --loss any --probe logistic --seed 1"
    )  # the two best on Reuters validation
    assert cells[7] == "goemotions_full --loss hbl --probe logistic --seed 1"


def test_a_stage_resumed_across_processes_reports_its_epoch_records_as_a_lower_bound(results, tmp_path):
    ev = [{"epoch": 1.0, "eval_s": 5.0}, {"epoch": 2.0, "eval_s": 5.0}, {"epoch": 3.0, "eval_s": None}]
    resumed = {"wall_s": {"probe_s": 150.0}, "epochs": {"epoch_s": [800.0, 900.0, 1000.0], "evaluations": ev}}
    whole = {"wall_s": {"probe_s": 2800.0}, "epochs": {"epoch_s": [800.0, 900.0, 1000.0], "evaluations": ev}}
    assert run_seconds.stage2_seconds(resumed) == (2710.0, True)  # the last process timed only the test pass
    assert run_seconds.stage2_seconds(whole) == (2800.0, False)
    assert run_seconds.stage2_seconds({"wall_s": {"probe_s": 40.0}}) == (
        40.0,
        False,
    )  # logistic probe: no epochs
    assert run_seconds.cost_cell([resumed]) == "≥2,710" and run_seconds.cost_cell([whole]) == "2,800"
    assert (
        run_seconds.cost_cell([resumed, whole]) == "2,800"
    )  # the runs timed whole are the measure where there are any


def _stop_index(scores: list[float], patience: int) -> int:
    """Index of the evaluation after which EarlyStoppingCallback (greater is better, threshold 0) stops."""
    best, waited = None, 0
    for i, score in enumerate(scores):
        if best is None or score > best:
            best, waited = score, 0
        else:
            waited += 1
            if waited >= patience:
                return i
    return len(scores) - 1


def _run_all_patience(study: str, record: dict) -> int:
    """The patience run_all.sh gave the full-study cells written before run.py recorded it."""
    if record["probe"] == "linear":
        return 5  # LINEAR
    return 3 if study == "goemotions_full" or str(record.get("tag") or "").startswith("long") else 2


@pytest.mark.parametrize(
    ("study", "at_least"),
    [
        ("reuters21578", 10),
        ("goemotions_full", 10),
        ("gpu_bf16/reuters21578", 10),
        ("gpu_bf16/goemotions_full", 5),
    ],
)
def test_no_finished_cell_trained_past_its_early_stopping(study, at_least):
    """Every cell stopped at the evaluation where early stopping stops an uninterrupted run, or ran out of
    budget before it (a resume that forgets the patience count trains on: restore_callback_states_from_checkpoint)."""
    assert (
        _stop_index([0.1, 0.3, 0.2, 0.25, 0.2], 3) == 4
        and _stop_index([0.1, 0.3, 0.2, 0.2, 0.4, 0.1], 2) == 3
    )
    checked = 0
    for root, _, files in os.walk(os.path.join(ROOT, "studies", "results", study)):
        if "metrics.json" not in files:
            continue
        with open(os.path.join(root, "metrics.json"), encoding="utf-8") as fh:
            record = json.load(fh)
        evals = [e["eval_macro_f1"] for e in (record.get("epochs") or {}).get("evaluations") or []]
        if evals:  # the logistic probe has no evaluations
            patience = record.get("early_stopping_patience") or _run_all_patience(study, record)
            assert _stop_index(evals, patience) == len(evals) - 1, (root, patience, evals)
            checked += 1
    assert checked >= at_least  # the study's linear probes and fine-tunes, not an empty walk


def test_run_gpu_runs_every_cell_in_bf16_with_the_alone_cells_first(tmp_path):
    """run_gpu.sh: the cells of run_all.sh's Reuters queue with --bf16 true, into its own results tree; the timed
    cells run alone before the side-by-side ones, the grid's third point after its first two, the fine-tunes
    last; goemotions_full names the two best losses from the GPU tree's Reuters rows."""
    import subprocess

    calls = tmp_path / "calls.txt"
    # records the runner's cells (appends are atomic: the queues run side by side)
    fake = _recording_python(tmp_path, calls)
    gpu = tmp_path / "gpu"
    env = {**os.environ, "PY": str(fake), "MLCL_RESULTS": str(gpu), "MLCL_RUNS": str(tmp_path / "runs")}
    script = os.path.join(ROOT, "studies", "run_gpu.sh")
    proc = subprocess.run(["bash", script, "reuters21578"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    cells = [line.split()[3:] for line in calls.read_text().splitlines()]  # after "run.py cell reuters21578"
    assert all(c[-2:] == ["--bf16", "true"] for c in cells)
    cells = [" ".join(c[:-2]) for c in cells]
    lin = "--probe.num_train_epochs 50 --patience 5"
    assert cells[:2] == [
        "--loss bce --probe finetune --lr 5e-5 --seed 1 --patience 2",
        f"--loss mulsupcon --probe linear --seed 1 {lin}",
    ]
    side = {
        "--loss pretrained --probe linear --seed 1 " + lin,
        "--loss pretrained --probe logistic --seed 1",
        "--loss bce --probe finetune --lr 1e-4 --seed 1 --patience 2",
        "--loss mulsupcon --probe logistic --seed 1",
    }
    side |= {
        f"--loss {loss} --probe {p} --seed 1" + (f" {lin}" if p == "linear" else "")
        for loss in choice_order()
        if loss != "mulsupcon"
        for p in ("linear", "logistic")
    }
    assert set(cells[2 : 2 + len(side)]) == side and len(side) == 2 + 2 + 2 * 7
    n = 2 + len(side)
    assert cells[n] == "--loss bce --probe finetune --lr extend --seed 1 --patience 2"
    finetunes = {f"--loss {loss} --probe finetune --lr best --seed 1 --patience 2" for loss in choice_order()}
    finetunes.add(
        "--loss bce --probe finetune --lr best --seed 1 --patience 3 --tag long --probe.num_train_epochs 20"
    )
    assert set(cells[n + 1 :]) == finetunes and len(cells) == n + 1 + 9
    # every linear probe before its loss's logistic one (the linear probe caches the features)
    for loss in choice_order():
        assert cells.index(f"--loss {loss} --probe linear --seed 1 {lin}") < cells.index(
            f"--loss {loss} --probe logistic --seed 1"
        )
    # GoEmotions: the two best losses on the GPU tree's Reuters validation rows (the CPU tree is not read)
    _probe_rows(gpu, {**SCORES, "hbl": 0.45})
    for loss, val in {**SCORES, "hbl": 0.45}.items():
        _full_run(gpu, loss, "linear", 1, val - 0.05, 0.5)
    calls.unlink()
    proc = subprocess.run(
        ["bash", script, "goemotions_full"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert (
        proc.returncode == 0
        and "the two best losses on the GPU study's Reuters validation rows: any hbl" in proc.stdout
    )
    cells = [" ".join(line.split()[3:-2]) for line in calls.read_text().splitlines()]
    assert cells[0] == "--loss bce --probe finetune --lr 5e-5 --seed 1 --patience 3"
    assert cells[-2:] in (
        [f"--loss {a} --probe finetune --lr best --seed 1 --patience 3" for a in order]
        for order in (("any", "hbl"), ("hbl", "any"))
    )


def test_run_all_baselines_run_tfidf_once_then_setfit_seed_by_seed(tmp_path):
    """run_all.sh baselines: seed 1 of every baseline on both studies before seeds 2 and 3 (the TF-IDF logistic
    model draws no random numbers: seed 1 only); every cell names its study's data folder under $DATA."""
    import subprocess

    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}; echo "RESULT $*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PY": str(fake), "MLCL_RUNS": str(tmp_path / "runs"), "DATA": "/data"}
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "studies", "run_all.sh"), "baselines"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "FAILED" not in proc.stdout, proc.stdout + proc.stderr
    calls = [line.split() for line in calls.read_text().splitlines()]
    assert [c[0] for c in calls[:2]] == ["studies/loss_choice.py", "studies/bce_choice.py"]  # the settings
    cells = calls[2:]
    assert [c[:2] for c in cells[:4]] == [["studies/baseline_tfidf.py", "reuters21578"]] * 2 + [
        ["studies/baseline_tfidf.py", "goemotions_full"]
    ] * 2
    studies = ("reuters21578", "goemotions_full")
    assert [(c[0], c[1], c[c.index("--seed") + 1]) for c in cells[4:]] == (
        [("studies/baseline_setfit.py", s, "1") for s in studies]
        + [("studies/baseline_tfidf.py", s, str(seed)) for seed in (2, 3) for s in studies]
        + [("studies/baseline_setfit.py", s, str(seed)) for seed in (2, 3) for s in studies]
    )
    assert all("--model svm" in " ".join(c) for c in cells[6:10])  # only the SVM draws random numbers
    assert all(
        c[-2:] == ["--data_dir", "/data/" + ("goemotions" if c[1] == "goemotions_full" else "reuters21578")]
        for c in cells
    )
    assert (tmp_path / "runs" / "logs" / "reuters21578").is_dir()  # one log per cell


def test_run_gpu_papers_gives_each_loss_its_papers_stage1_budget(tmp_path, monkeypatch):
    """run_gpu.sh papers: the study's base rows, then every loss's probes and fine-tune with the overrides of
    paper_budgets.py, into its own results tree; the overrides parse with the real argument classes."""
    import subprocess
    import sys

    from hf_mlcl.recipes import load_recipe, parse_stage, split_overrides

    spec = importlib.util.spec_from_file_location(
        "paper_budgets", os.path.join(ROOT, "studies", "paper_budgets.py")
    )
    budgets = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "paper_budgets", budgets)  # its dataclass looks its module up
    spec.loader.exec_module(budgets)
    assert sorted(budgets.BUDGETS) == sorted(choice_order())  # every loss of the study has a budget
    msc = budgets.BUDGETS["msc"]
    assert (msc.epochs, msc.batch, msc.queue) == (80, 32, 512)  # ABALONE, App. A
    ws = budgets.BUDGETS["ws_mulsupcon"]
    assert (ws.epochs, ws.batch) == (100, 64)  # ws-MulSupCon's implementation details
    recipe = load_recipe(os.path.join(ROOT, "studies", "recipes", "reuters21578", "hbl.yaml"))
    _, _, args = parse_stage(
        recipe,
        "contrastive",
        split_overrides([*budgets.BUDGETS["hbl"].overrides(), "--use_cpu", "true"], ["contrastive"]),
        output_dir=str(tmp_path / "x"),
    )
    assert (args.num_train_epochs, args.per_device_train_batch_size, args.queue_size) == (80, 128, 4096)
    assert args.loss_kwargs == {"base": "mulsupcon", "k_min": 128}  # the paper's gate, with the paper's queue
    assert "| msc | ABALONE | 80 | 32 | 512 |" in budgets.table()

    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(
        f'#!/bin/sh\ncase "$1" in *run.py) echo "$MLCL_RESULTS $@" >> {calls}; echo "RESULT $*";; '
        f'*) exec {sys.executable} "$@";; esac\n'
    )
    fake.chmod(0o755)
    env = {**os.environ, "PY": str(fake), "MLCL_RUNS": str(tmp_path / "runs")}
    env.pop("MLCL_RESULTS", None)
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "studies", "run_gpu.sh"), "papers", "reuters21578"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    lines = calls.read_text().splitlines()
    assert all(line.split()[0].endswith(os.path.join("studies", "results", "gpu_papers")) for line in lines)
    cells = [" ".join(line.split()[4:]) for line in lines]  # after "<tree> studies/run.py cell reuters21578"
    for loss, budget in budgets.BUDGETS.items():
        mine = [c for c in cells if c.startswith(f"--loss {loss} ")]
        assert len(mine) == 3 and all(" ".join(budget.overrides()) in c for c in mine), (loss, mine)
    bce = [c for c in cells if c.startswith("--loss bce")]
    assert len(bce) == 4 and not any("--contrastive" in c for c in bce)  # the grid and the 20-epoch run


def test_summary_compute_points_and_cost_read_every_kind_of_cell(results, tmp_path):
    """summary_table: a row per method, baselines included, the joint objective at the w chosen on seed-1
    validation once its grid is complete, "not yet run" where a cell is missing; the training cost adds
    stage 1 to stage 2 and prefers runs that encoded their own features; compute_points leaves out probes
    whose seconds hold no encoder pass; cost_rows counts a shared stage 1 once."""
    curve = {
        "epoch_s": [100.0, 120.0],
        "whole_epoch_s": [100.0, 120.0],
        "evaluations": [{"epoch": 1.0, "eval_macro_f1": 0.3, "eval_s": 5.0}],
    }
    _full_run(tmp_path, "bce", "finetune", 1, 0.40, 0.30, tag="lr1e-4", epochs=curve, best=0.3)
    stage1 = {"epochs": {"epoch_s": [500.0]}}
    _full_run(
        tmp_path,
        "jaccard",
        "logistic",
        1,
        0.50,
        0.45,
        stage1=stage1,
        features={"train": "encoded"},
        wall_s={"stage1_s": 500.0, "probe_s": 60.0},
    )
    _full_run(
        tmp_path,
        "jaccard",
        "linear",
        1,
        0.48,
        0.44,
        stage1=stage1,
        features={"train": "loaded"},
        wall_s={"stage1_s": 500.0, "probe_s": 10.0},
    )
    _full_run(tmp_path, "tfidf", "svm", 1, 0.42, 0.41, wall_s={"probe_s": 30.0})
    joint = "| reuters21578 | joint (1 - w) BCE + w jaccard, w {} (chosen on validation), lr 1e-4, up to 5 epochs |"
    for w, val in (("0.2", 0.30), ("0.5", 0.25), ("0.05", 0.33)):
        _full_run(tmp_path, "joint", "finetune", 1, val, 0.28, tag=f"w{w}-lr1e-4")
    _full_run(tmp_path, "joint", "finetune", 2, 0.99, 0.99, tag="w0.2-lr1e-4")  # seed 2 chooses nothing
    assert (
        joint.format("?") + " not yet run |" in full_tables.summary_table()
    )  # 0.05 is an edge: 0.01 pending
    _full_run(tmp_path, "joint", "finetune", 1, 0.31, 0.10, tag="w0.01-lr1e-4")
    _full_run(tmp_path, "joint", "finetune", 2, 0.20, 0.30, tag="w0.05-lr1e-4")
    summary = full_tables.summary_table()
    assert (
        joint.format("0.05") + " 0.900 ± 0.000 (n=2) | 0.290 ± 0.014 (n=2) | 0.950 ± 0.000 (n=2) |" in summary
    )
    bce = next(
        line for line in summary.splitlines() if "BCE fine-tune, lr 1e-4 (chosen on validation)" in line
    )
    assert (
        "| 0.900 (n=1) | 0.300 (n=1) | 0.950 (n=1) | ≥225 |" in bce
    )  # epochs + evaluations > the process's 50 s
    assert (
        "| reuters21578 | TF-IDF 1-2 grams + linear SVM | 0.900 (n=1) | 0.410 (n=1) | 0.950 (n=1) | 30 |"
        in summary
    )
    assert "| reuters21578 | TF-IDF 1-2 grams + logistic regression | not yet run |" in summary
    assert (
        "| goemotions_full | SetFit: MiniLM on any-overlap pairs + logistic head | not yet run |" in summary
    )
    assert (
        run_seconds.cost_cell(
            [
                json.loads(
                    (tmp_path / "reuters21578" / "jaccard_linear" / "seed1" / "metrics.json").read_text()
                )
            ]
        )
        == "≥510"
    )
    points, curves = cost_tables.compute_points("reuters21578")
    assert (
        points["stage 1 + logistic"] == [(560.0, 0.45)] and "stage 1 + linear" not in points
    )  # loaded: left out
    assert points["TF-IDF + linear SVM"] == [(30.0, 0.41)] and curves == {}
    rows = dict(cost_tables.cost_rows("reuters21578"))
    assert rows["stage 1 (contrastive, batch 64), one epoch"] == [500.0]  # one encoder, two probe cells
    assert rows["fine-tune (BCE, MiniLM + linear head), one epoch"] == [100.0, 120.0]
    assert rows["logistic probe, whole: encoding train + validation + test, then the fits"] == [60.0]
    assert cost_tables._spread([100.0, 120.0, 500.0]) == "120 (100-500; 3)" and cost_tables._spread([]) == "—"


def test_sampler_cells_have_their_own_table_and_stay_out_of_the_others(results, tmp_path):
    """A stage-1 variant with positive-ensured batches (run.py --batch-sampler positives: tag "positives") is
    compared with the random-batch cell of the same loss and probe, and no other table reads it."""
    _full_run(tmp_path, "jaccard", "logistic", 1, 0.50, 0.30)
    _full_run(tmp_path, "jaccard", "logistic", 1, 0.52, 0.35, tag="positives", batch_sampler="positives")
    _full_run(tmp_path, "jaccard", "linear", 1, 0.48, 0.31)
    table = variant_tables.sampler_table("reuters21578").splitlines()
    jaccard = next(line for line in table if line.startswith("| jaccard |"))
    assert "| 0.300 → 0.350 (+0.050) | 0.310 → not yet run | 0.500 → 0.520 (+0.020) |" in jaccard
    assert study_cells.load("reuters21578")[("jaccard", "logistic")][0]["metrics"]["test_macro_f1"] == 0.30
    assert ("jaccard", "logistic-positives") not in study_cells.load("reuters21578", tagged=True)
    assert "0.350" not in full_tables.full_table("reuters21578")


def test_tail_seeds_rerun_seeds_2_3_of_the_tail_cells_only_where_per_label_files_are_missing(
    tmp_path, monkeypatch
):
    """run_all.sh tail-seeds: seed 1 of the tail table's baseline (the best on validation), then the SVM, the two best losses' logistic probes and BCE (the longer budget where it won)
    for seeds 2-3, each with --rerun-without-per-label; cell_io.finished skips a cell that has both files."""
    import subprocess

    monkeypatch.syspath_prepend(os.path.join(ROOT, "studies"))
    import cell_io

    folder = tmp_path / "cell"
    folder.mkdir()
    assert not cell_io.finished(str(folder), force=False)
    (folder / "metrics.json").write_text("{}")
    assert cell_io.finished(str(folder), force=False) and not cell_io.finished(str(folder), force=True)
    assert not cell_io.finished(str(folder), force=False, without_per_label=True)
    (folder / "per_label_f1.json").write_text("{}")
    assert cell_io.finished(str(folder), force=False, without_per_label=True)

    calls = tmp_path / "calls.txt"
    # records the runners' cells, runs everything else (the choices) for real
    fake = _recording_python(tmp_path, calls, "*run.py|*baseline_*")
    env = {**os.environ, "PY": str(fake), "MLCL_RESULTS": str(tmp_path), "MLCL_RUNS": str(tmp_path / "runs")}
    _probe_rows(tmp_path, {**SCORES, "hbl": 0.45})
    for loss, val in {**SCORES, "hbl": 0.45}.items():
        _full_run(tmp_path, loss, "linear", 1, val - 0.05, 0.5)
    _full_run(tmp_path, "bce", "finetune", 1, 0.30, 0.1, tag="lr2e-4")
    _full_run(tmp_path, "bce", "finetune", 1, 0.35, 0.1, tag="long-lr2e-4")
    _full_run(tmp_path, "tfidf", "logreg", 1, 0.43, 0.1)
    _full_run(tmp_path, "tfidf", "svm", 1, 0.42, 0.1)
    _full_run(tmp_path, "setfit", "logistic", 1, 0.30, 0.1)
    proc = subprocess.run(
        ["bash", os.path.join(ROOT, "studies", "run_all.sh"), "tail-seeds", "reuters21578"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and "FAILED" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    words = [line.split()[1:] for line in calls.read_text().splitlines()]  # without the script
    cells = [" ".join(w[1:] if w[0] == "cell" else w).split(" --data_dir")[0] for w in words]
    again = "--rerun-without-per-label"
    expected = [f"reuters21578 --model logreg --seed 1 {again}"]  # the baseline best on validation
    expected += [f"reuters21578 --model svm --seed {s} {again}" for s in (2, 3)]
    expected += [
        f"reuters21578 --loss {loss} --probe logistic --seed {s} {again}"
        for s in (2, 3)
        for loss in ("any", "hbl")
    ]
    expected += [
        f"reuters21578 --loss bce --probe finetune --lr best --seed {s} --patience 2 {again}" for s in (2, 3)
    ]
    expected += [
        f"reuters21578 --loss bce --probe finetune --lr best --seed {s} --patience 3 --tag long "
        f"--probe.num_train_epochs 20 {again}"
        for s in (2, 3)
    ]
    assert cells == expected
