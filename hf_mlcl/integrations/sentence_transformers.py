"""hf_mlcl's multi-label contrastive losses as sentence-transformers losses.

:class:`MultiLabelContrastiveLoss` (with an optional MoCo queue), its GradCache variant
:class:`CachedMultiLabelContrastiveLoss`, :func:`to_sentence_transformers_dataset` and
:func:`add_lora_adapter`.

References: GradCache, Gao et al., RepL4NLP 2021, eq. 5; MoCo, He et al. 2020, Eq. 2; cross-batch memory,
Wang et al., CVPR 2020.
Design: docs/design.md, "Losses in sentence-transformers (hf_mlcl/integrations/sentence_transformers.py)".
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

try:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.base.losses.gradcache import CachedLossMixin
except ImportError as err:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "hf_mlcl.integrations.sentence_transformers needs sentence-transformers: "
        "pip install -e '.[sentence-transformers]' in the hf_mlcl repository"
    ) from err

from hf_mlcl.hub.model_card import loss_paper
from hf_mlcl.labels.multihot import LABEL_INPUT_FORMATS, ids_to_multihot, labels_to_multihot
from hf_mlcl.losses.registry import resolve_loss_name
from hf_mlcl.modeling.sharded import sharding_kind
from hf_mlcl.training.gradcache import split_inputs
from hf_mlcl.training.momentum import MomentumEncoder, UpdateAfterOptimizerSteps

from ._batches import contrastive_batch_loss

__all__ = [
    "MultiLabelContrastiveLoss",
    "CachedMultiLabelContrastiveLoss",
    "add_lora_adapter",
    "to_sentence_transformers_dataset",
]

_GRADCACHE_BIBTEX = """@inproceedings{gao2021scaling,
  title={Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup},
  author={Gao, Luyu and Zhang, Yunyi and Han, Jiawei and Callan, Jamie},
  booktitle={Proceedings of the 6th Workshop on Representation Learning for NLP (RepL4NLP-2021)},
  year={2021}
}"""


def _embedding_dim(model: SentenceTransformer) -> int | None:
    for name in ("get_embedding_dimension", "get_sentence_embedding_dimension"):
        fn = getattr(model, name, None)
        if callable(fn):
            return fn()
    return None


def _printable(value: Any) -> Any:
    """A loss keyword as the model card's JSON can hold it: a tensor (e.g. an (L, L) ``label_similarity``
    matrix) by its shape, a function by its name."""
    if isinstance(value, Tensor):
        return f"tensor{tuple(value.shape)}"
    if callable(value):
        return getattr(value, "__name__", type(value).__name__)
    return value


class MultiLabelContrastiveLoss(nn.Module):
    """An hf_mlcl multi-label contrastive loss for ``SentenceTransformerTrainer``.

    Args:
        model: the ``SentenceTransformer`` being trained.
        loss: a contrastive loss name of :func:`hf_mlcl.losses.list_contrastive_losses` (``"sd"``,
            ``"mulsupcon"``, ``"msc"``, ``"jaccard"``, ``"all"``, ``"any"``, ``"ws_mulsupcon"``, ``"hbl"``).
        num_labels: size of the label space; required for label-id lists and for losses with per-label
            parameters (``msc``'s prototypes), else read from the multi-hot width.
        label_format: ``"multi_hot"`` ((B, L) 0/1 rows), ``"ids"`` ((B, K) ids padded with -1), or
            ``"auto"``: float / bool tensors are multi-hot; integer tensors are ids unless they are 0/1
            rows exactly ``num_labels`` wide (set the format when that could be ambiguous).
        gather_across_devices: contrast each process's anchors with the candidates of all processes
            (an all-gather with gradient), as ``ContrastiveTrainer`` does under DDP. Default False, as in
            sentence-transformers' own losses (``MultipleNegativesRankingLoss``); hf_mlcl's trainers and
            ``ContrastiveLossFunc`` default to True.
        temperature: tau (default: the loss paper's value).
        queue_size: K past keys among the candidates (0: in-batch only; the queue in docs/design.md's
            section on sentence-transformers).
        contrast_set: with a queue, ``"keys"``, ``"queries+queue"`` or ``"queries+keys"`` (None: the loss
            paper's).
        queue_warmup: leave the queue out until it has been filled once (None: the loss paper's).
        momentum: EMA factor of the key encoder (MoCo's 0.999); None: no key encoder, the keys are the
            embeddings without gradient.
        **loss_kwargs: the loss's own keywords (e.g. ``weight_in_log=True`` for ``sd``).
    """

    def __init__(
        self,
        model: SentenceTransformer,
        loss: str = "sd",
        num_labels: int | None = None,
        label_format: str = "auto",
        gather_across_devices: bool = False,
        temperature: float | None = None,
        queue_size: int = 0,
        contrast_set: str | None = None,
        queue_warmup: bool | None = None,
        momentum: float | None = 0.999,
        **loss_kwargs: Any,
    ) -> None:
        super().__init__()
        if label_format not in LABEL_INPUT_FORMATS:
            raise ValueError(f"label_format must be one of {LABEL_INPUT_FORMATS}; got {label_format!r}")
        if num_labels is not None and num_labels <= 0:
            raise ValueError(f"num_labels must be positive; got {num_labels}")
        self.model = model
        self.loss_name = resolve_loss_name(loss)
        self.num_labels = num_labels
        self.label_format = label_format
        self.gather_across_devices = bool(gather_across_devices)
        self.loss_kwargs = dict(loss_kwargs)
        self._batch_loss = contrastive_batch_loss(
            loss,
            loss_kwargs,
            temperature,
            _embedding_dim(model),
            num_labels,
            label_format,
            self.gather_across_devices,
            queue_size,
            contrast_set,
            queue_warmup,
        )
        self.loss_fn = self._batch_loss.loss_fn
        if momentum is not None and not 0.0 <= float(momentum) < 1.0:
            raise ValueError(
                f"momentum must be in [0, 1) (MoCo uses 0.999) or None (no key encoder); got {momentum}"
            )
        self.queue_size = int(queue_size)
        self.momentum = None if momentum is None else float(momentum)
        self._key_updates: UpdateAfterOptimizerSteps | None = (
            None  # the key encoder, from the first training batch
        )
        self._key_chunk: int | None = None  # key encoder batch (the cached variant: its mini-batch size)

    # ------------------------------------------------------------------------------------------ labels
    def multi_hot(self, labels: Tensor) -> Tensor:
        """The batch's labels as a (B, L) float32 multi-hot matrix (see ``label_format``)."""
        return labels_to_multihot(labels, self.num_labels, self.label_format)

    # ------------------------------------------------------------------------------------------ loss
    @staticmethod
    def _single_column(sentence_features: Iterable[dict[str, Tensor]]) -> list[dict[str, Tensor]]:
        features = list(sentence_features)
        if len(features) != 1:
            raise ValueError(
                f"the dataset must have one text column besides the label column; got {len(features)} "
                "(remove the other columns, e.g. dataset.select_columns(['text', 'label']))"
            )
        return features

    def compute_loss(self, embeddings: Tensor, labels: Tensor, keys: Any = None) -> Tensor:
        """The hf_mlcl loss of ``embeddings`` (B, D) with ``labels`` (multi-hot or padded ids); with a queue
        in training, ``keys()`` gives the batch's keys (default: the embeddings without gradient). The
        values are checked on the first call only (docs/design.md's section on sentence-transformers)."""
        return self._batch_loss(embeddings, labels, keys)

    # ------------------------------------------------------------------------------------------ queue
    def set_label_statistics(self, train_labels: Tensor) -> None:
        """The training set's labels for a loss weighted by them (``ws_mulsupcon``): call it once before training
        (:meth:`~hf_mlcl.integrations._batches.BatchLoss.set_label_statistics`)."""
        self._batch_loss.set_label_statistics(train_labels)

    @property
    def queue(self) -> Any:
        """The :class:`~hf_mlcl.training.memory.EmbeddingQueue` (None in batch mode and before the first
        training batch)."""
        return self._batch_loss.queue

    @property
    def key_encoder(self) -> MomentumEncoder | None:
        """The momentum key encoder (None without a queue, with ``momentum=None``, before the first training
        batch)."""
        return None if self._key_updates is None else self._key_updates.key_encoder

    def _keys_of(self, features: dict[str, Any]) -> Any:
        """What the loss calls for this batch's keys: the key encoder on ``features`` (built from the model
        at the first training batch), in chunks of ``_key_chunk`` texts; None (the embeddings without
        gradient) in batch mode, at evaluation and with ``momentum=None``."""
        if self.queue_size == 0 or self.momentum is None or not torch.is_grad_enabled():
            return None
        if self._key_updates is None:
            sharded = sharding_kind(self.model)
            if sharded is not None:  # a copy of sharded parameters holds this process's shard only
                raise ValueError(
                    f"queue_size={self.queue_size} with a momentum encoder cannot copy a model sharded by {sharded}; "
                    "pass momentum=None (keys without gradient) or train with hf_mlcl.ContrastiveTrainer, whose "
                    "key encoder is a second LoRA adapter under DeepSpeed / FSDP"
                )
            self._key_updates = UpdateAfterOptimizerSteps(
                MomentumEncoder(self.model, momentum=self.momentum), lambda: self.model
            )
        key_encoder = self._key_updates.key_encoder

        def keys() -> Tensor:  # one pass per mini-batch of the cached variant, else one for the batch
            chunks = split_inputs(features, self._key_chunk) if self._key_chunk else [features]
            return torch.cat([key_encoder(chunk)["sentence_embedding"] for chunk in chunks])

        return keys

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        (features,) = self._single_column(sentence_features)
        keys = self._keys_of(
            dict(features)
        )  # its own copy: sentence-transformers' modules write into the dict
        return self.compute_loss(self.model(features)["sentence_embedding"], labels, keys)

    # ------------------------------------------------------------------------------------------ card
    def get_config_dict(self) -> dict[str, Any]:
        """What sentence-transformers' model card lists under the loss."""
        return {
            "loss": self.loss_name,
            "temperature": self.loss_fn.temperature,
            "num_labels": self.num_labels,
            "label_format": self.label_format,
            "gather_across_devices": self.gather_across_devices,
            **(
                {
                    "queue_size": self.queue_size,
                    "contrast_set": self._batch_loss.contrast_set,
                    "momentum": self.momentum,
                }
                if self.queue_size
                else {}
            ),
            **{key: _printable(value) for key, value in self.loss_kwargs.items()},
        }

    @property
    def citation(self) -> str:
        """BibTeX of the loss's paper (sentence-transformers' model card cites it)."""
        return loss_paper(self.loss_name)["bibtex"]


class CachedMultiLabelContrastiveLoss(CachedLossMixin, MultiLabelContrastiveLoss):
    """:class:`MultiLabelContrastiveLoss` with GradCache (Gao et al. 2021, eq. 5): texts are embedded
    ``mini_batch_size`` at a time without a graph, the loss over the whole batch caches dL/dz, and each
    mini-batch is re-embedded with its replayed RNG state to push dL/dz into the model. Same gradients
    as the plain loss (dropout included), memory of one mini-batch. Other arguments as the plain loss.

    A loss that owns parameters (``msc``'s label prototypes) has their gradient dL/dtheta computed in
    the same pass as dL/dz, and cached too: it reaches the parameters through the returned loss tensor
    (a zero-valued term ``theta . g - (theta . g).detach()``), so whatever the trainer does to the loss
    before its backward — divide it by the gradient-accumulation steps, multiply it by the fp16 loss
    scale — scales the parameters' gradient exactly as it scales the model's (GradCache's hook
    multiplies dL/dz by the same incoming gradient).
    """

    def __init__(
        self,
        model: SentenceTransformer,
        loss: str = "sd",
        mini_batch_size: int = 32,
        show_progress_bar: bool = False,
        **kwargs: Any,
    ) -> None:
        if mini_batch_size <= 0:
            raise ValueError(f"mini_batch_size must be positive; got {mini_batch_size}")
        MultiLabelContrastiveLoss.__init__(self, model, loss, **kwargs)
        self.mini_batch_size = int(mini_batch_size)
        self._key_chunk = self.mini_batch_size  # the key encoder too embeds one mini-batch at a time
        self._pending_keys: Any = None
        self.show_progress_bar = bool(show_progress_bar)

    def calculate_loss(
        self, reps: list[list[Tensor]], labels: Tensor | None = None, *, with_backward: bool = False
    ) -> Tensor:
        """The loss of the whole batch from its mini-batch embeddings; with ``with_backward`` the
        gradients wrt. the embeddings go to their ``.grad`` (GradCache's cache) and those wrt. the loss's
        own parameters are kept for :meth:`forward`, none of them written to a parameter yet."""
        loss = self.compute_loss(torch.cat(reps[0]), labels, self._pending_keys)
        if not with_backward:
            return loss
        params = [p for p in self.loss_fn.parameters() if p.requires_grad]
        self._batch_loss.average_parameter_grads = (
            False  # averaged once, when the returned loss's backward runs
        )
        try:
            grads = torch.autograd.grad(loss, [*reps[0], *params], allow_unused=True)
        finally:
            self._batch_loss.average_parameter_grads = True
        for rep, grad in zip(reps[0], grads):
            rep.grad = grad
        self._parameter_grads = [(p, g) for p, g in zip(params, grads[len(reps[0]) :]) if g is not None]
        return loss.detach()

    def forward(self, sentence_features: Iterable[dict[str, Tensor]], labels: Tensor) -> Tensor:
        self._parameter_grads: list[tuple[Tensor, Tensor]] = []
        features = self._single_column(sentence_features)
        self._pending_keys = self._keys_of(dict(features[0]))
        try:
            loss = self.forward_cached(features, labels)
        finally:
            self._pending_keys = None
        grads, self._parameter_grads = self._parameter_grads, []
        if not grads:
            return loss
        # value 0, gradient g * (the gradient the trainer sends into the loss): accumulation and loss scaling
        surrogate = torch.stack([torch.vdot(p.flatten(), g.flatten().to(p.dtype)) for p, g in grads]).sum()
        return loss + (surrogate - surrogate.detach()).to(loss.dtype)

    def get_config_dict(self) -> dict[str, Any]:
        return {**super().get_config_dict(), "mini_batch_size": self.mini_batch_size}

    @property
    def citation(self) -> str:
        return super().citation + "\n\n" + _GRADCACHE_BIBTEX


def add_lora_adapter(
    model: SentenceTransformer,
    r: int = 16,
    alpha: int = 32,
    dropout: float = 0.1,
    target_modules: Sequence[str] | None = None,
) -> SentenceTransformer:
    """Give ``model``'s transformer a LoRA adapter (Hu et al. 2022) on its architecture's attention and
    feed-forward projections (:func:`hf_mlcl.modeling.lora.default_lora_targets`: BERT / MiniLM, RoBERTa,
    ModernBERT, MPNet, Llama ...; or ``target_modules``). Only the adapter trains. ``model.save(path)``
    writes the adapter alone (``adapter_config.json`` naming the base model, ``adapter_model.safetensors``)
    beside sentence-transformers' own files, and ``SentenceTransformer(path)`` loads the base with the
    adapter, as for any PEFT model it reads. The transformer is wrapped in peft's ``PeftModel``
    (``get_peft_model``): sentence-transformers' ``model.add_adapter`` goes through transformers' PEFT
    integration, which transformers 5.24 allows only with peft >= 0.22. Returns ``model``."""
    from peft import LoraConfig, get_peft_model

    from hf_mlcl.modeling.lora import default_lora_targets

    module = model[0] if len(model) else None
    backbone = getattr(module, "model", None)
    if backbone is None or not hasattr(backbone, "config"):
        raise ValueError(
            "add_lora_adapter needs a SentenceTransformer whose first module holds a transformers model"
        )
    if hasattr(backbone, "peft_config"):
        raise ValueError("this SentenceTransformer's transformer already has an adapter")
    targets = list(target_modules) if target_modules is not None else default_lora_targets(backbone)
    config = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none")
    module.model = get_peft_model(backbone, config)
    return model


def to_sentence_transformers_dataset(
    dataset: Any,
    label_format: str = "ids",
    text_column: str = "text",
    label_column: str = "labels",
    num_labels: int | None = None,
) -> Any:
    """An hf_mlcl split (``text`` + ``labels`` id lists) as a sentence-transformers dataset: columns
    ``text`` and ``label``, the label ids padded with -1 to the longest row (``"ids"``, light for large
    label spaces) or multi-hot rows (``"multi_hot"``). ``num_labels`` defaults to the ClassLabel names."""
    from hf_mlcl.data.registry import label_names

    if label_format not in ("ids", "multi_hot"):
        raise ValueError(f"label_format must be 'ids' or 'multi_hot'; got {label_format!r}")
    if num_labels is None and label_format == "multi_hot":
        num_labels = len(label_names(dataset))
    rows: Sequence[Sequence[int]] = dataset.with_format("arrow")[label_column].to_pylist()
    odd = next((v for r in rows for v in r if not isinstance(v, int) or isinstance(v, bool)), None)
    if odd is not None:
        raise ValueError(
            f"the {label_column!r} column must hold lists of integer label ids (got {odd!r}): load the data with "
            "hf_mlcl.data.load_mlc_dataset, or encode label names as ids with a ClassLabel Sequence "
            "(hf_mlcl.data.make_features(names))"
        )
    width = max((len(r) for r in rows), default=0) or 1
    ids = torch.full((len(rows), width), -1, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    if len(rows):
        flat = torch.tensor([i for r in rows for i in r], dtype=torch.long)
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        ids[mask] = flat
    values = ids if label_format == "ids" else ids_to_multihot(ids, num_labels).to(torch.int8)
    out = dataset.select_columns([text_column])
    if text_column != "text":
        out = out.rename_column(text_column, "text")
    return out.add_column("label", values.tolist())
