"""Model cards for hf_mlcl checkpoints: card data, loss citations, rendering and atomic writing.

``CardData`` holds what a card says (collected during a run by
:class:`hf_mlcl.hub.card_callback.ModelCardCallback`); :func:`render_model_card` fills the Jinja
template ``model_cards/{encoder,classifier}.md`` and the YAML front matter with huggingface_hub's
``ModelCardData`` / ``EvalResult`` (``model-index`` with the measured metrics); :func:`save_model_card`
writes ``README.md`` atomically (temp file + ``os.replace``) next to ``card_data.json``, so an
interrupted write never leaves a half card behind.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from typing import Any

CARD_FILE = "README.md"
CARD_DATA_FILE = "card_data.json"
KINDS = ("encoder", "classifier")
_REPO_TEMPLATES = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "model_cards"
)


def _template_dir() -> str:
    """The repository's model_cards/ (source checkout, editable install), else the copy a wheel installs
    under ``<prefix>/share/hf_mlcl/model_cards`` (pyproject's data-files; prefix = the environment, or
    the user base for ``pip install --user``)."""
    import site
    import sys

    candidates = [_REPO_TEMPLATES]
    for prefix in (sys.prefix, sys.base_prefix, getattr(site, "USER_BASE", None)):
        if prefix:
            candidates.append(os.path.join(prefix, "share", "hf_mlcl", "model_cards"))
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "encoder.md")):
            return folder
    return _REPO_TEMPLATES


TEMPLATE_DIR = _template_dir()

# name -> (display name, citation line, BibTeX). Canonical loss names of hf_mlcl.losses.
LOSS_PAPERS: dict[str, dict[str, str]] = {
    "all": {
        "display": "ALL (exact label-set match)",
        "cite": "Zhang & Wu, Multi-Label Supervised Contrastive Learning, AAAI 2024 (baseline strategy)",
        "bibtex": (
            "@inproceedings{zhang2024mulsupcon,\n  title={Multi-Label Supervised Contrastive Learning},\n"
            "  author={Zhang, Pingyue and Wu, Mengyue},\n  booktitle={Proceedings of the AAAI Conference on "
            "Artificial Intelligence},\n  volume={38},\n  number={15},\n  pages={16786--16793},\n  year={2024}\n}"
        ),
    },
    "any": {
        "display": "ANY (shared label)",
        "cite": "Zhang & Wu, Multi-Label Supervised Contrastive Learning, AAAI 2024 (baseline strategy)",
        "bibtex": "",  # filled below: same paper as "all"
    },
    "mulsupcon": {
        "display": "MulSupCon",
        "cite": "Zhang & Wu, Multi-Label Supervised Contrastive Learning, AAAI 2024",
        "bibtex": "",
    },
    "similarity_dissimilarity": {
        "display": "Similarity-Dissimilarity loss",
        "cite": (
            "Huang, Long, Luo & Liu, Similarity-Dissimilarity Loss with Supervised Contrastive Learning for "
            "Multi-label Classification, arXiv:2410.13439"
        ),
        "bibtex": (
            "@article{huang2024similarity,\n  title={Similarity-Dissimilarity Loss with Supervised Contrastive "
            "Learning for Multi-label Classification},\n  author={Huang, Guangming and Long, Yunfei and Luo, "
            "Cunjin and Liu, Sheng},\n  journal={arXiv preprint arXiv:2410.13439},\n  year={2024}\n}"
        ),
    },
    "jaccard": {
        "display": "L_Base (Jaccard-weighted SupCon)",
        "cite": (
            "Audibert, Gauffre & Amini, Exploring Contrastive Learning for Long-Tailed Multi-Label Text "
            "Classification, ECML-PKDD 2024"
        ),
        "bibtex": (
            "@inproceedings{audibert2024exploring,\n  title={Exploring Contrastive Learning for Long-Tailed "
            "Multi-Label Text Classification},\n  author={Audibert, Alexandre and Gauffre, Aur{\\'e}lien and "
            "Amini, Massih-Reza},\n  booktitle={Joint European Conference on Machine Learning and Knowledge "
            "Discovery in Databases},\n  pages={245--261},\n  year={2024},\n  publisher={Springer}\n}"
        ),
    },
    "msc": {
        "display": "MSC / ABALONE",
        "cite": (
            "Audibert, Gauffre & Amini, Exploring Contrastive Learning for Long-Tailed Multi-Label Text "
            "Classification, ECML-PKDD 2024"
        ),
        "bibtex": "",
    },
    "ws_mulsupcon": {
        "display": "ws-MulSupCon (weighted stratification)",
        "cite": (
            "Lin & Chen, Weighted Stratification in Multi-Label Contrastive Learning for Long-Tailed Medical "
            "Image Classification"
        ),
        "bibtex": (
            "@misc{lin2025wsmulsupcon,\n  title={Weighted Stratification in Multi-Label Contrastive Learning "
            "for Long-Tailed Medical Image Classification},\n  author={Lin, Ying-Chih and Chen, Yong-Sheng},\n"
            "  year={2025}\n}"
        ),
    },
    "hbl": {
        "display": "HBL (hierarchical boundary learning)",
        "cite": (
            "Chen, Lyu, Wang & Tang, Learning Semantic Boundaries: An Adaptive Structural Loss for Multi-Label "
            "Contrastive Learning"
        ),
        "bibtex": (
            "@misc{chen2025hbl,\n  title={Learning Semantic Boundaries: An Adaptive Structural Loss for "
            "Multi-Label Contrastive Learning},\n  author={Chen, Ning and Lyu, Shen-Huan and Wang, Yanyan and "
            "Tang, Bin},\n  year={2025}\n}"
        ),
    },
    "bce": {"display": "binary cross-entropy", "cite": "standard multi-label BCE", "bibtex": ""},
    "focal": {
        "display": "focal loss",
        "cite": "Lin, Goyal, Girshick, He & Dollar, Focal Loss for Dense Object Detection, ICCV 2017",
        "bibtex": (
            "@inproceedings{lin2017focal,\n  title={Focal Loss for Dense Object Detection},\n  author={Lin, "
            "Tsung-Yi and Goyal, Priya and Girshick, Ross and He, Kaiming and Doll{\\'a}r, Piotr},\n"
            "  booktitle={ICCV},\n  year={2017}\n}"
        ),
    },
    "asymmetric": {
        "display": "asymmetric loss",
        "cite": "Ridnik et al., Asymmetric Loss for Multi-Label Classification, ICCV 2021",
        "bibtex": (
            "@inproceedings{ridnik2021asymmetric,\n  title={Asymmetric Loss for Multi-Label Classification},\n"
            "  author={Ridnik, Tal and Ben-Baruch, Emanuel and Zamir, Nadav and Noy, Asaf and Friedman, Itamar "
            "and Protter, Matan and Zelnik-Manor, Lihi},\n  booktitle={ICCV},\n  year={2021}\n}"
        ),
    },
}
for _same, _src in (("any", "all"), ("mulsupcon", "all"), ("msc", "jaccard")):
    LOSS_PAPERS[_same]["bibtex"] = LOSS_PAPERS[_src]["bibtex"]
LOSS_ALIASES = {"sd": "similarity_dissimilarity"}

# metrics shown in model-index (key in the metrics dict -> (metric type, display name))
_INDEX_METRICS = {
    "micro_f1": ("f1", "micro-F1"),
    "macro_f1": ("f1", "macro-F1"),
    "p@1": ("precision_at_1", "P@1"),
    "p@5": ("precision_at_5", "P@5"),
    "p@8": ("precision_at_8", "P@8"),
    "p@15": ("precision_at_15", "P@15"),
    "micro_auc": ("roc_auc", "micro-AUC"),
    "macro_auc": ("roc_auc", "macro-AUC"),
    "knn_micro_f1": ("f1", "kNN micro-F1"),
    "knn_macro_f1": ("f1", "kNN macro-F1"),
}


def loss_paper(name: str | None) -> dict[str, str]:
    """Display name, one-line citation and BibTeX of a loss (unknown names get an empty citation)."""
    key = LOSS_ALIASES.get(str(name), str(name))
    return LOSS_PAPERS.get(key, {"display": str(name), "cite": "", "bibtex": ""})


@dataclasses.dataclass
class CardData:
    """Everything a card states; JSON-serialisable (``card_data.json``)."""

    kind: str = "encoder"
    model_name: str | None = None
    base_model: str | None = None
    dataset: str | None = None
    dataset_options: dict[str, Any] = dataclasses.field(default_factory=dict)
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

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"card kind must be one of {KINDS}; got {self.kind!r}")

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


def _metric_value(metrics: dict[str, float], key: str) -> tuple[str, float] | None:
    """The test value of a metric if present, else the validation value (name says which split)."""
    for prefix, split in (("test_", "test"), ("validation_", "validation"), ("eval_", "validation"), ("", "test")):
        value = metrics.get(prefix + key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return split, float(value)
    return None


def eval_results(card: CardData) -> list[Any]:
    """``huggingface_hub.EvalResult`` rows for model-index: one per reported metric (test split first)."""
    from huggingface_hub import EvalResult

    task = "text-classification" if card.kind == "classifier" else "feature-extraction"
    rows = []
    for key, (metric_type, display) in _INDEX_METRICS.items():
        found = _metric_value(card.metrics, key)
        if found is None:
            continue
        split, value = found
        rows.append(
            EvalResult(
                task_type=task,
                task_name="multi-label text classification",
                dataset_type=card.dataset or "unknown",
                dataset_name=card.dataset or "unknown",
                dataset_split=split,
                metric_type=metric_type,
                metric_name=display,
                metric_value=round(value, 4),
            )
        )
    return rows


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def _is_hub_id(name: str | None) -> bool:
    """A Hub model id (``org/name``), not a local folder or a description such as "random-init bert"."""
    return bool(name) and bool(_HUB_ID.match(name)) and not os.path.exists(name)


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

    template_path = template_path or os.path.join(TEMPLATE_DIR, f"{card.kind}.md")
    if not os.path.isfile(template_path):
        raise FileNotFoundError(
            f"model card template {template_path} is missing; it ships in the repository's model_cards/ folder "
            "and a wheel installs it under <prefix>/share/hf_mlcl/model_cards: reinstall hf_mlcl, or pass "
            "template_path="
        )
    results = eval_results(card)
    name = card.model_name or f"hf-mlcl-{card.kind}"
    meta = ModelCardData(
        language=card.language,
        license=card.license,
        library_name="transformers",
        pipeline_tag="text-classification" if card.kind == "classifier" else "feature-extraction",
        tags=["hf_mlcl", "multi-label", "contrastive-learning", card.kind]
        + ([LOSS_ALIASES.get(str(card.contrastive_loss or card.loss), str(card.contrastive_loss or card.loss))]
           if (card.contrastive_loss or card.loss) else []),
        datasets=[card.dataset] if card.dataset else None,
        base_model=card.base_model if _is_hub_id(card.base_model) else None,
        model_name=name,
        eval_results=results or None,
    )
    stage1 = card.contrastive_loss if card.kind == "classifier" else card.loss
    return ModelCard.from_template(
        meta,
        template_path=template_path,
        card=card,
        name=name,
        loss_info=loss_paper(stage1) if stage1 else None,
        probe_loss_info=loss_paper(card.loss) if card.kind == "classifier" else None,
        metric_rows=_metric_table(card.metrics),
        hyperparameters=sorted(card.hyperparameters.items()),
        shown_labels=card.label_names[:20],
    )


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str, text: str) -> None:
    """Write ``text`` to ``path`` through a temp file in the same folder and ``os.replace``."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def save_model_card(card: CardData, folder: str, template_path: str | None = None) -> str:
    """Render and write ``README.md`` + ``card_data.json`` into ``folder`` atomically; returns the card path."""
    text = str(render_model_card(card, template_path))
    atomic_write_text(
        os.path.join(folder, CARD_DATA_FILE), json.dumps(card.to_dict(), indent=2, sort_keys=True, default=str)
    )
    path = os.path.join(folder, CARD_FILE)
    atomic_write_text(path, text)
    return path
