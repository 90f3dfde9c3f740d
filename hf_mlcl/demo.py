"""``hf-mlcl demo``: the whole pipeline, offline, on a laptop CPU in a few minutes.

A seeded synthetic corpus with a tokenizer trained on it and a tiny random BERT (or a real dataset with
``--dataset``, a pretrained encoder with ``--model``); stage 1 with each loss, then a probe on the frozen
encoder, through :func:`hf_mlcl.training.stages.run_stages` with the data loaded once; a BCE fine-tune as the
baseline (``_bce_budget``: at least the contrastive rows' epochs, docs/RESULTS.md's recipe on a pretrained
encoder); one table on the test split and plots. Everything lands under ``--output_dir`` (default
``./hf_mlcl_demo``): a folder per method with its checkpoints and cards, ``plots/``, ``results.md`` and
``results.json``. The table, the plots and their meaning: README, "Set up and run the demo".
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hf_mlcl.files import atomic_write_text
from hf_mlcl.training.arguments import (
    ContrastiveTrainingArguments,
    DataArguments,
    ModelArguments,
    ProbingTrainingArguments,
)
from hf_mlcl.training.run_lock import RunLock
from hf_mlcl.training.stages import load_run_data, run_stages

SYNTHETIC = dict(num_labels=20, num_train=1000, num_validation=200, num_test=200, min_words=20, max_words=60)
TINY_BERT = dict(
    model_type="bert",
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=128,
    hidden_dropout_prob=0.1,
    attention_probs_dropout_prob=0.1,
)


# The BCE baseline on a pretrained encoder, as docs/RESULTS.md's study fine-tuned all-MiniLM-L6-v2: the
# learning rate chosen on validation (GoEmotions 1e-4, Reuters-21578 2e-4; other datasets GoEmotions'),
# up to 5 epochs with the best on validation macro-F1 kept (no early stopping in 5 epochs).
STUDY_BCE_LR = {"goemotions": 1e-4, "reuters21578": 2e-4}
STUDY_BCE_EPOCHS = 5.0

TINY_LLAMA = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    max_position_embeddings=128,
)


def save_tiny_llama(folder: str, seed: int = 0) -> str:
    """Write a tiny random Llama (``TINY_LLAMA``) and a byte-level BPE tokenizer trained on the synthetic
    corpus into ``folder``: a saved base for the LoRA path on a CPU (``recipes/demo/tiny_llama_lora.yaml``),
    which the Llama-3.1-8B recipes take from the Hub. Returns ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaModel

    from hf_mlcl.data import make_synthetic_corpus, train_tokenizer

    texts = make_synthetic_corpus(num_labels=10, num_train=256, num_validation=8, num_test=8, seed=seed)[
        "train"
    ]["text"]
    tokenizer = train_tokenizer(
        texts, vocab_size=500, style="llama", model_max_length=TINY_LLAMA["max_position_embeddings"]
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **TINY_LLAMA,
    )
    LlamaModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


_T0 = [time.time()]


# fewer optimizer steps than this in stage 1 leave the encoders barely trained (5 % warm-up included)
MIN_DEMO_STEPS = 20


def _say(msg: str) -> None:
    print(f"[hf-mlcl demo {time.time() - _T0[0]:5.0f}s] {msg}", flush=True)


@dataclass
class _Request:
    """The demo's options as ``run_demo`` received them (None: the default for the encoder and dataset)."""

    output_dir: str
    dataset: str
    data_dir: str | None
    model: str | None
    epochs: float | None
    probe_epochs: float | None
    probe: str
    seed: int
    synthetic_options: dict[str, Any] | None
    max_train_samples: int | None
    max_eval_samples: int | None
    max_length: int | None


