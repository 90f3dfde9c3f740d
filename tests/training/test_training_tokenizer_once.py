"""A tokenizer trained on the fly under several processes: trained once, by the global main process, and
sent to the others (every node gets the same vocabulary without racing for shared storage)."""

from __future__ import annotations

import json
import os

import pytest
from _training_helpers import run_two_processes

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_tokenizer_once_worker.py")


@pytest.mark.slow  # two torchrun processes; the two-node tests see the result (the same features on every node)
@pytest.mark.timeout(300)
def test_the_tokenizer_is_trained_once_and_every_process_gets_it(tmp_path):
    run_two_processes(WORKER, str(tmp_path), timeout=280)
    ranks = [json.load(open(tmp_path / f"rank{r}.json", encoding="utf-8")) for r in (0, 1)]
    assert [r["calls"] for r in ranks] == [1, 0]
    assert ranks[0]["vocab"] == ranks[1]["vocab"] and ranks[0]["ids"] == ranks[1]["ids"]
    assert ranks[0]["vocab_size"] == ranks[1]["vocab_size"] == len(ranks[0]["vocab"])  # the embedding fits it
