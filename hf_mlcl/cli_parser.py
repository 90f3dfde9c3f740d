"""``hf-mlcl``'s argument parser: the sub-commands, their options and the recipe keys their ``--help`` lists.

:func:`build_parser` builds it; :func:`override_keys_help` writes the recipe-key section of a ``--help``. Only
:mod:`hf_mlcl.cli` imports this module.

Design: docs/design.md, "Command line (hf_mlcl/cli.py)".
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1 (a length, a batch size); argparse reports anything else in one line."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer; got {text!r}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0 (epochs); argparse reports anything else in one line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number; got {text!r}")
    return value


def name_list(text: str) -> list[str]:
    """An argparse type: comma-separated names, none of them empty."""
    names = [name.strip() for name in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, none empty; got {text!r}")
    return names


# The keys a `--help` lists (a test checks each is a real field); all of them: docs/usage.md.
HELP_MODEL_DATA_KEYS = (
    "model_name_or_path",
    "tokenizer_name_or_path",
    "pooling",
    "projection_dim",
    "dataset",
    "data_dir",
    "dataset_options",
    "data_files",
    "text_column",
    "label_column",
    "label_format",
    "max_length",
    "max_train_samples",
    "max_eval_samples",
)
HELP_TRAINING_KEYS = {
    "contrastive": (
        "loss",
        "temperature",
        "queue_size",
        "learning_rate",
        "num_train_epochs",
        "max_steps",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "seed",
        "bf16",
        "use_cpu",
        "report_to",
    ),
    "probe": (
        "probe",
        "loss",
        "threshold",
        "learning_rate",
        "num_train_epochs",
        "max_steps",
        "per_device_train_batch_size",
        "seed",
        "report_to",
    ),
    "joint": (
        "contrastive_weight",
        "supervised_loss",
        "loss",
        "temperature",
        "threshold",
        "learning_rate",
        "num_train_epochs",
        "per_device_train_batch_size",
        "seed",
    ),
}


def override_keys_help(stages: Sequence[str]) -> str:
    """The ``--help`` section listing the common keys a command accepts, with each field's own help."""
    import dataclasses

    from hf_mlcl.recipes import argument_classes as _arg_classes

    def lines(classes, keys):
        fields = {f.name: f for cls in classes for f in dataclasses.fields(cls)}
        out = []
        for key in keys:
            text = " ".join(str(fields[key].metadata.get("help", "")).split())
            text = text if len(text) <= 64 else text[:61] + "..."
            out.append(f"  --{key:<30} {text}".rstrip())
        return out

    model_cls, data_cls, _ = _arg_classes("probe")
    parts = [
        "recipe keys (override any of them: --key value; a recipe holds the same keys):",
        "model and data:",
        *lines((model_cls, data_cls), HELP_MODEL_DATA_KEYS),
    ]
    for stage in stages:
        prefix = f"--{stage}.key or " if len(stages) > 1 else ""
        parts += [
            f"{stage} stage training ({prefix}--key):",
            *lines((_arg_classes(stage)[2],), HELP_TRAINING_KEYS[stage]),
        ]
    if stages:
        parts.append(
            "  --output_dir                     the run's root folder (run) or the stage's folder (train, probe)"
        )
    scope = (
        [
            "All keys: every field of ModelArguments, DataArguments and the training arguments of the stages",
            "this command runs (hf_mlcl.training.arguments; they subclass transformers.TrainingArguments, so all",
            "of its fields work too); an option of a stage it does not run is an error.",
        ]
        if stages
        else ["All keys: every field of ModelArguments and DataArguments (hf_mlcl.training.arguments)."]
    )
    parts += [
        "",
        *scope,
        "See docs/usage.md (Recipes, Data). Mappings as JSON: --dataset_options '{\"num_labels\": 6}'. A",
        "misspelt key fails with the nearest valid name.",
    ]
    return "\n".join(parts)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows only the documented spelling of an option (``--encoder_path``), not its dashed alias."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if action.option_strings and action.nargs != 0:
            return f"{action.option_strings[0]} {self._format_args(action, self._get_default_metavar_for_optional(action))}"
        if action.option_strings:
            return (
                action.option_strings[0]
                if action.option_strings[0] != "-h"
                else ", ".join(action.option_strings)
            )
        return super()._format_action_invocation(action)


