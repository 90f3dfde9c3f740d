"""``hf-mlcl``: the command-line entry point (``python -m hf_mlcl``, ``accelerate launch -m hf_mlcl.cli``).

:func:`main` runs the sub-commands (``train``, ``probe``, ``run``, ``evaluate``, ``predict``, ``export``,
``push``, ``demo``, ``inspect``) of the parser :func:`~hf_mlcl.cli_parser.build_parser` builds; what they
print around a run is in :mod:`hf_mlcl.cli_report`. The command line only parses arguments and prints, and
nothing in the library imports it.

Design: docs/design.md, "Command line (hf_mlcl/cli.py)".
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from hf_mlcl.cli_parser import HELP_MODEL_DATA_KEYS, HELP_TRAINING_KEYS, build_parser, override_keys_help
from hf_mlcl.cli_report import announce, print_footprint, report_run, saved_line, say
from hf_mlcl.training import distributed as D

logger = logging.getLogger("hf_mlcl.cli")

__all__ = [
    "COMMANDS",
    "HELP_MODEL_DATA_KEYS",
    "HELP_TRAINING_KEYS",
    "Terminated",
    "build_parser",
    "cmd_demo",
    "cmd_evaluate",
    "cmd_export",
    "cmd_inspect",
    "cmd_predict",
    "cmd_probe",
    "cmd_push",
    "cmd_run",
    "cmd_train",
    "configure_logging",
    "main",
    "override_keys_help",
]


# ----------------------------------------------------------------------------------------------------
# sub-commands
# ----------------------------------------------------------------------------------------------------
def _load(recipe_path: str | None, overrides: Sequence[str], stages: Sequence[str]):
    from hf_mlcl.recipes import load_recipe, split_overrides, validate_recipe

    recipe = load_recipe(recipe_path) if recipe_path else {}
    validate_recipe(recipe, recipe_path or "recipe")
    return recipe, split_overrides(overrides, stages)


def _check_models(model_args, base: bool = True, **folders: str | None) -> None:
    """Before any training: each model / tokenizer / folder named exists locally or on a reachable Hub (the
    recipe's model only where the stage reads it, ``base``)."""
    from hf_mlcl.hub import check_model_source

    if model_args is not None:
        if base:
            check_model_source(model_args.model_name_or_path, "--model_name_or_path")
        check_model_source(model_args.tokenizer_name_or_path, "--tokenizer_name_or_path")
    for flag, name in folders.items():
        check_model_source(name, f"--{flag}")


def cmd_train(ns, overrides) -> dict:
    from hf_mlcl.recipes import parse_stage
    from hf_mlcl.training import stages
    from hf_mlcl.training.preflight import check_stage

    recipe, ov = _load(ns.recipe, overrides, ["contrastive"])
    model_args, data_args, args = parse_stage(recipe, "contrastive", ov, output_dir=ov.output_dir)
    check_stage(args, data_args)
    _check_models(model_args)
    result = stages.run_contrastive_stage(model_args, data_args, args)
    say(saved_line("contrastive", args.output_dir, result))
    return result.metrics


def cmd_probe(ns, overrides) -> dict:
    from hf_mlcl.evaluation.tables import format_table
    from hf_mlcl.modeling.builders import holds_a_model, holds_a_tokenizer, require_a_model
    from hf_mlcl.recipes import parse_stage, recipe_stages, stage_output_dir
    from hf_mlcl.training import stages
    from hf_mlcl.training.preflight import check_stage

    if ns.encoder_path:
        require_a_model(ns.encoder_path)  # a run's root folder names its encoder/ in one line
    recipe, ov = _load(ns.recipe, overrides, ["probe"])
    model_args, data_args, args = parse_stage(recipe, "probe", ov, output_dir=ov.output_dir)
    check_stage(args, data_args)
    encoder = ns.encoder_path
    if encoder is None and "contrastive" in recipe_stages(recipe):
        default = stage_output_dir(recipe, "contrastive")
        if holds_a_model(default):
            encoder = default  # a saved encoder: its own weights, or an adapter over its base
        elif args.process_index == 0:
            print(
                f"no encoder in {default}: the head goes on {model_args.model_name_or_path or 'the recipe model'} "
                "(the supervised baseline); pass --encoder_path for an encoder trained elsewhere"
            )
    if encoder and os.path.isdir(encoder) and os.path.realpath(args.output_dir) == os.path.realpath(encoder):
        from hf_mlcl.training.preflight import InputError

        raise InputError(
            f"--output_dir {args.output_dir} is the encoder being probed: the classifier would replace it; "
            "choose another --output_dir"
        )
    # an encoder folder with its tokenizer needs no recipe model (an adapter's base is named in the folder)
    _check_models(model_args, base=not holds_a_tokenizer(encoder), encoder_path=encoder)
    result = stages.run_probe_stage(model_args, data_args, args, encoder, stages.encoder_loss(encoder))
    if args.process_index == 0:
        print(saved_line("probe", args.output_dir, result))
        print(
            format_table(
                [{"classifier": os.path.basename(os.path.normpath(args.output_dir)), **result.metrics}],
                show_split=True,
            )
        )
        print_footprint(args.output_dir)
    return result.metrics


def cmd_run(ns, overrides) -> dict:
    """Both stages (as the recipe's ``stages`` says), test evaluation with plots, cards, optional push."""
    from hf_mlcl.recipes import (
        CLASSIFIER_STAGES,
        STAGES,
        RecipeError,
        parse_stage,
        recipe_stages,
        stage_output_dir,
    )
    from hf_mlcl.training import stages as S
    from hf_mlcl.training.checkpoints import remove_incomplete_checkpoints
    from hf_mlcl.training.preflight import check_stage
    from hf_mlcl.training.run_lock import RunLock

    recipe, _ = _load(ns.recipe, [], STAGES)
    names = recipe_stages(recipe)
    final = next((s for s in names if s in CLASSIFIER_STAGES), None)  # the stage writing the classifier
    if final is None:
        raise RecipeError(
            f"{ns.recipe} runs no classifier stage (stages: {names}): hf-mlcl run trains the recipe's stages and "
            f"scores the classifier on test; add probe or joint to its stages, or train the encoder alone with "
            f"hf-mlcl train {ns.recipe}"
        )
    _, ov = _load(None, overrides, names)
    parsed = {s: parse_stage(recipe, s, ov) for s in names if s == "contrastive"}
    parsed[final] = parse_stage(recipe, final, ov)
    if ns.push_to:  # before any training: a push that cannot work must not cost two stages
        _check_push(ns.push_to, *([f"{ns.push_to}-encoder"] if "contrastive" in names else []))
        _check_adapters_pushable([model_args for model_args, _, _ in parsed.values()])
    for _, stage_data, stage_args in parsed.values():  # before any work: both stages' folders and the launch
        check_stage(stage_args, stage_data)
    model_args, data_args, pargs = parsed[final]
    _check_models(parsed["contrastive" if "contrastive" in parsed else final][0])  # and the models
    stage_args = {name: args for name, (_, _, args) in parsed.items()}
    run_root = ov.output_dir or recipe.get("output_dir") or os.path.dirname(stage_output_dir(recipe, final))
    _check_results_file(run_root, pargs)
    # one run per run folder, held for all its stages, the evaluation and results.json: a second run (or a
    # resume) into it stops in one line, never between two stages of this one
    lock = RunLock(run_root) if pargs.should_save else None
    if lock is not None:
        lock.acquire()
        # the temp files of interrupted writes (a killed run's results.json)
        remove_incomplete_checkpoints(run_root)
    try:
        results = S.run_stages(model_args, data_args, stage_args, evaluate=not ns.no_plots, announce=announce)
        if pargs.process_index == 0:
            report_run(ns, run_root, results, final, pargs.output_dir)
    finally:
        if lock is not None:
            lock.release()
    return {k: r.metrics for k, r in results.items()}


def _check_results_file(run_root: str, args) -> None:
    """A run's root that holds a saved model, or whose ``results.json`` is not this run's to replace (a demo's
    table, a file of the user's, or another run's results without --overwrite_output_dir /
    --resume_from_checkpoint), stops before any work."""
    from hf_mlcl.files import json_shape
    from hf_mlcl.modeling.builders import holds_a_model
    from hf_mlcl.training.checkpoints import wants_resume
    from hf_mlcl.training.preflight import InputError

    if holds_a_model(run_root):  # a run writes its stages' folders inside its root: never into a model
        raise InputError(
            f"--output_dir {run_root} holds a saved model; a run writes its stages' folders (encoder/, "
            "classifier/) and results.json inside its --output_dir: choose another folder"
        )
    path = os.path.join(run_root, "results.json")
    shape = json_shape(path)
    if shape is None or (
        shape == "object" and (args.overwrite_output_dir or wants_resume(args.resume_from_checkpoint))
    ):
        return
    what = (
        "another run's results"
        if shape == "object"
        else "a file that is not a run's results (a demo's table?)"
    )
    raise InputError(
        f"{path} holds {what}; choose another --output_dir"
        + (", or pass --overwrite_output_dir true to replace it" if shape == "object" else "")
    )


def _check_adapters_pushable(stage_model_args: list) -> None:
    """An input error where a stage saves LoRA adapters over a local base model: such an adapter loads nowhere
    else, so its push is refused (:mod:`hf_mlcl.hub.push`), and that must be said before any training."""
    from hf_mlcl.training.preflight import InputError

    for model_args in stage_model_args:
        base = model_args.model_name_or_path
        if model_args.use_lora and not model_args.merge_lora and base and os.path.isdir(base):
            raise InputError(
                f"--push_to: the LoRA adapters this run saves sit on the local base model {base!r}, so a pushed "
                "adapter would load nowhere else; push the base model to the Hub and train from its id, or "
                "train with --merge_lora true"
            )


def _check_push(repo_id: str, *more_ids: str, token: str | None = None, before_training: bool = True) -> None:
    """:func:`hf_mlcl.hub.check_push_target` as an input error (every process of a launch finds it: said once)."""
    from hf_mlcl.hub import check_push_target, check_repo_id
    from hf_mlcl.training.preflight import InputError

    try:
        for name in (repo_id, *more_ids):
            check_repo_id(name)
        check_push_target(repo_id, token=token, before_training=before_training)
    except (ValueError, ConnectionError) as err:
        raise InputError(str(err)) from err


def cmd_evaluate(ns, overrides) -> dict:
    from hf_mlcl.evaluation.tables import TABLE_KEYS, format_table
    from hf_mlcl.recipes import STAGES, parse_stage
    from hf_mlcl.training import stages

    _check_models(None, checkpoint=ns.checkpoint)
    recipe, ov = _load(ns.recipe, overrides, [])
    recipe = {k: v for k, v in recipe.items() if k not in (*STAGES, "stages")}
    if ns.recipe is None:
        recipe = _data_recipe_of(ns.checkpoint, user_dataset="--dataset" in ov.common)
    recipe["probe"] = {}  # only the data arguments matter here
    _, data_args, _ = parse_stage(recipe, "probe", ov, output_dir=ns.checkpoint)
    metrics = stages.evaluate_checkpoint(
        ns.checkpoint,
        data_args,
        split=ns.split,
        batch_size=ns.batch_size,
        plots=not ns.no_plots,
        output_dir=ns.output_dir,
    )
    print(
        format_table(
            [{"checkpoint": os.path.basename(os.path.normpath(ns.checkpoint)), **metrics}],
            keys=TABLE_KEYS,
            prefix=f"{ns.split}_",
            show_split=True,
        )
    )
    return metrics


def _data_recipe_of(checkpoint: str, user_dataset: bool) -> dict:
    """The data keys a checkpoint was trained with, from its card_data.json: dataset, its loader options
    and max_length (a user's ``--dataset`` drops the stored dataset and its options, not max_length). Local
    data paths are found from any working directory (:func:`hf_mlcl.hub.resolve_local_data`)."""
    from hf_mlcl.hub import CARD_DATA_FILE, CardData, resolve_local_data

    if not os.path.isfile(os.path.join(checkpoint, CARD_DATA_FILE)):
        logger.warning("%s has no %s: evaluating with the default data arguments", checkpoint, CARD_DATA_FILE)
        return {}
    card = CardData.load(checkpoint)
    recipe: dict[str, Any] = {}
    if card.dataset and not user_dataset:
        local = resolve_local_data(card, checkpoint)
        recipe["dataset"] = local.get("dataset", card.dataset)
        if local.get("data_dir"):
            recipe["data_dir"] = local["data_dir"]
        if card.dataset_options:
            recipe["dataset_options"] = dict(card.dataset_options)
        if local.get("data_files"):
            recipe.setdefault("dataset_options", {})["data_files"] = local["data_files"]
    if card.hyperparameters.get("max_length") is not None:
        recipe["max_length"] = int(card.hyperparameters["max_length"])
    say(f"evaluate: data arguments from {os.path.join(checkpoint, CARD_DATA_FILE)}: {recipe}")
    return recipe


def _no_overrides(overrides: Sequence[str]) -> None:
    """Commands that take no recipe keys: extra arguments are bad input (exit status 2)."""
    from hf_mlcl.recipes import RecipeError

    if overrides:
        raise RecipeError(f"unexpected arguments {list(overrides)}")


def cmd_predict(ns, overrides) -> dict:
    from hf_mlcl.prediction import predict_file

    _no_overrides(overrides)
    summary = predict_file(
        ns.classifier,
        ns.input,
        ns.output,
        text_column=ns.text_column,
        batch_size=ns.batch_size,
        max_length=ns.max_length,
        device=ns.device,
        all_scores=ns.all_scores,
        prediction_prefix=ns.prediction_prefix,
    )
    say(
        f"predicted {summary['rows']} texts ({summary['labels_per_text']:.2f} labels per text, threshold "
        f"{summary['threshold']}) into {summary['output']}"
    )
    return summary


def cmd_export(ns, overrides) -> dict:
    from hf_mlcl.onnx_export import export_onnx

    _no_overrides(overrides)
    info = export_onnx(ns.folder, opset=ns.opset)
    say(f"exported the {info['kind']} to {info['path']} (inputs {info['inputs']}, outputs {info['outputs']})")
    return info


def cmd_push(ns, overrides) -> dict:
    from hf_mlcl.hub import check_pushable, push_folder
    from hf_mlcl.hub.locate import hub_endpoint

    _no_overrides(overrides)
    check_pushable(ns.folder)  # what is wrong with the folder first, then with the Hub
    _check_push(ns.repo_id, token=ns.token, before_training=False)
    info = push_folder(
        ns.folder,
        ns.repo_id,
        token=ns.token,
        private=ns.private,
        revision=ns.revision,
        commit_message=ns.commit_message,
    )
    print(f"pushed {ns.folder} to {hub_endpoint()}/{ns.repo_id} ({info})")
    return {}


def cmd_demo(ns, overrides) -> dict:
    from hf_mlcl.demo import run_demo

    _no_overrides(overrides)
    return run_demo(
        output_dir=ns.output_dir,
        dataset=ns.dataset,
        data_dir=ns.data_dir,
        model=ns.model,
        losses=ns.losses,
        epochs=ns.epochs,
        probe=ns.probe,
        max_train_samples=ns.max_train_samples,
        max_eval_samples=ns.max_eval_samples,
        max_length=ns.max_length,
        seed=ns.seed,
    )


def cmd_inspect(ns: argparse.Namespace, rest: list[str]) -> None:
    """Thin caller of :func:`hf_mlcl.analysis.inspect_dataset`: print the table, write JSON + PNGs."""
    if rest:
        raise ValueError(f"unrecognised arguments: {' '.join(rest)}")
    import torch

    from hf_mlcl.analysis import format_report, inspect_dataset, write_report
    from hf_mlcl.analysis.report import check_report_prefix

    # a dataset given as a path names its files by its file name: the report goes into --output_dir only
    prefix = check_report_prefix(
        ns.prefix or os.path.splitext(os.path.basename(os.path.normpath(ns.dataset)))[0]
    )  # before the report is computed
    options = {}
    for item in ns.option:
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"--option takes key=value (a loader keyword), got {item!r}")
        try:
            options[key] = json.loads(value)  # numbers, true / false, lists
        except json.JSONDecodeError:
            options[key] = value
    # the command owns its process: the inspection's sampled (B, B + K) products are small, and one intra-op
    # thread avoids the pool's contention on them
    torch.set_num_threads(1)
    report = inspect_dataset(
        ns.dataset,
        ns.data_dir,
        splits=[s for s in ns.splits.split(",") if s],
        loader_options=options,
        batch_size=ns.batch_size,
        queue_size=ns.queue_size,
        num_processes=ns.num_processes,
        k_min=ns.k_min,
        n_batches=ns.batches,
        seed=ns.seed,
    )
    print(format_report(report))
    paths = write_report(report, ns.output_dir, prefix=prefix)
    print("wrote " + ", ".join(paths.values()))


