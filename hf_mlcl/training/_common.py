"""Batch and label-space plumbing shared by the two trainers: label-count checks, label pop, row slicing."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch

logger = logging.getLogger(__name__)

_DEFAULT_ID2LABEL = {0: "LABEL_0", 1: "LABEL_1"}


def dataset_columns(dataset: Any) -> list[str] | None:
    """Column names of a ``datasets.Dataset`` (or the keys of a map-style dataset's first item)."""
    if dataset is None:
        return None
    cols = getattr(dataset, "column_names", None)
    if isinstance(cols, list):
        return cols
    try:
        first = dataset[0]
    except Exception:  # iterable datasets: cannot peek without consuming
        return None
    return list(first) if isinstance(first, dict) else None


def dataset_num_labels(dataset: Any, label_column: str = "labels") -> int | None:
    """Number of labels declared by the dataset's ``Sequence(ClassLabel)`` feature, or None."""
    features = getattr(dataset, "features", None)
    if not features or label_column not in features:
        return None
    feat = features[label_column]
    inner = getattr(feat, "feature", feat)  # Sequence(ClassLabel) / List(ClassLabel)
    n = getattr(inner, "num_classes", None)
    return int(n) if n is not None else None


def dataset_label_names(dataset: Any, label_column: str = "labels") -> list[str] | None:
    features = getattr(dataset, "features", None)
    if not features or label_column not in features:
        return None
    inner = getattr(features[label_column], "feature", features[label_column])
    names = getattr(inner, "names", None)
    return list(names) if names else None


def check_label_column(dataset: Any, label_column: str, which: str) -> None:
    """ValueError when a dataset has no label column (the contrastive and probing losses need labels)."""
    if dataset is None:
        return
    cols = dataset_columns(dataset)
    if cols is not None and label_column not in cols:
        raise ValueError(
            f"the {which} dataset has no {label_column!r} column (columns: {cols}); multi-label training "
            f"needs label-id lists in {label_column!r} — load it with hf_mlcl.data.load_mlc_dataset or rename "
            "the column (dataset.rename_column(old, 'labels'))"
        )


def model_num_labels(model: Any) -> int | None:
    """The model config's label count when it was set on purpose (not PretrainedConfig's default 2)."""
    config = getattr(model, "config", None)
    if config is None:
        return None
    id2label = getattr(config, "id2label", None)
    if not id2label or {int(k): v for k, v in id2label.items()} == _DEFAULT_ID2LABEL:
        return None
    return int(config.num_labels)


def resolve_num_labels(
    dataset: Any,
    num_labels: int | None,
    label_column: str,
    model: Any = None,
    loss: Any = None,
    queue: Any = None,
) -> int:
    """The label count everyone must agree on; ValueError naming the two sides of any mismatch."""
    sources: list[tuple[str, int]] = []
    if num_labels is not None:
        sources.append(("num_labels argument", int(num_labels)))
    n_ds = dataset_num_labels(dataset, label_column)
    if n_ds is not None:
        sources.append((f"the dataset's {label_column!r} ClassLabel feature", n_ds))
    n_model = model_num_labels(model)
    if n_model is not None:
        sources.append(("model.config.num_labels", n_model))
    n_loss = getattr(loss, "num_labels", None)
    if isinstance(n_loss, int):
        sources.append((f"the loss's num_labels ({type(loss).__name__})", n_loss))
    n_queue = getattr(queue, "num_labels", None)
    if isinstance(n_queue, int):
        sources.append(("the embedding queue's num_labels", n_queue))
    if not sources:
        raise ValueError(
            "cannot tell the number of labels: the dataset has no ClassLabel feature; pass num_labels= to the "
            "trainer (or load the data with hf_mlcl.data.load_mlc_dataset)"
        )
    first_name, first = sources[0]
    for name, value in sources[1:]:
        if value != first:
            raise ValueError(
                f"label-count mismatch: {first_name} says {first} labels but {name} says {value}; build the "
                "model / loss / queue for the dataset's label space (len(hf_mlcl.data.label_names(ds)))"
            )
    return first


def accepted_kwargs(cls_or_fn: Any, candidates: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``candidates`` that the constructor / function signature accepts by name."""
    target = cls_or_fn.__init__ if inspect.isclass(cls_or_fn) else cls_or_fn
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return {}
    # Only explicitly named parameters count: a ``**kwargs`` catch-all is never guessed into.
    return {
        n: v for n, v in candidates.items() if n in params and params[n].kind != inspect.Parameter.VAR_KEYWORD
    }


def slice_rows(t: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows [start, stop) of a dense or torch-sparse tensor."""
    if t.layout != torch.strided:
        idx = torch.arange(start, stop, device=t.device)
        return t.index_select(0, idx)
    return t[start:stop]


def slice_batch(batch: dict[str, Any], start: int, stop: int, n: int) -> dict[str, Any]:
    """Rows [start, stop) of every tensor in ``batch`` whose first dim is ``n``."""
    return {
        k: slice_rows(v, start, stop)
        if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n
        else v
        for k, v in batch.items()
    }


def pop_labels(inputs: dict[str, Any], label_column: str = "labels") -> tuple[dict[str, Any], torch.Tensor]:
    """(model inputs, labels): a copy of the batch without its label entry (``label_column``, else
    ``"labels"``); ValueError when the batch has none."""
    inputs = dict(inputs)
    labels = inputs.pop(label_column if label_column in inputs else "labels", None)
    if labels is None:
        raise ValueError(f"the batch has no {label_column!r}; the collator must return multi-hot labels")
    return inputs, labels


def labels_to_dense_float(labels: torch.Tensor) -> torch.Tensor:
    if labels.layout != torch.strided:
        labels = labels.to_dense()
    return labels.float()


def batch_rows(batch: dict[str, Any]) -> int:
    ref = batch.get("input_ids")
    if ref is None:
        ref = next(v for v in batch.values() if isinstance(v, torch.Tensor))
    return int(ref.shape[0])


def label_matrix(dataset: Any, label_column: str, num_labels: int) -> torch.Tensor:
    """The (N, L) multi-hot label matrix of a dataset's label-id lists as a torch sparse COO tensor."""
    from hf_mlcl.data.multihot import multi_hot_tensor

    lists = (
        dataset[label_column] if hasattr(dataset, "column_names") else [ex[label_column] for ex in dataset]
    )
    return multi_hot_tensor(lists, num_labels, sparse=True, hint=f" in the {label_column!r} column")
