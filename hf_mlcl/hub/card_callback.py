"""A ``TrainerCallback`` that collects model-card data while a run happens (as sentence-transformers does).

Attach it to a trainer (``trainer.add_callback(cb)`` or ``callbacks=[cb]``): it records the training
hyperparameters when training starts, the model's pooling / head / base model, every evaluation's
metrics, and the final train metrics; :meth:`ModelCardCallback.save` (or ``write_on_train_end=True``)
renders the card into a folder. For a trainer that already finished (e.g. one returned by
``hf_mlcl.training.stages.train_contrastive``), :meth:`ModelCardCallback.collect_from_trainer` replays the same
hooks from ``trainer.args``, ``trainer.model`` and ``trainer.state.log_history``.
"""

from __future__ import annotations

import enum
import importlib.metadata
import logging
import os
from typing import Any

import torch
from transformers import TrainerCallback

from hf_mlcl.modeling.builders import folder_layout, stored_config
from hf_mlcl.modeling.folders_mlcl import ADAPTER_CONFIG_NAME
from hf_mlcl.modeling.lora import LORA_OPTIONS

from .model_card import CardData, anchored_path, save_model_card

# what a gradient-trained stage has and a logistic probe (lbfgs on cached features) does not
_GRADIENT_KEYS = (
    "learning_rate",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "num_train_epochs",
    "max_steps",
    "lr_scheduler_type",
    "warmup_steps",
    "weight_decay",
    "optim",
    "max_grad_norm",
)
# TrainingArguments fields worth stating on a card (when the run's args have them).
_TRAINING_KEYS = (
    *_GRADIENT_KEYS,
    "seed",
    "bf16",
    "fp16",
    # ContrastiveTrainingArguments
    "temperature",
    "n_views",
    "queue_size",
    "momentum",
    "gather_across_devices",
    "gradcache_chunk_size",
    # ProbingTrainingArguments
    "probe",
)
_SETTINGS_IN_METRICS = ("contrastive_weight", "contrastive_projection_dim")  # the joint stage's metrics.json
_MODEL_KEYS = ("pooling", "head", "chunk_size", *LORA_OPTIONS)
logger = logging.getLogger(__name__)
_VERSIONS = ("hf_mlcl", "transformers", "torch", "accelerate", "peft", "datasets", "huggingface_hub")


def _plain(value: Any) -> Any:
    """JSON-friendly: enums to their value (a str enum too, which would print as ``SchedulerType.COSINE``),
    everything else unchanged or str."""
    if isinstance(value, enum.Enum) or (
        hasattr(value, "value") and not isinstance(value, (int, float, str, bool))
    ):
        return value.value
    if isinstance(value, (int, float, str, bool)) or value is None:
        return value
    return str(value)


def _default_temperature(loss: str) -> Any:
    """The temperature a loss uses when none is given (its paper's), or None for an unknown or supervised loss."""
    from hf_mlcl.losses.registry import get_loss_class

    try:
        return getattr(get_loss_class(loss), "default_temperature", None)
    except (KeyError, ValueError):
        return None


def framework_versions() -> dict[str, str]:
    out = {}
    for name in _VERSIONS:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


