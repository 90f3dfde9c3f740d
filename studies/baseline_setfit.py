"""SetFit's multi-label recipe as a baseline of the study: all-MiniLM-L6-v2 trained on text pairs with
CosineSimilarityLoss, a pair being positive when its two texts share any label, then a one-vs-rest logistic
head on the trained encoder's embeddings (Tunstall et al. 2022, "Efficient Few-Shot Learning Without
Prompts", arXiv:2209.11055; the ``setfit`` package, ``multi_target_strategy="one-vs-rest"``).

    python studies/baseline_setfit.py reuters21578 --seed 1 [--data_dir ../shared/data/reuters21578]

It runs ``setfit.Trainer`` with one change: :func:`any_overlap_pairs` draws the pairs without listing every
pair first. Writes ``studies/results/<study>/setfit_logistic/seed<S>/metrics.json``; a finished cell is skipped.

Protocol: docs/study.md, "The SetFit baseline (studies/baseline_setfit.py)".
"""

from __future__ import annotations

import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cell_io  # noqa: E402  (studies/cell_io.py)
import paths  # noqa: E402  (studies/paths.py: where the study's files live)
import scale  # noqa: E402  (studies/scale.py: training subsets, SetFit's steps at a subset size)

PAIRS_PER_STEP = 32  # 64 texts per step, the batch of the study's stage 1 (scale.STAGE1_BATCH)


