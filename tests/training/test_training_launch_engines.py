"""hf_mlcl.training.launch.launch_problem: a launch that asks for DeepSpeed / FSDP but would train something else
(or cannot run as asked) is named with its cause and fix, from the arguments and the environment alone."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from hf_mlcl.training.launch import launch_problem, requested_engine
from hf_mlcl.training.preflight import check_launch


def _args(**kw):
    base = dict(use_cpu=False, ddp_backend=None, gradcache_chunk_size=0, deepspeed=None, fsdp=[])
    base.update(kw)
    return SimpleNamespace(**base)


@pytest.fixture
def env(monkeypatch):
    for name in ("ACCELERATE_USE_DEEPSPEED", "ACCELERATE_USE_FSDP", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_no_engine_asked_no_problem(env):
    assert requested_engine(_args()) is None
    assert launch_problem(_args(use_cpu=True, gradcache_chunk_size=8), cuda_available=False) is None


def test_deepspeed_requests(env):
    env.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert requested_engine(_args()) == "deepspeed"
    assert (
        launch_problem(_args(), cuda_available=False) is None
    )  # one CPU process: DeepSpeed's CPU accelerator
    problem = launch_problem(_args(use_cpu=True), cuda_available=False)
    assert "use_cpu=True makes accelerate drop it" in problem and "remove --use_cpu true" in problem
    env.setenv("WORLD_SIZE", "2")
    assert "--ddp_backend gloo" in launch_problem(_args(), cuda_available=False)
    assert launch_problem(_args(ddp_backend="gloo"), cuda_available=False) is None
    assert launch_problem(_args(), cuda_available=True) is None  # GPUs: NCCL
    problem = launch_problem(_args(ddp_backend="gloo", gradcache_chunk_size=8), cuda_available=False)
    assert "gradcache_chunk_size=8" in problem and "--contrastive.gradcache_chunk_size 0" in problem
    assert "\n" not in problem


def test_fsdp_requests(env):
    env.setenv("ACCELERATE_USE_FSDP", "true")
    assert requested_engine(_args()) == "fsdp"
    problem = launch_problem(_args(), cuda_available=False)
    assert "no GPU" in problem and "plain DDP" in problem and "deepspeed_zero3.yaml" in problem
    assert "use_cpu=True" in launch_problem(_args(use_cpu=True), cuda_available=True)
    assert (
        launch_problem(_args(gradcache_chunk_size=8), cuda_available=True) is None
    )  # GradCache runs under FSDP
    env.delenv("ACCELERATE_USE_FSDP")
    assert "args.fsdp" in launch_problem(_args(fsdp=["full_shard"]), cuda_available=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-machine launch rules")
def test_check_launch_lets_several_deepspeed_cpu_processes_through(env):
    env.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--use_cpu true"):
        check_launch(_args())  # plain multi-process launch on CPU: the existing check
    env.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    check_launch(_args(ddp_backend="gloo"))  # ZeRO-3 over gloo needs no use_cpu
    with pytest.raises(ValueError, match="--ddp_backend gloo"):
        check_launch(_args())


def test_a_process_that_accelerate_launch_cpu_started_alone_stops(env):
    """`accelerate launch --cpu --num_processes 2` (or --num_machines 2) runs the script once per machine
    with MASTER_ADDR but no WORLD_SIZE: each process would train alone into the same folder."""
    from hf_mlcl.training.preflight import InputError

    for name in ("RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MV2_COMM_WORLD_SIZE", "MASTER_ADDR"):
        env.delenv(name, raising=False)
    env.setenv("ACCELERATE_USE_CPU", "True")
    check_launch(_args(use_cpu=True))  # `accelerate launch --cpu` of one process: fine
    env.setenv("MASTER_ADDR", "127.0.0.1")
    env.setenv("MASTER_PORT", "29500")
    with pytest.raises(InputError, match="started this process on its own") as err:
        check_launch(_args(use_cpu=True))
    assert "recipes/accelerate/cpu.yaml" in str(err.value) and "\n" not in str(err.value)
    env.setenv("WORLD_SIZE", "2")  # torchrun (cpu.yaml) or mpirun gave the process its rank: a real group
    env.setenv("RANK", "1")
    check_launch(_args(use_cpu=True))


def test_a_trainer_without_the_requested_engine_stops(env):
    """After preparation (EngineCheckCallback) and when built (check_engine_applied): the requested engine or a
    one-line error naming the cause."""
    from accelerate.utils import DistributedType

    from hf_mlcl.training.launch import EngineCheckCallback, check_engine_applied

    env.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    trainer = SimpleNamespace(
        args=_args(),
        model_wrapped=torch.nn.Linear(2, 2),  # what a DDP-less CPU run leaves
        is_deepspeed_enabled=False,
        is_fsdp_enabled=False,
        accelerator=SimpleNamespace(distributed_type=DistributedType.MULTI_CPU),
    )
    with pytest.raises(
        ValueError,
        match=r"asks for DeepSpeed \(ACCELERATE_USE_DEEPSPEED=true\) but accelerate set up MULTI_CPU",
    ):
        check_engine_applied(trainer)
    with pytest.raises(ValueError, match="the prepared model is a Linear"):
        EngineCheckCallback(trainer).on_train_begin(trainer.args, None, "control")
    trainer.model_wrapped = type("DeepSpeedEngine", (torch.nn.Module,), {})()
    trainer.is_deepspeed_enabled = True
    check_engine_applied(trainer)
    assert EngineCheckCallback(trainer).on_train_begin(trainer.args, None, "control") == "control"


def _fsdp_trainer(version: int | None, model: torch.nn.Module):
    plugin = None if version is None else SimpleNamespace(fsdp_version=version)
    return SimpleNamespace(
        model=model,
        is_fsdp_enabled=plugin is not None,
        accelerator=SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin)),
    )


def test_fsdp1_cannot_wrap_a_bf16_backbone_with_fp32_adapters(env):
    """FSDP1's flat parameters need one dtype per unit: a LoRA model on a bf16 backbone stops with the fix named
    when the trainer is built (check_engine_applied), not at wrapping; FSDP2 and uniform models pass."""
    from hf_mlcl.training.launch import check_engine_applied, fsdp_dtype_problem

    mixed = torch.nn.Sequential(torch.nn.Linear(2, 2).to(torch.bfloat16), torch.nn.Linear(2, 2))
    problem = fsdp_dtype_problem(_fsdp_trainer(1, mixed))
    assert "FSDP1 (fsdp_version: 1)" in problem and "bfloat16 and float32" in problem
    assert "fsdp_version: 2 (recipes/accelerate/fsdp_llama_lora.yaml)" in problem and "\n" not in problem
    trainer = _fsdp_trainer(1, mixed)
    trainer.args = _args()
    with pytest.raises(ValueError, match="flattens each wrapped unit's parameters"):
        check_engine_applied(trainer)
    assert fsdp_dtype_problem(_fsdp_trainer(2, mixed)) is None  # FSDP2 shards each parameter on its own
    assert fsdp_dtype_problem(_fsdp_trainer(None, mixed)) is None  # no FSDP
    assert fsdp_dtype_problem(_fsdp_trainer(1, mixed.to(torch.bfloat16))) is None  # one dtype: FSDP1 wraps it


def test_shutdown_empties_the_dtensor_caches_and_skips_missing_ones(monkeypatch):
    """After an FSDP2 run torch's DTensor caches hold the device mesh and its gloo groups (the end-to-end check is
    the thread check of test_training_fsdp.py's worker). They are private torch APIs: the ones torch 2.13 has are
    found, and a cache torch does not have is skipped."""
    import sys
    import types

    import torch.distributed.tensor._collective_utils  # noqa: F401
    import torch.distributed.tensor._redistribute  # noqa: F401

    from hf_mlcl.training import distributed as D

    for module_name, path, method in D._DTENSOR_CACHES:  # torch 2.13 has every one of them
        obj = sys.modules[module_name]
        for attr in path.split(".") if path else ():
            obj = getattr(obj, attr)
        assert callable(getattr(obj, method)), (module_name, path, method)
    assert callable(torch._C._clear_DTensor_sharding_propagator_cache)

    calls = []
    fake = types.ModuleType("fake_dtensor_caches")
    fake.cached = types.SimpleNamespace(cache_clear=lambda: calls.append("cached"))
    monkeypatch.setitem(sys.modules, "fake_dtensor_caches", fake)
    monkeypatch.setattr(
        D,
        "_DTENSOR_CACHES",
        (
            ("fake_dtensor_caches", "cached", "cache_clear"),
            ("fake_dtensor_caches", "gone.deeper", "cache_clear"),  # an attribute a later torch may not have
            ("module_that_was_never_imported", "", "clear"),
        ),
    )
    monkeypatch.delattr(torch._C, "_clear_DTensor_sharding_propagator_cache")
    D._release_dtensor_caches()
    assert calls == ["cached"]


def test_a_lora_finetune_of_the_adapter_stage_one_will_save_stops_before_stage_one(
    env, tmp_path, monkeypatch
):
    """Under DeepSpeed, stage 2's LoRA fine-tune (probe: finetune, or joint) of the adapter stage 1 would save
    cannot save: the run stops in one line before stage 1 loads its data, not after stage 1 has trained."""
    from hf_mlcl.training import (
        ContrastiveTrainingArguments,
        DataArguments,
        JointTrainingArguments,
        ModelArguments,
        ProbingTrainingArguments,
        stages,
    )
    from hf_mlcl.training.preflight import InputError

    class StageOneStarted(Exception):
        pass

    def data_loads(*args, **kwargs):
        raise StageOneStarted

    monkeypatch.setattr(stages, "load_run_data", data_loads)
    env.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    data = DataArguments(dataset="synthetic")
    out = str(tmp_path)
    second_stages = {
        "probe": ProbingTrainingArguments(output_dir=f"{out}/clf", probe="finetune", report_to=[]),
        "joint": JointTrainingArguments(output_dir=f"{out}/joint", report_to=[]),
    }
    adapter = ModelArguments(model_name_or_path=f"{out}/base", use_lora=True)
    for name, second in second_stages.items():
        first = ContrastiveTrainingArguments(output_dir=f"{out}/enc", report_to=[])
        with pytest.raises(InputError, match="a LoRA fine-tune .* saved as a LoRA adapter under deepspeed"):
            stages.run_stages(adapter, data, {"contrastive": first, name: second})
        merged = ModelArguments(model_name_or_path=f"{out}/base", use_lora=True, merge_lora=True)
        with pytest.raises(StageOneStarted):  # stage 1 saves merged weights: nothing to refuse
            stages.run_stages(merged, data, {"contrastive": first, name: second})
    linear = ProbingTrainingArguments(output_dir=f"{out}/linear", probe="linear", report_to=[])
    with pytest.raises(StageOneStarted):  # a frozen probe saves no new adapter
        stages.run_stages(adapter, data, {"contrastive": first, "probe": linear})