class ModelCardCallback(TrainerCallback):
    """Collect :class:`~hf_mlcl.hub.model_card.CardData` during training.

    Args:
        kind: "encoder" (stage 1) or "classifier" (stage 2).
        model_args / data_args: the run's ``ModelArguments`` / ``DataArguments`` (base model, dataset,
            max length, LoRA settings).
        label_names: the dataset's label names (card lists the first ones; sets ``num_labels``).
        contrastive_loss / encoder_path: for classifier cards, the stage-1 loss and encoder folder.
        write_on_train_end: render the card into ``args.output_dir`` when training ends.
    """

    def __init__(
        self,
        kind: str = "encoder",
        model_args: Any = None,
        data_args: Any = None,
        label_names: list[str] | None = None,
        contrastive_loss: str | None = None,
        encoder_path: str | None = None,
        write_on_train_end: bool = False,
    ) -> None:
        # a local base model or encoder is recorded absolute (the data: local_data), so that a push from any
        # directory knows it for this machine's and leaves it out (CardData.for_hub)
        self.card = CardData(
            kind=kind, contrastive_loss=contrastive_loss, encoder_path=anchored_path(encoder_path)
        )
        self.write_on_train_end = write_on_train_end
        self.card.framework_versions = framework_versions()
        if label_names is not None:
            self.card.label_names = [str(n) for n in label_names]
            self.card.num_labels = len(label_names)
        if model_args is not None:
            self.card.base_model = anchored_path(getattr(model_args, "model_name_or_path", None)) or (
                f"random-init {model_args.backbone_config.get('model_type', 'backbone')}"
                if getattr(model_args, "backbone_config", None)
                else None
            )
            for key in _MODEL_KEYS:
                if key == "head" and kind == "encoder":  # the classifier's option, not the encoder's
                    continue
                if hasattr(model_args, key):
                    self.card.hyperparameters[key] = _plain(getattr(model_args, key))
            self.card.pooling = getattr(model_args, "pooling", None)
            if kind == "classifier":
                self.card.head = getattr(model_args, "head", None)
        self._data_args = data_args  # its local paths go into the card when it is saved (local_data_paths)
        if data_args is not None:
            self.card.dataset = getattr(data_args, "dataset", None)
            options = data_args.loader_options() if hasattr(data_args, "loader_options") else None
            self.card.dataset_options = dict(options or getattr(data_args, "dataset_options", None) or {})
            self.card.hyperparameters["max_length"] = getattr(data_args, "max_length", None)

    # ----------------------------------------------------------------------------------- hooks
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._collect_args(args)
        self._collect_model(model)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.update_metrics(metrics or {})

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self._collect_train_metrics(state)
        if (
            self.write_on_train_end and args.should_save
        ):  # the folder's writer (each node's with save_on_each_node)
            self.save(args.output_dir)

    # ----------------------------------------------------------------------------------- collection
    def _collect_args(self, args) -> None:
        logistic = (
            getattr(args, "probe", None) == "logistic"
        )  # fitted by lbfgs: no optimizer, schedule or epochs
        for key in _TRAINING_KEYS:
            if logistic and key in _GRADIENT_KEYS:
                continue
            if hasattr(args, key):
                value = getattr(args, key)
                if key == "max_steps" and (value is None or value <= 0):
                    continue
                self.card.hyperparameters[key] = _plain(value)
        if logistic:
            self.card.hyperparameters["logistic_c_grid"] = _plain(getattr(args, "logistic_c_grid", None))
            self.card.hyperparameters["logistic_max_iter"] = _plain(getattr(args, "logistic_max_iter", None))
        if self.card.hyperparameters.get("queue_size") == 0:  # the momentum encoder keys a queue only
            self.card.hyperparameters.pop("momentum", None)
        if self.card.hyperparameters.get("temperature", 0) is None and getattr(args, "loss", None):
            self.card.hyperparameters["temperature"] = _default_temperature(args.loss)
        given = getattr(args, "loss_kwargs", None)
        if isinstance(given, dict) and given.get("temperature") is not None:  # the loss's own keyword wins
            self.card.hyperparameters["temperature"] = _plain(given["temperature"])
        if getattr(args, "threshold", None) is not None:  # how the threshold was chosen; its value: metrics
            self.card.hyperparameters["threshold_strategy"] = _plain(args.threshold)
        world = int(getattr(args, "world_size", 1) or 1)
        if not logistic:
            self.card.hyperparameters["total_train_batch_size"] = (
                args.per_device_train_batch_size * args.gradient_accumulation_steps * world
            )
        self.card.hyperparameters["num_processes"] = world
        self.card.loss = getattr(args, "loss", self.card.loss)
        self.card.loss_kwargs = dict(getattr(args, "loss_kwargs", None) or {})
        if self.card.kind == "classifier":
            self.card.probe = getattr(args, "probe", None)
        if self.card.kind == "classifier" and hasattr(args, "contrastive_weight"):  # the joint objective
            self.card.probe = "joint"
            self.card.loss = args.supervised_loss
            self.card.loss_kwargs = dict(args.supervised_loss_kwargs or {})
            self.card.contrastive_loss = args.loss
            self.card.hyperparameters["contrastive_weight"] = float(args.contrastive_weight)
            if args.contrastive_projection_dim:
                self.card.hyperparameters["contrastive_projection_dim"] = int(args.contrastive_projection_dim)
            self.card.hyperparameters["contrastive_loss_kwargs"] = dict(args.loss_kwargs or {})
        if getattr(args, "hub_model_id", None):
            self.card.model_name = self.card.model_name or args.hub_model_id
            self.card.repo_id = args.hub_model_id

    def _collect_model(self, model) -> None:
        if model is None:
            return
        config = getattr(model, "config", None)
        if config is None:
            return
        if not self.card.base_model:
            self.card.base_model = anchored_path(getattr(config, "backbone_name_or_path", None))
        pooling = getattr(config, "pooling", None)  # the model's own (a native head pools as its family does)
        if pooling:
            if getattr(config, "native_pooling", None) == "pooler":
                pooling = "cls, then the backbone's pooler (dense + tanh)"
            self.card.pooling = pooling
            self.card.hyperparameters["pooling"] = pooling
        if self.card.kind == "encoder":
            self.card.hyperparameters.setdefault("projection_dim", getattr(config, "projection_dim", None))
        self.card.reduced_precision = reduced_precision(model)
        id2label = getattr(config, "id2label", None) or {}
        if not self.card.label_names and id2label and len(id2label) > 2:  # 2 = the transformers default
            self.card.label_names = [str(id2label[i]) for i in sorted(id2label, key=int)]
            self.card.num_labels = len(self.card.label_names)

    def _collect_train_metrics(self, state) -> None:
        for entry in reversed(getattr(state, "log_history", None) or []):
            if "train_runtime" in entry:
                self.update_metrics({k: v for k, v in entry.items() if k.startswith("train_")})
                break

    def update_metrics(self, metrics: dict[str, Any]) -> None:
        """Record numeric metrics (later values of the same key win); a setting recorded beside them (the joint
        objective's ``contrastive_weight``) stays a hyperparameter."""
        for key, value in metrics.items():
            if key in self.card.hyperparameters or key in _SETTINGS_IN_METRICS:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.card.metrics[key] = float(value)

    def collect_from_trainer(self, trainer, metrics: dict[str, Any] | None = None) -> CardData:
        """Fill the card from a trainer that has already trained (the hooks' data, replayed)."""
        self._collect_args(trainer.args)
        self._collect_model(
            trainer.accelerator.unwrap_model(trainer.model)
            if hasattr(trainer, "accelerator")
            else trainer.model
        )
        for entry in trainer.state.log_history:
            if any(k.startswith("eval_") for k in entry):
                self.update_metrics({k: v for k, v in entry.items() if k.startswith("eval_")})
        self._collect_train_metrics(trainer.state)
        if metrics:
            self.update_metrics(metrics)
        return self.card

    def save(self, folder: str, model_name: str | None = None) -> str:
        """Render the card into ``folder`` (README.md + card_data.json, atomically). The card's "How to use"
        code loads the model from its Hub repo (``hub_model_id``) or, without one, from ``folder`` as given."""
        if model_name:
            self.card.model_name = model_name
        if not self.card.model_name:
            parts = os.path.normpath(os.path.abspath(folder)).split(os.sep)[-2:]
            self.card.model_name = "-".join(p for p in parts if p) or f"hf-mlcl-{self.card.kind}"
        self.card.folder = os.path.normpath(folder)
        self.card.local_data = local_data_paths(self._data_args, folder)
        self.card.layout = folder_layout(folder)
        self.card.adapter = os.path.isfile(os.path.join(folder, ADAPTER_CONFIG_NAME))
        if not self.card.adapter and stored_config(folder).get("dtype") == "float32":
            self.card.reduced_precision = None  # merged into a float32 base: one dtype throughout
        if self.card.reduced_precision and self.card.layout != "hf_mlcl":
            logger.warning(
                "%s: the backbone is %s and the trained adapter / heads float32; sentence-transformers, "
                "transformers and peft run some or all of them in %s (outputs to its rounding), hf_mlcl's "
                "from_pretrained as trained",
                folder,
                self.card.reduced_precision,
                self.card.reduced_precision,
            )
        return save_model_card(self.card, folder)


