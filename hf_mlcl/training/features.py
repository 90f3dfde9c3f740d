"""Frozen pooled features: computed once, held in memory for a cached linear probe, kept on disk across runs.

:class:`FrozenFeatures` is the service a frozen-encoder probe uses; :class:`PooledFeatureDataset` and
:class:`PooledFeatureCollator` feed the cached features to Trainer; :class:`FeatureStore` keeps them on disk
under a key of what the encoder computes from.

Design: docs/design.md, "Frozen features (hf_mlcl/training/features.py)".
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
import torch.nn as nn

from hf_mlcl.files import atomic_path

logger = logging.getLogger(__name__)

__all__ = ["POOLED_KEY", "FeatureStore", "FrozenFeatures", "PooledFeatureCollator", "PooledFeatureDataset"]

POOLED_KEY = "pooled_features"  # the keyword of MLCLForMultiLabelClassification.forward
_LABEL_IDS = "label_ids"
_FORMAT = "hf_mlcl-pooled-features-v1"
_CONFIG_NAMES = {"_name_or_path", "transformers_version", "id2label", "label2id"}  # names, not computation


class PooledFeatureDataset(torch.utils.data.Dataset):
    """Map-style dataset of pooled features (N, H) and each row's label ids (CSR: ``indptr``, ``indices``).

    Row ``i`` is ``{"pooled_features": features[i], "label_ids": indices[indptr[i]:indptr[i + 1]]}``.
    """

    def __init__(self, features: torch.Tensor, indptr: np.ndarray, indices: np.ndarray) -> None:
        if features.dim() != 2 or len(indptr) != features.shape[0] + 1:
            raise ValueError(
                f"features must be (N, H) with N + 1 row pointers; got {tuple(features.shape)} and {len(indptr)}"
            )
        self.features = features
        self.indptr = np.asarray(indptr, dtype=np.int64)
        self.indices = np.asarray(indices, dtype=np.int64)

    @classmethod
    def from_batches(cls, batches: Iterable[tuple[torch.Tensor, torch.Tensor]]) -> PooledFeatureDataset:
        """Collect ``(pooled (b, H), label ids (b, K) padded with -1)`` batches, in dataset order, into one
        dataset."""
        feats: list[torch.Tensor] = []
        counts: list[np.ndarray] = []
        indices: list[np.ndarray] = []
        for pooled, ids in batches:
            kept = ids >= 0
            feats.append(pooled.detach().float().cpu())
            counts.append(kept.sum(dim=1).cpu().numpy())
            indices.append(ids[kept].cpu().numpy())  # row-major: sorted by row
        if not feats:
            raise ValueError("no rows to encode: the dataset is empty")
        indptr = np.concatenate([[0], np.cumsum(np.concatenate(counts))])
        return cls(torch.cat(feats), indptr, np.concatenate(indices))

    def multi_hot(self, num_labels: int) -> np.ndarray:
        """The rows' labels as an (N, num_labels) bool matrix."""
        from hf_mlcl.labels.multihot import multi_hot_array

        return multi_hot_array(num_labels=num_labels, csr=(self.indptr, self.indices))

    def __len__(self) -> int:
        return int(self.features.shape[0])

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {POOLED_KEY: self.features[i], _LABEL_IDS: self.indices[self.indptr[i] : self.indptr[i + 1]]}


