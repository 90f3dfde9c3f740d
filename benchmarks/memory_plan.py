"""Predicted peak accelerator memory of a recipe's training stage, from its shapes alone, and its CPU check.

``python benchmarks/memory_plan.py RECIPE.yaml [--config CONFIG.json] [--gpu-gib 80] [--compare]
[--key value ...]`` reads the recipe (``_base_`` resolved by :func:`hf_mlcl.recipes.load_recipe`; overrides
as ``hf-mlcl run`` takes them), the base model's shapes (``--config``, else :data:`BUILTIN_SHAPES`), and
prints the peak of one optimizer step of the first stage that trains the encoder (stage 1, the joint
objective or a fine-tune) by component, with a verdict against ``--gpu-gib``. ``--compare`` adds the
plain-process GPU cells recorded in ``benchmarks/results/*/llama_lora.json`` beside their prediction.

:func:`predict` is the model (plain arithmetic, no torch); :func:`storage_peak` (a ``StoragePeak``
dispatch mode) and :func:`measure_cpu_peak` measure the peak of live tensor bytes of stage-1 steps of a
tiny model on the CPU (``ContrastiveTrainer`` as ``hf-mlcl run`` builds it); tests/test_memory_plan.py
compares the two.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import sys
import weakref
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/: the measurements package
from measurements import shapes  # noqa: E402  (the published shapes, torch-free)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 1024**3

# The bases of the shipped recipes, for a Hub model that is not available offline (their published configs)
BUILTIN_SHAPES: dict[str, dict[str, Any]] = {
    "meta-llama/Llama-3.1-8B": {"model_type": "llama", "tie_word_embeddings": False, **shapes.LLAMA_31_8B},
    "FacebookAI/roberta-base": dict(shapes.ROBERTA_BASE),
}
DECODERS = ("llama", "mistral", "qwen2", "qwen3")
ENCODERS = ("bert", "roberta", "xlm-roberta")
LORA_DEFAULT_TARGETS = {
    "decoder": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "encoder": ["query", "key", "value", "dense"],
}
# Defaults of the argument dataclasses (hf_mlcl/training/model_data_arguments.py, stage_arguments.py and
# transformers' TrainingArguments) for keys a recipe leaves out; tests/test_memory_plan.py checks them.
DEFAULTS: dict[str, Any] = {
    "use_lora": False,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.1,
    "lora_target_modules": None,
    "projection_dim": 256,
    "projection_hidden_dim": None,
    "max_length": 512,
    "per_device_train_batch_size": 8,
    "gradcache_chunk_size": 0,
    "activation_checkpointing": None,  # transformers: None = off
    "activation_checkpointing_kwargs": None,
    "queue_size": 0,
    "n_views": 1,
    "bf16": False,
    "probe": "linear",
}
# Allowances (bytes), stated rather than derived: the CUDA context and kernels that torch's allocator does
# not count, and the caching allocator's slack over the allocated peak (the upper end of the reserved /
# allocated ratios in benchmarks/results/*/llama_lora.json).
CUDA_CONTEXT = 0.75 * GIB
ALLOCATOR_SLACK = 0.08
# Copies of the (anchors x candidates) matrices a contrastive loss holds at once (logits, exp / softmax,
# log-probabilities, positive weights, masks and their gradients), each of fp32.
LOSS_MATRIX_COPIES = 8


# ------------------------------------------------------------------------------------------ settings
def _value(text: str) -> Any:
    import yaml

    return yaml.safe_load(text) if text != "" else True


def resolve_settings(recipe_path: str, tokens: list[str]) -> dict[str, Any]:
    """The settings of the recipe's training stage: its top-level keys, its stage section, then the
    ``--key value`` / ``--stage.key value`` overrides (an unprefixed key lands where the recipe has it,
    else in the stage), then :data:`DEFAULTS`. Adds ``stage`` (the stage the prediction is for)."""
    from hf_mlcl.recipes import load_recipe, recipe_stages

    recipe = load_recipe(recipe_path)
    stages = recipe_stages(recipe)
    stage = next(
        (
            s
            for s in stages
            if s in ("contrastive", "joint") or (recipe.get(s) or {}).get("probe") == "finetune"
        ),
        stages[0],
    )
    settings = {**DEFAULTS, **{k: v for k, v in recipe.items() if not isinstance(v, dict)}}
    settings.update(recipe.get(stage) or {})
    i = 0
    while i < len(tokens):
        key = tokens[i]
        if not key.startswith("--"):
            raise SystemExit(f"override {key!r} is not --key value")
        value = tokens[i + 1] if i + 1 < len(tokens) and not tokens[i + 1].startswith("--") else ""
        i += 2 if value != "" else 1
        name = key[2:]
        if "." in name:
            where, name = name.split(".", 1)
            if where != stage:
                continue
        settings[name] = _value(value)
    settings["stage"] = stage
    return settings


def load_shape(settings: dict[str, Any], config_path: str | None) -> dict[str, Any]:
    """The base model's config: ``config_path`` (a transformers config.json), else :data:`BUILTIN_SHAPES`
    by the recipe's ``model_name_or_path``, else the config.json in that folder."""
    if config_path:
        with open(config_path, encoding="utf-8") as f:
            return json.load(f)
    name = str(settings.get("model_name_or_path"))
    if name in BUILTIN_SHAPES:
        return dict(BUILTIN_SHAPES[name])
    local = os.path.join(name, "config.json")
    if os.path.isfile(local):
        with open(local, encoding="utf-8") as f:
            return json.load(f)
    raise SystemExit(f"no shapes for {name!r}: pass --config CONFIG.json (a transformers config.json)")


