"""Multi-label metrics of a split streamed in row chunks: :class:`MultiLabelAccumulator` (``add_batch`` /
``compute``, as HF ``evaluate`` metrics and ``Trainer(batch_eval_metrics=True)``).

Exact at any size, from per-chunk counts and sparse truth: micro / macro P, R, F1, hamming loss,
example F1, subset accuracy (at the thresholds counted while streaming), P@k, R@k, R-precision,
``map_example`` and the global-grid threshold. Per-label AUC / AP, micro AUC and per-label thresholds need
whole columns: up to ``exact_cells`` rows x labels the inputs are kept (4 bytes a cell for float32
logits) and these are exact too (the engines of :mod:`hf_mlcl.evaluation.ranking` and
:mod:`hf_mlcl.evaluation.thresholds`, within 1e-12 of :func:`compute_multilabel_metrics`). Above it
they come from per-label histograms of the scores (bins 1/32 logit wide on [-16, 16], plus the counted
thresholds as edges): AUC and AP split a positive's bin by a density linear across it (AP as the
binomial expectation), :meth:`bounds` gives the exact intervals; per-label thresholds are the best bin
edge (exact F1 at every edge). Memory: the histograms (labels x ~1,100 x 4 bytes), a few integers per
row and per positive, one chunk of ``CHUNK_CELLS`` cells. Design: docs/usage.md, "Evaluation at large
label counts".
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation import inputs as _inputs
from hf_mlcl.evaluation.inputs import check_ks, check_true, mean_or_nan, safe_div, sigmoid, to_numpy
from hf_mlcl.evaluation.metrics import DEFAULT_KS, metric_keys
from hf_mlcl.evaluation.ranking import float32_exact, per_label_ap_auc
from hf_mlcl.evaluation.thresholds import _best_cuts_argsort, _best_cuts_keys, threshold_grid

logger = logging.getLogger(__name__)

__all__ = ["EXACT_CELLS", "HISTOGRAM_KEYS", "MultiLabelAccumulator"]

EXACT_CELLS = 1 << 25  # rows x labels kept for exact column metrics (128 MiB of float32 logits)
LOGIT_RANGE = 16.0  # histogram bins: uniform in logit on [-LOGIT_RANGE, LOGIT_RANGE] ...
BINS_PER_LOGIT = 32  # ... BINS_PER_LOGIT per logit unit, plus the counted thresholds as edges
HISTOGRAM_KEYS = ("micro_auc", "macro_auc", "map_label")  # approximate above exact_cells
_LUT_PER_LOGIT = 256  # cells of the bin look-up table, per logit unit
_LUT_RANGE = 24.0
_BINOMIAL_MAX = 64  # in-bin negatives up to which the expected precision is summed exactly


def _logit(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(p) - np.log1p(-p)
    return np.nan_to_num(z, nan=0.0, posinf=1e4, neginf=-1e4)


def _references(references: Any, rows: int, num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, label) of every positive of a batch, sorted by row then label, from a dense multi-hot
    matrix (numpy / torch), a sparse one (torch, scipy) or a list of label-id lists (one per row)."""
    if isinstance(references, (list, tuple)):
        ids = [np.asarray(r, dtype=np.int64).ravel() for r in references]
        if len(ids) != rows:
            raise ValueError(f"{len(ids)} label-id lists for {rows} prediction rows.")
        cols = np.concatenate(ids) if ids else np.zeros(0, np.int64)
        if cols.size and (cols.min() < 0 or cols.max() >= num_labels):
            raise ValueError(f"label ids must lie in [0, {num_labels}), got {cols.min()}..{cols.max()}.")
        row = np.repeat(np.arange(rows, dtype=np.int64), [r.size for r in ids])
        key = np.unique(row * num_labels + cols)
        return key // num_labels, key % num_labels
    if hasattr(references, "tocsr"):  # scipy sparse
        m = references.tocsr()
        m.sum_duplicates()
        m.eliminate_zeros()
        if m.shape != (rows, num_labels):
            raise ValueError(f"references have shape {m.shape}, predictions ({rows}, {num_labels}).")
        if m.nnz and not np.all(m.data == 1):
            raise ValueError("references must contain only 0 and 1 (multi-hot).")
        return np.repeat(np.arange(rows, dtype=np.int64), np.diff(m.indptr)), m.indices.astype(np.int64)
    y = check_true(references, "references")
    if y.shape != (rows, num_labels):
        raise ValueError(f"references have shape {y.shape}, predictions ({rows}, {num_labels}).")
    r, c = np.nonzero(y)
    return r.astype(np.int64), c.astype(np.int64)


