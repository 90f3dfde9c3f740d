"""recipes/custom/my_csv.yaml parses and runs end to end (`hf-mlcl run`) on a tiny CSV with no validation
and no test file: validation is carved and stated in both model cards, the run has no test metrics."""

from __future__ import annotations

import csv
import json
import os
import random

import pytest

from hf_mlcl.cli import main
from hf_mlcl.recipes import load_recipe, parse_stage

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
RECIPE = os.path.join(ROOT, "recipes", "custom", "my_csv.yaml")
TOPICS = {
    "sports": "goal match team score",
    "politics": "vote law party senate",
    "science": "atom cell gene lab",
}


def _tiny_csv(path, n=64, seed=0, one_column_per_label=False):
    rng = random.Random(seed)
    with open(path, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["text", *sorted(TOPICS)] if one_column_per_label else ["text", "labels"])
        for _ in range(n):
            labs = rng.sample(sorted(TOPICS), rng.randint(1, 2))
            words = " ".join(" ".join(rng.sample(TOPICS[t].split(), 3)) for t in labs)
            w.writerow(
                [words, *[int(t in labs) for t in sorted(TOPICS)]]
                if one_column_per_label
                else [words, ";".join(labs)]
            )
    return str(path)


def _tiny_recipe(tmp_path):
    """The recipe as shipped, with only the encoder swapped for a tiny random BERT (no download)."""
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(
        f"_base_: {RECIPE}\nmodel_name_or_path: null\nmax_length: 32\n"
        "backbone_config: {model_type: bert, vocab_size: 300, hidden_size: 32, num_hidden_layers: 1, "
        "num_attention_heads: 4, intermediate_size: 64, max_position_embeddings: 64}\n",
        encoding="utf-8",
    )
    return str(tiny)


def _run_command(tmp_path, data: str, out) -> list[str]:
    """``hf-mlcl run`` of the tiny recipe on the CSV ``data`` into ``out``, without progress bars."""
    return [
        "run",
        _tiny_recipe(tmp_path),
        "--dataset",
        data,
        "--output_dir",
        str(out),
        "--disable_tqdm",
        "true",
    ]


def test_my_csv_recipe_parses_with_its_data_keys():
    recipe = load_recipe(RECIPE)
    model_args, data_args, args = parse_stage(recipe, "contrastive")
    assert data_args.dataset == "my_data.csv" and data_args.label_column == "labels"
    assert data_args.validation_fraction == 0.1 and args.loss == "similarity_dissimilarity"
    assert model_args.model_name_or_path == "sentence-transformers/all-MiniLM-L6-v2"
    _, _, pargs = parse_stage(recipe, "probe")
    assert pargs.probe == "linear" and not pargs.bf16


def test_my_csv_recipe_runs_on_a_tiny_csv(tmp_path):
    data = _tiny_csv(tmp_path / "my_data.csv")
    tiny = _tiny_recipe(tmp_path)
    out = str(tmp_path / "run")
    rc = main(
        [
            "run",
            tiny,
            "--dataset",
            data,
            "--output_dir",
            out,
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "16",
            "--disable_tqdm",
            "true",
        ]
    )
    assert rc == 0
    results = json.load(open(os.path.join(out, "results.json")))
    probe = results["probe"]
    assert "validation_micro_f1" in probe and not any(k.startswith("test_") for k in probe)
    for stage in ("encoder", "classifier"):
        card = json.load(open(os.path.join(out, stage, "card_data.json")))
        assert card["dataset"] == data and card["num_labels"] == 3
        assert card["label_names"] == ["politics", "science", "sports"]
        assert any("validation: carved from train (6 of 64 rows" in n for n in card["data_notes"])
        readme = open(os.path.join(out, stage, "README.md"), encoding="utf-8").read()
        assert "carved from train (6 of 64 rows, validation_fraction=0.1, seed=42)" in readme
        # a local CSV is not a Hub dataset: the card's metadata must not list its path under datasets:
        meta = readme.split("---", 2)[1]
        assert "datasets:" not in meta and data not in meta