# ------------------------------------------------------------------------------------------ the model
@dataclasses.dataclass
class Component:
    name: str
    bytes: float
    how: str


def _family(shape: dict[str, Any]) -> str:
    kind = shape.get("model_type", "llama")
    if kind in DECODERS:
        return "decoder"
    if kind in ENCODERS:
        return "encoder"
    raise SystemExit(f"model_type {kind!r} is not modelled; known: {DECODERS + ENCODERS}")


def _dims(shape: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    d, layers = int(shape["hidden_size"]), int(shape["num_hidden_layers"])
    heads = int(shape["num_attention_heads"])
    kv = int(shape.get("num_key_value_heads") or heads) * (d // heads)
    return d, layers, heads, kv, int(shape["intermediate_size"]), int(shape["vocab_size"])


def _linears(shape: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) of every linear layer of one block, by module name."""
    d, _, _, kv, inter, _ = _dims(shape)
    if _family(shape) == "decoder":
        heads = shape["num_attention_heads"]
        return shapes.decoder_linears(
            {**shape, "num_key_value_heads": shape.get("num_key_value_heads") or heads}
        )
    # BERT / RoBERTa: attention.self.{query,key,value}, attention.output.dense, intermediate.dense,
    # output.dense ("dense" matches the last three)
    return {
        "query": (d, d),
        "key": (d, d),
        "value": (d, d),
        "dense": (d, d),
        "dense#i": (d, inter),
        "dense#o": (inter, d),
    }


def backbone_parameters(shape: dict[str, Any]) -> int:
    """Parameters of the ``AutoModel`` backbone (no language-model head: the encoder pools hidden states)."""
    d, layers, _, _, inter, vocab = _dims(shape)
    lin = _linears(shape)
    if _family(shape) == "decoder":
        per_layer = sum(i * o for i, o in lin.values()) + 2 * d  # two RMSNorm weights
        bias = sum(o for _, o in lin.values()) if shape.get("attention_bias") else 0
        return vocab * d + layers * (per_layer + bias) + d
    per_layer = sum(i * o + o for i, o in lin.values()) + 4 * d  # weights, biases, two LayerNorms
    positions = int(shape.get("max_position_embeddings", 512)) * d
    types = int(shape.get("type_vocab_size", 2)) * d
    pooler = d * d + d if shape.get("add_pooling_layer", True) else 0
    return vocab * d + positions + types + 2 * d + layers * per_layer + pooler


def lora_parameters(shape: dict[str, Any], r: int, targets: list[str]) -> tuple[int, int]:
    """(LoRA parameters, summed input width of the adapted layers of one block): A is r x in, B out x r."""
    n = width = 0
    for name, (i, o) in _linears(shape).items():
        if name.split("#")[0] in targets:
            n += r * (i + o)
            width += i
    return int(shape["num_hidden_layers"]) * n, width


def layer_saved_bytes(shape: dict[str, Any], s: dict[str, Any], seq: int) -> tuple[float, float]:
    """(bytes one block keeps for its backward per token, bytes of its input per token).

    Tensors saved by autograd in one block (``a`` = bytes of an activation: 2 under bf16 autocast, 4 in
    fp32): each norm its fp32 input (under autocast a copy; in fp32 the block's input or the middle
    residual), the fp32 1/rms and its output (the normalised product too when the norm weight trains);
    SDPA's fused kernel q, k, v (after RoPE), its output (o_proj's input) and the fp32 log-sum-exp per
    head; the MLP's gate, silu(gate), up and their product; per adapted layer LoRA A's output, and its
    input when peft's fp32 cast (under autocast: then cast to bf16) or dropout (with its 1-byte mask, as
    CUDA's fused dropout; CPU's unfused dropout keeps a float mask) makes a new tensor.
    """
    d, _, heads, kv, inter, _ = _dims(shape)
    bf16 = s["bf16"]
    a = 2 if bf16 else 4
    frozen_norm = bool(s["use_lora"])
    norm = (4 * d if bf16 else 0) + 4 + a * d + (0 if frozen_norm else a * d)
    if _family(shape) == "decoder":
        attention = a * (d + 2 * kv) + a * d + 4 * heads
        residual = 0 if bf16 else 4 * d  # the middle residual, saved by the fp32 second norm
        mlp = 4 * a * inter
    else:
        attention = a * 3 * d + a * d + 4 * heads + a * d + d  # q, k, v, out, lse, dense input, dropout mask
        residual = 0 if bf16 else 4 * d
        mlp = 2 * a * inter + a * d + 2 * d  # dense output and GELU output, output dense, dropout masks
    lora = 0.0
    if s["use_lora"]:
        _, width = lora_parameters(shape, int(s["lora_r"]), s["lora_targets"])
        n_targets = sum(1 for n in _linears(shape) if n.split("#")[0] in s["lora_targets"])
        dropout = float(s["lora_dropout"]) > 0
        copies = bf16 or dropout
        lora = width * ((a if copies else 0) + (1 if dropout else 0)) + n_targets * int(s["lora_r"]) * a
    return norm * 2 + attention + residual + mlp + lora, a * d


def _backward_workspace(shape: dict[str, Any], s: dict[str, Any]) -> float:
    """Bytes per token alive in a block's backward beyond what it saved: two MLP-wide gradients (of the
    product and of one factor) and the hidden-size gradient flowing down."""
    d, _, _, _, inter, _ = _dims(shape)
    a = 2 if s["bf16"] else 4
    return 2 * a * inter + a * d


def _forward_workspace(shape: dict[str, Any], s: dict[str, Any]) -> float:
    """Bytes per token of a block's forward without gradient (the key encoder, GradCache's first pass):
    the block's input and residual and its widest live tensors (gate, up, silu(gate), product)."""
    d, _, _, _, inter, _ = _dims(shape)
    a = 2 if s["bf16"] else 4
    return 4 * a * inter + 4 * a * d + (8 * d if s["bf16"] else 0)


