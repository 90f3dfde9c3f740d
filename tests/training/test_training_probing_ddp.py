"""Cached linear probe under two processes (torchrun, gloo on CPU): every process trains on its own shard
of the cached features (no row twice, none missing), and the head equals the one-process head on the
concatenated batches and the two-process head trained on the texts (no duplicated gradient); features
saved to a feature_cache_dir by two processes are read back by two processes and by one."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
import torch
from _training_helpers import run_two_processes, tiny_encoder, tiny_tokenizer

from hf_mlcl.modeling import MLCLForMultiLabelClassification

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "_ddp_probe_worker.py")


@pytest.mark.slow  # the fast version: tests/cli/test_cli_multinode.py (a cached linear probe on two processes)
@pytest.mark.timeout(300)
def test_two_process_cached_probe_shards_rows_and_matches_one_process(tmp_path):
    tok = tiny_tokenizer()
    tok.save_pretrained(tmp_path / "tok")
    torch.manual_seed(0)
    clf = MLCLForMultiLabelClassification.from_encoder(tiny_encoder(tok), num_labels=4, freeze_encoder=True)
    clf.save_pretrained(tmp_path / "init")
    run_two_processes(WORKER, str(tmp_path), timeout=280)
    sys.path.insert(0, HERE)
    from _ddp_probe_worker import N_TRAIN, run

    two = {
        (c, r): torch.load(tmp_path / f"cache-{c}-rank{r}.pt", weights_only=False)
        for c in (True, False)
        for r in (0, 1)
    }
    one = run(str(tmp_path), True, per_device=8)  # one process, the same 8-row optimizer steps
    assert one["world"] == 1 and one["cached"] and all(two[(True, r)]["cached"] for r in (0, 1))
    assert not two[(False, 0)]["cached"]
    # each process trained on its own 4 rows of every 8-row step: together exactly the rows one process saw
    seen = [torch.cat(two[(True, r)]["seen"]) for r in (0, 1)]
    assert seen[0].shape == seen[1].shape == (N_TRAIN // 2, 32)
    assert torch.cdist(seen[0], seen[1]).min() > 1e-4  # disjoint shards
    ref = torch.cat(one["seen"])
    assert ref.shape == (N_TRAIN, 32)
    merged = torch.cat([torch.cat([a, b]) for a, b in zip(two[(True, 0)]["seen"], two[(True, 1)]["seen"])])
    torch.testing.assert_close(merged, ref, rtol=1e-5, atol=1e-6)
    for key, value in one["head"].items():
        for cache in (True, False):
            for r in (0, 1):
                torch.testing.assert_close(two[(cache, r)]["head"][key], value, rtol=1e-5, atol=1e-6)
    for cache in (True, False):  # evaluation and prediction gather the whole split on every process
        for r in (0, 1):
            got = two[(cache, r)]
            for key in ("eval_micro_f1", "eval_macro_f1", "eval_p@1", "eval_micro_auc"):
                assert got["eval"][key] == pytest.approx(one["eval"][key], rel=1e-5), key
            # eval_loss averages per-process batch losses (the padded tail batch counts): compare like with like
            assert got["eval"]["eval_loss"] == pytest.approx(two[(False, 0)]["eval"]["eval_loss"], rel=1e-5)
            np.testing.assert_allclose(got["scores"], one["scores"], rtol=1e-5, atol=1e-6)
            assert np.array_equal(got["truth"], one["truth"])
    # features on disk: two processes write one file per split, then read every split back; a one-process
    # run finds the same keys (the key does not depend on the sharding) and trains the same head
    store = tmp_path / "features"
    assert len(os.listdir(store)) == 3
    for r in (0, 1):
        written = torch.load(tmp_path / f"store-write-rank{r}.pt", weights_only=False)
        read = torch.load(tmp_path / f"store-read-rank{r}.pt", weights_only=False)
        assert written["encoded_rows"] > 0 and read["encoded_rows"] == 0
        for key, value in one["head"].items():
            torch.testing.assert_close(read["head"][key], value, rtol=1e-5, atol=1e-6)
    solo = run(str(tmp_path), True, per_device=8, store=str(store), name="solo")
    assert solo["encoded_rows"] == 0 and len(os.listdir(store)) == 3
    for key, value in one["head"].items():
        torch.testing.assert_close(solo["head"][key], value, rtol=1e-5, atol=1e-6)
