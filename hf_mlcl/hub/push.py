"""Upload a trained hf_mlcl folder (model, tokenizer, card, metrics, plots) to the Hugging Face Hub.

The push only reads the folder: it lists the files worth publishing (:func:`files_to_push`), creates the
repository (``HfApi.create_repo(exist_ok=True)``) and uploads exactly those files in one
``HfApi.create_commit``, with the model card re-rendered for the repository (its "How to use" code names
the repo id, not the local folder). A failure (network, permissions, quota) raises
:class:`PushError` and leaves the local checkpoint byte-for-byte as it was.
"""

from __future__ import annotations

import fnmatch
import json
import os
from typing import Any

from .model_card import CARD_DATA_FILE, CARD_FILE, is_local_path

# Published: weights, configs, tokenizer, remote code, card, metrics, plots.
_INCLUDE = (
    "*.safetensors",
    "*.safetensors.index.json",
    "pytorch_model*.bin",
    "*.json",
    "*.py",
    "*.md",
    "*.txt",
    "*.model",
    "*.jinja",
    "*.png",
    "*.svg",
    "*.onnx",  # hf-mlcl export's onnx/model.onnx, where optimum and transformers.js read it
    "*.onnx.data",  # its external weights, for a model over 2 GB
)
# Never published: resumable-training state and local logs (large, private or pickled), and the settings a
# resume compares (run_settings.json: this machine's model, data and encoder paths).
_EXCLUDE_FILES = (
    "training_args.bin",
    "optimizer.pt",
    "scheduler.pt",
    "rng_state*",
    "*.tmp",
    ".*",
    "run_settings.json",
)
_EXCLUDE_DIRS = ("checkpoint-*", "runs", ".*", "__pycache__")
_WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


class PushError(RuntimeError):
    """The upload failed; the local folder is unchanged."""


def files_to_push(folder: str) -> list[str]:
    """Relative POSIX paths of the files a push uploads (sorted): regular files inside ``folder`` only, never a
    symbolic link (it could point anywhere on this machine) nor a hidden or temporary file."""
    out = []
    for dirpath, dirs, files in os.walk(folder):
        dirs[:] = sorted(
            d
            for d in dirs
            if not any(fnmatch.fnmatch(d, p) for p in _EXCLUDE_DIRS)
            and not os.path.islink(os.path.join(dirpath, d))
        )
        for name in files:
            if any(fnmatch.fnmatch(name, p) for p in _EXCLUDE_FILES):
                continue
            if os.path.islink(os.path.join(dirpath, name)) or not os.path.isfile(os.path.join(dirpath, name)):
                continue
            if any(fnmatch.fnmatch(name, p) for p in _INCLUDE):
                rel = os.path.relpath(os.path.join(dirpath, name), folder)
                out.append(rel.replace(os.sep, "/"))
    return sorted(out)


# JSON keys of the published files that name where a model or its data came from (config.json, mlcl_config.json,
# metrics.json, trainer_state.json): a local path there goes as its file or folder name
_PROVENANCE_KEYS = ("backbone_name_or_path", "_name_or_path", "dataset", "best_model_checkpoint")


def _without_local_paths(folder: str, name: str) -> bytes | None:
    """The bytes to upload for the JSON file ``name`` when it names a path of this machine as a model's or its
    data's origin (``_PROVENANCE_KEYS``: its file or folder name instead), else None (uploaded as it is). ValueError for an
    adapter whose base model is a local folder: the pushed adapter could not load anywhere else."""
    if not name.endswith(".json") or "/" in name:
        return None
    path = os.path.join(folder, name)
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    if name == "adapter_config.json" and is_local_path(data.get("base_model_name_or_path")):
        raise ValueError(
            f"{path}: the adapter's base model is the local folder {data['base_model_name_or_path']!r}, so the "
            "pushed adapter would load nowhere else; push the base model to the Hub and set "
            "base_model_name_or_path to its id, or train with merge_lora: true"
        )
    local = [k for k in _PROVENANCE_KEYS if is_local_path(data.get(k))]
    if not local:
        return None
    for key in local:
        data[key] = os.path.basename(os.path.normpath(data[key]))
    return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _commit_operations(folder: str, files: list[str], repo_id: str) -> list[Any]:
    """One ``CommitOperationAdd`` per file, the card re-rendered for ``repo_id`` on the way: its "How to use"
    code then loads ``repo_id`` instead of the local folder, and ``card_data.json`` loses this machine's
    paths (:meth:`CardData.for_hub`). The local files are only read."""
    from huggingface_hub import CommitOperationAdd

    from .model_card import CardData, render_model_card

    rendered: dict[str, bytes] = {
        name: data for name in files if (data := _without_local_paths(folder, name))
    }
    if CARD_DATA_FILE in files:
        card = CardData.load(folder).for_hub(repo_id)
        rendered[CARD_FILE] = str(render_model_card(card)).encode("utf-8")
        rendered[CARD_DATA_FILE] = json.dumps(card.to_dict(), indent=2, sort_keys=True, default=str).encode(
            "utf-8"
        )
    return [
        CommitOperationAdd(path_in_repo=f, path_or_fileobj=rendered.get(f, os.path.join(folder, f)))
        for f in files
    ]


