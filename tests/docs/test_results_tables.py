"""docs/results/make_tables.py turns per-run metrics.json files into the RESULTS.md tables."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture()
def tables(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("make_tables", os.path.join(ROOT, "docs", "results", "make_tables.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "HERE", str(tmp_path))
    return mod


def _run(root, loss, probe, seed, micro, macro, tag=None, stage1=None, probe_s=10.0):
    cell = f"{loss}_{probe}" + (f"-{tag}" if tag else "")
    folder = root / "ds" / cell / f"seed{seed}"
    folder.mkdir(parents=True)
    wall = {"probe_s": probe_s, **({"stage1_s": stage1} if stage1 else {})}
    record = {"loss": loss, "probe": probe, "seed": seed, "tag": tag, "overrides": ["--probe.num_train_epochs", "10"] if tag else [],
              "metrics": {"test_micro_f1": micro, "test_macro_f1": macro, "validation_micro_f1": 0.5, "threshold": 0.3},
              "wall_s": wall}  # fmt: skip
    (folder / "metrics.json").write_text(json.dumps(record))


def test_summary_variants_and_runs_tables(tables, tmp_path):
    for seed, (mi, ma) in enumerate([(0.30, 0.10), (0.32, 0.12), (0.34, 0.14)], start=1):
        _run(tmp_path, "bce", "finetune", seed, mi, ma)
    _run(tmp_path, "hbl", "logistic", 1, 0.40, 0.20, stage1=30.0)
    _run(tmp_path, "bce", "finetune", 1, 0.50, 0.25, tag="10ep", probe_s=99.0)

    summary = tables.table("ds")
    bce_row = next(line for line in summary.splitlines() if line.startswith("| BCE"))
    # mean ± sample std (ddof 1) of 0.30/0.32/0.34 and 0.10/0.12/0.14; the tagged run is not mixed in
    assert "0.320 ± 0.020 (n=3)" in bce_row and "0.120 ± 0.020 (n=3)" in bce_row and "| 1,2,3 |" in bce_row
    hbl_row = next(line for line in summary.splitlines() if line.startswith("| mulsupcon + hbl"))
    assert "| 0.400 (n=1) | 0.200 (n=1) | — | — | 30 | 10 | — | 1 |" in hbl_row

    variants = tables.variants_table("ds")
    assert "finetune-10ep" in variants and "`--probe.num_train_epochs 10`" in variants and "0.500 (n=1)" in variants
    assert len(variants.splitlines()) == 3  # header, rule, one variant

    runs = tables.runs_table("ds")
    assert runs.count("\n| BCE fine-tuning") == 4 and "| finetune-10ep | 1 | 0.5000 | 0.2500 |" in runs
    assert tables.best_contrastive("ds") == ("hbl", "logistic")


def test_main_rewrites_only_the_marked_blocks(tables, tmp_path, monkeypatch):
    _run(tmp_path, "hbl", "logistic", 1, 0.40, 0.20, stage1=30.0)
    md = tmp_path / "RESULTS.md"
    md.write_text("intro\n<!-- TABLE:ds -->\nold table\n<!-- /TABLE:ds -->\noutro\n")
    monkeypatch.setattr(tables, "RESULTS_MD", str(md))
    monkeypatch.setattr(tables, "f1_plot", lambda d: None)
    tables.main([])
    text = md.read_text()
    assert text.startswith("intro\n<!-- TABLE:ds -->\n| stage 1 loss") and text.endswith("<!-- /TABLE:ds -->\noutro\n")
    assert "old table" not in text and "0.400 (n=1)" in text
    assert (tmp_path / "ds" / "runs.md").read_text().count("| mulsupcon + hbl | logistic | 1 |") == 1
