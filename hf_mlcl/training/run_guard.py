"""Checks that run before any long work: a sane launch, and an output folder that is never mixed.

* :func:`check_launch`: several processes (``WORLD_SIZE > 1``, e.g. ``accelerate launch`` with the
  multi-GPU config) on a machine without a GPU need ``--use_cpu true``; without it the Trainer would
  train every rank on the whole data outside the process group. The error names the flag. A process that
  ``accelerate launch --cpu`` started alone although it asked for several processes or machines stops
  too, naming the launch that works. A launch that
  asks for DeepSpeed or FSDP but would get something else (``use_cpu``, FSDP without GPU, several
  DeepSpeed CPU processes without ``--ddp_backend gloo``, GradCache under DeepSpeed) stops with the
  cause and the fix (:func:`hf_mlcl.training.sharding.launch_problem`).
* :func:`check_output_dir`: a new run into a folder that already holds files stops with a clear error
  unless the user passes ``--overwrite_output_dir true`` or resumes (``--resume_from_checkpoint``). It
  only checks: nothing is deleted before the new run's inputs are checked.
* :func:`remove_previous_checkpoints`: with ``--overwrite_output_dir true``, the old run's checkpoints
  are removed (so a later resume can never pick them) — called by the stage entry points
  (:mod:`hf_mlcl.training.entry`) once the data, the model and the batch size have passed their checks,
  right before training starts, so a typo in the new run's inputs never costs the old run's checkpoints.
* :func:`stage_finished`: a stage folder whose final save, metrics and card are all written.

:class:`InputError` is the ValueError of a check that every process of a launch runs on the same inputs
(the output folder, the batch size against the train rows): ``hf-mlcl`` prints it once per node, on the
node's main process, instead of once per process.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from . import distributed as D
from .checkpoints import checkpoint_folders, wants_resume

logger = logging.getLogger(__name__)

__all__ = [
    "InputError", "check_launch", "check_output_dir", "remove_previous_checkpoints", "stage_finished", "FINISHED_FILES",
]  # fmt: skip


class InputError(ValueError):
    """Bad input found alike by every process of a launch (see module doc): the command line prints it on
    each node's main process only; every process exits with the same status."""

# written last by a stage (metrics by hf_mlcl.training.entry, the card data by the CLI's stage runner)
FINISHED_FILES = ("metrics.json", "card_data.json")


def check_launch(args: Any) -> None:
    """Refuse a launch that would not form a working process group on this machine, or would not train
    with the DeepSpeed / FSDP engine it asks for (:func:`hf_mlcl.training.sharding.launch_problem`)."""
    import torch

    from .sharding import launch_problem, requested_engine

    problem = launch_problem(args)
    if problem:
        raise ValueError(problem)
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
        raise ValueError(
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
