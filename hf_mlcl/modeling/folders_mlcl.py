"""Model folders of the hf_mlcl models: atomic saving, folders saved as a LoRA adapter (loaded with the adapter
unmerged where peft is installed), and the bundling of the code files a folder ships as remote code.

Copied beside the weights with ``modeling_mlcl.py`` (Hub remote code, ``trust_remote_code=True``): it imports only
the standard library, ``torch``, ``transformers`` and ``safetensors`` (deepspeed and peft inside ``try``), never
``hf_mlcl``.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoModel
from transformers.utils import logging

logger = logging.get_logger(__name__)

__all__ = [
    "ADAPTER_CONFIG_NAME",
    "apply_adapter",
    "ADAPTER_WEIGHTS_NAME",
    "HEADS_WEIGHTS_NAME",
    "bundle_code_files",
    "hub_file",
    "hub_keywords",
    "load_adapter_folder",
    "merge_lora_weights",
    "resolve_subfolder",
    "save_folder_atomically",
]

_WEIGHT_FILE_PREFIXES = ("model", "pytorch_model")
ADAPTER_CONFIG_NAME = "adapter_config.json"
ADAPTER_WEIGHTS_NAME = "adapter_model.safetensors"
# a saved model's own config, or an adapter's over its base: a folder holding either holds a model
MODEL_CONFIG_FILES = ("config.json", ADAPTER_CONFIG_NAME)
HEADS_WEIGHTS_NAME = "model.safetensors"
_PEFT_PREFIX = "base_model.model."


def save_folder_atomically(target: str, save: Callable[[str], Any]) -> None:
    """``save(folder)`` into a temporary folder beside ``target``, then moved into place (module docstring)."""
    target = os.path.abspath(target)
    parent = os.path.dirname(target)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a checkpoint folder gets the usual mode
    try:
        save(tmp)
        for name in os.listdir(tmp):  # safetensors writes its files 0600: give them the folder's umask
            if name.endswith(".safetensors"):
                os.chmod(os.path.join(tmp, name), 0o666 & ~umask)
        if not os.path.isdir(target) or not os.listdir(target):
            try:  # rename(2) replaces a missing or empty folder in one step
                os.replace(tmp, target)
                return
            except OSError:  # another process wrote into the folder meanwhile: go file by file
                pass
        new_files = set(os.listdir(tmp))
        for name in os.listdir(target):
            path = os.path.join(target, name)
            if (
                name not in new_files
                and os.path.isfile(path)
                and name.startswith(_WEIGHT_FILE_PREFIXES)
                and name.endswith((".safetensors", ".bin", ".index.json"))
            ):
                os.remove(path)
        for name in sorted(new_files):
            src, dst = os.path.join(tmp, name), os.path.join(target, name)
            if os.path.isdir(src):
                shutil.rmtree(dst, ignore_errors=True)
            os.replace(src, dst)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _whole(weight: torch.Tensor):
    """A context in which ``weight`` is whole: a DeepSpeed ZeRO-3 partitioned parameter (a model loaded while
    ZeRO-3 is configured) is gathered and its change broadcast from rank 0, so every process must enter it
    together; any other tensor as it is."""
    if not hasattr(weight, "ds_id"):
        return contextlib.nullcontext()
    try:  # an optional import, which transformers' check of remote code does not require to be installed
        from deepspeed.zero import GatheredParameters
    except ImportError as err:
        raise ImportError(
            "this parameter is partitioned by DeepSpeed ZeRO-3, but deepspeed cannot be imported"
        ) from err
    return GatheredParameters([weight], modifier_rank=0)


def merge_lora_weights(
    backbone: nn.Module, adapter_config: Mapping[str, Any], adapter_state: Mapping[str, torch.Tensor]
) -> int:
    """Add a saved LoRA adapter into ``backbone``'s weights in place: W <- W + s B A for every adapted
    linear layer (Hu et al., 2022, "LoRA", Eq. 3: h = W0 x + s B A x, s = lora_alpha / r, or
    lora_alpha / sqrt(r) with rsLoRA). Keys are PEFT's (``base_model.model.<module>.lora_A.weight``).
    Returns the number of merged layers; ValueError for adapter kinds this merge does not cover. Under
    DeepSpeed ZeRO-3 (a backbone loaded partitioned) every process calls this together."""
    import math

    kind = adapter_config.get("peft_type", "LORA")
    if kind != "LORA":
        raise ValueError(f"only LoRA adapters are merged on load; this adapter is {kind}")
    for option in ("use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern"):
        if adapter_config.get(option):
            raise ValueError(
                f"adapter option {option} is not supported when loading without peft; load the backbone with "
                "peft.PeftModel.from_pretrained instead"
            )
    r, alpha = int(adapter_config["r"]), float(adapter_config["lora_alpha"])
    scale = alpha / (math.sqrt(r) if adapter_config.get("use_rslora") else r)
    suffix_a, suffix_b = ".lora_A.weight", ".lora_B.weight"
    merged = 0
    with torch.no_grad():
        for key in sorted(adapter_state):
            if not key.endswith(suffix_a):
                continue
            path = key[: -len(suffix_a)]
            path = path[len(_PEFT_PREFIX) :] if path.startswith(_PEFT_PREFIX) else path
            down, up = adapter_state[key], adapter_state[key[: -len(suffix_a)] + suffix_b]
            weight = backbone.get_submodule(path).weight
            with _whole(weight):
                delta = (up.to(weight.device, torch.float32) @ down.to(weight.device, torch.float32)) * scale
                weight.copy_((weight.float() + delta).to(weight.dtype))
            merged += 1
    if not merged:
        raise ValueError("the adapter holds no LoRA weights (no '*.lora_A.weight' keys)")
    return merged


def hub_file(path: str, filename: str, hub_kwargs: Mapping[str, Any]) -> str | None:
    """``filename`` of a local folder or a Hub repo (downloaded to the cache), or None when absent."""
    if os.path.isdir(path):
        local = os.path.join(path, filename)
        return local if os.path.isfile(local) else None
    from transformers.utils import cached_file

    return cached_file(
        path,
        filename,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **hub_kwargs,
    )


HUB_KEYWORDS = (
    "revision",
    "cache_dir",
    "token",
    "local_files_only",
    "subfolder",
)  # from_pretrained's, for files


def hub_keywords(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of ``from_pretrained``'s ``kwargs`` that locate a folder's files (``HUB_KEYWORDS``, those set)."""
    return {k: kwargs[k] for k in HUB_KEYWORDS if kwargs.get(k) is not None}


