"""``losses``: the contrastive losses' forward + backward on the device, against the floors a user knows.

Tables ``in-batch``, ``keys`` and ``in-batch-compiled`` (``benchmarks/loss_speed.py``'s, measured on the
device), with fp32 and bf16 embeddings; CUDA-synchronised median times of one forward + backward.

Method: docs/benchmarks.md, "The losses on the device (benchmarks/measurements/losses.py)"
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from .common import Cell

DESCRIPTION = (
    "every contrastive loss's forward + backward on the device, fp32 and bf16 embeddings: in-batch N 64 / 256 "
    "against the plain dense-mask SupCon and PML SupConLoss; with K 4,096 keys at L 54 / 8,929 / 25,230, "
    "dense against sparse labels"
)


# the losses that cost more than the plain SupCon in eager mode, timed again under torch.compile
COMPILED_LOSSES = ("hbl", "msc", "ws_mulsupcon")


def cells(tiny: bool) -> list[Cell]:
    return [
        Cell(f"{table}-{dtype}", params={"table": table, "dtype": dtype}, timeout=900)
        for table in ("in-batch", "keys")
        for dtype in ("fp32", "bf16")
    ] + [Cell("in-batch-compiled", params={"table": "in-batch-compiled", "dtype": "fp32"}, timeout=900)]


def _timer(repeats: int, warmup: int):
    from .common import synchronize

    def time_pair(fn, ref) -> tuple[float, float]:
        for _ in range(warmup):
            fn()
            ref()
        a, b = [], []
        for _ in range(repeats):
            synchronize()
            t0 = time.perf_counter()
            fn()
            synchronize()
            a.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            ref()
            synchronize()
            b.append(time.perf_counter() - t0)
        return statistics.median(a), statistics.median(b)

    return time_pair


def _step(fn, z, *labels):
    def run():
        zz = z.detach().requires_grad_(True)
        for p in getattr(fn, "parameters", lambda: [])():
            p.grad = None
        fn(zz, *labels).backward()

    return run


def _with_checks(loss):
    """``loss`` called with its input checks on (a direct call's default), off again afterwards."""
    from hf_mlcl.losses.input_checks import set_input_checks

    def call(*args):
        set_input_checks(loss, True)
        try:
            return loss(*args)
        finally:
            set_input_checks(loss, False)

    call.parameters = loss.parameters
    return call


def _multi_label_batch(n: int, dim: int, labels: int, dev, dtype):
    """(embeddings (n, dim), multi-hot labels (n, labels)): about 2.4 labels per row, at least one each."""
    import torch

    gen = torch.Generator().manual_seed(n)
    z = torch.randn(n, dim, generator=gen).to(dev, dtype)
    y = (torch.rand(n, labels, generator=gen) < 1.4 / labels).float()
    y[torch.arange(n), torch.randint(0, labels, (n,), generator=gen)] = 1.0
    return z, y.to(dev), gen


def _build(name: str, labels: int, dim: int, dev, label_rows):
    """A registered loss built by ``loss_speed.build_loss`` (its keywords, statistics from ``label_rows``) on
    ``dev``, input checks off (as training runs it after the first batch)."""
    from types import SimpleNamespace

    import loss_speed as LS

    from hf_mlcl.losses.input_checks import set_input_checks

    loss = LS.build_loss(name, SimpleNamespace(labels=labels, dim=dim), label_rows).to(dev)
    set_input_checks(loss, False)
    return loss


def _compiled_table(tiny: bool, dev, time_pair, repeats: int) -> dict[str, Any]:
    import loss_speed as LS
    import torch

    from .common import synchronize

    n, dim, labels = (32, 16, 10) if tiny else (256, 128, 54)
    z, y, _ = _multi_label_batch(n, dim, labels, dev, torch.float32)

    def plain(e, lb):
        return LS.plain_supcon(e, lb, single=False)

    def first_call(fn) -> float:
        """Seconds of ``fn``'s first step: the compilation, for a compiled one."""
        synchronize()
        t0 = time.perf_counter()
        _step(fn, z, y)()
        synchronize()
        return time.perf_counter() - t0

    # the toy run checks the measurement, not the kernels (inductor's C++ code generation would take most of
    # it on a CPU): it traces with aot_eager; tests/losses/test_losses_compile.py checks inductor's numbers
    backend = "aot_eager" if tiny else "inductor"
    torch._dynamo.reset()
    plain_compiled = torch.compile(plain, backend=backend)
    plain_compile_s = first_call(plain_compiled)
    t_plain_c, t_plain = time_pair(_step(plain_compiled, z, y), _step(plain, z, y))
    rows = []
    for name in COMPILED_LOSSES:
        loss = _build(name, labels, dim, dev, y)
        compiled = torch.compile(loss, backend=backend)
        compile_s = first_call(compiled)
        t_comp, t_eager = time_pair(_step(compiled, z, y), _step(loss, z, y))
        rows.append(
            {
                "loss": name,
                "n": n,
                "dim": dim,
                "labels": labels,
                "compile_s": compile_s,
                "compiled_ms": t_comp * 1e3,
                "eager_ms": t_eager * 1e3,
                "plain_ms": t_plain * 1e3,
                "plain_compiled_ms": t_plain_c * 1e3,
                "compiled_over_plain": t_comp / t_plain,
                "compiled_over_plain_compiled": t_comp / t_plain_c,
            }
        )
    return {
        "table": "in-batch-compiled",
        "dtype": "fp32",
        "repeats": repeats,
        "rows": rows,
        "input_checks": False,
        "backend": backend,
        "plain_compile_s": plain_compile_s,
        "worst_compiled_over_plain": max(r["compiled_over_plain"] for r in rows),
        "checks": {},
    }


def _bind(fn, *args):
    def run():
        fn(*args)

    return run


def run(cell: Cell, tiny: bool, cache_dir: str) -> dict[str, Any]:
    import loss_speed as LS
    import torch
    import torch.nn.functional as F
    from pytorch_metric_learning.losses import SupConLoss

    from hf_mlcl.losses.registry import list_contrastive_losses

    from .common import device

    dev = device()
    dtype = torch.bfloat16 if cell.params["dtype"] == "bf16" else torch.float32
    repeats, warmup = (3, 1) if tiny else (15, 3)
    time_pair = _timer(repeats, warmup)
    names = list_contrastive_losses()
    rows: list[dict[str, Any]] = []
    if cell.params["table"] == "in-batch-compiled":
        return _compiled_table(tiny, dev, time_pair, repeats)
    if cell.params["table"] == "in-batch":
        dim, labels = (16, 10) if tiny else (128, 54)
        pml = SupConLoss(temperature=0.07)
        for n in (16, 32) if tiny else (64, 256):
            z, y, gen = _multi_label_batch(n, dim, labels, dev, dtype)
            classes = torch.randint(0, 10, (n,), generator=gen).to(dev)
            onehot = F.one_hot(classes, 10).float()
            plain_multi = _step(lambda e, lb: LS.plain_supcon(e, lb, single=False), z, y)
            plain_single = _step(lambda e, lb: LS.plain_supcon(e, lb, single=True), z, classes)
            for name in names:
                multi, single = _build(name, labels, dim, dev, y), _build(name, 10, dim, dev, onehot)
                t_multi, t_plain = time_pair(_step(multi, z, y), plain_multi)
                t_checked, _ = time_pair(_step(_with_checks(multi), z, y), _step(multi, z, y))
                t_single, t_plain_single = time_pair(_step(single, z, onehot), plain_single)
                t_single_pml, t_pml = time_pair(_step(single, z, onehot), _step(pml, z, classes))
                rows.append(
                    {
                        "loss": name,
                        "n": n,
                        "dim": dim,
                        "labels": labels,
                        "ms": t_multi * 1e3,
                        "plain_ms": t_plain * 1e3,
                        "over_plain": t_multi / t_plain,
                        "single_over_plain": t_single / t_plain_single,
                        "single_over_pml": t_single_pml / t_pml,
                        "pml_ms": t_pml * 1e3,
                        "checked_ms": t_checked * 1e3,
                    }
                )
        worst = max(max(r["over_plain"], r["single_over_plain"]) for r in rows)
        return {
            "table": "in-batch",
            "dtype": cell.params["dtype"],
            "repeats": repeats,
            "rows": rows,
            "input_checks": False,
            "worst_over_plain": worst,
            "checks": {},
        }
    dim, k = (16, 64) if tiny else (256, 4096)
    spaces = ((10, 2.4), (100, 4.0), (300, 4.0)) if tiny else ((54, 2.4), (8929, 16.0), (25230, 16.0))

    class Args:  # the fields loss_speed.make_inputs / build_loss read
        pass

    for n in (16, 32) if tiny else (64, 256):
        for labels, per_row in spaces:
            args = Args()
            args.n, args.k, args.dim, args.labels, args.per_row, args.zipf, args.seed = (
                n,
                k,
                dim,
                labels,
                per_row,
                1.0,
                0,
            )
            z, y, keys, yk, y_all = LS.make_inputs(args)
            z, keys = z.to(dev, dtype), keys.to(dev, dtype)
            y, yk = y.to(dev), yk.to(dev)
            y_dense, yk_dense = y.to_dense(), yk.to_dense()
            floor = _bind(LS.floor_step, z, y, keys, yk)
            for name in names:
                loss = _build(name, labels, dim, dev, y_all.to(dev))
                sparse_step = _bind(LS.loss_step, loss, z, y, keys, yk)
                dense_step = _bind(LS.loss_step, loss, z, y_dense, keys, yk_dense)
                t_dense, t_sparse = time_pair(dense_step, sparse_step)
                t_loss, t_floor = time_pair(sparse_step, floor)
                rows.append(
                    {
                        "loss": name,
                        "n": n,
                        "k": k,
                        "dim": dim,
                        "labels": labels,
                        "labels_per_row": per_row,
                        "dense_ms": t_dense * 1e3,
                        "sparse_ms": t_sparse * 1e3,
                        "dense_over_sparse": t_dense / t_sparse,
                        "floor_ms": t_floor * 1e3,
                        "sparse_over_floor": t_loss / t_floor,
                    }
                )
    top = max(s[0] for s in spaces)
    worst = max(r["dense_over_sparse"] for r in rows if r["labels"] == top)
    return {
        "table": "keys",
        "dtype": cell.params["dtype"],
        "repeats": repeats,
        "rows": rows,
        "input_checks": False,
        "worst_dense_over_sparse_at_max_labels": worst,
        "checks": {},
    }
