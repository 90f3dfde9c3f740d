"""Model cards for hf_mlcl checkpoints: card data and rendering (the loss citations come from the losses).

``CardData`` holds what a card says (collected during a run by
:class:`hf_mlcl.hub.card_callback.ModelCardCallback`); :func:`render_model_card` fills the Jinja
template ``model_cards/{encoder,classifier}.md`` (package data of ``hf_mlcl.model_cards``) and the YAML front matter with huggingface_hub's
``ModelCardData`` / ``EvalResult`` (``model-index`` with the measured metrics); :func:`save_model_card`
writes ``README.md`` atomically (temp file + ``os.replace``) next to ``card_data.json``, so an
interrupted write never leaves a half card behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from hf_mlcl.files import atomic_write_json, atomic_write_text

CARD_FILE = "README.md"
CARD_DATA_FILE = "card_data.json"
SENTENCE_TRANSFORMERS = "sentence-transformers"
KINDS = ("encoder", "classifier")
TEMPLATE_PACKAGE = "hf_mlcl.model_cards"


def template_text(kind: str) -> str:
    """The Jinja template of a card kind (``encoder`` / ``classifier``), read as package data of
    ``hf_mlcl.model_cards`` with :mod:`importlib.resources` (the repository's top-level ``model_cards/``
    folder, mapped to that package in pyproject.toml), so source checkouts, editable installs and wheels
    read the same file."""
    from importlib import resources

    if kind not in KINDS:
        raise ValueError(f"unknown model card kind {kind!r}; expected one of {KINDS}")
    resource = resources.files(TEMPLATE_PACKAGE).joinpath(f"{kind}.md")
    if not resource.is_file():
        raise FileNotFoundError(
            f"model card template {kind}.md is missing from the package {TEMPLATE_PACKAGE} (the repository's "
            "model_cards/ folder): reinstall hf_mlcl, or pass template_path="
        )
    return resource.read_text(encoding="utf-8")


def loss_paper(name: str | None) -> dict[str, str]:
    """Display name, one-line reference and BibTeX of a loss, read from the registered loss class's
    ``display_name`` / ``reference`` / ``citation`` attributes (names and aliases resolve through
    :func:`hf_mlcl.losses.registry.resolve_loss_name`; unknown names get an empty citation)."""
    from hf_mlcl.losses import get_loss_class

    try:
        cls = get_loss_class(str(name))
    except ValueError:
        return {"display": str(name), "cite": "", "bibtex": ""}
    return {
        "display": getattr(cls, "display_name", cls.loss_name),
        "cite": getattr(cls, "reference", ""),
        "bibtex": getattr(cls, "citation", ""),
    }


def _canonical_loss(name: str) -> str:
    """The registry's canonical name of a loss (``"sd"`` -> ``"similarity_dissimilarity"``), else ``name``."""
    from hf_mlcl.losses.registry import resolve_loss_name

    try:
        return resolve_loss_name(name)
    except ValueError:
        return name


def contrastive_tags(card: CardData) -> list[str]:
    """The Hub tags of the card's training: ``contrastive-learning`` and the contrastive loss where one trained
    the encoder (an encoder's own loss, a classifier's ``contrastive_loss``), else the supervised loss alone."""
    contrastive = card.contrastive_loss or (card.loss if card.kind == "encoder" else None)
    if contrastive:
        return ["contrastive-learning", _canonical_loss(str(contrastive))]
    return [_canonical_loss(str(card.loss))] if card.loss else []