@pytest.mark.parametrize(
    "options",
    [
        ["--label_format", "columns"],
        ["--label_columns", "politics,science,sports"],
        ["--label_column", ""],
        ["--label_column=", "--label_format", "columns"],
    ],
)
def test_the_command_line_label_layout_overrides_the_recipes(tmp_path, options):
    """recipes/custom/my_csv.yaml pins label_column: labels; a one-column-per-label CSV still goes through it
    when the command line says so (and a later label_column replaces a recipe's label_columns)."""
    from hf_mlcl.recipes import split_overrides
    from hf_mlcl.training.stages import load_run_data

    data = _tiny_csv(tmp_path / "wide.csv", one_column_per_label=True)
    ov = split_overrides(["--dataset", data, *options], ["contrastive"])
    _, data_args, _ = parse_stage(load_recipe(RECIPE), "contrastive", ov, output_dir=str(tmp_path / "out"))
    run_data = load_run_data(data_args)
    ds, names = run_data.dataset, run_data.label_names
    assert names == ["politics", "science", "sports"]
    expected = {}
    for row in csv.DictReader(open(data, encoding="utf-8")):
        expected[row["text"]] = [i for i, t in enumerate(names) if row[t] == "1"]
    for split in ds.values():
        for text, labels in zip(list(split["text"]), list(split["labels"])):
            assert labels == expected[text]
    # the other way round: a recipe with label_columns, a delimited file and --label_column on the command line
    recipe = tmp_path / "wide.yaml"
    recipe.write_text(f"_base_: {RECIPE}\nlabel_columns: [politics, science]\n", encoding="utf-8")
    narrow = _tiny_csv(tmp_path / "narrow.csv")
    ov = split_overrides(["--dataset", narrow, "--label_column", "labels"], ["contrastive"])
    _, data_args, _ = parse_stage(
        load_recipe(str(recipe)), "contrastive", ov, output_dir=str(tmp_path / "out")
    )
    assert load_run_data(data_args).label_names == ["politics", "science", "sports"]


def test_a_one_column_per_label_csv_runs_through_the_readme_recipe(tmp_path):
    data = _tiny_csv(tmp_path / "wide.csv", one_column_per_label=True)
    out = str(tmp_path / "run")
    rc = main(
        [
            "run",
            _tiny_recipe(tmp_path),
            "--dataset",
            data,
            "--label_format",
            "columns",
            "--output_dir",
            out,
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "16",
            "--disable_tqdm",
            "true",
            "--no_plots",
        ]
    )
    assert rc == 0
    for stage in ("encoder", "classifier"):
        card = json.load(open(os.path.join(out, stage, "card_data.json")))
        assert card["label_names"] == ["politics", "science", "sports"]


@pytest.mark.parametrize("extra", [[], ["--contrastive.max_steps", "1"]])
def test_a_dataset_smaller_than_one_batch_stops_before_training(tmp_path, capsys, extra):
    """10 rows (9 after the validation carve) and stage 1's batch of 32 with drop_last: one line naming both,
    before any model is built, and no folder at all (max_steps does not change that)."""
    data = _tiny_csv(tmp_path / "ten.csv", n=10)
    out = tmp_path / "run"
    capsys.readouterr()
    rc = main([*_run_command(tmp_path, data, out), *extra])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("hf-mlcl run: error: the train split has 9 rows, fewer than one batch of 32 ")
    assert "per_device_train_batch_size 32" in err[0] and "dataloader_drop_last" in err[0]
    assert "at most 9" in err[0]
    assert not out.exists()