def resolve_subfolder(
    path: str, kwargs: Mapping[str, Any], markers: tuple[str, ...]
) -> tuple[str, dict[str, Any]]:
    """``path`` and ``from_pretrained``'s ``kwargs`` with a ``subfolder`` turned into a folder of its own when hf_mlcl
    reads that part itself: a local folder's subfolder is joined to its path; a Hub repository's subfolder holding
    one of ``markers`` (a native or adapter layout's file) is downloaded and its local copy returned. Otherwise
    (no subfolder, or a Hub subfolder in hf_mlcl's own format, which transformers reads) nothing changes."""
    subfolder = kwargs.get("subfolder")
    if not subfolder:
        return path, dict(kwargs)
    rest = {k: v for k, v in kwargs.items() if k != "subfolder"}
    if os.path.isdir(path):
        return os.path.join(path, subfolder), rest
    hub = hub_keywords(rest)
    if not any(hub_file(path, marker, {**hub, "subfolder": subfolder}) for marker in markers):
        return path, dict(kwargs)
    from huggingface_hub import snapshot_download

    snapshot = snapshot_download(path, allow_patterns=[f"{subfolder}/*"], **hub)
    return os.path.join(snapshot, subfolder), rest


def _peft_available() -> bool:
    try:  # an optional import, which transformers' check of remote code does not require to be installed
        import peft  # noqa: F401
    except ImportError:
        return False
    return True


