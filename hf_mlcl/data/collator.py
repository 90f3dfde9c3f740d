"""Batch collation: on-the-fly tokenization / padding and multi-hot labels built per batch.

Datasets store labels as id lists (``Sequence(ClassLabel)``); the (B, L) multi-hot matrix exists only
for one batch, so label spaces like MIMIC-IV ICD-10 (25,230 codes) never need a documents x labels
matrix. Long documents (PLM-ICD, Huang et al. 2022: up to 3,072 tokens split into chunks of 128) are
padded to a multiple of the chunk size so the model can reshape (B, T) into (B, T / chunk, chunk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from hf_mlcl.labels.multihot import integer_multihot_rows, multi_hot_tensor, multihot_to_ids

_TOKEN_KEYS = ("input_ids", "attention_mask", "token_type_ids")
BATCH_LABEL_FORMATS = ("dense", "sparse", "ids")  # how a collated batch holds its labels


class MultiLabelCollator:
    """Turn a list of examples into model inputs plus a float32 multi-hot ``labels`` batch.

    Examples carry ``text_column`` (tokenized here, truncated to ``max_length``) or pre-tokenized
    ``input_ids`` (+ optional ``attention_mask`` / ``token_type_ids``; truncated, then padded), and
    ``label_column`` with label ids (``None`` -> no labels, for inference). Extra columns are ignored.

    ``label_format="dense"`` -> float32 (B, L); ``"sparse"`` -> ``torch.sparse_coo_tensor`` (B, L); ``"ids"`` ->
    int64 (B, K) label ids, each row's ascending and padded with -1, K >= 1 the most labels of a row (a compact
    form at large label counts that, unlike a sparse tensor, can be sliced and gathered).
    ``n_views=2`` -> 2B rows: rows [0, B) view 1 and rows [B, 2B) view 2 (identical inputs; dropout
    in the model makes the views differ, as in SimCSE/SupCon two-crop batches); labels repeated.
    ``pad_to_multiple_of`` (e.g. the model's ``chunk_size``) rounds the padded length up.
    ``padding="max_length"`` pads every batch to ``max_length`` (static shapes).

    ``drop_unpadded_attention_mask`` (default True): a batch in which no row is padded (every row as long
    as the longest, e.g. all truncated at ``max_length``) is returned without ``attention_mask``: every
    token attends either way (the models' default for an absent mask), and the backbone then runs its
    attention unmasked (SDPA's flash kernel; a prepared all-ones mask would force the masked kernel)
    without transformers' host read of the mask (``padding_mask.all()``, a device synchronisation per
    forward on an accelerator). The check is made here, on the host, where it costs nothing. False keeps
    the all-ones mask in every batch (for code that reads ``batch["attention_mask"]``).

    ``padding_free=True`` concatenates the batch's rows into one row without padding (decoder backbones:
    :class:`~hf_mlcl.modeling.MLCLPreTrainedModel` takes it): ``input_ids`` (1, T) with T the batch's real
    tokens, ``position_ids`` (1, T) restarting at 0 for every row, ``cu_seq_lens`` int32 (B + 1,) the rows'
    offsets, ``max_seq_len`` the longest row (an int), ``labels`` (B, L) first (Trainer counts a batch's rows
    from its first tensor). No row may be empty.
    """

    def __init__(
        self,
        tokenizer,
        num_labels: int,
        max_length: int = 512,
        n_views: int = 1,
        text_column: str = "text",
        label_column: str | None = "labels",
        label_format: str = "dense",
        pad_to_multiple_of: int | None = None,
        padding: str = "longest",
        drop_unpadded_attention_mask: bool = True,
        padding_free: bool = False,
    ) -> None:
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        if max_length < 1:
            raise ValueError(f"max_length must be >= 1, got {max_length}")
        if n_views < 1:
            raise ValueError(f"n_views must be >= 1 (2 for two-view contrastive batches), got {n_views}")
        if label_format not in BATCH_LABEL_FORMATS:
            raise ValueError(f"label_format must be one of {BATCH_LABEL_FORMATS}, got {label_format!r}")
        if padding not in ("longest", "max_length"):
            raise ValueError(f"padding must be 'longest' or 'max_length', got {padding!r}")
        if pad_to_multiple_of is not None and pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be a positive int, got {pad_to_multiple_of}")
        if tokenizer.pad_token_id is None:
            raise ValueError(
                "the tokenizer has no pad token; set tokenizer.pad_token (e.g. to eos_token) first"
            )
        # for every padding: the tokenizer refuses a truncation length off the multiple at the first batch
        if pad_to_multiple_of and max_length % pad_to_multiple_of:
            raise ValueError(
                f"max_length={max_length} is not a multiple of pad_to_multiple_of={pad_to_multiple_of}; "
                "choose e.g. max_length=3072 with chunk_size 128"
            )
        self.tokenizer = tokenizer
        self.num_labels = int(num_labels)
        self.max_length = int(max_length)
        self.n_views = int(n_views)
        self.text_column = text_column
        self.label_column = label_column
        self.label_format = label_format
        self.pad_to_multiple_of = pad_to_multiple_of
        self.padding = padding
        self.drop_unpadded_attention_mask = bool(drop_unpadded_attention_mask)
        self.padding_free = bool(padding_free)

    # -- tokens -------------------------------------------------------------------------------
    def _encode(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        first = examples[0]
        if "input_ids" in first:
            return self._pad_pretokenized(examples)
        if self.text_column not in first:
            raise ValueError(
                f"examples have neither {self.text_column!r} nor 'input_ids' (keys: {sorted(first)}); set "
                "text_column= to the text field, or pre-tokenize with hf_mlcl.data.tokenize_dataset"
            )
        try:
            texts = [ex[self.text_column] for ex in examples]
        except KeyError as err:
            raise ValueError(f"an example in the batch lacks the {self.text_column!r} column") from err
        return self.tokenizer(
            texts,
            truncation=True,
            max_length=self.max_length,
            padding=self.padding,
            pad_to_multiple_of=self.pad_to_multiple_of,
            return_tensors="pt",
        )

    def _kept(self, ids: np.ndarray) -> slice | np.ndarray:
        """The positions of a pre-tokenized row that ``max_length`` keeps, as the tokenizer truncates a text: on
        its ``truncation_side``, keeping the special tokens the row starts and ends with ([CLS] ... [SEP])."""
        n, limit = len(ids), self.max_length
        if n <= limit:
            return slice(None)
        lead, trail = self._special_edges()
        left = getattr(self.tokenizer, "truncation_side", "right") == "left"
        if left and len(lead) < limit and np.array_equal(ids[: len(lead)], lead):
            return np.r_[0 : len(lead), n - limit + len(lead) : n]
        if not left and len(trail) < limit and np.array_equal(ids[n - len(trail) :], trail):
            return np.r_[0 : limit - len(trail), n - len(trail) : n]
        return slice(n - limit, n) if left else slice(0, limit)

    def _special_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """The special token ids the tokenizer puts before and after a text's tokens (BERT: [CLS] and [SEP])."""
        if not hasattr(self, "_edges"):
            bare = self.tokenizer("x", add_special_tokens=False)["input_ids"]
            full = self.tokenizer("x")["input_ids"]
            start = next((i for i in range(len(full)) if full[i : i + len(bare)] == bare), 0)
            self._edges = (np.asarray(full[:start]), np.asarray(full[start + len(bare) :]))
        return self._edges

    def _pad_pretokenized(self, examples: Sequence[dict]) -> dict[str, torch.Tensor]:
        """Truncate + pad pre-tokenized rows with one vectorised scatter per key (no tokenizer.pad).

        Rows may be lists, numpy arrays or tensors (``dataset.with_format("numpy")``). The attention
        mask is rebuilt from the lengths when absent; the tokenizer's ``padding_side`` is respected."""
        keys = [k for k in _TOKEN_KEYS if k in examples[0] and examples[0][k] is not None]
        rows = [{k: np.asarray(ex[k]).reshape(-1) for k in keys} for ex in examples]
        kept = [self._kept(row["input_ids"]) for row in rows]
        seqs = {k: [row[k][keep] for row, keep in zip(rows, kept)] for k in keys}
        lengths = np.fromiter((len(x) for x in seqs["input_ids"]), dtype=np.int64, count=len(examples))
        width = self.max_length if self.padding == "max_length" else int(lengths.max(initial=0))
        if self.pad_to_multiple_of:
            width = -(-max(width, 1) // self.pad_to_multiple_of) * self.pad_to_multiple_of
        pos = np.arange(width)[None, :]
        if getattr(self.tokenizer, "padding_side", "right") == "left":
            filled = pos >= (width - lengths)[:, None]
        else:
            filled = pos < lengths[:, None]
        pad_values = {
            "input_ids": self.tokenizer.pad_token_id,
            "token_type_ids": getattr(self.tokenizer, "pad_token_type_id", 0),
            "attention_mask": 0,
        }
        out = {}
        for k in keys:
            arr = np.full((len(examples), width), pad_values[k], dtype=np.int64)
            if lengths.sum():
                arr[filled] = np.concatenate(seqs[k])
            out[k] = torch.from_numpy(arr)
        if "attention_mask" not in out:
            out["attention_mask"] = torch.from_numpy(filled.astype(np.int64))
        return out

    # -- labels -------------------------------------------------------------------------------
    def labels_to_tensor(self, label_lists: Sequence[Sequence[int]]) -> torch.Tensor:
        """Id lists -> float32 (B, L) dense or sparse COO multi-hot (one vectorised scatter), or the padded id
        matrix of ``label_format="ids"``. Rows of floats or
        bools (``[0., 1., 0., 1.]``, what transformers users pass) are multi-hot rows already, never ids; so are
        rows of num_labels integers 0 and 1 that repeat a value (``[1, 0, 1]``), which no id list does."""
        if label_lists and (_float_or_bool_row(label_lists[0]) or self._integer_multihot_row(label_lists[0])):
            dense = self._multi_hot_rows(label_lists)
            if self.label_format == "ids":
                return multihot_to_ids(dense, min_width=1)
            return dense.to_sparse().coalesce() if self.label_format == "sparse" else dense
        labels = multi_hot_tensor(
            label_lists,
            self.num_labels,
            sparse=self.label_format != "dense",
            hint="; pass the dataset's num_labels (len(label_names(ds))) to MultiLabelCollator",
        )
        return multihot_to_ids(labels, min_width=1) if self.label_format == "ids" else labels

    def _integer_multihot_row(self, row: Any) -> bool:
        """A row of ``num_labels`` integers 0 and 1 that repeats a value: a multi-hot row, not ids."""
        values = np.asarray(row).reshape(1, -1)
        return values.shape[1] == self.num_labels and integer_multihot_rows(values)

    def _multi_hot_rows(self, rows: Sequence[Any]) -> torch.Tensor:
        """(B, L) float32 from multi-hot rows; ValueError unless each has num_labels 0/1 values."""
        try:
            dense = torch.as_tensor(np.asarray(rows, dtype=np.float32))
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"multi-hot label rows must all have num_labels={self.num_labels} values ({err})"
            ) from err
        if dense.dim() != 2 or dense.shape[1] != self.num_labels:
            raise ValueError(
                f"multi-hot label rows (floats / bools) must have num_labels={self.num_labels} values; got shape "
                f"{tuple(dense.shape)}; pass label ids as integer lists instead"
            )
        if not bool(((dense == 0) | (dense == 1)).all()):
            raise ValueError("multi-hot label rows must hold only 0 and 1")
        return dense

    def __call__(self, examples: Sequence[dict[str, Any]]) -> dict[str, torch.Tensor]:
        if not examples:
            raise ValueError("MultiLabelCollator got an empty batch")
        batch = dict(self._encode(examples))
        mask = batch.get("attention_mask")
        if (
            self.drop_unpadded_attention_mask and mask is not None and bool(mask.all())
        ):  # a host tensor: no sync
            del batch["attention_mask"]
        if self.label_column is not None:
            try:
                label_lists = [ex[self.label_column] for ex in examples]
            except KeyError as err:
                raise ValueError(
                    f"examples lack the label column {self.label_column!r} (keys: {sorted(examples[0])}); "
                    "set label_column= (or label_column=None for unlabeled inference batches)"
                ) from err
            batch["labels"] = self.labels_to_tensor(label_lists)
        if self.n_views > 1:
            for key, value in batch.items():
                if value.is_sparse:
                    b = value.shape[0]
                    idx, vals = value.indices(), value.values()
                    shifted = [idx + torch.tensor([[v * b], [0]]) for v in range(self.n_views)]
                    batch[key] = torch.sparse_coo_tensor(
                        torch.cat(shifted, 1),
                        vals.repeat(self.n_views),
                        (b * self.n_views, value.shape[1]),
                        check_invariants=False,
                    ).coalesce()
                else:
                    batch[key] = value.repeat(self.n_views, *([1] * (value.dim() - 1)))
        return pack_rows(batch) if self.padding_free else batch


def pack_rows(batch: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A padded batch (``input_ids`` (B, W), ``attention_mask`` (B, W) or none: no padding) as one row without
    padding: ``labels`` (when present), ``input_ids`` and ``token_type_ids`` (1, T), ``position_ids`` (1, T)
    counting from 0 in every row, ``cu_seq_lens`` int32 (B + 1,) and ``max_seq_len`` (int). Host tensors only.
    ValueError for a row without tokens (it would have no token to pool)."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    mask = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()
    lengths = mask.sum(1)
    if not bool((lengths > 0).all()):
        raise ValueError("padding_free batches need at least one token in every row; a row is empty")
    offsets = torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])
    total = int(offsets[-1])
    starts = torch.repeat_interleave(offsets[:-1], lengths, output_size=total)
    packed: dict[str, Any] = {}
    if "labels" in batch:
        packed["labels"] = batch["labels"]
    for key in ("input_ids", "token_type_ids"):
        if batch.get(key) is not None:
            packed[key] = batch[key][mask][None]
    packed["position_ids"] = (torch.arange(total) - starts)[None]
    packed["cu_seq_lens"] = offsets.to(torch.int32)
    packed["max_seq_len"] = int(lengths.max())
    return packed


