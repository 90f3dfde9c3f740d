"""The MoCo key encoder: an exponential moving average of the online encoder (He et al., 2020, Eq. 2).

The key encoder averages the online encoder's TRAINABLE parameters only: frozen tensors (a LoRA base
model, a frozen backbone) and buffers are shared with the online encoder, so a LoRA key encoder costs
only the adapter and head parameters. :class:`MomentumEncoder` is a separate module tree sharing the
frozen base; under DeepSpeed ZeRO-3 / FSDP the key weights are a second LoRA adapter of the sharded model
(:class:`AdapterMomentumEncoder`). :func:`build_key_encoder` picks the one a run needs. The queue they fill
and the contrast set they feed: :mod:`hf_mlcl.training.memory`.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

__all__ = [
    "MOCO_MOMENTUM",
    "MOMENTUM_ADAPTER",
    "AdapterMomentumEncoder",
    "MomentumEncoder",
    "UpdateAfterOptimizerSteps",
    "build_key_encoder",
    "check_momentum",
]

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def _unwrap(module: nn.Module) -> nn.Module:
    """Strip DDP / accelerate wrappers (``.module``) so parameter names match."""
    while isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        module = module.module
    return module


def _ema_(targets: list[torch.Tensor], sources: list[torch.Tensor], momentum: float) -> None:
    """targets <- m * targets + (1 - m) * sources, in place (MoCo, He et al. 2020, Eq. 2)."""
    torch._foreach_mul_(targets, momentum)
    torch._foreach_add_(targets, sources, alpha=1.0 - momentum)


MOCO_MOMENTUM = 0.999  # He et al. 2020's m, every momentum encoder's default


def check_momentum(momentum: float) -> float:
    """``momentum`` as a float; ValueError unless it lies in [0, 1)."""
    if not 0.0 <= float(momentum) < 1.0:
        raise ValueError(f"momentum must be in [0, 1) (MoCo uses 0.999); got {momentum}")
    return float(momentum)


class MomentumEncoder:
    """Key encoder theta_k <- m * theta_k + (1 - m) * theta_q (MoCo, He et al. 2020, Eq. 2).

    Built from the online encoder by a ``deepcopy`` in which every frozen parameter and every buffer
    maps to itself: those tensors are shared (same storage), only trainable parameters are copied.
    Copies are detached (``requires_grad=False``); for fp16 / bf16 parameters an fp32 master copy
    keeps the EMA exact (``1 - m = 0.001`` is below bf16 resolution).

    Call ``update(online)`` once per optimizer step (not per micro-batch). Calling the object runs
    the key encoder in eval mode under ``torch.no_grad`` and returns what ``online`` returns.
    """

    def __init__(self, online: nn.Module, momentum: float = MOCO_MOMENTUM) -> None:
        self.momentum = check_momentum(momentum)
        online = _unwrap(online)
        memo: dict[int, Any] = {}
        for param in online.parameters():
            if not param.requires_grad:
                memo[id(param)] = param
        for buffer in online.buffers():
            memo[id(buffer)] = buffer
        self.module: nn.Module = copy.deepcopy(online, memo)
        self.module.eval()
        self._names: list[str] = [n for n, p in online.named_parameters() if p.requires_grad]
        key_params = dict(self.module.named_parameters())
        missing = [n for n in self._names if n not in key_params]
        if missing:
            raise ValueError(
                f"key encoder lacks trainable parameters {missing[:3]} ...; cannot build the EMA copy"
            )
        self._key: dict[str, torch.Tensor] = {}
        self._master: dict[str, torch.Tensor] = {}
        for name in self._names:
            param = key_params[name]
            param.requires_grad_(False)
            self._key[name] = param
            if param.dtype in _LOW_PRECISION:
                self._master[name] = param.detach().float().clone()

    # ------------------------------------------------------------------------------------------------
    @property
    def trainable_names(self) -> list[str]:
        """Names of the parameters that are averaged (the online encoder's trainable ones)."""
        return list(self._names)

    def averaged_tensors(self) -> list[torch.Tensor]:
        """The averaged parameters of the key encoder and their fp32 masters, in a fixed order: what makes two
        key encoders of one online model equal."""
        return [self._key[n] for n in self._names] + [
            self._master[n] for n in self._names if n in self._master
        ]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with torch.no_grad():
            return self.module(*args, **kwargs)

    @torch.no_grad()
    def update(self, online: nn.Module) -> None:
        """EMA step: key = m * key + (1 - m) * online, over the trainable parameters."""
        online_params = dict(_unwrap(online).named_parameters())
        try:
            sources = [online_params[name].detach() for name in self._names]
        except KeyError as err:
            raise ValueError(
                f"online encoder has no parameter {err}; pass the same model the EMA was built from"
            ) from err
        fp32_targets, fp32_sources, low_names, low_sources = [], [], [], []
        for name, src in zip(self._names, sources):
            if name in self._master:
                low_names.append(name)
                low_sources.append(src.float())
            else:
                fp32_targets.append(self._key[name])
                fp32_sources.append(src.to(self._key[name].dtype))
        if fp32_targets:
            _ema_(fp32_targets, fp32_sources, self.momentum)
        if low_names:
            masters = [self._master[n] for n in low_names]
            _ema_(masters, low_sources, self.momentum)
            for name, master in zip(low_names, masters):
                self._key[name].copy_(master)

    def to(self, *args: Any, **kwargs: Any) -> MomentumEncoder:
        """Move the key encoder (shared frozen tensors follow the online model anyway)."""
        self.module.to(*args, **kwargs)
        for name in self._master:
            device = self._key[name].device
            self._master[name] = self._master[name].to(device)
        names = set(self._names)
        self._key = {n: p for n, p in self.module.named_parameters() if n in names}
        return self

    def train(self, mode: bool = False) -> MomentumEncoder:
        """Set the key encoder's mode (eval by default: deterministic keys, no dropout)."""
        self.module.train(mode)
        return self

    def eval(self) -> MomentumEncoder:
        return self.train(False)

    # ------------------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Only the averaged (trainable) tensors, fp32 masters where kept, and ``momentum``."""
        params = {n: (self._master.get(n, self._key[n])).detach().clone() for n in self._names}
        return {"momentum": self.momentum, "params": params}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        params = _matching_params(state, self._names)
        self.momentum = float(state.get("momentum", self.momentum))
        for name, value in params.items():
            if name in self._master:
                self._master[name].copy_(value)
            self._key[name].copy_(value)


MOMENTUM_ADAPTER = "momentum"


class AdapterMomentumEncoder:
    """The MoCo key encoder of a LoRA model as a second adapter of the same model (for DeepSpeed / FSDP).

    :class:`MomentumEncoder` runs the key encoder as a separate module tree that shares the frozen base.
    Under DeepSpeed ZeRO-3 or FSDP the base is sharded and only the training engine's own module tree
    can gather it, so here the key weights are a second PEFT adapter (``"momentum"``: LoRA matrices and
    copies of the ``modules_to_save`` heads) added to the ``PeftModel`` before the engine wraps it. It is
    sharded like every other parameter and never trained (``requires_grad=False``); the frozen base is
    not copied. Keys are computed by the prepared model itself with the momentum adapter active, in eval
    mode and without gradient.

    The EMA (MoCo, He et al. 2020, Eq. 2) runs on fp32 master copies of the averaged tensors, kept whole
    on every process (one copy of the trainable parameters: cheap for LoRA); :meth:`update` gathers the
    online adapter, updates the masters and writes them into the momentum adapter
    (:func:`hf_mlcl.modeling.sharded.full_parameters`). Every process must call :meth:`update`,
    :meth:`__call__` and :meth:`load_state_dict` together. :meth:`state_dict` needs no communication and
    has the format of :class:`MomentumEncoder` (tensors keyed by the online parameters' names), so a
    checkpoint resumes under either.

    ``runner`` returns the model as prepared for training (the DeepSpeedEngine / FSDP root), which the
    key forward and the gathers go through; by default the ``PeftModel`` itself.
    """

    def __init__(
        self,
        online: nn.Module,
        momentum: float = MOCO_MOMENTUM,
        runner: Callable[[], nn.Module] | None = None,
    ) -> None:
        from hf_mlcl.modeling.sharded import full_parameters

        self.momentum = check_momentum(momentum)
        peft_model = _unwrap(online)
        if not hasattr(peft_model, "peft_config"):
            raise ValueError(
                f"AdapterMomentumEncoder needs the PeftModel of apply_lora; got {type(peft_model).__name__}"
            )
        self._peft = peft_model
        self._runner = runner or (lambda: self._peft)
        self.adapter = peft_model.active_adapter
        trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
        if MOMENTUM_ADAPTER not in peft_model.peft_config:
            peft_model.add_adapter(MOMENTUM_ADAPTER, copy.deepcopy(peft_model.peft_config[self.adapter]))
        for name, param in peft_model.named_parameters():
            if _adapter_of(name, (MOMENTUM_ADAPTER,)):
                param.requires_grad_(False)
        still = [n for n, p in peft_model.named_parameters() if p.requires_grad]
        if still != trainable:
            raise ValueError(
                f"adding the momentum adapter changed the trainable parameters ({len(trainable)} -> {len(still)})"
            )
        self._names = trainable
        self._key_names = {name: self._key_name(name) for name in trainable}
        self._layers = _adapter_layers(peft_model)
        with full_parameters(peft_model, [*trainable, *self._key_names.values()], writeback=True) as full:
            self._master = {n: full[n].detach().float().clone() for n in trainable}
            for name in trainable:
                full[self._key_names[name]].copy_(full[name])

    def _key_name(self, name: str) -> str:
        parts = name.split(".")
        if parts.count(self.adapter) != 1:
            raise ValueError(
                f"trainable parameter {name} is not a parameter of adapter {self.adapter!r}: only LoRA adapters and "
                "modules_to_save heads can be averaged into the momentum adapter"
            )
        return ".".join(MOMENTUM_ADAPTER if part == self.adapter else part for part in parts)

    @property
    def trainable_names(self) -> list[str]:
        """Names of the parameters that are averaged (the online encoder's trainable ones)."""
        return list(self._names)

    @contextmanager
    def hidden_from_saves(self) -> Iterator[None]:
        """The momentum adapter left out of ``PeftModel.save_pretrained`` (which saves every configured
        adapter): Trainer checkpoints hold the trained adapter only; the momentum weights are restored from
        :meth:`state_dict` (under ZeRO-3 the Trainer gathers trainable parameters only, so they would be
        missing anyway)."""
        config = self._peft.peft_config.pop(MOMENTUM_ADAPTER)
        try:
            yield
        finally:
            self._peft.peft_config[MOMENTUM_ADAPTER] = config

    @contextmanager
    def _keys_active(self) -> Iterator[None]:
        """The momentum adapter active in every adapter layer and head (no change to ``requires_grad``)."""
        before = [layer._active_adapter for layer in self._layers]
        for layer, active in zip(self._layers, before):
            layer._active_adapter = MOMENTUM_ADAPTER if isinstance(active, str) else [MOMENTUM_ADAPTER]
        try:
            yield
        finally:
            for layer, active in zip(self._layers, before):
                layer._active_adapter = active

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """The key encoder's output: the prepared model with the momentum adapter, eval mode, no gradient."""
        model = self._runner()
        was_training = model.training
        model.train(False)
        try:
            with torch.no_grad(), self._keys_active():
                return model(*args, **kwargs)
        finally:
            model.train(was_training)

    def _write_masters(self, model: nn.Module, ema: bool) -> None:
        """Write the masters into the momentum adapter; with ``ema`` first average the online adapter in."""
        from hf_mlcl.modeling.sharded import full_parameters

        names = [*self._key_names.values(), *(self._names if ema else ())]
        with torch.no_grad(), full_parameters(model, names, writeback=True) as full:
            if ema:
                masters = [self._master[n] for n in self._names]
                _ema_(masters, [full[n].float() for n in self._names], self.momentum)
            for name in self._names:
                full[self._key_names[name]].copy_(self._master[name])

    @torch.no_grad()
    def update(self, online: nn.Module | None = None) -> None:
        """EMA step: key = m * key + (1 - m) * online, over the trainable parameters. ``online``: the
        prepared model (default: ``runner()``); every process must call this together."""
        self._write_masters(online if online is not None else self._runner(), ema=True)

    def to(self, *args: Any, **kwargs: Any) -> AdapterMomentumEncoder:
        """Move the fp32 masters (the adapter itself moves with the model)."""
        device = next((a for a in args if isinstance(a, (str, torch.device))), kwargs.get("device"))
        if device is not None:
            self._master = {n: t.to(device) for n, t in self._master.items()}
        return self

    def state_dict(self) -> dict[str, Any]:
        """The fp32 masters keyed by the online parameters' names, and ``momentum``."""
        return {"momentum": self.momentum, "params": {n: t.detach().clone() for n, t in self._master.items()}}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the masters and write them into the momentum adapter (every process together)."""
        params = _matching_params(state, self._names)
        self.momentum = float(state.get("momentum", self.momentum))
        for name, value in params.items():
            self._master[name].copy_(value)
        self._write_masters(self._runner(), ema=False)


def _adapter_of(name: str, adapters: tuple[str, ...]) -> bool:
    return any(part in adapters for part in name.split("."))


def _adapter_layers(model: nn.Module) -> list[nn.Module]:
    """The modules whose active adapter decides the forward: PEFT tuner layers and ``modules_to_save``
    wrappers."""
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils.other import AuxiliaryTrainingWrapper

    return [m for m in model.modules() if isinstance(m, (BaseTunerLayer, AuxiliaryTrainingWrapper))]


def _matching_params(state: Mapping[str, Any], names: list[str]) -> Mapping[str, torch.Tensor]:
    """The averaged tensors of a saved momentum state; ValueError when they are not those of this encoder."""
    params = state["params"]
    unknown, missing = set(params) - set(names), set(names) - set(params)
    if unknown or missing:
        raise ValueError(
            f"momentum state does not match this encoder: missing {sorted(missing)[:3]}, unexpected {sorted(unknown)[:3]}"
        )
    return params


def build_key_encoder(
    model: nn.Module, momentum: float, sharded: bool, runner: Callable[[], nn.Module], queue_size: int
) -> Any:
    """The key encoder of a run: a copy sharing the frozen base (:class:`MomentumEncoder`), or when DeepSpeed /
    FSDP shard the model (``sharded``) a second LoRA adapter inside it (:class:`AdapterMomentumEncoder`,
    whose forward and gathers go through ``runner()``, the prepared model). ValueError for a sharded model
    that is not a LoRA model."""
    if not sharded:
        return MomentumEncoder(model, momentum=momentum)
    if not hasattr(_unwrap(model), "peft_config"):
        raise ValueError(
            f"queue_size={queue_size} under DeepSpeed / FSDP needs a LoRA model (use_lora: true): the momentum "
            "encoder is then a second adapter inside the sharded model; for full fine-tuning with a queue launch "
            "DDP (recipes/accelerate/multi_gpu.yaml) or set queue_size 0"
        )
    return AdapterMomentumEncoder(model, momentum=momentum, runner=runner)


class UpdateAfterOptimizerSteps:
    """The EMA step of a key encoder (MoCo, He et al. 2020, Eq. 2) after every optimizer step that trains the
    online encoder, for training loops that do not call ``update`` themselves (the sentence-transformers
    loss: its trainer knows nothing of a key encoder).

    A global optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``) calls
    ``key_encoder.update(online())`` after the step of any ``torch.optim.Optimizer`` that holds one of the
    online encoder's trainable parameters, once per optimizer step whatever the gradient accumulation (as
    ``ContrastiveTrainer``'s ``on_optimizer_step``). Wrappers that step an inner optimizer (accelerate's
    ``AcceleratedOptimizer``) are skipped: the inner step calls the hook. A step that the fp16 loss
    scaler skips (inf / NaN gradients) does not reach the optimizer, so the key encoder does not move
    either. An optimizer that is not a ``torch.optim.Optimizer`` (DeepSpeed's ZeRO optimizers) calls no
    hook: call :meth:`update` yourself there. The hook is removed when this object is garbage-collected.

    Args:
        key_encoder: has ``update(online)`` (:class:`MomentumEncoder`).
        online: returns the online encoder (a callable: a trainer may swap in a wrapped model).
    """

    def __init__(self, key_encoder: Any, online: Callable[[], nn.Module]) -> None:
        self.key_encoder = key_encoder
        self.online = online
        self.steps = 0
        self._holds: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        this = weakref.ref(self)

        def after_step(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            owner = this()
            if owner is not None:
                owner._after_step(optimizer)

        handle = register_optimizer_step_post_hook(after_step)
        weakref.finalize(self, handle.remove)

    def _trains_online(self, optimizer: torch.optim.Optimizer) -> bool:
        """Whether ``optimizer`` holds one of the online encoder's trainable parameters (decided once)."""
        known = self._holds.get(optimizer)
        if known is None:
            inner = getattr(optimizer, "optimizer", None)
            if isinstance(
                inner, torch.optim.Optimizer
            ):  # a wrapper: its inner optimizer's step calls the hook
                known = False
            else:
                ours = {id(p) for p in _unwrap(self.online()).parameters() if p.requires_grad}
                known = any(id(p) in ours for group in optimizer.param_groups for p in group["params"])
            self._holds[optimizer] = known
        return known

    def _after_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._trains_online(optimizer):
            self.update()

    def update(self) -> None:
        """One EMA step of the key encoder towards the online encoder."""
        self.key_encoder.update(self.online())
        self.steps += 1
