"""Write docs/PERFORMANCE.md from the GPU suite's results (``benchmarks/results/<device>/<measurement>.json``).

    python benchmarks/performance_doc.py            # rewrite docs/PERFORMANCE.md
    python benchmarks/performance_doc.py --check    # exit 1 when the committed file differs

One section per measurement of ``benchmarks/gpu_suite.py`` (in its priority order), one table per device
that measured it, with the device, the versions and the last command. GPU rows are absolute figures; rows of
the CPU check (``--tiny``, toy sizes on two shared cores) show only ratios and the checks. Every cell's
status names the commit it was measured at, and **stale** where its sources (``cell_sources``) changed in
git between that commit and HEAD. A cell without a result says "not yet measured"; a failed cell shows its
error.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
DOC = os.path.join(REPO, "docs", "PERFORMANCE.md")
STALE = "**stale**"
UNKNOWN = "(freshness unknown)"
# Where this generator's part of docs/PERFORMANCE.md ends: studies/make_tables.py writes what follows (the
# training cost of the results study, from its cells' records); --check compares the part before it only.
STUDY_MARK = (
    "<!-- studies/make_tables.py writes the rest of this file: the training cost of the results study -->"
)


def split_generated(text: str) -> tuple[str, str]:
    """(this generator's part, the results study's part starting at ``STUDY_MARK``, or "")."""
    i = text.find(STUDY_MARK)
    return (text, "") if i < 0 else (text[:i], text[i:])


def load(root: str = os.path.join(HERE, "results")) -> dict[str, dict[str, dict[str, Any]]]:
    """{measurement: {device folder: results}} of every ``<root>/<device>/<measurement>.json``."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in sorted(glob.glob(os.path.join(root, "*", "*.json"))):
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        out.setdefault(data["measurement"], {})[os.path.basename(os.path.dirname(path))] = data
    return out


