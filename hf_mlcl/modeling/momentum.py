"""MoCo-style momentum (key) encoder and feature / label queue (He et al., 2020, Eq. 2 and Sec. 3.2).

The key encoder is an exponential moving average of the online encoder's TRAINABLE parameters only:
frozen tensors (a LoRA base model, a frozen backbone) and buffers are shared with the online encoder,
so a LoRA key encoder costs only the adapter and head parameters. The queue keeps K embeddings (K, D)
and their labels as a (K, L) bool matrix or, for large label spaces (MIMIC-IV ICD-10: 25,230 labels),
as padded label-index lists returned as a torch sparse COO matrix — never a K x L float matrix.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from hf_mlcl.losses.relations import nonzero_pairs

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


def _check_momentum(momentum: float) -> float:
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

    def __init__(self, online: nn.Module, momentum: float = 0.999) -> None:
        self.momentum = _check_momentum(momentum)
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
        params = state["params"]
        unknown = set(params) - set(self._names)
        missing = set(self._names) - set(params)
        if unknown or missing:
            raise ValueError(
                f"momentum state does not match this encoder: missing {sorted(missing)[:3]}, "
                f"unexpected {sorted(unknown)[:3]}"
            )
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
        momentum: float = 0.999,
        runner: Callable[[], nn.Module] | None = None,
    ) -> None:
        from .sharded import full_parameters

        self.momentum = _check_momentum(momentum)
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
        from .sharded import full_parameters

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
        params = state["params"]
        unknown = set(params) - set(self._names)
        missing = set(self._names) - set(params)
        if unknown or missing:
            raise ValueError(
                f"momentum state does not match this encoder: missing {sorted(missing)[:3]}, "
                f"unexpected {sorted(unknown)[:3]}"
            )
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


# on CPU, label spaces wider than this are queued as label rows ("auto"; EmbeddingQueue docstring)
CPU_SPARSE_LABELS = 256


class EmbeddingQueue:
    """Ring buffer of the last K key embeddings (K, D) and their labels (MoCo queue, He et al. 2020).

    Labels are kept as a (K, L) bool matrix (``label_format="bool"``) or as padded label-index rows
    (``"sparse"``; ``.labels`` then returns a torch sparse COO (n, L) bool tensor). ``"auto"`` picks
    sparse when K * L > 2**27 (128 MB), and on a CPU queue also when L > 256: the loss reads the
    queue's labels every step, and on CPU a (K, L) bool matrix costs more than the label rows from
    about 200 labels on (``benchmarks/loss_speed.py --queue-formats``, K = 4,096, mulsupcon / any, step
    time with the bool matrix over step time with the rows: 0.80-0.97 at L = 28-160, 1.03-1.07 at
    256, 1.29-1.33 at 512, 1.45-1.76 at 1,000-25,230). A state saved with the other format is adopted
    by an ``"auto"`` queue on :meth:`load_state_dict`.

    Host reads: :meth:`enqueue` and the queue's tensors read no value on the host with ``"bool"``
    labels (the pointer and fill count are Python integers); ``"sparse"`` labels need data-dependent
    shapes (the label rows' non-zeros), read at each enqueue and each ``labels`` access.
    """

    def __init__(
        self,
        size: int,
        dim: int,
        num_labels: int,
        label_format: str = "auto",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> None:
        if size <= 0 or dim <= 0 or num_labels <= 0:
            raise ValueError(
                f"size, dim and num_labels must be positive; got size={size}, dim={dim}, num_labels={num_labels}"
            )
        self._auto_format = label_format == "auto"
        if label_format == "auto":
            on_cpu = torch.device(device if device is not None else "cpu").type == "cpu"
            dense = size * num_labels <= 2**27 and not (on_cpu and num_labels > CPU_SPARSE_LABELS)
            label_format = "bool" if dense else "sparse"
        if label_format not in ("bool", "sparse"):
            raise ValueError(f"label_format must be 'auto', 'bool' or 'sparse'; got {label_format!r}")
        self.size, self.dim, self.num_labels, self.label_format = (
            int(size),
            int(dim),
            int(num_labels),
            label_format,
        )
        self._emb = torch.zeros(self.size, self.dim, dtype=dtype, device=device)
        if label_format == "bool":
            self._lab = torch.zeros(self.size, self.num_labels, dtype=torch.bool, device=device)
        else:
            self._lab = torch.full((self.size, 1), -1, dtype=torch.int32, device=device)
        self.ptr = 0
        self.n_filled = 0

    def __len__(self) -> int:
        return self.n_filled

    @property
    def device(self) -> torch.device:
        return self._emb.device

    def to(self, device: torch.device | str) -> EmbeddingQueue:
        self._emb = self._emb.to(device)
        self._lab = self._lab.to(device)
        return self

    # ------------------------------------------------------------------------------------------------
    def _label_indices(self, labels: torch.Tensor) -> torch.Tensor:
        """(B, L) dense or sparse multi-hot -> (B, M) int32 label ids padded with -1 (vectorised)."""
        batch = labels.shape[0]
        rows, cols = nonzero_pairs(labels)  # row-major: each row's ids in ascending order
        counts = torch.bincount(rows, minlength=batch)
        width = max(1, int(counts.max()) if counts.numel() else 1)
        starts = torch.cumsum(counts, 0) - counts
        slot = torch.arange(rows.numel(), device=rows.device) - starts[rows]
        out = torch.full((batch, width), -1, dtype=torch.int32, device=self.device)
        out[rows.to(self.device), slot.to(self.device)] = cols.to(self.device, torch.int32)
        return out

    @torch.no_grad()
    def enqueue(self, embeddings: torch.Tensor, labels: torch.Tensor) -> None:
        """Write a batch at the pointer, wrapping around (oldest entries are overwritten)."""
        if embeddings.dim() != 2 or embeddings.shape[1] != self.dim:
            raise ValueError(f"embeddings must be (B, {self.dim}); got {tuple(embeddings.shape)}")
        if labels.dim() != 2 or labels.shape[0] != embeddings.shape[0] or labels.shape[1] != self.num_labels:
            raise ValueError(
                f"labels must be (B, {self.num_labels}) with B={embeddings.shape[0]}; got {tuple(labels.shape)}"
            )
        batch = embeddings.shape[0]
        if batch == 0:
            return
        embeddings = embeddings.detach()
        if labels.layout not in (torch.strided, torch.sparse_coo):
            labels = labels.to_sparse_coo()  # CSR / BSR -> COO (row selection below needs it)
        if batch > self.size:  # only the newest K rows survive
            newest = torch.arange(batch - self.size, batch, device=labels.device)
            embeddings, labels = embeddings[-self.size :], labels.index_select(0, newest)
            self.ptr = (self.ptr + batch - self.size) % self.size
            batch = self.size
        index = (self.ptr + torch.arange(batch, device=self.device)) % self.size
        self._emb[index] = embeddings.to(self._emb.device, self._emb.dtype)
        if self.label_format == "bool":
            dense = labels.to_dense() if labels.layout != torch.strided else labels
            self._lab[index] = dense.to(self.device) != 0
        else:
            rows = self._label_indices(labels)
            if rows.shape[1] > self._lab.shape[1]:
                grown = torch.full((self.size, rows.shape[1]), -1, dtype=torch.int32, device=self.device)
                grown[:, : self._lab.shape[1]] = self._lab
                self._lab = grown
            elif rows.shape[1] < self._lab.shape[1]:
                pad = torch.full(
                    (batch, self._lab.shape[1] - rows.shape[1]), -1, dtype=torch.int32, device=self.device
                )
                rows = torch.cat([rows, pad], dim=1)
            self._lab[index] = rows
        self.ptr = (self.ptr + batch) % self.size
        self.n_filled = min(self.n_filled + batch, self.size)

    # ------------------------------------------------------------------------------------------------
    @property
    def embeddings(self) -> torch.Tensor:
        """(n_filled, D) queued embeddings (slot order)."""
        return self._emb[: self.n_filled]

    @property
    def labels(self) -> torch.Tensor:
        """(n_filled, L) labels: a bool tensor, or a sparse COO bool tensor for ``label_format="sparse"``."""
        if self.label_format == "bool":
            return self._lab[: self.n_filled]
        rows = self._lab[: self.n_filled]
        r, c = (rows >= 0).nonzero(as_tuple=True)
        indices = torch.stack([r, rows[r, c].long()])
        values = torch.ones(indices.shape[1], dtype=torch.bool, device=self.device)
        return torch.sparse_coo_tensor(
            indices, values, (self.n_filled, self.num_labels), check_invariants=False
        ).coalesce()

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume with the same queue contents and pointer."""
        return {
            "size": self.size,
            "dim": self.dim,
            "num_labels": self.num_labels,
            "label_format": self.label_format,
            "ptr": self.ptr,
            "n_filled": self.n_filled,
            "embeddings": self._emb.detach().cpu().clone(),
            "labels": self._lab.detach().cpu().clone(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("size", "dim", "num_labels"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"queue state has {key}={state[key]} but this queue has {getattr(self, key)}; "
                    "build the queue with the saved sizes"
                )
        if state["label_format"] != self.label_format:
            if not self._auto_format:
                raise ValueError(
                    f"queue state stores labels as {state['label_format']!r}, this queue as "
                    f"{self.label_format!r}; build it with label_format='auto' or {state['label_format']!r}"
                )
            self.label_format = state["label_format"]  # "auto": resume in the format the state was saved in
        self._emb = state["embeddings"].to(self.device, self._emb.dtype).clone()
        self._lab = state["labels"].to(self.device).clone()
        self.ptr = int(state["ptr"])
        self.n_filled = int(state["n_filled"])

    def memory_bytes(self) -> int:
        """Bytes held by the queue tensors."""
        return self._emb.numel() * self._emb.element_size() + self._lab.numel() * self._lab.element_size()

    def __repr__(self) -> str:
        return (
            f"EmbeddingQueue(size={self.size}, dim={self.dim}, num_labels={self.num_labels}, "
            f"label_format={self.label_format!r}, filled={self.n_filled}, ptr={self.ptr}, "
            f"MB={self.memory_bytes() / 2**20:.1f})"
        )


__all__ = ["MOMENTUM_ADAPTER", "AdapterMomentumEncoder", "EmbeddingQueue", "MomentumEncoder"]
