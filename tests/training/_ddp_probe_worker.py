"""Worker of test_training_probing_ddp.py, launched by `torchrun --nproc_per_node 2` (gloo, CPU).

Trains the linear probe saved in ``<root>/init`` with and without cached features (sequential batches
of ``per_device`` rows per process) and saves, per process, the trained head, the pooled-feature rows
each training batch held (cached run), the evaluation metrics, the test scores and the rows the encoder
ran on; then twice more with a ``feature_cache_dir`` (the first run writes it, the second reads it).
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _training_helpers import collator, exit_if_gloo_threads, probe_args, tiny_split  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from hf_mlcl.modeling import MLCLForMultiLabelClassification  # noqa: E402
from hf_mlcl.training import ProbingTrainer  # noqa: E402
from hf_mlcl.training import distributed as D  # noqa: E402

N_TRAIN, N_EVAL, N_TEST = 24, 20, 10


class RecordingTrainer(ProbingTrainer):
    """Keeps the pooled-feature rows of every training micro-batch this process trained on."""

    seen: list

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and "pooled_features" in inputs:
            self.seen.append(inputs["pooled_features"].detach().cpu().clone())
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def run(root: str, cache: bool, per_device: int, store: str | None = None, name: str = "") -> dict:
    tok = AutoTokenizer.from_pretrained(os.path.join(root, "tok"))
    model = MLCLForMultiLabelClassification.from_pretrained(os.path.join(root, "init"))
    encoded = []
    model.backbone.register_forward_hook(
        lambda m, a, kw, out: encoded.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    args = probe_args(
        os.path.join(root, f"run-{cache}-{D.world_size()}{name}"),
        cache_features=cache,
        feature_cache_dir=store,
        per_device_train_batch_size=per_device,
        per_device_eval_batch_size=8,
        max_steps=3,
        learning_rate=5e-2,
        train_sampling_strategy="sequential",
        eval_strategy="steps",
        eval_steps=3,
    )
    tr = RecordingTrainer(
        model=model,
        args=args,
        train_dataset=tiny_split(N_TRAIN),
        eval_dataset=tiny_split(N_EVAL, 1),
        data_collator=collator(tok),
    )
    tr.seen = []
    tr.train()
    scores, truth = tr.predict_scores(tiny_split(N_TEST, 2))
    evals = [h for h in tr.state.log_history if "eval_loss" in h]
    head = {
        k: v.detach().clone()
        for k, v in tr.accelerator.unwrap_model(tr.model).classifier.state_dict().items()
    }
    return {
        "head": head,
        "seen": tr.seen,
        "eval": evals[-1],
        "scores": scores,
        "truth": truth,
        "cached": tr.cache_features,
        "world": D.world_size(),
        "encoded_rows": sum(encoded),
    }


if __name__ == "__main__":
    root = sys.argv[1]
    for cache in (True, False):
        res = run(root, cache, per_device=4)
        torch.save(res, os.path.join(root, f"cache-{cache}-rank{os.environ.get('RANK', '0')}.pt"))
    # features on disk: the first run encodes and saves them (process 0 writes), the second loads them
    for name in ("write", "read"):
        res = run(root, True, per_device=4, store=os.path.join(root, "features"), name=name)
        torch.save(res, os.path.join(root, f"store-{name}-rank{os.environ.get('RANK', '0')}.pt"))
    D.shutdown()  # see _ddp_worker.py: leave with the gloo group shut down
    exit_if_gloo_threads()
