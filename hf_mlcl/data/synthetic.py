"""Seeded synthetic multi-label text corpus (tests, demos, memory / speed benchmarks).

Generative story (all draws vectorised with numpy, per shard of documents):

1. ``L`` labels with Zipf-like prior ``p_l ∝ 1 / rank^zipf_exponent`` (long tail as in MIMIC/AAPD),
   partitioned into ``num_groups`` topics (label ``l`` belongs to group ``l % num_groups``).
2. A document has ``k ~ 1 + Poisson(mean_labels - 1)`` labels (clipped to ``max_labels``): the first
   from ``p``; each further one, with probability ``cooccurrence``, from the first label's group
   (prior restricted to the group), else from ``p`` — so labels co-occur inside topics.
3. Its length is uniform in ``[min_words, max_words]``; each word is, with probability ``signal``, a
   word of one of its labels (each label owns ``words_per_label`` words), otherwise a noise word
   drawn from a Zipf-distributed ``noise_vocab_size``-word background vocabulary.

Words are pronounceable syllable strings, so a subword tokenizer learns realistic pieces.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from datasets import DatasetDict

from hf_mlcl.data.registry import make_features, normalize_splits, register_dataset

_SYLLABLES = np.array([c + v for c in "bdfgklmnprstvz" for v in "aeiou"], dtype=object)  # 70 syllables
_SPLIT_INDEX = {"train": 0, "validation": 1, "test": 2}


def _words_from_ids(ids: np.ndarray, min_syllables: int) -> np.ndarray:
    """Distinct syllable strings for integer ids (base-70 digits, at least ``min_syllables``)."""
    base = len(_SYLLABLES)
    n_syl = max(min_syllables, int(np.ceil(np.log(max(int(ids.max()) + 1, 2)) / np.log(base))))
    out = np.full(len(ids), "", dtype=object)
    rest = ids.astype(np.int64)
    for _ in range(n_syl):
        out = _SYLLABLES[rest % base] + out
        rest //= base
    return out


class SyntheticCorpusGenerator:
    """Holds the label prior, groups and vocabulary; :meth:`generate` draws a shard of documents."""

    def __init__(
        self,
        num_labels: int = 20,
        min_words: int = 20,
        max_words: int = 80,
        zipf_exponent: float = 1.0,
        mean_labels: float = 2.0,
        max_labels: int | None = None,
        num_groups: int | None = None,
        cooccurrence: float = 0.7,
        words_per_label: int = 20,
        noise_vocab_size: int = 2000,
        signal: float = 0.5,
        seed: int = 0,
    ) -> None:
        if num_labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        if not 1 <= min_words <= max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
        if mean_labels < 1:
            raise ValueError(f"mean_labels must be >= 1, got {mean_labels}")
        if not 0.0 <= signal <= 1.0 or not 0.0 <= cooccurrence <= 1.0:
            raise ValueError("signal and cooccurrence are probabilities in [0, 1]")
        if words_per_label < 1 or noise_vocab_size < 1:
            raise ValueError("words_per_label and noise_vocab_size must be >= 1")
        self.num_labels, self.min_words, self.max_words = num_labels, min_words, max_words
        self.mean_labels = mean_labels
        self.max_labels = max_labels or max(1, min(num_labels, int(np.ceil(4 * mean_labels))))
        self.num_groups = num_groups or max(1, num_labels // 5)
        self.cooccurrence, self.signal, self.seed = cooccurrence, signal, seed
        self.words_per_label, self.noise_vocab_size = words_per_label, noise_vocab_size

        rng = np.random.default_rng([seed, 99])
        # Zipf prior over a random permutation, so frequent labels are spread over the groups.
        rank = np.empty(num_labels, np.int64)
        rank[rng.permutation(num_labels)] = np.arange(1, num_labels + 1)
        self.label_prior = (1.0 / rank**zipf_exponent) / np.sum(1.0 / rank**zipf_exponent)
        self.group = np.arange(num_labels) % self.num_groups
        # Labels ordered by group; cumulative prior gives O(log L) restricted sampling per draw.
        self._by_group = np.argsort(self.group, kind="stable")
        self._cum_by_group = np.cumsum(self.label_prior[self._by_group])
        starts = np.searchsorted(self.group[self._by_group], np.arange(self.num_groups))
        self._g_lo = np.where(starts > 0, self._cum_by_group[np.maximum(starts - 1, 0)], 0.0)
        ends = np.append(starts[1:], num_labels)
        self._g_hi = self._cum_by_group[ends - 1]
        self._cum_prior = np.cumsum(self.label_prior)
        noise_rank = np.arange(1, noise_vocab_size + 1)
        self._cum_noise = np.cumsum(1.0 / noise_rank) / np.sum(1.0 / noise_rank)
        # Inverse-CDF lookup table (2^20 cells): O(1) noise-word draws instead of a binary search per word.
        self._noise_table = np.minimum(
            np.searchsorted(self._cum_noise, (np.arange(2**20) + 0.5) / 2**20, side="right"),
            noise_vocab_size - 1,
        ).astype(np.int32)
        vocab_size = noise_vocab_size + num_labels * words_per_label
        # Shuffle ids -> strings so word strings do not reveal labels by prefix.
        self.vocab = _words_from_ids(rng.permutation(vocab_size), 2)
        self.label_names = [f"label_{i:0{len(str(num_labels - 1))}d}" for i in range(num_labels)]

    def _sample_cum(self, cum: np.ndarray, u: np.ndarray) -> np.ndarray:
        return np.minimum(np.searchsorted(cum, u * cum[-1], side="right"), len(cum) - 1)

    def generate_ids(self, n: int, rng: np.random.Generator):
        """Draw ``n`` documents: (label_flat, label_ptr, word_ids, word_ptr) CSR-style arrays."""
        L = self.num_labels
        k = np.clip(1 + rng.poisson(self.mean_labels - 1, size=n), 1, self.max_labels)
        m = 2 * self.max_labels  # candidates per document (deduplicated below)
        cand = np.empty((n, m), np.int64)
        cand[:, 0] = self._sample_cum(self._cum_prior, rng.random(n))
        g = self.group[cand[:, 0]]
        u = rng.random((n, m - 1))
        lo, hi = self._g_lo[g][:, None], self._g_hi[g][:, None]
        in_group = self._by_group[
            np.minimum(np.searchsorted(self._cum_by_group, lo + u * (hi - lo), side="right"), L - 1)
        ]
        in_group = np.where(self.group[in_group] == g[:, None], in_group, cand[:, :1])  # float edge guard
        glob = self._sample_cum(self._cum_prior, rng.random((n, m - 1)))
        cand[:, 1:] = np.where(rng.random((n, m - 1)) < self.cooccurrence, in_group, glob)
        # Keep the first k distinct candidates of each row (order-preserving dedupe on doc*L+label keys).
        keys = (np.arange(n)[:, None] * L + cand).ravel()
        first = np.zeros(keys.size, bool)
        first[np.unique(keys, return_index=True)[1]] = True
        first = first.reshape(n, m)
        keep = first & (np.cumsum(first, axis=1) <= k[:, None])
        label_flat = cand[keep]
        nlab = keep.sum(1)
        label_ptr = np.concatenate([[0], np.cumsum(nlab)])

        lengths = rng.integers(self.min_words, self.max_words + 1, size=n)
        word_ptr = np.concatenate([[0], np.cumsum(lengths)])
        total = int(word_ptr[-1])
        doc = np.repeat(np.arange(n), lengths)
        slot = (rng.random(total) * nlab[doc]).astype(np.int64)
        lab = label_flat[label_ptr[:-1][doc] + slot]
        label_word = (
            self.noise_vocab_size + lab * self.words_per_label + rng.integers(0, self.words_per_label, total)
        )
        noise_word = self._noise_table[(rng.random(total) * 2**20).astype(np.int64)]
        words = np.where(rng.random(total) < self.signal, label_word, noise_word)
        return label_flat, label_ptr, words, word_ptr

    def _vocab_bytes(self):
        if not hasattr(self, "_vb"):
            encoded = [w.encode("ascii") + b" " for w in self.vocab.tolist()]
            lens = np.fromiter((len(b) for b in encoded), dtype=np.int64, count=len(encoded))
            self._vb = (
                np.frombuffer(b"".join(encoded), dtype=np.uint8),
                np.concatenate([[0], np.cumsum(lens)]),
            )
        return self._vb

    def generate_arrow(self, n: int, rng: np.random.Generator):
        """``n`` documents as a ``pyarrow.Table`` (``text`` string, ``labels`` list<int64>, sorted ids).

        Texts are assembled without Python string joins: the bytes of every word (plus a space) are
        gathered from one vocabulary buffer with a repeat/arange index, and the Arrow string array is
        built straight from the offsets and data buffers."""
        import pyarrow as pa

        label_flat, label_ptr, words, word_ptr = self.generate_ids(n, rng)
        data, starts = self._vocab_bytes()
        wlen = (starts[1:] - starts[:-1])[words]  # bytes per word incl. trailing space
        out_start = np.concatenate([[0], np.cumsum(wlen)])
        total = int(out_start[-1])
        src = np.repeat(starts[:-1][words] - out_start[:-1], wlen) + np.arange(total)
        buf = data[src]
        doc_end = out_start[word_ptr[1:]] - 1  # position of each document's trailing space
        doc_start = out_start[word_ptr[:-1]]
        # Arrow strings must be contiguous: compact out the trailing spaces between documents.
        keep = np.ones(total, bool)
        keep[doc_end] = False
        buf = buf[keep]
        lengths = doc_end - doc_start
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        text = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(buf.tobytes())).cast(
            pa.string()
        )
        doc_of_label = np.repeat(np.arange(n), np.diff(label_ptr))
        order = np.lexsort((label_flat, doc_of_label))
        labels = pa.ListArray.from_arrays(pa.array(label_ptr.astype(np.int32)), pa.array(label_flat[order]))
        return pa.table({"text": text, "labels": labels})

    def generate(self, n: int, rng: np.random.Generator) -> tuple[list[str], list[list[int]]]:
        """``n`` documents as (texts, sorted label id lists); same draws as :meth:`generate_arrow`."""
        table = self.generate_arrow(n, rng)
        return table.column("text").to_pylist(), table.column("labels").to_pylist()

    def iter_tables(self, split: str, num_docs: int, shard_size: int = 1000):
        """Deterministic ``pyarrow.Table`` shards (``default_rng([seed, split, j])`` for shard j)."""
        for j, start in enumerate(range(0, num_docs, shard_size)):
            rng = np.random.default_rng([self.seed, _SPLIT_INDEX[split], j])
            yield self.generate_arrow(min(shard_size, num_docs - start), rng)

    def iter_shards(
        self, split: str, num_docs: int, shard_size: int = 1000
    ) -> Iterator[tuple[list[str], list[list[int]]]]:
        """Deterministic shards for ``split``: shard ``j`` uses ``default_rng([seed, split, j])``."""
        for table in self.iter_tables(split, num_docs, shard_size):
            yield table.column("text").to_pylist(), table.column("labels").to_pylist()

    def iter_examples(self, split: str, num_docs: int, shard_size: int = 1000) -> Iterator[dict]:
        """Examples ``{"text", "labels"}`` one by one (for ``Dataset.from_generator``)."""
        for texts, labels in self.iter_shards(split, num_docs, shard_size):
            for t, y in zip(texts, labels):
                yield {"text": t, "labels": y}


def make_synthetic_corpus(
    num_labels: int = 20,
    num_train: int = 1000,
    num_validation: int = 200,
    num_test: int = 200,
    min_words: int = 20,
    max_words: int = 80,
    seed: int = 0,
    splits=None,
    **kw,
) -> DatasetDict:
    """Seeded synthetic multi-label corpus (generative story in the module docstring).

    Extra keywords go to :class:`SyntheticCorpusGenerator`: ``zipf_exponent`` (1.0), ``mean_labels``
    (2.0), ``max_labels``, ``num_groups`` (L // 5), ``cooccurrence`` (0.7), ``words_per_label`` (20),
    ``noise_vocab_size`` (2000), ``signal`` (0.5). Same arguments -> identical corpus.
    """
    gen = SyntheticCorpusGenerator(
        num_labels=num_labels, min_words=min_words, max_words=max_words, seed=seed, **kw
    )
    sizes = {"train": num_train, "validation": num_validation, "test": num_test}
    import pyarrow as pa
    from datasets import Dataset, DatasetInfo
    from datasets.table import InMemoryTable

    features = make_features(gen.label_names)
    out = {}
    for split in normalize_splits(splits):
        if sizes[split] < 0:
            raise ValueError(f"num_{split} must be >= 0, got {sizes[split]}")
        tables = list(gen.iter_tables(split, sizes[split], shard_size=5000))
        table = pa.concat_tables(tables) if tables else features.arrow_schema.empty_table()
        table = table.cast(features.arrow_schema)
        out[split] = Dataset(InMemoryTable(table), info=DatasetInfo(features=features))
    return DatasetDict(out)


@register_dataset("synthetic")
def load_synthetic(data_dir=None, **options) -> DatasetDict:
    """``load_mlc_dataset("synthetic", **options)`` = :func:`make_synthetic_corpus` (data_dir unused)."""
    return make_synthetic_corpus(**options)
