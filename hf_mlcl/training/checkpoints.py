"""The output folder of a stage: checks before a run writes, complete-or-absent checkpoints, the resume
choice, and the contrastive trainer's extra state file.

:func:`check_launch`, :func:`check_output_dir` and :class:`InputError` check before any long work;
:class:`CompleteCheckpointsMixin` and :func:`resolve_resume` keep and pick complete checkpoints;
:func:`save_state_file` / :func:`load_state_file` store the trainer's extra state as safetensors.

Design: docs/design.md, "Output folders and checkpoints (hf_mlcl/training/checkpoints.py)".
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
from transformers import TrainerCallback

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
    "check_lora_save",
    "check_output_dir",
    "check_stage",
    "check_train_batches",
    "checkpoint_folders",
    "finished_stage_metrics",
    "is_complete_checkpoint",
    "last_complete_checkpoint",
    "load_state_file",
    "new_folders",
    "optimizer_state_to_tree",
    "parse_resume",
    "preflight",
    "remove_checkpoints",
    "remove_incomplete_checkpoints",
    "remove_previous_checkpoints",
    "require_a_step",
    "resolve_resume",
    "save_state_file",
    "stage_finished",
    "tree_to_optimizer_state",
    "wants_resume",
    "whole_run_train_loss",
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
    each node's main process only; every process exits with the same status."""


# ----------------------------------------------------------------------------------------------------
# before any work: the launch and the output folder
# ----------------------------------------------------------------------------------------------------
def check_launch(args: Any) -> None:
    """Refuse a launch that would not form a working process group on this machine, or would not train
    with the DeepSpeed / FSDP engine it asks for (:func:`hf_mlcl.training.launch.launch_problem`)."""
    from .launch import launch_problem, requested_engine

    problem = launch_problem(args)
    if problem:
        raise InputError(problem)
    if _lone_process_of_a_cpu_launch():
        raise InputError(
            "accelerate launch started this process on its own: with --cpu (or use_cpu: true in the accelerate "
            "config) it starts one process per machine and forms no process group, so every process or machine "
            "would train its own model into the same output folder; launch with --config_file "
            "recipes/accelerate/cpu.yaml and no --cpu, and pass --use_cpu true to hf-mlcl (for one process, "
            "run hf-mlcl without accelerate launch or unset MASTER_ADDR)"
        )
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    deepspeed = requested_engine(args) == "deepspeed"  # runs on CPU processes over gloo by itself
    if world > 1 and not torch.cuda.is_available() and not getattr(args, "use_cpu", False) and not deepspeed:
        raise InputError(
            f"launched as {world} processes (WORLD_SIZE={world}) on a machine without a GPU: add "
            "--use_cpu true so the processes train together over gloo (or launch one process)"
        )


def _lone_process_of_a_cpu_launch() -> bool:
    """True when ``accelerate launch --cpu`` asked for several processes or machines and got this one alone.

    Its CPU launcher (accelerate 1.x ``simple_launcher``) runs the script once per machine, without torchrun
    (without mpirun, too, unless given a hostfile); it sets ``ACCELERATE_USE_CPU`` and, for more than one
    process or machine, ``MASTER_ADDR`` / ``MASTER_PORT``, but no ``WORLD_SIZE``, so accelerate sees one
    process and the machines train side by side, each its own model, into the same folder."""
    env = os.environ
    if env.get("ACCELERATE_USE_CPU", "").lower() not in ("true", "1") or not env.get("MASTER_ADDR"):
        return False
    ranked = ("WORLD_SIZE", "RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE")
    return not any(env.get(name) for name in ranked)


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


def remove_previous_checkpoints(
    output_dir: str, overwrite: bool, resume: Any, is_main_process: bool = True
) -> None:
    """With ``overwrite`` and no resume: delete the ``checkpoint-*`` folders an earlier run left in
    ``output_dir`` (main process; every rank waits), so no later resume picks them. Call it only once the
    new run's inputs have passed their checks, right before training."""
    if not overwrite or wants_resume(resume):
        return
    if is_main_process:
        for path in remove_checkpoints(output_dir):
            logger.warning(f"--overwrite_output_dir: removed {path} of the previous run")
    D.barrier()