def apply_adapter(backbone: nn.Module, path: str, weights_file: str, hub: Mapping[str, Any]) -> None:
    """The PEFT adapter of the folder ``path`` on ``backbone``, unmerged (transformers' ``load_adapter``, which
    needs peft), with its weights as saved in float32, the dtype peft trains them in (``load_adapter`` casts them
    to the backbone's dtype, which for a bf16 base rounds them): a bf16 base keeps every update of its adapter.
    Modules the adapter saves whole (``modules_to_save``) keep the model's dtype.
    ``weights_file``: the local copy of its ``adapter_model.safetensors``; ``hub``: the folder's Hub keywords."""
    from safetensors.torch import load_file

    # the Hub keywords go as the download's (load_adapter's own local_files_only fails in transformers 5)
    backbone.load_adapter(path, adapter_name="default", adapter_kwargs=dict(hub))
    params = dict(backbone.named_parameters())
    for key, value in load_file(weights_file).items():
        module, _, leaf = key.removeprefix(_PEFT_PREFIX).rpartition(".")
        lora = ".lora_" in key  # else a module the adapter saves whole (``modules_to_save``: a native head)
        name = f"{module}.default.{leaf}" if lora else f"{module}.modules_to_save.default.{leaf}"
        if name not in params:
            raise ValueError(f"{weights_file}: {key} matches no adapter weight of the loaded model ({name})")
        params[name].data = value.to(params[name].device, torch.float32 if lora else params[name].dtype)


def load_adapter_folder(
    cls: Any, path: str, adapter_file: str, hub: Mapping[str, Any], kwargs: Mapping[str, Any]
) -> nn.Module:
    """A ``cls`` model from a folder saved as a LoRA adapter (module docstring): the base backbone named by
    ``adapter_config.json`` (``base_model_name_or_path``, else the config's ``backbone_name_or_path``) with the
    adapter applied (:func:`apply_adapter`; merged in, :func:`merge_lora_weights`, where peft is not installed,
    with a warning for bf16 / fp16 weights, and under DeepSpeed ZeRO-3) and the heads read from
    ``model.safetensors``; ValueError naming what does not fit.
    ``hub``: the Hub keywords of the folder (revision, cache, token); ``kwargs``: ``from_pretrained``'s."""
    from safetensors.torch import load_file

    config = kwargs.get("config")
    if not isinstance(config, cls.config_class):
        config = cls.config_class.from_pretrained(path, **hub)
    with open(adapter_file, encoding="utf-8") as fh:
        adapter_config = json.load(fh)
    base = adapter_config.get("base_model_name_or_path") or config.backbone_name_or_path
    if not base:
        raise ValueError(f"{path}/{ADAPTER_CONFIG_NAME} names no base model (base_model_name_or_path)")
    base_kwargs = {
        k: kwargs[k] for k in ("dtype", "cache_dir", "token", "local_files_only") if kwargs.get(k) is not None
    }
    base_kwargs.setdefault("dtype", config.dtype or "auto")  # the dtype the backbone trained in
    backbone = AutoModel.from_pretrained(base, **base_kwargs)
    expected = (config.backbone_config or {}).get("vocab_size")
    embeddings = backbone.get_input_embeddings().weight
    rows = getattr(embeddings, "ds_shape", embeddings.shape)[0]  # ZeRO-3 keeps the full shape in ds_shape
    if expected is not None and rows != int(expected):
        raise ValueError(
            f"base model {base} has {rows} token embeddings but the adapter was trained with {expected}; load "
            "the base model it was trained on"
        )
    weights = hub_file(path, ADAPTER_WEIGHTS_NAME, hub)
    heads_file = hub_file(path, HEADS_WEIGHTS_NAME, hub)
    if weights is None or heads_file is None:
        raise ValueError(
            f"{path} holds {ADAPTER_CONFIG_NAME} but not {ADAPTER_WEIGHTS_NAME} and {HEADS_WEIGHTS_NAME}"
        )
    partitioned = any(hasattr(p, "ds_id") for p in backbone.parameters())  # loaded while ZeRO-3 is configured
    if partitioned or not _peft_available():
        if not partitioned and next(backbone.parameters()).dtype in (torch.bfloat16, torch.float16):
            logger.warning(
                "peft is not installed: the adapter of %s is merged into %s weights, which rounds away updates "
                "below their resolution (install peft to keep it unmerged)",
                path,
                next(backbone.parameters()).dtype,
            )
        merge_lora_weights(backbone, adapter_config, load_file(weights))
    model = cls(config, backbone=backbone)
    if not partitioned and _peft_available():
        apply_adapter(model.backbone, path, weights, hub)
    missing, unexpected = model.load_state_dict(load_file(heads_file), strict=False)
    missing = [k for k in missing if not k.startswith(f"{cls.base_model_prefix}.")]
    if missing or unexpected:
        raise ValueError(
            f"{path}/{HEADS_WEIGHTS_NAME} does not fit {cls.__name__}: missing {missing}, unexpected {unexpected}"
        )
    model.to(next(backbone.parameters()).device)
    model.eval()
    return model


