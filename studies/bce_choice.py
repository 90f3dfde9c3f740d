"""How the full-data studies (docs/RESULTS.md) choose their BCE fine-tuning baseline, on validation only.

* **Learning rate**: the ``bce_finetune-lr<lr>`` seed-1 cell with the highest validation macro-F1
  (``run.py --lr best``; the grid itself is ``lr_grid.py``); the joint objective's w likewise
  (``run.py --weight best``).
* **Budget**: where the chosen run ended its 5 epochs still improving (``LONG_BUDGET``), the same fine-tune
  also runs with a longer budget (``run.py --tag long``: cell ``bce_finetune-long-lr<lr>``). That run becomes
  the bar when its seed-1 validation macro-F1 is higher than the 5-epoch run's (a tie keeps the cheaper
  5 epochs), and then it also gets seeds 2-3, so that the seed-spread verdict can be read against it.
  This rule was fixed before the longer run finished. The fine-tunes from the stage-1 encoders keep
  the 5-epoch budget, so the 5-epoch BCE run stays their equal-budget comparison and gets seeds 2-3
  in either case.

    python studies/bce_choice.py reuters21578     # prints "long" or "base"
"""

from __future__ import annotations

import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cell_io import metrics_path, validation_macro_f1  # noqa: E402  (studies/cell_io.py: a cell's files)
from paths import RESULTS  # noqa: E402  (studies/paths.py: where the cells' outputs live)
from scale import split_cell  # noqa: E402  (studies/scale.py: a subset's cells end in -n<N>)

LONG_TAG = "long"
# studies whose chosen BCE run ended its 5 epochs still improving, and the longer budget run_all.sh gives them
# (run_all.sh's long_bce() runs exactly this budget, for the studies listed here: keep the two in step)
LONG_BUDGET = {"reuters21578": "up to 20 epochs (patience 3)"}
JOINT_WEIGHTS = (
    "0.2",
    "0.5",
)  # the joint objective's grid of w (run_all.sh reads it: --weights)
# its extensions past the better edge, up to JOINT_EXTENSIONS (lr_grid.extend_grid, run.py --weight extend,
# extend2, extend3): the BCE term is a mean over the batch's N x L entries, the contrastive one over anchors
# (docs/losses.md), so the better w can lie far below 0.2
JOINT_LADDER = ("0.001", "0.01", "0.05", "0.2", "0.5", "0.8")
JOINT_EXTENSIONS = 3


def _seed1_scores(
    study: str, glob_name: str, key: str, results: str, train_size: int | None
) -> dict[str, float]:
    """Validation macro-F1 of each finished seed-1 cell of ``study`` whose folder matches ``glob_name`` and
    whose base name (without a subset's ``-n<N>``) matches the regular expression ``key`` at ``train_size``
    rows, by ``key``'s first group."""
    scores = {}
    for path in glob.glob(os.path.join(results, study, glob_name, "seed1", "metrics.json")):
        cell, size = split_cell(os.path.basename(os.path.dirname(os.path.dirname(path))))
        found = re.fullmatch(key, cell)
        if found and size == train_size:
            scores[found[1]] = validation_macro_f1(path)
    return scores


def bce_validation_scores(
    study: str, results: str = RESULTS, train_size: int | None = None
) -> dict[str, float]:
    """Validation macro-F1 of each finished ``bce_finetune-lr*`` seed-1 cell of ``study`` trained on
    ``train_size`` rows (None: the whole split; a subset's cells end in ``-n<N>``, studies/scale.py), by
    learning rate (budget variants such as ``bce_finetune-long-lr*`` are no points of the grid)."""
    return _seed1_scores(study, "bce_finetune-lr*", r"bce_finetune-lr(.+)", results, train_size)


def joint_validation_scores(
    study: str, results: str = RESULTS, train_size: int | None = None, lr: str | None = None
) -> dict[str, float]:
    """Validation macro-F1 of each finished seed-1 ``joint_finetune-w<w>-lr<lr>`` cell of ``study`` at
    ``train_size`` rows (at learning rate ``lr``; None: any), by w."""
    at = r".+" if lr is None else re.escape(lr)
    return _seed1_scores(
        study, "joint_finetune-w*", rf"joint_finetune-w([0-9.]+)-lr{at}", results, train_size
    )


def extended_joint_weight(
    study: str, results: str = RESULTS, train_size: int | None = None, k: int = 1, lr: str | None = None
) -> str | None:
    """The w grid's ``k``-th extension (``JOINT_WEIGHTS``, then one ``JOINT_LADDER`` step past the better edge;
    lr_grid.extend_grid): None when the best w lies inside the grid, NotReady before its points have run."""
    import lr_grid

    return lr_grid.extend_grid(
        joint_validation_scores(study, results, train_size, lr), JOINT_WEIGHTS, JOINT_LADDER, k, "weights"
    )


def joint_grid_done(
    study: str, results: str = RESULTS, size: int | None = None, lr: str | None = None
) -> bool:
    """Whether every w of the grid has its seed-1 cell at ``size`` (and ``lr``): ``JOINT_WEIGHTS`` and the
    extensions past the better edge that validation asks for (run.py --weight extend, extend2, extend3)."""
    import lr_grid

    scores = joint_validation_scores(study, results, size, lr)
    return lr_grid.grid_complete(scores, JOINT_WEIGHTS, JOINT_LADDER, JOINT_EXTENSIONS)


