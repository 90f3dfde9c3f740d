"""compute_multilabel_metrics against scikit-learn and hand-computed values (loops allowed here)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn import metrics as skm

import hf_mlcl.evaluation.inputs as inp
import hf_mlcl.evaluation.ranking as rk
from hf_mlcl.evaluation import (
    METRIC_KEYS,
    apply_threshold,
    compute_multilabel_metrics,
    make_compute_metrics,
    metric_keys,
    per_label_f1,
    predictions_to_scores,
    sigmoid,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _data(n=40, num_labels=11, seed=0, ties=False):
    rng = np.random.default_rng(seed)
    y = rng.random((n, num_labels)) < 0.3
    y[:, 2] = False  # never positive
    y[0] = False  # an example without labels
    s = rng.random((n, num_labels))
    s = s + 0.4 * y  # informative scores
    s = np.clip(s / 1.4, 0, 1)
    if ties:
        s = np.round(s, 1)
    return y, s.astype(np.float32)


def _ref_topk(y, s, k):
    """CAML's precision_at_k / recall_at_k, spelled out."""
    p, r = [], []
    for i in range(y.shape[0]):
        top = np.argsort(-s[i], kind="stable")[:k]
        hits = y[i, top].sum()
        p.append(hits / len(top))
        r.append(hits / y[i].sum() if y[i].sum() else 0.0)
    return np.mean(p), np.mean(r)


def _ref_rprec(y, s):
    vals = []
    for i in range(y.shape[0]):
        r = int(y[i].sum())
        vals.append(y[i, np.argsort(-s[i], kind="stable")[:r]].sum() / r if r else 0.0)
    return np.mean(vals)


def _sklearn_reference(y, s, thr=0.5):
    pred = s >= np.float32(thr) if np.isscalar(thr) else s >= np.asarray(thr, dtype=s.dtype)
    ref = {}
    for avg in ("micro", "macro"):
        p, r, f, _ = skm.precision_recall_fscore_support(y, pred, average=avg, zero_division=0)
        ref[f"{avg}_precision"], ref[f"{avg}_recall"], ref[f"{avg}_f1"] = p, r, f
    mp, mr = ref["macro_precision"], ref["macro_recall"]
    ref["macro_f1_harmonic"] = 2 * mp * mr / (mp + mr) if mp + mr else 0.0
    ref["micro_auc"] = skm.roc_auc_score(y.ravel(), s.ravel())
    both = [j for j in range(y.shape[1]) if 0 < y[:, j].sum() < y.shape[0]]
    ref["macro_auc"] = np.mean([skm.roc_auc_score(y[:, j], s[:, j]) for j in both])
    has_pos = [j for j in range(y.shape[1]) if y[:, j].any()]
    ref["map_label"] = np.mean([skm.average_precision_score(y[:, j], s[:, j]) for j in has_pos])
    ref["map_example"] = np.mean(
        [skm.average_precision_score(y[i], s[i]) if y[i].any() else 0.0 for i in range(y.shape[0])]
    )
    ref["hamming_loss"] = skm.hamming_loss(y, pred)
    ref["example_f1"] = skm.f1_score(y, pred, average="samples", zero_division=0)
    ref["subset_accuracy"] = skm.accuracy_score(y, pred)
    ref["r_precision"] = _ref_rprec(y, s)
    for k in (1, 5, 8, 15):
        ref[f"p@{k}"], ref[f"r@{k}"] = _ref_topk(y, s, k)
    return ref


def test_keys_are_the_contract():
    y, s = _data()
    out = compute_multilabel_metrics(y, s)
    assert list(out) == list(METRIC_KEYS) == metric_keys((1, 5, 8, 15))
    for key in ("macro_f1", "macro_f1_harmonic", "p@8", "r@15", "map_label", "map_example", "r_precision"):
        assert key in out
    assert all(isinstance(v, float) for v in out.values())
    assert list(compute_multilabel_metrics(y, s, ks=(3,))) == metric_keys((3,))


