"""Multi-label metrics of a split streamed in row chunks: :class:`MultiLabelAccumulator` (``add_batch`` /
``compute``, as HF ``evaluate`` metrics and ``Trainer(batch_eval_metrics=True)``).

Exact at any size, from per-chunk counts and sparse truth: micro / macro P, R, F1, hamming loss,
example F1, subset accuracy (at the thresholds counted while streaming), P@k, R@k, R-precision,
``map_example`` and the global-grid threshold. Per-label AUC / AP, micro AUC and per-label thresholds need
whole columns: up to ``exact_cells`` rows x labels the inputs are kept (4 bytes a cell for float32
logits) and these are exact too (:mod:`hf_mlcl.evaluation.exact_columns`, within 1e-12 of
:func:`compute_multilabel_metrics`); above it they come from per-label histograms of the scores, with
exact bounds (:mod:`hf_mlcl.evaluation.score_histograms`). Memory: the histograms (labels x ~1,100 x 4
bytes), per row one int32 for each counted threshold (the global grid's, about 100: 0.4 KB a row) and a few
per positive, one chunk of ``CHUNK_CELLS`` cells. Design:
docs/usage.md, "Evaluation at large label counts".
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_mlcl.evaluation import inputs as _inputs
from hf_mlcl.evaluation.exact_columns import best_cuts, exact_columns
from hf_mlcl.evaluation.inputs import check_ks, mean_or_nan, safe_div, sigmoid, to_numpy
from hf_mlcl.evaluation.metrics import DEFAULT_KS, metric_keys
from hf_mlcl.evaluation.positives import expected_in_top, ge_within, reference_positives, tied_counts
from hf_mlcl.evaluation.score_histograms import HISTOGRAM_KEYS, ScoreHistograms
from hf_mlcl.evaluation.thresholds import below_floor, check_min_threshold, fill_untuned, threshold_grid

logger = logging.getLogger(__name__)

__all__ = ["EXACT_CELLS", "HISTOGRAM_KEYS", "MultiLabelAccumulator"]

EXACT_CELLS = 1 << 25  # rows x labels kept for exact column metrics (128 MiB of float32 logits)


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
        self._pos: dict[str, list[np.ndarray]] = {k: [] for k in ("row", "col", "score", "above", "tied")}
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
        self._hists = ScoreHistograms(num_labels, dt, self._counted, self.from_logits)
        self._ready = True

    @property
    def edges(self) -> np.ndarray:
        """The histograms' bin edges (sorted scores; the counted thresholds among them)."""
        return self._hists.edges

    @property
    def hist(self) -> np.ndarray:
        """(bins, L) int32 counts of every label's scores: bin b holds ``edges[b-1] <= s < edges[b]``."""
        return self._hists.hist

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
        rows, cols = reference_positives(references, raw.shape[0], self.num_labels)
        self._pending.append((np.array(raw, copy=True), rows + self._pending_rows, cols))
        self._pending_rows += raw.shape[0]
        if self._pending_rows >= _inputs.rows_per_chunk(self.num_labels):
            self._flush()

    def _scores(self, raw: np.ndarray) -> np.ndarray:
        if self.from_logits:
            return sigmoid(raw.astype(self.score_dtype, copy=False))
        return raw.astype(self.score_dtype, copy=False)

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
        bins = self._hists.bins(s, raw)
        self._hists.add(bins)
        width = self._counted.size + 1
        g = self._hists.counted_below[bins]
        g += (np.arange(n) * width)[:, None]
        per_row = np.bincount(g.ravel(), minlength=n * width).reshape(n, width)
        del g, bins
        self._row_ge.append(np.cumsum(per_row[:, ::-1], axis=1)[:, ::-1][:, 1:].astype(np.int32))
        for v in self._vectors:
            pred = s >= v["thr"]
            v["label"] += np.count_nonzero(pred, axis=0)
            v["row"].append(np.count_nonzero(pred, axis=1))
        values = s[rows, cols]
        above, tied = tied_counts(np.sort(s, axis=1), rows, values)
        self._pos["row"].append(rows + self._rows_done)
        self._pos["col"].append(cols.astype(np.int32))
        self._pos["score"].append(values)
        self._pos["above"].append(above.astype(np.int32))
        self._pos["tied"].append(tied.astype(np.int32))
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

    def _label_pred(self, t: np.ndarray) -> np.ndarray:
        """(L,) predictions per label at ``t``: a counted vector, edges of the histograms, or the inputs."""
        for v in self._vectors:
            if t.ndim and np.array_equal(v["thr"], t):
                return v["label"]
        j = np.searchsorted(self.edges, t)
        if np.all((j < self.edges.size) & (self.edges[np.minimum(j, self.edges.size - 1)] == t)):
            return self._hists.cells_above(j + 1)  # s >= edges[j]  <=>  bin >= j + 1
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
        out["macro_f1_harmonic"] = 0.0 if mp + mr == 0 else float(safe_div(2 * mp * mr, mp + mr, zd))

        ap_l, auc_l, mauc = self._column_metrics()
        out["micro_auc"] = mauc
        out["macro_auc"] = mean_or_nan(auc_l[~np.isnan(auc_l)])

        above, tied = self._p("above"), self._p("tied")  # labels of the row scored above / as the positive
        n_ge = above + tied  # its rank when there is no tie

        def hits(depth: Any) -> np.ndarray:  # per row: its positives among its `depth` top-scored labels
            return np.bincount(rows, weights=expected_in_top(above, tied, depth), minlength=n)

        for k in self.ks:
            kk = min(k, num_labels)
            out[f"p@{k}"] = float(np.mean(hits(kk) / kk))
        for k in self.ks:
            kk = min(k, num_labels)
            out[f"r@{k}"] = float(np.mean(safe_div(hits(kk), true_e, zd)))

        out["map_label"] = mean_or_nan(ap_l[~np.isnan(ap_l)])
        pos_ge = ge_within(rows, pscore)
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
        hits_at_r = hits(true_e[rows])
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
    def _column_metrics(self) -> tuple[np.ndarray, np.ndarray, float]:
        if self._columns is None:
            rows, cols, pscore = self._p("row"), self._p("col"), self._p("score")
            if self._store is not None:
                self._columns = exact_columns(self._store, self._scores, self.num_labels, rows, cols, pscore)
            else:
                *self._columns, self._bounds = self._hists.columns(cols, pscore, self._rows_done)
        return self._columns

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
        pred = self._hists.cells_at_grid(g)
        pscore = self._p("score")
        hist = np.bincount(np.searchsorted(g, pscore, side="right"), minlength=g.size + 1)
        tp = np.cumsum(hist[::-1])[::-1][1:]
        f1 = safe_div(2 * tp, pred + pscore.size, 0.0)
        return float(grid[int(np.argmax(f1))])

    def tune_per_label_thresholds(
        self, default: float | None = None, min_threshold: float = 0.01
    ) -> np.ndarray:
        """(L,) thresholds maximising each label's F1; labels without a positive, or whose best cut lies below
        ``min_threshold`` and predicts them for more than half of the rows, get ``default`` (None: the global
        threshold). While :attr:`exact`: :func:`~hf_mlcl.evaluation.tune_per_label_thresholds`
        (cuts between distinct scores). Above ``exact_cells``: the histogram edge whose cut has the best
        F1 (the counts at every edge are exact; ties go to fewer predictions)."""
        check_min_threshold(min_threshold)
        self._finish()
        num_labels = self.num_labels
        cols = self._p("col")
        n_pos = np.bincount(cols, minlength=num_labels)
        if self._store is not None:
            out, predicted = best_cuts(self._store, self._scores, num_labels, self._p("row"), cols)
        else:
            out, predicted = self._hists.best_edges(cols, self._p("score"), n_pos)
        untuned = (n_pos == 0) | below_floor(out, predicted, self._rows_done, min_threshold)
        return fill_untuned(out, untuned, self.tune_global_threshold, default)

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
