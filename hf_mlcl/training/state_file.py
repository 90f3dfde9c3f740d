"""The contrastive trainer's extra checkpoint state (loss parameters, momentum encoder, queue) as one safetensors
file: nested dicts of tensors and plain values, no pickle.

Design: docs/design.md, "Output folders and checkpoints (hf_mlcl/training/checkpoints.py)".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch

from hf_mlcl.files import atomic_path

__all__ = [
    "STATE_FILE",
    "load_state_file",
    "optimizer_state_to_tree",
    "save_state_file",
    "tree_to_optimizer_state",
]

STATE_FILE = "mlcl_trainer_state.safetensors"
_TREE_KEY = "hf_mlcl_state"
_TENSOR = "__tensor__"


def _flatten(node: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, torch.Tensor):
        if node.layout != torch.strided:
            raise ValueError(f"checkpoint state {path!r} is a sparse tensor; store it dense or as indices")
        tensors[path] = node.detach().to("cpu").contiguous().clone()
        return {_TENSOR: path}
    if isinstance(node, Mapping):
        out = {}
        for key, value in node.items():
            if not isinstance(key, str) or "/" in key:
                raise ValueError(
                    f"checkpoint state keys must be strings without '/'; got {key!r} under {path!r}"
                )
            out[key] = _flatten(value, f"{path}/{key}" if path else key, tensors)
        return out
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    raise ValueError(
        f"checkpoint state {path!r} holds a {type(node).__name__}; only tensors, dicts and plain values "
        "(int, float, str, bool, None) are stored"
    )


def _rebuild(node: Any, tensors: Mapping[str, torch.Tensor]) -> Any:
    if isinstance(node, dict):
        if set(node) == {_TENSOR}:
            return tensors[node[_TENSOR]]
        return {key: _rebuild(value, tensors) for key, value in node.items()}
    return node


def save_state_file(state: Mapping[str, Any], path: str) -> None:
    """Write ``state`` (nested dicts of tensors and plain values) to ``path`` as safetensors, atomically."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    tree = _flatten(state, "", tensors)
    with atomic_path(path) as tmp:
        save_file(tensors, tmp, metadata={_TREE_KEY: json.dumps(tree)})


def load_state_file(path: str, device: torch.device | str = "cpu") -> dict[str, Any]:
    """The state dict written by :func:`save_state_file` (tensors on ``device``). ValueError when the file is
    not an hf_mlcl state."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(path, framework="pt") as fh:
        meta = fh.metadata() or {}
    if _TREE_KEY not in meta:
        raise ValueError(f"{path} is not an hf_mlcl trainer state (no {_TREE_KEY!r} metadata)")
    target = torch.device(device)
    # safetensors names the CPU "cpu" only; a process of a multi-process CPU launch has the device cpu:0
    where = "cpu" if target.type == "cpu" else str(target)
    return _rebuild(json.loads(meta[_TREE_KEY]), load_file(path, device=where))


def optimizer_state_to_tree(state: Mapping[str, Any]) -> dict[str, Any]:
    """A ``torch.optim.Optimizer.state_dict()`` in the form :func:`save_state_file` stores: the per-parameter
    state keyed by the parameter index as a string, the param groups (plain values) as JSON text."""
    return {
        "state": {str(index): dict(values) for index, values in state["state"].items()},
        "param_groups": json.dumps(state["param_groups"]),
    }


def tree_to_optimizer_state(tree: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of :func:`optimizer_state_to_tree`: a state dict for ``Optimizer.load_state_dict``."""
    return {
        "state": {int(index): dict(values) for index, values in tree["state"].items()},
        "param_groups": json.loads(tree["param_groups"]),
    }
