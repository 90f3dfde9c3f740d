"""Worker of test_training_fsdp.py: the tiny-Llama + LoRA recipe under FSDP on CPU, 2 gloo processes.

    accelerate launch --config_file recipes/accelerate/cpu.yaml --num_processes 2 _fsdp_worker.py ROOT CASE...

accelerate applies FSDP to GPU processes only (``AcceleratorState`` switches to FSDP from the GPU-type distributed
types), so on CPU the launch gives a MULTI_CPU (gloo) state. :class:`FSDPOnCPU`, test-only, turns that state into
FSDP right after the Trainer builds its Accelerator, with the FSDP plugin that ``accelerate launch --config_file
recipes/accelerate/fsdp_llama_lora.yaml`` gives its processes (:func:`plugin_from_config`). Everything after that
is the library's and accelerate's own code: Trainer's preparation (accelerate's FSDP wrapping), the training
steps, GradCache, the adapter momentum encoder, ``save_lora_model``.

Cases (:data:`CASES`, run one after the other in the same two processes), each 3 steps of 8-row global batches
on a tiny Llama + LoRA (r 4, adapters and heads fp32, dropout 0 so that one and two processes see the same
model): ``sd`` with the recipe's GradCache (chunks of 2) and activation checkpointing; ``msc`` with learnable
label prototypes, the momentum encoder (a second adapter of the sharded model) and a queue; ``bf16``: sd with
the backbone stored in bf16 (``apply_lora(bf16=True)``, what failed on the GPU under FSDP1), computed without
autocast; ``bf16_amp``: the same under bf16 mixed precision (accelerate's autocast and FSDP2's bf16
``MixedPrecisionPolicy``, as on the GPU); ``bce``: the LoRA BCE fine-tune of a classifier (ProbingTrainer) on
the bf16 backbone. Every process then computes the trained model's outputs of fixed texts and calls
``save_lora_model`` (an adapter folder, and merged weights); the main process writes ``ROOT/fsdp-<case>.pt``. :func:`run` (also called by the test with
``fsdp=False``) is the plain one-process run on the same global batches.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _training_helpers import LABELS, base_args, collator, exit_if_gloo_threads, probe_args, tiny_split  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora  # noqa: E402
from hf_mlcl.modeling.lora import save_lora_model  # noqa: E402
from hf_mlcl.training import ContrastiveTrainer, ProbingTrainer  # noqa: E402
from hf_mlcl.training import distributed as D  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FSDP_CONFIG = os.path.abspath(os.path.join(HERE, "..", "..", "recipes", "accelerate", "fsdp_llama_lora.yaml"))
TEXTS = ["heart cardiac pulse of the", "graph network node with", "quantum photon spin field and renal"]
STEPS = 3
CASES: dict[str, dict] = {
    "sd": dict(loss="sd", gradcache_chunk_size=2, checkpointing=True),
    "msc": dict(loss="msc", queue_size=8, momentum=0.9),
    "bf16": dict(loss="sd", bf16_backbone=True),
    "bf16_amp": dict(loss="sd", bf16_backbone=True, bf16=True),
    "bce": dict(bce=True, bf16_backbone=True),
}


def plugin_from_config(path: str = FSDP_CONFIG):
    """The FSDP plugin that ``accelerate launch --config_file PATH`` gives its processes: the config's
    ``fsdp_config`` copied onto the launch options, turned into the processes' ``FSDP_*`` environment by
    accelerate's own ``prepare_multi_gpu_env``, read back by ``FullyShardedDataParallelPlugin()``.

    One change, for FSDP1 only: ``sync_module_states`` (and ``cpu_ram_efficient_loading``, which needs it)
    broadcast rank 0's weights from an accelerator device and stop on CPU ("no available devices"); they are
    off there, every rank loading the same weights. FSDP2 takes the config as it is (``sync_module_states`` is
    obsolete there; ``cpu_ram_efficient_loading`` shards the model on the meta device and broadcasts rank 0's
    state dict, which runs over gloo).
    """
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    cfg = ClusterConfig.from_yaml_file(path)
    args = launch_command_parser().parse_args(
        [
            "--config_file",
            path,
            "--use_fsdp",
            "--num_processes",
            "2",
            "--num_machines",
            "1",
            "--mixed_precision",
            "no",
            "--dynamo_backend",
            "no",
            "worker.py",
        ]
    )
    for key, value in cfg.fsdp_config.items():  # what launch_command does with the config file
        setattr(args, key if "fsdp" in key else f"fsdp_{key}", value)
    env = {key: value for key, value in prepare_multi_gpu_env(args).items() if key.startswith("FSDP_")}
    if env["FSDP_VERSION"] == "1":
        env["FSDP_SYNC_MODULE_STATES"] = env["FSDP_CPU_RAM_EFFICIENT_LOADING"] = "false"
    os.environ.update(env)
    return FullyShardedDataParallelPlugin()


class FSDPOnCPU:
    """Test-only Trainer mixin: FSDP on the gloo processes of a CPU machine, with the project's FSDP plugin.

    accelerate never applies FSDP on CPU, so right after the Trainer builds its Accelerator its MULTI_CPU state
    becomes the FSDP state accelerate builds on GPUs: the plugin of :func:`plugin_from_config` (its mixed
    precision set from the run's, as ``AcceleratorState`` does), ``distributed_type`` FSDP and the device
    ``cpu`` (FSDP1 rejects ``cpu:0``) in both the ``AcceleratorState`` and the ``PartialState`` shared dicts
    (every ``AcceleratorState()`` built later copies the latter), and the Trainer's ``is_fsdp_enabled``.
    """

    def create_accelerator_and_postprocess(self):
        from accelerate.state import PartialState
        from accelerate.utils import DistributedType

        super().create_accelerator_and_postprocess()
        state = self.accelerator.state
        if state.distributed_type not in (DistributedType.MULTI_CPU, DistributedType.FSDP):
            raise RuntimeError(
                f"expected the gloo processes of cpu.yaml (MULTI_CPU), got {state.distributed_type}"
            )
        plugin = plugin_from_config()
        if state.mixed_precision != "no":
            plugin.set_mixed_precision(state.mixed_precision)
        state.fsdp_plugin = plugin
        for shared in (state.__dict__, PartialState._shared_state):
            shared["distributed_type"] = DistributedType.FSDP
            shared["device"] = torch.device("cpu")
        self.is_fsdp_enabled = True


class FSDPContrastiveTrainer(FSDPOnCPU, ContrastiveTrainer):
    """ContrastiveTrainer under FSDP on CPU (test-only)."""


class FSDPProbingTrainer(FSDPOnCPU, ProbingTrainer):
    """ProbingTrainer under FSDP on CPU (test-only)."""


class GradNorms(TrainerCallback):
    """The gradient norm of every optimizer step, as Trainer logs it."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "grad_norm" in logs:
            self.norms.append(float(logs["grad_norm"]))


def encoder(root: str, bf16_backbone: bool = False, checkpointing: bool = False):
    """The tiny Llama base + the test's projection head + LoRA (seeded)."""
    model = MLCLEncoder.from_backbone(os.path.join(root, "base"), pooling="last_token", projection_dim=8)
    model.projection_head.load_state_dict(load_file(os.path.join(root, "head.safetensors")))
    torch.manual_seed(0)
    return apply_lora(
        model, r=4, alpha=8, dropout=0.0, bf16=bf16_backbone, gradient_checkpointing=checkpointing
    )


def classifier(root: str, bf16_backbone: bool = False):
    """A classifier on the tiny Llama base with the test's head, and LoRA (seeded): the LoRA BCE fine-tune."""
    enc = MLCLEncoder.from_backbone(os.path.join(root, "base"), pooling="last_token", projection_dim=8)
    model = MLCLForMultiLabelClassification.from_encoder(
        enc, id2label=LABELS, freeze_encoder=False, classifier_dropout=0.0
    )
    model.classifier.load_state_dict(load_file(os.path.join(root, "classifier.safetensors")))
    torch.manual_seed(0)
    return apply_lora(model, r=4, alpha=8, dropout=0.0, bf16=bf16_backbone, gradient_checkpointing=False)


def outputs(model, tok, field: str = "embeddings") -> torch.Tensor:
    """The model's ``field`` (embeddings / logits) of TEXTS in eval mode (under FSDP every process calls it)."""
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = getattr(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), field)
    model.train(was_training)
    return out.detach().float().cpu()


