"""Complete-or-absent Trainer checkpoints, and which one ``resume_from_checkpoint`` picks.

``transformers.Trainer`` writes ``checkpoint-<step>`` in place (weights, optimizer, scheduler, RNG,
``trainer_state.json``) and our trainers add their own files after it (the contrastive trainer's
safetensors state ``mlcl_trainer_state.safetensors``, :mod:`hf_mlcl.training.checkpoint_state`). A
process killed half-way (``kill -9``, OOM, pre-emption) leaves a folder that *looks* like the newest
checkpoint, and ``resume_from_checkpoint=True`` (``transformers.trainer_utils.get_last_checkpoint``)
would pick it and fail, or worse resume from half-written state.

:class:`CompleteCheckpointsMixin` writes a ``.saving`` marker into the folder before anything else and
removes it only after every file (and every rank) is done, so

* a checkpoint is *complete* when it has ``trainer_state.json`` and no ``.saving`` marker
  (checkpoints written before this marker existed count as complete when they hold
  ``trainer_state.json``, which the Trainer writes after the weights and optimizer);
* :func:`resolve_resume` turns ``True`` / ``"true"`` into the newest checkpoint complete on every process
  (node-local folders of a multi-node run may differ), removes the incomplete ones (and temp files left
  by interrupted atomic writes) on the process that writes the folder, and starts fresh (``None``) when
  the folder holds no checkpoint yet, so ``hf-mlcl run --resume_from_checkpoint true`` can resume
  whichever stage was interrupted.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any

from hf_mlcl.files import TMP_PREFIX

from . import distributed as D

logger = logging.getLogger(__name__)

__all__ = [
    "SAVING_MARKER",
    "CompleteCheckpointsMixin",
    "checkpoint_folders",
    "is_complete_checkpoint",
    "last_complete_checkpoint",
    "parse_resume",
    "remove_incomplete_checkpoints",
    "resolve_resume",
    "wants_resume",
]

SAVING_MARKER = ".saving"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"


def checkpoint_folders(output_dir: str) -> list[str]:
    """Every ``checkpoint-<step>`` folder in ``output_dir``, oldest step first."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        m = _CHECKPOINT_RE.match(name)
        if m and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), os.path.join(output_dir, name)))
    return [path for _, path in sorted(found)]


def is_complete_checkpoint(path: str) -> bool:
    """True when ``path`` holds a finished checkpoint: ``trainer_state.json`` and no ``.saving`` marker."""
    return (
        os.path.isdir(path)
        and os.path.isfile(os.path.join(path, TRAINER_STATE))
        and not os.path.exists(os.path.join(path, SAVING_MARKER))
    )


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest complete checkpoint folder in ``output_dir``, or None."""
    complete = [p for p in checkpoint_folders(output_dir) if is_complete_checkpoint(p)]
    return complete[-1] if complete else None


def remove_incomplete_checkpoints(output_dir: str) -> list[str]:
    """Delete the incomplete ``checkpoint-*`` folders and ``.tmp-*`` files of ``output_dir``; returns them."""
    removed = [p for p in checkpoint_folders(output_dir) if not is_complete_checkpoint(p)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    if os.path.isdir(output_dir):
        for name in os.listdir(output_dir):
            path = os.path.join(output_dir, name)
            if name.startswith(TMP_PREFIX) and os.path.isfile(path):
                os.unlink(path)
                removed.append(path)
    for path in removed:
        logger.warning(f"removed {path}: left over by an interrupted save")
    return removed


def parse_resume(value: Any) -> bool | str:
    """``resume_from_checkpoint`` as given (YAML, command line, Python) read in one place: ``False`` (start
    fresh: None, False, "false", ""), ``True`` (the last complete checkpoint: True, "true") or a path."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("true", "false", ""):
            return text.lower() == "true"
        return text
    return bool(value) if value is None or isinstance(value, bool) else str(value)


def wants_resume(value: Any) -> bool:
    """True for a ``resume_from_checkpoint`` that asks to resume (True, "true" or a path)."""
    return parse_resume(value) is not False


