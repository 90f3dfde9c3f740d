"""Speed and memory of every contrastive loss at MIMIC-IV ICD-10 scale, relative to a floor.

Defaults: N = 256 anchors, K = 4096 queued keys, D = 256, L = 25,230 labels (~16 a row) as sparse COO; also
small in-batch batches against two plain SupCon peers, and dense against sparse labels.

Run:  python benchmarks/loss_speed.py            (full scale, ~5-10 minutes on 2 cores)
      python benchmarks/loss_speed.py --quick    (tiny sizes, seconds)
      python benchmarks/loss_speed.py --no-memory --no-loops   (ratios only)
      python benchmarks/loss_speed.py --no-loops --no-memory --no-small --no-dense --no-mimic \\
          --queue-formats 28:1.2,90:1.3,160:2,256:3,512:3,1000:4,8929:12,25230:16   (queue label format)

Method: docs/benchmarks.md, "Loss speed and memory at MIMIC scale (benchmarks/loss_speed.py)"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import warnings

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle OpenMP threads sleep: CPU time = work done

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from hf_mlcl.labels import multihot as M  # noqa: E402
from hf_mlcl.labels import relations as R  # noqa: E402
from hf_mlcl.losses import get_loss  # noqa: E402
from hf_mlcl.losses.registry import list_contrastive_losses  # noqa: E402
from hf_mlcl.training.memory import EmbeddingQueue  # noqa: E402

warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")

LOSS_KWARGS = {
    "hbl": {"base": "mulsupcon"},
}


# ----------------------------------------------------------------------------------------- data
def zipf_labels(
    rows: int, num_labels: int, per_row: float, exponent: float, gen: torch.Generator
) -> torch.Tensor:
    """Sparse COO (rows, L) multi-hot: row sizes ~ Poisson(per_row) clipped to [1, 3*per_row], labels
    drawn without replacement with probability ~ 1 / rank**exponent (Gumbel top-k, chunked)."""
    logp = -exponent * torch.log(torch.arange(1, num_labels + 1, dtype=torch.float32))
    perm = torch.randperm(num_labels, generator=gen)  # label ids not ordered by frequency
    max_k = max(1, int(3 * per_row))
    sizes = torch.poisson(torch.full((rows,), float(per_row)), generator=gen).clamp(1, max_k).long()
    r_idx, c_idx = [], []
    for start in range(0, rows, 256):
        stop = min(rows, start + 256)
        u = torch.rand(stop - start, num_labels, generator=gen).clamp_min(1e-12)
        keys = logp[None, :] - torch.log(-torch.log(u))
        top = keys.topk(max_k, dim=1).indices
        keep = torch.arange(max_k)[None, :] < sizes[start:stop, None]
        rr = torch.arange(start, stop)[:, None].expand(-1, max_k)
        r_idx.append(rr[keep])
        c_idx.append(perm[top[keep]])
    idx = torch.stack([torch.cat(r_idx), torch.cat(c_idx)])
    return torch.sparse_coo_tensor(
        idx, torch.ones(idx.shape[1]), (rows, num_labels), check_invariants=False
    ).coalesce()


def make_inputs(args):
    gen = torch.Generator().manual_seed(args.seed)
    rows = args.n + args.k
    y_all = zipf_labels(rows, args.labels, args.per_row, args.zipf, gen)
    idx = y_all.indices()
    in_a = idx[0] < args.n
    y = torch.sparse_coo_tensor(
        idx[:, in_a], torch.ones(int(in_a.sum())), (args.n, args.labels), check_invariants=False
    ).coalesce()
    kidx = idx[:, ~in_a].clone()
    kidx[0] -= args.n
    yk = torch.sparse_coo_tensor(
        kidx, torch.ones(kidx.shape[1]), (args.k, args.labels), check_invariants=False
    ).coalesce()
    z = torch.randn(args.n, args.dim, generator=gen)
    k = F.normalize(torch.randn(args.k, args.dim, generator=gen), dim=1)
    return z, y, k, yk, y_all


# ----------------------------------------------------------------------------------------- floor
def floor_step(z, y, k, yk, tau=0.1, prototypes=None):
    """z @ [z; k (; C)]^T / tau, masked logsumexp, backward; plus the sparse intersection product."""
    zz = z.detach().requires_grad_(True)
    zn = F.normalize(zz, dim=1)
    parts = [zn, k]
    if prototypes is not None:
        parts.append(F.normalize(prototypes, dim=1))
    c = torch.cat(parts)
    logits = zn @ c.T / tau
    n = zn.shape[0]
    eye = torch.zeros_like(logits, dtype=torch.bool)
    eye[:, :n] = torch.eye(n, dtype=torch.bool)
    lse = torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=1)
    lse.sum().backward()
    with torch.no_grad():
        R.intersections(y, R.cat_labels(y, yk))
    return lse


# ----------------------------------------------------------------------------------------- loops
def _label_lists(labels: torch.Tensor):
    """{label: LongTensor of rows} via a Python dict (public-code style)."""
    idx = labels.coalesce().indices()
    order = torch.argsort(idx[1], stable=True)
    cols, rows = idx[1][order], idx[0][order]
    uniq, counts = torch.unique_consecutive(cols, return_counts=True)
    return dict(zip(uniq.tolist(), torch.split(rows, counts.tolist())))


def _masked_logp(zn, cn, n, tau):
    logits = zn @ cn.T / tau
    eye = torch.zeros_like(logits, dtype=torch.bool)
    eye[:, :n] = torch.eye(n, dtype=torch.bool)
    return logits, eye


def mulsupcon_loop(z, y, k, yk, tau=0.1):
    """MulSupCon with a Python loop over labels (one positive set per label, as in public code)."""
    zn = F.normalize(z, dim=1)
    cn = torch.cat([zn, k])
    n = zn.shape[0]
    logits, eye = _masked_logp(zn, cn, n, tau)
    logp = logits - torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=1, keepdim=True)
    anchors_of = _label_lists(y)
    cands_of = _label_lists(R.cat_labels(M.as_multihot(y), M.as_multihot(yk)))
    total = logp.new_zeros(())
    pairs = 0
    for label, rows in anchors_of.items():
        cols = cands_of[label]
        lp = logp[rows][:, cols]
        not_self = cols[None, :] != rows[:, None]
        cnt = not_self.sum(1)
        ok = cnt > 0
        total = total - ((lp * not_self).sum(1)[ok] / cnt[ok]).sum()
        pairs += int(ok.sum())
    return total / max(pairs, 1)


def msc_loop(z, y, k, yk, prototypes, tau=0.1, beta=0.1):
    """ABALONE L_MSC with a Python loop over labels for N(i, j) and the positive sums."""
    zn = F.normalize(z, dim=1)
    cn = torch.cat([zn, k])
    n = zn.shape[0]
    logits, eye = _masked_logp(zn, cn, n, tau)
    sp = zn @ F.normalize(prototypes, dim=1).T / tau
    lse = torch.logaddexp(
        math.log(beta) + torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=1),
        torch.logsumexp(sp, dim=1),
    )
    ya, yc = M.as_multihot(y), R.cat_labels(M.as_multihot(y), M.as_multihot(yk))
    sizes_a, sizes_c = R.label_sizes(ya), R.label_sizes(yc)
    inter = R.intersections(ya, yc)
    union = sizes_a[:, None] + sizes_c[None, :] - inter
    anchors_of, cands_of = _label_lists(y), _label_lists(yc)
    acc = torch.zeros(n)
    for label, rows in anchors_of.items():
        cols = cands_of[label]
        f = (1.0 / union[rows][:, cols]) * (cols[None, :] != rows[:, None])
        n_ij = 1.0 + f.sum(1)
        term = (f * (logits[rows][:, cols] - lse[rows, None])).sum(1) + (sp[rows, label] - lse[rows])
        acc = acc.index_add(0, rows, term / n_ij)
    valid = sizes_a > 0
    return (-acc[valid] / sizes_a[valid]).mean()


def hbl_loop(z, y, k, yk, base_fn, lambda_=0.01, gamma=0.8, m_rel=0.1, m_abs=0.3, k_min=128):
    """HBL with a Python loop over anchors (numpy median per anchor), as a straightforward port."""
    base = base_fn(z, y, k, yk)
    zn = F.normalize(z, dim=1)
    cn = torch.cat([zn, k])
    n = zn.shape[0]
    ya, yc = M.as_multihot(y), R.cat_labels(M.as_multihot(y), M.as_multihot(yk))
    inter = R.intersections(ya, yc)
    union = R.label_sizes(ya)[:, None] + R.label_sizes(yc)[None, :] - inter
    jac = torch.where(union > 0, inter / union.clamp_min(1), torch.zeros_like(inter))
    sim = zn @ cn.T
    total = sim.new_zeros(())
    for i in range(n):
        mask = torch.ones(cn.shape[0], dtype=torch.bool)
        mask[i] = False
        pos = (inter[i] > 0) & mask
        if int(pos.sum()) < k_min:
            continue
        neg = (inter[i] == 0) & mask
        theta = float(np.median(jac[i][pos].numpy()))
        soft, hard = pos & (jac[i] >= theta), pos & (jac[i] < theta)
        if not soft.any() or not hard.any():
            continue
        l_rel = torch.relu(sim[i][hard].max() - sim[i][soft].min() + m_rel)
        l_abs = torch.relu(sim[i][neg].max() - sim[i][hard].min() + m_abs) if neg.any() else 0.0
        total = total + l_rel + gamma * l_abs
    return base + lambda_ * total / n


# ----------------------------------------------------------------------------------------- peers
def plain_supcon(z, labels, tau=0.07, single=True):
    """SupCon in ten lines: the in-process floor for small in-batch steps (positives: same class, or
    for multi-hot rows a shared label)."""
    zn = F.normalize(z, dim=1)
    logits = zn @ zn.T / tau
    eye = torch.eye(z.shape[0], dtype=torch.bool, device=z.device)
    pos = ((labels[:, None] == labels[None, :]) if single else (labels @ labels.T > 0)) & ~eye
    logp = logits - logits.masked_fill(eye, float("-inf")).logsumexp(dim=1, keepdim=True)
    n_pos = pos.sum(dim=1)
    mean_logp = logp.masked_fill(~pos, 0.0).sum(dim=1) / n_pos.clamp_min(1)
    return -mean_logp[n_pos > 0].mean()


def small_inputs(n, dim, single, gen):
    z = torch.randn(n, dim, generator=gen)
    if single:
        classes = torch.randint(0, 10, (n,), generator=gen)
        return z, classes, F.one_hot(classes, 10).float()
    y = (torch.rand(n, 50, generator=gen) < 3 / 50).float()
    return z, y, y


# ----------------------------------------------------------------------------------------- timing
def time_fn(fn, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def time_pair(fn, ref_fn, repeats: int, warmup: int) -> dict[str, float]:
    """Median wall and process-CPU times of ``fn`` and ``ref_fn`` measured in alternating rounds.

    On a shared, oversubscribed machine wall time partly measures the scheduler; process CPU time
    (all threads, idle OpenMP threads sleeping) measures the work done. Both are reported.
    """
    for _ in range(warmup):
        fn()
        ref_fn()
    wa, wb, ca, cb = [], [], [], []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wa.append(time.perf_counter() - t0)
        ca.append(time.process_time() - c0)
        c0, t0 = time.process_time(), time.perf_counter()
        ref_fn()
        wb.append(time.perf_counter() - t0)
        cb.append(time.process_time() - c0)
    med = statistics.median
    return {"wall": med(wa), "wall_ref": med(wb), "cpu": med(ca), "cpu_ref": med(cb)}


def time_pair_batched(fn, ref_fn, repeats: int, inner: int) -> dict[str, float]:
    """:func:`time_pair` for sub-millisecond calls: each sample times ``inner`` consecutive calls."""

    def many(f):
        def run():
            for _ in range(inner):
                f()

        return run

    r = time_pair(many(fn), many(ref_fn), repeats, 2)
    return {key: value / inner for key, value in r.items()}


def build_loss(name, args, y_all):
    kwargs = dict(LOSS_KWARGS.get(name, {}))
    if name == "msc" or (name == "hbl" and kwargs.get("base") == "msc"):
        kwargs.update(num_labels=args.labels, embedding_dim=args.dim)
    loss = get_loss(name, **kwargs)
    if getattr(loss, "requires_label_statistics", False):
        loss.set_label_statistics(y_all)  # stands in for the training labels
    return loss


def loss_step(loss, z, y, k, yk):
    zz = z.detach().requires_grad_(True)
    for p in loss.parameters():
        p.grad = None
    out = loss(zz, y, k, yk)
    out.backward()
    return out


def _proc_status_kib(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{key} not in /proc/self/status")


def memory_child(args) -> None:
    """Subprocess: peak resident-memory increase of one forward+backward of ``args.child``.

    The kernel's RSS high-water mark is reset after the inputs are built (``/proc/self/clear_refs``
    = 5), so the figure is VmHWM(after the step) - VmRSS(before the step).
    """
    torch.set_num_threads(args.threads)
    z, y, k, yk, y_all = make_inputs(args)
    name = args.child
    if name.startswith("floor"):
        protos = torch.randn(args.labels, args.dim, requires_grad=True) if name == "floor+protos" else None
        step = lambda: floor_step(z, y, k, yk, prototypes=protos)  # noqa: E731
    else:
        loss = build_loss(name, args, y_all)
        step = lambda: loss_step(loss, z, y, k, yk)  # noqa: E731
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    base = _proc_status_kib("VmRSS")
    step()
    peak = _proc_status_kib("VmHWM")
    print(json.dumps({"extra_mib": (peak - base) / 1024.0}))


def measure_memory(name: str, argv: list[str]) -> float | None:
    cmd = [sys.executable, os.path.abspath(__file__), *argv, "--child", name]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=True)
        return json.loads(res.stdout.strip().splitlines()[-1])["extra_mib"]
    except Exception as err:  # pragma: no cover - diagnostics only
        print(f"  (memory probe for {name} failed: {err})")
        return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=256, help="anchors per batch")
    p.add_argument("--k", type=int, default=4096, help="keys (queue) per batch")
    p.add_argument("--dim", type=int, default=256, help="embedding dimension")
    p.add_argument("--labels", type=int, default=25230, help="number of labels L")
    p.add_argument("--per-row", type=float, default=16.0, help="mean labels per row")
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the label frequency")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--losses", nargs="*", default=None, help="subset of contrastive losses (default: all)")
    p.add_argument("--no-loops", action="store_true", help="skip the per-label Python-loop baselines")
    p.add_argument("--no-memory", action="store_true", help="skip the RSS peak-memory subprocesses")
    p.add_argument("--quick", action="store_true", help="tiny sizes (N=32, K=128, D=32, L=500)")
    p.add_argument("--no-small", action="store_true", help="skip the small in-batch peer comparison")
    p.add_argument("--no-dense", action="store_true", help="skip the dense-vs-sparse label comparison")
    p.add_argument("--no-mimic", action="store_true", help="skip the MIMIC-scale floor table")
    p.add_argument("--small-repeats", type=int, default=15, help="samples per small-batch timing")
    p.add_argument(
        "--queue-formats",
        default=None,
        metavar="L:PER_ROW,...",
        help="also time one loss step with the keys' labels as an EmbeddingQueue holds them, a (K, L) bool "
        "matrix vs label rows, for each label-space size L (e.g. 90:1.3,256:3,1000:4,25230:16)",
    )
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    raw = sys.argv[1:] if argv is None else argv
    args = p.parse_args(raw)
    if args.quick:
        args.n, args.k, args.dim, args.labels, args.per_row = 32, 128, 32, 500, 4.0
        args.repeats, args.warmup = min(args.repeats, 3), 1
    if args.child:
        memory_child(args)
        return
    child_argv = [a for a in raw if a != "--child"]

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    z, y, k, yk, y_all = make_inputs(args)
    nnz = y._nnz() + yk._nnz()
    print(
        f"# loss_speed: N={args.n} K={args.k} D={args.dim} L={args.labels} labels/row={nnz / (args.n + args.k):.1f} "
        f"(Zipf {args.zipf}), sparse COO labels, threads={args.threads}, torch {torch.__version__}, "
        f"median of {args.repeats} after {args.warmup} warm-up"
    )
    mat = args.n * (args.n + args.k) * 4 / 2**20
    print(
        f"# sizes: (N, N+K) fp32 = {mat:.1f} MiB; (N, L) fp32 = {args.n * args.labels * 4 / 2**20:.1f} MiB; "
        f"(N, N+K, L) fp32 would be {mat * args.labels / 1024:.1f} GiB"
    )
    names = args.losses or list_contrastive_losses()

    protos = torch.randn(args.labels, args.dim, requires_grad=True)

    def floor_fn():
        floor_step(z, y, k, yk)

    def floor_p_fn():
        floor_step(z, y, k, yk, prototypes=protos)

    if not args.no_small:
        small_batch_table(args, names)
    if not args.no_dense:
        dense_vs_sparse_table(args, names, z, y, k, yk, y_all)
    if args.queue_formats:
        queue_format_table(args, [n for n in ("mulsupcon", "any") if n in names] or names[:1])
    if args.no_mimic:
        return
    fl = time_pair(floor_p_fn, floor_fn, args.repeats, args.warmup)
    print(
        f"floor (z@[z;k]^T + logsumexp fwd+bwd + sparse Y@Yc^T): wall {fl['wall_ref'] * 1e3:8.2f} ms, "
        f"cpu {fl['cpu_ref'] * 1e3:8.2f} ms"
    )
    print(
        f"floor+protos (candidates [z;k;C], C = L prototypes):   wall {fl['wall'] * 1e3:8.2f} ms, "
        f"cpu {fl['cpu'] * 1e3:8.2f} ms"
    )
    proto_factor = fl["cpu"] / fl["cpu_ref"]
    mem_floor = None if args.no_memory else measure_memory("floor", child_argv)
    mem_floor_p = None if args.no_memory else measure_memory("floor+protos", child_argv)
    print("# each loss is timed in rounds alternating with its floor; ratio = median(loss) / median(floor),")
    print("# from process CPU time (robust to other users' load) and from wall time")
    print()
    header = (
        f"{'loss':<26}{'cpu ms':>9}{'floor':>9}{'ratio':>7}{'wall ms':>9}{'floor':>9}{'ratio':>7}"
        f"{'target':>8}  {'peak MiB':>8}  notes"
    )
    print(header)
    print("-" * len(header))
    if mem_floor is not None:
        print(f"{'floor':<26}{'':>65}  {mem_floor:>8.1f}")
        print(f"{'floor+protos':<26}{'':>65}  {mem_floor_p:>8.1f}")
    results = {}
    for name in names:
        loss = build_loss(name, args, y_all)
        ref_fn = floor_p_fn if name == "msc" else floor_fn
        r = time_pair(lambda loss=loss: loss_step(loss, z, y, k, yk), ref_fn, args.repeats, args.warmup)
        results[name] = r
        target = 2.5 if name == "hbl" else 1.5
        ratio = r["cpu"] / r["cpu_ref"]
        mem = None if args.no_memory else measure_memory(name, child_argv)
        note = ""
        if name == "msc":
            note = f"floor = floor+protos; vs plain floor {ratio * proto_factor:.2f}"
        if name == "hbl":
            note = f"base mulsupcon, k_min={loss.k_min}"
        ok = "ok" if ratio <= target else "MISS"
        mem_s = f"{mem:8.1f}" if mem is not None else f"{'-':>8}"
        print(
            f"{name:<26}{r['cpu'] * 1e3:>9.1f}{r['cpu_ref'] * 1e3:>9.1f}{ratio:>7.2f}"
            f"{r['wall'] * 1e3:>9.1f}{r['wall_ref'] * 1e3:>9.1f}{r['wall'] / r['wall_ref']:>7.2f}"
            f"{'<=' + str(target):>8}  {mem_s}  {ok} {note}".rstrip()
        )

    if not args.no_loops:
        print()
        print("Python-loop versions (public-code style) of the same losses, same inputs (cpu time):")
        print(f"{'loss':<26}{'cpu ms':>9}{'floor':>9}{'ratio':>7}{'speed-up':>10}  same value")
        loops = {}
        if "mulsupcon" in names:
            loops["mulsupcon"] = (
                lambda zz: mulsupcon_loop(zz, y, k, yk),
                build_loss("mulsupcon", args, y_all),
            )
        if "msc" in names:
            msc = build_loss("msc", args, y_all)
            loops["msc"] = (lambda zz, m=msc: msc_loop(zz, y, k, yk, m.prototypes), msc)
        if "hbl" in names:
            hbl = build_loss("hbl", args, y_all)
            loops["hbl"] = (lambda zz, h=hbl: hbl_loop(zz, y, k, yk, h.base, k_min=h.k_min), hbl)
        for name, (fn, vec) in loops.items():

            def step(fn=fn):
                zz = z.detach().requires_grad_(True)
                out = fn(zz)
                out.backward()
                return out

            ref_fn = floor_p_fn if name == "msc" else floor_fn
            r = time_pair(step, ref_fn, max(1, min(args.repeats, 3)), 1)
            with torch.no_grad():
                a = float(fn(z))
                b = float(vec(z, y, k, yk))
            same = abs(a - b) <= 1e-4 * max(1.0, abs(b))
            ratio = r["cpu"] / r["cpu_ref"]
            speed = (
                ratio / (results[name]["cpu"] / results[name]["cpu_ref"]) if name in results else float("nan")
            )
            print(
                f"{name + ' (loop)':<26}{r['cpu'] * 1e3:>9.1f}{r['cpu_ref'] * 1e3:>9.1f}{ratio:>7.2f}"
                f"{speed:>9.1f}x  {same} ({a:.6f} vs {b:.6f})"
            )


def small_batch_table(args, names) -> None:
    """Every loss vs the plain SupCon and PML's SupConLoss on small in-batch steps (cpu-time ratios)."""
    try:
        from pytorch_metric_learning.losses import SupConLoss
    except ImportError:  # pragma: no cover - the dev extra installs it
        SupConLoss = None
    print(
        "# small in-batch steps (no keys, dense labels, D=128): forward+backward, each loss timed in rounds"
    )
    print(
        "# alternating with its peer; ratio = median cpu(loss) / median cpu(peer), and the same from wall time"
    )
    print(
        "# (the losses run small steps on one intra-op thread, which saves more CPU than wall time); the goal"
    )
    print(
        "# (<= 1.0, hbl <= 1.5) is checked on the larger of the cpu and wall ratios against the plain SupCon"
    )
    header = (
        f"{'loss':<26}{'N':>5}{'single/plain':>14}{'single/PML':>12}{'multi/plain':>13}"
        f"{'wall single':>13}{'wall multi':>12}  goal"
    )
    print(header)
    print("-" * len(header))
    sizes = (32,) if args.quick else (64, 256)
    inner = 3 if args.quick else 10
    repeats = 3 if args.quick else args.small_repeats
    pml = None if SupConLoss is None else SupConLoss(temperature=0.07)
    for n in sizes:
        gen = torch.Generator().manual_seed(args.seed + n)
        batches = {single: small_inputs(n, 128, single, gen) for single in (True, False)}

        def step(fn, z, lab):
            def run():
                zz = z.detach().requires_grad_(True)
                for prm in getattr(fn, "parameters", lambda: [])():
                    prm.grad = None
                fn(zz, lab).backward()

            return run

        base = {}
        for single, (z, lab_peer, _) in batches.items():
            base[single] = step(lambda e, lb, s=single: plain_supcon(e, lb, single=s), z, lab_peer)
        for name in names:
            cells, walls = [], []
            for single, (z, lab_peer, y) in batches.items():
                kwargs = dict(LOSS_KWARGS.get(name, {}))
                if name == "msc":
                    kwargs.update(num_labels=y.shape[1], embedding_dim=128)
                loss = get_loss(name, **kwargs)
                if getattr(loss, "requires_label_statistics", False):
                    loss.set_label_statistics(y)
                r = time_pair_batched(step(loss, z, y), base[single], repeats, inner)
                cells.append(r["cpu"] / r["cpu_ref"])
                walls.append(r["wall"] / r["wall_ref"])
                if single:
                    if pml is None:
                        cells.append(float("nan"))
                    else:
                        rp = time_pair_batched(step(loss, z, y), step(pml, z, lab_peer), repeats, inner)
                        cells.append(rp["cpu"] / rp["cpu_ref"])
            goal = 1.5 if name == "hbl" else 1.0
            worst = max(cells[0], cells[2], *walls)
            print(
                f"{name:<26}{n:>5}{cells[0]:>14.2f}{cells[1]:>12.2f}{cells[2]:>13.2f}{walls[0]:>13.2f}{walls[1]:>12.2f}  "
                f"<= {goal} {'ok' if worst <= goal else 'MISS'}"
            )
    print()


