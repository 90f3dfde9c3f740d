"""The output folder of a stage: checks before a run writes, complete-or-absent checkpoints, the resume choice,
and the contrastive trainer's extra state file.

**Before any long work** (:func:`check_launch`, :func:`check_output_dir`):

* several processes (``WORLD_SIZE > 1``, e.g. ``accelerate launch`` with the multi-GPU config) on a
  machine without a GPU need ``--use_cpu true``; without it the Trainer would train every rank on the
  whole data outside the process group. A launch that asks for DeepSpeed or FSDP but would get something
  else (``use_cpu``, FSDP without GPU, several DeepSpeed CPU processes without ``--ddp_backend gloo``,
  GradCache under DeepSpeed) stops with the cause and the fix
  (:func:`hf_mlcl.training.sharding.launch_problem`);
* a new run into a folder that already holds files stops with a clear error unless the user passes
  ``--overwrite_output_dir true`` or resumes (``--resume_from_checkpoint``). It only checks: with
  ``--overwrite_output_dir true`` the old run's checkpoints go in :func:`remove_previous_checkpoints`,
  called by the stages (:mod:`hf_mlcl.training.stages`) once the data, the model and the batch size have
  passed their checks, right before training starts, so a typo in the new run's inputs never costs the
  old run's checkpoints. :func:`stage_finished`: a stage folder whose final save, metrics and card are
  all written.

:class:`InputError` is the ValueError of a check that every process of a launch runs on the same inputs
(the output folder, the batch size against the train rows): ``hf-mlcl`` prints it once, on the main
process, instead of once per process.

**Complete-or-absent checkpoints.** ``transformers.Trainer`` writes ``checkpoint-<step>`` in place
(weights, optimizer, scheduler, RNG, ``trainer_state.json``) and our trainers add their own files after
it (the contrastive trainer's state file, below). A process killed half-way (``kill -9``, OOM,
pre-emption) leaves a folder that *looks* like the newest checkpoint, and ``resume_from_checkpoint=True``
(``transformers.trainer_utils.get_last_checkpoint``) would pick it and fail, or worse resume from
half-written state. :class:`CompleteCheckpointsMixin` writes a ``.saving`` marker into the folder before
anything else and removes it only after every file (and every rank) is done, so

* a checkpoint is *complete* when it has ``trainer_state.json`` and no ``.saving`` marker
  (checkpoints written before this marker existed count as complete when they hold
  ``trainer_state.json``, which the Trainer writes after the weights and optimizer);
* :func:`resolve_resume` turns ``True`` / ``"true"`` into the newest complete checkpoint, removes the
  incomplete ones (and temp files left by interrupted atomic writes) on the main process, and starts
  fresh (``None``) when the folder holds no checkpoint yet, so ``hf-mlcl run --resume_from_checkpoint
  true`` can resume whichever stage was interrupted.

**The contrastive trainer's extra state** (loss parameters, momentum encoder, queue) is stored as
safetensors, without pickle, so resuming from a checkpoint someone else wrote never runs their code. A
state is a nested dict of tensors and plain JSON values (``{"loss": {...}, "queue": {"ptr": 3,
"embeddings": tensor, ...}}``). :func:`save_state_file` writes every tensor into one safetensors file
under its path joined with ``/`` and keeps the tree (with the plain values) as JSON in the file's
metadata; :func:`load_state_file` rebuilds the same dict. Checkpoints written before this format
(``mlcl_trainer_state.pt``) are still read, with ``torch.load(weights_only=True)`` (tensors and
primitive containers only, no arbitrary objects).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any

import torch

from hf_mlcl.files import TMP_PREFIX, atomic_path

from . import distributed as D

logger = logging.getLogger(__name__)

__all__ = [
    "FINISHED_FILES",
    "LEGACY_STATE_FILE",
    "SAVING_MARKER",
    "STATE_FILE",
    "CompleteCheckpointsMixin",
    "InputError",
    "check_launch",
    "check_output_dir",
    "checkpoint_folders",
    "is_complete_checkpoint",
    "last_complete_checkpoint",
    "load_state_file",
    "optimizer_state_to_tree",
    "parse_resume",
    "remove_incomplete_checkpoints",
    "remove_previous_checkpoints",
    "resolve_resume",
    "save_state_file",
    "stage_finished",
    "tree_to_optimizer_state",
    "wants_resume",
]

SAVING_MARKER = ".saving"
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
TRAINER_STATE = "trainer_state.json"
STATE_FILE = "mlcl_trainer_state.safetensors"
LEGACY_STATE_FILE = "mlcl_trainer_state.pt"
_TREE_KEY = "hf_mlcl_state"
_TENSOR = "__tensor__"
# written last by a stage (metrics by the stage, the card data by its card callback)
FINISHED_FILES = ("metrics.json", "card_data.json")


class InputError(ValueError):
    """Bad input found alike by every process of a launch (see module doc): the command line prints it on
    the main process only; every process exits with the same status."""


# ----------------------------------------------------------------------------------------------------
# before any work: the launch and the output folder
# ----------------------------------------------------------------------------------------------------
def check_launch(args: Any) -> None:
    """Refuse a launch that would not form a working process group on this machine, or would not train
    with the DeepSpeed / FSDP engine it asks for (:func:`hf_mlcl.training.sharding.launch_problem`)."""
    from .sharding import launch_problem, requested_engine

    problem = launch_problem(args)
    if problem:
        raise ValueError(problem)
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    deepspeed = requested_engine(args) == "deepspeed"  # runs on CPU processes over gloo by itself
    if world > 1 and not torch.cuda.is_available() and not getattr(args, "use_cpu", False) and not deepspeed:
        raise ValueError(
            f"launched as {world} processes (WORLD_SIZE={world}) on a machine without a GPU: add "
            "--use_cpu true so the processes train together over gloo (or launch one process)"
        )


def check_output_dir(output_dir: str, overwrite: bool, resume: Any) -> None:
    """Stop a new run from writing into ``output_dir`` when it already holds files and neither
    ``overwrite`` nor ``resume`` is asked for (see module doc). Deletes nothing."""
    if overwrite or wants_resume(resume) or not os.path.isdir(output_dir) or not os.listdir(output_dir):
        return
    shown = sorted(os.listdir(output_dir))
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    raise InputError(
        f"output_dir {output_dir} already holds a run ({', '.join(shown[:5])}{more}); pass "
        "--overwrite_output_dir true to replace it, --resume_from_checkpoint true to continue it, "
        "or choose another --output_dir"
    )


def remove_previous_checkpoints(output_dir: str, overwrite: bool, resume: Any, is_main_process: bool = True) -> None:
    """With ``overwrite`` and no resume: delete the ``checkpoint-*`` folders an earlier run left in
    ``output_dir`` (main process; every rank waits), so no later resume picks them. Call it only once the
    new run's inputs have passed their checks, right before training."""
    if not overwrite or wants_resume(resume):
        return
    if is_main_process:
        for path in checkpoint_folders(output_dir):
            shutil.rmtree(path, ignore_errors=True)
            logger.warning(f"--overwrite_output_dir: removed {path} of the previous run")
    D.barrier()