class PooledFeatureCollator:
    """Stack :class:`PooledFeatureDataset` rows; ``labels_to_tensor`` (the text collator's, e.g.
    ``MultiLabelCollator.labels_to_tensor``) builds the multi-hot labels, so both paths hand the loss
    the same label tensor (dense or sparse)."""

    def __init__(self, labels_to_tensor: Callable[[Sequence[Sequence[int]]], torch.Tensor]) -> None:
        self.labels_to_tensor = labels_to_tensor

    def __call__(self, rows: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        return {
            POOLED_KEY: torch.stack([r[POOLED_KEY] for r in rows]),
            "labels": self.labels_to_tensor([r[_LABEL_IDS] for r in rows]),
        }


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
            raise ValueError(
                f"feature_cache_dir={self.directory!r} cannot be created ({err}): name a writable folder"
            ) from err
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
        streams = {
            part: hashlib.sha256() for part in ("lengths", "starts", "input_ids", "token_type_ids", "labels")
        }
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
            logger.warning(
                f"feature cache: {path} holds {len(features)} rows, expected {rows}; encoding again"
            )
            return None
        return features

    def save(self, key: str, features: PooledFeatureDataset) -> str | None:
        """Write ``features`` under ``key`` through a unique temporary file renamed into place; returns the
        path, or None (with a warning) when the file could not be written."""
        from safetensors.torch import save_file

        path = self.path(key)
        try:
            with atomic_path(path) as tmp:
                save_file(
                    {
                        "features": features.features.contiguous(),
                        "indptr": torch.from_numpy(np.ascontiguousarray(features.indptr)),
                        "indices": torch.from_numpy(np.ascontiguousarray(features.indices)),
                    },
                    tmp,
                    metadata={"format": _FORMAT, "rows": str(len(features))},
                )
            return path
        except OSError as err:  # derived data: the run goes on with the features in memory
            logger.warning(f"feature cache: cannot write {path} ({err}); the features are not saved")
            return None


@contextmanager
def _id_labels(trainer: Any) -> Iterator[bool]:
    """While an encoding pass builds and iterates its loader: the trainer's
    :class:`~hf_mlcl.data.MultiLabelCollator` with ``label_format="ids"``, so no batch holds (b, L) label rows,
    and padded rows (``padding_free`` off: the pass and the feature-store key read a row per document); yields
    whether the labels come as padded ids (other collators are left as they are: multi-hot)."""
    from hf_mlcl.data.collator import MultiLabelCollator

    collator = trainer.data_collator
    if not isinstance(collator, MultiLabelCollator):
        yield False
        return
    ids = copy.copy(collator)  # shares the tokenizer; the trainer's own collator is put back below
    ids.label_format = "ids"
    ids.padding_free = False
    trainer.data_collator = ids
    try:
        yield True
    finally:
        trainer.data_collator = collator


def _padded_ids(labels: torch.Tensor, as_ids: bool) -> torch.Tensor:
    """A batch's labels as (b, K >= 1) ids padded with -1: as they are from an ids collator, else from the
    multi-hot matrix (K >= 1 keeps the gather across processes well-formed when no row has a label)."""
    from hf_mlcl.labels.multihot import multihot_to_ids

    return labels if as_ids else multihot_to_ids(labels, min_width=1)


class FrozenFeatures:
    """The pooled features of a frozen-encoder probe, one encoder pass per dataset (the service behind
    ``ProbingTrainer(cache_features=...)``).

    :meth:`of` returns a dataset's :class:`PooledFeatureDataset`: computed on first use through the
    trainer's own text dataloader (in eval mode, without gradient; under several processes every process
    gets every row, ``gather_for_metrics`` dropping the duplicated tail), or, with a :class:`FeatureStore`,
    loaded from the file of the same encoder and tokenised rows; then reused for as long as the trainer
    lives (the encoder is frozen and in eval mode, so its outputs never change; features are not written to
    checkpoints and a resumed run computes them again). ``sources`` records, per split name, whether they
    were ``"encoded"`` or ``"loaded"``. The passes leave the random-number streams as they were
    (``fork_rng``: iterating a DataLoader draws a seed), so a run with cached features draws the same
    dropout masks as one without.

    ``trainer``: the ``ProbingTrainer`` (its model, arguments, accelerator, collator, label split and
    ``text_test_dataloader``).
    """

    def __init__(self, trainer: Any, store: FeatureStore | None = None) -> None:
        self.trainer = trainer
        self.store = store
        self.sources: dict[str, str] = {}
        self._cache: dict[int, tuple[Any, nn.Module, PooledFeatureDataset]] = {}
        self._digest: tuple[nn.Module, str] | None = None

    @staticmethod
    def blocker(trainer: Any) -> str | None:
        """Why ``trainer`` cannot train its linear head on cached features, or None when it can."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        args = trainer.args
        if getattr(model.config, "head", "linear") == "label_attention" or not hasattr(
            model, "logits_from_pooled"
        ):
            return (
                f"head={getattr(model.config, 'head', None)!r} reads token states, not a pooled vector "
                "(only head='linear' or 'native' can be trained on cached features)"
            )
        if trainer.is_fsdp_enabled or trainer.is_deepspeed_enabled:
            return "FSDP / DeepSpeed shard the encoder's weights across processes"
        if args.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
            return (
                f"train_sampling_strategy={args.train_sampling_strategy!r} orders the batches by text length"
            )
        if "inputs" in (args.include_for_metrics or []):
            return "include_for_metrics=['inputs'] hands the token ids to compute_metrics"
        if args.include_num_input_tokens_seen not in ("no", False, None):
            return "include_num_input_tokens_seen counts the tokens of every training batch"
        if args.dataloader_drop_last:
            return "dataloader_drop_last would drop the last rows of every split's encoding pass"
        return None

    def of(self, dataset: Any, name: str = "dataset") -> PooledFeatureDataset:
        """The features of ``dataset`` (see the class docstring)."""
        backbone = self.trainer.accelerator.unwrap_model(self.trainer.model).backbone
        entry = self._cache.get(id(dataset))
        if entry is not None and entry[0] is dataset and entry[1] is backbone:
            return entry[2]
        features = self._encoded_or_stored(dataset, name)
        self._cache[id(dataset)] = (dataset, backbone, features)
        return features

    def batches(self, dataset: Any, desc: str = "Encoding") -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        """``(pooled (b, H) float32, label ids (b, K) int64 padded with -1)`` of every batch of ``dataset``, in
        dataset order, from one encoder pass (see the class docstring). The labels travel as ids, never as
        (b, L) multi-hot rows: a :class:`~hf_mlcl.data.MultiLabelCollator` hands them over as ids for the pass."""
        from tqdm.auto import tqdm

        tr = self.trainer
        model = tr.accelerator.unwrap_model(tr.model)
        was_training = model.training
        model.eval()
        bar = None
        try:
            with torch.random.fork_rng(devices=[]), _id_labels(tr) as as_ids:
                loader = tr.text_test_dataloader(dataset)
                bar = tqdm(loader, desc=desc, disable=tr.args.disable_tqdm or not tr.is_local_process_zero())
                for batch in bar:
                    model_inputs, y = tr.split_labels(tr._prepare_inputs(batch))
                    # accelerate's autocast wraps the model's forward only: this pass calls encode_tokens and
                    # pool directly, so it enters the mixed precision the forward of an uncached run gets
                    with torch.no_grad(), tr.compute_loss_context_manager(), tr.accelerator.autocast():
                        states, mask, segment = model.encode_tokens(
                            model_inputs["input_ids"],
                            model_inputs.get("attention_mask"),
                            model_inputs.get("token_type_ids"),
                        )  # padded rows: _id_labels turns packing off for the pass
                        pooled = model.pool(states, mask, segment)
                    ids = tr.accelerator.pad_across_processes(_padded_ids(y, as_ids), dim=1, pad_index=-1)
                    pooled, ids = tr.accelerator.gather_for_metrics((pooled.float().contiguous(), ids))
                    yield pooled.cpu(), ids.cpu()
        finally:
            if bar is not None:
                bar.close()
            model.train(was_training)

    def _encoded_or_stored(self, dataset: Any, name: str) -> PooledFeatureDataset:
        """One encoder pass over ``dataset``, or the features a run with the same encoder and tokenised rows
        saved in the store."""
        start = time.perf_counter()
        tr, store = self.trainer, self.store
        if store is not None:
            key, rows = self._key(dataset)
            stored = store.load(key, rows)
            # every process must take the same branch: the encoder pass gathers across processes
            if self._on_every_process(stored is not None):
                logger.info(f"{tr.args.probe} probe: loaded the {name} features from {store.path(key)}")
                self.sources[name] = "loaded"
                return stored
        features = PooledFeatureDataset.from_batches(self.batches(dataset, f"Encoding {name} features"))
        logger.info(
            f"{tr.args.probe} probe: cached the frozen features of {len(features)} {name} rows "
            f"in {time.perf_counter() - start:.1f} s"
        )
        self.sources[name] = "encoded"
        # one writer per copy of the store: the global main process (shared storage), or each node's main
        # process with save_on_each_node (node-local storage), never one per node into a shared folder
        if store is not None and tr.args.should_save:
            saved = store.save(key, features)
            if saved is not None:
                logger.info(f"{tr.args.probe} probe: saved the {name} features to {saved}")
        return features

    def _key(self, dataset: Any) -> tuple[str, int]:
        """:meth:`FeatureStore.key` of ``dataset`` as the trainer would encode it: its collator over the rows in
        order (not sharded across processes, so every process and world size gets the same key)."""
        from hf_mlcl.labels.multihot import id_pairs, nonzero_pairs

        tr = self.trainer
        model = tr.accelerator.unwrap_model(tr.model)
        cached = self._digest
        if cached is None or cached[0] is not model.backbone:  # the frozen weights are hashed once
            cached = self._digest = (model.backbone, FeatureStore.encoder_digest(model.backbone))
        config = model.config
        settings = {
            "pooling": config.pooling,
            "segmented": getattr(config, "segmented", None),
            "chunk_size": getattr(config, "chunk_size", None),
            "bf16": bool(tr.args.bf16),
            "fp16": bool(tr.args.fp16),
        }
        if config.head == "native":  # features through the backbone's pooler (a linear head's keys unchanged)
            settings["head"] = "native"
        if tr.args.bf16 or tr.args.fp16:  # computed under autocast (stores of float32 runs keep their keys)
            settings["autocast"] = True

        def label_pairs(batch: dict[str, Any]) -> torch.Tensor:
            labels = tr.split_labels(batch)[1]
            return torch.stack(id_pairs(labels) if as_ids else nonzero_pairs(labels), dim=1)

        # iterating a DataLoader draws a seed from the global generator: keep the run's random streams as
        # they are, so dropout masks do not depend on whether a store is used
        with torch.random.fork_rng(devices=[]), _id_labels(tr) as as_ids:
            loader = torch.utils.data.DataLoader(
                dataset,
                batch_size=tr.args.per_device_eval_batch_size,
                shuffle=False,
                collate_fn=tr.data_collator,
            )
            return FeatureStore.key(cached[1], loader, settings, label_pairs)

    def _on_every_process(self, flag: bool) -> bool:
        """True when ``flag`` holds on every process (``flag`` itself with one process)."""
        accelerator = self.trainer.accelerator
        if accelerator.num_processes == 1:
            return flag
        flags = accelerator.gather(torch.tensor([int(flag)], device=self.trainer.args.device))
        return bool(flags.min().item())
