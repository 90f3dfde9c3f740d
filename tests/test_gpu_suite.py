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
    return subprocess.run([sys.executable, os.path.join(BENCH, "gpu_suite.py"), *args], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)  # fmt: skip


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
        assert fig["queue_size"] == (16 if fig["run"] == "msc" else 0)
        assert fig["gradcache_chunk_size"] == (0 if name.endswith(("-direct", "deepspeed")) or fig["run"] == "bce" else 2)
    throughput = json.loads((out / "throughput.json").read_text())["cells"]
    for entry in throughput.values():
        rows = entry["figures"]["rows"]
        assert set(rows) == {"contrastive", "trainer_bce", "st_mlcl", "st_mnrl"}
        assert all(r["samples_per_s"] > 0 and len(r["step_time_s"]) == 4 for r in rows.values())
        ratio = entry["figures"]["ratios"]["contrastive_over_trainer_bce"]
        assert ratio == pytest.approx(rows["contrastive"]["samples_per_s"] / rows["trainer_bce"]["samples_per_s"])
    plm = json.loads((out / "plm_icd.json").read_text())["cells"]
    for entry in plm.values():
        fig = entry["figures"]
        assert fig["segments"] == fig["seq_len"] // fig["segment_len"] == 8 and fig["documents_per_s"] > 0
    losses = json.loads((out / "losses.json").read_text())["cells"]
    assert len(losses["in-batch-fp32"]["figures"]["rows"]) == 8 * 2  # every loss at two batch sizes
    assert len(losses["keys-bf16"]["figures"]["rows"]) == 8 * 2 * 3  # ... and three label spaces
    same = json.loads((out / "gradcache.json").read_text())["cells"]["minilm-4096"]["figures"]["same_loss"]
    assert same["same"] and same["plain"] == pytest.approx(same["gradcache"], rel=1e-5)

    again = _suite("--tiny", "--only", "gradcache,plm_icd", "--out", str(out), "--cache-dir", str(cache), timeout=120)
    assert again.returncode == 0 and again.stdout.count("measured already") == 1 + 4

    page = performance_doc.render(str(tmp_path / "results"))
    for name in gpu_suite.MEASUREMENTS:
        assert f"`{name}`" in page
    assert "GPU: not yet measured" in page  # only CPU-check results in this folder
    assert "not run: accelerate applies FSDP only on accelerator devices" in page


def test_without_a_gpu_the_full_sizes_stop_with_the_way_out():
    proc = _suite("--only", "gradcache", timeout=120)
    assert proc.returncode == 2 and "--tiny" in proc.stderr