def resolve_resume(value: Any, output_dir: str, is_main_process: bool = True) -> str | None:
    """What to hand ``Trainer.train(resume_from_checkpoint=...)``.

    ``None`` / ``False`` / ``"false"``: start fresh. ``True`` / ``"true"``: the newest checkpoint complete
    in the ``output_dir`` of every process (node-local folders may differ) after removing incomplete ones
    (``is_main_process``: the process that writes the folder; every rank waits for it), or ``None``
    (start fresh) when there is none yet. A path: that folder, which must be complete.
    """
    value = parse_resume(value)
    if value is False:
        return None
    if value is True:
        if is_main_process:
            remove_incomplete_checkpoints(output_dir)
        D.barrier()
        last = _last_complete_on_every_process(output_dir, is_main_process)
        if last is None:
            logger.warning(f"no complete checkpoint in {output_dir}: starting this stage from the beginning")
        return last
    path = value
    if not is_complete_checkpoint(path):
        why = f"is interrupted (it holds {SAVING_MARKER})" if os.path.isdir(path) else "does not exist"
        raise ValueError(
            f"resume_from_checkpoint={path} {why}; pass --resume_from_checkpoint true to take the last "
            "complete checkpoint of output_dir"
        )
    return path


def _step(path: str) -> int:
    return int(_CHECKPOINT_RE.match(os.path.basename(path)).group(1))


def _last_complete_on_every_process(output_dir: str, is_main_process: bool) -> str | None:
    """The newest checkpoint complete in the ``output_dir`` of every process, or None when no process has one.

    Every process of a shared folder sees the same checkpoints. Node-local folders (``save_on_each_node``)
    can differ: a node killed in the middle of a save has that checkpoint incomplete (removed by then),
    the others complete; resuming each node from its own newest would start the processes at different
    steps, which never meet in their collectives. So the processes agree on the newest step complete
    everywhere, and the main process of a folder removes its checkpoints past that step (the resumed run
    writes them again). ValueError when some node has checkpoints but none is complete on every node."""
    steps = [_step(p) for p in checkpoint_folders(output_dir) if is_complete_checkpoint(p)]
    every = D.all_gather_object(steps)
    common = set(every[0]).intersection(*every[1:])
    if not common:
        if any(every):
            held = "; ".join(f"process {r}: {', '.join(f'checkpoint-{s}' for s in st) or 'none'}" for r, st in enumerate(every))
            raise ValueError(
                f"resume_from_checkpoint: no checkpoint of {output_dir} is complete on every node ({held}); copy "
                "one complete checkpoint folder to every node, or start without --resume_from_checkpoint"
            )
        return None
    step = max(common)
    if is_main_process:
        for path in checkpoint_folders(output_dir):
            if _step(path) > step:
                shutil.rmtree(path, ignore_errors=True)
                logger.warning(f"removed {path}: newer than checkpoint-{step}, the newest complete on every node")
    D.barrier()
    return os.path.join(output_dir, f"checkpoint-{step}")


class CompleteCheckpointsMixin:
    """Mix into a ``transformers.Trainer`` subclass (before ``Trainer``): checkpoints are complete or
    marked. Subclasses add their own files in :meth:`save_extra_checkpoint_files`, which runs while
    the folder is still marked."""

    def save_extra_checkpoint_files(self, folder: str) -> None:
        """Write files of this trainer beyond the Trainer's own into ``folder`` (main process)."""

    def _save_checkpoint(self, model, trial) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(self._get_output_dir(trial=trial), f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        marker = os.path.join(folder, SAVING_MARKER)
        if self.args.should_save:
            os.makedirs(folder, exist_ok=True)
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write("a save is in progress; this checkpoint is incomplete until this file is gone\n")
        D.barrier()  # no rank writes into the folder before it is marked
        super()._save_checkpoint(model, trial)
        if self.args.should_save and os.path.isdir(folder):
            self.save_extra_checkpoint_files(folder)
        D.barrier()  # every rank's shards / optimizer states are on disk
        if self.args.should_save and os.path.exists(marker):
            os.unlink(marker)