def __getattr__(name: str) -> Any:
    if name == "LOSS_PAPERS":  # canonical name -> loss_paper(name), built from the registry on access
        from hf_mlcl.losses import list_losses

        return {loss: loss_paper(loss) for loss in list_losses()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# metrics shown in model-index (key in the metrics dict -> (metric type, display name, metric config: which
# average of a metric type, so that the Hub tells micro-F1 and macro-F1 apart))
_INDEX_METRICS = {
    "micro_f1": ("f1", "micro-F1", "micro"),
    "macro_f1": ("f1", "macro-F1", "macro"),
    "p@1": ("precision_at_1", "P@1", None),
    "p@5": ("precision_at_5", "P@5", None),
    "p@8": ("precision_at_8", "P@8", None),
    "p@15": ("precision_at_15", "P@15", None),
    "micro_auc": ("roc_auc", "micro-AUC", "micro"),
    "macro_auc": ("roc_auc", "macro-AUC", "macro"),
    "knn_micro_f1": ("f1", "kNN micro-F1", "knn-micro"),
    "knn_macro_f1": ("f1", "kNN macro-F1", "knn-macro"),
}


def is_local_path(value: Any) -> bool:
    """True for a string naming a path of this machine (absolute, or one that exists from here)."""
    return isinstance(value, str) and bool(value) and (os.path.isabs(value) or os.path.exists(value))


def anchored_path(value: Any) -> Any:
    """``value`` made absolute when it is a relative path that exists from here, so that :func:`is_local_path`
    still knows it for a path of this machine when the card is pushed from another directory."""
    return os.path.abspath(value) if is_local_path(value) else value


def _without_local_paths(value: Any) -> Any:
    """``value`` (loader options: dicts and lists of them) with every path of this machine cut to its file or
    folder name."""
    if isinstance(value, dict):
        return {k: _without_local_paths(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_without_local_paths(v) for v in value]
    return os.path.basename(os.path.normpath(value)) if is_local_path(value) else value


@dataclasses.dataclass
class CardData:
    """Everything a card states; JSON-serialisable (``card_data.json``)."""

    kind: str = "encoder"
    model_name: str | None = None
    base_model: str | None = None
    dataset: str | None = None
    dataset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
    data_notes: list[str] = dataclasses.field(
        default_factory=list
    )  # e.g. "validation: carved from train ..."
    num_labels: int | None = None
    label_names: list[str] = dataclasses.field(default_factory=list)
    loss: str | None = None
    loss_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    contrastive_loss: str | None = None  # classifier cards: the stage-1 loss of the encoder
    encoder_path: str | None = None
    pooling: str | None = None
    head: str | None = None
    probe: str | None = None
    hyperparameters: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    framework_versions: dict[str, str] = dataclasses.field(default_factory=dict)
    license: str = "apache-2.0"
    language: str = "en"
    # where the model can be loaded from: its Hub repository, else the folder it was saved into (as the run
    # named it); the "How to use" code names the first one set
    repo_id: str | None = None
    folder: str | None = None
    # the saved folder's format (hf_mlcl.modeling.builders.folder_layout): "sentence-transformers" (an encoder,
    # or a classifier with a linear head),
    # "transformers" (a classifier with a native head), "peft" (the same as a LoRA adapter) or "hf_mlcl"
    # (hf_mlcl's classes, shipped as remote code)
    layout: str = "hf_mlcl"
    # the folder is a LoRA adapter over its base model (``adapter_config.json``)
    adapter: bool = False
    # "bfloat16" / "float16": the backbone's weights are stored so while the trained adapter and heads are float32
    # (loaders that run a model in one dtype reproduce it to that rounding only); None: one dtype throughout
    reduced_precision: str | None = None
    # local data paths of the run (dataset file / folder, data_dir, data_files), relative to ``folder``, so
    # `hf-mlcl evaluate` finds the data from any working directory; never pushed (:meth:`for_hub`)
    local_data: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"card kind must be one of {KINDS}; got {self.kind!r}")

    @property
    def location(self) -> str:
        """What ``from_pretrained`` takes to load this model: the Hub repo id, else the saved folder."""
        return self.repo_id or self.folder or self.model_name or f"hf-mlcl-{self.kind}"

    def for_hub(self, repo_id: str) -> CardData:
        """A copy of the card as published to ``repo_id``: the repo named, this machine's paths left out (a
        local base model or encoder path is dropped, a local dataset keeps its file or folder name)."""
        local = is_local_path
        # a local data file named from the run's directory is local though it is not found from here
        local_dataset = local(self.dataset) or "dataset" in self.local_data
        return dataclasses.replace(
            self,
            repo_id=repo_id,
            model_name=repo_id,
            folder=None,
            local_data={},
            base_model=None if local(self.base_model) else self.base_model,
            encoder_path=None if local(self.encoder_path) else self.encoder_path,
            dataset=os.path.basename(os.path.normpath(self.dataset)) if local_dataset else self.dataset,
            dataset_options=_without_local_paths(self.dataset_options),
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CardData:
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @classmethod
    def load(cls, folder: str) -> CardData:
        with open(os.path.join(folder, CARD_DATA_FILE), encoding="utf-8") as fh:
            return cls.from_dict(json.load(fh))


def resolve_local_data(card: CardData, folder: str) -> dict[str, Any]:
    """The card's :attr:`~CardData.local_data` as paths that work from the current directory: each one
    joined to ``folder`` (the folder the card was read from) where that exists, else left as stored."""

    def here(path: Any) -> Any:
        if isinstance(path, (list, tuple)):
            return [here(p) for p in path]
        if isinstance(path, str) and not os.path.isabs(path):
            joined = os.path.normpath(os.path.join(folder, path))
            return joined if os.path.exists(joined) else path
        return path

    out = {}
    for key, value in (card.local_data or {}).items():
        out[key] = {k: here(v) for k, v in value.items()} if isinstance(value, dict) else here(value)
    return out


def _metric_value(metrics: dict[str, float], key: str) -> tuple[str, float] | None:
    """The test value of a metric if present, else the validation value (name says which split)."""
    for prefix, split in (
        ("test_", "test"),
        ("validation_", "validation"),
        ("eval_", "validation"),
        ("", "test"),
    ):
        value = metrics.get(prefix + key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return split, float(value)
    return None


def eval_results(card: CardData) -> list[Any]:
    """``huggingface_hub.EvalResult`` rows for model-index: one per reported metric (test split first)."""
    from huggingface_hub import EvalResult

    task = "text-classification" if card.kind == "classifier" else "feature-extraction"
    if _is_dataset_id(card.dataset):
        dataset_type = dataset_name = str(card.dataset)
    elif card.dataset:  # a local file or folder: its name only, never a path of the machine that trained it
        dataset_type, dataset_name = "local", os.path.basename(os.path.normpath(str(card.dataset)))
    else:
        dataset_type = dataset_name = "unknown"
    rows = []
    for key, (metric_type, display, config) in _INDEX_METRICS.items():
        found = _metric_value(card.metrics, key)
        if found is None:
            continue
        if key.startswith("p@") and card.num_labels and int(key[2:]) > card.num_labels:
            continue  # P@k beyond the label space is no ranking measure of this model
        split, value = found
        rows.append(
            EvalResult(
                task_type=task,
                task_name="multi-label text classification",
                dataset_type=dataset_type,
                dataset_name=dataset_name,
                dataset_split=split,
                metric_type=metric_type,
                metric_name=display,
                metric_config=config,
                metric_value=round(value, 4),
            )
        )
    return rows


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _is_hub_id(name: str | None) -> bool:
    """A Hub model id (``org/name``), not a local folder or a description such as "random-init bert"."""
    return bool(name) and bool(_HUB_ID.match(name)) and not os.path.exists(name)


def _is_dataset_id(name: str | None) -> bool:
    """A dataset name for the card's ``datasets:`` metadata: a Hub id or a registered name, not a local
    data file (``my_data.csv``) or folder, which mean nothing on the Hub (the body still names them)."""
    from hf_mlcl.data.custom import FILE_FORMATS  # the suffixes the own-data loader reads

    return _is_hub_id(name) and not str(name).lower().endswith((*FILE_FORMATS, ".txt", ".arrow"))


def _hub_datasets(name: str | None) -> list[str] | None:
    """The card's ``datasets:`` metadata: a registered dataset's Hub id (none where it has none: its registered
    name is no Hub dataset), else a Hub id the run loaded."""
    from hf_mlcl.data.registry import dataset_hub_id, registered_dataset

    if registered_dataset(name) is not None:
        hub_id = dataset_hub_id(name)
        return [hub_id] if hub_id else None
    return [name] if _is_dataset_id(name) else None


def _metric_table(metrics: dict[str, float]) -> list[tuple[str, str]]:
    rows = []
    for key in sorted(metrics):
        value = metrics[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        rows.append((key, f"{value:.4f}" if isinstance(value, float) else str(value)))
    return rows


def render_model_card(card: CardData, template_path: str | None = None) -> Any:
    """A ``huggingface_hub.ModelCard``: YAML metadata (model-index with ``eval_results``) + Markdown body."""
    from huggingface_hub import ModelCard, ModelCardData

    if template_path is not None and not os.path.isfile(template_path):
        raise FileNotFoundError(f"model card template {template_path} does not exist: pass an existing file")
    template_str = None if template_path is not None else template_text(card.kind)
    results = eval_results(card)
    name = card.model_name or f"hf-mlcl-{card.kind}"
    st = card.layout == SENTENCE_TRANSFORMERS
    if st and card.kind == "classifier":  # a sentence-transformers model whose output is label probabilities
        library, pipeline_tag, tags = SENTENCE_TRANSFORMERS, "text-classification", [SENTENCE_TRANSFORMERS]
    elif st:
        library, pipeline_tag, tags = (
            SENTENCE_TRANSFORMERS,
            "sentence-similarity",
            [SENTENCE_TRANSFORMERS, "feature-extraction"],
        )
    elif card.layout == "peft":  # a LoRA classifier with a native head: a PEFT SEQ_CLS adapter
        library, pipeline_tag, tags = "peft", "text-classification", ["lora"]
    else:
        library, tags = "transformers", []
        pipeline_tag = "text-classification" if card.kind == "classifier" else "feature-extraction"
    meta = ModelCardData(
        language=card.language,
        license=card.license,
        library_name=library,
        pipeline_tag=pipeline_tag,
        tags=[*tags, "hf_mlcl", "multi-label", *contrastive_tags(card), card.kind],
        datasets=_hub_datasets(card.dataset),
        base_model=card.base_model if _is_hub_id(card.base_model) else None,
        model_name=name,
        eval_results=results or None,
    )
    stage1 = card.contrastive_loss if card.kind == "classifier" else card.loss
    return ModelCard.from_template(
        meta,
        template_path=template_path,
        template_str=template_str,
        card=card,
        name=name,
        loss_info=loss_paper(stage1) if stage1 else None,
        probe_loss_info=loss_paper(card.loss) if card.kind == "classifier" else None,
        location=card.location,
        base_model_id=card.base_model if _is_hub_id(card.base_model) else None,
        max_length=card.hyperparameters.get("max_length") or 512,
        metric_rows=_metric_table(card.metrics),
        hyperparameters=sorted(card.hyperparameters.items()),
        shown_labels=card.label_names[:20],
    )


def save_model_card(card: CardData, folder: str, template_path: str | None = None) -> str:
    """Render and write ``README.md`` + ``card_data.json`` into ``folder`` atomically; returns the card path.
    ``card_data.json`` last: it marks a stage finished (``preflight.FINISHED_FILES``), so a run killed
    between the two is resumed, not taken for finished without its card."""
    text = str(render_model_card(card, template_path))
    path = os.path.join(folder, CARD_FILE)
    atomic_write_text(path, text)
    atomic_write_json(os.path.join(folder, CARD_DATA_FILE), card.to_dict(), default=str)
    return path