def predict(settings: dict[str, Any], shape: dict[str, Any]) -> dict[str, Any]:
    """The predicted peak (bytes) of one optimizer step of ``settings['stage']`` by component."""
    s = dict(settings)
    family = _family(shape)
    s["lora_targets"] = list(s.get("lora_target_modules") or LORA_DEFAULT_TARGETS[family])
    stage = s["stage"]
    contrastive = stage in ("contrastive", "joint")
    finetune = stage == "joint" or s.get("probe") == "finetune"
    d, layers, heads, _, _, _ = _dims(shape)
    batch, seq = int(s["per_device_train_batch_size"]), int(s["max_length"])
    chunk = int(s.get("gradcache_chunk_size") or 0) if contrastive else 0
    rows = min(chunk, batch) if chunk > 0 else batch
    ckpt = bool(s["activation_checkpointing"])
    # activation_checkpointing_kwargs {every_n_layers: k}: transformers checkpoints the layers i % k == 0 only
    every = int((s.get("activation_checkpointing_kwargs") or {}).get("every_n_layers", 1)) if ckpt else 1
    proj_dim = int(s["projection_dim"])
    proj_hidden = int(s.get("projection_hidden_dim") or d)
    num_labels = int(s.get("num_labels", 54))  # --num_labels; 54: AAPD
    lora = bool(s["use_lora"])
    # apply_lora casts the backbone to bf16 (bf16 recipes); without LoRA the weights stay fp32 (autocast)
    weight_bytes = 2 if (lora and s["bf16"]) else 4
    n_base = backbone_parameters(shape)
    # stage 1 trains the projection head; a fine-tune (probe: finetune, joint) the classifier on the pooled output
    heads_n = proj_hidden * d + proj_hidden + proj_hidden * proj_dim + proj_dim
    if finetune:
        heads_n = d * num_labels + num_labels
    n_lora, _ = lora_parameters(shape, int(s["lora_r"]), s["lora_targets"]) if lora else (0, 0)
    n_train = n_lora + heads_n if lora else n_base + heads_n
    parts: list[Component] = []
    if lora:
        parts.append(
            Component(
                "frozen base weights",
                n_base * weight_bytes + heads_n * 4,
                f"{n_base / 1e6:.1f} M x {weight_bytes} B + the heads' frozen fp32 copy (peft modules_to_save)",
            )
        )
    parts.append(
        Component(
            "trainable parameters",
            n_train * 4,
            f"{n_train / 1e6:.2f} M fp32 ({'LoRA ' + str(n_lora / 1e6) + ' M + ' if lora else 'backbone + '}heads)",
        )
    )
    parts.append(Component("gradients", n_train * 4, "fp32, one per trainable parameter"))
    parts.append(Component("AdamW states", n_train * 8, "exp_avg + exp_avg_sq, fp32"))
    queue = int(s.get("queue_size") or 0) if contrastive else 0
    if queue:
        labels = 4 * num_labels
        parts.append(
            Component(
                "momentum encoder + queue",
                n_train * 4 + queue * (4 * proj_dim + labels),
                f"EMA copy of the trainable parameters (fp32) + {queue} keys x {proj_dim} + their labels",
            )
        )
    saved, block_input = layer_saved_bytes(shape, s, seq)
    tokens = rows * seq
    # in fp32 the first norm saves the block's input itself; under autocast its fp32 copy (in ``saved``)
    kept = saved + (0 if s["bf16"] else block_input)
    checked = [ckpt and i % every == 0 for i in range(layers)]
    checkpointed = sum(checked)
    # backward runs from the top block down: a checkpointed block recomputes its saved tensors once the blocks
    # above it have freed theirs, so it adds to the stored peak only what those freed tensors do not cover
    recompute, freed = 0, 0
    for is_checked in reversed(checked):
        if is_checked:
            recompute = max(recompute, saved - freed)
        freed += block_input if is_checked else kept
    acts = checkpointed * block_input + (layers - checkpointed) * kept + recompute
    if checkpointed == layers:
        how = f"{layers} block inputs + one block recomputed, {rows} rows x {seq} tokens"
    elif checkpointed:
        how = (
            f"{checkpointed} checkpointed block inputs (one block in {every}) + one recomputed + "
            f"{layers - checkpointed} blocks' saved tensors, {rows} rows x {seq} tokens"
        )
    else:
        how = f"{layers} blocks' saved tensors, {rows} rows x {seq} tokens"
    a = 2 if s["bf16"] else 4
    # the last block's output and the final norm's saved tensors (outside the checkpointed blocks)
    final = a * d + (4 * d if s["bf16"] else 0) + 4 + a * d
    acts = tokens * (acts + final + _backward_workspace(shape, s))
    parts.append(Component("activations", acts, how + " + the backward's gradient workspace of one block"))
    if chunk > 0:
        parts.append(
            Component(
                "GradCache cache",
                3 * batch * proj_dim * 4,
                f"the ({batch}, {proj_dim}) embeddings, their gradient and the chunks' outputs, fp32",
            )
        )
    if contrastive:
        candidates = batch * int(s.get("n_views") or 1) + queue
        parts.append(
            Component(
                "loss matrices",
                LOSS_MATRIX_COPIES * batch * candidates * 4 + 3 * batch * candidates * 4,
                f"{LOSS_MATRIX_COPIES} fp32 ({batch} x {candidates}) similarity-sized matrices + label overlaps",
            )
        )
    if finetune:
        parts.append(
            Component("logits", 4 * batch * num_labels * 4, f"({batch}, {num_labels}) logits, probs, grads")
        )
    static = sum(p.bytes for p in parts if p.name not in ("activations",))
    # the key encoder's forward runs over the whole batch without gradient before the step's graph exists
    key_forward = batch * seq * _forward_workspace(shape, s) if queue else 0.0
    allocated = static + max(acts, key_forward)
    if key_forward > acts:
        parts.append(
            Component(
                "key-forward excess",
                key_forward - acts,
                "the momentum encoder's no-grad forward of the whole batch outgrows the step's activations",
            )
        )
    device_total = allocated * (1 + ALLOCATOR_SLACK) + CUDA_CONTEXT
    return {
        "stage": stage,
        "parts": parts,
        "allocated": allocated,
        "device_total": device_total,
        "n_base": n_base,
        "n_train": n_train,
        "rows_per_pass": rows,
        "heads": heads,
    }