def reduced_precision(model) -> str | None:
    """``"bfloat16"`` / ``"float16"`` when ``model``'s parameters mix that dtype (a backbone stored in it) with
    float32 ones (the adapter and heads, trained in float32), else None."""
    parameters = getattr(model, "parameters", None)
    dtypes = {p.dtype for p in parameters() if p.is_floating_point()} if callable(parameters) else set()
    if torch.float32 not in dtypes:
        return None
    low = [d for d in (torch.bfloat16, torch.float16) if d in dtypes]
    return str(low[0]).removeprefix("torch.") if low else None


def local_data_paths(data_args: Any, folder: str) -> dict[str, Any]:
    """The run's local data paths (``dataset`` when it is a file or folder, ``data_dir``, the ``data_files``
    of its loader options) relative to ``folder``, for :attr:`CardData.local_data`: the card's folder can
    then find its data from any working directory (:func:`hf_mlcl.hub.model_card.resolve_local_data`)."""
    if data_args is None:
        return {}

    def rel(path: Any) -> Any:
        if isinstance(path, (list, tuple)):
            return [rel(p) for p in path]
        if isinstance(path, str) and os.path.exists(path):
            return os.path.relpath(os.path.abspath(path), os.path.abspath(folder))
        return path

    out: dict[str, Any] = {}
    for key in ("dataset", "data_dir"):
        value = getattr(data_args, key, None)
        if isinstance(value, str) and os.path.exists(value):
            out[key] = rel(value)
    options = data_args.loader_options() if hasattr(data_args, "loader_options") else {}
    files = options.get("data_files")
    if files:
        out["data_files"] = {k: rel(v) for k, v in files.items()} if isinstance(files, dict) else rel(files)
    return out
