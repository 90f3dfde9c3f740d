"""Every committed recipe parses with the real argument dataclasses; the grid is complete and current;
composition, typo detection and override routing behave; accelerate configs load with accelerate's own
config class."""

from __future__ import annotations

import importlib.util
import os
import warnings

import pytest
import torch

from hf_mlcl.recipes import (
    STAGES,
    RecipeError,
    load_recipe,
    parse_stage,
    recipe_stages,
    split_overrides,
    validate_recipe,
)

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
RECIPES = os.path.join(ROOT, "recipes")


def _generator():
    spec = importlib.util.spec_from_file_location("recipes_generate", os.path.join(RECIPES, "generate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


GEN = _generator()
CELLS = sorted(GEN.grid())


def _cpu_overrides():
    # The recipes ask for bf16 (the papers' precision). transformers 5.23 refuses bf16 without a GPU
    # unless use_cpu is set, so the CPU check parses exactly what a CPU user would run.
    return split_overrides(["--use_cpu", "true"], STAGES)


def test_grid_is_complete_and_generated_files_are_current():
    assert GEN.main(["--check"]) == 0
    # 3 general datasets x 2 encoders + 6 MIMIC settings x 3 encoders, each with 10 losses and the joint
    # objective (not on PLM-ICD: its label attention pools no representation)
    assert len(CELLS) == (3 * 2 + 6 * 3) * 11 - 6 == 258
    on_disk = set()
    for dataset in GEN.DATASETS:
        for dirpath, _dirs, files in os.walk(os.path.join(RECIPES, dataset)):
            rel = os.path.relpath(dirpath, RECIPES)
            on_disk |= {os.path.join(rel, f) for f in files if f.endswith(".yaml")}
    assert on_disk == set(CELLS), "a recipe in a grid folder that the generator does not write (stale?)"


def _hand_written_recipes() -> list[str]:
    """Every recipe that is neither a base, an accelerate config, nor a generated grid cell, and every recipe of
    the results study (studies/recipes), relative to the repository root."""
    out = []
    grid_dirs = set(GEN.DATASETS) | {"base", "accelerate"}
    for dirpath, _dirs, files in os.walk(RECIPES):
        rel = os.path.relpath(dirpath, RECIPES)
        if rel == "." or rel.split(os.sep)[0] in grid_dirs:
            continue
        out += [os.path.join("recipes", rel, f) for f in files if f.endswith(".yaml")]
    for dirpath, _dirs, files in os.walk(os.path.join(ROOT, "studies", "recipes")):
        out += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in files if f.endswith(".yaml")]
    return sorted(out)


@pytest.mark.parametrize("rel", _hand_written_recipes())
def test_every_hand_written_recipe_parses(rel):
    """recipes/demo, studies/recipes ...: the same real-dataclass parse as the grid (CPU: use_cpu)."""
    recipe = load_recipe(os.path.join(ROOT, rel))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        for stage in recipe_stages(recipe):
            model_args, data_args, args = parse_stage(recipe, stage, _cpu_overrides())
            assert data_args.dataset and args.output_dir


def test_every_recipe_parses_with_the_real_argument_classes():
    overrides = _cpu_overrides()
    n = 0
    with warnings.catch_warnings():
        # a deprecated TrainingArguments name (removed in transformers 6) must fail here, not in a user's run
        warnings.simplefilter("error", FutureWarning)
        for rel in CELLS:
            recipe = load_recipe(os.path.join(RECIPES, rel))
            dataset, encoder, loss = rel[: -len(".yaml")].split(os.sep)
            for stage in recipe_stages(recipe):
                model_args, data_args, args = parse_stage(recipe, stage, overrides)
                n += 1
                assert args.bf16 is True and args.weight_decay == 0.01 and args.max_grad_norm == 1.0
                assert args.warmup_steps == 0.05
                assert args.output_dir == os.path.join(
                    "outputs", dataset, encoder, loss, GEN_STAGE_DIR[stage]
                )
                assert model_args.model_name_or_path
                if (
                    dataset == "rcv1"
                ):  # ABALONE's label set (topics seen 30 times in training) and validation share
                    assert data_args.dataset_options == {"min_label_count": 30, "validation_size": 0.15}
                if stage == "contrastive":
                    assert str(args.lr_scheduler_type.value) == "cosine"
                    assert model_args.projection_dim == (
                        128 if loss == "hbl" else 256
                    )  # HBL's stated dimension
                    if loss in ("ws_mulsupcon", "hbl"):  # the papers' momentum keys and queue
                        assert args.queue_size == 4096 and args.momentum == 0.999
                    assert args.loss == {"sd": "similarity_dissimilarity"}.get(loss, loss)
                elif stage == "joint":
                    assert args.loss == "jaccard" and args.supervised_loss == "bce"
                    assert args.contrastive_weight == 0.5 and args.per_device_train_batch_size in (32, 128)
                else:
                    assert args.loss == (loss if loss in SUPERVISED_BASELINES else "bce")
                    assert args.probe == ("finetune" if loss in SUPERVISED_BASELINES else "linear")
    # the 24 BCE and 24 ZLPR baselines have no contrastive stage; the 18 joint recipes one stage
    assert n == 240 + 192 + 18


SUPERVISED_BASELINES = ("bce", "zlpr")


GEN_STAGE_DIR = {"contrastive": "encoder", "probe": "classifier", "joint": "classifier"}


@pytest.mark.parametrize(
    "rel, expect",
    [
        # SD paper App. C: tau 0.07, D_P 256; ABALONE: batch 32, lr 2e-5, 80 epochs; RoBERTa 512 tokens
        (
            "aapd/roberta-base/sd.yaml",
            dict(
                temperature=0.07,
                per_device_train_batch_size=32,
                learning_rate=2e-5,
                num_train_epochs=80,
                max_length=512,
                pooling="cls",
                model_name_or_path="FacebookAI/roberta-base",
            ),
        ),
        (
            "uklex/legal-bert/jaccard.yaml",
            dict(
                temperature=0.1,
                model_name_or_path="nlpaueb/legal-bert-base-uncased",
                dataset_options={"version": 69},
            ),
        ),
        # ABALONE MSC: queue 512, momentum 0.999, beta 0.1
        (
            "rcv1/roberta-base/msc.yaml",
            dict(temperature=0.1, queue_size=512, momentum=0.999, loss_kwargs={"beta": 0.1}),
        ),
        # Llama + LoRA r16 / alpha 32 / dropout 0.1, 1,024 tokens on MIMIC, batch 128 (SD paper v1)
        (
            "mimic4_icd10_50/llama-3.1-8b-lora/mulsupcon.yaml",
            dict(
                use_lora=True,
                lora_r=16,
                lora_alpha=32,
                lora_dropout=0.1,
                max_length=1024,
                pooling="last_token",
                per_device_train_batch_size=128,
                dataset="mimic4_icd10",
                dataset_options={"variant": "50"},
                activation_checkpointing=True,
            ),
        ),
        ("aapd/llama-3.1-8b-lora/any.yaml", dict(max_length=512, learning_rate=1e-4)),
        # PLM-ICD: 3,072 tokens in 128-token segments, label-wise attention head
        (
            "mimic3_full/plm-icd/all.yaml",
            dict(
                max_length=3072,
                chunk_size=128,
                head="label_attention",
                dataset="mimic3",
                dataset_options={"variant": "full"},
            ),
        ),
        ("mimic3_50/plm-icd/hbl.yaml", dict(loss="hbl", loss_kwargs={"base": "mulsupcon"}, queue_size=4096)),
    ],
)
def test_paper_hyperparameters_reach_the_arguments(rel, expect):
    model_args, data_args, args = parse_stage(
        load_recipe(os.path.join(RECIPES, rel)), "contrastive", _cpu_overrides()
    )
    for key, value in expect.items():
        got = next(getattr(o, key) for o in (model_args, data_args, args) if hasattr(o, key))
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, key


@pytest.mark.parametrize("loss", SUPERVISED_BASELINES)
def test_supervised_baselines_skip_the_contrastive_stage(loss):
    recipe = load_recipe(os.path.join(RECIPES, f"aapd/roberta-base/{loss}.yaml"))
    assert recipe["stages"] == ["probe"]
    _, _, args = parse_stage(recipe, "probe", _cpu_overrides())
    assert args.probe == "finetune" and args.learning_rate == pytest.approx(2e-5) and args.loss == loss


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU behaviour of bf16")
def test_bf16_without_a_gpu_needs_use_cpu():
    """What transformers 5.23 does with the recipes' bf16 on a CPU-only machine (documented in the README)."""
    recipe = load_recipe(os.path.join(RECIPES, "aapd/roberta-base/sd.yaml"))
    with pytest.raises(ValueError, match="use_cpu"):
        parse_stage(recipe, "contrastive")


# ------------------------------------------------------------------------------------------------ errors
def _write(tmp_path, name, text):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "contrastive:\n  lerning_rate: 1.0e-5\n",
            r"unknown key 'lerning_rate' .*\[contrastive\].*'learning_rate'",
        ),
        ("model_name_or_pth: x\n", r"unknown key 'model_name_or_pth'.*'model_name_or_path'"),
        ("learning_rate: 1.0e-5\n", r"'learning_rate' .* training argument: put it under `contrastive:`"),
        # removed in transformers 5.x: must fail loudly, not be ignored
        ("contrastive:\n  warmup_ratio: 0.05\n", r"unknown key 'warmup_ratio'"),
        ("probe:\n  evaluation_strategy: epoch\n", r"unknown key 'evaluation_strategy'.*'eval_strategy'"),
        ("stages: [pretrain]\n", r"stages must be"),
        ("probe: 3\n", r"`probe:` must be a mapping"),
    ],
)
def test_unknown_or_misplaced_keys_name_the_key(tmp_path, text, match):
    with pytest.raises(RecipeError, match=match):
        validate_recipe(load_recipe(_write(tmp_path, "r.yaml", text)))