def _trainer(root: str, case: str, per_device: int, fsdp: bool, callbacks: list):
    kw = dict(CASES[case])
    bf16_backbone, checkpointing = kw.pop("bf16_backbone", False), kw.pop("checkpointing", False)
    tag = f"{'fsdp' if fsdp else 'plain'}-{case}"
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "base"))
    common = dict(
        per_device_train_batch_size=per_device,
        max_steps=STEPS,
        learning_rate=1e-2,
        max_grad_norm=1.0,
        train_sampling_strategy="sequential",
        dataloader_drop_last=True,
        bf16=kw.pop("bf16", False),
    )
    data = tiny_split(8 * STEPS)
    if kw.pop("bce", False):
        args = probe_args(os.path.join(root, f"run-{tag}"), probe="finetune", loss="bce", **common)
        cls = FSDPProbingTrainer if fsdp else ProbingTrainer
        model = classifier(root, bf16_backbone)
    else:
        # the arguments first, as train_contrastive does
        args = base_args(
            os.path.join(root, f"run-{tag}"),
            lr_scheduler_type="cosine",
            warmup_steps=1,
            knn_k=0,
            **common,
            **kw,
        )
        cls = FSDPContrastiveTrainer if fsdp else ContrastiveTrainer
        model = encoder(root, bf16_backbone, checkpointing)
    return cls(
        model=model, args=args, train_dataset=data, data_collator=collator(tok), callbacks=callbacks
    ), tok


