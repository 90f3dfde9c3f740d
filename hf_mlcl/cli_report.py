"""What ``hf-mlcl`` prints around its commands: main-process lines, ``run``'s stage headers and its report.

:func:`report_run` writes ``results.json``, prints the table, pushes and prints the footprint at the end of
``run``. Only :mod:`hf_mlcl.cli` imports this module.

Design: docs/design.md, "Command line (hf_mlcl/cli.py)".
"""

from __future__ import annotations

import os


def say(msg: str) -> None:
    """Print on the main process only (``accelerate launch`` sets RANK on every process)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(msg, flush=True)


def announce(i: int, n: int, name: str, args, result) -> None:
    """``hf-mlcl run``'s lines around a stage: a header before it, where its model went after it."""
    if result is None:
        if name == "contrastive":
            what = f"contrastive training of the encoder (loss: {args.loss})"
        elif name == "joint":
            what = (
                f"joint fine-tune of encoder and head ((1 - w) {args.supervised_loss} + w {args.loss}, "
                f"w = {args.contrastive_weight})"
            )
        else:
            what = "multi-label head on the encoder"
        say(f"\n=== hf-mlcl run: stage {i}/{n}: {what} -> {args.output_dir}")
    else:
        say(saved_line(name, args.output_dir, result))


def saved_line(name: str, output_dir: str, result) -> str:
    """Where a stage's model is; a stage a resume found finished with the same settings was not trained again."""
    model = "encoder" if name == "contrastive" else "classifier"
    if getattr(result, "skipped", False):
        return f"{model} kept in {output_dir} (finished earlier with these settings)"
    return f"{model} saved to {output_dir}"


def report_run(ns, run_root: str, results: dict, final: str, classifier_dir: str) -> None:
    """The main process's end of ``run``: results.json, the table, the optional push and the footprint."""
    from hf_mlcl.evaluation.tables import format_table
    from hf_mlcl.files import atomic_write_json

    metrics = results[final].metrics
    summary = {k: v for k, v in metrics.items() if k.startswith(("test_", "validation_")) or k == "threshold"}
    os.makedirs(run_root, exist_ok=True)
    atomic_write_json(
        os.path.join(run_root, "results.json"), {k: r.metrics for k, r in results.items()}, default=str
    )
    print(format_table([{"run": os.path.basename(os.path.normpath(run_root)), **summary}], show_split=True))
    print(
        f"results: {os.path.join(run_root, 'results.json')}   classifier (model card, metrics, plots): "
        f"{classifier_dir}",
        flush=True,
    )
    if ns.push_to:
        from hf_mlcl.hub import push_folder
        from hf_mlcl.hub.locate import hub_endpoint

        push_folder(classifier_dir, ns.push_to, private=ns.private)
        if "contrastive" in results:
            push_folder(results["contrastive"].output_dir, f"{ns.push_to}-encoder", private=ns.private)
        print(f"pushed to {hub_endpoint()}/{ns.push_to}")
    print_footprint(run_root)


def print_footprint(folder: str) -> None:
    """One line with what a run leaves on disk: ``outputs/x: 12 MB``."""
    from hf_mlcl.files import folder_size, format_size

    print(f"{folder}: {format_size(folder_size(folder))}", flush=True)