def best_joint_weight(
    study: str, results: str = RESULTS, train_size: int | None = None, lr: str | None = None
) -> str:
    """The joint objective's w chosen on validation: the seed-1 ``joint_finetune-w<w>-lr<lr>`` cell of ``study``
    at ``train_size`` rows with the highest validation macro-F1 (a tie: the larger w, as the grid's extension
    rule reads it), at the learning rate ``lr`` (default: BCE's, :func:`best_bce_lr`, the rate the joint cells
    train at), so w is never compared across learning rates. ValueError until the grid is complete
    (:func:`joint_grid_done`)."""
    lr = best_bce_lr(study, results, train_size) if lr is None else lr
    scores = joint_validation_scores(study, results, train_size, lr)
    if not scores:
        raise ValueError(
            f"--weight best: no finished joint_finetune-w*-lr{lr} seed-1 cell of {study} at this size"
        )
    if not joint_grid_done(study, results, train_size, lr):
        raise ValueError(
            f"--weight best: the w grid of {study} at this size is not complete (ran: {', '.join(sorted(scores))}); "
            "run --weight extend, extend2 and extend3 first"
        )
    return max(scores, key=lambda w: (scores[w], float(w)))


def bce_extensions(train_size: int | None) -> int:
    """How many times BCE's learning-rate grid grows past its better edge: once on a whole training set, twice
    on a subset (run_all.sh's LRS and SCALE_LRS; studies/lr_grid.py)."""
    return 1 if train_size is None else 2


def bce_grid_done(study: str, results: str = RESULTS, train_size: int | None = None) -> bool:
    """Whether every point of BCE's learning-rate grid at ``train_size`` has its seed-1 cell (the first two and
    the extensions validation asks for, :func:`bce_extensions`): only then is the choice final."""
    import lr_grid

    scores = bce_validation_scores(study, results, train_size)
    return lr_grid.grid_complete(scores, lr_grid.FIRST, lr_grid.LADDER, bce_extensions(train_size))


def best_bce_lr(
    study: str, results: str = RESULTS, train_size: int | None = None, complete: bool = False
) -> str:
    """The fine-tuning learning rate chosen on validation: the ``bce_finetune-lr*`` seed-1 cell of ``study``
    (at ``train_size`` rows) with the highest validation macro-F1 (a tie: the larger rate, read as a number, as
    the grid's extension rule reads it), among the points run so far (a table labels it provisional until
    :func:`bce_grid_done`; ``complete`` requires that, as a run that trains at it does). ValueError when none
    has finished yet, or with ``complete`` while the grid is not."""
    scores = bce_validation_scores(study, results, train_size)
    size = "" if train_size is None else f" at --train-size {train_size}"
    if not scores:
        raise ValueError(
            f"--lr best: no finished bce_finetune-lr* seed-1 cell{size} under {os.path.join(results, study)}; "
            "run the BCE learning-rate cells first (run_all.sh full-reuters-base / full-goemotions-base / scale)"
        )
    if complete and not bce_grid_done(study, results, train_size):
        raise ValueError(
            f"--lr best: the learning-rate grid of {study}{size} is not complete (ran: {', '.join(sorted(scores))}); "
            "run --lr extend" + (" and extend2" if train_size is not None else "") + " first"
        )
    return max(scores, key=lambda lr: (scores[lr], float(lr)))


def long_cell(lr: str) -> str:
    """The cell folder of the longer-budget BCE run at learning rate ``lr`` (``run.py --tag long --lr <lr>``)."""
    return f"bce_finetune-{LONG_TAG}-lr{lr}"


def bce_budget(study: str, results: str = RESULTS) -> str:
    """``"long"`` when the longer-budget BCE run of ``study`` beats the 5-epoch run at the chosen learning rate
    on seed-1 validation macro-F1, else ``"base"`` (always ``"base"`` for a study without a longer run).
    ValueError for a study without results, or while a run the choice needs has not finished."""
    if not os.path.isdir(os.path.join(results, study)):
        raise ValueError(
            f"no study {study!r} under {results} (the full-data studies: reuters21578, goemotions_full)"
        )
    if study not in LONG_BUDGET:
        return "base"
    scores = bce_validation_scores(study, results)
    lr = best_bce_lr(study, results)
    long = metrics_path(study, long_cell(lr), 1, results)
    if not os.path.isfile(long):
        raise ValueError(
            f"{study}: the BCE run with {LONG_BUDGET[study]} at lr {lr} (seed 1) has not finished, so the "
            "budget of the BCE baseline is not chosen yet (run_all.sh full-reuters runs it before the seeds)"
        )
    return "long" if validation_macro_f1(long) > scores[lr] else "base"


if __name__ == "__main__":
    if sys.argv[1:] == ["--weights"]:  # the joint objective's grid of w, for run_all.sh
        print(" ".join(JOINT_WEIGHTS))
        sys.exit(0)
    if len(sys.argv) != 2:
        sys.exit("usage: python studies/bce_choice.py <study> | --weights")
    try:
        print(bce_budget(sys.argv[1]))
    except ValueError as err:
        sys.exit(f"error: {err}")
