"""Worker of test_training_zero3.py, launched by `accelerate launch` with recipes/accelerate/deepspeed_zero3.yaml
(DeepSpeed's CPU accelerator, ZeRO-3 over gloo, one or two processes).

``msc``: a tiny Llama + LoRA encoder trains 3 steps of msc (learnable label prototypes, momentum encoder, queue)
on 8-row global batches; then every process computes the trained model's embeddings of fixed texts and calls
save_lora_model. ``resume``: the same run with a checkpoint at step 2, and a run resumed from it. ``bce``: the
LoRA BCE fine-tune of a classifier on the same base (adapters + head), then its
logits and save_lora_model. The main process writes what the test compares with a plain one-process run
(``run`` / ``run_bce``, also called by the test): logged losses, the trained model's outputs, the loss, momentum
and queue states, and the adapter folder.
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _training_helpers import LABELS, base_args, collator, exit_if_gloo_threads, probe_args, tiny_split  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from hf_mlcl.modeling import MLCLEncoder, MLCLForMultiLabelClassification, apply_lora  # noqa: E402
from hf_mlcl.modeling.lora import save_lora_model  # noqa: E402
from hf_mlcl.training import ContrastiveTrainer, ProbingTrainer  # noqa: E402
from hf_mlcl.training import distributed as D  # noqa: E402

TEXTS = ["heart cardiac pulse of the", "graph network node with", "quantum photon spin field and renal"]
STEPS = 3


def encoder(root: str):
    """The tiny Llama base + the test's projection head + LoRA (seeded), whatever the engine."""
    model = MLCLEncoder.from_backbone(os.path.join(root, "base"), pooling="last_token", projection_dim=8)
    model.projection_head.load_state_dict(load_file(os.path.join(root, "head.safetensors")))
    torch.manual_seed(0)
    return apply_lora(model, r=4, alpha=8, dropout=0.0, bf16=False, gradient_checkpointing=False)


def classifier(root: str):
    """A classifier on the tiny Llama base with the test's head, and LoRA (seeded): the LoRA BCE fine-tune."""
    encoder = MLCLEncoder.from_backbone(os.path.join(root, "base"), pooling="last_token", projection_dim=8)
    model = MLCLForMultiLabelClassification.from_encoder(
        encoder, id2label=LABELS, freeze_encoder=False, classifier_dropout=0.0
    )
    model.classifier.load_state_dict(load_file(os.path.join(root, "classifier.safetensors")))
    torch.manual_seed(0)
    return apply_lora(model, r=4, alpha=8, dropout=0.0, bf16=False, gradient_checkpointing=False)


def outputs(model, tok, field: str = "embeddings") -> torch.Tensor:
    """The model's ``field`` (embeddings / logits) of TEXTS (eval mode, no gradient; under ZeRO-3 every process
    calls it)."""
    batch = tok(TEXTS, padding=True, return_tensors="pt")
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = getattr(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), field)
    model.train(was_training)
    return out.detach().float().cpu()


def embed(model, tok) -> torch.Tensor:
    return outputs(model, tok, "embeddings")


def contrastive_trainer(root: str, output_dir: str, per_device: int, **args) -> ContrastiveTrainer:
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "base"))
    # the arguments first, as train_contrastive does: under ZeRO-3 the backbone then loads partitioned
    args = base_args(
        output_dir,
        per_device_train_batch_size=per_device,
        loss="msc",
        queue_size=8,
        momentum=0.9,
        max_steps=STEPS,
        learning_rate=1e-2,
        lr_scheduler_type="cosine",
        warmup_steps=1,
        max_grad_norm=1.0,
        knn_k=0,
        **args,
    )
    return ContrastiveTrainer(
        model=encoder(root), args=args, train_dataset=tiny_split(8 * STEPS), data_collator=collator(tok)
    )


def state(tr: ContrastiveTrainer, tok) -> dict:
    """What a contrastive run ends with (every process calls it: the embeddings are a ZeRO-3 forward)."""
    return {
        "world": D.world_size(),
        "engine": type(tr.model_wrapped).__name__,
        "losses": [h["loss"] for h in tr.state.log_history if "loss" in h],
        "prototypes": tr.loss_fn.prototypes.detach().cpu().clone(),
        "momentum": {k: v.cpu() for k, v in tr.momentum_encoder.state_dict()["params"].items()},
        "queue": tr.queue.embeddings.cpu().clone(),
        "embeddings": embed(tr.model_wrapped, tok),
    }


def run(root: str, tag: str, per_device: int, **engine_args) -> dict:
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "base"))
    tr = contrastive_trainer(root, os.path.join(root, f"run-{tag}"), per_device, **engine_args)
    initial_prototypes = tr.loss_fn.prototypes.detach().cpu().clone()
    tr.train()
    result = {"initial_prototypes": initial_prototypes, **state(tr, tok)}
    save_lora_model(tr.model_wrapped, os.path.join(root, f"adapter-{tag}"), accelerator=tr.accelerator)
    return result


def run_resumed(root: str, tag: str, per_device: int, **engine_args) -> dict:
    """The msc run with a checkpoint at step 2, and a second run resumed from it: both final states."""
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "base"))
    full = contrastive_trainer(
        root,
        os.path.join(root, f"full-{tag}"),
        per_device,
        save_strategy="steps",
        save_steps=2,
        **engine_args,
    )
    full.train()
    resumed = contrastive_trainer(root, os.path.join(root, f"resumed-{tag}"), per_device, **engine_args)
    resumed.train(resume_from_checkpoint=os.path.join(root, f"full-{tag}", "checkpoint-2"))
    return {"full": state(full, tok), "resumed": state(resumed, tok)}


def run_bce(root: str, tag: str, per_device: int, **engine_args) -> dict:
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "base"))
    args = probe_args(
        os.path.join(root, f"bce-run-{tag}"),
        probe="finetune",
        loss="bce",
        per_device_train_batch_size=per_device,
        max_steps=STEPS,
        learning_rate=1e-2,
        max_grad_norm=1.0,
        train_sampling_strategy="sequential",
        **engine_args,
    )
    tr = ProbingTrainer(
        model=classifier(root), args=args, train_dataset=tiny_split(8 * STEPS), data_collator=collator(tok)
    )
    tr.train()
    model = tr.accelerator.unwrap_model(tr.model)
    result = {
        "world": D.world_size(),
        "engine": type(tr.model_wrapped).__name__,
        "losses": [h["loss"] for h in tr.state.log_history if "loss" in h],
        "trainable": sorted(n for n, p in model.named_parameters() if p.requires_grad),
        "logits": outputs(tr.model_wrapped, tok, "logits"),
    }
    save_lora_model(tr.model_wrapped, os.path.join(root, f"bce-adapter-{tag}"), accelerator=tr.accelerator)
    return result


if __name__ == "__main__":
    root, mode, tag, per_device = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    res = {"msc": run, "bce": run_bce, "resume": run_resumed}[mode](
        root, tag, per_device, use_cpu=False, ddp_backend="gloo"
    )
    if int(os.environ.get("RANK", "0")) == 0:
        torch.save(res, os.path.join(root, f"{tag}.pt"))
    D.shutdown()
    exit_if_gloo_threads()
