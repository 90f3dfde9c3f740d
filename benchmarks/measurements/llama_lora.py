"""``llama_lora``: Llama-3.1-8B + LoRA at the AAPD recipe's shapes, under three launchers.

Random-weight Llama-3.1-8B, the recipes ``recipes/aapd/llama-3.1-8b-lora/{sd,msc,bce}.yaml``; each cell
trains, then checks that the saved adapter reloads to the trained outputs. MFU / HFU from
:func:`flops_per_token` and :func:`hardware_flops_per_token`.

Method: docs/benchmarks.md, "Llama-3.1-8B + LoRA (benchmarks/measurements/llama_lora.py)"
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import time
from typing import Any

from .common import LLAMA_31_8B, LLAMA_TINY, REPO, Cell
from .shapes import decoder_linears

DESCRIPTION = (
    "Llama-3.1-8B + LoRA (AAPD recipes): stage 1 sd, stage 1 msc with momentum encoder and 4,096 queue, "
    "BCE LoRA fine-tune; plain process, accelerate FSDP (fsdp_llama_lora.yaml), DeepSpeed ZeRO-3 "
    "(deepspeed_zero3.yaml); one process each"
)
RECIPE_DIR = os.path.join("recipes", "aapd", "llama-3.1-8b-lora")
NUM_LABELS = 54  # AAPD
QUEUE = 4096
LAUNCHER_CONFIGS = {
    "fsdp": os.path.join("recipes", "accelerate", "fsdp_llama_lora.yaml"),
    "deepspeed": os.path.join("recipes", "accelerate", "deepspeed_zero3.yaml"),
}
# the fastest settings that fit a GPU (benchmarks/memory_plan.py fastest_fitting): an 80 GB H100 and a 141 GB
# H200 (the memory torch reports, GiB), less a tenth for the prediction's error
FIT_GIB = {"fit80": 79.6, "fit141": 139.8}
FIT_SAFETY = 0.9
_FSDP_ON_CPU = (
    "accelerate applies FSDP only on accelerator devices (AcceleratorState keeps MULTI_CPU for CPU "
    "processes), so on a CPU-only machine this cell would silently train without FSDP"
)


_LIGER_ON_CPU = "Liger-Kernel's kernels are Triton GPU kernels"


def fit_params(run: str, fit: str) -> dict[str, Any]:
    """The levers of ``run``'s recipe with the least work that fit ``FIT_GIB[fit]`` (less ``FIT_SAFETY``), as
    memory_plan.fastest_fitting predicts them at the cell's shapes: GradCache chunk, LoRA dropout and
    ``every_n_layers`` (0: activation checkpointing off)."""
    import sys

    benchmarks = os.path.join(REPO, "benchmarks")
    if benchmarks not in sys.path:
        sys.path.insert(0, benchmarks)
    import memory_plan

    tokens = ["--contrastive.queue_size", str(QUEUE)] if run == "msc" else []
    settings = memory_plan.resolve_settings(os.path.join(REPO, RECIPE_DIR, f"{run}.yaml"), tokens)
    shape = memory_plan.BUILTIN_SHAPES["meta-llama/Llama-3.1-8B"]
    best = memory_plan.fastest_fitting(settings, shape, FIT_SAFETY * FIT_GIB[fit])
    if best is None:
        raise ValueError(f"no lever setting of {run} is predicted to fit {FIT_GIB[fit]} GiB")
    every = (best["activation_checkpointing_kwargs"] or {}).get("every_n_layers", 1)
    return {
        "gradcache_chunk_size": best["gradcache_chunk_size"],
        "lora_dropout": best["lora_dropout"],
        "every_n_layers": every if best["activation_checkpointing"] else 0,
    }


def cells(tiny: bool) -> list[Cell]:
    """Priority order: the plain-process cells (the MFU goal; the ``-fit80`` / ``-fit141`` ones at the fastest
    settings predicted to fit an 80 GB / a 141 GB GPU), then FSDP, then ZeRO-3."""
    plan = [
        ("msc", "plain", "fit141"),
        ("sd", "plain", "fit141"),
        ("msc", "plain", "fit80"),
        ("sd", "plain", "fit80"),
        ("msc", "plain", "fit141-liger"),
        ("sd", "plain", "fit141-liger"),
        ("msc", "plain", None),
        ("msc", "plain", 0),
        ("sd", "plain", None),
        ("sd", "plain", 0),
        ("bce", "plain", None),
        ("sd", "fsdp", None),
        ("msc", "fsdp", None),
        ("bce", "fsdp", None),
        ("sd", "deepspeed", None),
        ("msc", "deepspeed", None),
        ("bce", "deepspeed", None),
    ]
    out = []
    for run, launcher, variant in plan:
        params: dict[str, Any] = {"run": run}
        cpu_reason = _FSDP_ON_CPU if launcher == "fsdp" else None
        if isinstance(variant, str):
            name = f"{run}-{launcher}-{variant}"
            fit, _, kernels = variant.partition("-")
            params.update(fit_params(run, fit))
            if kernels == "liger":  # Liger-Kernel's RMSNorm / SwiGLU / RoPE on the backbone
                params["use_liger_kernel"] = True
                cpu_reason = _LIGER_ON_CPU
        else:
            name = f"{run}-{launcher}" + ("-direct" if variant == 0 else "")
            if variant is not None:
                params["gradcache_chunk_size"] = variant
        out.append(
            Cell(
                name,
                launcher,
                params,
                timeout=300 if tiny else 900,
                cpu_reason=cpu_reason,
            )
        )
    return out


# ------------------------------------------------------------------------------------------ FLOPs
def lora_parameters(shape: dict[str, Any], r: int, targets: list[str]) -> int:
    """Parameters of rank-``r`` LoRA pairs (A: r x in, B: out x r) on the named Llama projections."""
    dims = decoder_linears(shape)
    return shape["num_hidden_layers"] * sum(r * (dims[t][0] + dims[t][1]) for t in targets)


def flops_per_token(
    shape: dict[str, Any], seq: int, r: int, targets: list[str], key_forward: bool
) -> dict[str, Any]:
    """Model FLOPs per trained token (module docstring); returns the total and its parts."""
    h, inter, layers = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"]
    kv = shape["num_key_value_heads"] * (h // shape["num_attention_heads"])
    dense = layers * (2 * h * h + 2 * h * kv + 3 * h * inter)
    n_lora = lora_parameters(shape, r, targets)
    forward = 2 * dense + 4 * layers * seq * h + 2 * n_lora
    total = 2 * forward + 2 * n_lora + (forward if key_forward else 0)
    return {
        "flops_per_token": total,
        "matmul_parameters": dense,
        "lora_parameters": n_lora,
        "forward_flops_per_token": forward,
        "formula": "2*(2N + 4*layers*seq*d + 2*N_lora) + 2*N_lora"
        + (" + forward (momentum keys)" if key_forward else ""),
    }


def hardware_flops_per_token(figures: dict[str, Any]) -> float:
    """FLOPs the device runs per trained token, from a cell's figures: the model FLOPs, plus one forward
    of the layers activation checkpointing recomputes in the backward, plus one when GradCache first
    encodes the whole batch without gradients (``gradcache_chunk_size`` > 0)."""
    checkpointed = int(bool(figures["activation_checkpointing"]))
    if figures.get("layers"):  # the share of the layers checkpointed (every_n_layers)
        checkpointed = figures["checkpointed_layers"] / figures["layers"]
    extra = checkpointed + int(bool(figures["gradcache_chunk_size"]))
    return figures["flops_per_token"] + extra * figures["forward_flops_per_token"]


# ------------------------------------------------------------------------------------- the base model
def base_folder(cache_dir: str, tiny: bool) -> str:
    """A folder with the random-init Llama backbone in bf16 (made once per cache folder)."""
    import torch
    from transformers import AutoModel, LlamaConfig

    from .common import device

    folder = os.path.join(cache_dir, "llama-tiny" if tiny else "llama-3.1-8b-random-bf16")
    if os.path.isfile(os.path.join(folder, "config.json")):
        return folder
    torch.manual_seed(0)
    config = LlamaConfig(**(LLAMA_TINY if tiny else LLAMA_31_8B))
    with torch.device(device()):
        model = AutoModel.from_config(config, dtype=torch.bfloat16)
    tmp = tempfile.mkdtemp(prefix=".llama-", dir=cache_dir)
    model.save_pretrained(tmp)
    os.replace(tmp, folder)
    del model
    gc.collect()
    return folder


# ----------------------------------------------------------------------------------------- one cell
def _wrapper_check(trainer, launcher: str) -> str:
    name = type(trainer.model_wrapped).__name__
    expected = {"fsdp": ("FullyShardedDataParallel", "FSDP"), "deepspeed": ("DeepSpeedEngine",)}.get(launcher)
    if expected is not None and not any(e in name for e in expected):
        raise RuntimeError(f"launcher {launcher} was asked for but the trained model is a {name}")
    if launcher == "plain" and any(e in name for e in ("FullyShardedDataParallel", "DeepSpeedEngine")):
        raise RuntimeError(f"plain launcher but the model is a {name}")
    return name


def _trainable_dtypes(model) -> dict[str, dict[str, int]]:
    """Tensors per dtype of the trainable parameters as the trained (wrapped) model holds them, the adapters
    (``lora_``) apart from the rest: whether an engine computed with bf16 adapters and heads, which a reload
    with fp32 adapters then computes differently."""
    out: dict[str, dict[str, int]] = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            kind = out.setdefault("lora" if "lora_" in name else "other", {})
            dtype = str(p.dtype).removeprefix("torch.")
            kind[dtype] = kind.get(dtype, 0) + 1
    return out


def _outputs(model, batch: dict, run: str, bf16: bool):
    import torch

    from .common import autocast

    model.eval()
    with torch.no_grad(), autocast(bf16):
        out = model(**batch)
    value = out["logits"] if run == "bce" else out["embeddings"]
    return value.float().cpu()


def _distance(a, b) -> dict[str, float]:
    import torch.nn.functional as F

    return {
        "max_abs_diff": float((a - b).abs().max()),
        "min_cosine": float(F.cosine_similarity(a, b, dim=-1).min()),
    }


def _trained_weights(trainer) -> dict[str, Any]:
    """The trainable parameters of the model as trained, gathered whole the way the save gathers them (every
    rank; fp32 copies on the CPU): what the saved adapter must hold."""
    from hf_mlcl.modeling.sharded import readable_state, unwrap_engine

    wrapped = trainer.model_wrapped
    params = dict(unwrap_engine(wrapped).named_parameters())
    names = [n for n, p in params.items() if p.requires_grad]
    with readable_state(wrapped, names, trainer.accelerator) as state:
        return {n: (params[n] if state is None else state[n]).detach().float().cpu().clone() for n in names}


def _weights_distance(model, trained: dict[str, Any]) -> dict[str, Any]:
    """Largest difference between the reloaded model's tensors and the trained ones, over every trained
    tensor (a missing one is counted): separates a wrong save from a forward that computes differently."""
    params = dict(model.named_parameters())
    missing = [n for n in trained if n not in params]
    diffs = [
        (float((params[n].detach().float().cpu() - t).abs().max()), float(t.abs().max()))
        for n, t in trained.items()
        if n in params
    ]
    return {
        "tensors": len(trained),
        "missing": len(missing),
        "missing_example": missing[:2],
        "max_abs_diff": max((d for d, _ in diffs), default=0.0),
        "max_rel_diff": max((d / m for d, m in diffs if m > 0), default=0.0),
    }


def _save_adapter(trainer, folder: str, base: str) -> None:
    """The adapter folder of a LoRA stage, through the library's save (every rank; gathers under
    FSDP / ZeRO-3; the main process writes)."""
    from hf_mlcl.modeling import save_lora_model

    save_lora_model(trainer.model_wrapped, folder, base, accelerator=trainer.accelerator)


def _reload_unmerged(folder: str, base: str, run_name: str, model_args, dtype, bf16: bool):
    """The saved adapter folder on a fresh base, with the LoRA layers kept apart (W x + s B A x, as in
    training): the adapter and head tensors read from the folder, so the outputs show whether the save
    holds the trained weights. (The library's ``from_pretrained`` merges B A into the base weights, which
    in bf16 rounds away updates smaller than the weights' resolution: reported as ``merged_load``.)"""
    import torch
    from safetensors.torch import load_file
    from transformers import set_seed

    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora
    from hf_mlcl.modeling.folders_mlcl import ADAPTER_WEIGHTS_NAME, HEADS_WEIGHTS_NAME

    from .common import device

    kwargs: dict[str, Any] = {"dtype": dtype}
    if device().type == "cuda":
        kwargs["device_map"] = {"": torch.cuda.current_device()}
    set_seed(0)
    model = MLCLEncoder.from_backbone(base, pooling=model_args.pooling, projection_dim=256, **kwargs)
    if run_name == "bce":
        model = MLCLForMultiLabelClassification.from_encoder(
            model, num_labels=NUM_LABELS, freeze_encoder=False
        )
    model = apply_lora(
        model,
        r=model_args.lora_r,
        alpha=model_args.lora_alpha,
        dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        gradient_checkpointing=False,
        bf16=bf16,
    )
    params = dict(model.named_parameters())
    saved = load_file(os.path.join(folder, ADAPTER_WEIGHTS_NAME))  # keys relative to the backbone
    lora = {n for n in params if ".lora_A." in n or ".lora_B." in n}
    prefix = "base_model.model."
    with torch.no_grad():
        for key, value in saved.items():
            name = prefix + "backbone." + key[len(prefix) :].replace(".weight", ".default.weight")
            params[name].copy_(value)
            lora.discard(name)
    if lora:
        raise RuntimeError(f"the saved adapter lacks {len(lora)} LoRA tensors, e.g. {sorted(lora)[:2]}")
    inner = model.base_model.model
    heads = load_file(os.path.join(folder, HEADS_WEIGHTS_NAME))
    for child in {k.split(".", 1)[0] for k in heads}:
        module = getattr(inner, child)
        target = module.modules_to_save["default"] if hasattr(module, "modules_to_save") else module
        target.load_state_dict(
            {k.split(".", 1)[1]: v for k, v in heads.items() if k.split(".", 1)[0] == child}
        )
    return model.to(device())


def run(cell: Cell, tiny: bool, cache_dir: str) -> dict[str, Any]:
    import torch
    from transformers import set_seed

    from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora
    from hf_mlcl.recipes import load_recipe
    from hf_mlcl.training import ContrastiveTrainer, ProbingTrainer

    from .common import (
        TIMED_RUN,
        StepProbe,
        device,
        peak_memory,
        random_token_rows,
        recipe_stage,
        reset_peak_memory,
        stack_rows,
        summary,
    )

    run_name, launcher = cell.params["run"], cell.launcher
    recipe_path = os.path.join(RECIPE_DIR, f"{run_name}.yaml")
    stage = "probe" if run_name == "bce" else "contrastive"
    recipe = load_recipe(os.path.join(REPO, recipe_path))
    section = recipe[stage]
    shape = LLAMA_TINY if tiny else LLAMA_31_8B
    warmup, steps = (1, 2) if tiny else (3, 5)
    batch = 4 if tiny else int(section["per_device_train_batch_size"])
    seq = 32 if tiny else int(recipe["max_length"])
    recipe_gradcache = int(section.get("gradcache_chunk_size", 0) or 0)
    gradcache = int(cell.params.get("gradcache_chunk_size", recipe_gradcache))
    notes: list[str] = []
    if tiny and gradcache:
        gradcache = 2
    if stage == "contrastive" and launcher == "deepspeed" and gradcache:
        notes.append("GradCache is not available under DeepSpeed: the batch runs in one pass")
        gradcache = 0
    bf16 = bool(section.get("bf16", True)) and device().type == "cuda"
    base = base_folder(cache_dir, tiny)
    out_root = tempfile.mkdtemp(prefix=f"{cell.name}-", dir=cache_dir)
    training: dict[str, Any] = {
        **TIMED_RUN,
        "max_steps": warmup + steps,
        "per_device_train_batch_size": batch,
        "bf16": bf16,
    }
    top: dict[str, Any] = {"model_name_or_path": base, "max_length": seq}
    if "lora_dropout" in cell.params:
        top["lora_dropout"] = cell.params["lora_dropout"]
    if cell.params.get("use_liger_kernel"):
        training["use_liger_kernel"] = True
    every = cell.params.get("every_n_layers")  # 0: no activation checkpointing; k: every k-th layer
    if every is not None:
        training["activation_checkpointing"] = every > 0
        if every > 1:
            training["activation_checkpointing_kwargs"] = json.dumps({"every_n_layers": every})
    if stage == "contrastive":
        training.update(knn_k=0, gradcache_chunk_size=gradcache)
        if run_name == "msc":
            training["queue_size"] = 16 if tiny else QUEUE
    else:
        training["load_best_model_at_end"] = False
    _, (model_args, _data_args, targs) = recipe_stage(recipe_path, stage, top, training, out_root)

    dtype = torch.bfloat16 if bf16 else torch.float32
    load_kwargs: dict[str, Any] = {"dtype": dtype}
    if launcher == "plain" and device().type == "cuda":
        load_kwargs["device_map"] = {"": torch.cuda.current_device()}
    set_seed(0)
    t0 = time.perf_counter()
    encoder = MLCLEncoder.from_backbone(base, pooling=model_args.pooling, projection_dim=256, **load_kwargs)
    model = encoder
    if run_name == "bce":
        model = MLCLForMultiLabelClassification.from_encoder(
            encoder, num_labels=NUM_LABELS, freeze_encoder=False
        )
    checkpointing = bool(targs.activation_checkpointing)
    model = apply_lora(
        model,
        r=model_args.lora_r,
        alpha=model_args.lora_alpha,
        dropout=model_args.lora_dropout,
        target_modules=model_args.lora_target_modules,
        gradient_checkpointing=checkpointing,
        bf16=bf16,
    )
    load_s = time.perf_counter() - t0
    n_total = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())
    n_trainable = sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters() if p.requires_grad)
    rows = random_token_rows(
        batch * (warmup + steps), seq, shape["vocab_size"], NUM_LABELS, shape["bos_token_id"]
    )
    probe_batch = {k: v[:4].to(device()) for k, v in stack_rows(rows[:4]).items() if k != "labels"}
    step_probe = StepProbe(count_from=warmup)
    trainer_cls = ProbingTrainer if run_name == "bce" else ContrastiveTrainer
    trainer = trainer_cls(
        model=model,
        args=targs,
        train_dataset=rows,
        data_collator=stack_rows,
        num_labels=NUM_LABELS,
        callbacks=[step_probe],
    )
    reset_peak_memory()
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    memory = peak_memory()
    layer_flags = [
        m.gradient_checkpointing for m in model.modules() if type(m).__name__.endswith("DecoderLayer")
    ]
    wrapper = _wrapper_check(trainer, launcher)
    trainable_dtypes = _trainable_dtypes(trainer.model_wrapped)
    reference = _outputs(trainer.model_wrapped, probe_batch, run_name, bf16)
    trained = _trained_weights(trainer)
    folder = os.path.join(out_root, "adapter")
    t0 = time.perf_counter()
    _save_adapter(trainer, folder, base)
    save_s = time.perf_counter() - t0
    adapter_bytes = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    del trainer, model, encoder
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if launcher == "deepspeed":
        from transformers.integrations.deepspeed import unset_hf_deepspeed_config

        unset_hf_deepspeed_config()  # the reload is a plain load, as a user's next process does
    t0 = time.perf_counter()
    reloaded = _reload_unmerged(folder, base, run_name, model_args, dtype, bf16)
    reload_s = time.perf_counter() - t0
    after = _outputs(reloaded, probe_batch, run_name, bf16)
    weights = _weights_distance(reloaded, trained)
    as_trained = None
    if (
        launcher == "deepspeed" and bf16
    ):  # DeepSpeed's bf16 mode holds every parameter (adapters, heads) in bf16
        as_trained = _distance(_outputs(reloaded.to(torch.bfloat16), probe_batch, run_name, bf16), reference)
    del reloaded, trained
    gc.collect()
    loader = MLCLForMultiLabelClassification if run_name == "bce" else MLCLEncoder
    merged = loader.from_pretrained(folder, dtype=dtype).to(device())  # the library's load: adapter merged
    after_merged = _outputs(merged, probe_batch, run_name, bf16)
    del merged
    gc.collect()
    reload = _distance(after, reference)
    reload["reference_max_abs"] = float(reference.abs().max())
    reload["merged_load"] = _distance(after_merged, reference)
    reload["weights"] = weights
    if as_trained is not None:
        reload["all_bf16"] = as_trained
    reload["same"] = bool(
        reload["max_abs_diff"] <= 1e-2 * reload["reference_max_abs"] and reload["min_cosine"] >= 0.9999
    )

    times = step_probe.times[warmup:]
    median = summary(times)["median"]
    key_forward = run_name == "msc"
    flops = flops_per_token(shape, seq, model_args.lora_r, list(model_args.lora_target_modules), key_forward)
    tokens_per_s = batch * seq / median
    from .common import device_info

    peak = device_info()["bf16_dense_peak_tflops"]
    achieved = flops["flops_per_token"] * tokens_per_s / 1e12
    return {
        "run": run_name,
        "launcher": launcher,
        "wrapper": wrapper,
        "recipe": recipe_path,
        "model": ("tiny Llama" if tiny else "Llama-3.1-8B architecture")
        + f", random init, {'bf16' if bf16 else 'fp32'}",
        "parameters": n_total,
        "trainable_parameters": n_trainable,
        "per_device_batch": batch,
        "seq_len": seq,
        "num_labels": NUM_LABELS,
        "gradcache_chunk_size": gradcache,
        "queue_size": int(getattr(targs, "queue_size", 0) or 0),
        "activation_checkpointing": checkpointing,
        "every_n_layers": int((targs.activation_checkpointing_kwargs or {}).get("every_n_layers", 1)),
        "checkpointed_layers": sum(bool(f) for f in layer_flags),
        "layers": len(layer_flags),
        "lora": {
            "r": model_args.lora_r,
            "alpha": model_args.lora_alpha,
            "dropout": model_args.lora_dropout,
            "targets": list(model_args.lora_target_modules),
        },
        "warmup_steps": warmup,
        "step_time_s": summary(times),
        "samples_per_s": batch / median,
        "tokens_per_s": tokens_per_s,
        **flops,
        "achieved_tflops": achieved,
        "peak_tflops": peak,
        "mfu": achieved / peak if peak else None,
        "peak_memory": memory,
        "syncs_per_step": step_probe.syncs,
        "sync_sites": step_probe.sync_sites[:8],
        "load_s": load_s,
        "train_s": train_s,
        "save_s": save_s,
        "adapter_bytes": adapter_bytes,
        "reload_s": reload_s,
        "reload": reload,
        "trainable_dtypes": trainable_dtypes,
        "notes": notes,
        # the saved tensors are the trained ones (to bf16 rounding where the engine trained bf16 copies)
        "checks": {
            "reload_same": reload["same"],
            "saved_weights_same": weights["missing"] == 0
            and weights["max_rel_diff"] <= (2**-8 if bf16 else 1e-6),
        },
    }
