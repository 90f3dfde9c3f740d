"""hf_mlcl.data: multi-label text datasets (loaders + synthetic corpus) and batch collation.

Data flow: ``load_mlc_dataset(name | Hub id | file | Dataset, data_dir)`` -> DatasetDict(text, labels=Sequence(ClassLabel))
-> ``MultiLabelCollator`` (tokens + per-batch multi-hot labels) -> model.
"""

from hf_mlcl.data import aapd, goemotions, mimic, rcv1, reuters21578, synthetic, uklex  # noqa: F401  (registers the loaders)
from hf_mlcl.data.collator import MultiLabelCollator, tokenize_dataset
from hf_mlcl.data.custom import data_notes, load_custom_dataset
from hf_mlcl.data.mimic import filter_by_hadm_ids, read_hadm_split_ids
from hf_mlcl.data.registry import (
    filter_by_ids,
    label_names,
    list_datasets,
    load_mlc_dataset,
    make_features,
    register_dataset,
    train_frequency,
)
from hf_mlcl.data.synthetic import SyntheticCorpusGenerator, make_synthetic_corpus
from hf_mlcl.data.tokenizer import ensure_pad_token, train_tokenizer

__all__ = [
    "MultiLabelCollator",
    "SyntheticCorpusGenerator",
    "data_notes",
    "ensure_pad_token",
    "filter_by_hadm_ids",
    "filter_by_ids",
    "label_names",
    "list_datasets",
    "load_custom_dataset",
    "load_mlc_dataset",
    "make_features",
    "make_synthetic_corpus",
    "read_hadm_split_ids",
    "register_dataset",
    "tokenize_dataset",
    "train_frequency",
    "train_tokenizer",
]
