"""The ``logistic`` probe's fits: one scikit-learn logistic regression per label on frozen features.

Audibert et al. (ABALONE), appendix "Details evaluating representation space": the representation of a
contrastive encoder is evaluated by one L2 logistic regression per label, the regularisation chosen per
label for F1 on validation. :func:`fit_logistic_probe` fits them on standardised features and folds the
standardisation into the returned weights, so ``ProbingTrainer`` copies them into the linear head of a
Hub-loadable classifier (``probe="logistic"``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["fit_logistic_probe"]


def _fit_one_label(
    x: np.ndarray, y: np.ndarray, xv: np.ndarray, yv: np.ndarray | None, cs: Sequence[float], max_iter: int
):
    from sklearn.linear_model import LogisticRegression

    pos = int(y.sum())
    if pos == 0 or pos == len(y):  # constant label: a bias-only model predicting the constant
        return np.zeros(x.shape[1]), (-12.0 if pos == 0 else 12.0), float("nan")
    best = None
    for c in cs:
        clf = LogisticRegression(C=float(c), max_iter=max_iter)
        clf.fit(x, y)
        if yv is None or len(cs) == 1:
            score = (0.0, 0)
        else:
            pred = clf.decision_function(xv) >= 0
            tp = int((pred & yv).sum())
            # F1 first; a tie (always the case for a label without validation positives) goes to the
            # C with fewer false positives on validation, then to the earlier C of the grid
            score = (2 * tp / max(int(pred.sum()) + int(yv.sum()), 1), tp - int(pred.sum()))
        if best is None or score > best[0]:
            best = (score, clf.coef_[0].copy(), float(clf.intercept_[0]), float(c))
    return best[1], best[2], best[3]


def fit_logistic_probe(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray | None = None,
    y_val: np.ndarray | None = None,
    c_grid: Sequence[float] = (1.0, 0.1, 0.01),
    max_iter: int = 1000,
    n_jobs: int | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-label L2 logistic regressions on standardised features (Audibert et al., ABALONE protocol).

    Every label gets its own ``sklearn.linear_model.LogisticRegression``; with validation data the
    inverse regularisation C is chosen per label from ``c_grid`` for the label's F1 at 0.5, a tie (a
    label without validation positives) for fewer false positives, then for the earlier C. Standardisation
    is folded into the returned weights, so ``sigmoid(x @ W.T + b)`` applies to the raw features. Constant
    labels get zero weights and a saturated bias. Returns ``(W (L, D), b (L,), chosen_C (L,))``.
    """
    from joblib import Parallel, delayed

    x_train = np.asarray(x_train, dtype=np.float64)
    y_train = np.asarray(y_train) > 0.5
    mean = x_train.mean(0)
    std = x_train.std(0)
    std[std < 1e-12] = 1.0
    xs = (x_train - mean) / std
    xv = None if x_val is None else (np.asarray(x_val, dtype=np.float64) - mean) / std
    yv = None if y_val is None else np.asarray(y_val) > 0.5
    fits = Parallel(n_jobs=n_jobs)(
        delayed(_fit_one_label)(
            xs, y_train[:, j], xv, None if yv is None else yv[:, j], tuple(c_grid), max_iter
        )
        for j in range(y_train.shape[1])
    )
    w_std = np.stack([f[0] for f in fits])
    b_std = np.array([f[1] for f in fits])
    chosen = np.array([f[2] for f in fits])
    w = w_std / std[None, :]
    b = b_std - w @ mean
    return w, b, chosen
