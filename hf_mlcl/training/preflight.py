"""Checks before a stage does long work: the launch, the output folder, the LoRA save, the training batches, and
whether a stage already finished; :class:`InputError` for bad input every process finds alike.

Design: docs/design.md, "Output folders and checkpoints (hf_mlcl/training/checkpoints.py)", the checks.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import shutil
from typing import Any

import torch

from hf_mlcl.files import file_in_the_way
from hf_mlcl.hub.model_card import CARD_DATA_FILE
from hf_mlcl.modeling.builders import holds_a_model

from . import distributed as D
from .checkpoints import remove_checkpoints, wants_resume
from .run_settings import RUN_SETTINGS_FILE, changed_settings, check_resume_settings

logger = logging.getLogger(__name__)

__all__ = [
    "FINISHED_FILES",
    "InputError",
    "METRICS_FILE",
    "check_launch",
    "check_lora_save",
    "check_output_dir",
    "check_some_steps",
    "check_stage",
    "check_train_batches",
    "finished_everywhere",
    "finished_stage_metrics",
    "new_folders",
    "preflight",
    "remove_previous_run",
    "replaces_previous_run",
    "require_a_step",
    "stage_finished",
]

METRICS_FILE = "metrics.json"  # a stage's metrics, written by the stage
# written last by a stage (metrics by the stage, the card data by its card callback)
FINISHED_FILES = (METRICS_FILE, CARD_DATA_FILE)
# What a run, and the commands that read its folder afterwards (evaluate, export), write into a stage's folder;
# a new run replacing it removes them first, so that nothing of the old model stays beside the new one (a
# sentence-transformers head beside a native classifier, an adapter beside a full model, an ONNX export, an
# evaluation or plots of the old weights), to be loaded or pushed with it
PREVIOUS_RUN_OUTPUTS = (
    "model*.safetensors",  # (not every *.safetensors: a feature cache kept in the folder is no model)
    "adapter_model.safetensors",
    "model*.safetensors.index.json",
    "pytorch_model*.bin",
    "training_args.bin",
    "config.json",
    "mlcl_config.json",
    "adapter_config.json",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "configuration_mlcl.py",
    "modeling_mlcl.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "*.model",
    "chat_template.jinja",
    "README.md",
    "thresholds.json",
    "trainer_state.json",
    "eval_*.json",
    "1_Pooling",
    "2_Dense",
    "3_Dense",
    "onnx",
    "plots",
)


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
    ``overwrite`` nor ``resume`` is asked for (see module doc), or when a file stands where it or a parent
    folder would go. Deletes nothing."""
    blocking = file_in_the_way(output_dir)
    if blocking is not None:
        raise InputError(
            f"output_dir {output_dir}: {blocking} is a file, not a folder; choose another --output_dir"
        )
    if overwrite or wants_resume(resume) or not os.path.isdir(output_dir) or not os.listdir(output_dir):
        return
    shown = sorted(os.listdir(output_dir))
    more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
    raise InputError(
        f"output_dir {output_dir} already holds a run ({', '.join(shown[:5])}{more}); pass "
        "--overwrite_output_dir true to replace it, --resume_from_checkpoint true to continue it, "
        "or choose another --output_dir"
    )


def replaces_previous_run(args: Any, settings: dict | None = None) -> bool:
    """True when the stage trains from scratch over a run its folder may hold: ``overwrite_output_dir`` without a
    resume, or with a resume of a finished stage (:func:`finished_everywhere`) trained with other ``settings``
    (a resume mid-stage goes on from its checkpoint with the new settings). Every process calls this."""
    if not args.overwrite_output_dir:
        return False
    if not wants_resume(args.resume_from_checkpoint):
        return True
    return finished_everywhere(args.output_dir) and bool(changed_settings(args.output_dir, settings))


def remove_previous_run(output_dir: str, is_main_process: bool = True) -> None:
    """Delete the previous run in ``output_dir``: its ``checkpoint-*`` folders, the files that mark a stage
    finished (``FINISHED_FILES``) and its run settings, which would let a later resume take it for this one, and
    its model and what was derived from it (``PREVIOUS_RUN_OUTPUTS``), which would stay beside the new model
    (main process; every rank waits). Call it only once the new run's inputs have passed their checks, right
    before training (:func:`replaces_previous_run`). Other files in the folder stay. Every rank has loaded its
    model before anything goes (the folder may be the one it loaded from)."""
    D.barrier()
    if is_main_process:
        for path in remove_checkpoints(output_dir):
            logger.warning(f"--overwrite_output_dir: removed {path} of the previous run")
        patterns = (*FINISHED_FILES, RUN_SETTINGS_FILE, *PREVIOUS_RUN_OUTPUTS)
        present = sorted(os.listdir(output_dir)) if os.path.isdir(output_dir) else []
        gone = [name for name in present if any(fnmatch.fnmatch(name, p) for p in patterns)]
        for name in gone:
            path = os.path.join(output_dir, name)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        if set(gone) - {*FINISHED_FILES, RUN_SETTINGS_FILE}:
            logger.warning(
                f"--overwrite_output_dir: removed the previous run's model files from {output_dir}"
            )
    D.barrier()


