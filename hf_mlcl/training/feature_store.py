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

* the encoder's weights (every tensor of its ``state_dict``: names, dtypes, shapes and bytes);
* the pooling and the autocast precision of the encoding pass;
* every row's token ids, attention mask and token type ids without their padding (so the eval batch
  size does not matter, the tokenizer, ``max_length`` and the texts do) and its label ids.

The token ids come from the trainer's own collator over the dataset in order, one cheap tokenisation
pass, against an encoder pass on a miss. Files are written under a temporary name and renamed into
place, so a killed run never leaves a partial file under a key; a file that cannot be read is reported
and computed again.
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

    def path(self, key: str) -> str:
        return os.path.join(self.directory, f"{key}.safetensors")

    @staticmethod
    def key(
        encoder: nn.Module,
        batches: Iterable[Mapping[str, Any]],
        settings: Mapping[str, Any],
        label_ids: Any,
    ) -> tuple[str, int]:
        """(hex key, number of rows) of the features ``encoder`` would compute from the collated ``batches``.

        ``settings``: anything else the encoding depends on (pooling, autocast precision), JSON-serialisable.
        ``label_ids``: a function of one collated batch returning its ``(row, label)`` index pairs, or the
        rows' labels are not part of the key.
        """
        hasher = hashlib.sha256(_FORMAT.encode())
        hasher.update(json.dumps(dict(settings), sort_keys=True, default=str).encode())
        for name, tensor in sorted(encoder.state_dict().items()):
            hasher.update(name.encode())
            _update_tensor(hasher, tensor)
        # one stream per part, fed raw int64 bytes only, so the batching never shows in the key
        streams = {part: hashlib.sha256() for part in ("lengths", "input_ids", "token_type_ids", "labels")}
        rows = 0
        for batch in batches:
            ids = torch.as_tensor(batch["input_ids"])
            mask = batch.get("attention_mask")
            mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool()
            parts = {"lengths": mask.sum(1)}  # the rows' lengths delimit the flat ids
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

    def save(self, key: str, features: PooledFeatureDataset) -> str:
        """Write ``features`` under ``key`` (through a temporary file renamed into place); returns the path."""
        from safetensors.torch import save_file

        os.makedirs(self.directory, exist_ok=True)
        path = self.path(key)
        tmp = f"{path}.tmp-{os.getpid()}"
        save_file(
            {
                "features": features.features.contiguous(),
                "indptr": torch.from_numpy(np.ascontiguousarray(features.indptr)),
                "indices": torch.from_numpy(np.ascontiguousarray(features.indices)),
            },
            tmp,
            metadata={"format": _FORMAT, "rows": str(len(features))},
        )
        os.replace(tmp, path)
        return path
