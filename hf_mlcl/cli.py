"""``hf-mlcl``: the command-line entry point (also ``python -m hf_mlcl`` / ``accelerate launch -m hf_mlcl.cli``).

Sub-commands::

    hf-mlcl train    RECIPE [--key value ...]               stage 1: contrastive training of the encoder
    hf-mlcl probe    RECIPE [--encoder-path DIR] [--key ...] stage 2: multi-label head (linear probe / fine-tune)
    hf-mlcl run      RECIPE [--push-to REPO] [--key ...]    both stages + test evaluation + model cards
    hf-mlcl evaluate CHECKPOINT [RECIPE] [--split test] [--key ...]   score a classifier, write metrics + plots
    hf-mlcl push     FOLDER --repo-id USER/NAME [--private]  upload model, tokenizer, card and metrics
    hf-mlcl demo     [--output-dir DIR] [--dataset goemotions --data-dir DIR --model PATH]

A RECIPE is a YAML file (see ``recipes/`` and :mod:`hf_mlcl.recipes`); ``--key value`` overrides any
ModelArguments / DataArguments / TrainingArguments field, ``--contrastive.key`` / ``--probe.key`` one stage
only, ``--output_dir`` the run's root folder. Typos fail with the nearest valid name.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from hf_mlcl.training import distributed as D

logger = logging.getLogger("hf_mlcl.cli")

PLOTS_DIR = "plots"


# ----------------------------------------------------------------------------------------------------
# stages (shared by `train`, `probe`, `run` and the demo)
# ----------------------------------------------------------------------------------------------------
def _call_with_card(fn, card_cb, *args) -> tuple[Any, dict]:
    """Run a training entry point with the card callback attached, then replay the finished trainer's
    data into it (the logistic probe never calls ``Trainer.train``, so its hooks alone would miss it)."""
    trainer, metrics = fn(*args, callbacks=[card_cb])
    card_cb.collect_from_trainer(trainer, metrics)
    return trainer, metrics


def _label_names(trainer) -> list[str] | None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    id2label = getattr(model.config, "id2label", None) or {}
    return [str(id2label[i]) for i in sorted(id2label, key=int)] if id2label else None


def run_contrastive_stage(model_args, data_args, training_args) -> tuple[Any, dict]:
    """Stage 1 via ``hf_mlcl.training.train_contrastive``; writes the encoder card into output_dir."""
    from hf_mlcl.hub import ModelCardCallback
    from hf_mlcl.training import train_contrastive

    card_cb = ModelCardCallback("encoder", model_args=model_args, data_args=data_args)
    trainer, metrics = _call_with_card(train_contrastive, card_cb, model_args, data_args, training_args)
    if trainer.is_world_process_zero():
        names = _label_names(trainer)
        if names and not card_cb.card.label_names:
            card_cb.card.label_names, card_cb.card.num_labels = names, len(names)
        card_cb.save(training_args.output_dir, model_name=training_args.hub_model_id)
    D.barrier()  # stage 2 (on any rank) starts only once the encoder, its metrics and card are written
    return trainer, metrics


def run_probe_stage(
    model_args, data_args, probing_args, encoder_path: str | None, contrastive_loss: str | None = None
) -> tuple[Any, dict]:
    """Stage 2 via ``hf_mlcl.training.train_probe``; writes the classifier card into output_dir."""
    from hf_mlcl.hub import ModelCardCallback
    from hf_mlcl.training import train_probe

    card_cb = ModelCardCallback(
        "classifier",
        model_args=model_args,
        data_args=data_args,
        contrastive_loss=contrastive_loss,
        encoder_path=encoder_path,
    )
    trainer, metrics = _call_with_card(train_probe, card_cb, model_args, data_args, probing_args, encoder_path)
    if trainer.is_world_process_zero():
        names = _label_names(trainer)
        if names:
            card_cb.card.label_names, card_cb.card.num_labels = names, len(names)
        card_cb.card.hyperparameters["threshold"] = str(probing_args.threshold)
        card_cb.save(probing_args.output_dir, model_name=probing_args.hub_model_id)
    D.barrier()
    return trainer, metrics


def _encoder_loss(encoder_path: str | None) -> str | None:
    """The contrastive loss recorded in an encoder folder's metrics.json / card_data.json, if any."""
    if not encoder_path:
        return None
    for name, key in (("card_data.json", "loss"), ("metrics.json", "loss")):
        path = os.path.join(encoder_path, name)
        if os.path.isfile(path):
            with open(path, encoding="utf-8") as fh:
                value = json.load(fh).get(key)
            if value:
                return value
    return None