@pytest.mark.parametrize("ties", [False, True])
def test_against_sklearn(ties):
    y, s = _data(ties=ties)
    out = compute_multilabel_metrics(y, s)
    ref = _sklearn_reference(y, s)
    for key, value in ref.items():
        if key.startswith(("p@", "r@", "r_precision")) and ties:
            continue  # sklearn's argsort orders tied labels by position; ours averages over their orders
        assert out[key] == pytest.approx(value, abs=1e-12), key


def test_per_label_threshold_array_matches_sklearn():
    y, s = _data(seed=3)
    thr = np.linspace(0.2, 0.8, y.shape[1])
    out = compute_multilabel_metrics(y, s, threshold=thr)
    ref = _sklearn_reference(y, s, thr)
    for key in ("micro_f1", "macro_f1", "example_f1", "hamming_loss", "subset_accuracy"):
        assert out[key] == pytest.approx(ref[key], abs=1e-12), key


def test_two_macro_f1_definitions_differ_and_are_named():
    # label 0: P=1, R=1/2 ; label 1: P=1/2, R=1
    y = np.array([[1, 0], [1, 0], [0, 1], [0, 0]])
    s = np.array([[0.9, 0.1], [0.2, 0.1], [0.1, 0.9], [0.1, 0.9]])
    out = compute_multilabel_metrics(y, s, ks=(1,))
    assert out["macro_precision"] == pytest.approx(0.75)
    assert out["macro_recall"] == pytest.approx(0.75)
    assert out["macro_f1"] == pytest.approx(2 / 3)  # mean of per-label F1 = (2/3 + 2/3) / 2
    assert out["macro_f1_harmonic"] == pytest.approx(0.75)  # 2 * .75 * .75 / 1.5


def test_hand_computed_small_case():
    y = np.array([[1, 0, 1, 0], [0, 1, 0, 0]])
    s = np.array([[0.8, 0.6, 0.3, 0.1], [0.2, 0.7, 0.9, 0.4]])
    out = compute_multilabel_metrics(y, s, ks=(1, 2))
    # predictions >= .5: row0 {0,1}, row1 {1,2}; TP = 2 (0 in row0, 1 in row1), FP = 2, FN = 1
    assert out["micro_precision"] == pytest.approx(2 / 4)
    assert out["micro_recall"] == pytest.approx(2 / 3)
    assert out["micro_f1"] == pytest.approx(4 / 7)
    # per-label F1: l0 1, l1 2/3, l2 0, l3 0 (never positive, never predicted -> 0)
    assert out["macro_f1"] == pytest.approx((1 + 2 / 3) / 4)
    assert out["hamming_loss"] == pytest.approx(3 / 8)
    assert out["example_f1"] == pytest.approx((2 * 1 / 4 + 2 * 1 / 3) / 2)
    assert out["subset_accuracy"] == 0.0
    # rankings: row0 0,1,2,3 ; row1 2,1,3,0
    assert out["p@1"] == pytest.approx((1 + 0) / 2)
    assert out["p@2"] == pytest.approx((1 / 2 + 1 / 2) / 2)
    assert out["r@1"] == pytest.approx((1 / 2 + 0) / 2)
    assert out["r@2"] == pytest.approx((1 / 2 + 1) / 2)
    assert out["r_precision"] == pytest.approx((1 / 2 + 0) / 2)  # R=2 -> {0,1}: 1 hit; R=1 -> {2}: 0
    # example AP: row0 hits at ranks 1 and 3 -> (1 + 2/3)/2 ; row1 hit at rank 2 -> 1/2
    assert out["map_example"] == pytest.approx(((1 + 2 / 3) / 2 + 1 / 2) / 2)
    # label AP (label 3 skipped): l0 1, l1 1, l2 rank 2 -> 1/2
    assert out["map_label"] == pytest.approx((1 + 1 + 0.5) / 3)
    # label AUC (label 3 has no positive, skipped): l0 1, l1 1, l2 0
    assert out["macro_auc"] == pytest.approx(2 / 3)
    assert out["micro_auc"] == pytest.approx(skm.roc_auc_score(y.ravel(), s.ravel()))


