"""The checks of a run on rows packed without padding (``padding_free``): the arguments, the model, the kernel."""

from __future__ import annotations

import logging
from typing import Any

from hf_mlcl.modeling.base_mlcl import padding_free_reason
from hf_mlcl.modeling.builders import backbone_config_dict

__all__ = ["check_padding_free_args", "check_padding_free_model", "check_padding_free_run"]

logger = logging.getLogger(__name__)


def check_padding_free_args(args: Any) -> None:
    """ValueError (one line) for training arguments that split a packed batch by rows: GradCache, or a queue with
    two views (the key view is sliced off)."""
    if getattr(args, "gradcache_chunk_size", 0) > 0:
        raise ValueError(
            "padding_free batches cannot be split into GradCache chunks; set gradcache_chunk_size 0 or "
            "padding_free false"
        )
    if getattr(args, "n_views", 1) > 1 and getattr(args, "queue_size", 0) > 0:
        raise ValueError(
            "padding_free batches with a queue need n_views 1 (the key view is split off by rows)"
        )


def check_padding_free_model(model: Any) -> None:
    """ValueError (one line) unless ``model`` (an hf_mlcl model or its ``PeftModel``) can encode packed rows; a
    warning where its attention kernel masks the packed row as a whole."""
    check = getattr(model, "check_padding_free", None)
    if check is None:
        raise ValueError(f"padding_free batches need an hf_mlcl model; got {type(model).__name__}")
    check()
    kernel = str(getattr(model.backbone.config, "_attn_implementation", None))
    if "flash" not in kernel and "flex" not in kernel:
        logger.warning(
            "padding_free with %s attention: transformers masks the packed row as a whole (T x T for T tokens), "
            "which can cost more than padding; flash_attention_2 or flex_attention attend row by row",
            kernel,
        )


def check_padding_free_run(model_args: Any, data_args: Any, args: Any, source: str | None = None) -> None:
    """Before a stage loads anything, where ``data_args.padding_free`` is on: :func:`check_padding_free_args` and
    the backbone's family read from its config (``source``: the stage's encoder folder or backbone, default
    ``model_args``'s)."""
    if not getattr(data_args, "padding_free", False):
        return
    check_padding_free_args(args)
    config = backbone_config_dict(model_args, source)
    if config is not None:
        reason = padding_free_reason(
            config.get("model_type"), config.get("is_causal", True), model_args.head == "label_attention"
        )
        if reason is not None:
            raise ValueError(reason)