def test_base_composition_order_deep_merge_and_relative_paths(tmp_path):
    _write(
        tmp_path,
        "base/a.yaml",
        "dataset: aapd\nmax_length: 128\ncontrastive:\n  loss: all\n  temperature: 0.1\n",
    )
    _write(tmp_path, "base/b.yaml", "max_length: 256\ncontrastive:\n  loss: any\n")
    leaf = _write(
        tmp_path, "cells/x/leaf.yaml", "_base_: [../../base/a.yaml, ../../base/b.yaml]\nmax_length: 64\n"
    )
    recipe = load_recipe(leaf)
    assert recipe == {"dataset": "aapd", "max_length": 64, "contrastive": {"loss": "any", "temperature": 0.1}}
    # a single string is accepted too
    one = _write(tmp_path, "cells/one.yaml", "_base_: ../base/b.yaml\n")
    assert load_recipe(one)["max_length"] == 256


def test_base_cycle_and_missing_base_are_reported(tmp_path):
    _write(tmp_path, "a.yaml", "_base_: [b.yaml]\n")
    _write(tmp_path, "b.yaml", "_base_: [a.yaml]\n")
    with pytest.raises(RecipeError, match="cycle"):
        load_recipe(str(tmp_path / "a.yaml"))
    _write(tmp_path, "c.yaml", "_base_: [nope.yaml]\n")
    with pytest.raises(
        RecipeError, match=r"c.yaml: its _base_ 'nope.yaml' is not a file"
    ):  # names the recipe
        load_recipe(str(tmp_path / "c.yaml"))
    _write(tmp_path, "d.yaml", "- a\n- b\n")
    with pytest.raises(RecipeError, match="mapping"):
        load_recipe(str(tmp_path / "d.yaml"))