def stage_finished(output_dir: str) -> bool:
    """True when a stage's folder holds its final model, metrics and card (``FINISHED_FILES``)."""
    return holds_a_model(output_dir) and all(
        os.path.isfile(os.path.join(output_dir, name)) for name in FINISHED_FILES
    )


def check_stage(args: Any, data_args: Any = None) -> None:
    """Stop before any work when the launch cannot form a working process group, ``args.output_dir``
    holds another run (:func:`check_launch`, :func:`check_output_dir`) or lies inside the dataset folder of
    ``data_args`` (:func:`check_output_outside_data`). Deletes nothing: with ``overwrite_output_dir`` the old
    checkpoints go only once the stage's data and model have loaded."""
    check_launch(args)
    check_output_dir(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint)
    if data_args is not None:
        check_output_outside_data(args.output_dir, getattr(data_args, "dataset", None))


def check_output_outside_data(output_dir: str, dataset: Any) -> None:
    """InputError in one line when ``output_dir`` lies inside the local dataset folder ``dataset``: the run's
    JSON files would be read as data files by the next load of that folder."""
    if not isinstance(dataset, (str, os.PathLike)) or not os.path.isdir(dataset):
        return
    folder, out = os.path.realpath(dataset), os.path.realpath(output_dir)
    if os.path.commonpath([folder, out]) == folder:
        raise InputError(
            f"output_dir {output_dir} lies inside the dataset folder {dataset}: its files would be read as data by "
            "the next load of that folder; choose an --output_dir outside it"
        )


def finished_everywhere(output_dir: str) -> bool:
    """:func:`stage_finished` in every process's folder (node-local folders may differ), so that every process
    takes the same path (every process calls this)."""
    return all(D.all_gather_object(stage_finished(output_dir)))


def finished_stage_metrics(args: Any, settings: dict | None = None) -> dict | None:
    """When resuming and the stage's folder already holds its finished output (:func:`finished_everywhere`): its
    saved metrics (the stage is not redone). Otherwise None. ``settings``: the new run's
    (:func:`~hf_mlcl.training.run_settings.stage_settings`); a finished stage trained with others is a
    ValueError listing them, or with ``overwrite_output_dir`` trained again from scratch (None;
    :func:`replaces_previous_run`)."""
    if not wants_resume(args.resume_from_checkpoint) or not finished_everywhere(args.output_dir):
        return None
    if args.overwrite_output_dir and changed_settings(args.output_dir, settings):
        return None  # trained again with the new settings
    check_resume_settings(args.output_dir, settings, overwrite=False)
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
        check_some_steps(args, stage)
        check_train_batches(train_rows, args, stage)
    created = new_folders(args.output_dir)
    if lora is not None:
        check_lora_save(lora[0], args, lora[1], lora[2])
    return created


def check_lora_save(model_args: Any, args: Any, source: str | None, adapter_encoder: bool = False) -> None:
    """Before any loading: a LoRA run under DeepSpeed / FSDP must be able to write its adapter at the end
    (:class:`InputError` naming the fix otherwise). ``adapter_encoder``: the stage fine-tunes an encoder saved
    as a LoRA adapter (or that stage 1 of the same run will save as one)."""
    from .launch import requested_engine

    engine = requested_engine(args)
    if engine is None:
        return
    if not (source or model_args.model_name_or_path):
        raise InputError(
            f"use_lora with a backbone built from backbone_config under {engine}: the sharded weights have no base "
            "model to save an adapter for; build the backbone from a saved model (model_name_or_path)"
        )
    if adapter_encoder:
        raise InputError(
            f"a LoRA fine-tune (probe: finetune, or the joint stage) on an encoder saved as a LoRA adapter under "
            f"{engine}: the new adapter "
            "applies to the merged encoder, not to the base model; save stage 1 with --merge_lora true or fine-tune "
            "without DeepSpeed / FSDP (the merged weights are then saved)"
        )


def check_some_steps(args: Any, stage: str) -> None:
    """:class:`InputError` (one line) when the schedule asks for no optimizer step (``max_steps`` unset and
    ``num_train_epochs`` 0 or below): found before anything is built or any earlier run's file removed
    (:func:`require_a_step` catches the schedules that round to no step)."""
    if int(args.max_steps) > 0 or float(args.num_train_epochs) > 0:
        return
    raise InputError(
        f"{stage} would train no step (num_train_epochs {args.num_train_epochs}, max_steps {args.max_steps}): "
        "set num_train_epochs above 0 or max_steps"
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
