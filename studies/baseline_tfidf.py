"""TF-IDF baselines of the study: word 1-2 grams, then one-vs-rest logistic regression or a linear SVM
(scikit-learn), the regularisation C chosen on validation; the study's protocol for the threshold and test.

    python studies/baseline_tfidf.py reuters21578 --model logreg --seed 1
    python studies/baseline_tfidf.py goemotions_full --model svm --seed 1 [--data_dir ../shared/data/goemotions]

Writes ``studies/results/<study>/tfidf_<model>/seed<S>/metrics.json``; a finished cell is skipped.

Protocol: docs/study.md, "The TF-IDF baselines (studies/baseline_tfidf.py)".
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cell_io  # noqa: E402  (studies/cell_io.py)
import scale  # noqa: E402  (studies/scale.py: training subsets)

C_START = (1.0, 10.0, 100.0)
C_LIMITS = (1e-3, 1e4)
MODELS = ("logreg", "svm")
VECTORIZER = {"ngram_range": (1, 2), "sublinear_tf": True, "min_df": 2}


def classifier(model: str, c: float, seed: int):
    """The one-vs-rest scikit-learn classifier of ``model`` at regularisation ``c``."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.multiclass import OneVsRestClassifier
    from sklearn.svm import LinearSVC

    if model == "logreg":
        return OneVsRestClassifier(LogisticRegression(C=c, solver="liblinear", dual=False, random_state=seed))
    if model == "svm":
        return OneVsRestClassifier(LinearSVC(C=c, dual=True, random_state=seed))
    raise ValueError(f"--model must be one of {', '.join(MODELS)}, got {model!r}")


def label_scores(clf, features) -> np.ndarray:
    """(N, L) scores in (0, 1): probabilities of a logistic model, sigmoid of an SVM's margins."""
    if hasattr(clf.estimators_[0], "predict_proba"):
        return np.asarray(clf.predict_proba(features), dtype=np.float64)
    margins = np.asarray(clf.decision_function(features), dtype=np.float64)
    return 1.0 / (1.0 + np.exp(-margins))


def next_c(scores: dict[float, float], limits: tuple[float, float] = C_LIMITS) -> float | None:
    """The C to try next: a decade past the best C when it is the grid's smallest or largest (within
    ``limits``), else None (the best C is inside the grid, or at a limit)."""
    grid = sorted(scores)
    best = max(grid, key=lambda c: (scores[c], -c))  # ties: the smaller C
    if best == grid[0] and best / 10 >= limits[0]:
        return best / 10
    if best == grid[-1] and best * 10 <= limits[1]:
        return best * 10
    return None


def choose_c(
    model: str,
    seed: int,
    x_train,
    y_train: np.ndarray,
    x_val,
    y_val: np.ndarray,
    start=C_START,
    limits=C_LIMITS,
) -> tuple[float, object, dict[str, float], float]:
    """Fit one classifier per C, from ``start`` and then by :func:`next_c`; return (chosen C, its fitted
    classifier, validation macro-F1 of every C tried at its validation-tuned threshold, seconds spent fitting
    them all). Test is not read."""
    from hf_mlcl.evaluation.metrics import compute_multilabel_metrics
    from hf_mlcl.evaluation.thresholds import tune_global_threshold

    scores: dict[float, float] = {}
    fitted: dict[float, object] = {}
    fit_s = 0.0
    todo: list[float] = list(start)
    while todo:
        c = todo.pop(0)
        t0 = time.time()
        clf = classifier(model, c, seed).fit(x_train, y_train)
        fit_s += time.time() - t0
        val = label_scores(clf, x_val)
        scores[c] = float(
            compute_multilabel_metrics(y_val, val, threshold=tune_global_threshold(y_val, val))["macro_f1"]
        )
        best = max(scores, key=lambda k: (scores[k], -k))
        fitted = {best: clf if best == c else fitted[best]}  # keep the best model only
        if not todo:
            nxt = next_c(scores, limits)
            todo = [nxt] if nxt is not None else []
    best = max(scores, key=lambda k: (scores[k], -k))
    return best, fitted[best], {str(c): v for c, v in sorted(scores.items())}, fit_s


def run_cell(
    study: str,
    model: str,
    seed: int,
    overrides: list[str],
    force: bool = False,
    without_per_label: bool = False,
    train_size: int | None = None,
) -> dict:
    """One TF-IDF cell; ``train_size``: a training subset of that many rows (studies/scale.py)."""
    from sklearn.feature_extraction.text import TfidfVectorizer

    classifier(model, 1.0, seed)  # an unknown --model stops here, before the data is read
    cell = scale.cell_name(f"tfidf_{model}", scale.check_size(study, train_size))
    if cell_io.skip_finished(study, cell, seed, force, without_per_label):
        return {}
    overrides = [*overrides, *scale.subset_overrides(train_size)]
    data = cell_io.labelled_data(study, overrides)
    ds, _, _, y = data
    t0 = time.time()
    vec = TfidfVectorizer(**VECTORIZER)
    x_train = vec.fit_transform(ds["train"]["text"])
    x_val, x_test = vec.transform(ds["validation"]["text"]), vec.transform(ds["test"]["text"])
    features_s = time.time() - t0
    c, clf, by_c, fit_s = choose_c(model, seed, x_train, y["train"], x_val, y["validation"])
    test_scores = label_scores(clf, x_test)
    metrics = cell_io.scored_metrics(y["validation"], label_scores(clf, x_val), y["test"], test_scores)
    settings = {
        "vectorizer": {**VECTORIZER, "ngram_range": list(VECTORIZER["ngram_range"])},
        "vocabulary": len(vec.vocabulary_),
        "c_start": list(C_START),
        "c": c,
        "validation_macro_f1_by_c": by_c,
    }
    # probe_s: the whole training cost (features + every C of the grid), as the tables read it
    wall = {
        "features_s": round(features_s, 1),
        "fit_s": round(fit_s, 1),
        "probe_s": round(features_s + fit_s, 1),
    }
    return cell_io.write_baseline(
        study, "tfidf", model, seed, overrides, data, test_scores, metrics, settings, wall, train_size
    )


def main(argv: list[str] | None = None) -> None:
    ap = cell_io.baseline_parser(__doc__)
    ap.add_argument("--model", required=True, choices=MODELS)
    args, overrides = ap.parse_known_args(argv)
    run_cell(
        args.study,
        args.model,
        args.seed,
        overrides,
        force=args.force,
        train_size=args.train_size,
        without_per_label=args.rerun_without_per_label,
    )


if __name__ == "__main__":
    main()