class _CommandParser(argparse.ArgumentParser):
    """``hf-mlcl``'s parsers: every ``--multi_word`` option also answers to ``--multi-word`` (the keys
    are dataclass fields, so the underscore spelling is the documented one), and a sub-command's
    ``--help`` ends with the recipe keys it accepts (built only when asked, so that plain commands do not
    import transformers to print help)."""

    override_stages: tuple[str, ...] = ()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        spellings: list[str] = []
        for name in names:
            if name.startswith("--"):
                documented = "--" + name[2:].replace("-", "_")
                spellings += [documented] + ([name] if name != documented else [])
                if name[2:].count("_"):
                    spellings.append("--" + name[2:].replace("_", "-"))
            else:
                spellings.append(name)
        return super().add_argument(*dict.fromkeys(spellings), **kwargs)

    def error(self, message: str) -> NoReturn:
        """A bad command line in one line (argparse prints its usage block first), naming ``--help``."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def format_help(self) -> str:
        text = super().format_help()
        if self.override_stages or self.prog.endswith(" evaluate"):
            text += "\n" + override_keys_help(self.override_stages) + "\n"
        return text


def build_parser() -> argparse.ArgumentParser:
    parser = _CommandParser(
        prog="hf-mlcl",
        description="Multi-label supervised contrastive learning on the HuggingFace Trainer.",
        epilog="Recipe overrides: --key value (any argument field), --contrastive.key / --probe.key for one stage.",
        allow_abbrev=False,
    )
    parser.add_argument("--log_level", default="warning", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)

    def add(name, help_text, stages=()):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.override_stages = tuple(stages)
        return p

    p = add("train", "stage 1: contrastive training of the encoder", ["contrastive"])
    p.add_argument("recipe", help="recipe YAML (recipes/<dataset>/<encoder>/<loss>.yaml)")
    p = add("probe", "stage 2: train a multi-label head on a (frozen) encoder", ["probe"])
    p.add_argument("recipe")
    p.add_argument(
        "--encoder_path",
        default=None,
        help="trained encoder folder (default: the recipe's stage-1 output if it exists, else the "
        "recipe's model: the supervised baseline)",
    )
    p = add(
        "run",
        "the recipe's stages (contrastive + probe, or joint), test evaluation with plots, and model cards",
        ["contrastive", "probe", "joint"],
    )
    p.add_argument("recipe")
    p.add_argument(
        "--push_to", default=None, help="Hub repo id for the classifier (encoder goes to <id>-encoder)"
    )
    p.add_argument("--private", action="store_true")
    p.add_argument("--no_plots", action="store_true")
    p = add("evaluate", "score a trained classifier on a split (metrics JSON + per-label F1 plot)")
    p.add_argument("checkpoint", help="classifier folder written by `probe` / `run`")
    p.add_argument(
        "recipe",
        nargs="?",
        default=None,
        help="recipe naming the dataset (default: the dataset, its options and max_length stored in "
        "the checkpoint's card_data.json; --dataset ... overrides)",
    )
    p.add_argument("--split", default="test")
    p.add_argument("--batch_size", type=positive_int, default=32)
    p.add_argument("--output_dir", default=None, help="where metrics and plots go (default: the checkpoint)")
    p.add_argument("--no_plots", action="store_true")
    p = add("predict", "label a file of new texts with a trained classifier at its tuned threshold")
    p.add_argument("classifier", help="classifier folder written by `probe` / `run`")
    p.add_argument(
        "input", help="CSV / TSV / JSON lines / parquet with a text column, or a .txt file, one text per line"
    )
    p.add_argument("--output", required=True, help="predictions file: .jsonl or .csv")
    p.add_argument("--text_column", default="text")
    p.add_argument("--batch_size", type=positive_int, default=32)
    p.add_argument(
        "--max_length",
        type=positive_int,
        default=None,
        help="default: the length the classifier was trained at",
    )
    p.add_argument("--device", default=None, help="default: the GPU if there is one, else the CPU")
    p.add_argument(
        "--all_scores", action="store_true", help="write every label's score, not only the predicted ones"
    )
    p.add_argument(
        "--prediction_prefix",
        default="",
        help="put before the predictions' column names (predicted_: predicted_labels, predicted_scores), for an "
        "input with a labels or scores column of its own",
    )
    p = add("export", "write a trained encoder or classifier as ONNX (onnx/model.onnx beside its config)")
    p.add_argument("folder", help="encoder or classifier folder written by `train` / `probe` / `run`")
    p.add_argument("--to", default="onnx", choices=["onnx"])
    p.add_argument("--opset", type=positive_int, default=18)
    p = add("push", "upload a trained folder (model, tokenizer, card, metrics) to the Hub")
    p.add_argument("folder")
    p.add_argument("--repo_id", required=True)
    p.add_argument("--private", action="store_true")
    p.add_argument("--token", default=None, help="default: the token `hf auth login` saved, or HF_TOKEN")
    p.add_argument("--revision", default=None, help="branch to commit to (created if it does not exist)")
    p.add_argument("--commit_message", default=None)
    p = add(
        "demo", "offline end-to-end demo: synthetic corpus, tiny encoder, 3 losses + BCE, table and plots"
    )
    p.add_argument("--output_dir", default="./hf_mlcl_demo")
    p.add_argument(
        "--dataset", default="synthetic", help="synthetic (default) or a registry name, e.g. goemotions"
    )
    p.add_argument("--data_dir", default=None)
    p.add_argument("--model", default=None, help="pretrained encoder path/id (default: a tiny random BERT)")
    p.add_argument(
        "--losses", type=name_list, default="sd,mulsupcon,all", help="comma-separated contrastive losses"
    )
    p.add_argument(
        "--epochs",
        type=positive_float,
        default=None,
        help="contrastive epochs (default: 10, or 1 with --model)",
    )
    p.add_argument(
        "--probe",
        default="logistic",
        choices=["logistic", "linear"],
        help="stage 2 on the frozen encoder: per-label logistic regressions or a linear BCE head",
    )
    p.add_argument("--max_train_samples", type=positive_int, default=None)
    p.add_argument(
        "--max_eval_samples",
        type=positive_int,
        default=None,
        help="cap of the validation and test splits (default: all for synthetic, 1000 for real data)",
    )
    p.add_argument("--max_length", type=positive_int, default=None)
    p.add_argument("--seed", type=int, default=42)
    p = add(
        "inspect",
        "how each loss sees a dataset: relations R1-R5, positives, wasted anchors, HBL gate, queue advice",
    )
    p.add_argument("dataset", help="a registry name (hf_mlcl.data.list_datasets())")
    p.add_argument("--data_dir", default=None)
    p.add_argument(
        "--splits", default="train", help="comma-separated splits, concatenated (e.g. validation,test)"
    )
    p.add_argument("--option", action="append", default=[], help="loader keyword as key=value (repeatable)")
    p.add_argument("--batch_size", type=positive_int, default=32, help="per-process batch size")
    p.add_argument("--queue_size", type=int, default=0)
    p.add_argument("--num_processes", type=positive_int, default=1)
    p.add_argument("--k_min", type=int, default=128, help="HBL's reliability gate")
    p.add_argument("--batches", type=positive_int, default=50, help="sampled batches per queue size")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_dir", default="./hf_mlcl_inspect")
    p.add_argument("--prefix", default=None, help="file-name prefix (default: the dataset name)")
    return parser