def test_overrides_are_routed_by_scope():
    ov = split_overrides(
        [
            "--learning_rate",
            "3.0e-5",
            "--probe.num_train_epochs=2",
            "--max_length",
            "64",
            "--output_dir",
            "/tmp/run",
            "--contrastive.loss",
            "any",
            "--report_to",
            "none",
        ],
        STAGES,
    )
    assert ov.common == ["--max_length", "64"]
    assert ov.output_dir == "/tmp/run"
    assert ov.stage["contrastive"] == ["--learning_rate", "3.0e-5", "--loss", "any", "--report_to", "none"]
    assert ov.stage["probe"] == [
        "--learning_rate",
        "3.0e-5",
        "--num_train_epochs",
        "2",
        "--report_to",
        "none",
    ]
    recipe = load_recipe(os.path.join(RECIPES, "aapd/roberta-base/sd.yaml"))
    ov = split_overrides(
        [
            "--use_cpu",
            "--learning_rate",
            "3.0e-5",
            "--probe.num_train_epochs=2",
            "--max_length",
            "64",
            "--output_dir",
            "/tmp/run",
        ],
        STAGES,
    )
    m, d, c = parse_stage(recipe, "contrastive", ov)
    _, _, p = parse_stage(recipe, "probe", ov)
    assert (c.learning_rate, d.max_length, c.output_dir) == (3e-5, 64, "/tmp/run/encoder")
    assert (p.learning_rate, p.num_train_epochs, p.output_dir) == (3e-5, 2, "/tmp/run/classifier")
    assert c.num_train_epochs == 80  # the probe-only override did not leak into stage 1
    # the reused parser is reset between calls: the earlier override does not stick
    _, _, again = parse_stage(recipe, "contrastive", _cpu_overrides())
    assert again.learning_rate == 2e-5