def test_label_never_positive():
    y, s = _data(seed=5)
    y[:, 3] = True  # never negative
    out = compute_multilabel_metrics(y, s)
    # dropping the never-positive label (2) and never-negative label (3) leaves the AUC mean unchanged
    keep = [j for j in range(y.shape[1]) if j not in (2, 3)]
    sub = compute_multilabel_metrics(y[:, keep], s[:, keep])
    assert out["macro_auc"] == pytest.approx(sub["macro_auc"])
    keep_ap = [j for j in range(y.shape[1]) if j != 2]
    assert out["map_label"] == pytest.approx(
        compute_multilabel_metrics(y[:, keep_ap], s[:, keep_ap])["map_label"]
    )
    # but it counts (as 0) in macro F1 when the label is predicted somewhere, and as zero_division otherwise
    f1 = per_label_f1(y, s >= 0.5)
    assert f1[2] == 0.0
    assert out["macro_f1"] == pytest.approx(f1.mean())
    s2 = s.copy()
    s2[:, 2] = 0.0  # never predicted either -> 0/0
    assert per_label_f1(y, s2 >= 0.5, zero_division=1.0)[2] == 1.0
    o0 = compute_multilabel_metrics(y, s2)
    o1 = compute_multilabel_metrics(y, s2, zero_division=1.0)
    assert o1["macro_f1"] - o0["macro_f1"] == pytest.approx(1.0 / y.shape[1])


def test_all_zero_predictions():
    y, _ = _data(seed=1)
    s = np.zeros(y.shape, dtype=np.float32)
    out = compute_multilabel_metrics(y, s)
    assert out["micro_precision"] == 0.0 and out["micro_recall"] == 0.0 and out["micro_f1"] == 0.0
    assert out["macro_f1"] == 0.0 and out["macro_f1_harmonic"] == 0.0 and out["example_f1"] == 0.0
    assert out["micro_auc"] == pytest.approx(0.5) and out["macro_auc"] == pytest.approx(0.5)
    assert out["hamming_loss"] == pytest.approx(y.sum() / y.size)
    assert out["subset_accuracy"] == pytest.approx(np.mean(~y.any(axis=1)))
    # all labels tied: AP of a label = its prevalence (sklearn: one threshold step)
    ap = [skm.average_precision_score(y[:, j], s[:, j]) for j in range(y.shape[1]) if y[:, j].any()]
    assert out["map_label"] == pytest.approx(np.mean(ap))
    for key in ("p@1", "p@5", "r@15", "r_precision"):
        assert 0.0 <= out[key] <= 1.0


def test_single_example():
    y = np.array([[0, 1, 0, 1, 1]])
    s = np.array([[0.1, 0.9, 0.6, 0.3, 0.8]])
    out = compute_multilabel_metrics(y, s)
    assert math.isnan(out["macro_auc"])  # no label has both a positive and a negative
    assert out["micro_auc"] == pytest.approx(skm.roc_auc_score(y.ravel(), s.ravel()))
    assert out["map_label"] == pytest.approx(1.0)  # each positive label is ranked first in its column
    assert out["map_example"] == pytest.approx(skm.average_precision_score(y[0], s[0]))
    assert out["p@1"] == 1.0 and out["p@5"] == pytest.approx(3 / 5)
    assert out["p@15"] == pytest.approx(3 / 5)  # P@k divides by min(k, L)
    assert out["r@1"] == pytest.approx(1 / 3) and out["r@15"] == 1.0
    assert out["r_precision"] == pytest.approx(2 / 3)
    assert out["micro_f1"] == pytest.approx(2 * 2 / (3 + 3))
    assert out["subset_accuracy"] == 0.0


def test_perfect_scores():
    y, _ = _data(seed=2)
    out = compute_multilabel_metrics(y, y.astype(np.float32))
    for key in ("micro_f1", "micro_auc", "macro_auc", "map_label", "subset_accuracy"):
        assert out[key] == pytest.approx(1.0), key
    assert out["hamming_loss"] == 0.0
    # the example without labels is a 0/0 for example F1, R@k and R-precision
    with_labels = np.mean(y.any(axis=1))
    assert with_labels < 1.0
    assert out["example_f1"] == pytest.approx(with_labels)
    assert out["r_precision"] == pytest.approx(with_labels)
    assert compute_multilabel_metrics(y, y.astype(float), zero_division=1.0)["example_f1"] == 1.0


