"""What every measurement of ``benchmarks/gpu_suite.py`` shares: the device and its bf16 peak, the
versions, step timing and host-sync counting inside ``Trainer``, synthetic batches, model shapes.

Model shapes are written out here (no Hub access): the figures of a run depend on the architecture,
never on the weights, so every backbone is built from its config with random weights.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import TrainerCallback

# bf16 dense (no sparsity) tensor-core peaks in TFLOP/s from NVIDIA's data sheets, matched against
# torch.cuda.get_device_name() in order (first substring that matches wins).
BF16_DENSE_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756.5),
    ("H100 NVL", 835.5),
    ("H100", 989.4),  # SXM5 (name "NVIDIA H100 80GB HBM3")
    ("H200", 989.4),
    ("GH200", 989.4),
    ("A100", 312.0),
    ("L40S", 362.05),
    ("L4", 121.0),
)

from .shapes import BERT_TINY, LLAMA_31_8B, LLAMA_TINY, MINILM_L6, ROBERTA_BASE  # noqa: E402,F401 (re-exported)


@dataclass
class Cell:
    """One run of a measurement: its name, the launcher it runs under and its parameters."""

    name: str
    launcher: str = "plain"  # "plain" | "fsdp" | "deepspeed"
    params: dict[str, Any] = field(default_factory=dict)
    timeout: int = 900
    cpu_reason: str | None = None  # set when this cell cannot run on a CPU-only machine, with the reason


# ----------------------------------------------------------------------------------------- the device
def device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def bf16_dense_peak_tflops(name: str) -> float | None:
    """The device's bf16 dense peak (TFLOP/s) from :data:`BF16_DENSE_PEAK_TFLOPS`, None if unknown."""
    for key, value in BF16_DENSE_PEAK_TFLOPS:
        if key in name:
            return value
    return None


def device_info() -> dict[str, Any]:
    """Name, kind, memory and bf16 peak of the device the measurements run on."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        name = torch.cuda.get_device_name(0)
        return {
            "kind": "cuda",
            "name": name,
            "memory_gib": round(props.total_memory / 2**30, 2),
            "multiprocessors": props.multi_processor_count,
            "bf16_dense_peak_tflops": bf16_dense_peak_tflops(name),
            "count": torch.cuda.device_count(),
        }
    return {
        "kind": "cpu",
        "name": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(),
        "bf16_dense_peak_tflops": None,
    }


def device_slug(info: dict[str, Any], tiny: bool) -> str:
    """Folder name of a device's results: ``cpu-tiny`` or the lower-cased GPU name with dashes."""
    if tiny or info["kind"] == "cpu":
        return "cpu-tiny" if tiny else "cpu"
    name = info["name"].lower()
    return "-".join("".join(ch if ch.isalnum() else " " for ch in name).split())


def versions() -> dict[str, str | None]:
    """Versions of Python, CUDA and the packages a figure depends on."""
    out: dict[str, str | None] = {"python": sys.version.split()[0], "cuda": torch.version.cuda}
    for pkg in (
        "torch",
        "transformers",
        "peft",
        "accelerate",
        "deepspeed",
        "sentence-transformers",
        "pytorch-metric-learning",
    ):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def reset_peak_memory() -> None:
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()


