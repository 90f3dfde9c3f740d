"""The stand-alone stage-1 throughput benchmark (benchmarks/stage1_throughput.py) runs end to end (tiny Llama +
LoRA on CPU) and prints its figures."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # the default suite runs the measurements of record: tests/test_gpu_suite.py (throughput cells)
def test_stage1_throughput_benchmark_prints_its_figures():
    cmd = [
        sys.executable,
        os.path.join(REPO, "benchmarks", "stage1_throughput.py"),
        "--model",
        "llama",
        "--llama-size",
        "tiny",
        "--steps",
        "3",
        "--warmup",
        "1",
        "--batch-size",
        "8",
        "--max-length",
        "16",
    ]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    text = out.stdout
    assert "model=llama-tiny+lora" in text and "measured_steps=3" in text
    trainable = float(re.search(r"trainable=([\d.]+)M", text).group(1))
    total = float(re.search(r"params=([\d.]+)M", text).group(1))
    assert 0 < trainable < total  # LoRA: only adapters + projection head train
    assert float(re.search(r"throughput ([\d.]+) samples/s", text).group(1)) > 0
    assert re.search(r"peak (RSS|GPU memory).* [\d.]+ GiB", text)


def test_carve_strata_prints_both_carves():
    """benchmarks/carve_strata.py (the random vs stratified validation carve) on the offline synthetic corpus."""
    cmd = [
        sys.executable,
        os.path.join(REPO, "benchmarks", "carve_strata.py"),
        "--dataset",
        "synthetic",
        "--data_dir",
        "",
        "--seeds",
        "2",
        "--rows",
        "3",
    ]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    random_row = re.search(r"random \(mean of seeds\)\s+([\d.]+)\s+([\d.]+)", text)
    strat_row = re.search(r"stratified\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)", text)
    assert random_row and strat_row, text
    assert float(strat_row.group(2)) <= 1.0 < float(random_row.group(2))  # largest deviation from the share