def test_chunked_paths_equal_unchunked(monkeypatch):
    y, s = _data(n=37, num_labels=23, seed=4, ties=True)
    full = compute_multilabel_metrics(y, s)
    monkeypatch.setattr(inp, "CHUNK_CELLS", 50)
    chunked = compute_multilabel_metrics(y, s)
    for key in full:
        assert chunked[key] == pytest.approx(full[key], abs=1e-12, nan_ok=True), key


def test_input_types_torch_scipy_float64():
    import scipy.sparse as sp

    y, s = _data(seed=6)
    ref = compute_multilabel_metrics(y, s)
    out_t = compute_multilabel_metrics(torch.from_numpy(y.astype(np.float32)), torch.from_numpy(s))
    out_sp = compute_multilabel_metrics(sp.csr_matrix(y.astype(np.int8)), s)
    for key in ref:
        assert out_t[key] == pytest.approx(ref[key], nan_ok=True)
        assert out_sp[key] == pytest.approx(ref[key], nan_ok=True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(y_true=np.ones((3, 2)), y_score=np.ones((3, 3))), "must match"),
        (dict(y_true=np.full((3, 2), 2), y_score=np.ones((3, 2))), "only 0 and 1"),
        (dict(y_true=np.ones(3), y_score=np.ones(3)), "2-D"),
        (dict(y_true=np.ones((2, 2)), y_score=np.array([[0.1, np.nan], [0, 0]])), "NaN"),
        (dict(y_true=np.ones((2, 2)), y_score=np.ones((2, 2)), threshold=np.ones(3)), "threshold"),
        (dict(y_true=np.ones((2, 2)), y_score=np.ones((2, 2)), ks=(0,)), "ks"),
        (dict(y_true=np.ones((0, 2)), y_score=np.ones((0, 2))), "empty"),
    ],
)
def test_bad_input_raises(kwargs, match):
    with pytest.raises(ValueError, match=match):
        compute_multilabel_metrics(**kwargs)


def test_helpers_sigmoid_predictions_and_trainer_callable():
    x = np.array([[-1000.0, 0.0, 1000.0]], dtype=np.float32)
    out = sigmoid(x)
    assert out.dtype == np.float32 and np.all(np.isfinite(out))
    np.testing.assert_allclose(out, [[0.0, 0.5, 1.0]], atol=1e-7)
    logits = np.array([[2.0, -2.0], [-3.0, 4.0]], dtype=np.float32)
    np.testing.assert_allclose(predictions_to_scores((logits, np.zeros((2, 5)))), sigmoid(logits))
    np.testing.assert_allclose(predictions_to_scores(logits, from_logits=False), logits)
    assert apply_threshold(sigmoid(logits)).tolist() == [[True, False], [False, True]]

    from types import SimpleNamespace  # stands in for transformers.EvalPrediction (same attributes)

    fn = make_compute_metrics(ks=(1,))
    res = fn(SimpleNamespace(predictions=logits, label_ids=np.array([[1.0, 0.0], [0.0, 1.0]])))
    assert fn((logits, np.array([[1.0, 0.0], [0.0, 1.0]])))["micro_f1"] == 1.0
    assert res["micro_f1"] == 1.0 and res["p@1"] == 1.0
    assert "macro_auc" in res  # both labels have a positive and a negative


