"""The settings a stage's result depends on (loss and its options, data, schedule, model), stored with its
checkpoints and its finished folder, and compared when a run resumes: a resume with other settings would
report results of a run that never had them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from typing import Any

from transformers import TrainingArguments

from hf_mlcl.files import atomic_write_json
from hf_mlcl.training.arguments import DecisionThresholdArguments

logger = logging.getLogger(__name__)

__all__ = [
    "RUN_SETTINGS_FILE",
    "check_resume_settings",
    "changed_settings",
    "stage_settings",
    "write_run_settings",
]

RUN_SETTINGS_FILE = "run_settings.json"

_MODEL_KEYS = (
    "model_name_or_path",
    "backbone_config",
    "pooling",
    "head",
    "chunk_size",
    "use_lora",
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
)
_PROJECTION_KEYS = (
    "projection_dim",
    "projection_hidden_dim",
)  # the contrastive stage's head; no classifier has it
_DATA_KEYS = (
    "dataset",
    "dataset_options",
    "data_files",
    "dataset_config",
    "text_column",
    "label_column",
    "label_columns",
    "label_format",
    "label_separator",
    "label_names_file",
    "unknown_labels",
    "validation_fraction",
    "test_fraction",
    "split_seed",
    "split_strategy",
    "max_length",
    "max_train_samples",
    "subset_seed",
    "max_eval_samples",
    "max_test_samples",
)
_TRAINER_KEYS = (
    "learning_rate",
    "num_train_epochs",
    "max_steps",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "seed",
    "weight_decay",
    "lr_scheduler_type",
    "warmup_steps",
    "optim",
    "max_grad_norm",
    "bf16",
    "fp16",
    "load_best_model_at_end",
    "metric_for_best_model",
    "lr_scheduler_kwargs",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim_args",
    "dataloader_drop_last",
)
# settings recorded only since the keys above: a run stored before lacks them, which says nothing of their value
# (no difference)
_LATER_KEYS = frozenset(
    {
        "max_eval_samples",
        "max_test_samples",
        "load_best_model_at_end",
        "metric_for_best_model",
        "lr_scheduler_kwargs",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "optim_args",
        "dataloader_drop_last",
        "world_size",
        "data_fingerprint",
    }
)
_FINGERPRINT_BYTES = 1 << 20  # the first and the last MiB of each file
_DATA_PATH_KEYS = ("dataset", "data_files", "label_names_file")  # local paths: compared by their contents
# fields of hf_mlcl's stage arguments that change how a run is kept or watched, not what it trains
_POLICY_KEYS = {
    "overwrite_output_dir",
    "keep_checkpoints",
    "remove_unused_columns",
    "restore_callback_states_from_checkpoint",
    "logging_nan_inf_filter",
    "knn_k",
    "cache_features",
    "feature_cache_dir",
}


def _canonical_loss(name: str) -> str:
    from hf_mlcl.losses.registry import resolve_loss_name

    try:
        return resolve_loss_name(name)
    except ValueError:  # not a registered name: the arguments' own checks say so
        return name


def _plain(value: Any) -> Any:
    value = getattr(value, "value", value)  # enums (lr_scheduler_type, optim)
    return json.loads(json.dumps(value, default=str))


def stage_settings(
    args: Any, model_args: Any = None, data_args: Any = None, encoder_path: str | None = None
) -> dict[str, Any]:
    """``{key: value}`` of what the stage's result depends on: its own fields (those hf_mlcl adds to
    ``TrainingArguments``, but the keeping / watching ones), the schedule and precision, the model, the data and,
    for a stage on a trained encoder (``encoder_path``), that encoder's own settings."""
    trainer_fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    own = [
        f.name
        for f in dataclasses.fields(args)
        if f.name not in trainer_fields and f.name not in _POLICY_KEYS
    ]
    out = {key: _plain(getattr(args, key)) for key in (*_TRAINER_KEYS, *own) if hasattr(args, key)}
    # the processes: the batch each contrasts (and the global batch) depends on how many share the data
    out["world_size"] = int(getattr(args, "world_size", 1))
    for key in ("loss", "supervised_loss"):  # an alias names the same loss ("sd", "similarity_dissimilarity")
        if isinstance(out.get(key), str):
            out[key] = _canonical_loss(out[key])
    model_keys = _MODEL_KEYS
    if not isinstance(args, DecisionThresholdArguments):  # a classifier stage has no projection head
        model_keys += _PROJECTION_KEYS
    for source, keys in ((model_args, model_keys), (data_args, _DATA_KEYS)):
        if source is not None:
            out.update({key: _plain(getattr(source, key)) for key in keys if hasattr(source, key)})
    fingerprint = data_fingerprint(data_args) if data_args is not None else None
    if fingerprint is not None:
        out["data_fingerprint"] = fingerprint
    upstream = None if encoder_path is None else os.path.join(encoder_path, RUN_SETTINGS_FILE)
    if upstream is not None and os.path.isfile(upstream):
        with open(upstream, encoding="utf-8") as fh:
            out["encoder"] = json.load(fh)
    return out


