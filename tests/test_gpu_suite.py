"""benchmarks/gpu_suite.py proven on the CPU: ``--tiny`` runs every measurement at toy sizes through the same
runner, launchers and JSON files as on a GPU, and docs/PERFORMANCE.md is generated from the results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(REPO, "benchmarks")
sys.path.insert(0, BENCH)

import gpu_suite  # noqa: E402
import performance_doc  # noqa: E402
from measurements import llama_lora  # noqa: E402
from measurements.common import LLAMA_31_8B  # noqa: E402


def _suite(*args: str, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MLCL_GIT_COMMIT": "test"}
    env.pop("MLCL_SUITE_MIRROR", None)
    return subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu_suite.py"), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=REPO,
    )


def test_llama_flops_and_lora_sizes_are_the_architecture_s():
    """N of Llama-3.1-8B's decoder matmuls and its r-16 LoRA pairs on the seven projections, by hand."""
    per_layer = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336
    assert per_layer * 32 == 6_979_321_856
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    lora = 32 * 16 * (2 * (4096 + 4096) + 2 * (4096 + 1024) + 2 * (4096 + 14336) + (14336 + 4096))
    assert llama_lora.lora_parameters(LLAMA_31_8B, 16, targets) == lora == 41_943_040
    plain = llama_lora.flops_per_token(LLAMA_31_8B, 512, 16, targets, key_forward=False)
    forward = 2 * 6_979_321_856 + 4 * 32 * 512 * 4096 + 2 * lora
    assert plain["forward_flops_per_token"] == forward
    assert plain["flops_per_token"] == 2 * forward + 2 * lora
    assert llama_lora.flops_per_token(LLAMA_31_8B, 512, 16, targets, key_forward=True)["flops_per_token"] == (
        plain["flops_per_token"] + forward
    )
    # what the device runs: + one forward for checkpointing's recomputation, + one for GradCache's first pass
    fig = {**plain, "activation_checkpointing": True, "gradcache_chunk_size": 8}
    assert llama_lora.hardware_flops_per_token(fig) == 4 * forward + 2 * lora
    assert llama_lora.hardware_flops_per_token({**fig, "gradcache_chunk_size": 0}) == 3 * forward + 2 * lora
    no_recompute = {**fig, "gradcache_chunk_size": 0, "activation_checkpointing": False}
    assert llama_lora.hardware_flops_per_token(no_recompute) == 2 * forward + 2 * lora
    # checkpointing on every 4th layer (every_n_layers 4): a quarter of a forward recomputed
    every_4th = {**fig, "gradcache_chunk_size": 0, "checkpointed_layers": 8, "layers": 32}
    assert llama_lora.hardware_flops_per_token(every_4th) == 2.25 * forward + 2 * lora


def test_the_committed_performance_page_is_generated_from_the_committed_results():
    assert performance_doc.main(["--check"]) == 0


def test_the_performance_page_keeps_the_results_study_part_that_follows_its_mark(tmp_path, monkeypatch):
    """performance_doc owns the page up to STUDY_MARK; studies/make_tables.py writes the rest (the training
    cost of the results study): --check reads the first part only, and a rewrite keeps the second."""
    doc = tmp_path / "PERFORMANCE.md"
    monkeypatch.setattr(performance_doc, "DOC", str(doc))
    study = f"{performance_doc.STUDY_MARK}\n\n## Training cost\n\n| a | b |\n"
    doc.write_text(performance_doc.render() + "\n" + study)
    assert performance_doc.main(["--check"]) == 0
    doc.write_text("# stale\n\n" + study)
    assert performance_doc.main(["--check"]) == 1
    assert performance_doc.main([]) == 0
    text = doc.read_text()
    assert text.endswith(study) and text.startswith(performance_doc.render())
    assert performance_doc.main(["--check"]) == 0


