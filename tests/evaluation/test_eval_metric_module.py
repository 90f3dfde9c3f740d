"""The `evaluate` metric module: offline local-path loading, compute / add_batch, combine."""

from __future__ import annotations

import os
import textwrap

import numpy as np
import pytest

from hf_mlcl.evaluation import METRIC_PATH, compute_multilabel_metrics

evaluate = pytest.importorskip("evaluate")


def _data(seed=0):
    rng = np.random.default_rng(seed)
    y = (rng.random((30, 6)) < 0.3).astype(np.int32)
    s = np.clip(rng.random((30, 6)) * 0.7 + 0.3 * y, 0, 1).astype(np.float32)
    return y, s


def test_metric_path_is_a_shipped_module_folder():
    assert os.path.isdir(METRIC_PATH)
    script = os.path.join(METRIC_PATH, os.path.basename(METRIC_PATH) + ".py")
    assert os.path.isfile(script)
    # an __init__.py makes the folder a package, so setuptools' find_packages ships the script
    assert os.path.isfile(os.path.join(METRIC_PATH, "__init__.py"))
    from setuptools import find_packages

    root = os.path.dirname(os.path.dirname(os.path.dirname(METRIC_PATH)))
    assert "hf_mlcl.evaluation.multilabel_metric" in find_packages(root, include=["hf_mlcl*"])


def test_load_offline_and_compute_matches_function():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    metric = evaluate.load(METRIC_PATH)
    assert metric.name == "multilabel_metric"
    y, s = _data()
    out = metric.compute(predictions=s.tolist(), references=y.tolist())
    ref = compute_multilabel_metrics(y, s)
    assert set(out) == set(ref)
    for key in ref:
        assert out[key] == pytest.approx(ref[key], nan_ok=True), key


def test_add_batch_kwargs_and_load_time_defaults():
    y, s = _data(1)
    metric = evaluate.load(METRIC_PATH)
    for i in range(0, 30, 10):
        metric.add_batch(predictions=s[i : i + 10], references=y[i : i + 10])
    out = metric.compute(threshold=0.3, ks=(2,))
    ref = compute_multilabel_metrics(y, s, threshold=0.3, ks=(2,))
    assert out == pytest.approx(ref, nan_ok=True)
    assert "p@2" in out and "p@5" not in out

    logits = np.log(s / (1 - s + 1e-6) + 1e-6).astype(np.float32)
    m2 = evaluate.load(METRIC_PATH, threshold=0.3, from_logits=True)
    out2 = m2.compute(predictions=logits, references=y)
    assert out2["micro_f1"] == pytest.approx(ref["micro_f1"], abs=1e-6)


def test_combine_with_another_local_module(tmp_path):
    other = tmp_path / "row_exact"
    other.mkdir()
    (other / "row_exact.py").write_text(
        textwrap.dedent(
            """
            import datasets
            import evaluate
            import numpy as np


            class RowExact(evaluate.Metric):
                def _info(self):
                    return evaluate.MetricInfo(
                        description="fraction of rows predicted exactly at 0.5",
                        citation="",
                        inputs_description="",
                        features=datasets.Features(
                            {
                                "predictions": datasets.Sequence(datasets.Value("float32")),
                                "references": datasets.Sequence(datasets.Value("int32")),
                            }
                        ),
                    )

                def _compute(self, predictions, references, **kwargs):
                    p = np.asarray(predictions) >= 0.5
                    return {"row_exact": float(np.mean(np.all(p == np.asarray(references).astype(bool), axis=1)))}
            """
        )
    )
    combined = evaluate.combine([METRIC_PATH, str(other)])
    y, s = _data(2)
    out = combined.compute(predictions=s.tolist(), references=y.tolist())
    assert out["row_exact"] == pytest.approx(out["subset_accuracy"])
    assert out["micro_f1"] == pytest.approx(compute_multilabel_metrics(y, s)["micro_f1"])
