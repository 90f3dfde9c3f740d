"""Recipe YAML files: composition (``_base_``), key validation, and parsing into argument dataclasses.

:func:`load_recipe` merges a recipe over its bases, :func:`validate_recipe` checks every key against the
argument dataclasses, :func:`split_overrides` / :func:`superseded_keys` apply command-line overrides and
:func:`parse_stage` builds a stage's arguments.

Design: docs/design.md, "Recipes (hf_mlcl/recipes.py)".
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Sequence
from typing import Any

import yaml

from hf_mlcl.stage_names import CLASSIFIER_STAGES, DEFAULT_STAGES, STAGES

BASE_KEY = "_base_"
META_KEYS = (BASE_KEY, "description", "output_dir", "stages", *STAGES)
STAGE_DIRS = {"contrastive": "encoder", "probe": "classifier", "joint": "classifier"}
DEFAULT_OUTPUT_ROOT = "outputs/run"


class RecipeError(ValueError):
    """A recipe file or an override is malformed (unknown key, bad ``_base_``, cycle ...)."""


# --------------------------------------------------------------------------------------------------
# composition
# --------------------------------------------------------------------------------------------------
def merge_recipes(base: dict, override: dict) -> dict:
    """Deep-merge ``override`` into a copy of ``base``: mappings merge per key, other values replace."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_recipes(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@functools.lru_cache(maxsize=256)
def _read_yaml_cached(path: str, mtime_ns: int) -> dict:
    with open(path, encoding="utf-8") as f:
        try:
            data = yaml.load(f, Loader=_LOADER)  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as err:
            raise RecipeError(f"{path} is not valid YAML: {err}") from err
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise RecipeError(f"{path} must hold a YAML mapping at top level; got {type(data).__name__}")
    return data


def _read_yaml(path: str) -> dict:
    """Parse one YAML file (cached per path and modification time: bases are shared by many cells)."""
    if not os.path.isfile(path):
        raise RecipeError(f"recipe file not found: {path}")
    return copy.deepcopy(_read_yaml_cached(path, os.stat(path).st_mtime_ns))


def load_recipe(path: str | os.PathLike, _chain: tuple[str, ...] = ()) -> dict:
    """Read a recipe and its ``_base_`` chain into one plain dict (no ``_base_`` key left).

    Raises RecipeError for a missing file, a non-mapping file, a malformed ``_base_`` or a cycle.
    """
    path = os.path.abspath(os.fspath(path))
    if path in _chain:
        cycle = " -> ".join([*_chain, path])
        raise RecipeError(f"_base_ cycle: {cycle}")
    data = _read_yaml(path)
    bases = data.pop(BASE_KEY, None) or []
    if isinstance(bases, str):
        bases = [bases]
    if not isinstance(bases, list) or not all(isinstance(b, str) for b in bases):
        raise RecipeError(f"{path}: {BASE_KEY} must be a path or a list of paths; got {bases!r}")
    merged: dict = {}
    here = os.path.dirname(path)
    for base in bases:
        base_path = os.path.join(here, base)
        if not os.path.isfile(base_path):
            raise RecipeError(f"{path}: its {BASE_KEY} {base!r} is not a file ({base_path})")
        merged = _merge_layered(merged, load_recipe(base_path, (*_chain, path)))
    return _merge_layered(merged, data)


# Keys that belong to one dataset: a later ``dataset`` naming another one drops them (the synthetic corpus's
# ``dataset_options: {num_labels: 10, ...}`` mean nothing to a CSV, a registered dataset's ``data_dir`` would
# be searched for the CSV, and ``data_files`` would replace it).
DATASET_BOUND_KEYS = ("dataset_options", "data_dir", "data_files", "dataset_config")


def superseded_keys(earlier: dict, later: dict) -> set[str]:
    """The top-level keys of ``earlier`` (a base recipe, or the recipe under the command line) that ``later``
    replaces without naming them: the contradicting label layout
    (:func:`hf_mlcl.data.custom.superseded_label_keys`) and, when ``later`` names another ``dataset``, the
    old dataset's ``DATASET_BOUND_KEYS`` that ``later`` does not set itself."""
    from hf_mlcl.data.custom import superseded_label_keys

    drop = superseded_label_keys(earlier, later)
    if "dataset" in later and str(later["dataset"]) != str(earlier.get("dataset")):
        drop |= {k for k in DATASET_BOUND_KEYS if k in earlier and k not in later}
    return drop


def _merge_layered(earlier: dict, later: dict) -> dict:
    """``merge_recipes``, where ``later`` also drops the keys of ``earlier`` it supersedes
    (:func:`superseded_keys`)."""
    dropped = superseded_keys(earlier, later)
    return merge_recipes({k: v for k, v in earlier.items() if k not in dropped}, later)


def _given_keys(tokens: Sequence[str]) -> dict[str, str]:
    """``{key: first value}`` of ``--key value ...`` override tokens (``""`` for a key given no value)."""
    given: dict[str, str] = {}
    key = None
    for tok in tokens:
        if tok.startswith("--"):
            key = tok[2:]
            given[key] = ""
        elif key is not None and given[key] == "":
            given[key] = tok
    return given