def test_the_goals_read_every_gpus_cells_and_the_recipes_batch_only():
    """The sharded-save row listed one GPU's cell of a name, whichever folder came last; the 80 GB row counted
    the -fit141 cells, whose batch the memory model sizes for a 141 GiB GPU; a CPU page said "2 shared cores"
    for results run on one thread."""
    import copy

    results = performance_doc.load(os.path.join(BENCH, "results"))
    folders = results["llama_lora"]
    first = next(k for k, d in folders.items() if d["device"]["kind"] == "cuda")
    # the first GPU's folder read last instead: the same rows
    renamed = {
        **results,
        "llama_lora": {**{k: d for k, d in folders.items() if k != first}, first: folders[first]},
    }
    assert performance_doc.goals(renamed) == performance_doc.goals(results)
    sharded = [
        (d["device"]["name"], c)
        for d in results["llama_lora"].values()
        if d["device"]["kind"] == "cuda"
        for c, e in d["cells"].items()
        if e.get("launcher") in ("fsdp", "deepspeed")
    ]
    row = next(line for line in performance_doc.goals(results) if "FSDP and ZeRO-3" in line)
    assert all(f"{c} " in row and name in row for name, c in sharded) and len(set(sharded)) > len(
        {c for _, c in sharded}
    )

    msc = next(
        (c, e)
        for d in results["llama_lora"].values()
        for c, e in d["cells"].items()
        if d["device"]["kind"] == "cuda"
        and (e.get("figures") or {}).get("run") == "msc"
        and e["figures"]["launcher"] == "plain"
    )
    big = copy.deepcopy(results)
    cells = next(d for d in big["llama_lora"].values() if d["device"]["kind"] == "cuda")["cells"]
    cells["msc-plain-fit141"] = copy.deepcopy(msc[1])
    cells["msc-plain-fit141"]["figures"]["peak_memory"]["reserved_gib"] = 123.7
    fit_row = next(
        line for line in performance_doc.goals(big) if "fits one 80 GB GPU at the recipe's batch" in line
    )
    assert (
        "msc-plain-fit141" not in fit_row
        and fit_row.rstrip(" |").endswith("met")
        and "not met" not in fit_row
    )

    cpu = next(d for d in results["llama_lora"].values() if d["device"]["kind"] != "cuda")
    threads = cpu["device"]["threads"]
    assert f"{threads} thread" in "".join(performance_doc.provenance(cpu, "cpu-tiny"))