# ----------------------------------------------------------------------------------------------------
# evaluation of a saved classifier
# ----------------------------------------------------------------------------------------------------
def score_classifier(model, tokenizer, dataset, num_labels: int, max_length: int, batch_size: int = 32):
    """Sigmoid scores (N, L) and multi-hot truth (N, L) of ``dataset`` (batched, no gradient)."""
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    from hf_mlcl.data import MultiLabelCollator
    from hf_mlcl.training.entry import segment_multiple

    collator = MultiLabelCollator(tokenizer, num_labels, max_length=max_length, pad_to_multiple_of=segment_multiple(model))
    device = next(model.parameters()).device
    scores, truth = [], []
    model.eval()
    with torch.no_grad():
        for batch in DataLoader(dataset, batch_size=batch_size, collate_fn=collator):
            labels = batch.pop("labels")
            inputs = {k: v.to(device) for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
            scores.append(torch.sigmoid(model(**inputs).logits.float()).cpu().numpy())
            truth.append(labels.to_dense().numpy() if labels.is_sparse else labels.numpy())
    return np.concatenate(scores), np.concatenate(truth) > 0.5


def evaluate_checkpoint(
    checkpoint: str,
    data_args,
    split: str = "test",
    batch_size: int = 32,
    plots: bool = True,
    output_dir: str | None = None,
) -> dict[str, float]:
    """Score a saved classifier on ``split`` at its stored decision threshold; write
    ``eval_<split>.json`` and ``plots/f1_vs_frequency_<split>.png`` into ``output_dir`` (default: the
    checkpoint folder). Returns the metrics, keys prefixed with the split name."""
    import numpy as np
    from transformers import AutoTokenizer

    from hf_mlcl.data import train_frequency
    from hf_mlcl.evaluation import compute_multilabel_metrics, per_label_f1, plot_f1_vs_frequency
    from hf_mlcl.hub.model_card import atomic_write_text
    from hf_mlcl.modeling import MLCLForMultiLabelClassification
    from hf_mlcl.training.entry import load_data

    model = MLCLForMultiLabelClassification.from_pretrained(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    ds, names = load_data(data_args)
    if split not in ds:
        raise ValueError(f"dataset {data_args.dataset!r} has no {split!r} split; choose one of {list(ds)}")
    trained = [str(model.config.id2label[i]) for i in range(model.config.num_labels)]
    if trained != [str(n) for n in names]:
        raise ValueError(
            f"the checkpoint's {len(trained)} labels differ from dataset {data_args.dataset!r}'s {len(names)} labels; "
            "evaluate on the dataset (and dataset_options) it was trained on"
        )
    scores, truth = score_classifier(model, tokenizer, ds[split], len(names), data_args.max_length, batch_size)
    threshold = getattr(model.config, "decision_threshold", None)
    threshold = 0.5 if threshold is None else (np.asarray(threshold) if isinstance(threshold, list) else float(threshold))
    metrics = {f"{split}_{k}": float(v) for k, v in compute_multilabel_metrics(truth, scores, threshold=threshold).items()}
    out = output_dir or checkpoint
    os.makedirs(out, exist_ok=True)
    atomic_write_text(os.path.join(out, f"eval_{split}.json"), json.dumps(metrics, indent=2, sort_keys=True))
    if plots and len(ds["train"]):
        freq = train_frequency(ds["train"], len(names))
        f1 = per_label_f1(truth, scores >= threshold)
        plot_f1_vs_frequency(f1, freq, os.path.join(out, PLOTS_DIR, f"f1_vs_frequency_{split}.png"),
                             title=f"{data_args.dataset}: per-label F1 ({split})")
    return metrics


# ----------------------------------------------------------------------------------------------------
# sub-commands
# ----------------------------------------------------------------------------------------------------
def _load(recipe_path: str | None, overrides: Sequence[str], stages: Sequence[str]):
    from hf_mlcl.recipes import load_recipe, split_overrides, validate_recipe

    recipe = load_recipe(recipe_path) if recipe_path else {}
    validate_recipe(recipe, recipe_path or "recipe")
    return recipe, split_overrides(overrides, stages)


def cmd_train(ns, overrides) -> dict:
    from hf_mlcl.recipes import parse_stage

    recipe, ov = _load(ns.recipe, overrides, ["contrastive"])
    model_args, data_args, args = parse_stage(recipe, "contrastive", ov, output_dir=ov.output_dir)
    _guard(args)
    _, metrics = run_contrastive_stage(model_args, data_args, args)
    print(f"encoder saved to {args.output_dir}")
    return metrics


def cmd_probe(ns, overrides) -> dict:
    from hf_mlcl.recipes import parse_stage, stage_output_dir

    recipe, ov = _load(ns.recipe, overrides, ["probe"])
    model_args, data_args, args = parse_stage(recipe, "probe", ov, output_dir=ov.output_dir)
    _guard(args)
    encoder = ns.encoder_path
    if encoder is None and "contrastive" in recipe.get("stages", ["contrastive"]):
        default = stage_output_dir(recipe, "contrastive")
        if os.path.isfile(os.path.join(default, "config.json")):
            encoder = default
    _, metrics = run_probe_stage(model_args, data_args, args, encoder, _encoder_loss(encoder))
    print(f"classifier saved to {args.output_dir}")
    return metrics


def cmd_run(ns, overrides) -> dict:
    """Both stages (as the recipe's ``stages`` says), test evaluation with plots, cards, optional push."""
    from hf_mlcl.recipes import STAGES, parse_stage, stage_output_dir

    recipe, _ = _load(ns.recipe, [], STAGES)
    stages = recipe.get("stages", list(STAGES))
    _, ov = _load(None, overrides, stages)
    root = ov.output_dir
    results: dict[str, Any] = {}
    encoder_path, contrastive_loss = None, None
    parsed = {s: parse_stage(recipe, s, ov) for s in stages if s == "contrastive"}
    parsed["probe"] = parse_stage(recipe, "probe", ov)
    for _, _, stage_args in parsed.values():  # before any work: both stages' folders and the launch
        _guard(stage_args)
    if "contrastive" in stages:
        model_args, data_args, args = parsed["contrastive"]
        if _skip_finished(args):
            metrics = _read_metrics(args.output_dir)
        else:
            _, metrics = run_contrastive_stage(model_args, data_args, args)
        encoder_path, contrastive_loss = args.output_dir, args.loss
        results["contrastive"] = metrics
    model_args, data_args, pargs = parsed["probe"]
    if _skip_finished(pargs):
        metrics = _read_metrics(pargs.output_dir)
    else:
        _, metrics = run_probe_stage(model_args, data_args, pargs, encoder_path, contrastive_loss)
    results["probe"] = metrics
    if pargs.process_index == 0:
        if not ns.no_plots:
            evaluate_checkpoint(pargs.output_dir, data_args, split="test" if _has_test(metrics) else "validation")
        summary = {k: v for k, v in metrics.items() if k.startswith(("test_", "validation_")) or k == "threshold"}
        run_root = root or recipe.get("output_dir") or os.path.dirname(stage_output_dir(recipe, "probe"))
        from hf_mlcl.hub.model_card import atomic_write_text

        os.makedirs(run_root, exist_ok=True)
        atomic_write_text(os.path.join(run_root, "results.json"), json.dumps(results, indent=2, sort_keys=True, default=str))
        print(format_table([{"run": os.path.basename(os.path.normpath(run_root)), **summary}]))
        if ns.push_to:
            from hf_mlcl.hub import push_folder

            push_folder(pargs.output_dir, ns.push_to, private=ns.private)
            if encoder_path:
                push_folder(encoder_path, f"{ns.push_to}-encoder", private=ns.private)
            print(f"pushed to https://huggingface.co/{ns.push_to}")
    return results


def _guard(args) -> None:
    """The launch and output-folder checks of :mod:`hf_mlcl.training.run_guard` for one stage."""
    from hf_mlcl.training.run_guard import check_launch, check_output_dir

    check_launch(args)
    check_output_dir(args.output_dir, args.overwrite_output_dir, args.resume_from_checkpoint, args.process_index == 0)


def _skip_finished(args) -> bool:
    """True when resuming and this stage's folder already holds its finished output (it is not redone)."""
    from hf_mlcl.training.run_guard import stage_finished, wants_resume

    if wants_resume(args.resume_from_checkpoint) and stage_finished(args.output_dir):
        print(f"{args.output_dir} is finished; resuming after it")
        return True
    return False


def _read_metrics(folder: str) -> dict:
    from hf_mlcl.training.entry import METRICS_FILE

    with open(os.path.join(folder, METRICS_FILE), encoding="utf-8") as fh:
        return json.load(fh)


def _has_test(metrics: dict) -> bool:
    return any(k.startswith("test_") for k in metrics)


def cmd_evaluate(ns, overrides) -> dict:
    from hf_mlcl.recipes import parse_stage

    recipe, ov = _load(ns.recipe, overrides, [])
    recipe = {k: v for k, v in recipe.items() if k not in ("contrastive", "probe", "stages")}
    recipe["probe"] = {}  # only the data arguments matter here
    _, data_args, _ = parse_stage(recipe, "probe", ov, output_dir=ns.checkpoint)
    metrics = evaluate_checkpoint(ns.checkpoint, data_args, split=ns.split, batch_size=ns.batch_size,
                                  plots=not ns.no_plots, output_dir=ns.output_dir)
    print(format_table([{"checkpoint": os.path.basename(os.path.normpath(ns.checkpoint)), **metrics}],
                       keys=_TABLE_KEYS, prefix=f"{ns.split}_"))
    return metrics


def cmd_push(ns, overrides) -> dict:
    from hf_mlcl.hub import push_folder

    if overrides:
        raise SystemExit(f"hf-mlcl push: unexpected arguments {overrides}")
    info = push_folder(ns.folder, ns.repo_id, token=ns.token, private=ns.private, revision=ns.revision)
    print(f"pushed {ns.folder} to https://huggingface.co/{ns.repo_id} ({info})")
    return {}


def cmd_demo(ns, overrides) -> dict:
    from hf_mlcl.demo import run_demo

    if overrides:
        raise SystemExit(f"hf-mlcl demo: unexpected arguments {overrides}")
    return run_demo(
        output_dir=ns.output_dir,
        dataset=ns.dataset,
        data_dir=ns.data_dir,
        model=ns.model,
        losses=[s.strip() for s in ns.losses.split(",") if s.strip()],
        epochs=ns.epochs,
        probe=ns.probe,
        max_train_samples=ns.max_train_samples,
        max_eval_samples=ns.max_eval_samples,
        max_length=ns.max_length,
        seed=ns.seed,
    )


# ----------------------------------------------------------------------------------------------------
# table printing
# ----------------------------------------------------------------------------------------------------
_TABLE_KEYS = ("micro_f1", "macro_f1", "p@1", "p@5")


def format_table(rows: list[dict], keys: Sequence[str] = _TABLE_KEYS, prefix: str = "test_") -> str:
    """A Markdown table: the first key of each row (its name) then ``prefix + key`` columns."""
    if not rows:
        return ""
    name_key = next(iter(rows[0]))
    header = [name_key, *keys]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] * len(header)) + "|"]
    for row in rows:
        cells = [str(row[name_key])]
        for key in keys:
            value = row.get(prefix + key, row.get(f"validation_{key}"))
            cells.append(f"{value:.4f}" if isinstance(value, (int, float)) else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------
# argument parsing
# ----------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hf-mlcl",
        description="Multi-label supervised contrastive learning on the HuggingFace Trainer.",
        epilog="Recipe overrides: --key value (any argument field), --contrastive.key / --probe.key for one stage.",
        allow_abbrev=False,
    )
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name, help_text):
        return sub.add_parser(name, help=help_text, description=help_text, allow_abbrev=False)

    p = add("train", "stage 1: contrastive training of the encoder")
    p.add_argument("recipe", help="recipe YAML (recipes/<dataset>/<encoder>/<loss>.yaml)")
    p = add("probe", "stage 2: train a multi-label head on a (frozen) encoder")
    p.add_argument("recipe")
    p.add_argument("--encoder-path", default=None,
                   help="trained encoder folder (default: the recipe's stage-1 output if it exists, else the "
                        "recipe's model: the supervised baseline)")
    p = add("run", "both stages, test evaluation with plots, and model cards")
    p.add_argument("recipe")
    p.add_argument("--push-to", default=None, help="Hub repo id for the classifier (encoder goes to <id>-encoder)")
    p.add_argument("--private", action="store_true")
    p.add_argument("--no-plots", action="store_true")
    p = add("evaluate", "score a trained classifier on a split (metrics JSON + per-label F1 plot)")
    p.add_argument("checkpoint", help="classifier folder written by `probe` / `run`")
    p.add_argument("recipe", nargs="?", default=None, help="recipe naming the dataset (or use --dataset ...)")
    p.add_argument("--split", default="test")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--output-dir", default=None, help="where metrics and plots go (default: the checkpoint)")
    p.add_argument("--no-plots", action="store_true")
    p = add("push", "upload a trained folder (model, tokenizer, card, metrics) to the Hub")
    p.add_argument("folder")
    p.add_argument("--repo-id", required=True)
    p.add_argument("--private", action="store_true")
    p.add_argument("--token", default=None, help="default: the cached `huggingface-cli login` token / HF_TOKEN")
    p.add_argument("--revision", default=None)
    p = add("demo", "offline end-to-end demo: synthetic corpus, tiny encoder, 3 losses + BCE, table and plots")
    p.add_argument("--output-dir", default="./hf_mlcl_demo")
    p.add_argument("--dataset", default="synthetic", help="synthetic (default) or a registry name, e.g. goemotions")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--model", default=None, help="pretrained encoder path/id (default: a tiny random BERT)")
    p.add_argument("--losses", default="sd,mulsupcon,all", help="comma-separated contrastive losses")
    p.add_argument("--epochs", type=float, default=None, help="contrastive epochs (default: 10, or 1 with --model)")
    p.add_argument("--probe", default="logistic", choices=["logistic", "linear"],
                   help="stage 2 on the frozen encoder: per-label logistic regressions or a linear BCE head")
    p.add_argument("--max-train-samples", type=int, default=None)
    p.add_argument("--max-eval-samples", type=int, default=None,
                   help="cap of the validation and test splits (default: all for synthetic, 1000 for real data)")
    p.add_argument("--max-length", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    return parser


COMMANDS = {
    "train": cmd_train,
    "probe": cmd_probe,
    "run": cmd_run,
    "evaluate": cmd_evaluate,
    "push": cmd_push,
    "demo": cmd_demo,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point; returns the process exit status."""
    from hf_mlcl.hub import PushError
    from hf_mlcl.recipes import RecipeError

    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    ns, rest = parser.parse_known_args(argv)
    logging.basicConfig(level=getattr(logging, ns.log_level.upper()), format="%(levelname)s %(name)s: %(message)s")
    try:
        COMMANDS[ns.command](ns, rest)
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":
            print(f"\nhf-mlcl {ns.command}: interrupted. {_resume_hint(ns.command, argv)}", file=sys.stderr)
        return 130
    except (RecipeError, ValueError, FileNotFoundError) as err:
        print(f"hf-mlcl {ns.command}: error: {err}", file=sys.stderr)
        return 2
    except PushError as err:
        print(f"hf-mlcl {ns.command}: {err}", file=sys.stderr)
        return 1
    D.shutdown()  # a clean end of a multi-process run (see hf_mlcl.training.distributed.shutdown)
    return 0


def _resume_hint(command: str, argv: Sequence[str]) -> str:
    """One line telling how to continue an interrupted command from its last complete checkpoint."""
    import shlex

    if command not in ("train", "probe", "run"):
        return "Nothing to resume."
    kept, skip_value = [], False
    for arg in argv:  # any earlier --resume_from_checkpoint (and its value) is replaced
        if skip_value:
            skip_value = False
        elif arg == "--resume_from_checkpoint":
            skip_value = True
        elif not arg.startswith("--resume_from_checkpoint="):
            kept.append(arg)
    return "Resume with: hf-mlcl " + shlex.join([*kept, "--resume_from_checkpoint", "true"])


if __name__ == "__main__":
    sys.exit(main())