@dataclass
class _Plan:
    """What every run of the demo shares: the request, data, model settings, sizes, the device."""

    request: _Request
    data_args: Any
    data: Any
    model_args: Any
    tokenizer: Any
    pretrained: bool
    epochs: float
    probe_epochs: float
    lr: float
    batch: int
    use_cpu: bool
    bce_lr: float
    bce_epochs: float

    def training(self, folder: str, **kwargs: Any) -> dict[str, Any]:
        """The arguments every stage of the demo shares, updated by ``kwargs``."""
        shared = dict(
            output_dir=folder,
            seed=self.request.seed,
            use_cpu=self.use_cpu,
            report_to="none",
            save_strategy="no",
            eval_strategy="no",
            logging_steps=10,
            remove_unused_columns=False,
            dataloader_num_workers=0,
            disable_tqdm=False,
            dataloader_pin_memory=not self.use_cpu,
            per_device_train_batch_size=self.batch,
            per_device_eval_batch_size=128,
            overwrite_output_dir=True,
        )
        return {**shared, **kwargs}


def _check_not_a_run(output_dir: str) -> None:
    """A folder holding an ``hf-mlcl run`` (its encoder/ or classifier/, or a results.json that is no demo's
    table) is not the demo's to overwrite (a demo's own folder is: the demo runs again)."""
    from hf_mlcl.files import json_shape
    from hf_mlcl.training.preflight import InputError

    stages = [name for name in ("encoder", "classifier") if os.path.isdir(os.path.join(output_dir, name))]
    shape = json_shape(os.path.join(output_dir, "results.json"))
    if stages or shape not in (None, "array"):
        held = ", ".join(stages) if stages else "results.json"
        raise InputError(
            f"{output_dir} holds a run's output ({held}), not a demo's; choose another --output_dir"
        )


def _earlier_methods(output_dir: str, losses: Sequence[str]) -> list[str]:
    """The method folders (holding an encoder/ or classifier/) in a demo's ``output_dir`` that a demo of
    ``losses`` does not write: an earlier demo's, with other losses."""
    written = {*losses, "bce"}
    return sorted(
        name
        for name in os.listdir(output_dir)
        if name not in written
        and any(os.path.isdir(os.path.join(output_dir, name, stage)) for stage in ("encoder", "classifier"))
    )


