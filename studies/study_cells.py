"""The full-data studies' cells as the tables read them: loading, each row's runs, and the names they share.

Reads studies/results/<dataset>/<loss>_<probe>/seed<S>/metrics.json (written by studies/run.py) from
``paths.RESULTS``, looked up at each call: :func:`results_root` points it at another tree (``run_gpu.sh``'s
``gpu_bf16``) for the tables and the choice rules they call (``bce_choice``, ``loss_choice``).
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bce_choice  # noqa: E402  (studies/bce_choice.py: the BCE baseline's learning rate and budget)
import loss_choice  # noqa: E402  (studies/loss_choice.py: the losses that get GoEmotions runs and seeds)
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)
import scale_table  # noqa: E402  (studies/scale_table.py: a metric over the seeds)
from bce_choice import LONG_BUDGET as LONG_BCE  # noqa: E402  (the studies with a longer-budget BCE run)

GPU_DIR = "gpu_bf16"  # run_gpu.sh's results tree inside the results folder (the study on one GPU, bf16)
ORDER = ["bce", "pretrained", "all", "any", "mulsupcon", "sd", "jaccard", "msc", "ws_mulsupcon", "hbl"]
NAMES = {
    "bce": "BCE fine-tuning (no stage 1)",
    "pretrained": "none: pretrained MiniLM, frozen",
    "hbl": "mulsupcon + hbl",
    "sd": "sd (similarity-dissimilarity)",
}
CONTRASTIVE = [x for x in ORDER if x not in ("bce", "pretrained")]
FULL_STUDIES = ("reuters21578", "goemotions_full")
FULL_PROBES = {
    "logistic": "logistic probe (ABALONE)",
    "linear": "linear probe (SD paper)",
    "finetune": "fine-tune",
}
NOT_RUN = scale_table.NOT_RUN  # "not yet run"
BASELINES = {
    ("tfidf", "logreg"): "TF-IDF 1-2 grams + logistic regression",
    ("tfidf", "svm"): "TF-IDF 1-2 grams + linear SVM",
    ("setfit", "logistic"): "SetFit: MiniLM on any-overlap pairs + logistic head",
}
CPU_DEVICE = "2-core AMD EPYC CPU (fp32)"  # the device of every CPU cell (metrics.json "device": "cpu")


def _stage1_sampler(run: dict) -> str:
    """The batch sampler of a cell's stage 1: the record's ``batch_sampler``, else its stage-1 arguments'."""
    return run.get("batch_sampler") or (run.get("contrastive_args") or {}).get("batch_sampler") or "random"


def load(
    dataset: str, tagged: bool = False, batch_sampler: str = "random"
) -> dict[tuple[str, str], list[dict]]:
    """Runs by (loss, probe): the main grid, or (``tagged``) the stage-2 variants by (loss, probe-tag); those
    of stage 1 trained with ``batch_sampler`` (``run.py --batch-sampler``: every table but the sampler's
    reads the random batches). Whole training sets only: the data-scale study's subset cells (``-n<N>``,
    studies/scale.py) are no rows of these tables."""
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(paths.RESULTS, dataset, "*", "seed*", "metrics.json"))):
        with open(path, encoding="utf-8") as fh:
            r = json.load(fh)
        if r.get("train_size") is not None:
            continue
        if _stage1_sampler(r) != batch_sampler:
            continue
        if batch_sampler != "random":
            r = {**r, "tag": r["tag"].removeprefix(batch_sampler).lstrip("-") or None}
        if bool(r.get("tag")) != tagged:
            continue
        cells[(r["loss"], r["probe"] + (f"-{r['tag']}" if tagged else ""))].append(r)
    return cells


@contextlib.contextmanager
def results_root(root: str):
    """Read another results tree with every table function (``run_gpu.sh``'s ``gpu_bf16``): they and the choice
    rules they call (``bce_choice``, ``loss_choice``) read the folder ``paths.RESULTS``."""
    saved, paths.RESULTS = paths.RESULTS, root
    try:
        yield
    finally:
        paths.RESULTS = saved


def load_tree(root: str, study: str) -> dict[tuple[str, str], list[dict]]:
    """:func:`load` of ``study`` in another results tree."""
    with results_root(root):
        return load(study)


def lr_runs(cells, loss: str) -> dict[str, list[dict]]:
    """Fine-tuning runs of ``loss`` grouped by learning rate (tags ``lr<value>``)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for (lo, probe), rs in cells.items():
        if lo == loss and probe.startswith("finetune-lr"):
            out[probe[len("finetune-lr") :]] += rs
    return out


def chosen_lr(study: str) -> str | None:
    """The BCE fine-tuning learning rate chosen on validation (run.py ``--lr best``), None before any has run."""
    return scale_table.choice_or_none(bce_choice.best_bce_lr, study, paths.RESULTS, None)


def chosen_weight(study: str) -> str | None:
    """The joint objective's w chosen on validation (run.py ``--weight best``), None until its grid is complete."""
    return scale_table.choice_or_none(bce_choice.best_joint_weight, study, paths.RESULTS, None)


def metric(runs: list[dict], key: str) -> str:
    """``key`` over the seeds as a table cell (``scale_table.summary``), "—" where no run has it."""
    return scale_table.summary(runs, key, missing="—")


def full_runs(plain, tagged, lr: str | None, loss: str, probe: str) -> list[dict]:
    """The runs of one full-study row (``plain`` / ``tagged``: :func:`load` of the study): the probes' cells,
    or the fine-tune at ``lr``, the learning rate BCE chose (:func:`chosen_lr`)."""
    if probe != "finetune":
        return plain.get((loss, probe), [])
    return lr_runs(tagged, loss).get(lr, []) if lr else []


def long_bce_runs(study: str, tagged, lr: str | None) -> list[dict]:
    """The BCE fine-tune at the chosen learning rate with the longer budget (``run_all.sh``: studies in
    LONG_BCE, whose chosen BCE run was still improving at the end of its 5 epochs)."""
    return (
        tagged.get(("bce", bce_choice.long_cell(lr)[len("bce_") :]), []) if lr and study in LONG_BCE else []
    )


def chosen_on_reuters() -> list[str]:
    """The two losses chosen on Reuters validation (``loss_choice.py``), [] until every loss has its probes."""
    try:
        return loss_choice.best_losses("reuters21578", 2, paths.RESULTS)
    except ValueError:
        return []