def stage_finished(output_dir: str) -> bool:
    """True when a stage's folder holds its final model, metrics and card (``FINISHED_FILES``)."""
    return all(os.path.isfile(os.path.join(output_dir, name)) for name in ("config.json", *FINISHED_FILES))


# ----------------------------------------------------------------------------------------------------
# complete-or-absent checkpoints and the resume choice
# ----------------------------------------------------------------------------------------------------
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

    ``None`` / ``False`` / ``"false"``: start fresh. ``True`` / ``"true"``: the newest complete checkpoint
    in ``output_dir`` after removing incomplete ones (main process only; every rank waits for it), or
    ``None`` (start fresh) when there is none yet. A path: that folder, which must be complete.
    """
    value = parse_resume(value)
    if value is False:
        return None
    if value is True:
        if is_main_process:
            remove_incomplete_checkpoints(output_dir)
        D.barrier()
        last = last_complete_checkpoint(output_dir)
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


# ----------------------------------------------------------------------------------------------------
# the contrastive trainer's extra state, as safetensors
# ----------------------------------------------------------------------------------------------------
def _flatten(node: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, torch.Tensor):
        if node.layout != torch.strided:
            raise ValueError(f"checkpoint state {path!r} is a sparse tensor; store it dense or as indices")
        tensors[path] = node.detach().to("cpu").contiguous().clone()
        return {_TENSOR: path}
    if isinstance(node, Mapping):
        out = {}
        for key, value in node.items():
            if not isinstance(key, str) or "/" in key:
                raise ValueError(f"checkpoint state keys must be strings without '/'; got {key!r} under {path!r}")
            out[key] = _flatten(value, f"{path}/{key}" if path else key, tensors)
        return out
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    raise ValueError(
        f"checkpoint state {path!r} holds a {type(node).__name__}; only tensors, dicts and plain values "
        "(int, float, str, bool, None) are stored"
    )


def _rebuild(node: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(node, dict):
        if set(node) == {_TENSOR}:
            return tensors[node[_TENSOR]]
        return {key: _rebuild(value, tensors) for key, value in node.items()}
    return node


def save_state_file(state: Mapping[str, Any], path: str) -> None:
    """Write ``state`` (nested dicts of tensors and plain values) to ``path`` as safetensors, atomically."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors)
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata={_TREE_KEY: json.dumps(tree)})


def load_state_file(path: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The state dict written by :func:`save_state_file` (tensors on ``device``); a legacy ``.pt`` file is
    read with ``torch.load(weights_only=True)``. ValueError when the file is not an hf_mlcl state."""
    if path.endswith(".pt"):
        return torch.load(path, map_location=device, weights_only=True)
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, framework="pt") as fh:
        meta = fh.metadata() or {}
    if _TREE_KEY not in meta:
        raise ValueError(f"{path} is not an hf_mlcl trainer state (no {_TREE_KEY!r} metadata)")
    return _rebuild(json.loads(meta[_TREE_KEY]), load_file(path, device=str(torch.device(device))))


def optimizer_state_to_tree(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ``torch.optim.Optimizer.state_dict()`` in the form :func:`save_state_file` stores: the per-parameter
    state keyed by the parameter index as a string, the param groups (plain values) as JSON text."""
    return {
        "state": {str(index): dict(values) for index, values in state["state"].items()},
        "param_groups": json.dumps(state["param_groups"]),
    }


def tree_to_optimizer_state(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_state_to_tree`: a state dict for ``Optimizer.load_state_dict``."""
    return {
        "state": {int(index): dict(values) for index, values in tree["state"].items()},
        "param_groups": json.loads(tree["param_groups"]),
    }
