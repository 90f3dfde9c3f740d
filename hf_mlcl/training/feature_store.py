"""Frozen pooled features on disk: one file per (encoder, tokenised dataset), reused across runs.

A frozen encoder in eval mode maps every text to the same pooled vector (Khosla et al. 2020, Sec. 4:
the linear evaluation protocol trains only a head on it), so the features one probe computed are the
features the next probe of the same encoder needs: ABALONE's per-label logistic regressions and the SD
paper's linear layer on one stage-1 encoder, a C grid, a second learning rate of the head. With
``ProbingTrainingArguments.feature_cache_dir`` the :class:`~hf_mlcl.training.ProbingTrainer` saves each
split's :class:`~hf_mlcl.training.feature_cache.PooledFeatureDataset` here and later runs load it
instead of running the encoder.

The key is what the encoder computes from, never a name or a path (a re-trained encoder saved to the
same folder must not hit): SHA-256 over

* the encoder's weights (:meth:`FeatureStore.encoder_digest`: every tensor of its ``state_dict``, names,
  dtypes, shapes and bytes) and its architecture (class and config, without names and paths);
* ``settings``: what else shapes the pass (``ProbingTrainer`` passes the pooling, the segmentation and
  segment length, the attention implementation and the run's bf16 / fp16 flags);
* every row's token ids and token type ids without their padding, the rows' lengths and, for a row
  padded on the left, where its tokens start (so right-padded rows give the same key for any eval
  batch size; the tokenizer, ``max_length`` and the texts always count), and its label ids.

Anything left out can only cost a miss, never a wrong hit, if it changes the token ids or the weights;
the settings above are the known inputs of the pass that change neither. The token ids come from the
trainer's own collator over the dataset in order, one cheap tokenisation pass, against an encoder pass
on a miss. Files are written under a unique temporary name and renamed into place, so a killed run never
leaves a partial file under a key; a file that cannot be read is reported and computed again, and a
file that cannot be written is reported and skipped (the features are derived data).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from .feature_cache import PooledFeatureDataset

logger = logging.getLogger(__name__)

__all__ = ["FeatureStore"]

_FORMAT = "hf_mlcl-pooled-features-v1"
_CONFIG_NAMES = {"_name_or_path", "transformers_version", "id2label", "label2id"}  # names, not computation


def _update_bytes(hasher: Any, t: torch.Tensor) -> None:
    """Hash a tensor's raw bytes (any dtype, bf16 included)."""
    t = t.detach().to("cpu").contiguous()
    if t.numel():
        hasher.update(t.reshape(-1).view(torch.uint8).numpy().data)


def _update_tensor(hasher: Any, t: torch.Tensor) -> None:
    """Hash a tensor's dtype, shape and raw bytes."""
    hasher.update(f"{t.dtype}{tuple(t.shape)}".encode())
    _update_bytes(hasher, t)


