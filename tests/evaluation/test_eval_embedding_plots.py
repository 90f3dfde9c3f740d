"""Embedding-space quality (Audibert et al. 2024, Sec. 5.3) and the PNG plots."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import davies_bouldin_score, silhouette_score

from hf_mlcl.evaluation import (
    embedding_quality,
    f1_by_frequency_bin,
    plot_embedding_projection,
    plot_f1_vs_frequency,
)
from hf_mlcl.evaluation.embedding import label_combinations, top_combination_clusters

COMBOS = [[0], [1, 2], [3], [4, 5], [0, 3], [2]]
SIZES = [60, 50, 40, 30, 8, 4]


def _clustered(seed=0, dim=16, spread=0.3):
    """Examples grouped by exact label set; each label set has its own well-separated centre."""
    rng = np.random.default_rng(seed)
    cid = np.repeat(np.arange(len(SIZES)), SIZES)
    rng.shuffle(cid)
    y = np.zeros((cid.size, 7), dtype=bool)
    for i, c in enumerate(cid):
        y[i, COMBOS[c]] = True
    centres = rng.normal(size=(len(SIZES), dim)) * 3
    x = centres[cid] + rng.normal(size=(cid.size, dim)) * spread
    return x.astype(np.float32), y, cid


def test_label_combinations_order_and_list_input():
    _, y, cid = _clustered()
    comb_id, counts, combos = label_combinations(y)
    assert counts.tolist() == SIZES
    assert [c.tolist() for c in combos] == COMBOS
    np.testing.assert_array_equal(comb_id, cid)
    ids = [np.flatnonzero(row).tolist() for row in y]
    comb_id2, counts2, _ = label_combinations(ids)  # ragged label-id lists, as stored in the datasets
    np.testing.assert_array_equal(comb_id2, comb_id)
    assert counts2.tolist() == SIZES


def test_top_combinations_int_fraction_and_empty():
    _, y, cid = _clustered()
    mask, ids, combos, counts = top_combination_clusters(y, 3)
    np.testing.assert_array_equal(mask, cid < 3)
    np.testing.assert_array_equal(ids, cid[cid < 3])
    assert counts.tolist() == SIZES[:3]
    mask_half, _, combos_half, _ = top_combination_clusters(y, 0.5)  # Audibert et al. keep half
    assert len(combos_half) == 3 and np.array_equal(mask_half, mask)
    assert len(top_combination_clusters(y, 1.0)[2]) == len(SIZES)  # the whole share: every combination
    assert len(top_combination_clusters(y, 2.0)[2]) == 2  # a whole float above 1 is a count
    y2 = y.copy()
    y2[:100] = False  # 100 examples without labels: the most frequent "combination"
    _, _, combos_no_empty, _ = top_combination_clusters(y2, 2)
    assert all(c.size for c in combos_no_empty)
    _, _, combos_empty, _ = top_combination_clusters(y2, 2, include_empty=True)
    assert combos_empty[0].size == 0
    with pytest.raises(ValueError, match="top_k_combinations"):
        top_combination_clusters(y, 0)


def test_quality_matches_sklearn_on_the_selected_subset():
    x, y, cid = _clustered(seed=1, spread=1.0)
    keep = cid < 4
    xn = x[keep] / np.linalg.norm(x[keep], axis=1, keepdims=True)
    out = embedding_quality(x, y, top_k_combinations=4)
    assert set(out) == {"silhouette", "davies_bouldin"}
    assert out["silhouette"] == pytest.approx(silhouette_score(xn, cid[keep], metric="cosine"), abs=1e-6)
    assert out["davies_bouldin"] == pytest.approx(davies_bouldin_score(xn, cid[keep]), abs=1e-6)
    eu = embedding_quality(x, y, top_k_combinations=4, metric="euclidean")
    assert eu["silhouette"] == pytest.approx(silhouette_score(xn, cid[keep]), abs=1e-6)
    # scale invariance (L2 normalisation first)
    assert embedding_quality(x * 7.0, y, 4)["silhouette"] == pytest.approx(out["silhouette"], abs=1e-6)


def test_label_id_lists_using_only_ids_0_and_1_are_not_read_as_a_multi_hot_matrix():
    """[[0], [1], ...] are two labels, one per text; it used to be read as a one-column multi-hot matrix
    (label 1 lost, id 0 'no label'). A row that repeats a value, or holds bools, is multi-hot."""
    from hf_mlcl.evaluation.embedding import multi_hot_matrix

    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 300)
    x = np.eye(2)[y] * 3 + rng.normal(size=(300, 2)) * 0.5
    want = embedding_quality(x, np.eye(2, dtype=bool)[y], top_k_combinations=2)
    assert embedding_quality(x, [[int(v)] for v in y], top_k_combinations=2) == pytest.approx(want)
    assert multi_hot_matrix([[0, 1], [1, 0]]).tolist() == [[True, True], [True, True]]
    assert multi_hot_matrix([[1, 0, 1], [0, 1, 0]]).tolist() == [[True, False, True], [False, True, False]]
    assert multi_hot_matrix([[True], [False]]).tolist() == [[True], [False]]
    assert multi_hot_matrix([[1, 1], [0, 1]]).tolist() == [[True, True], [False, True]]


def test_quality_ranks_separated_clusters_above_random():
    x, y, _ = _clustered(seed=2)
    rand = np.random.default_rng(3).normal(size=x.shape)
    good = embedding_quality(x, y, top_k_combinations=5)
    bad = embedding_quality(rand, y, top_k_combinations=5)
    assert good["silhouette"] > 0.5 > bad["silhouette"]
    assert bad["silhouette"] < 0.1
    assert good["davies_bouldin"] < 1.0 < bad["davies_bouldin"]
    # subsampling keeps the ranking
    sub = embedding_quality(x, y, top_k_combinations=5, max_samples=80)
    assert sub["silhouette"] > 0.5


def test_quality_bad_input():
    x, y, _ = _clustered()
    with pytest.raises(ValueError, match="at least 2 label combinations"):
        embedding_quality(x, y, top_k_combinations=1)
    with pytest.raises(ValueError, match="rows"):
        embedding_quality(x[:10], y)
    with pytest.raises(ValueError, match="metric"):
        embedding_quality(x, y, metric="manhattan")


def _check_png(path, min_w=300, min_h=200):
    from matplotlib.image import imread

    with open(path, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    img = imread(path)
    h, w = img.shape[:2]
    assert w >= min_w and h >= min_h and w <= 4000 and h <= 4000
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    assert float(img[..., :3].std()) > 0.01  # not a blank canvas
    return img


def test_plot_f1_vs_frequency_single_and_overlay(tmp_path):
    rng = np.random.default_rng(0)
    freq = np.concatenate([[0, 0], rng.integers(1, 2000, 98)])
    f1 = np.clip(np.log10(freq + 1) / 3.5 + rng.normal(0, 0.1, 100), 0, 1)
    p1 = plot_f1_vs_frequency(f1, freq, tmp_path / "sub" / "f1.png", title="BCE")
    assert p1 == str(tmp_path / "sub" / "f1.png")
    _check_png(p1)
    p2 = plot_f1_vs_frequency({"BCE": f1, "MSC": np.clip(f1 + 0.1, 0, 1)}, freq, tmp_path / "f1_two.png")
    _check_png(p2)
    train_matrix = rng.random((50, 100)) < 0.1  # (N, L) training labels -> column sums
    _check_png(plot_f1_vs_frequency(f1, train_matrix, tmp_path / "f1_m.png"))
    with pytest.raises(ValueError, match="same length"):
        plot_f1_vs_frequency(f1[:5], freq, tmp_path / "bad.png")


def test_f1_by_frequency_bin_gives_the_plots_binned_means():
    freq = np.array([1, 3, 5, 7, 0, 3])
    f1 = np.array([0.1, 0.2, 0.3, 0.4, 0.9, 0.6])
    # edges 1, 7^(1/3), 7^(2/3), 7 (log-spaced, 3 bins): [1, 1.91) {0.1}, [1.91, 3.66) {0.2, 0.6},
    # [3.66, 7] {0.3, 0.4}; label 4 is unseen in training
    bins = f1_by_frequency_bin({"BCE": f1, "MSC": 1 - f1}, freq, n_bins=3)
    assert [(b["n_labels"], round(b["low"], 3)) for b in bins] == [(1, 1.0), (2, 1.913), (2, 3.659)]
    assert [b["mean_f1"]["BCE"] for b in bins] == pytest.approx([0.1, 0.4, 0.35])
    assert [b["mean_f1"]["MSC"] for b in bins] == pytest.approx([0.9, 0.6, 0.65])
    assert f1_by_frequency_bin(f1, freq, n_bins=8)[0]["mean_f1"] == {None: pytest.approx(0.1)}
    assert f1_by_frequency_bin(f1, np.zeros(6)) == []
    with pytest.raises(ValueError, match="n_bins"):
        f1_by_frequency_bin(f1, freq, n_bins=0)


@pytest.mark.parametrize("method", ["pca", "tsne"])
def test_plot_embedding_projection(tmp_path, method):
    x, y, _ = _clustered(seed=4)
    if method == "tsne":
        x, y = x[:70], y[:70]  # keep t-SNE fast
    names = [f"code_{i}" for i in range(y.shape[1])]
    path = plot_embedding_projection(
        x, y, tmp_path / f"proj_{method}.png", top_k_combinations=4, label_names=names, method=method
    )
    img = _check_png(path)
    assert img.shape[1] > img.shape[0] * 0.9  # legend on the right widens the figure
    with pytest.raises(ValueError, match="method"):
        plot_embedding_projection(x, y, tmp_path / "x.png", method="umap")
