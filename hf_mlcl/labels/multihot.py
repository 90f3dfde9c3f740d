"""Multi-hot label matrices: built from label-id lists, validated, converted between layouts.

Datasets store labels as id lists (``Sequence(ClassLabel)``); the collator (per batch), the trainers
(training-set label statistics) and the embedding-quality metrics (label combinations) turn them into
(N, L) multi-hot matrices through :func:`label_coordinates` (one ``np.repeat`` for the rows and one
concatenation for the columns, never a per-example Python loop over labels). The losses validate what
they are given with :func:`as_multihot` (0/1 values, dense or torch-sparse COO / CSR, a large sparse-enough
dense matrix turned sparse in one scan); the integrations accept multi-hot rows or -1-padded id lists
(:func:`labels_to_multihot`); gathering across processes and queues use the bool forms
(:func:`to_dense_bool`, :func:`to_sparse_bool`). Validated matrices are float32 (exact for counts below
2**24) or float32 sparse COO.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .host_reads import host_reads_are_free

__all__ = [
    "LABEL_DTYPE",
    "LABEL_INPUT_FORMATS",
    "as_multihot",
    "cast",
    "coalesced",
    "dataset_label_matrix",
    "id_pairs",
    "ids_to_multihot",
    "is_sparse",
    "label_coordinates",
    "labels_to_multihot",
    "multi_hot_tensor",
    "multihot_to_ids",
    "nonzero_pairs",
    "resolve_label_format",
    "to_dense_bool",
    "to_dense_float",
    "to_sparse_bool",
    "binary_array",
    "integer_multihot_rows",
    "multi_hot_array",
]

LABEL_DTYPE = torch.float32
COMPACT_MIN_LABELS = 1024  # dense products over more labels than this skip the all-zero columns
_SCAN_MIN_ENTRIES = 2**20  # as_multihot(allow_sparse=True) scans dense matrices this large
_SCAN_BLOCK_BYTES = 256  # block size of that scan's first, vectorised pass


def label_coordinates(
    label_lists: Sequence[Sequence[int]], num_labels: int | None = None, hint: str = ""
) -> tuple[np.ndarray, np.ndarray, int]:
    """(rows, cols, num_labels) of the ones of the multi-hot matrix of ``label_lists``.

    ``num_labels=None`` infers ``max id + 1`` (at least 1). ValueError naming the first id outside
    ``[0, num_labels)``, followed by ``hint`` (how the caller fixes it).
    """
    arrays = [np.asarray(x, dtype=np.int64).reshape(-1) for x in label_lists]
    lengths = np.fromiter((len(x) for x in arrays), dtype=np.int64, count=len(arrays))
    cols = np.concatenate(arrays) if arrays else np.zeros(0, np.int64)
    if num_labels is None:
        num_labels = int(cols.max()) + 1 if cols.size else 1
    if cols.size and (cols.min() < 0 or cols.max() >= num_labels):
        bad = cols[(cols < 0) | (cols >= num_labels)]
        raise ValueError(f"label id {int(bad[0])} is outside [0, num_labels={num_labels}){hint}")
    rows = np.repeat(np.arange(len(arrays)), lengths)
    return rows, cols, int(num_labels)


def multi_hot_array(
    label_lists: Sequence[Sequence[int]] | None = None,
    num_labels: int | None = None,
    hint: str = "",
    csr: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Id lists (or their CSR form ``csr=(indptr, indices)``) -> a numpy bool (N, L) multi-hot matrix.

    ``num_labels=None`` infers ``max id + 1``; ValueError naming an id outside ``[0, num_labels)``, then ``hint``.
    """
    if csr is not None:
        indptr, indices = (np.asarray(a, dtype=np.int64) for a in csr)
        rows, cols = np.repeat(np.arange(len(indptr) - 1), np.diff(indptr)), indices
        num_labels = int(num_labels if num_labels is not None else (cols.max() + 1 if cols.size else 1))
        count = len(indptr) - 1
    else:
        rows, cols, num_labels = label_coordinates(label_lists, num_labels, hint)
        count = len(label_lists)
    out = np.zeros((count, num_labels), dtype=bool)
    out[rows, cols] = True
    return out


