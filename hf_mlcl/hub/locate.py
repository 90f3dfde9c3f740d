"""Say early, in one line, why a model name cannot be loaded: a missing local folder or an unreachable Hub.

``from_pretrained`` on a missing path either fails deep in ``huggingface_hub`` ("Repo id must be in the
form ...", a long traceback) or, for a name that is also a valid Hub id, retries the network for most of
a minute. :func:`check_model_source` decides before any loading: an existing folder is fine; a name that
can only be a path (``./x``, ``/x``, ``~/x``, ``a/b/c``) and is missing is "no such folder"; a Hub id is
fine when it is in the local HF cache or the Hub answers, and otherwise one line says the Hub is
unreachable (or switched off with ``HF_HUB_OFFLINE``).
"""

from __future__ import annotations

import os
import socket
from urllib.parse import urlparse

__all__ = ["check_model_source", "hub_endpoint", "hub_reachable"]


def _is_hub_id(name: str) -> bool:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(name)
    except HFValidationError:
        return False
    return True


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_endpoint() -> str:
    """The Hub's address as huggingface_hub uses it (``HF_ENDPOINT``, default https://huggingface.co)."""
    from huggingface_hub import constants

    return constants.ENDPOINT.rstrip("/")


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether a TCP connection to the Hub endpoint (``HF_ENDPOINT``, default huggingface.co) opens."""
    from huggingface_hub import constants

    url = urlparse(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def _in_cache(repo_id: str) -> bool:
    from huggingface_hub import try_to_load_from_cache

    found = try_to_load_from_cache(repo_id, "config.json")
    return isinstance(found, str)


def check_model_source(name: str | None, what: str = "model") -> None:
    """Raise FileNotFoundError / ConnectionError (one line each) unless ``name`` can be loaded.

    ``what`` names the option in the message (e.g. ``"--model_name_or_path"``). ``None`` passes.
    """
    if not name:
        return
    path = os.path.expanduser(name)
    if os.path.isdir(path):
        return
    if os.path.exists(path):
        raise FileNotFoundError(
            f"{what} {name!r} is a file; give the folder that holds config.json and the weights"
        )
    if not _is_hub_id(name) or name.startswith((".", "/", "~")) or os.path.isabs(name):
        raise FileNotFoundError(
            f"{what} {name!r}: no such folder (in {os.getcwd()}); give an existing model folder, or a Hub id "
            "like 'owner/name'"
        )
    if _in_cache(name):
        return
    if _offline():
        raise ConnectionError(
            f"{what} {name!r} is no local folder and not in the Hugging Face cache, and the Hub is switched off "
            "(HF_HUB_OFFLINE=1): download it once online, or give a local folder"
        )
    if not hub_reachable():
        raise ConnectionError(
            f"{what} {name!r} is no local folder and not in the Hugging Face cache, and the Hub is unreachable "
            f"(no network?): give a local folder, or run where {hub_endpoint()} can be reached"
        )
