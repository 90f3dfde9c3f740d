"""Complete-or-absent checkpoints and the resume choice: a checkpoint folder is marked while it is written
(:data:`SAVING_MARKER`), an incomplete one is never resumed from, and :func:`resolve_resume` picks the last
complete checkpoint on every process.

Design: docs/design.md, "Output folders and checkpoints (hf_mlcl/training/checkpoints.py)".
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any

from transformers import TrainerCallback

from hf_mlcl.files import TMP_PREFIX, disk_full

from . import distributed as D
from .checksums import check_checkpoint, write_checksums
from .run_settings import write_run_settings

logger = logging.getLogger(__name__)

__all__ = [
    "SAVING_MARKER",
    "CheckpointSaveError",
    "CompleteCheckpointsMixin",
    "checkpoint_folders",
    "is_complete_checkpoint",
    "last_complete_checkpoint",
    "parse_resume",
    "remove_checkpoints",
    "remove_incomplete_checkpoints",
    "resolve_resume",
    "wants_resume",
    "whole_run_train_loss",
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


def _interrupted_temp(name: str, folder_name: str | None = None) -> bool:
    """A temp file or folder of an interrupted atomic write: inside ``output_dir`` a ``.tmp-*`` file
    (:mod:`hf_mlcl.files`) or the ``.checkpoint-N.tmp-*`` folder a checkpoint save writes before renaming it
    into place; beside it (``folder_name`` given) only the ``.<folder_name>.tmp-*`` folder of the stage's own
    final save, never another entry of the parent folder."""
    if folder_name is not None:
        return name.startswith(f".{folder_name}.tmp-")
    if name.startswith(TMP_PREFIX):
        return True
    return (
        name.startswith(".")
        and _CHECKPOINT_RE.match(name[1:].split(".tmp-", 1)[0]) is not None
        and ".tmp-" in name
    )


def remove_checkpoints(output_dir: str) -> list[str]:
    """Delete every ``checkpoint-*`` folder of ``output_dir``; returns them."""
    removed = checkpoint_folders(output_dir)
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def remove_incomplete_checkpoints(output_dir: str) -> list[str]:
    """Delete the incomplete ``checkpoint-*`` folders of ``output_dir`` and the temp files and folders of
    interrupted saves in it (and beside it, for its own final save); returns them."""
    removed = [p for p in checkpoint_folders(output_dir) if not is_complete_checkpoint(p)]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    output_dir = os.path.normpath(output_dir)
    parent = os.path.dirname(os.path.abspath(output_dir))
    places = [(output_dir, None), (parent, os.path.basename(os.path.abspath(output_dir)))]
    for folder, target in places:
        if not os.path.isdir(folder):
            continue
        for name in sorted(os.listdir(folder)):
            path = os.path.join(folder, name)
            if not _interrupted_temp(name, target):
                continue
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=True)
            else:
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


def resolve_resume(
    value: Any, output_dir: str, is_main_process: bool = True, max_steps: int = -1
) -> str | None:
    """What to hand ``Trainer.train(resume_from_checkpoint=...)``.

    ``None`` / ``False`` / ``"false"``: start fresh. ``True`` / ``"true"``: the newest checkpoint complete
    in the ``output_dir`` of every process (node-local folders may differ) after removing incomplete ones
    (``is_main_process``: the process that writes the folder; every rank waits for it), or ``None``
    (start fresh) when there is none yet; with ``max_steps > 0`` one before that step (Trainer resumed at
    ``max_steps`` in the middle of an epoch trains one step past it; the steps after the checkpoint taken
    are trained again, to the same weights). A path: that folder, which must be complete.
    """
    value = parse_resume(value)
    if value is False:
        return None
    if value is True:
        if is_main_process:
            remove_incomplete_checkpoints(output_dir)
        D.barrier()
        last = _last_complete_on_every_process(output_dir, is_main_process, max_steps)
        if last is None:
            logger.warning(f"no complete checkpoint in {output_dir}: starting this stage from the beginning")
        elif is_main_process:
            print(f"resuming from {last}", flush=True)
        return last
    path = value
    if not is_complete_checkpoint(path):
        if not os.path.isdir(path):
            why = "does not exist"
        elif os.path.exists(os.path.join(path, SAVING_MARKER)):
            why = f"is interrupted (it holds {SAVING_MARKER})"
        else:
            why = f"is not a Trainer checkpoint (it holds no {TRAINER_STATE})"
        raise ValueError(
            f"resume_from_checkpoint={path} {why}; pass --resume_from_checkpoint true to take the last "
            "complete checkpoint of output_dir"
        )
    damage = check_checkpoint(path)
    if damage.damaged:
        raise ValueError(
            f"resume_from_checkpoint={path} is damaged: {damage.describe()} differ from what was saved; pass "
            "--resume_from_checkpoint true to take the last undamaged checkpoint of output_dir"
        )
    _warn_missing_rng(path, damage.missing_rng, is_main_process)
    if is_main_process:
        print(f"resuming from {path}", flush=True)
    return path


def _warn_missing_rng(path: str, missing: list[str], is_main_process: bool) -> None:
    if missing and is_main_process:
        logger.warning(
            f"{path} lacks {', '.join(missing)}: the resumed run draws other random numbers (data order, "
            "dropout) than the uninterrupted one would"
        )


def _intact_steps(output_dir: str, check: bool) -> tuple[list[int], str | None]:
    """The steps of the complete checkpoints of ``output_dir`` without the damaged newest ones (``check``: the
    process that reads the folder compares checksums, newest first, until an undamaged one), and a note naming
    the damaged ones when no checkpoint is left."""
    complete = [p for p in checkpoint_folders(output_dir) if is_complete_checkpoint(p)]
    if not check:
        return [_step(p) for p in complete], None
    damaged = []
    while complete:
        found = check_checkpoint(complete[-1]).damaged
        if not found:
            break
        path = complete.pop()
        damaged.append(f"{os.path.basename(path)}: {', '.join(found)}")
        logger.warning(f"{path} is damaged ({', '.join(found)}): resuming from the checkpoint before it")
    note = "; ".join(damaged) if damaged and not complete else None
    return [_step(p) for p in complete], note


def whole_run_train_loss(log_history: list[dict], start_step: int, end_step: int, this_call: float) -> float:
    """The mean training loss over every step of a run that resumed at ``start_step`` and ended at
    ``end_step``. ``Trainer`` reports ``train_loss`` over the steps of its own ``train()`` call only
    (``this_call``); the steps before the resume are read from the checkpoint's ``log_history``, whose
    ``loss`` entries are each the mean over the steps since the entry before (:class:`CompleteCheckpointsMixin`
    logs at every save, so they reach ``start_step``). Where they do not (a checkpoint of another writer),
    ``this_call`` is returned unchanged."""
    if start_step <= 0:
        return this_call
    total, covered = 0.0, 0
    for entry in log_history:
        if "loss" in entry and covered < entry.get("step", 0) <= start_step:
            total += float(entry["loss"]) * (entry["step"] - covered)
            covered = entry["step"]
    if covered != start_step or end_step <= 0:
        logger.warning(
            "train_loss covers the steps after the resume only: the checkpoint's log does not reach "
            f"step {start_step}"
        )
        return this_call
    return (total + this_call * max(end_step - start_step, 0)) / end_step


class _LogAtEverySave(TrainerCallback):
    """Log the training loss whenever a checkpoint is saved, so every checkpoint's ``log_history`` covers
    every step before it (:func:`whole_run_train_loss`), and note the step ``train()`` started from."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        self.trainer.train_start_step = state.global_step

    def on_step_end(self, args, state, control, **kwargs):
        if control.should_save:
            control.should_log = True

    on_epoch_end = on_step_end