def test_the_batch_check_counts_the_per_process_batch_of_every_process():
    import types

    from hf_mlcl.training.preflight import check_train_batches

    args = types.SimpleNamespace(dataloader_drop_last=True, train_batch_size=8, world_size=2)
    check_train_batches(16, args, "stage 1")  # one batch of 8 on each of the 2 processes
    with pytest.raises(
        ValueError,
        match=r"15 rows, fewer than one batch of 16 \(per_device_train_batch_size 8 x 2 "
        r"processes\).*at most 7",
    ):
        check_train_batches(15, args, "stage 1")
    with pytest.raises(ValueError, match="launch at most 1 process"):
        check_train_batches(1, args, "stage 1")
    args.dataloader_drop_last = False  # the probe stage: a short last batch still trains
    check_train_batches(1, args, "stage 2")


def test_a_stage_without_an_optimizer_step_saves_no_model(tmp_path, capsys):
    """A schedule of no step stops in one line before anything is built, and an --overwrite_output_dir run with it
    leaves the run in the folder as it was."""
    data = _tiny_csv(tmp_path / "my_data.csv")
    out = tmp_path / "run"
    run = [*_run_command(tmp_path, data, out), "--per_device_train_batch_size", "16"]
    assert main([*run, "--contrastive.num_train_epochs", "0"]) == 2
    assert "stage 1 (contrastive) would train no step (num_train_epochs 0.0" in capsys.readouterr().err
    assert not out.exists()
    assert main([*run, "--max_steps", "2"]) == 0
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main([*run, "--overwrite_output_dir", "true", "--contrastive.num_train_epochs", "0"]) == 2
    assert "would train no step" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_my_csv_probe_defaults_are_the_best_mean_of_the_recorded_grid():
    """recipes/custom/my_csv.yaml's probe learning rate and epochs are the cell of the grid that
    benchmarks/custom_probe_grid.py recorded (validation macro-F1 on 400- and 2,000-row GoEmotions CSVs) with the
    best mean over the sizes; the grid spans learning rates on both sides."""
    path = os.path.join(ROOT, "benchmarks", "cpu_results", "custom_probe_grid.json")
    with open(path, encoding="utf-8") as fh:
        grid = json.load(fh)["validation_macro_f1"]
    assert set(grid) == {"400", "2000"}
    scores = {
        size: {(float(lr), int(ep)): f1 for lr, row in rows.items() for ep, f1 in row.items()}
        for size, rows in grid.items()
    }
    _, _, pargs = parse_stage(load_recipe(RECIPE), "probe")
    default = (pargs.learning_rate, int(pargs.num_train_epochs))
    cells = set.intersection(*(set(s) for s in scores.values()))
    assert default == max(cells, key=lambda cell: sum(s[cell] for s in scores.values()))
    for size, by_cell in scores.items():
        lrs = sorted({lr for lr, _ in by_cell})
        assert len(lrs) >= 3 and lrs[0] < default[0] < lrs[-1], (size, lrs)


def test_a_pushed_run_names_no_path_of_this_machine(tmp_path):
    """Both stage folders of a run on a local CSV, pushed: no uploaded byte names the run's folder or data path
    (metrics.json's dataset and trainer_state.json's best checkpoint go as their names; run_settings.json, the
    resume's bookkeeping, stays home)."""
    from _fake_hub import FakeHfApi

    from hf_mlcl.hub import push_folder

    data = _tiny_csv(tmp_path / "my_data.csv")
    out = str(tmp_path / "run")
    argv = [*_run_command(tmp_path, data, out), "--max_steps", "2", "--per_device_train_batch_size", "16"]
    assert main(argv) == 0
    for stage in ("encoder", "classifier"):
        api = FakeHfApi()
        push_folder(os.path.join(out, stage), f"someone/{stage}", api=api)
        assert "metrics.json" in api.uploaded and "run_settings.json" not in api.uploaded
        leaked = [name for name, content in api.uploaded.items() if str(tmp_path).encode() in content]
        assert leaked == [], stage
        assert json.loads(api.uploaded["metrics.json"])["dataset"] == "my_data.csv"