def stage_finished(output_dir: str) -> bool:
    """True when a stage's folder holds its final model, metrics and card (``FINISHED_FILES``)."""
    config = ("config.json", "adapter_config.json")  # a model of its own, or an adapter over its base
    return any(os.path.isfile(os.path.join(output_dir, name)) for name in config) and all(
        os.path.isfile(os.path.join(output_dir, name)) for name in FINISHED_FILES
    )


def check_stage(args: Any) -> None:
    """Stop before any work when the launch cannot form a working process group or ``args.output_dir``
    holds another run (:func:`check_launch`, :func:`check_output_dir`). Deletes nothing: with
    ``overwrite_output_dir`` the old checkpoints go only once the stage's data and model have loaded."""
    check_launch(args)
    check_output_dir(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint)


def finished_stage_metrics(args: Any) -> dict | None:
    """When resuming and the stage's folder already holds its finished output (:func:`stage_finished`): its
    saved metrics (the stage is not redone). Otherwise None. Under several processes the stage counts as
    finished only when it is in every process's folder (node-local folders may differ), so every process
    takes the same path (every process calls this)."""
    if not wants_resume(args.resume_from_checkpoint):
        return None
    if not all(D.all_gather_object(stage_finished(args.output_dir))):
        return None
    print(f"{args.output_dir} is finished; resuming after it")
    with open(os.path.join(args.output_dir, FINISHED_FILES[0]), encoding="utf-8") as fh:
        return json.load(fh)


def preflight(
    args: Any, stage: str, train_rows: int | None, lora: tuple[Any, str | None, bool] | None = None
) -> list[str]:
    """The checks of a stage's inputs once its data are loaded and before its model is built; returns the
    folders the stage will create (:func:`new_folders`, removed again by :func:`require_a_step`).

    ``train_rows``: the train split must fill one batch (:func:`check_train_batches`; None skips it: the
    logistic probe fits on all rows at once). ``lora``: ``(model_args, source, adapter_encoder)`` of a stage
    that saves LoRA adapters: under DeepSpeed / FSDP it must be able to write them (:func:`check_lora_save`).
    """
    if train_rows is not None:
        check_train_batches(train_rows, args, stage)
    created = new_folders(args.output_dir)
    if lora is not None:
        check_lora_save(lora[0], args, lora[1], lora[2])
    return created


def check_lora_save(model_args: Any, args: Any, source: str | None, adapter_encoder: bool = False) -> None:
    """Before any loading: a LoRA run under DeepSpeed / FSDP must be able to write its adapter at the end
    (ValueError naming the fix otherwise)."""
    from .launch import requested_engine

    engine = requested_engine(args)
    if engine is None:
        return
    if not (source or model_args.model_name_or_path):
        raise ValueError(
            f"use_lora with a backbone built from backbone_config under {engine}: the sharded weights have no base "
            "model to save an adapter for; build the backbone from a saved model (model_name_or_path)"
        )
    if adapter_encoder:
        raise ValueError(
            f"probe: finetune with use_lora on an encoder saved as a LoRA adapter under {engine}: the new adapter "
            "applies to the merged encoder, not to the base model; save stage 1 with --merge_lora true or fine-tune "
            "without DeepSpeed / FSDP (the merged weights are then saved)"
        )


def check_train_batches(n_rows: int, args: Any, stage: str) -> None:
    """:class:`InputError` (a ValueError, one line) when the train split cannot
    fill one batch on every process and the stage
    drops an incomplete last batch (``dataloader_drop_last``, stage 1's default): the stage would make no
    optimizer step. Each process takes ``args.train_batch_size`` rows per batch, ``args.world_size``
    processes share the split. Runs before any model is built or any folder is written."""
    if not args.dataloader_drop_last:
        return  # a short last batch still trains
    processes = max(1, int(args.world_size))
    per_process = int(args.train_batch_size)
    if n_rows >= per_process * processes:
        return
    batch = f"per_device_train_batch_size {per_process}" + (
        f" x {processes} processes" if processes > 1 else ""
    )
    fit = n_rows // processes
    fix = (
        f"lower per_device_train_batch_size to at most {fit}"
        if fit
        else f"launch at most {n_rows} process{'es' if n_rows > 1 else ''}"
    )
    raise InputError(
        f"the train split has {n_rows} rows, fewer than one batch of {per_process * processes} ({batch}), and "
        f"{stage} drops an incomplete last batch (dataloader_drop_last true), so it would train no step; {fix}, "
        "or add training rows"
    )