def run_demo(
    output_dir: str = "./hf_mlcl_demo",
    dataset: str = "synthetic",
    data_dir: str | None = None,
    model: str | None = None,
    losses: Sequence[str] = ("sd", "mulsupcon", "all"),
    epochs: float | None = None,
    max_train_samples: int | None = None,
    max_eval_samples: int | None = None,
    max_length: int | None = None,
    seed: int = 42,
    probe_epochs: float | None = None,
    probe: str = "logistic",
    synthetic_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the demo; returns ``{"rows": [...], "table": str, "seconds": float, "output_dir": str, "baseline":
    {"learning_rate": float, "num_train_epochs": float}}`` (the BCE baseline's settings)."""
    from hf_mlcl.hub import check_model_source
    from hf_mlcl.losses.registry import check_contrastive_loss, resolve_loss_name

    start = _T0[0] = time.time()
    losses = list(losses)
    for name in losses:  # before any work: a loss stage 1 cannot train, a model that cannot load
        check_contrastive_loss(name, "--losses names stage 1's losses; the demo trains its BCE row itself")
    resolved = [resolve_loss_name(n) for n in losses]
    same = sorted({n for n, key in zip(losses, resolved) if resolved.count(key) > 1})
    if same:  # one row a loss: a second name of it would train the same stage again into its folder
        raise ValueError(f"--losses names one loss twice ({', '.join(same)}); name each once")
    check_model_source(model, "--model")
    _check_not_a_run(output_dir)
    with RunLock(output_dir):  # one demo per folder: a second one into it stops in one line
        os.makedirs(output_dir, exist_ok=True)
        earlier = _earlier_methods(output_dir, losses)
        if earlier:
            _say(
                f"note: {output_dir} keeps {', '.join(earlier)} from an earlier demo; this one neither rewrites "
                "nor lists them"
            )
        plan = _plan(
            _Request(
                output_dir=output_dir,
                dataset=dataset,
                data_dir=data_dir,
                model=model,
                epochs=epochs,
                probe_epochs=probe_epochs,
                probe=probe,
                seed=seed,
                synthetic_options=synthetic_options,
                max_train_samples=max_train_samples,
                max_eval_samples=max_eval_samples,
                max_length=max_length,
            )
        )
        results: dict[str, Any] = {}  # method -> stage results of its run
        n_runs = len(losses) + 1
        for i, loss in enumerate(losses, 1):
            results[loss] = _contrastive_run(plan, loss, i, n_runs)
        results["bce (fine-tuned)"] = _bce_run(plan, n_runs)
        _say("scoring the test split, embedding quality and plots")
        rows, table, split = _report(plan, results)
        seconds = time.time() - start
        atomic_write_text(
            os.path.join(output_dir, "results.md"),
            f"# hf-mlcl demo ({dataset}, {split} split)\n\nbaseline: {_bce_desc(plan)}\n\n{table}\n\n"
            f"wall time: {seconds:.0f} s\n",
        )
        atomic_write_text(os.path.join(output_dir, "results.json"), json.dumps(rows, indent=2, default=float))
        print()
        probe_desc = (
            "per-label logistic regressions"
            if probe == "logistic"
            else f"{probe} probe, {plan.probe_epochs:g} epochs"
        )
        print(
            f"hf-mlcl demo: {dataset}, {len(plan.data.label_names)} labels, {split} split; contrastive stage "
            f"{plan.epochs:g} epochs, then {probe_desc} on the frozen encoder; baseline: {_bce_desc(plan)}"
        )
        print(table)
        print(
            f"plots: {os.path.join(output_dir, 'plots')}   checkpoints + model cards: {output_dir}/<method>/   "
            f"wall time: {seconds:.0f} s"
        )
        baseline = {"learning_rate": plan.bce_lr, "num_train_epochs": plan.bce_epochs}
        return {
            "rows": rows,
            "table": table,
            "seconds": seconds,
            "output_dir": output_dir,
            "baseline": baseline,
        }


def _plan(request: _Request) -> _Plan:
    """The demo's data (loaded once, for every run), tokenizer and model settings."""
    import torch
    from transformers import AutoTokenizer

    from hf_mlcl.data.tokenizer import train_tokenizer

    r = request
    dataset, model, probe = r.dataset, r.model, r.probe
    pretrained = model is not None
    synthetic = dataset == "synthetic"
    options = {**SYNTHETIC, "seed": r.seed, **(r.synthetic_options or {})} if synthetic else {}
    data_args = DataArguments(
        dataset=dataset,
        data_dir=r.data_dir,
        dataset_options=options,
        max_length=r.max_length or (128 if pretrained or not synthetic else 96),
        max_train_samples=r.max_train_samples,
        # real datasets: cap validation and test so a CPU run stays in minutes (synthetic: sized above)
        max_eval_samples=r.max_eval_samples or (None if synthetic else 1000),
        max_test_samples=r.max_eval_samples or (None if synthetic else 1000),
    )
    data = load_run_data(data_args)
    ds = data.dataset
    _say(
        f"dataset {dataset}: {len(ds['train'])} train / {len(ds['validation'])} validation / "
        f"{len(ds['test']) if 'test' in ds else 0} test documents, {len(data.label_names)} labels"
    )
    if pretrained:
        model_args = ModelArguments(model_name_or_path=model, pooling="mean", projection_dim=256)
        tokenizer, lr, batch = AutoTokenizer.from_pretrained(model), 3e-5, 32
    else:
        tok_dir = os.path.join(r.output_dir, "tokenizer")
        tokenizer = train_tokenizer(
            ds["train"]["text"],
            vocab_size=2000,
            style="bert",
            model_max_length=TINY_BERT["max_position_embeddings"],
        )
        tokenizer.save_pretrained(tok_dir)
        _say(f"trained a WordPiece tokenizer ({len(tokenizer)} tokens) -> {tok_dir}")
        model_args = ModelArguments(
            backbone_config=dict(TINY_BERT), tokenizer_name_or_path=tok_dir, pooling="mean", projection_dim=64
        )
        lr, batch = 1e-3, 64
    epochs = r.epochs if r.epochs is not None else (1.0 if pretrained else 10.0)
    probe_epochs = r.probe_epochs if r.probe_epochs is not None else (3.0 if pretrained else 5.0)
    bce_lr, bce_epochs = _bce_budget(dataset, pretrained, lr, epochs, probe, probe_epochs)
    steps = int(len(ds["train"]) // batch * epochs)  # stage 1's optimizer steps (full batches)
    if steps < MIN_DEMO_STEPS:
        _say(
            f"warning: stage 1 takes {steps} optimizer step(s) ({len(ds['train'])} rows, batch {batch}, {epochs:g} "
            f"epochs), and the warm-up keeps its learning rate near 0: the rows compare barely trained models; "
            "raise --max_train_samples or --epochs"
        )
    return _Plan(
        request=r,
        data_args=data_args,
        data=data,
        model_args=model_args,
        tokenizer=tokenizer,
        pretrained=pretrained,
        epochs=epochs,
        probe_epochs=probe_epochs,
        lr=lr,
        batch=batch,
        use_cpu=not torch.cuda.is_available(),
        bce_lr=bce_lr,
        bce_epochs=bce_epochs,
    )


def _bce_budget(
    dataset: str, pretrained: bool, lr: float, epochs: float, probe: str, probe_epochs: float
) -> tuple[float, float]:
    """The BCE baseline's learning rate and epochs: never fewer epochs than a contrastive row trains for
    (stage 1, plus the linear probe's; the logistic probe's lbfgs fit has none), and on a pretrained
    encoder the study's recipe (``STUDY_BCE_LR``, at least ``STUDY_BCE_EPOCHS``).

    Args:
        dataset: the demo's dataset name (``STUDY_BCE_LR``'s key; others get GoEmotions' rate).
        pretrained: whether the encoder is pretrained (``--model``); a tiny random BERT keeps ``lr``.
        lr: the demo's stage-1 learning rate.
        epochs: stage 1's epochs.
        probe: stage 2's probe, ``logistic`` or ``linear``.
        probe_epochs: the linear probe's epochs.

    Returns:
        ``(learning_rate, num_train_epochs)`` of the BCE fine-tune.
    """
    contrastive = epochs + (probe_epochs if probe != "logistic" else 0.0)
    if not pretrained:
        return lr, contrastive
    return STUDY_BCE_LR.get(dataset, STUDY_BCE_LR["goemotions"]), max(STUDY_BCE_EPOCHS, contrastive)


def _bce_desc(plan: _Plan) -> str:
    """The BCE baseline's settings, as the demo prints them."""
    source = " (docs/RESULTS.md's BCE recipe)" if plan.pretrained else ""
    return (
        f"BCE fine-tuning, {plan.bce_epochs:g} epochs at lr {plan.bce_lr:g}{source}, "
        "the best epoch on validation macro-F1 kept"
    )


def _bce_run(plan: _Plan, n_runs: int) -> dict[str, Any]:
    """The baseline: the same encoder fine-tuned end to end with BCE (:func:`run_stages`), evaluated on
    validation every epoch; the best epoch's model is kept (its checkpoints are removed once it is saved)."""
    _say(f"[{n_runs}/{n_runs}] baseline: the same encoder, {_bce_desc(plan)}")
    bce = ProbingTrainingArguments(
        **plan.training(
            os.path.join(plan.request.output_dir, "bce", "classifier"),
            probe="finetune",
            loss="bce",
            learning_rate=plan.bce_lr,
            num_train_epochs=plan.bce_epochs,
            lr_scheduler_type="linear",
            warmup_steps=0.05,
            weight_decay=0.01,
            eval_strategy="epoch",
            save_strategy="epoch",
            save_total_limit=1,
            save_only_model=True,
            load_best_model_at_end=True,
            metric_for_best_model="macro_f1",
            greater_is_better=True,
        )
    )
    return run_stages(plan.model_args, plan.data_args, {"probe": bce}, data=plan.data)


def _contrastive_run(plan: _Plan, loss: str, i: int, n_runs: int) -> dict[str, Any]:
    """Stage 1 with ``loss`` and stage 2 on the frozen encoder (:func:`run_stages`, with their cards)."""
    run_dir = os.path.join(plan.request.output_dir, loss)
    cargs = ContrastiveTrainingArguments(
        **plan.training(
            os.path.join(run_dir, "encoder"),
            loss=loss,
            learning_rate=plan.lr,
            num_train_epochs=plan.epochs,
            lr_scheduler_type="cosine",
            warmup_steps=0.05,
            weight_decay=0.01,
            dataloader_drop_last=True,
        )
    )
    pargs = ProbingTrainingArguments(
        **plan.training(
            os.path.join(run_dir, "classifier"),
            probe=plan.request.probe,
            loss="bce",
            learning_rate=1e-2 if not plan.pretrained else 1e-3,
            num_train_epochs=plan.probe_epochs,
            lr_scheduler_type="linear",
        )
    )

    def announce(_i, _n, name, _args, result) -> None:
        if result is None:
            what = (
                f"stage 1: contrastive training with loss {loss!r} ({plan.epochs:g} epochs)"
                if name == "contrastive"
                else f"stage 2: {plan.request.probe} probe on the frozen {loss!r} encoder"
            )
            _say(f"[{i}/{n_runs}] {what}")

    return run_stages(
        plan.model_args,
        plan.data_args,
        {"contrastive": cargs, "probe": pargs},
        data=plan.data,
        announce=announce,
    )


def _report(plan: _Plan, results: dict[str, Any]) -> tuple[list[dict[str, Any]], str, str]:
    """One table row per method (its probe's test metrics, the test silhouette of its encoder) and the plots:
    per-label F1 against training frequency from the test scores each probe computed, and each encoder's
    2-D embedding projection."""
    import numpy as np

    from hf_mlcl.data import train_frequency
    from hf_mlcl.evaluation import (
        embedding_quality,
        per_label_f1,
        plot_embedding_projection,
        plot_f1_vs_frequency,
    )
    from hf_mlcl.evaluation.tables import format_table
    from hf_mlcl.modeling import MLCLEncoder

    ds, names, plots = (
        plan.data.dataset,
        plan.data.label_names,
        os.path.join(plan.request.output_dir, "plots"),
    )
    split = "test" if "test" in ds and len(ds["test"]) else "validation"
    rows, f1s = [], {}
    for name, stages in results.items():
        probe = stages["probe"]
        scores, truth = probe.scores[split]
        f1s[name] = per_label_f1(truth, scores >= np.asarray(probe.metrics["threshold"]))
        row = {"method": name, **{k: v for k, v in probe.metrics.items() if k.startswith(f"{split}_")}}
        if "contrastive" in stages:
            enc = MLCLEncoder.from_pretrained(stages["contrastive"].output_dir)
            emb = enc.encode(
                ds[split]["text"],
                plan.tokenizer,
                batch_size=128,
                max_length=plan.data_args.max_length,
                normalize=True,
            ).numpy()
            row[f"{split}_silhouette"] = embedding_quality(emb, truth)["silhouette"]
            plot_embedding_projection(
                emb,
                truth,
                os.path.join(plots, f"embeddings_{name}.png"),
                label_names=names,
                title=f"{plan.request.dataset}: {name} embeddings ({split})",
            )
        rows.append(row)
    plot_f1_vs_frequency(
        f1s,
        train_frequency(ds["train"], len(names)),
        os.path.join(plots, "f1_vs_frequency.png"),
        title=f"{plan.request.dataset}: per-label F1 vs training frequency ({split})",
    )
    table = format_table(rows, keys=("micro_f1", "macro_f1", "p@1", "p@5", "silhouette"), prefix=f"{split}_")
    return rows, table, split
