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


def test_padding_share_counts_padding_and_attention_work():
    """benchmarks/padding_share.py's figures on rows of known lengths."""
    import numpy as np

    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    from padding_share import batch_figures

    lengths = np.array([4, 2, 3, 1])
    # batches [4, 2] and [3, 1]: 10 real tokens of 2 * 4 + 2 * 3 = 14; attention 16 + 4 + 9 + 1 = 30 of 32 + 18
    figures = batch_figures(lengths, np.arange(4), batch=2)
    assert figures["padding_share"] == pytest.approx(4 / 14)
    assert figures["tokens_packed_over_padded"] == pytest.approx(10 / 14)
    assert figures["attention_packed_over_padded"] == pytest.approx(30 / 50)
    assert batch_figures(lengths, np.array([0, 2, 1, 3]), batch=2)["padding_share"] == pytest.approx(2 / 12)