def new_folders(path: str) -> list[str]:
    """``path`` and those of its parents that do not exist yet, deepest first."""
    out, path = [], os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        out.append(path)
        path = os.path.dirname(path)
    return out


def require_a_step(trainer: Any, created: list[str], stage: str) -> None:
    """:class:`InputError` (nothing saved) when the stage's training made no
    optimizer step, e.g.
    ``num_train_epochs 0``: its model would be the untrained one. The empty folders the stage created
    (``created``, :func:`new_folders`; the Trainer makes ``output_dir``) are removed again."""
    if trainer.state.global_step > 0:
        return
    D.barrier()
    if trainer.args.should_save:  # the process that writes this folder (one per node with save_on_each_node)
        for folder in created:  # deepest first; only folders this stage created and left empty
            if os.path.isdir(folder) and not os.listdir(folder):
                os.rmdir(folder)
    args = trainer.args
    raise InputError(
        f"{stage} made no optimizer step (num_train_epochs {args.num_train_epochs}, max_steps {args.max_steps}, "
        f"{len(trainer.train_dataset)} train rows), so no model was saved; train at least one step"
    )


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


def _interrupted_temp(name: str, folder_name: str | None = None) -> bool:
    """A temp file or folder of an interrupted atomic write: ``.tmp-*`` (:mod:`hf_mlcl.files`), or the
    ``.<target>.tmp-*`` folder a model save writes before renaming it into place (``.checkpoint-4.tmp-x``
    inside ``output_dir``; ``.<folder_name>.tmp-x`` beside it for the stage's own final save)."""
    if name.startswith(TMP_PREFIX):
        return True
    if folder_name is not None:
        return name.startswith(f".{folder_name}.tmp-")
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
        elif is_main_process:
            print(f"resuming from {last}", flush=True)
        return last
    path = value
    if not is_complete_checkpoint(path):
        why = f"is interrupted (it holds {SAVING_MARKER})" if os.path.isdir(path) else "does not exist"
        raise ValueError(
            f"resume_from_checkpoint={path} {why}; pass --resume_from_checkpoint true to take the last "
            "complete checkpoint of output_dir"
        )
    if is_main_process:
        print(f"resuming from {path}", flush=True)
    return path


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
            held = "; ".join(
                f"process {r}: {', '.join(f'checkpoint-{s}' for s in st) or 'none'}"
                for r, st in enumerate(every)
            )
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
                logger.warning(
                    f"removed {path}: newer than checkpoint-{step}, the newest complete on every node"
                )
    D.barrier()
    return os.path.join(output_dir, f"checkpoint-{step}")


class CompleteCheckpointsMixin:
    """Mix into a ``transformers.Trainer`` subclass (before ``Trainer``): checkpoints are complete or
    marked. Subclasses add their own files in :meth:`save_extra_checkpoint_files`, which runs while
    the folder is still marked."""

    train_start_step = 0  # the step the last train() call started from (> 0 after a resume)

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
        finally:
            self.args.save_total_limit = limit
        if self.args.should_save and os.path.isdir(folder):
            self.save_extra_checkpoint_files(folder)
        D.barrier()  # every rank's shards / optimizer states are on disk
        if self.args.should_save and os.path.exists(marker):
            os.unlink(marker)
        if self.args.should_save:
            rotate_checkpoints(
                output_dir=run_dir,
                save_total_limit=limit,
                best_model_checkpoint=self.state.best_model_checkpoint,
                use_mtime=False,
            )


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
                raise ValueError(
                    f"checkpoint state keys must be strings without '/'; got {key!r} under {path!r}"
                )
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
    target = torch.device(device)
    # safetensors names the CPU "cpu" only; a process of a multi-process CPU launch has the device cpu:0
    where = "cpu" if target.type == "cpu" else str(target)
    return _rebuild(json.loads(meta[_TREE_KEY]), load_file(path, device=where))


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