def _float_or_bool_row(row: Any) -> bool:
    """True for a label row of floats or bools (a multi-hot row), False for one of integer ids."""
    if isinstance(row, (torch.Tensor, np.ndarray)):
        return row.dtype in (torch.bool, np.bool_) or (
            row.dtype.is_floating_point
            if isinstance(row, torch.Tensor)
            else np.issubdtype(row.dtype, np.floating)
        )
    return any(isinstance(v, (float, bool, np.floating, np.bool_)) for v in row)


def tokenize_dataset(
    dataset_dict,
    tokenizer,
    max_length: int = 512,
    num_proc: int | None = None,
    text_column: str = "text",
    keep_text: bool = False,
    batch_size: int = 1000,
    desc: str | None = "Tokenizing",
    model_inputs: Sequence[str] | None = None,
):
    """Pre-tokenize a DatasetDict (or Dataset) with ``datasets.map(batched=True)`` (progress bars,
    disk cache, optional ``num_proc``). Adds ``input_ids`` / ``attention_mask`` (truncated to
    ``max_length``, not padded: :class:`MultiLabelCollator` pads per batch); drops the text column
    unless ``keep_text``; keeps ``labels`` and other columns. ``model_inputs=("input_ids",)`` stores only
    the ids (smaller cache; the collator rebuilds the attention mask from the lengths)."""
    from datasets import Dataset, DatasetDict

    if not isinstance(dataset_dict, (Dataset, DatasetDict)):
        raise ValueError(
            f"tokenize_dataset expects a datasets.Dataset or DatasetDict, got {type(dataset_dict).__name__}"
        )
    cols = dataset_dict.column_names
    cols = cols if isinstance(cols, list) else next(iter(cols.values()), [])
    if text_column not in cols:
        raise ValueError(f"no text column {text_column!r} to tokenize (columns: {cols}); pass text_column=")

    def _tok(batch):
        enc = tokenizer(batch[text_column], truncation=True, max_length=max_length)
        return dict(enc) if model_inputs is None else {k: enc[k] for k in model_inputs}

    return dataset_dict.map(
        _tok,
        batched=True,
        batch_size=batch_size,
        num_proc=num_proc,
        remove_columns=None if keep_text else [text_column],
        desc=desc,
    )