@pytest.mark.parametrize(
    "tokens, match",
    [
        (["--lerning_rate", "1e-5"], r"unknown key 'lerning_rate'.*'learning_rate'"),
        (["--probe.queue_size", "3"], r"unknown key 'queue_size' in --probe"),
        (["--train.learning_rate", "3"], r"prefix must be one of"),
        (["learning_rate", "3"], r"expected an option"),
        (["--output_dir="], r"--output_dir takes exactly one folder"),  # it fell back to the recipe's
    ],
)
def test_bad_overrides_name_the_problem(tokens, match):
    with pytest.raises(RecipeError, match=match):
        split_overrides(tokens, STAGES)


def test_a_stage_only_key_is_rejected_when_that_stage_does_not_run():
    with pytest.raises(RecipeError, match="queue_size"):
        split_overrides(["--queue_size", "8"], ["probe"])


# ------------------------------------------------------------------------------------------- accelerate
ACCELERATE = os.path.join(RECIPES, "accelerate")


def test_accelerate_configs_load_with_accelerates_config_class():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import DistributedType

    names = sorted(f for f in os.listdir(ACCELERATE) if f.endswith(".yaml"))
    assert names == [
        "cpu.yaml",
        "deepspeed_zero3.yaml",
        "fsdp_llama_lora.yaml",
        "multi_gpu.yaml",
        "single_gpu.yaml",
    ]
    launch_dests = {a.dest for a in launch_command_parser()._actions}
    configs = {}
    for name in names:
        cfg = ClusterConfig.from_yaml_file(os.path.join(ACCELERATE, name))  # rejects unknown top-level keys
        configs[name] = cfg
        # `accelerate launch` copies fsdp_config / deepspeed_config entries onto its own options
        for key in cfg.fsdp_config or {}:
            assert (key if "fsdp" in key else f"fsdp_{key}") in launch_dests, key
        for key in cfg.deepspeed_config or {}:
            assert key in launch_dests, key
    assert (
        configs["single_gpu.yaml"].distributed_type == DistributedType.NO
        and configs["single_gpu.yaml"].num_processes == 1
    )
    assert configs["multi_gpu.yaml"].distributed_type == DistributedType.MULTI_GPU
    # cpu.yaml: the torchrun launcher (MULTI_GPU type, use_cpu false) so --num_processes N starts N
    # processes; `use_cpu: true` would make `accelerate launch` start one. The recipe's --use_cpu picks gloo.
    cpu = configs["cpu.yaml"]
    assert (
        cpu.distributed_type == DistributedType.MULTI_GPU and cpu.use_cpu is False and cpu.num_processes == 2
    )
    assert cpu.mixed_precision == "no"
    fsdp = configs["fsdp_llama_lora.yaml"]
    assert fsdp.distributed_type == DistributedType.FSDP and fsdp.mixed_precision == "bf16"
    # FSDP2: FSDP1's flat parameters cannot hold the bf16 backbone with the fp32 LoRA adapters and heads
    assert fsdp.fsdp_config["fsdp_version"] == 2
    assert fsdp.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"  # the final save gathers
    assert fsdp.fsdp_config["fsdp_auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert fsdp.fsdp_config["fsdp_transformer_layer_cls_to_wrap"] == "LlamaDecoderLayer"
    ds = configs["deepspeed_zero3.yaml"]
    assert ds.distributed_type == DistributedType.DEEPSPEED and ds.deepspeed_config["zero_stage"] == 3


def test_fsdp_plugin_accepts_the_fsdp_settings(monkeypatch):
    """Reproduce `accelerate launch`: config file -> launch options -> process environment -> FSDP plugin."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import launch_command_parser
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env

    path = os.path.join(ACCELERATE, "fsdp_llama_lora.yaml")
    cfg = ClusterConfig.from_yaml_file(path)
    args = launch_command_parser().parse_args(
        [
            "--config_file",
            path,
            "--use_fsdp",
            "--num_processes",
            "8",
            "--num_machines",
            "1",
            "--mixed_precision",
            "bf16",
            "--dynamo_backend",
            "no",
            "train.py",
        ]
    )
    for key, value in cfg.fsdp_config.items():  # what launch_command does with the config file
        setattr(args, key if "fsdp" in key else f"fsdp_{key}", value)
    env = prepare_multi_gpu_env(args)
    assert env["FSDP_VERSION"] == "2" and env["FSDP_AUTO_WRAP_POLICY"] == "TRANSFORMER_BASED_WRAP"
    for key, value in env.items():
        if key.startswith("FSDP_"):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.use_orig_params is None and plugin.sync_module_states is None  # obsolete in FSDP2
    assert plugin.cpu_ram_efficient_loading is True
    assert plugin.transformer_cls_names_to_wrap == ["LlamaDecoderLayer"]


def test_reused_parser_gives_the_dataclass_defaults():
    """The cached parser is reset per action (bool fields have a --x and a --no_x action on one dest)."""
    import dataclasses

    from hf_mlcl.training.arguments import ContrastiveTrainingArguments

    parse_stage(
        load_recipe(os.path.join(RECIPES, "aapd/roberta-base/sd.yaml")), "contrastive", _cpu_overrides()
    )
    _, _, parsed = parse_stage({}, "contrastive", output_dir="x")
    direct = ContrastiveTrainingArguments(output_dir="x")
    assert parsed.eval_do_concat_batches is True
    for f in dataclasses.fields(direct):
        if f.init:
            assert getattr(parsed, f.name) == getattr(direct, f.name), f.name


def test_demo_recipe_parses_on_cpu_without_overrides():
    recipe = load_recipe(os.path.join(RECIPES, "demo", "tiny_synthetic.yaml"))
    model_args, data_args, args = parse_stage(recipe, "contrastive")
    assert model_args.backbone_config["model_type"] == "bert" and data_args.dataset == "synthetic"
    assert args.loss == "similarity_dissimilarity" and args.output_dir == "outputs/tiny_synthetic/encoder"
    _, _, probe = parse_stage(recipe, "probe")
    assert probe.output_dir == "outputs/tiny_synthetic/classifier"


def test_a_wrong_type_in_a_recipe_is_one_line_naming_the_key(tmp_path, capsys):
    """A recipe value of the wrong type stops in one line naming the recipe key (not argparse's usage text,
    not the command line); a wrong value given on the command line is said of the command line."""
    from hf_mlcl.cli import main

    recipe = tmp_path / "bad.yaml"
    recipe.write_text(
        f"_base_: {os.path.join(ROOT, 'recipes', 'demo', 'tiny_synthetic.yaml')}\ncontrastive:\n  num_train_epochs: abc\n"
    )
    assert main(["train", str(recipe), "--output_dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "hf-mlcl train: error: recipe key 'num_train_epochs' under `contrastive:`: invalid float value: 'abc'"
    ]
    good = os.path.join(ROOT, "recipes", "demo", "tiny_synthetic.yaml")
    assert (
        main(["train", good, "--output_dir", str(tmp_path / "o"), "--contrastive.num_train_epochs", "x"]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "on the command line" in err[0] and "'x'" in err[0]


def test_a_key_that_moved_says_where_it_lives_now():
    with pytest.raises(
        RecipeError, match="'projection_dim' in r.yaml \\[contrastive\\] belongs at the top level"
    ):
        validate_recipe({"contrastive": {"projection_dim": 128}}, "r.yaml")
    recipe = {"projection_dim": 64, "stages": ["contrastive"], "contrastive": {"use_cpu": True}}
    model_args, _, _ = parse_stage(recipe, "contrastive")
    assert model_args.projection_dim == 64


@pytest.mark.parametrize(
    "rel, stage, expect",
    [
        # the encoder base's own values win over the loss base's stage defaults
        ("aapd/llama-3.1-8b-lora/joint.yaml", "joint", dict(learning_rate=1e-4)),
        ("mimic3_50/plm-icd/bce.yaml", "probe", dict(learning_rate=5e-5)),
        ("mimic3_50/plm-icd/zlpr.yaml", "probe", dict(learning_rate=5e-5)),
        # ... and the dataset base's (MIMIC: 20 epochs for every stage)
        ("mimic3_full/roberta-base/bce.yaml", "probe", dict(num_train_epochs=20, learning_rate=2e-5)),
        ("mimic4_icd10_50/roberta-base/joint.yaml", "joint", dict(num_train_epochs=20, learning_rate=2e-5)),
        # where neither sets a value, the loss base's stands
        ("aapd/roberta-base/bce.yaml", "probe", dict(num_train_epochs=10, learning_rate=2e-5)),
    ],
)
def test_a_dataset_or_encoder_base_wins_over_the_loss_base(rel, stage, expect):
    _, _, args = parse_stage(load_recipe(os.path.join(RECIPES, rel)), stage, _cpu_overrides())
    for key, value in expect.items():
        assert getattr(args, key) == pytest.approx(value), key