def _step(path: str) -> int:
    return int(_CHECKPOINT_RE.match(os.path.basename(path)).group(1))


def _remove_checkpoints_after(output_dir: str, step: int, is_main_process: bool, why: str) -> None:
    """The main process removes the checkpoints of ``output_dir`` past ``step`` (the resumed run writes them
    again); every process waits for it."""
    if is_main_process:
        for path in checkpoint_folders(output_dir):
            if _step(path) > step:
                shutil.rmtree(path, ignore_errors=True)
                logger.warning(f"removed {path}: {why}")
    D.barrier()


def _last_complete_on_every_process(
    output_dir: str, is_main_process: bool, max_steps: int = -1
) -> str | None:
    """The newest checkpoint complete in the ``output_dir`` of every process, or None when no process has one.

    Every process of a shared folder sees the same checkpoints. Node-local folders (``save_on_each_node``)
    can differ: a node killed in the middle of a save has that checkpoint incomplete (removed by then),
    the others complete; resuming each node from its own newest would start the processes at different
    steps, which never meet in their collectives. So the processes agree on the newest step complete
    everywhere, and the main process of a folder removes its checkpoints past that step (the resumed run
    writes them again). ValueError when some node has checkpoints but none is complete on every node."""
    found = D.all_gather_object(_intact_steps(output_dir, is_main_process))
    notes = [note for _, note in found if note]
    if notes:
        raise ValueError(
            f"resume_from_checkpoint: every checkpoint of {output_dir} is damaged ({notes[0]}); pass "
            "--overwrite_output_dir true without --resume_from_checkpoint to train this stage again"
        )
    every = [[s for s in steps if max_steps <= 0 or s < max_steps] for steps, _ in found]
    common = set(every[0]).intersection(*every[1:])
    if not common:
        if any(every):
            held = "; ".join(
                f"process {r}: {', '.join(f'checkpoint-{s}' for s in st) or 'none'}"
                for r, st in enumerate(every)
            )
            raise ValueError(
                f"resume_from_checkpoint: no checkpoint of {output_dir} is complete on every node ({held}); copy "
                "one complete checkpoint folder to every node, or start without --resume_from_checkpoint"
            )
        _remove_checkpoints_after(output_dir, 0, is_main_process, "none before max_steps to resume from")
        return None
    step = max(common)
    why = "the newest complete on every node" + (f" before max_steps {max_steps}" if max_steps > 0 else "")
    _remove_checkpoints_after(output_dir, step, is_main_process, f"newer than checkpoint-{step}, {why}")
    chosen = os.path.join(output_dir, f"checkpoint-{step}")
    _warn_missing_rng(
        chosen, check_checkpoint(chosen).missing_rng if is_main_process else [], is_main_process
    )
    return chosen


