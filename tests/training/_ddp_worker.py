"""Worker of test_training_ddp.py, launched by `torchrun --nproc_per_node 2` (gloo, CPU).

Each rank trains on its 4 rows of every 8-row batch (one step, or two for the queue configurations);
rank 0 saves the last step's logged loss (mean over ranks) and DDP-averaged parameter gradients (plus
loss-parameter gradients) for each configuration: stage 1 (ContrastiveTrainer) and the joint objective
(JointTrainer, whose logged loss comes with its supervised and contrastive parts).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _training_helpers import base_args, collator, exit_if_gloo_threads, tiny_split  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402

from hf_mlcl.modeling import MLCLEncoder  # noqa: E402
from hf_mlcl.training import ContrastiveTrainer  # noqa: E402
from hf_mlcl.training import distributed as D  # noqa: E402


def configs():
    from hf_mlcl.losses import SimilarityDissimilarityLoss

    class NoKeysSD(SimilarityDissimilarityLoss):
        supports_keys = False  # exercises the gathered-anchors path

    return {
        "sd": dict(loss="sd"),
        # two steps: the queue (filled by step 1's gathered keys) is a candidate set at step 2
        "msc_queue": dict(loss="msc", queue_size=8, max_steps=2),  # queries+queue
        "mulsupcon_keys_queue": dict(loss="mulsupcon", queue_size=8, max_steps=2),  # keys, warm-up
        "sd_union_queue": dict(loss="sd", queue_size=8, max_steps=2, contrast_set="queries+keys"),
        "nokeys": dict(loss="sd", loss_fn=NoKeysSD()),
        "sd_views_gradcache": dict(loss="sd", n_views=2, gradcache_chunk_size=3),
    }


class Capture(TrainerCallback):
    def __init__(self, trainer_ref):
        self.trainer_ref = trainer_ref
        self.grads = None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        tr = self.trainer_ref[0]
        model = tr.accelerator.unwrap_model(tr.model)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        for n, p in tr.loss_fn.named_parameters():
            grads[f"loss.{n}"] = p.grad.detach().clone()
        for n, p in (getattr(tr, "projection", None) or torch.nn.Identity()).named_parameters():
            grads[f"projection.{n}"] = p.grad.detach().clone()  # the joint's training-only head
        self.grads = grads


def joint_configs():
    """The joint objective, (1 - w) BCE + w contrastive, on a classifier: in-batch, behind a training-only
    projection head, and with a queue from step 2."""
    return {
        "joint_any": dict(loss="any", contrastive_weight=0.3),
        "joint_projection": dict(loss="jaccard", contrastive_weight=0.5, contrastive_projection_dim=8),
        "joint_mulsupcon_queue": dict(loss="mulsupcon", contrastive_weight=0.5, queue_size=8, max_steps=2),
    }


def run_joint(root: str, name: str, kw: dict, per_device: int):
    """A JointTrainer run from the saved classifier: the last logged loss and its parts, and the gradients."""
    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.training import JointTrainer, JointTrainingArguments

    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tok"))
    model = MLCLForMultiLabelClassification.from_pretrained(os.path.join(root, "joint-init")).double()
    ref: list = []
    cap = Capture(ref)
    args = base_args(
        os.path.join(root, f"run-{name}"),
        JointTrainingArguments,
        per_device_train_batch_size=per_device,
        **kw,
    )
    tr = JointTrainer(
        model=model,
        args=args,
        train_dataset=tiny_split(8 * kw.get("max_steps", 1)),
        data_collator=collator(tok),
        callbacks=[cap],
    )
    ref.append(tr)
    tr.train()
    last = [h for h in tr.state.log_history if "loss" in h][-1]
    parts = {k: last[k] for k in ("loss", "loss_supervised", "loss_contrastive")}
    return {"loss": parts, "grads": cap.grads, "world": D.world_size()}


def run(root: str, name: str, kw: dict, per_device: int, rank_start: bool = False):
    """One ContrastiveTrainer run. ``rank_start``: each rank's loss parameters and key encoder start apart (as
    per-rank seeds leave them), and the result holds every rank's copies of them after training."""
    kw = dict(kw)
    loss_fn = kw.pop("loss_fn", None)
    n_views = kw.get("n_views", 1)
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tok"))
    # float64: at init the embeddings are nearly collinear and the gradients are differences of
    # near-equal terms; double precision keeps the 1-vs-2-process comparison far from round-off.
    model = MLCLEncoder.from_pretrained(os.path.join(root, "init")).double()
    ref: list = []
    cap = Capture(ref)
    args = base_args(os.path.join(root, f"run-{name}"), per_device_train_batch_size=per_device, knn_k=0, **kw)
    rows = 8 * kw.get("max_steps", 1)
    tr = ContrastiveTrainer(
        model=model,
        args=args,
        train_dataset=tiny_split(rows),
        data_collator=collator(tok, n_views),
        loss_fn=loss_fn,
        callbacks=[cap],
    )
    ref.append(tr)
    averaged = set(tr.momentum_encoder.trainable_names) if rank_start else set()
    key_params = (
        [p for n, p in tr.momentum_encoder.module.named_parameters() if n in averaged] if rank_start else []
    )
    with torch.no_grad():
        for t in [*tr.loss_fn.parameters(), *key_params] if rank_start else []:
            t.add_(0.1 * (1 + D.rank()))
    tr.train()
    loss = [h["loss"] for h in tr.state.log_history if "loss" in h][-1]
    queue = None if tr.queue is None else tr.queue.embeddings.clone()
    result = {"loss": loss, "grads": cap.grads, "world": D.world_size(), "queue": queue}
    if rank_start:
        own = [t.detach().clone() for t in [*tr.loss_fn.parameters(), *key_params]]
        result["every_rank"] = D.all_gather_object(own)
    return result


if __name__ == "__main__":
    root = sys.argv[1]
    per_device = int(sys.argv[2])
    runs = [(name, kw, run) for name, kw in configs().items()]
    runs += [(name, kw, run_joint) for name, kw in joint_configs().items()]
    for name, kw, fn in runs:
        res = fn(root, name, kw, per_device)
        if int(os.environ.get("RANK", "0")) == 0:
            torch.save(res, os.path.join(root, f"{name}-{res['world']}.pt"))
    start = run(
        root, "msc_rank_start", dict(loss="msc", queue_size=8, max_steps=2), per_device, rank_start=True
    )
    if D.rank() == 0:
        torch.save(start["every_rank"], os.path.join(root, "rank-start.pt"))
    # in the process group the runs started: a logged part only rank 0 has (rank 1's anchors had no
    # positive) is still averaged on both, in one collective
    from hf_mlcl.training.loss_window import LossWindow

    window = LossWindow()
    one = torch.ones((), dtype=torch.float64)
    only_0 = {"only_0": one * 4} if D.rank() == 0 else {}
    window.add({"loss": one, "shared": one * (1 + D.rank()), **only_0})
    torch.save(window.averages(), os.path.join(root, f"window-{D.rank()}.pt"))
    # without this, rank 1 aborted about 1 run in 5 ("terminate called without an active exception"):
    # leaving the interpreter with a live gloo group races its threads against the static destructors.
    # The trainers above are still alive here (each Capture points back at its trainer, a cycle), and
    # their DDP wrappers keep the group: before shutdown() collected them, its threads outlived
    # destroy_process_group and rank 1 still aborted now and then. The check below fails if they do again.
    D.shutdown()
    exit_if_gloo_threads()
