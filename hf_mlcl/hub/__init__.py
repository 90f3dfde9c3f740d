"""hf_mlcl.hub: model-card data collection, rendering and Hub upload.

* :class:`ModelCardCallback` (a ``TrainerCallback``) collects hyperparameters and metrics during a run;
* :class:`CardData`, :func:`render_model_card`, :func:`save_model_card` (atomic README.md);
* :func:`check_model_source` says in one line why a model name cannot load (no such folder, Hub unreachable);
* :func:`check_push_target` says before any training, in one line, why a push cannot work;
* :func:`push_folder` uploads a trained folder with ``HfApi.create_repo`` + ``create_commit``.
"""

from .card_callback import ModelCardCallback, framework_versions
from .locate import check_model_source, hub_reachable
from .model_card import (
    CARD_DATA_FILE,
    CARD_FILE,
    LOSS_PAPERS,
    CardData,
    loss_paper,
    render_model_card,
    resolve_local_data,
    save_model_card,
)
from .push import PushError, check_push_target, check_pushable, check_repo_id, files_to_push, push_folder

__all__ = [
    "CARD_DATA_FILE",
    "CARD_FILE",
    "LOSS_PAPERS",
    "CardData",
    "ModelCardCallback",
    "PushError",
    "check_model_source",
    "check_push_target",
    "check_repo_id",
    "check_pushable",
    "files_to_push",
    "framework_versions",
    "hub_reachable",
    "loss_paper",
    "push_folder",
    "render_model_card",
    "resolve_local_data",
    "save_model_card",
]
