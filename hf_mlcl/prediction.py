"""Labels for new texts from a saved classifier, at the decision threshold tuned on validation: read a file of
texts, score them in batches on the device that is there, write label names and scores (``hf-mlcl predict``)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["INPUT_FORMATS", "PREDICTION_COLUMNS", "predict_file", "predict_texts", "read_texts"]

INPUT_FORMATS = (".csv", ".tsv", ".jsonl", ".json", ".parquet", ".txt")
PREDICTION_COLUMNS = ("labels", "scores")  # what predict_file adds to the input's columns (after a prefix)
logger = logging.getLogger(__name__)


def read_texts(path: str, text_column: str = "text") -> tuple[list[str], Any]:
    """The texts of a CSV / TSV / JSON lines / parquet file (``text_column``) or of a plain text file (one per
    line), and the table they came from (None for plain text).

    Raises:
        FileNotFoundError: no such file.
        ValueError: an unknown file type, or a table without ``text_column``.
    """
    import pandas as pd

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no input file {path!r}")
    suffix = os.path.splitext(path)[1].lower()
    if suffix == ".txt":
        with open(path, encoding="utf-8") as fh:
            return [line.rstrip("\n") for line in fh], None
    readers = {
        ".csv": lambda: pd.read_csv(path, dtype=str, keep_default_na=False),
        ".tsv": lambda: pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False),
        ".jsonl": lambda: pd.read_json(path, lines=True, dtype=False),
        ".json": lambda: pd.read_json(path, lines=not _json_array(path), dtype=False),
        ".parquet": lambda: pd.read_parquet(path),
    }
    if suffix not in readers:
        raise ValueError(f"{path}: unknown input type {suffix!r}; use one of {INPUT_FORMATS}")
    table = readers[suffix]()
    if text_column not in table.columns:
        raise ValueError(
            f"{path} has no column {text_column!r} (columns: {list(table.columns)}); pass --text_column"
        )
    return [_text(t) for t in table[text_column].tolist()], table


def _json_array(path: str) -> bool:
    """Whether a ``.json`` file holds one JSON array of records (else JSON lines, one record a line)."""
    with open(path, encoding="utf-8-sig") as fh:
        for line in fh:
            if line.strip():
                return line.lstrip().startswith("[")
    return False


def _plain(value: Any) -> Any:
    """An input cell as a JSON / CSV value: NumPy arrays (parquet's list cells, also inside lists and structs) as
    lists."""
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _text(value: Any) -> str:
    """A table cell as a text: a missing one (None, NaN) as "" (not "None" / "nan"), others as ``str``."""
    if value is None or (isinstance(value, float) and value != value):
        return ""
    return value if isinstance(value, str) else str(value)


def _thresholds(config: Any, num_labels: int) -> np.ndarray:
    """The classifier's tuned decision threshold (``config.decision_threshold``: one value or one per label)
    as a (num_labels,) array; 0.5 where none was stored."""
    value = getattr(config, "decision_threshold", None)
    return np.broadcast_to(np.asarray(0.5 if value is None else value, dtype=np.float64), (num_labels,))


def _batches(texts: Sequence[str], batch_size: int) -> Iterator[list[int]]:
    """Row indices in batches of similar length (longest first), so a batch pads little."""
    order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]


@torch.inference_mode()
def predict_texts(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    batch_size: int = 32,
    max_length: int | None = None,
    progress: bool = True,
) -> np.ndarray:
    """Sigmoid scores (N, num_labels) float64 of ``texts`` in their order: the float64 sigmoid of the float32
    logits, the scores a training run tunes its threshold on (float32 rounds every logit above about 16.6 to 1).

    Args:
        model: a multi-label classifier returning ``logits`` (hf_mlcl's or a transformers one), on its device.
        tokenizer: its tokenizer.
        texts: the texts.
        batch_size: texts per forward pass.
        max_length: truncation length in tokens (default: the tokenizer's ``model_max_length``, at most 512).
        progress: show a progress bar.
    """
    from tqdm.auto import tqdm

    from hf_mlcl.modeling.modeling_mlcl import model_inputs, tokenizer_limit

    if batch_size <= 0:
        raise ValueError(f"batch_size must be positive; got {batch_size}")
    length = max_length or min(tokenizer_limit(tokenizer) or 512, 512)
    device = next(model.parameters()).device
    scores = np.zeros((len(texts), int(model.config.num_labels)), dtype=np.float64)
    with tqdm(total=len(texts), desc="Predicting", unit="text", disable=not progress) as bar:
        for rows in _batches(texts, batch_size):
            inputs = model_inputs(tokenizer, [texts[i] for i in rows], device, length)
            scores[rows] = torch.sigmoid(model(**inputs).logits.float().double()).cpu().numpy()
            bar.update(len(rows))
    return scores


def _max_length(folder: str) -> int | None:
    """The token length the classifier was trained at, from its card data (None when not recorded)."""
    from hf_mlcl.hub.model_card import CARD_DATA_FILE

    path = os.path.join(folder, CARD_DATA_FILE)
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as fh:
        value = json.load(fh).get("hyperparameters", {}).get("max_length")
    return int(value) if value else None


def _load_classifier(folder: str) -> Any:
    """The classifier of ``folder``: a native one as the transformers class it is (nothing to convert), any
    other with hf_mlcl's loader."""
    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.modeling.builders import folder_layout, model_files_required
    from hf_mlcl.modeling.native_mlcl import TRANSFORMERS

    with model_files_required(folder):
        if folder_layout(folder) == TRANSFORMERS:
            from transformers import AutoModelForSequenceClassification

            return AutoModelForSequenceClassification.from_pretrained(folder)
        return MLCLForMultiLabelClassification.from_pretrained(folder)


def _available_device(name: str) -> torch.device:
    """``name`` as a device this machine has; ValueError in one line otherwise (before the model loads)."""
    try:
        device = torch.device(name)
    except RuntimeError as err:
        raise ValueError(f"--device {name!r}: {str(err).splitlines()[0]}") from None
    if device.type == "cpu":
        return device
    module = getattr(torch, device.type, None)
    count = module.device_count() if module is not None and hasattr(module, "device_count") else 0
    if count == 0 or (device.index is not None and device.index >= count):
        raise ValueError(
            f"--device {name}: torch sees {count} {device.type} device(s) here; pass --device cpu"
        )
    return device


def predict_file(
    classifier: str,
    input_path: str,
    output_path: str,
    text_column: str = "text",
    batch_size: int = 32,
    max_length: int | None = None,
    device: str | None = None,
    all_scores: bool = False,
    progress: bool = True,
    prediction_prefix: str = "",
) -> dict[str, Any]:
    """Label the texts of ``input_path`` with the classifier folder ``classifier`` at its tuned threshold and
    write one row per text to ``output_path`` (JSON lines, or CSV by its suffix): the input's columns, the
    predicted ``labels`` (names, ';'-joined in CSV) and their ``scores`` (every label's with ``all_scores``).

    Args:
        classifier: a classifier folder written by ``hf-mlcl probe`` / ``run`` (any of its formats).
        input_path: CSV / TSV / JSON lines / parquet with ``text_column``, or a plain text file, one per line.
        output_path: where the predictions go (``.jsonl`` or ``.csv``); an existing file is replaced, never the
            input. A row without text (empty or missing) gets no labels and no scores (a warning counts them).
        text_column: the column holding the texts.
        batch_size: texts per forward pass.
        max_length: truncation length (default: the length the classifier was trained at).
        device: ``"cpu"``, ``"cuda"`` ... (default: the accelerator there is, else the CPU).
        all_scores: write every label's score, not only the predicted labels'.
        progress: show a progress bar.
        prediction_prefix: put before the names of the predictions' columns (``"predicted_"``: ``predicted_labels``
            and ``predicted_scores``), for an input that has a ``labels`` or ``scores`` column of its own.

    Returns:
        A summary: rows, labels per text on average, the threshold source, the output path.

    Raises:
        FileNotFoundError / ValueError: a missing input or classifier, an unknown file type, a missing column,
            an input column the predictions would replace (``PREDICTION_COLUMNS``), an output that is the input;
            all before the model is loaded.
    """
    from transformers import AutoTokenizer

    from hf_mlcl.files import atomic_path
    from hf_mlcl.modeling.builders import require_a_model

    out_suffix = os.path.splitext(output_path)[1].lower()
    if out_suffix not in (".jsonl", ".csv"):
        raise ValueError(f"--output must end in .jsonl or .csv; got {output_path!r}")
    if not os.path.isdir(classifier):
        raise FileNotFoundError(f"no classifier folder {classifier!r}")
    require_a_model(classifier)
    if (
        os.path.exists(output_path)
        and os.path.exists(input_path)
        and os.path.samefile(input_path, output_path)
    ):
        raise ValueError(f"--output {output_path} is the input file; write the predictions to another file")
    texts, table = read_texts(input_path, text_column)
    label_key, score_key = (prediction_prefix + name for name in PREDICTION_COLUMNS)
    taken = [name for name in (label_key, score_key) if table is not None and name in table.columns]
    if taken:
        raise ValueError(
            f"{input_path} has a column {taken[0]!r}, which the predictions' column of that name would replace; "
            "pass --prediction_prefix predicted_ (columns predicted_labels, predicted_scores) or rename it"
        )
    device = _available_device(device) if device else ("cuda" if torch.cuda.is_available() else "cpu")
    model = _load_classifier(classifier).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(classifier)
    blank = np.array([not t.strip() for t in texts], dtype=bool)
    if blank.any():
        logger.warning(
            f"{input_path}: {int(blank.sum())} of {len(texts)} rows have no text (empty or missing); they get no "
            "labels and no scores"
        )
    num_labels = int(model.config.num_labels)
    scores = np.full((len(texts), num_labels), np.nan, dtype=np.float64)
    written = np.flatnonzero(~blank)
    scores[written] = predict_texts(
        model,
        tokenizer,
        [texts[i] for i in written],
        batch_size,
        max_length or _max_length(classifier),
        progress,
    )
    names = [str(model.config.id2label[i]) for i in range(num_labels)]
    chosen = (scores >= _thresholds(model.config, num_labels)) & ~blank[:, None]
    # the input's columns as Python values (a missing value as None: null in JSON lines)
    given = [] if table is None else table.astype(object).where(table.notna(), None).to_dict("records")
    rows = []
    for i in range(len(texts)):
        picked = np.flatnonzero(chosen[i])
        row = {k: _plain(v) for k, v in given[i].items()} if table is not None else {"text": texts[i]}
        row[label_key] = [names[j] for j in picked]
        row[score_key] = (
            dict(zip(names, [None if blank[i] else v for v in scores[i].round(6).tolist()]))
            if all_scores
            else [round(float(scores[i, j]), 6) for j in picked]
        )
        rows.append(row)
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    with atomic_path(output_path) as tmp:
        if out_suffix == ".csv":
            import pandas as pd

            frame = pd.DataFrame(rows)
            frame[label_key] = [";".join(r[label_key]) for r in rows]
            frame[score_key] = [
                json.dumps(r[score_key]) if all_scores else ";".join(map(str, r[score_key])) for r in rows
            ]
            frame.to_csv(tmp, index=False)
        else:
            with open(tmp, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(row, default=str) + "\n")
    stored = getattr(model.config, "decision_threshold", None)
    return {
        "rows": len(texts),
        "labels_per_text": float(chosen.sum(1).mean()) if len(texts) else 0.0,
        "threshold": "tuned (config.decision_threshold)" if stored is not None else "0.5 (none stored)",
        "output": output_path,
    }