def f(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def gib(memory: dict[str, float] | None) -> str:
    if not memory:
        return "–"
    if "allocated_gib" in memory:
        return f"{memory['allocated_gib']:.1f} / {memory['reserved_gib']:.1f}"
    return "–"


def syncs(values: list[int] | None) -> str:
    if not values:
        return "–"
    return f"{min(values)}–{max(values)}" if min(values) != max(values) else str(values[0])


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def one_line(error: str, limit: int) -> str:
    """An error on one line of at most about ``limit`` characters: whitespace collapsed, a long one cut in
    its middle (``gpu_suite.cut_middle``), so a message that holds a tensor's repr still shows what failed."""
    import gpu_suite

    return gpu_suite.cut_middle(" ".join(error.split()), limit)


def status(cell: dict[str, Any] | None) -> str:
    """A cell's status, with the commit it was measured at (``_at``, from :func:`annotate`)."""
    if cell is None:
        return "not yet measured"
    at = f" at {cell['_at']}" if cell.get("_at") else ""
    if cell["status"] == "ok":
        return f"ok{at}"
    if cell["status"] == "not_run":
        return f"not run: {cell['reason']}"
    return f"**failed**{at}: `{one_line(cell.get('error', ''), 160)}`"


def measured_at(commit: str | None, freshness: str) -> str:
    """```<commit>```, then **stale** or (freshness unknown) where that applies."""
    if not commit:
        return f"an unrecorded commit {UNKNOWN}"
    sha, plus, extra = commit.partition("+")
    mark = {"stale": f" {STALE}", "unknown": f" {UNKNOWN}"}.get(freshness, "")
    return f"`{sha[:10]}{plus}{extra}`{mark}"


def annotate(results: dict, changes) -> None:
    """Give every recorded cell ``_at``: the commit it was measured at (its own, else its file's: the last
    run's) and whether its sources changed since (``changes``: ``cell_sources.Changes``)."""
    import cell_sources

    for name, devices in results.items():
        for data in devices.values():
            for cell, entry in data.get("cells", {}).items():
                if entry.get("status") == "not_run":
                    continue
                commit = entry.get("git_commit") or data.get("git_commit")
                state, _ = changes.freshness(commit, cell_sources.sources(name, cell))
                entry["_at"] = measured_at(commit, state)


def sources_line(name: str) -> str:
    """What a measurement's figures are stale against (``cell_sources``)."""
    import cell_sources

    paths = ", ".join(f"`{p}`" for p in cell_sources.LIBRARY[name])
    extra = {
        "llama_lora": ", the cell's recipe with its `_base_` files and its launcher's accelerate config",
        "plm_icd": ", the cell's recipe with its `_base_` files",
    }.get(name, "")
    return f"Sources (a figure is **stale** when one changed after its commit): {paths}{extra}."


def provenance(data: dict[str, Any], folder: str) -> list[str]:
    dev, v = data["device"], data["versions"]
    threads = dev.get("threads")
    cores = f"{threads} thread{'s' if threads != 1 else ''}" if threads else "shared cores"
    name = dev["name"] if dev["kind"] == "cuda" else f"CPU check (`--tiny`: toy sizes, {cores}; ratios only)"
    peak = (
        f", bf16 dense peak {dev['bf16_dense_peak_tflops']} TFLOP/s"
        if dev.get("bf16_dense_peak_tflops")
        else ""
    )
    versions = ", ".join(f"{k} {val}" for k, val in v.items() if val)
    return [
        f"*{name}{peak}. {versions}. Last run at commit `{(data.get('git_commit') or '?')[:10]}`: "
        f"`{data['command']}` (each cell's own command: `benchmarks/results/{folder}/{data['measurement']}.json`).*",
        "",
    ]


# ----------------------------------------------------------------------------------- per measurement
def cell_entries(data: dict[str, Any], cells: list):
    """(cell, its result entry or None, its figures or None), in the measurement's cell order."""
    for cell in cells:
        entry = data["cells"].get(cell.name)
        yield cell, entry, (entry or {}).get("figures")


def unmeasured(head: list[str], first: list[str]) -> list[str]:
    """The row of a cell without figures: its first columns, then dashes to the width of ``head``."""
    return first + ["–"] * (len(head) - len(first))


def hfu(fig: dict[str, Any]) -> float:
    """The share of the device's bf16 peak that a llama_lora cell ran, recomputation and GradCache's no-grad
    forward included (``llama_lora.hardware_flops_per_token``)."""
    import gpu_suite

    # the recorded MFU scaled by the device's FLOPs over the model's (the same tokens/s and peak)
    return (
        fig["mfu"]
        * gpu_suite.measurement("llama_lora").hardware_flops_per_token(fig)
        / fig["flops_per_token"]
    )


def llama_lora(data: dict[str, Any], cells: list, gpu: bool) -> list[str]:
    head = ["cell", "model wrapped as", "status"]
    head += (
        [
            "GradCache chunk",
            "step s",
            "tokens/s",
            "model TFLOP/s",
            "MFU",
            "HFU",
            "peak GiB (alloc / reserved)",
            "host syncs / step",
        ]
        if gpu
        else []
    ) + ["reload max abs diff / min cosine"]
    rows = []
    for cell, entry, fig in cell_entries(data, cells):
        if not fig:
            rows.append(unmeasured(head, [cell.name, cell.launcher, status(entry)]))
            continue
        reload = fig["reload"]
        measured = (
            [
                f(fig["gradcache_chunk_size"], 0),
                f"{fig['step_time_s']['median']:.2f}",
                f"{fig['tokens_per_s']:.0f}",
                f"{fig['achieved_tflops']:.0f}",
                f"{100 * fig['mfu']:.1f} %" if fig.get("mfu") else "–",
                f"{100 * hfu(fig):.1f} %" if fig.get("mfu") else "–",
                gib(fig["peak_memory"]),
                syncs(fig.get("syncs_per_step")),
            ]
            if gpu
            else []
        )
        rows.append(
            [
                cell.name,
                fig["wrapper"],
                status(entry),
                *measured,
                f"{reload['max_abs_diff']:.2g} / {reload['min_cosine']:.5f}",
            ]
        )
    out = table(head, rows)
    measured = [fig for _, _, fig in cell_entries(data, cells) if fig]
    first = next((fig for fig in measured if fig["run"] != "msc"), None)
    queue = next((fig["queue_size"] for fig in measured if fig["run"] == "msc"), None)
    if first and gpu:
        out += [
            "",
            f"Batch {first['per_device_batch']} x {first['seq_len']} tokens per step, LoRA r {first['lora']['r']} "
            f"(alpha {first['lora']['alpha']}, dropout {first['lora']['dropout']}) on {', '.join(first['lora']['targets'])}; "
            f"{first['trainable_parameters'] / 1e6:.1f} M trainable of {first['parameters'] / 1e9:.2f} B parameters; "
            f"msc: queue of {f'{queue:,}' if queue else '–'} keys. Model FLOPs per token: `{first['formula']}` "
            f"(N = {first['matmul_parameters'] / 1e9:.2f} B matmul weights, N_lora = {first['lora_parameters'] / 1e6:.1f} M; "
            f"{first['flops_per_token'] / 1e9:.1f} GFLOP per token for sd and BCE; msc adds the momentum "
            f"encoder's forward of the same tokens). HFU counts what the device ran: one more forward per token "
            "with activation checkpointing (every cell) and one more with GradCache (chunk > 0), so with both "
            "MFU is at most half of HFU for sd and BCE.",
        ]
        merged = [
            f"{cell.name}: {fig['reload']['merged_load']['min_cosine']:.3f}"
            for cell, _, fig in cell_entries(data, cells)
            if fig
        ]
        out += [
            "",
            "The library's `from_pretrained` of the same folders merges the adapter into the bf16 base "
            f"weights; minimum cosine to the trained outputs: {', '.join(merged)}.",
        ]
    return out


def profiled(profile: dict[str, Any] | None) -> list[str]:
    """Kernels launched and their device time in the row's profiled step ('–' where not profiled)."""
    if not profile or profile.get("kernels") is None:
        return ["–", "–"]
    return [f(profile["kernels"]), f"{profile['device_ms']:.1f}"]


def throughput(data: dict[str, Any], cells: list, gpu: bool) -> list[str]:
    out: list[str] = []
    head = ["trainer", "samples/s relative to contrastive"]
    if gpu:
        head += [
            "samples/s (step)",
            "samples/s (wall, with data)",
            "step ms",
            "peak GiB",
            "host syncs / step",
            "kernels / step",
            "device ms / step",
        ]
    else:  # toy steps of a few ms on shared cores time noisily; the operators a step dispatches are exact
        head += ["aten operators / step"]
    for cell, entry, fig in cell_entries(data, cells):
        out += [f"**{cell.name}** ({status(entry)})", ""]
        if not fig:
            continue
        rows = []
        for row, r in fig["rows"].items():
            measured = (
                [
                    f"{r['samples_per_s']:.0f}",
                    f"{r['wall_samples_per_s']:.0f}",
                    f"{1e3 * r['step_time_s']['median']:.1f}",
                    gib(r["peak_memory"]),
                    syncs(r["syncs_per_step"]),
                    *profiled(r.get("profile")),
                ]
                if gpu
                else [f((r.get("profile") or {}).get("operators"))]
            )
            rows.append(
                [row, f"{r['samples_per_s'] / fig['rows']['contrastive']['samples_per_s']:.2f}", *measured]
            )
        out += table(head, rows)
        ratio = fig["ratios"]
        out += [
            "",
            f"ContrastiveTrainer / Trainer + BCE = {ratio['contrastive_over_trainer_bce']:.2f}; "
            f"/ SentenceTransformerTrainer (same loss) = {ratio['contrastive_over_st_mlcl']:.2f}; "
            f"/ MultipleNegativesRankingLoss = {ratio['contrastive_over_st_mnrl']:.2f} "
            f"(batch {fig['batch']} x {fig['seq_len']} tokens, {fig['rounds']} rounds x {fig['measured_steps_per_run']} steps).",
            "",
        ]
    return out


def plm_icd(data: dict[str, Any], cells: list, gpu: bool) -> list[str]:
    head = ["cell", "status"] + (
        [
            "labels",
            "batch x tokens",
            "GradCache chunk",
            "step s",
            "documents/s",
            "peak GiB (alloc / reserved)",
            "fits",
        ]
        if gpu
        else ["batch x tokens (toy)"]
    )
    rows = []
    for cell, entry, fig in cell_entries(data, cells):
        if not fig:
            rows.append(unmeasured(head, [cell.name, status(entry)]))
        elif gpu:
            rows.append(
                [
                    cell.name,
                    status(entry),
                    f(fig["num_labels"]),
                    f"{fig['per_device_batch']} x {fig['seq_len']}",
                    f(fig["gradcache_chunk_size"]),
                    f"{fig['step_time_s']['median']:.2f}",
                    f"{fig['documents_per_s']:.1f}",
                    gib(fig["peak_memory"]),
                    f(fig["fits"]),
                ]
            )
        else:
            rows.append([cell.name, status(entry), f"{fig['per_device_batch']} x {fig['seq_len']}"])
    return table(head, rows)


def losses(data: dict[str, Any], cells: list, gpu: bool) -> list[str]:
    """GPU rows: every loss's table; CPU-check rows: the worst ratio alone."""
    out: list[str] = []
    for cell, entry, fig in cell_entries(data, cells):
        out += [f"**{cell.name}** ({status(entry)})", ""]
        if not fig:
            continue
        if gpu and fig.get("input_checks", True):
            out += [
                "Measured with the losses' input checks on (host reads of the labels' values and of the "
                "result's finiteness in every call), which training turns off after the first batch.",
                "",
            ]
        if fig["table"] == "in-batch-compiled":
            if gpu:
                rows = [
                    [
                        r["loss"],
                        str(r["n"]),
                        f"{r['compiled_over_plain']:.2f}",
                        f"{r['compiled_over_plain_compiled']:.2f}",
                        f"{r['compiled_ms']:.3f}",
                        f"{r['eager_ms']:.3f}",
                        f"{r['plain_ms']:.3f}",
                        f"{r['plain_compiled_ms']:.3f}",
                        f"{r['compile_s']:.0f}",
                    ]
                    for r in fig["rows"]
                ]
                out += table(
                    [
                        "loss",
                        "N",
                        "compiled / plain SupCon",
                        "compiled / compiled plain SupCon",
                        "compiled ms",
                        "eager ms",
                        "plain ms",
                        "compiled plain ms",
                        "compile s",
                    ],
                    rows,
                ) + [""]
            out += [
                f"Worst compiled loss (backend {fig.get('backend', 'inductor')}) / eager plain SupCon: "
                f"{fig['worst_compiled_over_plain']:.2f}.",
                "",
            ]
            continue
        if fig["table"] == "in-batch":
            if gpu:
                rows = [
                    [
                        r["loss"],
                        str(r["n"]),
                        f"{r['over_plain']:.2f}",
                        f"{r['single_over_plain']:.2f}",
                        f"{r['single_over_pml']:.2f}",
                        f"{r['ms']:.3f}",
                        f"{r['plain_ms']:.3f}",
                        f"{r['checked_ms']:.3f}" if "checked_ms" in r else "–",
                    ]
                    for r in fig["rows"]
                ]
                out += table(
                    [
                        "loss",
                        "N",
                        "multi-label / plain SupCon",
                        "single-label / plain SupCon",
                        "single-label / PML SupConLoss",
                        "loss ms",
                        "plain ms",
                        "loss ms, input checks on",
                    ],
                    rows,
                ) + [""]

            out += [f"Worst ratio to the plain SupCon: {fig['worst_over_plain']:.2f}.", ""]
        else:
            if gpu:
                rows = [
                    [
                        r["loss"],
                        str(r["n"]),
                        str(r["labels"]),
                        f"{r['dense_over_sparse']:.2f}",
                        f"{r['sparse_over_floor']:.2f}",
                        f"{r['sparse_ms']:.2f}",
                        f"{r['dense_ms']:.2f}",
                    ]
                    for r in fig["rows"]
                ]
                out += table(
                    ["loss", "N", "L", "dense / sparse", "sparse / floor", "sparse ms", "dense ms"], rows
                ) + [""]
            out += [
                f"Worst dense / sparse at the largest L: {fig['worst_dense_over_sparse_at_max_labels']:.2f}.",
                "",
            ]
    return out


def gradcache(data: dict[str, Any], cells: list, gpu: bool) -> list[str]:
    head = [
        "cell",
        "status",
        "largest plain batch",
        "GradCache",
        "memory GradCache / plain",
        "samples/s GradCache / plain",
        "same loss",
    ]
    rows = []
    for cell, entry, fig in cell_entries(data, cells):
        if not fig:
            rows.append(unmeasured(head, [cell.name, status(entry)]))
            continue
        plain, cached = fig["largest_plain"], fig["gradcache"]
        if gpu:
            rows.append(
                [
                    cell.name,
                    status(entry),
                    f"{plain['batch']} ({plain['samples_per_s']:.0f} samples/s, {gib(plain['peak_memory'])} GiB)",
                    f"{fig['contrast_set']} in chunks of {fig['chunk']} ({cached['samples_per_s']:.0f} samples/s, {gib(cached['peak_memory'])} GiB)",
                    f"{fig['memory_ratio']:.2f}",
                    f"{fig['speed_ratio']:.2f}",
                    f(fig["same_loss"]["same"]),
                ]
            )
        else:
            rows.append(
                [
                    cell.name,
                    status(entry),
                    str(plain["batch"]),
                    str(fig["contrast_set"]),
                    "–",
                    f"{fig['speed_ratio']:.2f}",
                    f(fig["same_loss"]["same"]),
                ]
            )
    return table(head, rows)


def _label(cell: str, entry: dict[str, Any]) -> str:
    """A cell's name with the commit it was measured at (:func:`annotate`)."""
    return f"{cell} ({entry['_at']})" if entry.get("_at") else cell


def _gpu_cells(results, name):
    """(device, cell name with its commit, figures) of every measured GPU cell of a measurement."""
    for data in results.get(name, {}).values():
        if data["device"]["kind"] != "cuda":
            continue
        for cell, entry in data["cells"].items():
            if entry.get("figures"):
                yield data["device"], _label(cell, entry), entry["figures"]


def goals(results) -> list[str]:
    """The issue's goals against the GPU figures: met, not met, or not yet measured."""
    rows = []

    def row(goal, values, met):
        verdict = "not yet measured" if not values else ("met" if met else "**not met**")
        rows.append([goal, "; ".join(values) or "–", verdict])

    msc = [
        (d, c, f)
        for d, c, f in _gpu_cells(results, "llama_lora")
        if f["run"] == "msc" and f["launcher"] == "plain"
    ]
    # the recipe's batch: not the -fit cells, whose batch the memory model sizes for a larger GPU
    at_recipe = [(d, c, f) for d, c, f in msc if "-fit" not in c.split(" ", 1)[0]]
    fit = [
        f"{c}: {f['peak_memory']['reserved_gib']:.1f} of {d['memory_gib']:.0f} GiB ({d['name']})"
        for d, c, f in at_recipe
    ]
    row(
        "Llama-3.1-8B + LoRA, msc with a 4,096 queue, fits one 80 GB GPU at the recipe's batch",
        fit,
        all(f["peak_memory"]["reserved_gib"] < 80 for _, _, f in at_recipe),
    )
    row(
        "... and runs at >= 40 % MFU",
        [f"{c}: {100 * f['mfu']:.1f} % (HFU {100 * hfu(f):.1f} %)" for _, c, f in msc],
        any(f["mfu"] >= 0.40 for _, _, f in msc),
    )
    sharded = {  # every GPU's cells: one GPU's result does not hide another's
        (data["device"]["name"], c): e
        for data in results.get("llama_lora", {}).values()
        if data["device"]["kind"] == "cuda"
        for c, e in data["cells"].items()
        if e.get("launcher") in ("fsdp", "deepspeed")
    }
    said = [
        f"{_label(c, e)} ({gpu}): "
        + (
            "reloads"
            if e.get("figures", {}).get("reload", {}).get("same")
            else f"failed ({one_line(e.get('error', ''), 70)})"
        )
        for (gpu, c), e in sorted(sharded.items())
    ]
    row(
        "FSDP and ZeRO-3 save the adapter, and it reloads",
        said,
        {e["launcher"] for e in sharded.values()} == {"fsdp", "deepspeed"}
        and all(e.get("figures", {}).get("reload", {}).get("same") for e in sharded.values()),
    )
    tp = list(_gpu_cells(results, "throughput"))
    row(
        "ContrastiveTrainer >= 0.95x Trainer + BCE",
        [f"{c}: {f['ratios']['contrastive_over_trainer_bce']:.2f}" for _, c, f in tp],
        all(f["ratios"]["contrastive_over_trainer_bce"] >= 0.95 for _, _, f in tp),
    )
    row(
        ">= 1.0x SentenceTransformerTrainer with the same loss",
        [f"{c}: {f['ratios']['contrastive_over_st_mlcl']:.2f}" for _, c, f in tp],
        all(f["ratios"]["contrastive_over_st_mlcl"] >= 1.0 for _, _, f in tp),
    )
    row(
        "A non-logging training step makes zero device-to-host syncs",
        [f"{c}: {max(f['rows']['contrastive']['syncs_per_step'])}" for _, c, f in tp],
        all(max(f["rows"]["contrastive"]["syncs_per_step"]) == 0 for _, _, f in tp),
    )
    lb = [(c, f) for _, c, f in _gpu_cells(results, "losses") if f["table"] == "in-batch"]
    row(
        "Every loss <= 1.0x the plain dense-mask SupCon at N 64 and 256",
        [f"{c}: worst {f['worst_over_plain']:.2f}" for c, f in lb],
        all(f["worst_over_plain"] <= 1.0 for _, f in lb),
    )
    lk = [(c, f) for _, c, f in _gpu_cells(results, "losses") if f["table"] == "keys"]
    row(
        "Dense labels <= 1.1x sparse at L 25,230",
        [f"{c}: worst {f['worst_dense_over_sparse_at_max_labels']:.2f}" for c, f in lk],
        all(f["worst_dense_over_sparse_at_max_labels"] <= 1.1 for _, f in lk),
    )
    plm = [(d, c, f) for d, c, f in _gpu_cells(results, "plm_icd") if f["dataset"] == "mimic4_icd10_full"]
    row(
        "PLM-ICD at MIMIC-IV ICD-10 full fits one 80 GB GPU at the recipe's batch",
        [f"{c}: {f['peak_memory']['reserved_gib']:.1f} GiB ({d['name']})" for d, c, f in plm],
        all(f["peak_memory"]["reserved_gib"] < 80 for _, _, f in plm),
    )
    return ["## Goals", "", *table(["goal", "measured", "verdict"], rows), ""]


def render(root: str = os.path.join(HERE, "results"), repo: str = REPO) -> str:
    """The whole of docs/PERFORMANCE.md from the results under ``root``; a figure is stale when its sources
    changed in ``repo``'s git between the commit it was measured at and HEAD."""
    import cell_sources
    import gpu_suite

    results = load(root)
    annotate(results, cell_sources.Changes(repo, against="HEAD"))
    lines = [
        "# Performance",
        "",
        "Measured by `benchmarks/gpu_suite.py` and written by `benchmarks/performance_doc.py` from "
        "`benchmarks/results/`; do not edit by hand. Run the suite on a GPU with "
        "`python benchmarks/gpu_suite.py` (on a machine without internet: `benchmarks/prepare_device.py` "
        "here, then `bash benchmarks/device_run.sh` there: the cells one 540 s call measures, every unmet "
        "goal's first cell before any goal's second, which `bash benchmarks/device_run.sh --plan` prints), then "
        "`python benchmarks/performance_doc.py`. How each measurement works: [benchmarks.md](benchmarks.md).",
        "",
        "Every figure names the commit it was measured at. **stale** marks a figure whose sources (listed "
        "under each measurement) changed in git after that commit, so it may no longer describe the code; "
        f"{UNKNOWN} marks one whose commit git here cannot compare (outside this clone, or measured with "
        "uncommitted changes: `<commit>+uncommitted`).",
        "",
    ]
    lines += goals(results)
    renderers = {
        "llama_lora": llama_lora,
        "throughput": throughput,
        "plm_icd": plm_icd,
        "losses": losses,
        "gradcache": gradcache,
    }
    for i, name in enumerate(gpu_suite.MEASUREMENTS, 1):
        module = gpu_suite.measurement(name)
        lines += [
            f"## {i}. `{name}`",
            "",
            (module.__doc__ or "").strip().split("\n\n")[0].replace("\n", " "),
            "",
            sources_line(name),
            "",
        ]
        devices = results.get(name, {})
        gpu_devices = [d for d, data in devices.items() if data["device"]["kind"] == "cuda"]
        if not gpu_devices:
            lines += ["**GPU: not yet measured.**", ""]
        for folder in sorted(devices, key=lambda d: devices[d]["device"]["kind"] != "cuda"):
            data = devices[folder]
            gpu = data["device"]["kind"] == "cuda"
            lines += provenance(data, folder)
            lines += renderers[name](data, module.cells(data["tiny"]), gpu) + [""]
    return "\n".join(lines).rstrip() + "\n"


def without_freshness(text: str) -> str:
    """``text`` without the stale / unknown marks: what --check compares."""
    return text.replace(f" {STALE}", "").replace(f" {UNKNOWN}", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true")
    opts = ap.parse_args(argv)
    text = render()
    current = open(DOC, encoding="utf-8").read() if os.path.isfile(DOC) else ""
    own, study = split_generated(current)
    if opts.check:  # the marks say how old a figure is against the commit the page was written at: a later
        # commit may age a figure without making the page wrong, so the check compares the page without them
        if without_freshness(own).rstrip("\n") == without_freshness(text).rstrip("\n"):
            return 0
        print(f"{DOC} is out of date: run python benchmarks/performance_doc.py", file=sys.stderr)
        return 1
    with open(DOC, "w", encoding="utf-8") as fh:
        fh.write(text + ("\n" + study if study else ""))  # the results study's part is kept as it is
    print(f"wrote {os.path.relpath(DOC, REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