def data_changes(folder: str, data_args: Any) -> list[str] | None:
    """The data settings of ``data_args`` that differ from those the stage in ``folder`` ran on (its
    ``run_settings.json``), or None when the folder records none. Local data are compared by their fingerprint
    where both sides have one (a path may be written from another working directory), by name otherwise."""
    path = os.path.join(folder, RUN_SETTINGS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        stored = json.load(fh)
    asked = {key: _plain(getattr(data_args, key, None)) for key in _DATA_KEYS}
    fingerprints = stored.get("data_fingerprint"), data_fingerprint(data_args)
    by_content = all(fingerprints)
    changed = [
        key
        for key in _DATA_KEYS
        if key in stored and stored[key] != asked[key] and not (by_content and key in _DATA_PATH_KEYS)
    ]
    if by_content and fingerprints[0] != fingerprints[1]:
        changed.append("data_fingerprint")
    return changed


def _local_data_paths(data_args: Any) -> list[str]:
    """The user's own data files and folders the stage reads: a local ``dataset``, ``data_files``,
    ``label_names_file`` (a registry dataset's ``data_dir`` is not: its files are the dataset's)."""
    named: list[Any] = [getattr(data_args, "dataset", None), getattr(data_args, "label_names_file", None)]
    files = getattr(data_args, "data_files", None)
    for value in files.values() if isinstance(files, dict) else [files]:
        named += value if isinstance(value, (list, tuple)) else [value]
    return [p for p in named if isinstance(p, str) and os.path.exists(p)]


def _hash_file(digest: Any, path: str, name: str) -> None:
    size = os.path.getsize(path)
    digest.update(f"{name}\0{size}\0".encode())
    with open(path, "rb") as fh:
        digest.update(fh.read(_FINGERPRINT_BYTES))
        if size > _FINGERPRINT_BYTES:
            fh.seek(max(_FINGERPRINT_BYTES, size - _FINGERPRINT_BYTES))
            digest.update(fh.read(_FINGERPRINT_BYTES))


def data_fingerprint(data_args: Any) -> str | None:
    """A digest of the user's local data (:func:`_local_data_paths`): each file's name, size, first and last MiB,
    so a file replaced between a kill and its resume is a changed setting; None for data without local files."""
    paths = _local_data_paths(data_args)
    if not paths:
        return None
    digest = hashlib.sha256()
    for path in paths:
        if os.path.isfile(path):
            _hash_file(digest, path, os.path.basename(path))
            continue
        for folder, subfolders, names in os.walk(path):
            subfolders[:] = sorted(d for d in subfolders if not d.startswith("."))
            for name in sorted(n for n in names if not n.startswith(".")):
                full = os.path.join(folder, name)
                _hash_file(digest, full, os.path.relpath(full, path))
    return digest.hexdigest()[:16]


def write_run_settings(folder: str, settings: dict[str, Any] | None) -> None:
    """``folder/run_settings.json`` (nothing when ``settings`` is None)."""
    if settings is not None:
        atomic_write_json(os.path.join(folder, RUN_SETTINGS_FILE), settings)


def _field_defaults() -> dict[str, Any]:
    """The default of each argument field whose classes agree on it (``loss`` differs between stages: none).
    A run stored before such a field existed ran with what its default does: options are added with a default
    that keeps the earlier behaviour."""
    from hf_mlcl.training import arguments as A

    found: dict[str, list[Any]] = {}
    classes = (A.ContrastiveTrainingArguments, A.ProbingTrainingArguments, A.JointTrainingArguments)
    for cls in (*classes, A.ModelArguments, A.DataArguments):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                found.setdefault(f.name, []).append(_plain(f.default))
    return {name: values[0] for name, values in found.items() if all(v == values[0] for v in values)}


def _differences(
    stored: dict[str, Any], new: dict[str, Any], prefix: str = "", defaults: dict[str, Any] | None = None
) -> list[str]:
    """``"key old -> new"`` for every setting that differs (the encoder's as ``encoder.key``); a stored key the
    stage no longer depends on (absent from ``new``) is no difference, nor a key the stored run predates whose new
    value is the field's default (:func:`_field_defaults`), nor one recorded only since (``_LATER_KEYS``)."""
    defaults = _field_defaults() if defaults is None else defaults
    out = []
    for key in sorted(new):
        old, now = stored.get(key), new.get(key)
        if isinstance(old, dict) and isinstance(now, dict) and key == "encoder":
            out += _differences(old, now, f"{prefix}{key}.", defaults)
        elif key not in stored and key in defaults and now == defaults[key]:
            continue  # the stored run predates this option and ran as its default does
        elif key not in stored and key in _LATER_KEYS:
            continue  # the stored run predates recording this setting: unknown
        elif old != now:
            out.append(f"{prefix}{key} {old!r} -> {now!r}")
    return out


def changed_settings(folder: str | None, settings: dict[str, Any] | None) -> list[str]:
    """``"key old -> new"`` for each setting ``folder`` was trained with other than ``settings`` (none when either
    side is unknown)."""
    path = None if folder is None else os.path.join(folder, RUN_SETTINGS_FILE)
    if settings is None or path is None or not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as fh:
        return _differences(json.load(fh), settings)


def check_resume_settings(folder: str | None, settings: dict[str, Any] | None, overwrite: bool) -> None:
    """ValueError (one line, listing the differences) when the run resumed from ``folder`` (a checkpoint or a
    finished stage's folder) had other settings than ``settings``; with ``overwrite`` a warning instead (the new
    settings win). Nothing to compare when either side is unknown."""
    changed = changed_settings(folder, settings)
    if not changed:
        return
    listed = "; ".join(changed)
    if overwrite:
        logger.warning(f"resuming {folder} with other settings (--overwrite_output_dir true): {listed}")
        return
    raise ValueError(
        f"--resume_from_checkpoint: {folder} was trained with other settings: {listed}; resume with the run's "
        "settings, or pass --overwrite_output_dir true to go on with these"
    )