def peak_memory() -> dict[str, float]:
    """Peak GPU memory (GiB) since the last reset: allocated by tensors and reserved by the allocator;
    on CPU the process's peak resident set."""
    if torch.cuda.is_available():
        return {
            "allocated_gib": round(torch.cuda.max_memory_allocated() / 2**30, 3),
            "reserved_gib": round(torch.cuda.max_memory_reserved() / 2**30, 3),
        }
    import resource

    return {"rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


def summary(values: Sequence[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


# ------------------------------------------------------------------------------- timing inside Trainer
class StepProbe(TrainerCallback):
    """Wall time of every optimizer step (device synchronised at both ends) and, from step
    ``count_from`` on, the host syncs made inside each step.

    A step is what ``Trainer`` runs between ``on_step_begin`` and ``on_step_end``: forward, loss,
    backward, clipping, optimizer and scheduler steps, and the callbacks registered before this one
    (the batch is fetched and moved to the device before ``on_step_begin``). Syncs are counted with
    ``torch.cuda.set_sync_debug_mode("warn")`` (CUDA only: every synchronising call, e.g. ``.item()``,
    ``float(tensor)``, a blocking device-to-host copy, ``nonzero``), each recorded with the Python
    frames that made it.
    """

    def __init__(self, count_from: int | None = None) -> None:
        self.times: list[float] = []
        self.begins: list[float] = []
        self.ends: list[float] = []
        self.syncs: list[int] = []
        self.sync_sites: list[str] = []
        self.count_from = count_from
        self._t0 = 0.0
        self._armed = False
        self._saved_showwarning = None
        self._saved_filters = None
        self._step = 0

    def _record(self, message, category, filename, lineno, file=None, line=None):  # warnings.showwarning
        text = str(message)
        if "synchroniz" in text.lower() and "prototype" not in text:  # not the mode's own notice
            self.syncs[-1] += 1
            if len(self.sync_sites) < 20:
                frames = [f for f in traceback.extract_stack()[:-2] if "warnings" not in f.filename]
                where = " <- ".join(
                    f"{os.path.basename(f.filename)}:{f.lineno}:{f.name}" for f in frames[-6:][::-1]
                )
                self.sync_sites.append(where)

    def _arm(self) -> None:
        self.syncs.append(0)
        self._saved_filters = warnings.filters[:]
        self._saved_showwarning = warnings.showwarning
        warnings.simplefilter("always")
        warnings.showwarning = self._record
        torch.cuda.set_sync_debug_mode("warn")
        self._armed = True

    def _disarm(self) -> None:
        torch.cuda.set_sync_debug_mode("default")
        warnings.showwarning = self._saved_showwarning
        warnings.filters[:] = self._saved_filters
        self._armed = False

    def on_step_begin(self, args, state, control, **kwargs):
        synchronize()
        self._t0 = time.perf_counter()
        self.begins.append(self._t0)
        if self.count_from is not None and torch.cuda.is_available() and self._step >= self.count_from:
            self._arm()

    def on_step_end(self, args, state, control, **kwargs):
        if self._armed:
            self._disarm()
        synchronize()
        end = time.perf_counter()
        self.ends.append(end)
        self.times.append(end - self._t0)
        self._step += 1


class StepProfile(TrainerCallback):
    """``torch.profiler`` over one optimizer step (the ``at``-th, 0-based; same window as
    :class:`StepProbe`), summarised as where the step's time goes: on a GPU the device kernels launched
    and the device time of each operator's own kernels, elsewhere the host's self time by operator.

    ``summary`` (after the step): ``kernels`` (device kernel launches; None without a GPU),
    ``device_ms`` (their total self time; None without a GPU), ``operators`` (aten operator calls),
    ``host_ms`` (the operators' total host self time) and ``top``: the ``top`` operators by device self
    time (by host self time without a GPU), each ``[name, calls, self ms]``. A profiler that fails leaves
    ``summary = {"error": "<one line>"}`` and the training goes on.
    """

    def __init__(self, at: int, top: int = 15) -> None:
        self.at, self.top, self.summary = at, top, None
        self._step, self._profiler = 0, None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._step == self.at:
            activities = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            synchronize()
            self._profiler = torch.profiler.profile(activities=activities)
            self._profiler.__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self._profiler is not None:
            synchronize()
            self._profiler.__exit__(None, None, None)
            try:
                self.summary = self._summarise(self._profiler)
            except Exception as err:  # the figures of the step stand without its profile
                self.summary = {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
            self._profiler = None
        self._step += 1

    def _summarise(self, profiler) -> dict[str, Any]:
        from torch.autograd import DeviceType

        events = profiler.key_averages()
        ops = [e for e in events if e.key.startswith("aten::")]
        gpu = torch.cuda.is_available()
        kernels = [e for e in events if e.device_type == DeviceType.CUDA] if gpu else []

        def self_device_us(e) -> float:
            return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0.0)))

        if gpu:  # operators by the device time of the kernels they launched themselves
            ranked = sorted(ops, key=self_device_us, reverse=True)
            top = [
                [e.key, e.count, self_device_us(e) / 1e3] for e in ranked[: self.top] if self_device_us(e) > 0
            ]
        else:
            ranked = sorted(ops, key=lambda e: e.self_cpu_time_total, reverse=True)
            top = [[e.key, e.count, e.self_cpu_time_total / 1e3] for e in ranked[: self.top]]
        return {
            "kernels": sum(e.count for e in kernels) if gpu else None,
            "device_ms": sum(self_device_us(e) for e in kernels) / 1e3 if gpu else None,
            "operators": sum(e.count for e in ops),
            "host_ms": sum(e.self_cpu_time_total for e in ops) / 1e3,
            "top": top,
        }


# ---------------------------------------------------------------------------------------- batches
def random_token_rows(
    n: int,
    seq: int,
    vocab: int,
    num_labels: int,
    first_token: int,
    labels_per_row: float = 2.4,
    seed: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """``n`` pre-tokenised rows of exactly ``seq`` random token ids (no padding) with random multi-hot
    labels (>= 1 per row, about ``labels_per_row`` on average)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (n, seq), generator=g)
    ids[:, 0] = first_token
    p = max(0.0, (labels_per_row - 1.0) / max(1, num_labels - 1))
    labels = (torch.rand(n, num_labels, generator=g) < p).float()
    labels[torch.arange(n), torch.randint(0, num_labels, (n,), generator=g)] = 1.0
    mask = torch.ones(seq, dtype=torch.long)
    return [{"input_ids": ids[i], "attention_mask": mask, "labels": labels[i]} for i in range(n)]


def stack_rows(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Collate pre-tokenised rows (the same for every trainer compared)."""
    return {k: torch.stack([r[k] for r in rows]) for k in rows[0]}


def autocast(enabled: bool):
    """bf16 autocast on the current device (what Trainer uses with ``bf16=True``), or a no-op."""
    if not enabled:
        import contextlib

        return contextlib.nullcontext()
    return torch.autocast(device_type=device().type, dtype=torch.bfloat16)


# ------------------------------------------------------------------------------------------ recipes
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def recipe_stage(recipe_path: str, stage: str, top: dict[str, Any], training: dict[str, Any], out_root: str):
    """A recipe's ``(ModelArguments, DataArguments, TrainingArguments)`` for ``stage`` as ``hf-mlcl run``
    parses them, with ``top`` (model / data keys) and ``training`` (the stage's keys) as command-line
    overrides. Also returns the merged recipe dict."""
    from hf_mlcl.recipes import load_recipe, parse_stage, split_overrides

    recipe = load_recipe(os.path.join(REPO, recipe_path))
    tokens = ["--output_dir", out_root]
    for key, value in top.items():
        tokens += [f"--{key}", str(value)]
    for key, value in training.items():
        tokens += [f"--{stage}.{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return recipe, parse_stage(recipe, stage, split_overrides(tokens, [stage]))


# the settings of a timed run: a fixed number of steps, nothing logged, saved or evaluated on the way
TIMED_RUN = {
    "save_strategy": "no",
    "logging_strategy": "no",
    "eval_strategy": "no",
    "report_to": "none",
    "disable_tqdm": True,
    "dataloader_num_workers": 0,
    "seed": 0,
}
