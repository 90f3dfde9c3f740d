"""Shared builders for the tests in tests/training (tiny backbone, hand-made multi-label data)."""

from __future__ import annotations

import os
import random
import sys

import torch
from transformers import BertConfig

from hf_mlcl.data import MultiLabelCollator
from hf_mlcl.data.registry import build_split
from hf_mlcl.data.tokenizer import word_level_tokenizer
from hf_mlcl.modeling import MLCLEncoder

LABELS = ["alpha", "beta", "gamma", "delta"]
_TOPIC = {
    0: "heart cardiac pulse artery",
    1: "kidney renal urine dialysis",
    2: "graph network node edge",
    3: "quantum photon spin field",
}
_NOISE = "the a of and with was is for on by to in".split()


def tiny_split(n: int = 32, seed: int = 0):
    """``n`` texts whose words reveal their labels; every row has 1-2 of 4 labels and in every aligned
    group of 4 rows each row shares a label with another, so every anchor of such a batch has a positive."""
    rng = random.Random(seed)
    pattern = [[0], [0, 1], [1, 2], [2], [3], [2, 3], [1, 3], [1]]
    texts, labels = [], []
    for i in range(n):
        labs = pattern[i % len(pattern)]
        words = []
        for lab in labs:
            words += rng.sample(_TOPIC[lab].split(), 3)
        words += rng.sample(_NOISE, 3)
        rng.shuffle(words)
        texts.append(" ".join(words))
        labels.append(sorted(labs))
    return build_split(texts, labels, LABELS)


def tiny_tokenizer():
    # a fixed vocabulary: train_tokenizer breaks frequency ties differently in every process, which made
    # the learning-dynamics tests (loss falls, kNN F1) depend on the run
    return word_level_tokenizer(" ".join(_TOPIC.values()).split() + _NOISE)


def tiny_encoder(
    tok, dropout: float = 0.0, projection_dim: int = 16, seed: int = 0, pooling: str = "cls"
) -> MLCLEncoder:
    """A 2-layer BERT encoder of width 32 (``pooling="cls"``: at this initialisation every row's pooled state
    is nearly the same; ``"mean"`` spreads them)."""
    torch.manual_seed(seed)
    cfg = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=tok.pad_token_id,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return MLCLEncoder.from_backbone(cfg, projection_dim=projection_dim, pooling=pooling)


def collator(tok, n_views: int = 1, num_labels: int = 4):
    return MultiLabelCollator(tok, num_labels, max_length=32, n_views=n_views)


def base_args(tmp_path, args_class=None, **kw):
    """Stage-1 arguments of a short CPU run (``args_class``: another ContrastiveTrainingArguments subclass)."""
    from hf_mlcl.training import ContrastiveTrainingArguments

    defaults = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        per_device_eval_batch_size=8,
        max_steps=1,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
        max_grad_norm=0.0,
        train_sampling_strategy="sequential",
        dataloader_num_workers=0,
        seed=0,
    )
    defaults.update(kw)
    return (args_class or ContrastiveTrainingArguments)(**defaults)


def gloo_threads() -> list[str]:
    """Names of this process's gloo threads still running (Linux: /proc/self/task; [] elsewhere). After
    ``hf_mlcl.training.distributed.shutdown()`` there must be none: a gloo thread alive at interpreter exit
    is what made a worker abort now and then (SIGABRT, "terminate called without an active exception")."""
    tasks = "/proc/self/task"
    if not os.path.isdir(tasks):
        return []
    names = []
    for tid in os.listdir(tasks):
        try:
            with open(os.path.join(tasks, tid, "comm")) as f:
                names.append(f.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sorted(n for n in names if "gloo" in n)


def exit_if_gloo_threads() -> None:
    """End a DDP test worker with an error naming the gloo threads that outlived ``shutdown()``."""
    left = gloo_threads()
    if left:
        sys.exit(f"gloo threads still running after D.shutdown(): {left}")


def run_two_processes(worker: str, *worker_args: str, timeout: int = 220) -> None:
    """``torchrun --nproc_per_node 2`` (gloo on CPU, one thread each) of ``worker``; AssertionError with
    the end of stderr when it fails."""
    here = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([here, os.getcwd()])}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    # --standalone: torchrun binds its rendezvous store to a port of the kernel's choosing and hands that
    # store to the workers. A port picked here and closed before torchrun binds it can be taken in between
    # (by any socket, e.g. an outgoing gloo connection of a concurrent run), failing the launch.
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        worker,
        *worker_args,
    ]
    from _launches import run_launch  # here: the workers import this module without tests/ on their path

    proc = run_launch(cmd, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]


def probe_args(tmp_path, **kw):
    """ProbingTrainingArguments of the probing tests: 4 steps of 8 rows on CPU, no saving, no reports."""
    from hf_mlcl.training import ProbingTrainingArguments

    base = dict(
        output_dir=str(tmp_path),
        per_device_train_batch_size=8,
        per_device_eval_batch_size=16,
        max_steps=4,
        learning_rate=5e-3,
        report_to=[],
        save_strategy="no",
        logging_steps=1,
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    base.update(kw)
    return ProbingTrainingArguments(**base)


class GradCapture:
    """TrainerCallback that snapshots every parameter gradient right before each optimizer step."""

    def __new__(cls, model):
        from transformers import TrainerCallback

        class _Capture(TrainerCallback):
            def __init__(self):
                self.grads: list[dict[str, torch.Tensor]] = []

            def on_pre_optimizer_step(self, args, state, control, **kwargs):
                self.grads.append(
                    {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
                )

        return _Capture()


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a)[:3], sorted(b)[:3])
    num = max(float((a[k] - b[k]).abs().max()) for k in a)
    den = max(float(b[k].abs().max()) for k in b)
    return num / max(den, 1e-12)


class RowCounter:
    """Forward hook on a backbone: the rows it encoded, and how many calls ran in training mode."""

    def __init__(self, backbone: torch.nn.Module) -> None:
        self.rows = 0
        self.training_calls = 0
        backbone.register_forward_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs, output):
        ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        self.rows += int(ids.shape[0])
        self.training_calls += int(module.training)


def save_tiny_llama_with_heads(root) -> None:
    """The sharded runs' (FSDP, ZeRO-3) saved inputs under ``root``: a tiny random Llama base with its tokenizer
    (``base/``), a projection head (``head.safetensors``) and a classifier head over ``LABELS``
    (``classifier.safetensors``), all drawn from seed 0."""
    from _tiny_llama import save_tiny_llama
    from safetensors.torch import save_file

    base = os.path.join(str(root), "base")
    cfg = save_tiny_llama(base, tiny_tokenizer())
    head = MLCLEncoder.from_backbone(base, pooling="last_token", projection_dim=8).projection_head
    save_file(
        {k: v.contiguous() for k, v in head.state_dict().items()}, os.path.join(str(root), "head.safetensors")
    )
    classifier = torch.nn.Linear(cfg.hidden_size, len(LABELS))
    save_file(
        {k: v.contiguous() for k, v in classifier.state_dict().items()},
        os.path.join(str(root), "classifier.safetensors"),
    )