class FeatureStore:
    """A folder of pooled-feature files named by their key (see the module docstring)."""

    def __init__(self, directory: str | os.PathLike) -> None:
        self.directory = os.fspath(directory)
        if os.path.exists(self.directory) and not os.path.isdir(self.directory):
            raise ValueError(
                f"feature_cache_dir={self.directory!r} is a file, not a folder: name a folder for the feature files"
            )
        try:  # before any encoding: a folder that cannot be written is found now, not after a pass
            os.makedirs(self.directory, exist_ok=True)
        except OSError as err:
            raise ValueError(f"feature_cache_dir={self.directory!r} cannot be created ({err}): name a writable folder") from err
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise ValueError(f"feature_cache_dir={self.directory!r} is not writable: name a writable folder")

    def path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.safetensors")

    @staticmethod
    def encoder_digest(encoder: nn.Module) -> str:
        """SHA-256 of an encoder's architecture (class, config without names / paths) and weights."""
        hasher = hashlib.sha256(type(encoder).__name__.encode())
        config = getattr(encoder, "config", None)
        if config is not None:
            described = {k: v for k, v in config.to_dict().items() if k not in _CONFIG_NAMES}
            described["attn_implementation"] = getattr(config, "_attn_implementation", None)
            hasher.update(json.dumps(described, sort_keys=True, default=str).encode())
        for name, tensor in sorted(encoder.state_dict().items()):
            hasher.update(name.encode())
            _update_tensor(hasher, tensor)
        return hasher.hexdigest()

    @staticmethod
    def key(
        encoder_digest: str,
        batches: Iterable[Mapping[str, Any]],
        settings: Mapping[str, Any],
        label_ids: Any,
    ) -> tuple[str, int]:
        """(hex key, number of rows) of the features the encoder of ``encoder_digest``
        (:meth:`encoder_digest`) would compute from the collated ``batches``.

        ``settings``: anything else the encoding depends on (pooling, segmentation, precision),
        JSON-serialisable. ``label_ids``: a function of one collated batch returning its ``(row, label)``
        index pairs, or None when the rows' labels are not part of the key.
        """
        hasher = hashlib.sha256(_FORMAT.encode())
        hasher.update(encoder_digest.encode())
        hasher.update(json.dumps(dict(settings), sort_keys=True, default=str).encode())
        # one stream per part, fed raw int64 bytes only, so the batching never shows in the key
        streams = {part: hashlib.sha256() for part in ("lengths", "starts", "input_ids", "token_type_ids", "labels")}
        rows = 0
        for batch in batches:
            ids = torch.as_tensor(batch["input_ids"])
            mask = batch.get("attention_mask")
            mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool()
            # the rows' lengths delimit the flat ids; a left-padded row also records where its tokens start
            # (position ids follow it), which ties its key to the batch's padding: a miss, never a wrong hit
            parts = {"lengths": mask.sum(1), "starts": mask.to(torch.int8).argmax(1)}
            for part in ("input_ids", "token_type_ids"):
                if batch.get(part) is not None:
                    parts[part] = torch.as_tensor(batch[part])[mask]
            if label_ids is not None:
                parts["labels"] = torch.as_tensor(label_ids(batch)) + torch.tensor([rows, 0])
            for part, value in parts.items():
                _update_bytes(streams[part], value.to(torch.int64))
            rows += int(ids.shape[0])
        for part, stream in streams.items():
            hasher.update(part.encode() + stream.digest())
        hasher.update(str(rows).encode())
        return hasher.hexdigest(), rows

    def load(self, key: str, rows: int) -> PooledFeatureDataset | None:
        """The features saved under ``key``, or None when there are none (or they cannot be read)."""
        from safetensors.torch import load_file

        path = self.path(key)
        if not os.path.isfile(path):
            return None
        try:
            saved = load_file(path)
            features = PooledFeatureDataset(
                saved["features"], saved["indptr"].numpy(), saved["indices"].numpy()
            )
        except Exception as err:  # a damaged file is derived data: say so and compute it again
            logger.warning(f"feature cache: cannot read {path} ({err}); encoding again")
            return None
        if len(features) != rows:
            logger.warning(f"feature cache: {path} holds {len(features)} rows, expected {rows}; encoding again")
            return None
        return features

    def save(self, key: str, features: PooledFeatureDataset) -> str | None:
        """Write ``features`` under ``key`` through a unique temporary file renamed into place; returns the
        path, or None (with a warning) when the file could not be written."""
        from hf_mlcl.files import atomic_write_safetensors

        path = self.path(key)
        tensors = {
            "features": features.features.contiguous(),
            "indptr": torch.from_numpy(np.ascontiguousarray(features.indptr)),
            "indices": torch.from_numpy(np.ascontiguousarray(features.indices)),
        }
        try:  # a unique temporary file: two processes writing one key never mix their bytes
            atomic_write_safetensors(tensors, path, metadata={"format": _FORMAT, "rows": str(len(features))})
            return path
        except OSError as err:  # derived data: the run goes on with the features in memory
            logger.warning(f"feature cache: cannot write {path} ({err}); the features are not saved")
            return None