@settings(max_examples=25, deadline=None)
@given(
    st.integers(1, 12),
    st.integers(2, 9),  # sklearn reads a single column as binary, not multi-label
    st.integers(0, 10_000),
)
def test_property_counts_match_sklearn(n, num_labels, seed):
    rng = np.random.default_rng(seed)
    y = rng.random((n, num_labels)) < 0.4
    s = np.round(rng.random((n, num_labels)), 1)
    out = compute_multilabel_metrics(y, s)
    pred = s >= 0.5
    assert out["micro_f1"] == pytest.approx(skm.f1_score(y, pred, average="micro", zero_division=0))
    assert out["macro_f1"] == pytest.approx(skm.f1_score(y, pred, average="macro", zero_division=0))
    assert out["example_f1"] == pytest.approx(skm.f1_score(y, pred, average="samples", zero_division=0))
    if 0 < y.sum() < y.size:
        assert out["micro_auc"] == pytest.approx(skm.roc_auc_score(y.ravel(), s.ravel()))
    else:
        assert math.isnan(out["micro_auc"])


@pytest.mark.parametrize("seed", range(4))
def test_sort_free_ap_auc_equals_argsort_path(seed):
    """float32 scores use packed 64-bit keys + searchsorted; float64 the argsort path: same numbers."""
    rng = np.random.default_rng(seed)
    y = rng.random((23, 17)) < rng.uniform(0.05, 0.6)
    s = rng.normal(size=(23, 17)).astype(np.float32)
    if seed % 2:
        s = (np.round(s * 2) / 2).astype(np.float32)  # ties, zeros and negative values
    for rows in (True, False):
        a, b = (s, y) if rows else (np.ascontiguousarray(s.T), np.ascontiguousarray(y.T))
        fast_ap, fast_auc = rk.grouped_ap_auc(s, y, groups_are_rows=rows)
        slow_ap, slow_auc = rk.rowwise_ap_auc(a, b)
        np.testing.assert_allclose(fast_ap, slow_ap, atol=1e-12)
        np.testing.assert_allclose(fast_auc, slow_auc, atol=1e-12)
    s64 = s.astype(np.float64) + 1e-12 * rng.random(s.shape)  # not float32-exact -> argsort path
    assert not rk.float32_exact(s64)
    out32 = compute_multilabel_metrics(y, s)
    out64 = compute_multilabel_metrics(y, s64)
    if seed % 2 == 0:  # without ties the tiny jitter changes no ranking
        for key in ("micro_auc", "macro_auc", "map_label", "map_example"):
            assert out32[key] == pytest.approx(out64[key], abs=1e-12), key


def test_top_k_of_tied_scores_is_the_mean_over_every_order_of_the_tied_labels():
    """P@k, R@k and R-precision with ties equal their mean over every order of the tied labels (each order one
    argsort ranking), and the plain argsort values without ties."""
    import itertools

    y = np.array([[1, 0, 1, 0, 0], [0, 1, 0, 0, 1], [1, 1, 0, 0, 0], [0, 0, 0, 1, 0]], dtype=bool)
    s = np.array(
        [
            [0.9, 0.9, 0.9, 0.2, 0.1],
            [0.5, 0.5, 0.3, 0.3, 0.3],
            [1.0, 1.0, 1.0, 1.0, 0.0],
            [0.4, 0.3, 0.2, 0.8, 0.1],
        ]
    )
    ks = (1, 2, 3)
    got = compute_multilabel_metrics(y, s, ks=ks)
    per_row = []
    for yi, si in zip(y, s):
        values = []
        for order in itertools.permutations(range(5)):  # tie-break by this order of the labels
            ranking = sorted(range(5), key=lambda j: (-si[j], order.index(j)))
            hit = np.cumsum(yi[ranking])
            values.append(
                [hit[k - 1] / k for k in ks]
                + [hit[k - 1] / yi.sum() for k in ks]
                + [hit[yi.sum() - 1] / yi.sum()]
            )
        per_row.append(np.mean(values, axis=0))
    want = np.mean(per_row, axis=0)
    keys = [f"p@{k}" for k in ks] + [f"r@{k}" for k in ks] + ["r_precision"]
    assert [got[key] for key in keys] == pytest.approx(list(want), abs=1e-12)
    assert got["p@1"] == pytest.approx((2 / 3 + 1 / 2 + 1 / 2 + 1) / 4)  # row 3: 2 of 4 tied labels are true