def integer_multihot_rows(rows: np.ndarray) -> bool:
    """True for equal-length integer rows ``(N, W)`` that are multi-hot rows rather than label-id lists: every
    value 0 or 1, and some row repeating one, which no id list does (``[1, 0, 1]``; ``[0, 1]`` reads as ids)."""
    return (
        rows.ndim == 2
        and rows.size > 0
        and rows.dtype.kind in "iu"
        and bool(((rows == 0) | (rows == 1)).all())
        and bool((np.diff(np.sort(rows, axis=1), axis=1) == 0).any())
    )


def binary_array(y: np.ndarray, hint: str = "") -> np.ndarray:
    """A numpy multi-hot matrix as bool; ValueError (then ``hint``) when a value is neither 0 nor 1."""
    if y.dtype == bool:
        return y
    if not np.all((y == 0) | (y == 1)):
        raise ValueError(f"labels must be multi-hot (0/1){hint}")
    return y.astype(bool)


def multi_hot_tensor(
    label_lists: Sequence[Sequence[int]], num_labels: int, sparse: bool = False, hint: str = ""
) -> torch.Tensor:
    """Id lists -> float32 (N, L) multi-hot: dense, or a coalesced ``torch.sparse_coo_tensor``."""
    rows, cols, num_labels = label_coordinates(label_lists, num_labels, hint)
    rows_t, cols_t = torch.from_numpy(rows), torch.from_numpy(cols)
    shape = (len(label_lists), num_labels)
    if sparse:
        idx = torch.stack([rows_t, cols_t])
        return torch.sparse_coo_tensor(
            idx, torch.ones(idx.shape[1]), shape, check_invariants=False
        ).coalesce()
    out = torch.zeros(shape, dtype=torch.float32)
    out[rows_t, cols_t] = 1.0
    return out


