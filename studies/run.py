"""Runner of the study in docs/RESULTS.md: one (study, loss, probe, seed) cell per call.

    python studies/run.py cell reuters21578 --loss bce --probe finetune --lr 5e-5 --seed 1
    python studies/run.py cell reuters21578 --loss pretrained --probe linear --seed 1
    python studies/run.py cell reuters21578 --loss sd --probe finetune --lr best --seed 1

``--loss bce`` fine-tunes MiniLM with BCE (no stage 1); ``--loss pretrained`` probes the frozen pretrained
MiniLM; ``--lr best`` / ``extend`` / ``extend2`` take the BCE learning rate chosen on validation (``lr_grid.py``).
Only ``metrics.json`` and ``per_label_f1.json`` land in ``studies/results/<study>/<cell>/seed<S>/``; checkpoints
go under ``$MLCL_RUNS``; a cell whose ``metrics.json`` exists is skipped unless ``--force`` is given.

Protocol: docs/study.md, "The runner (studies/run.py)".
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cell_io  # noqa: E402  (studies/cell_io.py: the cell files every runner of the study writes)
import encoder_identity  # noqa: E402  (studies/encoder_identity.py: the digest of the stage-1 encoder's weights)
import paths  # noqa: E402  (studies/paths.py: where the study's files live)
import scale  # noqa: E402  (studies/scale.py: the data-scale study's subsets, epoch rule and cell names)


def _has_checkpoint(folder: str) -> bool:
    """True when ``folder`` holds a Trainer ``checkpoint-*`` to resume from."""
    return os.path.isdir(folder) and any(n.startswith("checkpoint-") for n in os.listdir(folder))


def _callbacks(args, folder: str, patience: int) -> list:
    """Timeline (always) and early stopping (when the stage evaluates and keeps the best model)."""
    from transformers import EarlyStoppingCallback

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timeline import TimelineCallback

    cbs = [TimelineCallback(os.path.join(folder, "timeline.jsonl"))]
    if str(getattr(args.eval_strategy, "value", args.eval_strategy)) != "no" and args.load_best_model_at_end:
        cbs.append(EarlyStoppingCallback(early_stopping_patience=patience))
    return cbs


def _epochs(folder: str) -> dict:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from timeline import epoch_summary

    return epoch_summary(os.path.join(folder, "timeline.jsonl"))


def _epoch_test(wanted: bool, probe: str, d_args, folder: str) -> list:
    """The per-epoch test scoring of ``--test-each-epoch`` (epoch_scores.py), for stages trained in epochs."""
    if not wanted:
        return []
    if probe == "logistic":
        raise ValueError("--test-each-epoch scores a stage trained in epochs: use --probe linear or finetune")
    from epoch_scores import EpochTestCallback

    from hf_mlcl.training.stages import load_run_data

    data = load_run_data(d_args)
    ds, names = data.dataset, data.label_names
    return [
        EpochTestCallback(
            ds["validation"],
            ds["test"],
            len(names),
            d_args.max_length,
            os.path.join(folder, "epoch_test.jsonl"),
        )
    ]


def best_bce_lr(dataset: str, train_size: int | None = None) -> str:
    """The fine-tuning learning rate chosen on validation among the BCE cells of the same training size
    (``bce_choice.best_bce_lr``; ValueError until every point of that size's grid has finished)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bce_choice

    return bce_choice.best_bce_lr(dataset, paths.RESULTS, train_size, complete=True)


def extended_bce_lr(dataset: str, train_size: int | None = None, k: int = 1) -> str | None:
    """The grid's ``k``-th extension, chosen on validation from the points before it at the same training
    size (studies/lr_grid.py); None when the best learning rate lies inside the grid."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bce_choice import bce_validation_scores
    from lr_grid import extension_lr

    return _extension(
        lambda: extension_lr(bce_validation_scores(dataset, paths.RESULTS, train_size), k),
        "--lr",
        k,
        train_size,
    )


def _extension(choose, option: str, k: int, train_size: int | None) -> str | None:
    """``choose()``: a grid's ``k``-th extension; its NotReady becomes a one-line ValueError naming ``option``."""
    from lr_grid import NotReady

    try:
        return choose()
    except NotReady as err:
        size = "" if train_size is None else f" --train-size {train_size}"
        raise ValueError(
            f"{option} extend{k if k > 1 else ''}: {err} (seed 1{size}); run them first"
        ) from None


def scale_tokens(
    recipe: dict, dataset: str, stage1: bool, probe: str, train_size: int | None, stage2: str = "probe"
) -> list[str]:
    """The overrides of a cell trained on ``train_size`` rows (studies/scale.py; none at full size): the seeded
    training subset, each trained stage's epochs by the epoch rule (``scale.scaled_epochs`` of the recipe's
    own; stage 1 only where ``stage1``), and a fine-tune or linear probe that evaluates (and keeps its best
    model) ``scale.EVALUATIONS`` times, evenly over its steps."""
    if scale.check_size(dataset, train_size) is None:
        return []
    full = scale.FULL_TRAIN[dataset]
    tokens = scale.subset_overrides(train_size)
    if stage1:
        epochs = scale.scaled_epochs(recipe["contrastive"]["num_train_epochs"], full, train_size)
        tokens += ["--contrastive.num_train_epochs", f"{epochs:g}"]
    epochs = recipe[stage2]["num_train_epochs"]
    if probe == "finetune":
        epochs = scale.scaled_epochs(epochs, full, train_size)
        tokens += [f"--{stage2}.num_train_epochs", f"{epochs:g}"]
    if probe != "logistic":
        every = str(scale.eval_every(epochs, train_size, recipe[stage2]["per_device_train_batch_size"]))
        for key, value in (("eval_strategy", "steps"), ("save_strategy", "steps"), ("eval_steps", every)):
            tokens += [f"--{stage2}.{key}", value]
        tokens += [f"--{stage2}.save_steps", every]
    return tokens


def best_joint_weight(dataset: str, train_size: int | None = None) -> str:
    """The joint objective's w chosen on validation at this training size, among the cells at the BCE learning
    rate chosen there (``bce_choice.best_joint_weight``; :func:`best_bce_lr`, the rate the joint cells train at)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bce_choice

    return bce_choice.best_joint_weight(dataset, paths.RESULTS, train_size, best_bce_lr(dataset, train_size))


def extended_joint_weight(dataset: str, train_size: int | None = None, k: int = 1) -> str | None:
    """The w grid's ``k``-th extension at this training size, among the cells at BCE's learning rate there (the
    rate the joint cells train at; ``bce_choice.extended_joint_weight``); None when the best w lies inside the
    grid."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import bce_choice

    if not 1 <= k <= bce_choice.JOINT_EXTENSIONS:
        raise ValueError(
            f"--weight extend{k}: the w grid extends at most {bce_choice.JOINT_EXTENSIONS} times"
        )
    return _extension(
        lambda: bce_choice.extended_joint_weight(
            dataset, paths.RESULTS, train_size, k, best_bce_lr(dataset, train_size)
        ),
        "--weight",
        k,
        train_size,
    )


def run_cell(
    dataset: str,
    loss: str,
    probe: str,
    seed: int,
    extra: list[str],
    force: bool = False,
    tag: str | None = None,
    lr: str | None = None,
    patience: int = 2,
    test_each_epoch: bool = False,
    batch_sampler: str = "random",
    train_size: int | None = None,
    weight: str | None = None,
    without_per_label: bool = False,
) -> dict:

    from hf_mlcl.data import label_names, train_frequency
    from hf_mlcl.recipes import load_recipe, parse_stage, split_overrides
    from hf_mlcl.training.stages import train_contrastive, train_joint, train_probe

    sys.path.insert(0, os.path.join(paths.REPO, "benchmarks"))
    from minilm import find_minilm

    os.chdir(paths.REPO)  # data_dir in the recipes is relative to the repository root
    recipe = load_recipe(cell_io.recipe_path(dataset, loss))
    joint = loss == "joint"  # one fine-tune with (1 - w) * BCE + w * contrastive: no stage 1, no probe stage
    stage2 = "joint" if joint else "probe"
    if joint and (probe != "finetune" or weight is None):
        raise ValueError("--loss joint fine-tunes: use it with --probe finetune and --weight W (or best)")
    if weight is not None:
        if not joint:
            raise ValueError("--weight is the joint objective's w: use it with --loss joint")
        extension = re.fullmatch(r"extend([0-9]*)", weight)
        if weight == "best":
            weight = best_joint_weight(dataset, train_size)
        elif extension:
            weight = extended_joint_weight(dataset, train_size, k=int(extension[1] or 1))
        if weight is None:
            print(f"SKIP {dataset} joint --weight: the best w lies inside the grid", flush=True)
            return {}
        float(weight)  # a number, or a clear error before any work
        tag = f"w{weight}" if tag is None else f"{tag}-w{weight}"
        extra = [*extra, "--joint.contrastive_weight", weight]
    # a training subset: its rows and epochs come first, so that an explicit override in ``extra`` wins
    stage1_trained = loss not in ("bce", "pretrained", "joint")
    extra = [*scale_tokens(recipe, dataset, stage1_trained, probe, train_size, stage2), *extra]
    if lr is not None:  # the fine-tuning learning rate under test; names the cell
        if probe != "finetune":
            raise ValueError("--lr is the fine-tuning learning rate: use it with --probe finetune")
        chosen = {
            "best": best_bce_lr,
            "extend": extended_bce_lr,
            "extend2": lambda *a: extended_bce_lr(*a, k=2),
        }.get(lr, lambda *_: lr)(dataset, train_size)
        if chosen is None:
            print(f"SKIP {dataset} bce --lr {lr}: the best learning rate lies inside the grid", flush=True)
            return {}
        lr = chosen
        float(lr)  # a number, or a clear error before any work
        tag = f"lr{lr}" if tag is None else f"{tag}-lr{lr}"  # e.g. finetune-long-lr2e-4: never read as an lr
        extra = [*extra, f"--{stage2}.learning_rate", lr]
    minilm = find_minilm()
    stage1 = loss
    if (
        batch_sampler != "random"
    ):  # a stage-1 variant: its own encoder, and a tag naming it on every probe cell
        if loss in ("bce", "pretrained"):
            raise ValueError("--batch-sampler chooses stage 1's batches: use it with a contrastive --loss")
        stage1 = f"{loss}-{batch_sampler}"
        tag = batch_sampler if tag is None else f"{batch_sampler}-{tag}"
        extra = [*extra, "--contrastive.batch_sampler", batch_sampler]
    stage1 = scale.cell_name(stage1, train_size)  # a subset's encoders and probes: <loss>-n<N>/seed<S>/
    run_dir = os.path.join(paths.RUNS, dataset, stage1, f"seed{seed}")
    cell = f"{loss}_{probe}" + (f"-{tag}" if tag else "")  # a tag keeps variants (overrides) apart
    cell = scale.cell_name(cell, train_size)  # a training subset of N rows: <cell>-n<N>
    out_dir = os.path.join(paths.RESULTS, dataset, cell, f"seed{seed}")
    if cell_io.finished(out_dir, force, without_per_label):
        print(f"SKIP {dataset} {cell} seed{seed}: {out_dir}/metrics.json exists (--force reruns)", flush=True)
        with open(os.path.join(out_dir, "metrics.json"), encoding="utf-8") as fh:
            return json.load(fh)
    tokens = ["--model_name_or_path", minilm, "--seed", str(seed), *extra]
    tokens += [] if joint else ["--probe.probe", probe]
    result: dict = {
        "dataset": dataset,
        "loss": loss,
        "probe": probe,
        "seed": seed,
        "overrides": extra,
        "tag": tag,
        "batch_sampler": batch_sampler,
        "train_size": train_size,  # None: the whole training split (studies/scale.py)
        "git_commit": cell_io.git_commit(),
        "device": cell_io.device(),
    }
    wall: dict[str, float] = {}

    encoder_path = None
    if stage1_trained:
        encoder_path = os.path.join(run_dir, "encoder")
        done = os.path.join(encoder_path, "metrics.json")
        ov = split_overrides([*tokens, "--max_eval_samples", "256"], ["contrastive", stage2])
        _, _, c_args = parse_stage(recipe, "contrastive", ov, output_dir=encoder_path)
        result["contrastive_args"] = {
            k: getattr(c_args, k)
            for k in (
                "loss",
                "loss_kwargs",
                "temperature",
                "learning_rate",
                "num_train_epochs",
                "per_device_train_batch_size",
                "queue_size",
                "n_views",
                "seed",
                "batch_sampler",
            )
        }
        if not os.path.isfile(done):
            m_args, d_args, c_args = parse_stage(recipe, "contrastive", ov, output_dir=encoder_path)
            if _has_checkpoint(encoder_path):
                c_args.resume_from_checkpoint = True
                print(f"RESUME stage 1 from the last checkpoint in {encoder_path}", flush=True)
            t0 = time.time()
            train_contrastive(m_args, d_args, c_args, callbacks=_callbacks(c_args, encoder_path, patience))
            wall["stage1_s"] = round(time.time() - t0, 1)
            with open(done, encoding="utf-8") as fh:
                saved = json.load(fh)
            saved["wall_s"] = wall["stage1_s"]
            saved["epochs"] = _epochs(encoder_path)
            cell_io.write_json(done, saved)
        with open(done, encoding="utf-8") as fh:
            result["stage1"] = json.load(fh)
        result["stage1"]["weights_sha256"] = encoder_identity.weights_digest(
            encoder_path
        )  # the one stage 2 loads
        wall["stage1_s"] = result["stage1"].get("wall_s")
    elif loss == "bce" and probe != "finetune":
        raise ValueError("--loss bce is the fine-tuning baseline: use --probe finetune")

    if probe in ("logistic", "linear"):  # frozen features on disk: the second probe of an encoder loads them
        tokens = [*tokens, "--probe.feature_cache_dir", os.path.join(paths.RUNS, dataset, "features")]
    ov = split_overrides(tokens, ["contrastive", stage2])  # the cell's tokens name both stages
    probe_dir = os.path.join(run_dir, probe + (f"-{tag}" if tag else ""))
    m_args, d_args, p_args = parse_stage(recipe, stage2, ov, output_dir=probe_dir)
    if loss == "bce":
        p_args.loss = "bce"
    for path in cell_io.drop_finished_run_files(probe_dir, out_dir):  # a rerun trains anew
        print(f"RERUN: removed {path} of the finished run", flush=True)
    if probe != "logistic" and _has_checkpoint(probe_dir):
        p_args.resume_from_checkpoint = True
        print(f"RESUME stage 2 from the last checkpoint in {probe_dir}", flush=True)
    t0 = time.time()
    stage = (train_joint if joint else train_probe)(
        m_args,
        d_args,
        p_args,
        encoder_path=encoder_path,
        callbacks=_callbacks(p_args, probe_dir, patience)
        + _epoch_test(test_each_epoch, probe, d_args, probe_dir),
    )
    trainer, metrics = stage.trainer, stage.metrics
    wall["probe_s"] = round(time.time() - t0, 1)  # this process's part when the stage was resumed
    if getattr(
        trainer, "feature_sources", None
    ):  # "encoded" / "loaded" per split: what the probe's wall time holds
        result["features"] = dict(trainer.feature_sources)
    if probe != "logistic":
        result["epochs"] = _epochs(probe_dir)
        if test_each_epoch:
            from epoch_scores import read_epoch_tests

            result["epoch_test"] = read_epoch_tests(os.path.join(probe_dir, "epoch_test.jsonl"))
        best = trainer.state.best_model_checkpoint  # recorded relative to $MLCL_RUNS: no machine paths
        result["best_checkpoint"] = None if best is None else os.path.relpath(best, paths.RUNS)
        result["best_metric"] = trainer.state.best_metric
        if any(type(cb).__name__ == "EarlyStoppingCallback" for cb in trainer.callback_handler.callbacks):
            result["early_stopping_patience"] = patience  # checked against the evaluations (studies/tests)
    result["probe_args"] = {
        k: getattr(p_args, k)
        for k in (
            "probe",
            "loss",
            "threshold",
            "learning_rate",
            "num_train_epochs",
            "per_device_train_batch_size",
            "logistic_c_grid",
            "seed",
            "contrastive_weight",
            "supervised_loss",
            "temperature",
        )
        if hasattr(p_args, k)
    }
    result["data"] = {
        "train": len(trainer.train_dataset),  # the rows trained on
        "subset_seed": d_args.subset_seed,
        "max_train_samples": d_args.max_train_samples,
        "max_eval_samples": d_args.max_eval_samples,
        "max_test_samples": d_args.max_test_samples,
        "max_length": d_args.max_length,
        "data_dir": d_args.data_dir,
    }
    result["metrics"] = metrics
    result["wall_s"] = wall

    # per-label F1 on test at the tuned threshold, with training-subset frequencies (the tail table and plot read
    # those of the random-batch cells only)
    if batch_sampler == "random":
        scores, truth = stage.scores["test"]
        names = label_names(trainer.train_dataset)
        train_count = train_frequency(trainer.train_dataset, len(names))
        cell_io.write_json(
            os.path.join(out_dir, "per_label_f1.json"),
            cell_io.per_label_record(names, truth, scores, metrics["threshold"], train_count),
        )
    cell_io.write_json(os.path.join(out_dir, "metrics.json"), result)
    print(
        f"RESULT {dataset} {cell} seed{seed}: test micro-F1 {metrics.get('test_micro_f1'):.4f} "
        f"macro-F1 {metrics.get('test_macro_f1'):.4f} wall {wall}",
        flush=True,
    )
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["cell"])
    ap.add_argument("dataset")
    ap.add_argument("--loss", required=True)
    ap.add_argument("--probe", default="logistic", choices=["logistic", "linear", "finetune"])
    ap.add_argument(
        "--lr",
        default=None,
        help="cell, --probe finetune: learning rate under test (names the cell "
        "lr<value>), 'best' for the BCE one with the highest validation macro-F1 (seed 1), or 'extend' "
        "for the BCE grid's third point, chosen on validation from the first two, 'extend2' for a fourth past "
        "the third when it is the best (lr_grid.py)",
    )
    ap.add_argument(
        "--patience",
        type=int,
        default=2,
        help="cell: early stopping after this many evaluations "
        "without improvement (stages that evaluate during training)",
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--tag",
        default=None,
        help="cell: name of a stage-2 variant (its --probe.key value overrides follow; "
        "with --lr the cell is <loss>_finetune-<tag>-lr<value>); the stage-1 encoder of the (dataset, "
        "loss, seed) is shared",
    )
    ap.add_argument(
        "--batch-sampler",
        default="random",
        choices=["random", "positives"],
        help="cell: stage 1's batches ('positives': every anchor has a positive under the loss's rule, "
        "hf_mlcl.data.sampler); a variant other than 'random' has its own stage-1 encoder and tags the "
        "cell <loss>_<probe>-<sampler>",
    )
    ap.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="cell: train on this many rows of the training split, the same seeded subset for every method "
        "and seed, with epochs by the epoch rule (studies/scale.py; cell <cell>-n<N>); default: all",
    )
    ap.add_argument(
        "--weight",
        default=None,
        help="cell, --loss joint: w of (1 - w) * BCE + w * contrastive (the cell joint_finetune-w<w>-lr<lr>), "
        "'best': the w of the seed-1 joint cells of this size with the best validation macro-F1, or 'extend', "
        "'extend2', 'extend3': the w grid's next point past its better edge (bce_choice.JOINT_LADDER; skipped when the best "
        "w lies inside the grid)",
    )
    ap.add_argument("--force", action="store_true", help="cell: rerun even if the cell's metrics.json exists")
    ap.add_argument("--rerun-without-per-label", action="store_true", help="cell: " + cell_io.RERUN_HELP)
    ap.add_argument(
        "--test-each-epoch",
        action="store_true",
        help="also score test after every epoch (a tuned "
        "threshold each time; the points of the compute figure; no choice reads them)",
    )
    args, extra = ap.parse_known_args(argv)
    run_cell(
        args.dataset,
        args.loss,
        args.probe,
        args.seed,
        extra,
        force=args.force,
        tag=args.tag,
        lr=args.lr,
        patience=args.patience,
        test_each_epoch=args.test_each_epoch,
        batch_sampler=args.batch_sampler,
        train_size=args.train_size,
        weight=args.weight,
        without_per_label=args.rerun_without_per_label,
    )


if __name__ == "__main__":
    main(sys.argv[1:])
