"""Atomic writes: one helper (unique temp name, fsync, os.replace) behind every file hf_mlcl writes itself."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import hf_mlcl.files as files
from hf_mlcl.files import TMP_PREFIX, atomic_path, atomic_write_text


@pytest.fixture
def recorded(monkeypatch):
    """Every fsync and os.replace made through hf_mlcl.files, in order, as (what, path)."""
    calls: list[tuple[str, str]] = []
    real_fsync, real_replace = files._fsync, os.replace

    def fsync(path):
        calls.append(("fsync", path))
        real_fsync(path)

    def replace(src, dst):
        calls.append(("replace", os.fspath(src)))
        real_replace(src, dst)

    monkeypatch.setattr(files, "_fsync", fsync)
    monkeypatch.setattr(files.os, "replace", replace)
    return calls


def _went_through_the_helper(calls, target) -> None:
    """One unique TMP_PREFIX temp file beside ``target``, flushed before it is renamed onto it."""
    assert [what for what, _ in calls] == ["fsync", "replace"]
    tmp = calls[0][1]
    assert calls[1][1] == tmp
    assert os.path.dirname(tmp) == os.path.dirname(os.path.abspath(target))
    assert os.path.basename(tmp).startswith(TMP_PREFIX)
    assert not os.path.exists(tmp) and os.path.isfile(target)


def test_atomic_path_replaces_on_success_and_leaves_the_old_file_on_error(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    atomic_write_text(str(target), "one")
    assert target.read_text() == "one"
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~files._umask())  # not mkstemp's 0600
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            open(tmp, "w").write("half")
            raise RuntimeError("killed")
    assert target.read_text() == "one"
    assert os.listdir(target.parent) == ["a.txt"]  # no temp file left


def test_two_writers_get_two_temp_names(tmp_path):
    with atomic_path(tmp_path / "x") as first, atomic_path(tmp_path / "x") as second:
        assert first != second


def test_the_trainer_state_file_is_written_through_the_helper(tmp_path, recorded):
    from hf_mlcl.training.state_file import load_state_file, save_state_file

    path = str(tmp_path / "state.safetensors")
    save_state_file({"queue": {"ptr": 3, "embeddings": torch.ones(2, 2)}}, path)
    _went_through_the_helper(recorded, path)
    assert load_state_file(path)["queue"]["ptr"] == 3


def test_pooled_features_are_written_through_the_helper(tmp_path, recorded):
    from hf_mlcl.training.features import FeatureStore, PooledFeatureDataset

    store = FeatureStore(tmp_path / "features")
    features = PooledFeatureDataset(torch.ones(2, 3), np.array([0, 1, 2]), np.array([0, 1]))
    path = store.save("ab" * 32, features)
    _went_through_the_helper(recorded, path)
    assert len(store.load("ab" * 32, 2)) == 2