def cast(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t.to(dtype)`` without the dispatcher round trip when ``t`` already has ``dtype``."""
    return t if t.dtype == dtype else t.to(dtype)


def coalesced(labels: Tensor) -> Tensor:
    """A sparse COO tensor in coalesced form: itself when it is already (``coalesce()`` would return it too,
    but the call is one that can read the device, so the flag is asked first)."""
    return labels if labels.is_coalesced() else labels.coalesce()


def is_sparse(labels: Tensor) -> bool:
    """True for torch-sparse layouts (COO, CSR, CSC, BSR, BSC)."""
    return labels.layout != torch.strided


def nonzero_pairs(labels: Tensor, explicit_zeros: bool = True) -> tuple[Tensor, Tensor]:
    """(row, col) int64 index vectors of the non-zeros of a dense or sparse (N, L) multi-hot matrix,
    in row-major order (explicit zeros of a sparse matrix are skipped).

    ``explicit_zeros=False``: the caller knows that a sparse matrix stores no zero (what
    :func:`as_multihot` returns): its indices are the pairs, with no host read of the values.
    """
    if is_sparse(labels):
        lab = coalesced(labels if labels.layout == torch.sparse_coo else labels.to_sparse_coo())
        idx = lab.indices()
        if not explicit_zeros:
            return idx[0], idx[1]
        keep = torch.nonzero(lab.values() != 0).squeeze(1)  # one host read for both selections
        return idx[0].index_select(0, keep), idx[1].index_select(0, keep)
    nz = (labels != 0).nonzero()
    return nz[:, 0], nz[:, 1]


def _raise_non_binary(name: str, vals: Tensor) -> None:
    """Raise the ValueError naming the first non-binary value of ``vals`` (if there is one)."""
    bad = (vals != 0) & (vals != 1)  # NaN is caught here too (NaN != 0 and NaN != 1)
    if bool(bad.any()):
        example = vals[bad][0].item()
        if example != example:
            raise ValueError(f"{name} contains NaN; labels must be binary multi-hot (0/1)")
        raise ValueError(
            f"{name} must be binary multi-hot (0/1) but contains the value {example!r}; "
            "pass a multi-hot matrix (not label counts, indices or soft labels)"
        )


_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _scan_dense(labels: Tensor, name: str, check_values: bool = True) -> Tensor | None:
    """Validate a large dense multi-hot matrix in one pass and return it as float32 COO if sparse.

    The non-zeros are found in one pass (:func:`_dense_nonzeros`) and only they are checked for being
    exactly 1 (``check_values``). Returns None when the matrix is not sparse enough (more than 1/32
    non-zero) for sparse products to pay off; it is valid either way. Host reads on an accelerator:
    the number of non-zeros and the value check (none on a CPU).
    """
    flat = labels.reshape(-1).contiguous()  # a strided view (e.g. y[:, ::2]) cannot be read as bytes
    elems = _dense_nonzeros(flat)
    vals = flat[elems]
    if check_values and vals.dtype != torch.bool and bool((vals != 1).any()):
        _raise_non_binary(name, vals)
    if elems.numel() * 32 > flat.numel():
        return None
    width = labels.shape[1]
    idx = torch.stack([elems // width, elems % width])
    ones = torch.ones(elems.numel(), dtype=LABEL_DTYPE, device=flat.device)
    return torch.sparse_coo_tensor(idx, ones, labels.shape, check_invariants=False, is_coalesced=True)


def _dense_nonzeros(flat: Tensor) -> Tensor:
    """Positions (int64, ascending) of the non-zero elements of a flat dense tensor (-0.0 is zero, NaN is not).

    On an accelerator: one ``torch.nonzero`` (one host read: the count). On a CPU, where a flat
    ``nonzero`` over floats is bandwidth-poor, the non-zeros are found from the raw bytes: one
    vectorised ``amax`` over 256-byte blocks viewed as uint8 (any set bit — a 1, a NaN, a negative
    value, even -0.0 — makes a block's max non-zero); the flagged blocks are then read as 8-byte words,
    ``nonzero`` finds the non-zero words and a second, small ``nonzero`` the non-zero elements inside them
    (8 bools, 4 halves or 2 floats per word: a bool matrix costs an eighth of the element-wise search);
    a -0.0 found that way is dropped at the end.
    """
    if not host_reads_are_free(flat):
        return torch.nonzero(flat).squeeze(1)
    n = flat.numel()
    per_block = max(1, _SCAN_BLOCK_BYTES // flat.element_size())
    nb = n // per_block
    head = nb * per_block
    blocks = flat[:head].view(nb, per_block)
    hit = torch.nonzero(blocks.view(torch.uint8).amax(dim=1)).squeeze(1)
    # the flagged blocks as 8-byte words: the non-zero words, then the set elements inside them, found
    # on integer views (a flat nonzero over integers is several times faster than one over floats)
    words = blocks.index_select(0, hit).view(torch.int64).view(-1)
    word = torch.nonzero(words).squeeze(1)
    per_word = 8 // flat.element_size()
    in_word = words[word].view(_SAME_SIZE_INT[flat.element_size()]).view(-1, per_word)
    w, e = torch.nonzero(in_word, as_tuple=True)
    loc = word[w] * per_word + e  # position in the flagged blocks, one after the other
    elems = torch.cat(
        [hit[loc // per_block] * per_block + loc % per_block, head + torch.nonzero(flat[head:]).squeeze(1)]
    )
    keep = flat[elems] != 0  # -0.0 has a set bit but is a zero label
    return elems if bool(keep.all()) else elems[keep]


def ids_to_multihot(ids: Tensor, num_labels: int, pad_id: int = -1, check_values: bool = True) -> Tensor:
    """(N, K) label-id lists padded with ``pad_id`` -> (N, ``num_labels``) float32 multi-hot (one scatter).

    ValueError naming the offending id when one lies outside ``[0, num_labels)``. That check reads the
    ids on the host (a synchronisation on an accelerator); ``check_values=False`` skips it, and an id
    outside the range then still fails, in the scatter, instead of being dropped: on the CPU with the same
    ValueError (on an accelerator as its device-side index assertion).
    """
    if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.is_floating_point() or ids.dtype == torch.bool:
        raise ValueError(
            f"label ids must be an integer (N, K) tensor padded with {pad_id}; got "
            f"{getattr(ids, 'dtype', type(ids).__name__)} of shape {tuple(getattr(ids, 'shape', ()))}"
        )
    valid = ids != pad_id
    if check_values:
        _check_id_range(ids, valid, num_labels, pad_id)
    # padding goes to the extra column num_labels, dropped below; an id >= num_labels is moved past it
    # (out of range for the scatter) so that an unchecked bad id can never pass for padding
    index = torch.where(valid, ids + (ids >= num_labels).to(ids.dtype), torch.full_like(ids, num_labels))
    out = torch.zeros(ids.shape[0], num_labels + 1, dtype=LABEL_DTYPE, device=ids.device)
    try:
        out.scatter_(1, index.long(), 1.0)
    except RuntimeError:  # an unchecked id out of range: named as the check names it
        _check_id_range(ids, valid, num_labels, pad_id)
        raise
    return out[:, :num_labels]


def _check_id_range(ids: Tensor, valid: Tensor, num_labels: int, pad_id: int) -> None:
    """ValueError naming the first id of ``ids`` (``valid``: not padding) outside ``[0, num_labels)``."""
    bad = valid & ((ids < 0) | (ids >= num_labels))
    if bool(bad.any()):
        raise ValueError(f"label id {int(ids[bad][0])} is outside [0, {num_labels}) (padding id: {pad_id})")


def multihot_to_ids(labels: Tensor, pad_id: int = -1, min_width: int = 0) -> Tensor:
    """(N, L) multi-hot matrix (dense or torch sparse) -> (N, K) int64 label ids, each row's ids ascending and
    padded with ``pad_id``, K the most labels of a row but at least ``min_width`` (the inverse of
    :func:`ids_to_multihot`).

    A compact form of a batch's labels at large label counts: K columns instead of L.
    """
    rows, cols = nonzero_pairs(labels)
    n = labels.shape[0]
    counts = torch.bincount(rows, minlength=n)
    width = max(int(counts.max()) if n else 0, min_width)
    starts = torch.cumsum(counts, 0) - counts
    out = torch.full((n, width), pad_id, dtype=torch.int64, device=cols.device)
    out[rows, torch.arange(rows.numel(), device=rows.device) - starts[rows]] = cols
    return out


def id_pairs(ids: Tensor, pad_id: int = -1) -> tuple[Tensor, Tensor]:
    """(row, col) int64 index vectors of the labels in an (N, K) id matrix padded with ``pad_id``, in row-major
    order (what :func:`nonzero_pairs` gives for the multi-hot matrix of ids given ascending)."""
    nz = (ids != pad_id).nonzero()
    return nz[:, 0], ids[nz[:, 0], nz[:, 1]].long()


LABEL_INPUT_FORMATS = ("auto", "multi_hot", "ids")


def resolve_label_format(labels: Tensor, num_labels: int | None = None, label_format: str = "auto") -> str:
    """``"multi_hot"`` or ``"ids"`` for a batch of labels (the rule of :func:`labels_to_multihot`).

    ``"auto"`` reads the values of an integer tensor exactly ``num_labels`` wide (are they all 0/1?): a
    host synchronisation on an accelerator, so callers that see many batches of one dataset resolve
    the format once per (dtype, width).
    """
    if label_format not in LABEL_INPUT_FORMATS:
        raise ValueError(f"label_format must be one of {LABEL_INPUT_FORMATS}; got {label_format!r}")
    if not isinstance(labels, Tensor) or labels.dim() != 2:
        raise ValueError(
            "labels must be a (batch, L) multi-hot or (batch, K) -1-padded label-id tensor; got "
            f"{tuple(labels.shape) if isinstance(labels, Tensor) else type(labels).__name__}"
        )
    if label_format != "auto":
        return label_format
    if labels.is_floating_point() or labels.dtype == torch.bool or is_sparse(labels):
        return "multi_hot"
    if labels.shape[1] != num_labels:  # decided by the width: no value read
        return "ids"
    return "multi_hot" if bool(((labels == 0) | (labels == 1)).all()) else "ids"


def labels_to_multihot(
    labels: Tensor, num_labels: int | None = None, label_format: str = "auto", check_values: bool = True
) -> Tensor:
    """A batch's labels as (B, L) float32 multi-hot: ``"multi_hot"`` rows pass through, ``"ids"`` ((B, K)
    label ids padded with -1) are scattered (:func:`ids_to_multihot`, needs ``num_labels``). ``"auto"``:
    float / bool tensors are multi-hot; integer tensors are ids unless they hold only 0/1 and are exactly
    ``num_labels`` wide (name the format where that could be ambiguous; :func:`resolve_label_format`).
    ValueError naming the problem. ``check_values=False`` skips the id-range check (see
    :func:`ids_to_multihot`); with ``"auto"`` the values are still read to pick the format.
    """
    fmt = resolve_label_format(labels, num_labels, label_format)
    if fmt == "multi_hot":
        if num_labels is not None and labels.shape[1] != num_labels:
            raise ValueError(f"multi-hot labels are {labels.shape[1]} wide but num_labels={num_labels}")
        return labels if is_sparse(labels) else labels.to(LABEL_DTYPE)
    if num_labels is None:
        raise ValueError(
            "label-id lists need num_labels= (the size of the label space); integer labels are read as "
            "-1-padded ids unless num_labels= is their width (pass it, or float / bool multi-hot labels)"
        )
    return ids_to_multihot(labels, num_labels, check_values=check_values)


def as_multihot(
    labels: Tensor,
    name: str = "labels",
    device: torch.device | None = None,
    allow_sparse: bool = False,
    check_values: bool = True,
) -> Tensor:
    """Validate a multi-hot (N, L) matrix and return it as float32 (dense) or coalesced float32 COO.

    Accepts bool / integer / floating dense tensors and torch-sparse COO / CSR / CSC tensors.
    Raises ``ValueError`` naming the problem for: non-tensors, wrong rank, NaN / non-binary values
    (duplicate COO entries that sum to 2 count as non-binary).

    ``check_values=False`` skips the value check, the one part that reads the labels on the host (a
    synchronisation on an accelerator): for labels already validated, e.g. once before training or on
    the host by the collator that built them. A dense matrix then costs no host read at all; sparse
    labels and the sparse scan below cost one whatever this says (the search for explicit zeros, the
    number of non-zeros: data-dependent shapes), and with the check on, sparse labels fold it into that
    read while the scan reads the values it found once more.

    ``allow_sparse``: a large dense matrix (more than ``COMPACT_MIN_LABELS`` labels, at least
    2**20 entries) that is at most 1/32 non-zero is returned as sparse COO, validated in the same
    pass (:func:`_scan_dense`): the losses then run on sparse label products whatever the input
    format, so dense and sparse labels cost about the same.
    """
    if not isinstance(labels, Tensor):
        raise ValueError(
            f"{name} must be a torch.Tensor multi-hot matrix of shape (N, L), got {type(labels).__name__}; "
            "convert label-index lists to multi-hot first (e.g. with hf_mlcl.data.MultiLabelCollator)"
        )
    if labels.dim() != 2:
        raise ValueError(f"{name} must be a 2-D multi-hot matrix (N, L), got shape {tuple(labels.shape)}")
    if labels.is_complex():
        raise ValueError(f"{name} must be real-valued 0/1, got dtype {labels.dtype}")
    if device is not None and labels.device != device:
        labels = labels.to(device)
    if is_sparse(labels):
        coo = labels if labels.layout == torch.sparse_coo else labels.to_sparse_coo()
        return _checked_sparse(coalesced(coo), name, check_values)
    if allow_sparse and labels.shape[1] > COMPACT_MIN_LABELS and labels.numel() >= _SCAN_MIN_ENTRIES:
        scanned = _scan_dense(labels, name, check_values)
        return cast(labels, LABEL_DTYPE) if scanned is None else scanned
    # v (v - 1) is 0 exactly for v in {0, 1}: NaN, +-inf and every other value give a non-zero
    # (for integers too: v (v - 1) = 0 mod 2^bits only for v = 0 or 1, one factor being odd)
    if check_values and labels.dtype != torch.bool and bool((labels * (labels - 1)).any()):
        _raise_non_binary(name, labels)
    return cast(labels, LABEL_DTYPE)


def _checked_sparse(labels: Tensor, name: str, check_values: bool) -> Tensor:
    """A coalesced COO multi-hot matrix validated (``check_values``) and without explicit zeros, as float32.

    The value check and the search for explicit zeros share one host read; dropping the zeros (rare)
    costs more reads only when there are some.
    """
    idx, v = labels.indices(), labels.values()
    flags = [v == 0]
    if check_values and v.dtype != torch.bool:
        flags.append(v * (v - 1))  # non-zero exactly for the values other than 0 / 1 (see as_multihot)
    has_zero, *non_binary = torch.stack([f.any() for f in flags]).tolist()
    if non_binary and non_binary[0]:
        _raise_non_binary(name, v)
    v = cast(v, LABEL_DTYPE)
    if has_zero:  # drop explicit zeros so nnz == number of (row, label) memberships
        keep = v != 0
        idx, v = idx[:, keep], v[keep]
    # a subset of coalesced (sorted, unique) indices is still coalesced: no second sort
    return torch.sparse_coo_tensor(
        idx, v, labels.shape, device=labels.device, check_invariants=False, is_coalesced=True
    )


def to_dense_bool(labels: Tensor) -> Tensor:
    """A multi-hot (N, L) matrix (dense bool/int/float, or torch sparse COO/CSR) as a dense bool tensor."""
    if labels.layout != torch.strided:
        labels = labels.to_dense()
    return labels if labels.dtype == torch.bool else labels != 0


def to_sparse_bool(labels: Tensor) -> Tensor:
    """A multi-hot (N, L) matrix (dense, or torch sparse COO/CSR) as a coalesced sparse COO bool tensor."""
    rows, cols = nonzero_pairs(labels)
    return torch.sparse_coo_tensor(
        torch.stack([rows, cols]),
        torch.ones(rows.numel(), dtype=torch.bool, device=labels.device),
        tuple(labels.shape),
        is_coalesced=True,
    )


def to_dense_float(labels: Tensor) -> Tensor:
    """A multi-hot (N, L) matrix (dense or torch sparse) as a dense float32 tensor (metrics, predictions)."""
    if labels.layout != torch.strided:
        labels = labels.to_dense()
    return labels.float()


def dataset_label_matrix(dataset: Any, label_column: str, num_labels: int) -> Tensor:
    """The (N, L) multi-hot label matrix of a dataset's label-id lists as a torch sparse COO tensor (the
    training-set statistics of ws-MulSupCon)."""
    lists = (
        dataset[label_column] if hasattr(dataset, "column_names") else [ex[label_column] for ex in dataset]
    )
    return multi_hot_tensor(lists, num_labels, sparse=True, hint=f" in the {label_column!r} column")