def run(root: str, case: str, per_device: int, fsdp: bool) -> dict:
    """Train ``case``, compute the outputs of TEXTS, save the adapter folder ``ROOT/adapter-<fsdp|plain>-<case>``;
    every process. Returns what the test compares."""
    norms = GradNorms()
    tr, tok = _trainer(root, case, per_device, fsdp, [norms])
    tr.train()
    field = "logits" if isinstance(tr, ProbingTrainer) else "embeddings"
    inner = tr.accelerator.unwrap_model(tr.model_wrapped)
    result = {
        "world": D.world_size(),
        "wrapper": type(tr.model_wrapped).__name__,
        "fsdp_version": tr.accelerator.state.fsdp_plugin.fsdp_version if tr.is_fsdp_enabled else None,
        "mixed_precision": tr.accelerator.mixed_precision,
        # every parameter's dtype as the engine holds it (FSDP2: the sharded DTensor's)
        "dtypes": {name: p.dtype for name, p in inner.named_parameters()},
        "trainable": sorted(name for name, p in inner.named_parameters() if p.requires_grad),
        "losses": [h["loss"] for h in tr.state.log_history if "loss" in h],
        "grad_norms": norms.norms,
        "outputs": outputs(tr.model_wrapped, tok, field),
    }
    if getattr(tr, "momentum_encoder", None) is not None:
        result["momentum"] = {k: v.cpu() for k, v in tr.momentum_encoder.state_dict()["params"].items()}
        result["queue"] = tr.queue.embeddings.cpu().clone()
        result["prototypes"] = tr.loss_fn.prototypes.detach().cpu().clone()
    tag = f"{'fsdp' if fsdp else 'plain'}-{case}"
    save_lora_model(tr.model_wrapped, os.path.join(root, f"adapter-{tag}"), accelerator=tr.accelerator)
    if fsdp:  # merged from the sharded model: the adapter folder reloaded onto the base and merged
        merged = os.path.join(root, f"merged-{tag}")
        save_lora_model(tr.model_wrapped, merged, merge=True, accelerator=tr.accelerator)
    return result


if __name__ == "__main__":
    faulthandler.dump_traceback_later(150, exit=True)  # a hung collective ends with every thread's stack
    root, cases = sys.argv[1], sys.argv[2:]
    for case in cases:
        res = run(root, case, per_device=4, fsdp=True)
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(res, os.path.join(root, f"fsdp-{case}.pt"))
    # D.shutdown() also empties torch's DTensor caches, which keep FSDP2's device mesh and its gloo groups alive
    D.shutdown()
    exit_if_gloo_threads()