# ------------------------------------------------------------------------------------------ speed levers
CHECKPOINT_EVERY = (None, 8, 4, 3, 2, 1)  # every_n_layers tried (None: no activation checkpointing)


def forward_units(settings: dict[str, Any], layers: int) -> float:
    """The work of a training step in forwards of the model: 1 forward + 2 for the backward, plus the share of
    the layers activation checkpointing recomputes, plus GradCache's no-grad forward of the whole batch."""
    units = 3.0
    if settings["activation_checkpointing"]:
        every = int((settings.get("activation_checkpointing_kwargs") or {}).get("every_n_layers", 1))
        units += -(-layers // every) / layers
    return units + (1.0 if int(settings.get("gradcache_chunk_size") or 0) > 0 else 0.0)


def fastest_fitting(settings: dict[str, Any], shape: dict[str, Any], gpu_gib: float) -> dict[str, Any] | None:
    """The lever settings of ``settings`` with the least work (:func:`forward_units`) whose predicted device
    total fits ``gpu_gib``: LoRA dropout 0 (no dropout copy of the adapted inputs), activation checkpointing
    off or on every k-th layer (:data:`CHECKPOINT_EVERY`), GradCache off or at the recipe's chunk; a tie goes to
    the smaller peak. Returns the overrides with ``units`` and ``plan`` (:func:`predict`), None if none fits."""
    layers = _dims(shape)[1]
    chunks = sorted({0, int(settings.get("gradcache_chunk_size") or 0)})
    best = None
    for every in CHECKPOINT_EVERY:
        for chunk in chunks:
            levers = {
                "lora_dropout": 0.0,
                "activation_checkpointing": every is not None,
                "activation_checkpointing_kwargs": {"every_n_layers": every} if every else None,
                "gradcache_chunk_size": chunk,
            }
            trial = {**settings, **levers}
            plan = predict(trial, shape)
            if plan["device_total"] > gpu_gib * GIB:
                continue
            key = (forward_units(trial, layers), plan["device_total"])
            if best is None or key < best[0]:
                best = (key, {**levers, "units": key[0], "plan": plan})
    return None if best is None else best[1]


# ------------------------------------------------------------------------------------------ measurement
def _storage_peak_class():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class StoragePeak(TorchDispatchMode):
        """Peak of the bytes of live tensor storages: every storage an op returns is counted once, from
        its first sight until ``weakref.finalize`` on the storage fires (torch keeps one Python object per
        storage while the storage lives). Storages made before the mode are registered with
        :meth:`adopt`, so an in-place op returning them does not count them again."""

        def __init__(self) -> None:
            super().__init__()
            self.live = 0
            self.peak = 0
            self._sizes: dict[int, int] = {}

        def _free(self, key: int) -> None:
            self.live -= self._sizes.pop(key, 0)

        def _see(self, t: Any) -> None:
            if not isinstance(t, torch.Tensor) or t.layout != torch.strided or t.device.type == "meta":
                return
            storage = t.untyped_storage()
            key, size = id(storage), storage.nbytes()
            if key not in self._sizes:
                self._sizes[key] = 0
                weakref.finalize(storage, self._free, key)
            self.live += size - self._sizes[key]  # new, or resized in place
            self._sizes[key] = size
            self.peak = max(self.peak, self.live)

        def adopt(self, tensors: Any) -> None:
            for t in tensors:
                self._see(t)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                self._see(t)
            return out

    return StoragePeak


def storage_peak() -> Any:
    """A new :class:`StoragePeak` tracker (the class is built on first use: the prediction needs no torch)."""
    return _storage_peak_class()()


def measure_cpu_peak(
    recipe_path: str, tokens: list[str], shape: dict[str, Any], num_labels: int = 54, steps: int = 2
) -> dict[str, Any]:
    """Peak live tensor bytes (:class:`StoragePeak`) of ``steps`` optimizer steps of the recipe's stage 1
    on the CPU with a random-init backbone of ``shape`` (a transformers config dict), built and trained as
    ``hf-mlcl run`` does: the stage's arguments parsed from the recipe and ``tokens``, ``MLCLEncoder``,
    ``with_lora``, ``ContrastiveTrainer`` (activation checkpointing and GradCache as the arguments say).
    The model's own tensors count from the start; rows are random tokens without padding."""
    import tempfile

    import torch
    from transformers import AutoConfig, set_seed

    from hf_mlcl.modeling import MLCLEncoder
    from hf_mlcl.modeling.builders import with_lora
    from hf_mlcl.recipes import load_recipe, parse_stage, split_overrides
    from hf_mlcl.training import ContrastiveTrainer

    recipe = load_recipe(recipe_path)
    with tempfile.TemporaryDirectory() as out:
        run = [
            *tokens,
            *("--max_steps", str(steps), "--save_strategy", "no", "--logging_strategy", "no"),
            *("--report_to", "none", "--disable_tqdm", "true", "--dataloader_num_workers", "0"),
            *("--use_cpu", "true", "--knn_k", "0", "--seed", "0"),
        ]
        model_args, _, targs = parse_stage(
            recipe, "contrastive", split_overrides(run, ["contrastive"]), output_dir=out
        )
        set_seed(0)
        config = AutoConfig.for_model(**shape)
        extra = (
            {"projection_hidden_dim": model_args.projection_hidden_dim}
            if model_args.projection_hidden_dim
            else {}
        )
        model = MLCLEncoder.from_backbone(
            config, pooling=model_args.pooling, projection_dim=model_args.projection_dim, **extra
        )
        if model_args.use_lora:
            model = with_lora(model, model_args)
        n = targs.per_device_train_batch_size * steps
        seq = int(recipe.get("max_length", DEFAULTS["max_length"]))
        seq = int(dict(zip(run[::2], run[1::2])).get("--max_length", seq))
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(5, int(shape["vocab_size"]), (n, seq), generator=g)
        labels = (torch.rand(n, num_labels, generator=g) < 0.1).float()
        labels[torch.arange(n), torch.randint(0, num_labels, (n,), generator=g)] = 1.0
        mask = torch.ones(seq, dtype=torch.long)
        rows = [{"input_ids": ids[i], "attention_mask": mask, "labels": labels[i]} for i in range(n)]

        def collate(batch: list[dict[str, Any]]) -> dict[str, Any]:
            return {k: torch.stack([r[k] for r in batch]) for k in batch[0]}

        tracker = storage_peak()
        tracker.adopt([*model.parameters(), *model.buffers()])
        model_bytes = tracker.live
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # toy-sized ops: threads only contend on a shared machine
        try:
            with tracker:
                trainer = ContrastiveTrainer(
                    model=model, args=targs, train_dataset=rows, data_collator=collate, num_labels=num_labels
                )
                trainer.train()
        finally:
            torch.set_num_threads(threads)
        return {"peak": tracker.peak, "model_bytes": model_bytes, "settings": targs}


# ------------------------------------------------------------------------------------------ recorded cells
def recorded_cells(pattern: str = os.path.join(REPO, "benchmarks", "results", "*", "llama_lora.json")):
    """``(device, cell, figures)`` of every plain-process cell measured on a GPU (status ok)."""
    out = []
    for path in sorted(glob.glob(pattern)):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if data.get("tiny") or data.get("device", {}).get("kind") != "cuda":
            continue
        for name, cell in data.get("cells", {}).items():
            figures = cell.get("figures") or {}
            if cell.get("launcher") == "plain" and cell.get("status") == "ok" and "peak_memory" in figures:
                out.append((data["device"]["name"], name, figures))
    return out


def cell_tokens(figures: dict[str, Any]) -> list[str]:
    """The overrides that give a recorded cell's settings (benchmarks/measurements/llama_lora.py runs the
    recipe at its batch and length with the cell's GradCache chunk and queue, bf16)."""
    tokens = [
        *("--per_device_train_batch_size", str(figures["per_device_batch"])),
        *("--max_length", str(figures["seq_len"]), "--bf16", "true"),
        *("--activation_checkpointing", str(bool(figures["activation_checkpointing"])).lower()),
        *("--num_labels", str(figures["num_labels"])),
        *("--lora_dropout", str(figures["lora"]["dropout"])),
    ]
    if figures.get("every_n_layers", 1) > 1:
        tokens += [
            "--activation_checkpointing_kwargs",
            json.dumps({"every_n_layers": figures["every_n_layers"]}),
        ]
    if figures["recipe"].endswith("bce.yaml"):
        return tokens
    return [
        *tokens,
        "--gradcache_chunk_size",
        str(figures["gradcache_chunk_size"]),
        "--queue_size",
        str(figures["queue_size"]),
    ]


def predict_cell(figures: dict[str, Any]) -> dict[str, Any]:
    settings = resolve_settings(os.path.join(REPO, figures["recipe"]), cell_tokens(figures))
    return predict(settings, BUILTIN_SHAPES["meta-llama/Llama-3.1-8B"])


# ------------------------------------------------------------------------------------------ command line
def _gib(n: float) -> str:
    return f"{n / GIB:7.2f} GiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe")
    parser.add_argument("--config", help="a transformers config.json with the base model's shapes")
    parser.add_argument("--gpu-gib", type=float, default=80.0, help="the accelerator's memory (GiB)")
    parser.add_argument(
        "--compare", action="store_true", help="also the recorded GPU cells (llama_lora.json)"
    )
    parser.add_argument(
        "--fastest",
        action="store_true",
        help="also the levers with the least work that fit --gpu-gib (checkpointing, GradCache, LoRA dropout)",
    )
    args, overrides = parser.parse_known_args(argv)
    settings = resolve_settings(args.recipe, overrides)
    shape = load_shape(settings, args.config)
    plan = predict(settings, shape)
    s = settings
    print(
        f"{args.recipe}: stage {plan['stage']}, batch {s['per_device_train_batch_size']} x {s['max_length']} tokens, "
        f"{'bf16' if s['bf16'] else 'fp32'}, activation checkpointing {'on' if s['activation_checkpointing'] else 'off'}, "
        f"GradCache chunk {s.get('gradcache_chunk_size') or 0}, queue {s.get('queue_size') or 0}, "
        f"LoRA {'r ' + str(s['lora_r']) if s['use_lora'] else 'off'}"
    )
    for part in plan["parts"]:
        print(f"  {part.name:<26}{_gib(part.bytes)}  {part.how}")
    print(f"  {'= allocated peak':<26}{_gib(plan['allocated'])}  (torch.cuda.max_memory_allocated)")
    extra = plan["device_total"] - plan["allocated"]
    print(
        f"  {'+ framework allowance':<26}{_gib(extra)}  CUDA context {CUDA_CONTEXT / GIB:.2f} GiB + "
        f"{ALLOCATOR_SLACK:.0%} caching-allocator slack"
    )
    total = plan["device_total"]
    verdict = "fits" if total <= args.gpu_gib * GIB else "does NOT fit"
    print(f"verdict: {total / GIB:.1f} GiB predicted {verdict} a {args.gpu_gib:g} GiB GPU")
    if args.fastest:
        best = fastest_fitting(settings, shape, args.gpu_gib)
        if best is None:
            print(f"fastest that fits: none of the levers fits a {args.gpu_gib:g} GiB GPU")
        else:
            every = (best["activation_checkpointing_kwargs"] or {}).get("every_n_layers")
            print(
                f"fastest that fits: lora_dropout 0, activation checkpointing "
                f"{'every ' + str(every) + ' layers' if every and every > 1 else 'on every layer' if every else 'off'}, "
                f"GradCache chunk {best['gradcache_chunk_size']}: {best['units']:.2f} forwards a step "
                f"(now {forward_units(settings, _dims(shape)[1]):.2f}), {best['plan']['device_total'] / GIB:.1f} GiB"
            )
    if args.compare:
        print("recorded plain-process GPU cells (benchmarks/results/*/llama_lora.json), allocated peak:")
        for device, name, figures in recorded_cells():
            predicted = predict_cell(figures)["allocated"] / GIB
            measured = figures["peak_memory"]["allocated_gib"]
            print(
                f"  {device} {name:<18} predicted {predicted:6.2f} GiB, measured {measured:6.2f} GiB "
                f"({predicted / measured - 1:+.0%})"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