@pytest.mark.parametrize("zero_division", [0.0, 1.0])
def test_a_classifier_wrong_on_every_label_has_harmonic_macro_f1_zero(zero_division):
    """P_M = R_M = 0 with predictions and positives on every label: F = 0 (sklearn), not zero_division, one-shot
    and streamed."""
    from hf_mlcl.evaluation import MultiLabelAccumulator

    y = np.array([[1, 0], [0, 1]], dtype=bool)
    s = np.array([[0.1, 0.9], [0.9, 0.1]])
    out = compute_multilabel_metrics(y, s, zero_division=zero_division)
    assert out["macro_precision"] == out["macro_recall"] == 0.0
    want = skm.f1_score(y, s >= 0.5, average="macro", zero_division=zero_division)
    assert out["macro_f1_harmonic"] == out["macro_f1"] == want == 0.0
    acc = MultiLabelAccumulator(from_logits=False, zero_division=zero_division)
    acc.add_batch(s, y)
    assert acc.compute(0.5)["macro_f1_harmonic"] == 0.0
    # nothing predicted and nothing true on any label: every 0/0 takes zero_division, the harmonic mean too
    empty = compute_multilabel_metrics(np.zeros((2, 2), bool), np.zeros((2, 2)), zero_division=zero_division)
    assert empty["macro_f1_harmonic"] == zero_division


def test_r_precision_needs_no_depth_of_the_largest_label_set():
    """R-precision reads each example's own cut, so the top-k counts stay (N, max k) when one example holds
    every label; the values equal the argsort definition."""
    rng = np.random.default_rng(3)
    y = rng.random((30, 40)) < 0.1
    y[0] = True  # one example with all 40 labels
    y[1] = False
    s = rng.random((30, 40)).astype(np.float32)
    hits, at_own = rk.ranked_hits(y, s, 5)
    assert hits.shape == (30, 5)
    n_true = y.sum(axis=1)
    want = [np.cumsum(yi[np.argsort(-si)])[n - 1] if n else 0.0 for yi, si, n in zip(y, s, n_true)]
    assert at_own == pytest.approx(want, abs=1e-12)
    rprec = np.mean([w / n if n else 0.0 for w, n in zip(want, n_true)])
    assert compute_multilabel_metrics(y, s)["r_precision"] == pytest.approx(rprec, abs=1e-12)


def test_confident_logits_keep_their_ranking_through_the_sigmoid():
    """float32 rounds sigmoid(x) to 1 for x above about 16.6: such logits are scored in float64, so AUC and AP
    equal sklearn's on the logits (a monotone map keeps them)."""
    rng = np.random.default_rng(0)
    logits = (18 + 2 * rng.standard_normal((60, 5))).astype(np.float32)
    y = rng.random((60, 5)) < 0.4
    scores = predictions_to_scores(logits)
    assert scores.dtype == np.float64 and len(np.unique(scores)) == logits.size
    assert predictions_to_scores(logits / 10).dtype == np.float32  # no saturation: the fast path
    got = make_compute_metrics()((logits, y.astype(np.float32)))
    assert got["micro_auc"] == pytest.approx(skm.roc_auc_score(y.ravel(), logits.ravel()), abs=1e-12)
    ap = np.mean([skm.average_precision_score(y[:, j], logits[:, j]) for j in range(5)])
    assert got["map_label"] == pytest.approx(ap, abs=1e-12)


def test_very_negative_logits_keep_their_ranking_through_the_sigmoid():
    """float32 rounds sigmoid(x) to a subnormal or 0 for x below about -87: such logits are scored in float64
    too, so the ranking metrics equal sklearn's on the logits."""
    rng = np.random.default_rng(1)
    logits = (-100 + 4 * rng.standard_normal((60, 5))).astype(np.float32)
    y = rng.random((60, 5)) < 0.4
    scores = predictions_to_scores(logits)
    assert scores.dtype == np.float64 and len(np.unique(scores)) == logits.size
    got = make_compute_metrics()((logits, y.astype(np.float32)))
    assert got["micro_auc"] == pytest.approx(skm.roc_auc_score(y.ravel(), logits.ravel()), abs=1e-12)