class CheckpointSaveError(ValueError):
    """A checkpoint could not be written (the device is full); the earlier ones are intact."""


class CompleteCheckpointsMixin:
    """Mix into a ``transformers.Trainer`` subclass (before ``Trainer``): checkpoints are complete or
    marked. Subclasses add their own files in :meth:`save_extra_checkpoint_files`, which runs while
    the folder is still marked."""

    train_start_step = 0  # the step the last train() call started from (> 0 after a resume)
    run_settings: dict | None = (
        None  # what the result depends on (run_settings.stage_settings), kept per checkpoint
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_callback(_LogAtEverySave(self))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        """``Trainer.log``, with the final ``train_loss`` of a resumed run over all its steps
        (:func:`whole_run_train_loss`), not only the steps after the resume."""
        if "train_loss" in logs and self.train_start_step > 0:
            logs["train_loss"] = whole_run_train_loss(
                self.state.log_history, self.train_start_step, self.state.global_step, logs["train_loss"]
            )
        super().log(logs, start_time)

    def save_extra_checkpoint_files(self, folder: str) -> None:
        """Write files of this trainer beyond the Trainer's own into ``folder`` (main process)."""

    def _save_checkpoint(self, model, trial) -> None:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, rotate_checkpoints

        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")
        marker = os.path.join(folder, SAVING_MARKER)
        if self.args.should_save:
            os.makedirs(folder, exist_ok=True)
            with open(marker, "w", encoding="utf-8") as fh:
                fh.write("a save is in progress; this checkpoint is incomplete until this file is gone\n")
        D.barrier()  # no rank writes into the folder before it is marked
        # Trainer rotates old checkpoints inside its save, ordered by modification time (and notices when two
        # saves within a second make that unreliable); they are rotated below instead, by step, once the new
        # checkpoint is complete, so the newest complete one never goes before its successor is finished
        limit, self.args.save_total_limit = self.args.save_total_limit, None
        try:
            super()._save_checkpoint(model, trial)
        except Exception as err:  # noqa: BLE001 (re-raised unless the device was full)
            if not disk_full(err, run_dir):
                raise
            raise CheckpointSaveError(
                f"no space left on the device while writing {folder} (it stays marked incomplete and is never "
                "resumed from; the earlier checkpoints are intact): free space, then resume with "
                "--resume_from_checkpoint true"
            ) from err
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save and os.path.isdir(folder):
            self.save_extra_checkpoint_files(folder)
            write_run_settings(folder, self.run_settings)
        D.barrier()  # every rank's shards / optimizer states are on disk
        if self.args.should_save and os.path.isdir(folder):
            write_checksums(folder, skip=(SAVING_MARKER,))  # checked before a resume reads the folder
        if self.args.should_save and os.path.exists(marker):
            os.unlink(marker)
        if self.args.should_save:
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )
