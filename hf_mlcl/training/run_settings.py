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
from hf_mlcl.modeling.lora import LORA_OPTIONS
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
    *LORA_OPTIONS,
    "tokenizer_name_or_path",
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
)
# the scheduler's and optimizer's options, the batches' order and the last batch's fate, recorded since the
# keys above
_OPTIMIZER_KEYS = (
    "lr_scheduler_kwargs",
    "adam_beta1",
    "adam_beta2",
    "adam_epsilon",
    "optim_args",
    "data_seed",
    "dataloader_drop_last",
)
# settings recorded only since the first keys: a run stored before lacks them, which says nothing of their value
# (no difference)
_LATER_KEYS = frozenset(
    {
        "max_eval_samples",
        "max_test_samples",
        "load_best_model_at_end",
        "metric_for_best_model",
        *_OPTIMIZER_KEYS,
        "tokenizer_name_or_path",
        "merge_lora",
        "world_size",  # stage_settings
        "data_fingerprint",  # with_data_fingerprint
    }
)
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
    keys = (*_TRAINER_KEYS, *_OPTIMIZER_KEYS, *own)
    out = {key: _plain(getattr(args, key)) for key in keys if hasattr(args, key)}
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
    upstream = None if encoder_path is None else stored_settings(encoder_path)
    if upstream is not None:
        out["encoder"] = upstream
    return out


def stored_settings(folder: str) -> dict[str, Any] | None:
    """The settings the stage saved in ``folder`` recorded (its ``run_settings.json``), None without one."""
    path = os.path.join(folder, RUN_SETTINGS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def split_fingerprints(dataset: Any) -> dict[str, str]:
    """``{split: digest}`` of each split's rows (every column, in order): what a stage trains, tunes and scores on,
    however the files were named or loaded. Batches of 1,000 rows as JSON."""
    out = {}
    for split in dataset:
        digest = hashlib.sha256()
        for batch in dataset[split].iter(batch_size=1000):
            digest.update(json.dumps(batch, sort_keys=True, default=str).encode())
        out[split] = digest.hexdigest()[:16]
    return out


def with_data_fingerprint(settings: dict[str, Any] | None, data: Any) -> dict[str, Any] | None:
    """``settings`` with the fingerprints of the loaded data's splits (``data_fingerprint``): a resume from a
    checkpoint compares them, so data replaced between a kill and its resume stop it; ``run_stages`` loads the data
    to compare them for a finished stage that recorded them (:func:`recorded_data`). Computed once per loaded
    data (kept in ``data.fingerprints``), so the stages of one run hash the rows once."""
    if settings is None or "data_fingerprint" in settings:  # a resume computed them before loading the stage
        return settings
    digests = getattr(data, "fingerprints", None)
    if digests is None:
        digests = split_fingerprints(data.dataset)
        if hasattr(data, "fingerprints"):
            data.fingerprints = digests
    return {**settings, "data_fingerprint": digests}


def recorded_data(folder: str) -> bool:
    """Whether the stage saved in ``folder`` recorded the fingerprints of its data (:func:`with_data_fingerprint`)."""
    return "data_fingerprint" in (stored_settings(folder) or {})


def evaluation_differs(folder: str, dataset: Any, split: str, max_length: Any) -> list[str]:
    """What differs between scoring ``split`` of ``dataset`` at ``max_length`` and the data the stage saved in
    ``folder`` ran on (its ``run_settings.json``): the split's rows, the truncation length; [] when the same or
    unknown (a folder from before the fingerprints)."""
    stored = stored_settings(folder) or {}
    changed = []
    own = (stored.get("data_fingerprint") or {}).get(split)
    if own is not None and own != split_fingerprints({split: dataset[split]})[split]:
        changed.append(f"the {split} split's rows")
    if own is not None and "max_length" in stored and stored["max_length"] != max_length:
        changed.append(f"max_length {stored['max_length']} -> {max_length}")
    return changed


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
    stored = None if folder is None or settings is None else stored_settings(folder)
    return [] if stored is None else _differences(stored, settings)


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
