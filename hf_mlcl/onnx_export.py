"""A saved encoder or classifier as an ONNX model in the layout the ecosystem reads: ``onnx/model.onnx`` beside
the folder's ``config.json`` and tokenizer (``hf-mlcl export FOLDER --to onnx``)."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

__all__ = ["ONNX_FILE", "export_onnx"]

ONNX_FILE = os.path.join("onnx", "model.onnx")
_TEXT_INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class _Classifier(nn.Module):
    """``logits`` (B, num_labels) of a multi-label classifier; a sigmoid gives the label probabilities. With
    ``states``, first ``last_hidden_state`` (B, T, H), the token states sentence-transformers' ONNX backend
    reads and then pools and classifies with the folder's own modules."""

    def __init__(self, model: nn.Module, states: bool = False) -> None:
        super().__init__()
        self.model = model
        self.states = states

    def forward(self, input_ids, attention_mask=None, token_type_ids=None):
        if not self.states:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).logits
        states, mask, segment = self.model.encode_tokens(input_ids, attention_mask, token_type_ids)
        return states, self.model.logits_from_pooled(self.model.pool(states, mask, segment))


class _Encoder(nn.Module):
    """``last_hidden_state`` (B, T, H), the token states, and ``sentence_embedding``, the folder's sentence
    embedding: the pooled representation (B, H), or with ``projected`` the projection head's output."""

    def __init__(self, model: nn.Module, projected: bool = False) -> None:
        super().__init__()
        self.model = model
        self.projected = projected

    def forward(
        self, input_ids, attention_mask=None, token_type_ids=None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from hf_mlcl.modeling.layers_mlcl import pool_states

        states, mask, segment = self.model.encode_tokens(input_ids, attention_mask, token_type_ids)
        pooled = pool_states(states, mask, self.model.config.pooling, segment)
        return states, self.model.projection_head(pooled) if self.projected else pooled


def _load(folder: str) -> tuple[nn.Module, str]:
    """The folder's model with hf_mlcl's loaders (every format it writes) and its kind."""
    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification
    from hf_mlcl.modeling.builders import holds_an_encoder

    if holds_an_encoder(folder):
        return MLCLEncoder.from_pretrained(folder), "encoder"
    return MLCLForMultiLabelClassification.from_pretrained(folder), "classifier"


def _save(program: Any, path: str) -> None:
    """Save the exported ``program`` as ``path`` and, for a model over 2 GB, the external data file beside it
    that ``path`` names (``model.onnx.data``): written in a temporary folder beside ``path`` and moved in, the
    data first, so an interrupted export leaves no half-written model and no temporary names inside it. A staging
    folder a killed export left behind is removed first."""
    import shutil
    import tempfile

    from hf_mlcl.files import TMP_PREFIX

    folder = os.path.dirname(path)
    for name in os.listdir(folder):
        if name.startswith(TMP_PREFIX):
            shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
    staging = tempfile.mkdtemp(dir=folder, prefix=TMP_PREFIX)
    try:
        program.save(os.path.join(staging, os.path.basename(path)))
        names = sorted(os.listdir(staging), key=lambda name: name == os.path.basename(path))
        for name in names:
            os.replace(os.path.join(staging, name), os.path.join(folder, name))
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def export_onnx(folder: str, opset: int = 18) -> dict[str, Any]:
    """Write ``folder/onnx/model.onnx``: the folder's classifier (output ``logits``, after ``last_hidden_state``
    for a sentence-transformers folder, whose ONNX backend reads the token states) or encoder (outputs
    ``last_hidden_state`` and ``sentence_embedding``, the folder's sentence embedding), with inputs named as its
    tokenizer's and a dynamic batch and sequence length, in float32 on the CPU, exported by ``torch.onnx.export``.

    Args:
        folder: a classifier or encoder folder hf_mlcl wrote (any of its formats), with its tokenizer.
        opset: the ONNX opset.

    Returns:
        ``{"path", "kind", "inputs", "outputs"}``.

    Raises:
        FileNotFoundError: no such folder.
        ImportError: the ``onnx`` extra (onnx, onnxscript) is not installed.
        ValueError: a folder without its tokenizer, a segmented (PLM-ICD) model, whose document-by-chunks
            encoding has no export, or an opset the exporter cannot write.
    """
    from transformers import AutoTokenizer

    from hf_mlcl.modeling.builders import folder_layout, holds_a_tokenizer, native_settings, require_a_model
    from hf_mlcl.modeling.native_mlcl import SENTENCE_TRANSFORMERS

    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no model folder {folder!r}")
    require_a_model(folder)
    # without a tokenizer transformers would make an empty one, whose inputs the graph would take
    if not holds_a_tokenizer(folder):
        raise ValueError(
            f"{folder} holds no tokenizer (tokenizer.json or tokenizer_config.json), which names the graph's "
            "inputs: save the model's tokenizer into it first; nothing written"
        )
    try:
        import onnx.defs
        import onnxscript  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"exporting to ONNX needs the onnx extra: pip install -e '.[onnx]' in the repository ({err})"
        ) from err
    newest = onnx.defs.onnx_opset_version()
    if not 1 <= opset <= newest:
        raise ValueError(f"--opset {opset}: the installed onnx knows opsets 1 to {newest}; nothing written")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model, kind = _load(folder)
    if getattr(model.config, "segmented", False):
        raise ValueError(f"{folder} holds a segmented (PLM-ICD) model, which has no ONNX export")
    model = model.float().to("cpu").eval()
    sample = tokenizer(["an example text to trace", "short"], padding=True, return_tensors="pt")
    inputs = tuple(name for name in _TEXT_INPUTS if name in sample)
    if kind == "classifier":  # a sentence-transformers folder: the token states its ONNX backend reads, too
        states = folder_layout(folder) == SENTENCE_TRANSFORMERS
        wrapper = _Classifier(model, states).eval()
        outputs = ["last_hidden_state", "logits"] if states else ["logits"]
    else:
        projected = (native_settings(folder) or {}).get("embedding") == "projected"
        wrapper = _Encoder(model, projected).eval()
        outputs = ["last_hidden_state", "sentence_embedding"]
    batch, length = torch.export.Dim("batch"), torch.export.Dim("sequence")
    path = os.path.join(folder, ONNX_FILE)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with torch.no_grad():
        program = torch.onnx.export(
            wrapper,
            (),
            kwargs={name: sample[name] for name in inputs},
            input_names=list(inputs),
            output_names=outputs,
            dynamic_shapes={name: {0: batch, 1: length} for name in inputs},
            opset_version=opset,
            dynamo=True,
            verbose=False,
        )
    written = program.model.opset_imports.get("")
    if written != opset:  # torch exports at its own opset and converts; a failed conversion keeps its own
        raise ValueError(
            f"--opset {opset}: torch's ONNX exporter could only write opset {written}; nothing written"
        )
    _save(program, path)
    return {"path": path, "kind": kind, "inputs": list(inputs), "outputs": outputs}