def _sibling_imports(tree: ast.Module, siblings: set[str]) -> list[ast.ImportFrom]:
    """The ``from .<sibling> import ...`` statements anywhere in ``tree`` whose sibling is in ``siblings``."""
    return [
        n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1 and n.module in siblings
    ]


def _top_level_names(tree: ast.Module) -> list[str]:
    """The names a module's top-level statements define (functions, classes, assignments)."""
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return names


def _code_lines(source: str, drop: list[ast.AST]) -> str:
    """A module's source without its docstring, its ``from __future__`` import and the statements ``drop``."""
    tree = ast.parse(source)
    skip = list(drop)
    for node in tree.body:
        docstring = (
            node is tree.body[0] and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        )
        if docstring or (isinstance(node, ast.ImportFrom) and node.module == "__future__"):
            skip.append(node)
    gone = {i for node in skip for i in range(node.lineno, node.end_lineno + 1)}
    return "\n".join(line for i, line in enumerate(source.splitlines(), start=1) if i not in gone).strip("\n")


def bundle_code_files(
    folder: str, main: str = "modeling_mlcl", keep: tuple[str, ...] = ("configuration_mlcl",)
) -> None:
    """Inline into ``folder/<main>.py`` the sibling modules it imports, directly or through each other
    (``from .<name> import ...`` anywhere in a file), that ``save_pretrained`` copied beside it, except those in
    ``keep``, and remove their files: each module's code after the modules it imports, ``main``'s last, without
    those imports. Nothing changes when no such sibling was copied (a bundled file saved again). ValueError when
    the copied modules import each other in a cycle, or when two modules define the same top-level name (the
    bundle would keep only the last)."""
    path = os.path.join(folder, f"{main}.py")
    copied = {n[: -len(".py")] for n in os.listdir(folder) if n.endswith(".py")} - set(keep) - {main}
    sources: dict[str, str] = {}
    order: list[str] = []

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in chain:
            raise ValueError(
                f"the copied modules import each other in a cycle: {' -> '.join((*chain, name))}"
            )
        with open(os.path.join(folder, f"{name}.py"), encoding="utf-8") as fh:
            sources[name] = fh.read()
        for node in _sibling_imports(ast.parse(sources[name]), copied):
            visit(node.module, (*chain, name))
        order.append(name)

    visit(main, ())
    if order == [main]:
        return
    defined: dict[str, str] = {}
    for name in order:
        for target in _top_level_names(ast.parse(sources[name])):
            if target != "__all__" and defined.setdefault(target, name) != name:
                raise ValueError(f"{target} is defined in both {defined[target]}.py and {name}.py")
    parts = [
        f"# ---- {name}.py\n"
        + _code_lines(sources[name], _sibling_imports(ast.parse(sources[name]), copied))
        + "\n"
        for name in order
    ]
    docstring = ast.get_docstring(ast.parse(sources[main]), clean=False) or ""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(f'"""{docstring}"""\n\nfrom __future__ import annotations\n\n' + "\n\n".join(parts))
    for name in order[:-1]:
        os.remove(os.path.join(folder, f"{name}.py"))