def any_overlap_pairs(
    labels: np.ndarray, n_pairs: int, rng: np.random.Generator, chunk: int = 65536, max_draws: int = 10**8
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(i, j, target)`` of ``n_pairs`` pairs of distinct rows of the (N, L) bool ``labels``: drawn uniformly,
    ``target`` 1.0 where rows i and j share a label (setfit's multi-label rule: ``any(logical_and(a, b))``),
    half of them positive (the odd one out negative), interleaved positive, negative, ... as setfit yields
    them. Draws candidate pairs in vectorised chunks; ValueError when ``max_draws`` candidates cannot fill
    both halves (a label set where no two texts share a label, or none differ)."""
    n = labels.shape[0]
    want = {True: n_pairs // 2, False: n_pairs - n_pairs // 2}
    got: dict[bool, list[np.ndarray]] = {True: [], False: []}
    have = {True: 0, False: 0}
    drawn = 0
    while (have[True] < want[True] or have[False] < want[False]) and drawn < max_draws:
        i, j = rng.integers(n, size=chunk), rng.integers(n, size=chunk)
        keep = i != j
        i, j = i[keep], j[keep]
        shared = (labels[i] & labels[j]).any(axis=1)
        for kind in (True, False):
            sel = np.flatnonzero(shared == kind)[: want[kind] - have[kind]]
            got[kind].append(np.stack([i[sel], j[sel]], axis=1))
            have[kind] += sel.size
        drawn += chunk
    if have[True] < want[True] or have[False] < want[False]:
        raise ValueError(
            f"{max_draws} random pairs gave {have[True]} positive / {have[False]} negative pairs, "
            f"{want[True]} / {want[False]} needed: the labels admit too few pairs of one kind"
        )
    pos, neg = np.concatenate(got[True]), np.concatenate(got[False])
    order = np.empty((n_pairs, 2), dtype=np.int64)  # positive, negative, positive, ... (setfit's order)
    order[0 : 2 * len(pos) : 2], order[1 : 2 * len(pos) : 2] = pos, neg[: len(pos)]
    order[2 * len(pos) :] = neg[len(pos) :]
    target = np.zeros(n_pairs, dtype=np.float64)
    target[0 : 2 * len(pos) : 2] = 1.0
    return order[:, 0], order[:, 1], target


def _trainer_class():
    """``setfit.Trainer`` whose pairs come from :func:`any_overlap_pairs` (built on import of setfit only)."""
    from datasets import Dataset
    from setfit import Trainer

    class AnyOverlapTrainer(Trainer):
        """setfit's Trainer; ``get_dataset`` draws the multi-label pairs by sampling (see the module docstring)."""

        def get_dataset(self, x, y, args, max_pairs: int = -1):
            if max_pairs <= 0:
                raise ValueError(
                    "the pair budget is set through TrainingArguments.max_steps (a positive number)"
                )
            labels = np.asarray(y, dtype=bool)
            i, j, target = any_overlap_pairs(labels, max_pairs, np.random.default_rng(args.seed))
            pairs = Dataset.from_dict(
                {"sentence_1": [x[k] for k in i], "sentence_2": [x[k] for k in j], "label": target.tolist()}
            )
            return pairs, args.loss(self.model.model_body)

    return AnyOverlapTrainer


def run_cell(
    study: str,
    seed: int,
    overrides: list[str],
    force: bool = False,
    without_per_label: bool = False,
    model_path: str | None = None,
    steps: int | None = None,
    train_size: int | None = None,
) -> dict:
    """One SetFit cell; ``train_size``: a training subset of that many rows, trained for as many steps as stage 1
    at that size (studies/scale.py); ``model_path`` (default: the study's MiniLM) and ``steps`` (default: the
    stage-1 budget) exist for the tests."""
    import setfit
    from datasets import Dataset
    from setfit import SetFitModel, TrainingArguments

    sys.path.insert(0, os.path.join(paths.REPO, "benchmarks"))
    from minilm import find_minilm

    cell = scale.cell_name("setfit_logistic", scale.check_size(study, train_size))
    if cell_io.skip_finished(study, cell, seed, force, without_per_label):
        return {}
    overrides = [*overrides, *scale.subset_overrides(train_size)]
    data = cell_io.labelled_data(study, overrides)
    ds, _, data_args, y = data
    steps = steps or scale.setfit_steps(study, train_size, len(ds["train"]))  # stage 1's steps at that size
    model = SetFitModel.from_pretrained(model_path or find_minilm(), multi_target_strategy="one-vs-rest")
    model.model_body.max_seq_length = data_args.max_length
    args = TrainingArguments(
        output_dir=os.path.join(paths.RUNS, study, scale.cell_name("setfit", train_size), f"seed{seed}"),
        batch_size=(PAIRS_PER_STEP, 16),
        num_epochs=1,
        max_steps=steps,
        seed=seed,
        max_length=data_args.max_length,
        save_strategy="no",
        report_to="none",
        show_progress_bar=False,
        logging_steps=50,
    )
    train = Dataset.from_dict({"text": ds["train"]["text"], "label": y["train"].astype(int).tolist()})
    trainer = _trainer_class()(model=model, args=args, train_dataset=train)
    t0 = time.time()
    trainer.train_embeddings(*trainer.dataset_to_parameters(train), args=args)
    t1 = time.time()
    trainer.train_classifier(*trainer.dataset_to_parameters(train), args=args)
    t2 = time.time()
    scores = {
        s: np.asarray(model.predict_proba(ds[s]["text"], as_numpy=True), dtype=np.float64)
        for s in ("validation", "test")
    }
    metrics = cell_io.scored_metrics(y["validation"], scores["validation"], y["test"], scores["test"])
    settings = {
        "setfit": setfit.__version__,
        "pairs": steps * PAIRS_PER_STEP,
        "steps": steps,
        "train_size": train_size,
        "pairs_per_step": PAIRS_PER_STEP,
        "body_learning_rate": args.body_embedding_learning_rate,
        "warmup_proportion": args.warmup_proportion,
        "max_length": data_args.max_length,
        "head": "OneVsRestClassifier(LogisticRegression())",
    }
    # stage1_s: the pair training; probe_s: the head (encoding every training text, then the fits)
    wall = {
        "stage1_s": round(t1 - t0, 1),
        "probe_s": round(t2 - t1, 1),
        "scoring_s": round(time.time() - t2, 1),
    }
    return cell_io.write_baseline(
        study,
        "setfit",
        "logistic",
        seed,
        overrides,
        data,
        scores["test"],
        metrics,
        settings,
        wall,
        train_size,
    )


def main(argv: list[str] | None = None) -> None:
    args, overrides = cell_io.baseline_parser(__doc__).parse_known_args(argv)
    run_cell(
        args.study,
        args.seed,
        overrides,
        force=args.force,
        train_size=args.train_size,
        without_per_label=args.rerun_without_per_label,
    )


if __name__ == "__main__":
    main()