def dense_vs_sparse_table(args, names, z, y, k, yk, y_all) -> None:
    """The same loss with float32 (and bool) dense labels vs sparse COO labels, same inputs (cpu-time ratios)."""
    y_dense, yk_dense = y.to_dense(), yk.to_dense()
    y_bool, yk_bool = y_dense.bool(), yk_dense.bool()
    print(
        f"# dense vs sparse labels at N={args.n} K={args.k} L={args.labels}: float32 dense (N, L) and (K, L) "
        "label matrices vs sparse COO;"
    )
    print("# ratio = median cpu(dense) / median cpu(sparse), alternating rounds; goal <= 1.3")

    def read_once():  # one pass over both dense matrices: the least any loss must spend on them
        y_dense.sum()
        yk_dense.sum()

    read = time_pair(read_once, read_once, args.repeats, args.warmup)
    read_cpu = (read["cpu"] + read["cpu_ref"]) / 2
    print(
        f"# reading the dense labels once ({(y_dense.numel() + yk_dense.numel()) * 4 / 2**20:.0f} MiB, a sum): "
        f"cpu {read_cpu * 1e3:.1f} ms, wall {(read['wall'] + read['wall_ref']) / 2 * 1e3:.1f} ms; "
        "'after read' = (dense - read) / sparse, the part of the gap the engine controls; 'bool' = "
        "cpu(bool dense (N, L) and (K, L)) / cpu(sparse)"
    )
    # what ContrastiveTrainer hands the loss: the collator's dense batch labels, the keys' labels from
    # an EmbeddingQueue with its default ("auto") label format
    queue = EmbeddingQueue(args.k, args.dim, args.labels)
    queue.enqueue(k, yk)
    yk_queue = queue.labels
    print(
        f"# 'queue keys' = cpu(dense (N, L) batch labels, keys' labels from EmbeddingQueue (label_format "
        f"auto -> {queue.label_format!r})) / cpu(sparse): what ContrastiveTrainer passes"
    )
    header = f"{'loss':<26}{'dense ms':>10}{'sparse ms':>11}{'ratio':>7}{'after read':>12}{'bool':>7}{'queue keys':>12}  goal"
    print(header)
    print("-" * len(header))
    for name in names:
        loss = build_loss(name, args, y_all)
        with torch.no_grad():
            a = float(loss(z, y_dense, k, yk_dense))
            b = float(loss(z, y, k, yk))
            a_bool = float(loss(z, y_bool, k, yk_bool))
        same = all(abs(v - b) <= 1e-4 * max(1.0, abs(b)) for v in (a, a_bool))
        r = time_pair(
            lambda loss=loss: loss_step(loss, z, y_dense, k, yk_dense),
            lambda loss=loss: loss_step(loss, z, y, k, yk),
            args.repeats,
            args.warmup,
        )
        rb = time_pair(
            lambda loss=loss: loss_step(loss, z, y_bool, k, yk_bool),
            lambda loss=loss: loss_step(loss, z, y, k, yk),
            args.repeats,
            args.warmup,
        )
        rq = time_pair(
            lambda loss=loss: loss_step(loss, z, y_dense, k, yk_queue),
            lambda loss=loss: loss_step(loss, z, y, k, yk),
            args.repeats,
            args.warmup,
        )
        ratio = r["cpu"] / r["cpu_ref"]
        after = (r["cpu"] - read_cpu) / r["cpu_ref"]
        print(
            f"{name:<26}{r['cpu'] * 1e3:>10.1f}{r['cpu_ref'] * 1e3:>11.1f}{ratio:>7.2f}{after:>12.2f}"
            f"{rb['cpu'] / rb['cpu_ref']:>7.2f}{rq['cpu'] / rq['cpu_ref']:>12.2f}  <= 1.3 "
            f"{'ok' if ratio <= 1.3 else 'MISS'}{'' if same else f'  VALUES DIFFER ({a}, bool {a_bool} vs {b})'}"
        )
    print()


