"""Per-label score histograms of a streamed split (:class:`ScoreHistograms`) and the whole-column metrics they
estimate once the inputs are no longer kept: per-label AUC / AP and micro AUC with their exact bounds, and
per-label thresholds at the best bin edge.

Bins are 1/32 logit wide on [-16, 16], plus the counted thresholds as edges. AUC and AP split a positive's
bin by a density linear across it (AP as the binomial expectation); the bounds put the whole bin above /
below the positive. Used by :class:`~hf_mlcl.evaluation.streaming.MultiLabelAccumulator` above
``exact_cells``; design: docs/usage.md, "Evaluation at large label counts".
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hf_mlcl.evaluation import inputs as _inputs
from hf_mlcl.evaluation.inputs import mean_or_nan, safe_div, sigmoid
from hf_mlcl.evaluation.positives import ge_within

__all__ = ["BINS_PER_LOGIT", "HISTOGRAM_KEYS", "LOGIT_RANGE", "ScoreHistograms", "logit"]

LOGIT_RANGE = 16.0  # histogram bins: uniform in logit on [-LOGIT_RANGE, LOGIT_RANGE] ...
BINS_PER_LOGIT = 32  # ... BINS_PER_LOGIT per logit unit, plus the counted thresholds as edges
HISTOGRAM_KEYS = ("micro_auc", "macro_auc", "map_label")  # approximate above exact_cells
_LUT_PER_LOGIT = 256  # cells of the bin look-up table, per logit unit
_LUT_RANGE = 24.0
_BINOMIAL_MAX = 64  # in-bin negatives up to which the expected precision is summed exactly


def logit(p: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)), with 0 for NaN and +-1e4 for +-inf."""
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(p) - np.log1p(-p)
    return np.nan_to_num(z, nan=0.0, posinf=1e4, neginf=-1e4)


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


