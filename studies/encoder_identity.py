"""Which stage-1 encoder a cell stood on: the digest of its weights, recorded by studies/run.py in the cell's
``stage1`` record, and the groups of cells that should share one encoder (same study, loss, stage-1
arguments, training size and seed) but recorded different stage-1 trainings.

    python studies/encoder_identity.py     # prints the groups whose cells stood on different encoders

Protocol: docs/study.md, "The runner (studies/run.py)".
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import paths  # noqa: E402  (studies/paths.py: where the cells' outputs live)

WEIGHT_SUFFIX = ".safetensors"


def weights_digest(folder: str) -> str | None:
    """SHA-256 over the ``*.safetensors`` files under ``folder`` (relative path and bytes, in path order); None
    when the folder holds none."""
    files = sorted(glob.glob(os.path.join(folder, "**", "*" + WEIGHT_SUFFIX), recursive=True))
    files = [f for f in files if "/checkpoint-" not in f.replace(os.sep, "/")]
    if not files:
        return None
    digest = hashlib.sha256()
    for path in files:
        digest.update(os.path.relpath(path, folder).encode() + b"\0")
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def stage1_identity(stage1: dict, by_digest: bool = True) -> tuple:
    """What tells one stage-1 training from another: its weights' digest where ``by_digest`` and recorded; else
    its training loss (the cells of one training copy its record; a retraining that repeats the same steps on
    the CPU repeats the loss to the last digit and the weights with it)."""
    if by_digest and stage1.get("weights_sha256"):
        return ("sha256", stage1["weights_sha256"])
    return ("train_loss", stage1.get("train_loss"))


def shared_encoder_groups(root: str | None = None) -> dict[tuple, list[tuple[str, dict]]]:
    """The cells with a stage 1, grouped by what should make them stand on one encoder (study, loss, stage-1
    arguments, training size, seed): ``{group: [(cell, stage1 record), ...]}``."""
    root = root or paths.RESULTS
    groups: dict[tuple, list[tuple[str, dict]]] = defaultdict(list)
    for path in sorted(glob.glob(os.path.join(root, "*", "*", "seed*", "metrics.json"))):
        with open(path, encoding="utf-8") as fh:
            run = json.load(fh)
        if not run.get("stage1"):
            continue
        study, cell, seed = path.split(os.sep)[-4:-1]
        args = json.dumps(run.get("contrastive_args") or {}, sort_keys=True)
        key = (study, run.get("loss"), args, run.get("train_size") or 0, seed)
        groups[key].append((cell, run["stage1"]))
    return dict(groups)


def group_identities(cells: list[tuple[str, dict]]) -> list[tuple[str, tuple]]:
    """Each cell's :func:`stage1_identity`, compared on the digest where every cell of the group recorded one and
    on the training loss otherwise (a cell recorded before the digest and one after are told apart by what both
    recorded)."""
    by_digest = all(stage1.get("weights_sha256") for _, stage1 in cells)
    return [(cell, stage1_identity(stage1, by_digest)) for cell, stage1 in cells]


def disagreements(root: str | None = None) -> list[tuple[tuple, list[tuple[str, tuple]]]]:
    """The groups of :func:`shared_encoder_groups` whose cells recorded more than one stage-1 training:
    ``[(group, [(cell, identity), ...]), ...]``, sorted."""
    found = []
    for key, cells in sorted(shared_encoder_groups(root).items()):
        identities = group_identities(cells)
        if len({ident for _, ident in identities}) > 1:
            found.append((key, identities))
    return found


def _gap(cells: list[tuple[str, tuple]]) -> str:
    """How far apart the recorded training losses are (relative), where the group was compared on them."""
    losses = [ident[1] for _, ident in cells if ident[0] == "train_loss" and ident[1] is not None]
    if len(losses) < len(cells):
        return " (weights differ)"
    return f" (training losses {min(losses):.4f} to {max(losses):.4f}, {(max(losses) - min(losses)) / min(losses):.1e} apart)"


def report(root: str | None = None) -> str:
    """One line per group of :func:`disagreements` and a count line."""
    found = disagreements(root)
    shared = sum(len(cells) > 1 for cells in shared_encoder_groups(root).values())
    lines = [
        f"{study} {loss} n{size or 'all'} {seed}: " + ", ".join(cell for cell, _ in cells) + _gap(cells)
        for (study, loss, _, size, seed), cells in found
    ]
    return "\n".join(
        [*lines, f"stage-1 trainings differ within {len(found)} of {shared} groups of cells that share one"]
    )


if __name__ == "__main__":
    print(report())