def _expected_precision(pos: np.ndarray, base: np.ndarray, m: np.ndarray, f: np.ndarray) -> np.ndarray:
    """E[pos / (base + K)] with K ~ Binomial(m, f), the negatives of a positive's bin above it (exact sum for
    m <= _BINOMIAL_MAX, the plug-in pos / (base + m f) above: precision is convex in K, so the plug-in
    alone underestimates AP where few negatives are near the positive)."""
    out = pos / (base + m * f)
    small = np.flatnonzero((m > 0) & (m <= _BINOMIAL_MAX))
    if small.size:
        mm, flip = m[small].astype(np.float64), f[small] > 0.5
        g = np.where(flip, 1.0 - f[small], f[small])  # count the side with probability <= 0.5: stable pmf
        ratio = g / (1.0 - g)
        pmf = (1.0 - g) ** mm
        total = np.zeros(small.size)
        for k in range(_BINOMIAL_MAX + 1):
            above = np.where(flip, mm - k, k)
            total += np.where(k <= mm, pmf * pos[small] / (base[small] + above), 0.0)
            pmf = pmf * np.maximum(mm - k, 0) / (k + 1) * ratio
        out[small] = total
    return out


def _lower_bound(sorted_rows: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each (row, value): number of entries of ``sorted_rows[row]`` (ascending) below ``value``."""
    width = sorted_rows.shape[1]
    lo = np.zeros(rows.size, dtype=np.int64)
    hi = np.full(rows.size, width, dtype=np.int64)
    for _ in range(max(1, int(width).bit_length() + 1)):  # vectorised bisection, every query at once
        active = lo < hi
        if not active.any():
            break
        mid = (lo + hi) // 2
        below = active & (sorted_rows[rows, np.minimum(mid, width - 1)] < values)
        lo = np.where(below, mid + 1, lo)
        hi = np.where(active & ~below, mid, hi)
    return lo


def _ge_within(groups: np.ndarray, values: np.ndarray) -> np.ndarray:
    """For each item: number of items of its group with a value >= its value (ties included)."""
    if groups.size == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.lexsort((values, groups))
    g, v = groups[order], values[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    new_value = new_group | np.r_[True, v[1:] != v[:-1]]
    start = np.maximum.accumulate(np.where(new_value, np.arange(g.size), 0))
    end = np.r_[np.flatnonzero(new_group)[1:], g.size]  # one past each group's last item
    group_end = end[np.cumsum(new_group) - 1]
    out = np.empty(g.size, dtype=np.int64)
    out[order] = group_end - start
    return out


class MultiLabelAccumulator:
    """The metrics of :func:`~hf_mlcl.evaluation.compute_multilabel_metrics` over batches of rows.

    Args:
        num_labels: L (default: the width of the first batch).
        thresholds: decision thresholds to count while streaming, besides the grid 0.01..0.99 of
            :func:`~hf_mlcl.evaluation.threshold_grid`: floats and / or (L,) per-label arrays. Every metric
            at these is exact in any size; see :meth:`compute` for the others.
        ks: the P@k / R@k cut-offs. zero_division: the value of every 0/0.
        from_logits: predictions are logits (probabilities = sigmoid), else scores compared as given.
        score_dtype: the dtype probabilities are compared in (default float64 for logits, which is
            what ``ClassifierEvaluation`` compares; for scores, their own float dtype).
        exact_cells: rows x labels up to which the inputs are kept for exact column metrics.

    ``add_batch(predictions, references)`` takes (B, L) logits / scores (numpy or torch) and the (B, L)
    truth: dense or sparse multi-hot (numpy, torch, scipy) or a list of label-id lists. Batches are
    buffered to about ``CHUNK_CELLS`` cells and processed together.
    """

    def __init__(
        self,
        num_labels: int | None = None,
        thresholds: Any = (),
        ks: Sequence[int] = DEFAULT_KS,
        zero_division: float = 0.0,
        from_logits: bool = True,
        score_dtype: Any = None,
        exact_cells: int = EXACT_CELLS,
    ) -> None:
        self.num_labels = None if num_labels is None else int(num_labels)
        self.ks = check_ks(ks)
        self.zero_division = float(zero_division)
        self.from_logits = bool(from_logits)
        self.score_dtype = None if score_dtype is None else np.dtype(score_dtype)
        if self.score_dtype is None and self.from_logits:
            self.score_dtype = np.dtype(np.float64)
        self.exact_cells = int(exact_cells)
        self._requested = self._split_thresholds(thresholds)
        self._rows_done = 0
        self._ready = False
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_rows = 0
        self._store: list[np.ndarray] | None = []  # the raw inputs, while exact
        self._pos: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "col", "score", "n_ge")}
        self._row_ge: list[np.ndarray] = []  # per row: predictions at each counted threshold
        self._columns: Any = None  # (per-label AP, per-label AUC, micro AUC), once computed
        self._bounds: dict[str, tuple[float, float]] = {}

    # ------------------------------------------------------------------ set-up
    @staticmethod
    def _split_thresholds(thresholds: Any) -> list[np.ndarray]:
        if thresholds is None:
            return []
        if not isinstance(thresholds, (list, tuple)):  # one float or one per-label array
            thresholds = [thresholds]
        out = []
        for t in thresholds:
            a = to_numpy(t, "threshold").astype(np.float64)
            if a.ndim > 1 or not np.all(np.isfinite(a)):
                raise ValueError("thresholds must be finite floats or (num_labels,) arrays.")
            out.append(a)
        return out

    def _setup(self, width: int, dtype: np.dtype) -> None:
        if self.num_labels is None:
            self.num_labels = width
        if self.score_dtype is None:
            self.score_dtype = (
                np.dtype(np.float32) if dtype in (np.float16, np.float32) else np.dtype(np.float64)
            )
        dt, num_labels = self.score_dtype, self.num_labels
        scalars = [float(t) for t in self._requested if t.ndim == 0]
        self._vectors = []
        for t in self._requested:
            if t.ndim == 1:
                if t.shape != (num_labels,):
                    raise ValueError(f"a per-label threshold must have shape ({num_labels},), got {t.shape}.")
                self._vectors.append(
                    {"thr": t.astype(dt), "label": np.zeros(num_labels, np.int64), "row": []}
                )
        self._counted = np.unique(np.r_[threshold_grid(), scalars].astype(dt))
        grid_z = np.arange(-LOGIT_RANGE * BINS_PER_LOGIT, LOGIT_RANGE * BINS_PER_LOGIT + 1) / BINS_PER_LOGIT
        self.edges = np.unique(np.r_[sigmoid(grid_z).astype(dt), self._counted, np.zeros(1, dt)])
        self._edges_z = _logit(self.edges.astype(np.float64))
        n_edges = self.edges.size
        self._pad = np.r_[-np.inf, self.edges.astype(np.float64), np.inf].astype(dt)
        counted = np.isin(self.edges, self._counted)
        self._gbin = np.r_[0, np.cumsum(counted)]  # bin -> number of counted thresholds <= value
        lut_z = np.arange(-_LUT_RANGE * _LUT_PER_LOGIT, _LUT_RANGE * _LUT_PER_LOGIT) / _LUT_PER_LOGIT
        self._lut = np.searchsorted(self.edges, sigmoid(lut_z).astype(dt), side="right")
        self.hist = np.zeros((n_edges + 1, num_labels), dtype=np.int32)  # bin b: edges[b-1] <= s < edges[b]
        self._ready = True

    # ------------------------------------------------------------------ streaming
    def add_batch(self, predictions: Any, references: Any) -> None:
        """Add (B, L) logits / scores and their truth (see the class docstring)."""
        raw = to_numpy(predictions, "predictions")
        if raw.ndim != 2 or raw.shape[0] == 0:
            raise ValueError(
                f"predictions must be a non-empty 2-D (rows, labels) matrix, got shape {raw.shape}."
            )
        if not np.issubdtype(raw.dtype, np.floating):
            raw = raw.astype(np.float64)
        elif raw.dtype == np.float16:
            raw = raw.astype(np.float32)
        if not self._ready:
            self._setup(raw.shape[1], raw.dtype)
        if raw.shape[1] != self.num_labels:
            raise ValueError(f"predictions have {raw.shape[1]} labels, expected {self.num_labels}.")
        if not np.all(np.isfinite(raw)):
            raise ValueError("predictions contain NaN or infinite values; check the model outputs.")
        rows, cols = _references(references, raw.shape[0], self.num_labels)
        self._pending.append((np.array(raw, copy=True), rows + self._pending_rows, cols))
        self._pending_rows += raw.shape[0]
        if self._pending_rows >= _inputs.rows_per_chunk(self.num_labels):
            self._flush()

    def _scores(self, raw: np.ndarray) -> np.ndarray:
        if self.from_logits:
            return sigmoid(raw.astype(self.score_dtype, copy=False))
        return raw.astype(self.score_dtype, copy=False)

    def _bins(self, s: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """Histogram bin of every score, the number of edges <= s: a look-up on the logit (a cell of
        1/256 logit holds at most one edge but where two are closer), checked against the edges."""
        cell = (raw if self.from_logits else _logit(s)) + _LUT_RANGE
        cell *= _LUT_PER_LOGIT
        np.clip(cell, 0, self._lut.size - 1, out=cell)
        b = self._lut[cell.astype(np.intp)]
        del cell
        b += s >= self._pad[b + 1]
        bad = (s < self._pad[b]) | (s >= self._pad[b + 1])
        if bad.any():
            b[bad] = np.searchsorted(self.edges, s[bad], side="right")
        return b

    def _flush(self) -> None:
        if not self._pending:
            return
        raw = np.concatenate([p[0] for p in self._pending]) if len(self._pending) > 1 else self._pending[0][0]
        rows = np.concatenate([p[1] for p in self._pending])
        cols = np.concatenate([p[2] for p in self._pending])
        self._pending, self._pending_rows = [], 0
        self._columns = None  # new rows: the column metrics are computed again
        n, num_labels = raw.shape
        if self._rows_done + n > np.iinfo(np.int32).max:
            raise ValueError("more than 2**31 - 1 rows: split the evaluation (the histograms count in int32)")
        s = self._scores(raw)
        bins = self._bins(s, raw)
        idx = bins * num_labels
        idx += np.arange(num_labels)
        np.add.at(self.hist.reshape(-1), idx.ravel(), np.int32(1))  # no (bins x labels) temporary
        del idx
        width = self._counted.size + 1
        g = self._gbin[bins]
        g += (np.arange(n) * width)[:, None]
        per_row = np.bincount(g.ravel(), minlength=n * width).reshape(n, width)
        del g, bins
        self._row_ge.append(np.cumsum(per_row[:, ::-1], axis=1)[:, ::-1][:, 1:].astype(np.int32))
        for v in self._vectors:
            pred = s >= v["thr"]
            v["label"] += np.count_nonzero(pred, axis=0)
            v["row"].append(np.count_nonzero(pred, axis=1))
        values = s[rows, cols]
        n_lt = _lower_bound(np.sort(s, axis=1), rows, values)
        self._pos["row"].append(rows + self._rows_done)
        self._pos["col"].append(cols.astype(np.int32))
        self._pos["score"].append(values)
        self._pos["n_ge"].append((num_labels - n_lt).astype(np.int32))
        self._rows_done += n
        if self._store is not None:
            if self._rows_done * num_labels > self.exact_cells:
                self._store = None
                logger.info(
                    "%d rows x %d labels exceed exact_cells=%d: %s and per-label thresholds come from "
                    "score histograms from here on",
                    self._rows_done,
                    num_labels,
                    self.exact_cells,
                    ", ".join(HISTOGRAM_KEYS),
                )
            else:
                self._store.append(raw)

    def _finish(self) -> None:
        self._flush()
        if self._rows_done == 0:
            raise ValueError("no rows were added: call add_batch(predictions, references) first.")
        for k, parts in self._pos.items():
            if len(parts) > 1:
                self._pos[k] = [np.concatenate(parts)]
        if len(self._row_ge) > 1:
            self._row_ge = [np.concatenate(self._row_ge)]
        for v in self._vectors:
            if len(v["row"]) > 1:
                v["row"] = [np.concatenate(v["row"])]

    def _p(self, key: str) -> np.ndarray:
        return self._pos[key][0]

    @property
    def num_rows(self) -> int:
        """Rows added so far."""
        return self._rows_done + self._pending_rows

    @property
    def exact(self) -> bool:
        """True while every metric is exact (at most ``exact_cells`` rows x labels so far)."""
        self._flush()
        return self._store is not None

    # ------------------------------------------------------------------ counts at a threshold
    def _threshold(self, threshold: Any) -> np.ndarray:
        t = to_numpy(threshold, "threshold").astype(np.float64)
        if t.ndim and t.shape != (self.num_labels,):
            raise ValueError(
                f"threshold must be a float or an array of shape ({self.num_labels},), got {t.shape}."
            )
        if not np.all(np.isfinite(t)):
            raise ValueError("threshold contains NaN or infinite values.")
        return t.astype(self.score_dtype)

    def _label_blocks(self) -> Iterable[tuple[int, int]]:
        step = max(1, _inputs.CHUNK_CELLS // self.hist.shape[0])
        for c0 in range(0, self.num_labels, step):
            yield c0, min(self.num_labels, c0 + step)

    def _cells_above(self, first_bin: np.ndarray) -> np.ndarray:
        """(L,) cells of each label in bins >= ``first_bin`` (a scalar or one bin per label)."""
        if first_bin.ndim == 0:
            return self.hist[int(first_bin) :].sum(axis=0)
        out = np.empty(self.num_labels, dtype=np.int64)
        for c0, c1 in self._label_blocks():
            suffix = np.cumsum(self.hist[::-1, c0:c1], axis=0)[::-1]
            out[c0:c1] = np.r_[suffix, np.zeros((1, c1 - c0), np.int64)][first_bin[c0:c1], np.arange(c1 - c0)]
        return out

    def _label_pred(self, t: np.ndarray) -> np.ndarray:
        """(L,) predictions per label at ``t``: a counted vector, edges of the histograms, or the inputs."""
        for v in self._vectors:
            if t.ndim and np.array_equal(v["thr"], t):
                return v["label"]
        j = np.searchsorted(self.edges, t)
        if np.all((j < self.edges.size) & (self.edges[np.minimum(j, self.edges.size - 1)] == t)):
            return self._cells_above(j + 1)  # s >= edges[j]  <=>  bin >= j + 1
        if self._store is not None:
            return sum(np.count_nonzero(self._scores(r) >= t, axis=0) for r in self._store)
        where = f"{float(t):g}" if t.ndim == 0 else "(per label)"
        raise ValueError(
            f"threshold {where} was not counted and {self._rows_done} rows x {self.num_labels} labels exceed "
            f"exact_cells={self.exact_cells}: pass it in thresholds= when creating the accumulator"
        )

    def _row_pred(self, t: np.ndarray) -> np.ndarray | None:
        """(N,) predictions per row at ``t``; None when not available (see :meth:`compute`)."""
        if t.ndim == 0:
            k = np.flatnonzero(self._counted == t)
            if k.size:
                return self._row_ge[0][:, int(k[0])].astype(np.int64)
        else:
            for v in self._vectors:
                if np.array_equal(v["thr"], t):
                    return v["row"][0].astype(np.int64)
        if self._store is not None:
            return np.concatenate([np.count_nonzero(self._scores(r) >= t, axis=1) for r in self._store])
        return None

    # ------------------------------------------------------------------ metrics
    def compute(self, threshold: float | np.ndarray = 0.5) -> dict[str, float]:
        """All metrics of :func:`~hf_mlcl.evaluation.compute_multilabel_metrics` at ``threshold``.

        Exact at a counted threshold (the grid, ``thresholds=``) and, while :attr:`exact`, at any
        threshold. Above ``exact_cells``, a per-label threshold made of histogram edges (what
        :meth:`tune_per_label_thresholds` returns there) gives exact label counts but no per-row
        predictions: ``example_f1`` and ``subset_accuracy`` are then NaN (the test split, scored once the
        thresholds are known, has them); ``micro_auc``, ``macro_auc``, ``map_label`` are histogram
        estimates (:meth:`bounds`).
        """
        self._finish()
        zd, n, num_labels = self.zero_division, self._rows_done, self.num_labels
        t = self._threshold(threshold)
        rows, cols, pscore = self._p("row"), self._p("col"), self._p("score")
        hit = pscore >= (t if t.ndim == 0 else t[cols])
        tp_l = np.bincount(cols[hit], minlength=num_labels)
        tp_e = np.bincount(rows[hit], minlength=n)
        true_l = np.bincount(cols, minlength=num_labels)
        true_e = np.bincount(rows, minlength=n)
        pred_l = self._label_pred(t)
        pred_e = self._row_pred(t)
        tp, n_pred, n_true = int(tp_l.sum()), int(pred_l.sum()), int(true_l.sum())

        out: dict[str, float] = {}
        out["micro_precision"] = float(safe_div(tp, n_pred, zd))
        out["micro_recall"] = float(safe_div(tp, n_true, zd))
        out["micro_f1"] = float(safe_div(2 * tp, n_pred + n_true, zd))
        mp = float(safe_div(tp_l, pred_l, zd).mean())
        mr = float(safe_div(tp_l, true_l, zd).mean())
        out["macro_precision"] = mp
        out["macro_recall"] = mr
        out["macro_f1"] = float(safe_div(2 * tp_l, pred_l + true_l, zd).mean())
        out["macro_f1_harmonic"] = float(safe_div(2 * mp * mr, mp + mr, zd))

        ap_l, auc_l, mauc = self._column_metrics()
        out["micro_auc"] = mauc
        out["macro_auc"] = mean_or_nan(auc_l[~np.isnan(auc_l)])

        n_ge = self._p("n_ge")  # labels of the row scored >= the positive: its rank when there is no tie
        for k in self.ks:
            kk = min(k, num_labels)
            out[f"p@{k}"] = float(np.mean(np.bincount(rows[n_ge <= kk], minlength=n) / kk))
        for k in self.ks:
            kk = min(k, num_labels)
            out[f"r@{k}"] = float(np.mean(safe_div(np.bincount(rows[n_ge <= kk], minlength=n), true_e, zd)))

        out["map_label"] = mean_or_nan(ap_l[~np.isnan(ap_l)])
        pos_ge = _ge_within(rows, pscore)
        with np.errstate(divide="ignore", invalid="ignore"):
            ap_e = np.bincount(rows, weights=pos_ge / n_ge, minlength=n) / true_e
        out["map_example"] = float(np.mean(np.where(true_e > 0, ap_e, zd)))

        out["hamming_loss"] = float((n_pred - tp + n_true - tp) / (n * num_labels))
        if pred_e is None:
            out["example_f1"] = out["subset_accuracy"] = float("nan")
        else:
            fp_fn = (pred_e - tp_e) + (true_e - tp_e)
            out["example_f1"] = float(np.mean(safe_div(2 * tp_e, pred_e + true_e, zd)))
            out["subset_accuracy"] = float(np.mean(fp_fn == 0))
        hits_at_r = np.bincount(rows[n_ge <= true_e[rows]], minlength=n)
        out["r_precision"] = float(np.mean(safe_div(np.where(true_e > 0, hits_at_r, 0), true_e, zd)))
        return {k: out[k] for k in metric_keys(self.ks)}

    def per_label_scores(self, threshold: float | np.ndarray = 0.5) -> dict[str, np.ndarray]:
        """Per-label precision, recall, F1 and support at ``threshold`` (as
        :func:`~hf_mlcl.evaluation.per_label_scores`; exact where :meth:`compute`'s label counts are)."""
        self._finish()
        zd, t = self.zero_division, self._threshold(threshold)
        cols, pscore = self._p("col"), self._p("score")
        tp = np.bincount(cols[pscore >= (t if t.ndim == 0 else t[cols])], minlength=self.num_labels)
        n_true = np.bincount(cols, minlength=self.num_labels)
        n_pred = self._label_pred(t)
        return {
            "precision": safe_div(tp, n_pred, zd),
            "recall": safe_div(tp, n_true, zd),
            "f1": safe_div(2 * tp, n_pred + n_true, zd),
            "support": n_true,
        }

    def per_label_f1(self, threshold: float | np.ndarray = 0.5) -> np.ndarray:
        """(L,) per-label F1 at ``threshold`` (what the per-label F1 plot and tables read)."""
        return self.per_label_scores(threshold)["f1"]

    # ------------------------------------------------------------------ column metrics
    def _column_blocks(self) -> Iterable[tuple[int, int, np.ndarray, np.ndarray]]:
        """(c0, c1, truth (N, c) bool, scores (N, c)) label blocks of the kept inputs, in the label
        chunks of :func:`per_label_ap_auc` / :func:`tune_per_label_thresholds` (exact mode)."""
        n, num_labels = self._rows_done, self.num_labels
        step = _inputs.rows_per_chunk(n)
        cols, rows = self._p("col"), self._p("row")
        order = np.argsort(cols, kind="stable")
        starts = np.searchsorted(cols[order], np.arange(0, num_labels + step, step))
        for i, c0 in enumerate(range(0, num_labels, step)):
            c1 = min(num_labels, c0 + step)
            sel = order[starts[i] : starts[i + 1]]
            truth = np.zeros((n, c1 - c0), dtype=bool)
            truth[rows[sel], cols[sel] - c0] = True
            yield c0, c1, truth, self._scores(np.concatenate([r[:, c0:c1] for r in self._store]))

    def _column_metrics(self) -> tuple[np.ndarray, np.ndarray, float]:
        if self._columns is None:
            if self._store is not None:
                self._columns = self._exact_columns()
            else:
                *self._columns, self._bounds = self._histogram_columns()
        return self._columns

    def _exact_columns(self) -> tuple[np.ndarray, np.ndarray, float]:
        """Per-label AP / AUC (:func:`per_label_ap_auc`) and micro AUC (as :func:`micro_auc`) of the kept inputs."""
        ap = np.empty(self.num_labels)
        auc = np.empty(self.num_labels)
        for c0, c1, truth, scores in self._column_blocks():
            ap[c0:c1], auc[c0:c1] = per_label_ap_auc(truth, scores)
        pos = self._p("score")
        n_pos, n_neg = pos.size, self._rows_done * self.num_labels - pos.size
        if n_pos == 0 or n_neg == 0:
            return ap, auc, float("nan")
        twice = 0  # 2 * sum over positives of (#cells < s_p + 0.5 #cells == s_p)
        for r in self._store:
            srt = np.sort(self._scores(r), axis=None)
            twice += int(np.searchsorted(srt, pos, side="left").sum(dtype=np.int64))
            twice += int(np.searchsorted(srt, pos, side="right").sum(dtype=np.int64))
        return ap, auc, (twice - n_pos * n_pos) / 2.0 / (float(n_pos) * float(n_neg))

    def _share_above(self, b: np.ndarray, z: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Share of bin ``b``'s cells above logit ``z``, from a density linear across the bin whose end values
        are the means of its density and its neighbours' (``counts``: (3, n) cells of bins b - 1, b, b + 1);
        0.5 in the open-ended bins."""
        ez, last = self._edges_z, self.edges.size - 1  # bin k spans edges[k - 1] <= s < edges[k]

        def closed(k: np.ndarray) -> np.ndarray:
            inside = (k >= 1) & (k <= last)
            kk = np.clip(k, 1, last)
            return inside & (ez[kk - 1] > -2 * LOGIT_RANGE) & (ez[kk] < 2 * LOGIT_RANGE)

        def density(k: np.ndarray, count: np.ndarray) -> np.ndarray:
            kk = np.clip(k, 1, last)
            return count / np.where(closed(k), ez[kk] - ez[kk - 1], np.inf)

        here = density(b, counts[1])
        left = (here + np.where(closed(b - 1), density(b - 1, counts[0]), here)) / 2
        right = (here + np.where(closed(b + 1), density(b + 1, counts[2]), here)) / 2
        kk = np.clip(b, 1, last)
        x = np.clip((z - ez[kk - 1]) / (ez[kk] - ez[kk - 1]), 0.0, 1.0)  # position of z in the bin
        mass = (left + right) / 2
        with np.errstate(divide="ignore", invalid="ignore"):
            share = (left * (1 - x) + (right - left) * (1 - x * x) / 2) / mass
        share = np.where(mass > 0, share, 1 - x)
        return np.where(closed(b), np.clip(share, 0.0, 1.0), 0.5)

    def _histogram_columns(self) -> tuple[np.ndarray, np.ndarray, float, dict[str, tuple[float, float]]]:
        """Per-label AP / AUC and micro AUC estimated from the histograms, and their exact bounds.

        For a positive p of label l in bin b: negatives of l in bins above b are >= p, those below are
        < p, those of bin b are split by :meth:`_share_above`. AP = mean_p pos_ge / (pos_ge + neg_ge),
        AUC = sum_p neg_lt / (P Nn), as the exact engines; the bounds put all of bin b above / below p.
        """
        num_labels, n, last = self.num_labels, self._rows_done, self.hist.shape[0] - 1
        cols, pscore = self._p("col"), self._p("score")
        b = np.searchsorted(self.edges, pscore, side="right")
        z = _logit(pscore.astype(np.float64))
        near = np.stack([self.hist[np.clip(b + d, 0, last), cols] for d in (-1, 0, 1)]).astype(np.float64)
        frac = self._share_above(b, z, near)
        key = cols.astype(np.int64) * self.hist.shape[0] + b  # positives of the same label and bin
        ge = _ge_within(cols.astype(np.int64), b)  # positives of the label in bins >= b
        same = np.unique(key, return_inverse=True, return_counts=True)
        eq = same[2][same[1].ravel()]
        in_bin = self.hist[b, cols] - eq
        cells_above = np.empty(cols.size, dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        for c0, c1 in self._label_blocks():
            sel = order[np.searchsorted(cols[order], c0) : np.searchsorted(cols[order], c1)]
            suffix = np.cumsum(self.hist[::-1, c0:c1], axis=0)[::-1]
            cells_above[sel] = np.r_[suffix, np.zeros((1, c1 - c0), np.int64)][b[sel] + 1, cols[sel] - c0]
        neg_above = cells_above - (ge - eq)
        n_pos = np.bincount(cols, minlength=num_labels).astype(np.float64)
        n_neg = n - n_pos
        pos_ge = _ge_within(cols.astype(np.int64), pscore)
        below = n_neg[cols] - neg_above - in_bin

        def ap_of(neg_ge: np.ndarray) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                s = np.bincount(cols, weights=pos_ge / (pos_ge + neg_ge), minlength=num_labels)
                return np.where(n_pos > 0, s / n_pos, np.nan)

        def auc_of(neg_lt: np.ndarray) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                s = np.bincount(cols, weights=neg_lt, minlength=num_labels)
                return np.where((n_pos > 0) & (n_neg > 0), s / (n_pos * n_neg), np.nan)

        with np.errstate(divide="ignore", invalid="ignore"):
            expected = _expected_precision(pos_ge.astype(np.float64), pos_ge + neg_above, in_bin, frac)
            ap = np.where(
                n_pos > 0, np.bincount(cols, weights=expected, minlength=num_labels) / n_pos, np.nan
            )
        auc = auc_of(below + (1 - frac) * in_bin)
        ap_lo, ap_hi = ap_of(neg_above + in_bin.astype(np.float64)), ap_of(neg_above.astype(np.float64))
        auc_lo, auc_hi = auc_of(below.astype(np.float64)), auc_of(below + in_bin.astype(np.float64))
        total_neg = self.hist.sum(axis=1) - np.bincount(b, minlength=self.hist.shape[0])
        g_above = np.r_[np.cumsum(total_neg[::-1])[::-1], 0]  # micro AUC: every label's negatives pooled
        g_in = total_neg[b]
        g_below = total_neg.sum() - g_above[b + 1] - g_in
        g_frac = self._share_above(b, z, np.stack([total_neg[np.clip(b + d, 0, last)] for d in (-1, 0, 1)]))
        den = float(pscore.size) * float(total_neg.sum())
        micro = [float("nan")] * 3
        if den > 0:
            micro = [float((g_below + w * g_in).sum() / den) for w in (1 - g_frac, 0.0, 1.0)]

        def mean(x: np.ndarray) -> float:
            return mean_or_nan(x[~np.isnan(x)])

        bounds = {
            "micro_auc": (micro[1], micro[2]),
            "macro_auc": (mean(auc_lo), mean(auc_hi)),
            "map_label": (mean(ap_lo), mean(ap_hi)),
        }
        return ap, auc, micro[0], bounds

    def bounds(self) -> dict[str, tuple[float, float]]:
        """Exact (lower, upper) bounds of ``micro_auc``, ``macro_auc``, ``map_label`` (both the value while
        :attr:`exact`); above ``exact_cells`` the estimates of :meth:`compute` lie between them."""
        self._finish()
        if self._store is not None:
            ap, auc, mauc = self._column_metrics()
            values = {
                "micro_auc": mauc,
                "macro_auc": mean_or_nan(auc[~np.isnan(auc)]),
                "map_label": mean_or_nan(ap[~np.isnan(ap)]),
            }
            return {k: (v, v) for k, v in values.items()}
        self._column_metrics()
        return dict(self._bounds)

    # ------------------------------------------------------------------ thresholds
    def tune_global_threshold(self) -> float:
        """:func:`~hf_mlcl.evaluation.tune_global_threshold` (the grid value maximising micro-F1), exact in
        any size: the grid values are counted edges of the histograms."""
        self._finish()
        grid = threshold_grid()
        g = grid.astype(self.score_dtype)
        j = np.searchsorted(self.edges, g)
        pred = np.cumsum(self.hist.sum(axis=1)[::-1])[::-1][j + 1]
        pscore = self._p("score")
        hist = np.bincount(np.searchsorted(g, pscore, side="right"), minlength=g.size + 1)
        tp = np.cumsum(hist[::-1])[::-1][1:]
        f1 = safe_div(2 * tp, pred + pscore.size, 0.0)
        return float(grid[int(np.argmax(f1))])

    def tune_per_label_thresholds(self, default: float | None = None) -> np.ndarray:
        """(L,) thresholds maximising each label's F1; labels without a positive get ``default`` (None: the
        global threshold). While :attr:`exact`: :func:`~hf_mlcl.evaluation.tune_per_label_thresholds`
        (cuts between distinct scores). Above ``exact_cells``: the histogram edge whose cut has the best
        F1 (the counts at every edge are exact; ties go to fewer predictions)."""
        self._finish()
        num_labels = self.num_labels
        out = np.empty(num_labels, dtype=np.float64)
        cols = self._p("col")
        n_pos = np.bincount(cols, minlength=num_labels)
        if self._store is not None:
            for c0, c1, truth, scores in self._column_blocks():
                if float32_exact(scores):
                    out[c0:c1] = _best_cuts_keys(scores.astype(np.float32), truth)
                else:
                    out[c0:c1] = _best_cuts_argsort(
                        np.ascontiguousarray(scores.T), np.ascontiguousarray(truth.T)
                    )
        else:
            b = np.searchsorted(self.edges, self._p("score"), side="right")
            n_bins = self.hist.shape[0]
            for c0, c1 in self._label_blocks():
                sel = (cols >= c0) & (cols < c1)
                pos = np.bincount(b[sel] * (c1 - c0) + cols[sel] - c0, minlength=n_bins * (c1 - c0))
                pred = np.cumsum(self.hist[::-1, c0:c1], axis=0)[::-1][1:]  # pred[j]: cells >= edges[j]
                tp = np.cumsum(pos.reshape(n_bins, c1 - c0)[::-1], axis=0)[::-1][1:]
                f1 = safe_div(2 * tp, pred + n_pos[c0:c1], 0.0)
                best = f1.shape[0] - 1 - np.argmax(f1[::-1], axis=0)  # ties: the higher edge
                out[c0:c1] = self.edges[best]
        if (n_pos == 0).any():
            out[n_pos == 0] = self.tune_global_threshold() if default is None else float(default)
        return out

    def tune_threshold(self, strategy: str = "global") -> float | np.ndarray:
        """``strategy`` "global" (:meth:`tune_global_threshold`) or "per_label" (:meth:`tune_per_label_thresholds`)."""
        if strategy == "global":
            return self.tune_global_threshold()
        if strategy == "per_label":
            return self.tune_per_label_thresholds()
        raise ValueError(f"strategy must be 'global' or 'per_label', got {strategy!r}.")

    # ------------------------------------------------------------------ dense view
    def dense(self) -> tuple[np.ndarray, np.ndarray]:
        """(scores (N, L), truth (N, L) bool) while :attr:`exact`; ValueError above ``exact_cells``."""
        self._finish()
        if self._store is None:
            raise ValueError(
                f"{self._rows_done} rows x {self.num_labels} labels exceed exact_cells={self.exact_cells}: "
                "the scores were not kept; use compute() / per_label_f1()"
            )
        truth = np.zeros((self._rows_done, self.num_labels), dtype=bool)
        truth[self._p("row"), self._p("col")] = True
        return np.concatenate([self._scores(r) for r in self._store]), truth

    @classmethod
    def from_arrays(cls, y_true: Any, y_score: Any, **kwargs: Any) -> MultiLabelAccumulator:
        """An accumulator fed with whole (N, L) arrays in row chunks (``from_logits=False`` by default)."""
        kwargs.setdefault("from_logits", False)
        acc = cls(**kwargs)
        y_score = to_numpy(y_score, "y_score")
        if y_score.ndim != 2:
            raise ValueError(f"y_score must be 2-D (num_examples, num_labels), got shape {y_score.shape}.")
        y_true = y_true.tocsr() if hasattr(y_true, "tocsr") else to_numpy(y_true, "y_true")
        step = _inputs.rows_per_chunk(y_score.shape[1])
        for r0 in range(0, y_score.shape[0], step):
            acc.add_batch(y_score[r0 : r0 + step], y_true[r0 : r0 + step])
        return acc