@pytest.mark.slow  # runs every cell of the tiny suite; the planner and the page have fast tests of their own
@pytest.mark.timeout(420)
def test_tiny_suite_measures_every_cell_on_the_cpu_and_skips_what_is_measured(tmp_path):
    out, cache = tmp_path / "results" / "cpu-tiny", tmp_path / "cache"
    proc = _suite("--tiny", "--out", str(out), "--cache-dir", str(cache), timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in gpu_suite.MEASUREMENTS:
        data = json.loads((out / f"{name}.json").read_text())
        assert data["tiny"] is True and data["device"]["kind"] == "cpu" and data["complete"] is True
        assert data["git_commit"] == "test" and data["versions"]["torch"]
        for cell in gpu_suite.measurement(name).cells(True):
            entry = data["cells"][cell.name]
            if cell.cpu_reason:  # FSDP: accelerate never applies it to CPU processes; said, not hidden
                assert entry == {"status": "not_run", "launcher": cell.launcher, "reason": cell.cpu_reason}
                continue
            assert entry["status"] == "ok", (name, cell.name, entry.get("error"))
            assert all(entry["figures"].get("checks", {}).values())
    llama = json.loads((out / "llama_lora.json").read_text())["cells"]
    for name, entry in llama.items():
        if entry["status"] != "ok":
            continue
        fig = entry["figures"]
        assert fig["wrapper"] == ("DeepSpeedEngine" if name.endswith("deepspeed") else "PeftModel")
        assert fig["reload"]["same"] and fig["reload"]["max_abs_diff"] <= 1e-5
        assert 0 < fig["trainable_parameters"] < fig["parameters"]
        assert set(fig["trainable_dtypes"]["lora"]) == {"float32"}  # fp32 on the CPU, under DeepSpeed too
        assert fig["queue_size"] == (16 if fig["run"] == "msc" else 0)
        fit = "-fit" in name  # the levers predicted fastest: no GradCache, LoRA dropout 0, every k-th layer
        assert fig["gradcache_chunk_size"] == (
            0 if name.endswith(("-direct", "deepspeed")) or fig["run"] == "bce" or fit else 2
        )
        if fit:
            every = llama_lora.fit_params(fig["run"], name.rsplit("-", 1)[1])["every_n_layers"]
            assert fig["lora"]["dropout"] == 0.0 and fig["every_n_layers"] == every
            assert fig["checkpointed_layers"] == -(-fig["layers"] // every)
    throughput = json.loads((out / "throughput.json").read_text())["cells"]
    for entry in throughput.values():
        rows = entry["figures"]["rows"]
        assert set(rows) == {"contrastive", "trainer_bce", "st_mlcl", "st_mnrl"}
        assert all(r["samples_per_s"] > 0 and len(r["step_time_s"]) == 4 for r in rows.values())
        for r in rows.values():  # one profiled step per row: aten operators and where the host time went
            profile = r["profile"]
            assert profile["kernels"] is None and profile["operators"] > 100 and profile["host_ms"] > 0, (
                profile
            )
            assert profile["top"] and all(calls >= 1 and ms >= 0 for _, calls, ms in profile["top"])
        ratio = entry["figures"]["ratios"]["contrastive_over_trainer_bce"]
        assert ratio == pytest.approx(
            rows["contrastive"]["samples_per_s"] / rows["trainer_bce"]["samples_per_s"]
        )
    plm = json.loads((out / "plm_icd.json").read_text())["cells"]
    for entry in plm.values():
        fig = entry["figures"]
        assert fig["segments"] == fig["seq_len"] // fig["segment_len"] == 8 and fig["documents_per_s"] > 0
    losses = json.loads((out / "losses.json").read_text())["cells"]
    assert len(losses["in-batch-fp32"]["figures"]["rows"]) == 8 * 2  # every loss at two batch sizes
    assert len(losses["keys-bf16"]["figures"]["rows"]) == 8 * 2 * 3  # ... and three label spaces
    compiled = losses["in-batch-compiled"]["figures"]["rows"]  # the losses above plain SupCon, compiled
    assert [r["loss"] for r in compiled] == ["hbl", "msc", "ws_mulsupcon"]
    assert all(r["compile_s"] > 0 and r["compiled_ms"] > 0 and r["plain_compiled_ms"] > 0 for r in compiled)
    same = json.loads((out / "gradcache.json").read_text())["cells"]["minilm-4096"]["figures"]["same_loss"]
    assert same["same"] and same["plain"] == pytest.approx(same["gradcache"], rel=1e-5)

    again = _suite(
        "--tiny", "--only", "gradcache,plm_icd", "--out", str(out), "--cache-dir", str(cache), timeout=120
    )
    assert again.returncode == 0 and again.stdout.count("measured already") == 1 + 4

    page = performance_doc.render(str(tmp_path / "results"))
    for name in gpu_suite.MEASUREMENTS:
        assert f"`{name}`" in page
    assert "GPU: not yet measured" in page  # only CPU-check results in this folder
    assert "not run: accelerate applies FSDP only on accelerator devices" in page


@pytest.mark.slow  # keeps the default suite within its 10 minutes (make test-slow)
def test_without_a_gpu_the_full_sizes_stop_with_the_way_out():
    proc = _suite("--only", "gradcache", timeout=120)
    assert proc.returncode == 2 and "--tiny" in proc.stderr


def test_a_cell_that_raises_in_a_shared_tiny_process_fails_alone(tmp_path, monkeypatch):
    """--tiny runs a measurement's plain cells in one process: a cell that raises is failed with its own
    error, the cells beside it keep their figures, and the child's exit status says that one raised."""
    from measurements.common import Cell

    def breaks_deep_inside():
        raise ValueError("cell a broke")

    def run(cell, tiny, cache_dir):
        if cell.name == "a":
            breaks_deep_inside()
        return {"x": 1.0, "checks": {"fine": True}}

    fake = type(
        "Fake", (), {"cells": staticmethod(lambda tiny: [Cell("a"), Cell("b")]), "run": staticmethod(run)}
    )
    monkeypatch.setattr(gpu_suite, "measurement", lambda name: fake)
    assert gpu_suite.run_cells("fake/a,b", True, str(tmp_path), str(tmp_path)) == 1
    written = {p.name: json.loads(p.read_text()) for p in tmp_path.glob("*.json")}
    assert written["a.json"]["_raised"] == "ValueError: cell a broke"
    assert written["b.json"]["x"] == 1.0 and written["b.json"]["_seconds"] >= 0

    # the parent reads the shared process's files: b measured, a failed with its error, though the child exited 1
    def replay(name, cells, tiny, result_dir, cache_dir):
        copy = (
            "import shutil, sys; [shutil.copy(p, sys.argv[2]) for p in sys.argv[1].split(',')]; sys.exit(1)"
        )
        return [sys.executable, "-c", copy, f"{tmp_path}/a.json,{tmp_path}/b.json", result_dir]

    monkeypatch.setattr(gpu_suite, "cell_command", replay)
    entries = dict(
        (cell.name, entry) for cell, entry in gpu_suite.run_group("fake", fake.cells(True), True, "x")
    )
    assert entries["b"]["status"] == "ok" and entries["b"]["figures"] == {"x": 1.0, "checks": {"fine": True}}
    assert entries["a"]["status"] == "failed" and entries["a"]["error"] == "ValueError: cell a broke"
    # where it was raised travels with the error (a log's tail can hold one long message and no frame)
    where = [(f.split(":")[0], f.split(":")[2]) for f in entries["a"]["traceback"][-2:]]
    assert where == [(os.path.basename(__file__), "run"), (os.path.basename(__file__), "breaks_deep_inside")]
    long = gpu_suite.short_error(
        RuntimeError("tensor([" + "1.0, " * 5000 + "]) Cannot partition a param in flight")
    )
    assert len(long) < 420 and long.startswith("RuntimeError: tensor([") and long.endswith("param in flight")
    assert entries["a"]["process"] == entries["b"]["process"] == "shared by 2 cells (--tiny)"
    # on a GPU every cell runs alone; --tiny groups the plain cells and keeps each launcher's cell apart
    cells = [Cell("p1"), Cell("d", launcher="deepspeed"), Cell("p2")]
    assert [[c.name for c in g] for g in gpu_suite.launch_groups(cells, tiny=False)] == [
        ["p1"],
        ["d"],
        ["p2"],
    ]
    assert [[c.name for c in g] for g in gpu_suite.launch_groups(cells, tiny=True)] == [["p1", "p2"], ["d"]]


def test_the_saved_weights_check_sees_a_changed_or_missing_tensor():
    """llama_lora compares the reloaded adapter's tensors with the trained ones: a wrong save (a changed
    value, a tensor left out) shows there even where the outputs could differ for other reasons."""
    import torch

    model = torch.nn.Linear(3, 2)
    trained = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    assert llama_lora._weights_distance(model, trained) | {"missing_example": []} == {
        "tensors": 2,
        "missing": 0,
        "missing_example": [],
        "max_abs_diff": 0.0,
        "max_rel_diff": 0.0,
    }
    with torch.no_grad():
        model.weight[0, 0] += 0.5
    seen = llama_lora._weights_distance(model, {**trained, "lost.weight": torch.zeros(1)})
    assert seen["missing"] == 1 and seen["missing_example"] == ["lost.weight"]
    assert seen["max_abs_diff"] == pytest.approx(0.5)
    assert seen["max_rel_diff"] == pytest.approx(0.5 / float(trained["weight"].abs().max()), rel=1e-6)