class ScoreHistograms:
    """(bins, L) int32 counts of every label's scores: bin b holds ``edges[b-1] <= s < edges[b]``.

    Args:
        num_labels: L. dtype: the dtype scores are compared in.
        counted: the thresholds counted while streaming (sorted, in ``dtype``): they are edges too.
        from_logits: the raw predictions are logits (the bin look-up then reads them directly).
    """

    def __init__(self, num_labels: int, dtype: np.dtype, counted: np.ndarray, from_logits: bool) -> None:
        self.from_logits = from_logits
        grid_z = np.arange(-LOGIT_RANGE * BINS_PER_LOGIT, LOGIT_RANGE * BINS_PER_LOGIT + 1) / BINS_PER_LOGIT
        self.edges = np.unique(np.r_[sigmoid(grid_z).astype(dtype), counted, np.zeros(1, dtype)])
        self.edges_z = logit(self.edges.astype(np.float64))
        self._pad = np.r_[-np.inf, self.edges.astype(np.float64), np.inf].astype(dtype)
        self.counted_below = np.r_[
            0, np.cumsum(np.isin(self.edges, counted))
        ]  # bin -> counted thresholds <= s
        lut_z = np.arange(-_LUT_RANGE * _LUT_PER_LOGIT, _LUT_RANGE * _LUT_PER_LOGIT) / _LUT_PER_LOGIT
        self._lut = np.searchsorted(self.edges, sigmoid(lut_z).astype(dtype), side="right")
        self.hist = np.zeros((self.edges.size + 1, num_labels), dtype=np.int32)

    @property
    def num_labels(self) -> int:
        return self.hist.shape[1]

    def bins(self, s: np.ndarray, raw: np.ndarray) -> np.ndarray:
        """Histogram bin of every score, the number of edges <= s: a look-up on the logit (a cell of
        1/256 logit holds at most one edge but where two are closer), checked against the edges."""
        cell = (raw if self.from_logits else logit(s)) + _LUT_RANGE
        cell *= _LUT_PER_LOGIT
        np.clip(cell, 0, self._lut.size - 1, out=cell)
        b = self._lut[cell.astype(np.intp)]
        del cell
        b += s >= self._pad[b + 1]
        bad = (s < self._pad[b]) | (s >= self._pad[b + 1])
        if bad.any():
            b[bad] = np.searchsorted(self.edges, s[bad], side="right")
        return b

    def add(self, bins: np.ndarray) -> None:
        """Count (N, L) bins of N rows."""
        idx = bins * self.num_labels
        idx += np.arange(self.num_labels)
        np.add.at(self.hist.reshape(-1), idx.ravel(), np.int32(1))  # no (bins x labels) temporary

    def label_blocks(self) -> Iterable[tuple[int, int]]:
        """(c0, c1) label blocks of about ``CHUNK_CELLS`` histogram cells."""
        step = max(1, _inputs.CHUNK_CELLS // self.hist.shape[0])
        for c0 in range(0, self.num_labels, step):
            yield c0, min(self.num_labels, c0 + step)

    def cells_above(self, first_bin: np.ndarray) -> np.ndarray:
        """(L,) cells of each label in bins >= ``first_bin`` (a scalar or one bin per label)."""
        if first_bin.ndim == 0:
            return self.hist[int(first_bin) :].sum(axis=0)
        out = np.empty(self.num_labels, dtype=np.int64)
        for c0, c1 in self.label_blocks():
            suffix = np.cumsum(self.hist[::-1, c0:c1], axis=0)[::-1]
            out[c0:c1] = np.r_[suffix, np.zeros((1, c1 - c0), np.int64)][first_bin[c0:c1], np.arange(c1 - c0)]
        return out

    def _share_above(self, b: np.ndarray, z: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Share of bin ``b``'s cells above logit ``z``, from a density linear across the bin whose end values
        are the means of its density and its neighbours' (``counts``: (3, n) cells of bins b - 1, b, b + 1);
        0.5 in the open-ended bins."""
        ez, last = self.edges_z, self.edges.size - 1  # bin k spans edges[k - 1] <= s < edges[k]

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

    def columns(
        self, cols: np.ndarray, pscore: np.ndarray, n: int
    ) -> tuple[np.ndarray, np.ndarray, float, dict[str, tuple[float, float]]]:
        """Per-label AP / AUC and micro AUC estimated from the histograms of ``n`` rows whose positives are
        (label ``cols``, score ``pscore``), and their exact bounds.

        For a positive p of label l in bin b: negatives of l in bins above b are >= p, those below are
        < p, those of bin b are split by :meth:`_share_above`. AP = mean_p pos_ge / (pos_ge + neg_ge),
        AUC = sum_p neg_lt / (P Nn), as the exact engines; the bounds put all of bin b above / below p.
        """
        num_labels, last = self.num_labels, self.hist.shape[0] - 1
        b = np.searchsorted(self.edges, pscore, side="right")
        z = logit(pscore.astype(np.float64))
        near = np.stack([self.hist[np.clip(b + d, 0, last), cols] for d in (-1, 0, 1)]).astype(np.float64)
        frac = self._share_above(b, z, near)
        key = cols.astype(np.int64) * self.hist.shape[0] + b  # positives of the same label and bin
        ge = ge_within(cols.astype(np.int64), b)  # positives of the label in bins >= b
        same = np.unique(key, return_inverse=True, return_counts=True)
        eq = same[2][same[1].ravel()]
        in_bin = self.hist[b, cols] - eq
        cells_above = np.empty(cols.size, dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        for c0, c1 in self.label_blocks():
            sel = order[np.searchsorted(cols[order], c0) : np.searchsorted(cols[order], c1)]
            suffix = np.cumsum(self.hist[::-1, c0:c1], axis=0)[::-1]
            cells_above[sel] = np.r_[suffix, np.zeros((1, c1 - c0), np.int64)][b[sel] + 1, cols[sel] - c0]
        neg_above = cells_above - (ge - eq)
        n_pos = np.bincount(cols, minlength=num_labels).astype(np.float64)
        n_neg = n - n_pos
        pos_ge = ge_within(cols.astype(np.int64), pscore)
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

    def cells_at_grid(self, grid: np.ndarray) -> np.ndarray:
        """Cells (all labels) scored >= each value of ``grid``, values that are edges (the counted grid)."""
        j = np.searchsorted(self.edges, grid)
        return np.cumsum(self.hist.sum(axis=1)[::-1])[::-1][j + 1]

    def best_edges(
        self, cols: np.ndarray, pscore: np.ndarray, n_pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(L,) the edge whose cut has each label's best F1 (the counts at every edge are exact; ties go to
        fewer predictions), for positives (label ``cols``, score ``pscore``) and ``n_pos`` per label, and (L,)
        the rows each cut predicts."""
        out = np.empty(self.num_labels, dtype=np.float64)
        predicted = np.empty(self.num_labels, dtype=np.int64)
        b = np.searchsorted(self.edges, pscore, side="right")
        n_bins = self.hist.shape[0]
        for c0, c1 in self.label_blocks():
            sel = (cols >= c0) & (cols < c1)
            pos = np.bincount(b[sel] * (c1 - c0) + cols[sel] - c0, minlength=n_bins * (c1 - c0))
            pred = np.cumsum(self.hist[::-1, c0:c1], axis=0)[::-1][1:]  # pred[j]: cells >= edges[j]
            tp = np.cumsum(pos.reshape(n_bins, c1 - c0)[::-1], axis=0)[::-1][1:]
            f1 = safe_div(2 * tp, pred + n_pos[c0:c1], 0.0)
            best = f1.shape[0] - 1 - np.argmax(f1[::-1], axis=0)  # ties: the higher edge
            out[c0:c1] = self.edges[best]
            predicted[c0:c1] = pred[best, np.arange(c1 - c0)]
        return out, predicted