# --------------------------------------------------------------------------------------------------
# key validation
# --------------------------------------------------------------------------------------------------
def _arg_classes(stage: str) -> tuple[type, type, type]:
    from hf_mlcl.training.arguments import (
        ContrastiveTrainingArguments,
        DataArguments,
        JointTrainingArguments,
        ModelArguments,
        ProbingTrainingArguments,
    )

    if stage == "contrastive":
        return ModelArguments, DataArguments, ContrastiveTrainingArguments
    if stage == "probe":
        return ModelArguments, DataArguments, ProbingTrainingArguments
    if stage == "joint":
        return ModelArguments, DataArguments, JointTrainingArguments
    raise RecipeError(f"unknown stage {stage!r}; choose one of {STAGES}")


def argument_classes(stage: str) -> tuple[type, type, type]:
    """``(ModelArguments, DataArguments, <Stage>TrainingArguments)`` of ``stage`` (one of ``STAGES``)."""
    return _arg_classes(stage)


def _init_fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls) if f.init}


def common_keys() -> set[str]:
    """Keys allowed at the top level of a recipe: ModelArguments + DataArguments fields."""
    model_cls, data_cls, _ = _arg_classes("contrastive")
    return _init_fields(model_cls) | _init_fields(data_cls)


def stage_keys(stage: str) -> set[str]:
    """Keys allowed inside a stage section: the fields of that stage's TrainingArguments subclass."""
    return _init_fields(_arg_classes(stage)[2])


# keys that moved between the argument classes: where they live now
MOVED_KEYS = {
    "projection_dim": "the top level of the recipe (a model argument, beside projection_hidden_dim)"
}


def _unknown(key: str, allowed: set[str], where: str) -> RecipeError:
    if key in MOVED_KEYS:
        return RecipeError(f"key {key!r} in {where} belongs at {MOVED_KEYS[key]}")
    if key in common_keys():  # a model / data argument given to one stage
        return RecipeError(
            f"key {key!r} in {where} is a model or data argument, shared by the stages: put it at the top level "
            f"of the recipe (on the command line --{key}, without a stage prefix)"
        )
    close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return RecipeError(f"unknown key {key!r} in {where}{hint}")


def validate_recipe(recipe: dict, source: str = "recipe") -> None:
    """Raise RecipeError naming the first unknown key (with the nearest valid spelling)."""
    top = common_keys() | set(META_KEYS)
    for key in recipe:
        if key not in top:
            # a training key at top level is a common slip: say where it belongs
            for stage in STAGES:
                if key in stage_keys(stage):
                    raise RecipeError(
                        f"key {key!r} in {source} is a training argument: put it under "
                        f"`contrastive:`, `probe:` or `joint:`"
                    )
            raise _unknown(key, top, source)
    stages = recipe_stages(recipe)
    if not isinstance(stages, list) or not stages or any(s not in STAGES for s in stages):
        raise RecipeError(
            f"{source}: stages must be a non-empty list drawn from {list(STAGES)}; got {stages!r}"
        )
    if sum(s in CLASSIFIER_STAGES for s in stages) > 1:
        raise RecipeError(
            f"{source}: stages {stages} train two classifiers into one folder; keep one of {list(CLASSIFIER_STAGES)}"
        )
    for stage in STAGES:
        section = recipe.get(stage) or {}
        if not isinstance(section, dict):
            raise RecipeError(f"{source}: `{stage}:` must be a mapping; got {type(section).__name__}")
        allowed = stage_keys(stage)
        for key in section:
            if key not in allowed:
                raise _unknown(key, allowed, f"{source} [{stage}]")


def recipe_stages(recipe: dict) -> list[str]:
    """The stages a recipe runs, in order: its ``stages`` list, else ``DEFAULT_STAGES``."""
    return recipe.get("stages", list(DEFAULT_STAGES))


# --------------------------------------------------------------------------------------------------
# command-line overrides
# --------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Overrides:
    """Override tokens split by scope: common (model/data), per stage, and the run root."""

    common: list[str] = dataclasses.field(default_factory=list)
    stage: dict[str, list[str]] = dataclasses.field(default_factory=lambda: {s: [] for s in STAGES})
    output_dir: str | None = None


def _not_run(stage: str, stages: Sequence[str]) -> str:
    """Why an override of ``stage``'s options does nothing in a command that runs ``stages``."""
    runs = f"it runs {' and '.join(stages)}" if stages else "it trains nothing"
    return f"an option of the {stage} stage, which this command does not run ({runs})"