def queue_format_table(args, names) -> None:
    """One loss step (dense float batch labels, K keys from an EmbeddingQueue) with the queue's labels as a
    (K, L) bool matrix against label rows, for each L of ``--queue-formats``: where EmbeddingQueue's
    ``label_format="auto"`` should switch to label rows on this device."""
    print(
        f"# queue label format at N={args.n} K={args.k}: cpu(step, keys' labels a (K, L) bool matrix) / "
        "cpu(step, label rows -> sparse COO); above 1 the rows are faster; auto = what EmbeddingQueue picks"
    )
    header = f"{'L':>7}{'labels/row':>11}  " + "".join(f"{n + ' bool/rows':>22}" for n in names) + "  auto"
    print(header)
    print("-" * len(header))
    for spec in args.queue_formats.split(","):
        num_labels, per_row = int(spec.split(":")[0]), float(spec.split(":")[1])
        sized = argparse.Namespace(**{**vars(args), "labels": num_labels, "per_row": per_row})
        z, y, k, yk, y_all = make_inputs(sized)
        queues = {}
        for fmt in ("bool", "sparse"):
            queues[fmt] = EmbeddingQueue(args.k, args.dim, num_labels, label_format=fmt)
            queues[fmt].enqueue(k, yk)
        y_dense, cells = y.to_dense(), []
        for name in names:
            loss = build_loss(name, sized, y_all)
            as_bool = (z, y_dense, queues["bool"].embeddings, queues["bool"].labels)
            as_rows = (z, y_dense, queues["sparse"].embeddings, queues["sparse"].labels)
            r = time_pair(
                lambda loss=loss, a=as_bool: loss_step(loss, *a),
                lambda loss=loss, a=as_rows: loss_step(loss, *a),
                args.repeats,
                args.warmup,
            )
            cells.append(f"{r['cpu'] / r['cpu_ref']:>22.2f}")
        auto = EmbeddingQueue(args.k, args.dim, num_labels).label_format
        print(f"{num_labels:>7}{per_row:>11.1f}  " + "".join(cells) + f"  {auto}")
    print()


if __name__ == "__main__":
    main()