def configure_logging(level_name: str) -> None:
    """One ``--log_level`` for everything a command prints besides its own results: hf_mlcl's loggers,
    transformers' and datasets' (pad-token and similar warnings), Python warnings (torch's pin_memory
    UserWarning) through the ``py.warnings`` logger, and the "Loading weights" / dataset ``map`` bars,
    which show only at ``info`` and ``debug``. Training progress follows ``--disable_tqdm``."""
    level = getattr(logging, level_name.upper())
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.captureWarnings(True)
    import datasets
    import transformers

    transformers.utils.logging.set_verbosity(level)
    datasets.utils.logging.set_verbosity(level)
    if level <= logging.INFO:
        transformers.utils.logging.enable_progress_bar()
        datasets.enable_progress_bars()
    else:
        transformers.utils.logging.disable_progress_bar()
        datasets.disable_progress_bars()


COMMANDS = {
    "train": cmd_train,
    "probe": cmd_probe,
    "run": cmd_run,
    "evaluate": cmd_evaluate,
    "predict": cmd_predict,
    "export": cmd_export,
    "push": cmd_push,
    "demo": cmd_demo,
    "inspect": cmd_inspect,
}


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's pre-emption, ``kill``): stops a command as Ctrl-C does, with the resume hint."""


def _terminate_like_ctrl_c():
    """Make SIGTERM raise :class:`Terminated` in the main thread while a command of a single-process run runs
    (the command line owns its process); returns the handler to restore, None where none is set: off the main
    thread, and under a multi-process launch, whose launcher stops the other processes with SIGTERM when one
    fails (a process waiting in a collective would only see the exception once the collective returns)."""
    import threading

    if (
        threading.current_thread() is not threading.main_thread()
        or int(os.environ.get("WORLD_SIZE", "1")) > 1
    ):
        return None

    def terminated(signum, frame):
        raise Terminated

    return signal.signal(signal.SIGTERM, terminated)


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the process exit status."""
    from hf_mlcl.hub import PushError
    from hf_mlcl.recipes import RecipeError
    from hf_mlcl.training.launch import LaunchFailures
    from hf_mlcl.training.preflight import InputError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, rest = parser.parse_known_args(argv)
    configure_logging(ns.log_level)
    # under a multi-process launch: a failure on any process (any node) stops every process, naming it
    failures = LaunchFailures(f"hf-mlcl {ns.command}").start()
    previous = _terminate_like_ctrl_c()
    try:
        _check_output_paths(ns)
        COMMANDS[ns.command](ns, rest)
    except KeyboardInterrupt as err:
        how = "terminated" if isinstance(err, Terminated) else "interrupted"
        failures.announce(how)
        if os.environ.get("RANK", "0") == "0":
            print(f"\nhf-mlcl {ns.command}: {how}. {_resume_hint(ns.command, argv)}", file=sys.stderr)
        return 143 if isinstance(err, Terminated) else 130
    except (RecipeError, ValueError, FileNotFoundError, ConnectionError, ImportError) as err:
        failures.announce(f"{err}")
        # every process found it (the same inputs): say it once per node (node-local folders may differ)
        if not (isinstance(err, InputError) and os.environ.get("LOCAL_RANK", "0") != "0"):
            print(f"hf-mlcl {ns.command}: error: {err}", file=sys.stderr)
        return 2
    except PushError as err:
        failures.announce(f"{err}")
        print(f"hf-mlcl {ns.command}: {err}", file=sys.stderr)
        return 1
    except BaseException as err:
        failures.stop()
        peer = failures.peer_failure()
        if (
            peer is not None
        ):  # this error is the consequence (a lost connection): report the cause, once per node
            if os.environ.get("LOCAL_RANK", "0") == "0":
                print(f"hf-mlcl {ns.command}: error: {peer}", file=sys.stderr)
            return 2
        failures.announce(f"{type(err).__name__}: {err}")
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    failures.stop()
    D.shutdown()  # a clean end of a multi-process run (see hf_mlcl.training.distributed.shutdown)
    return 0


def _check_output_paths(ns) -> None:
    """A command's own ``--output_dir`` (evaluate, demo, inspect) where a file stands, or ``predict``'s ``--output``
    naming a folder: one line before any work (the stages check theirs in ``check_stage``)."""
    from hf_mlcl.files import file_in_the_way

    folder = getattr(ns, "output_dir", None)
    blocking = file_in_the_way(folder) if folder else None
    if blocking is not None:
        raise ValueError(
            f"--output_dir {folder}: {blocking} is a file, not a folder; choose another --output_dir"
        )
    output = getattr(ns, "output", None)
    if isinstance(output, str) and os.path.isdir(output):
        raise ValueError(f"--output {output} is a folder; name the file to write (.jsonl or .csv)")


def _resume_hint(command: str, argv: Sequence[str]) -> str:
    """One line telling how to continue an interrupted command from its last complete checkpoint."""
    import shlex

    if command not in ("train", "probe", "run"):
        return "Nothing to resume."
    kept, skip_value = [], None
    for arg in argv:  # any earlier --resume_from_checkpoint is replaced; a secret is never echoed
        key = arg.split("=", 1)[0]
        if skip_value is not None:
            if skip_value:
                kept.append("...")
            skip_value = None
        elif key == "--resume_from_checkpoint":
            skip_value = False if "=" not in arg else None
        elif key.lstrip("-").rsplit(".", 1)[-1] in _SECRET_OPTIONS:
            kept.append(f"{key}=..." if "=" in arg else arg)
            skip_value = True if "=" not in arg else None
        else:
            kept.append(arg)
    return "Resume with: hf-mlcl " + shlex.join([*kept, "--resume_from_checkpoint", "true"])


_SECRET_OPTIONS = (
    "hub_token",
    "token",
)  # their values are not printed (an override may carry a stage prefix)


if __name__ == "__main__":
    sys.exit(main())