def split_overrides(tokens: Sequence[str], stages: Sequence[str]) -> Overrides:
    """Route ``--key value`` tokens: model/data keys to every parser, ``--probe.key`` to one stage,
    an unprefixed training key to every stage in ``stages``; ``--output_dir`` is the run root.

    Raises RecipeError for a token that is not an option, a key no scope knows, or a key of a stage that is
    not in ``stages`` (it would do nothing).
    """
    out = Overrides()
    common = common_keys()
    i = 0
    tokens = list(tokens)
    while i < len(tokens):
        tok = tokens[i]
        if not tok.startswith("--"):
            raise RecipeError(f"expected an option like --learning_rate 3.0e-5; got {tok!r}")
        name, eq, inline = tok[2:].partition("=")
        values = [inline] if eq else []
        i += 1
        while not eq and i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        name = name.replace("-", "_")
        prefix, dot, key = name.partition(".")
        if dot:
            if prefix not in STAGES:
                raise RecipeError(
                    f"--{name}: the prefix must be one of {STAGES} (e.g. --probe.learning_rate)"
                )
            if key not in stage_keys(prefix):
                raise _unknown(key, stage_keys(prefix), f"--{prefix}.*")
            if prefix not in stages:
                raise RecipeError(f"--{name}: {_not_run(prefix, stages)}")
            out.stage[prefix] += [f"--{key}", *values]
        elif name == "output_dir":
            if len(values) != 1 or not values[0].strip():
                raise RecipeError("--output_dir takes exactly one folder")
            out.output_dir = values[0]
        elif name in common:
            out.common += [f"--{name}", *values]
        else:
            targets = [s for s in stages if name in stage_keys(s)]
            if not targets:
                elsewhere = [s for s in STAGES if name in stage_keys(s)]
                if elsewhere:
                    raise RecipeError(f"--{name}: {_not_run(' / '.join(elsewhere), stages)}")
                allowed = common | set().union(*(stage_keys(s) for s in STAGES))
                raise _unknown(name, allowed, "the command-line overrides")
            for s in targets:
                out.stage[s] += [f"--{name}", *values]
    return out


# --------------------------------------------------------------------------------------------------
# parsing into dataclasses
# --------------------------------------------------------------------------------------------------
def stage_output_dir(recipe: dict, stage: str, root: str | None = None) -> str:
    """Folder of one stage: the section's own ``output_dir``, else ``<root>/encoder|classifier``."""
    section = recipe.get(stage) or {}
    if section.get("output_dir") and root is None:
        return section["output_dir"]
    base = root or recipe.get("output_dir") or DEFAULT_OUTPUT_ROOT
    return os.path.join(base, STAGE_DIRS[stage])


def _parser(stage: str) -> Any:
    """A fresh ``HfArgumentParser`` over the stage's three dataclasses (a new one per parse, so the
    recipe defaults set on it never leak into the next parse)."""
    from transformers import HfArgumentParser

    return HfArgumentParser(_arg_classes(stage))


def parse_stage(
    recipe: dict,
    stage: str,
    overrides: Overrides | None = None,
    output_dir: str | None = None,
) -> tuple[Any, Any, Any]:
    """Build ``(ModelArguments, DataArguments, <Stage>TrainingArguments)`` for one stage.

    The recipe's top-level keys and the stage's section become the parser's defaults; override tokens
    are parsed on top by ``HfArgumentParser``, so types, choices and ``__post_init__`` checks are the
    dataclasses' own. ``output_dir`` (when given) is the stage's folder.
    """
    validate_recipe(recipe)
    overrides = overrides or Overrides()
    parser = _parser(stage)
    defaults = {k: v for k, v in recipe.items() if k not in META_KEYS}
    for key in superseded_keys(
        defaults, _given_keys(overrides.common)
    ):  # the command line's layout / dataset win
        del defaults[key]
    defaults.update(recipe.get(stage) or {})
    defaults["output_dir"] = output_dir or stage_output_dir(recipe, stage, overrides.output_dir)
    parser.set_defaults(**defaults)  # argparse's public API: recipe values become the option defaults
    tokens = [*overrides.common, *overrides.stage.get(stage, [])]

    def stop(message: str) -> None:  # argparse's error(): one line naming where the value came from, no usage
        raise RecipeError(_where_a_value_came_from(message, tokens, recipe, stage))

    parser.error = stop
    try:
        return tuple(parser.parse_args_into_dataclasses(args=tokens, look_for_args_file=False))
    except SystemExit as err:  # argparse printed something else (e.g. --help)
        raise RecipeError(f"could not parse the {stage} arguments {tokens}") from err


def _where_a_value_came_from(message: str, tokens: Sequence[str], recipe: dict, stage: str) -> str:
    """argparse's ``message`` about an option, said of the recipe key or the command-line option it came from."""
    found = re.match(r"argument --([\w.-]+)", message)
    key = found.group(1).replace("-", "_") if found else None
    given = key is not None and any(t.lstrip("-").split("=", 1)[0].replace("-", "_") == key for t in tokens)
    if key is None or given:
        return f"{stage} arguments on the command line: {message}"
    section = f" under `{stage}:`" if key in (recipe.get(stage) or {}) else ""
    detail = message.split(": ", 1)[1] if ": " in message else message
    return f"recipe key {key!r}{section}: {detail}"