def check_pushable(folder: str, files: list[str] | None = None) -> list[str]:
    """Raise ValueError unless ``folder`` holds a config, weights and a model card; returns the files."""
    from hf_mlcl.modeling.folders_mlcl import MODEL_CONFIG_FILES

    if not os.path.isdir(folder):
        raise ValueError(f"nothing to push: {folder!r} is not a folder")
    files = files_to_push(folder) if files is None else files
    top = {f for f in files if "/" not in f}
    if not set(MODEL_CONFIG_FILES) & top:
        raise ValueError(
            f"{folder} has no config.json: push the folder a training run saved (its output_dir)"
        )
    if not any(fnmatch.fnmatch(f, p) for f in top for p in _WEIGHTS):
        raise ValueError(f"{folder} has no model weights (*.safetensors / pytorch_model*.bin)")
    if CARD_FILE not in top:
        hint = (
            "render it with hf_mlcl.hub.save_model_card(CardData.load(folder), folder)"
            if CARD_DATA_FILE in top
            else "run training through `hf-mlcl train|probe|run`, which writes README.md"
        )
        raise ValueError(f"{folder} has no model card ({CARD_FILE}); {hint}")
    for name in files:  # before any network call: an adapter on a local base model cannot be published
        _without_local_paths(folder, name)
    return files


def check_repo_id(repo_id: str | None) -> str:
    """Return ``repo_id`` or raise ValueError unless it is a valid Hub model id ('user/name' or 'name').

    No network call: used to reject a bad ``--push_to`` before any training starts.
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    hint = "use 'user/name' or 'name' (letters, digits, '-', '_', '.'; no spaces; at most 96 characters)"
    if not repo_id:
        raise ValueError(f"empty Hub repo_id: {hint}")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise ValueError(f"invalid Hub repo_id {repo_id!r}: {hint}") from err
    return repo_id


_LOGIN = "run `hf auth login` (or set HF_TOKEN)"


def check_push_target(
    repo_id: str, token: str | None = None, api: Any = None, before_training: bool = True
) -> str:
    """Before any training: raise ValueError / ConnectionError, in one line, when a push to ``repo_id`` cannot
    work, so a run never trains for hours and then fails at its push. Checks, in this order (the first two
    without any network call): the repo id's spelling; the Hub switched off (``HF_HUB_OFFLINE``); a token
    (``token``, else ``HF_TOKEN`` or the one ``hf auth login`` saved); a TCP connection to the Hub; the
    token itself (``HfApi.whoami``): valid, allowed to write, and its account or one of its organisations
    owning the namespace of ``repo_id``. ``before_training``: the messages suggest training without the push
    and pushing later (not for ``hf-mlcl push`` itself). Returns ``repo_id``."""
    from huggingface_hub import get_token

    from .locate import _offline, hub_endpoint, hub_reachable

    check_repo_id(repo_id)
    where = f"cannot push to {repo_id!r}"
    later = " or train without --push_to and push later with `hf-mlcl push FOLDER --repo_id ...`"
    later = later if before_training else ""
    if _offline():
        raise ConnectionError(f"{where}: the Hub is switched off (HF_HUB_OFFLINE=1); unset it{later}")
    token = token or get_token()
    if not token:
        raise ValueError(f"{where}: no Hugging Face token; {_LOGIN} with a token that can write")
    if not hub_reachable():
        raise ConnectionError(
            f"{where}: the Hub is unreachable (no network?); run where {hub_endpoint()} can be reached{later}"
        )
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi()
    try:
        me = api.whoami(token=token)
    except Exception as err:  # noqa: BLE001 - an invalid token, or the network dropping now
        raise ValueError(
            f"{where}: the Hub refused the token ({type(err).__name__}); {_LOGIN} again"
        ) from err
    role = ((me.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise ValueError(f"{where}: the token is read-only; {_LOGIN} with a token that can write")
    owners = [me.get("name"), *[org.get("name") for org in me.get("orgs") or []]]
    namespace = repo_id.split("/")[0] if "/" in repo_id else me.get("name")
    if namespace not in owners:
        raise ValueError(
            f"{where}: the token belongs to {me.get('name')!r}, who cannot create repositories under "
            f"{namespace!r} (yours: {', '.join(repr(o) for o in owners if o)}); use one of them"
        )
    return repo_id


def push_folder(
    folder: str,
    repo_id: str,
    *,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    commit_message: str | None = None,
    api: Any = None,
) -> Any:
    """Create ``repo_id`` (if needed) and upload the publishable files of ``folder``, to the branch
    ``revision`` when one is given (created from the main branch if it does not exist; a ``refs/pr/N`` ref
    is committed to as it is).

    Returns the ``CommitInfo`` of ``create_commit``. Raises ValueError for an incomplete folder (before
    any network call) and :class:`PushError` when the Hub call fails; neither touches the folder.
    """
    check_repo_id(repo_id)
    files = check_pushable(folder)
    operations = _commit_operations(folder, files, repo_id)
    if api is None:
        from huggingface_hub import HfApi

        api = HfApi(token=token)
    try:
        api.create_repo(repo_id=repo_id, repo_type="model", private=private, exist_ok=True, token=token)
        if revision and not revision.startswith("refs/pr/"):  # create_commit needs the branch to exist
            api.create_branch(repo_id=repo_id, branch=revision, repo_type="model", exist_ok=True, token=token)
        return api.create_commit(
            repo_id=repo_id,
            repo_type="model",
            operations=operations,
            revision=revision,
            commit_message=commit_message or f"Upload hf_mlcl model ({len(files)} files)",
            token=token,
        )
    except Exception as err:  # noqa: BLE001 - any Hub / network failure
        raise PushError(
            f"push of {folder} to {repo_id} failed ({type(err).__name__}: {err}); "
            "the local folder is unchanged"
        ) from err
