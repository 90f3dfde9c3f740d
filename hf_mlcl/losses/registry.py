"""Name -> loss-class registry behind :func:`hf_mlcl.losses.get_loss`.

Loss modules register themselves with the :func:`register_loss` decorator::

    @register_loss("similarity_dissimilarity", "sd")
    class SimilarityDissimilarityLoss(ContrastiveLoss): ...

Canonical names are what :func:`list_losses` returns; aliases are only accepted by
:func:`get_loss`. Look-ups are case-insensitive and treat ``-`` like ``_``.

:func:`build_contrastive_loss` is how a trainer or an integration builds a contrastive loss for a run:
the user's keywords plus the run's :class:`LossSettings` (temperature, label count, embedding width) that
the loss class declares it takes (``run_settings``), never guessed from its signature.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import torch.nn as nn

T = TypeVar("T", bound=type)

_REGISTRY: dict[str, type[nn.Module]] = {}
_ALIASES: dict[str, str] = {}


def _canon(name: str) -> str:
    return name.strip().lower().replace("-", "_")


def register_loss(name: str, *aliases: str) -> Callable[[T], T]:
    """Class decorator: register a loss class under ``name`` (canonical) and ``aliases``.

    Registering the same name twice with a *different* class raises ``ValueError`` (re-registering
    the same class, e.g. on module reload, is allowed).
    """

    def deco(cls: T) -> T:
        key = _canon(name)
        old = _REGISTRY.get(key)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"loss name {key!r} is already registered to {old.__qualname__}")
        _REGISTRY[key] = cls  # type: ignore[assignment]
        for alias in aliases:
            a = _canon(alias)
            if a == key:  # e.g. "ws-mulsupcon" for "ws_mulsupcon": already accepted by _canon
                continue
            if a in _REGISTRY:
                raise ValueError(f"alias {a!r} of {key!r} clashes with the canonical loss name {a!r}")
            _ALIASES[a] = key
        cls.loss_name = key  # type: ignore[attr-defined]
        return cls

    return deco


def resolve_loss_name(name: str) -> str:
    """Canonical name for ``name`` (an alias or a canonical name); ValueError listing names if unknown."""
    if not isinstance(name, str):
        raise ValueError(f"loss name must be a string, got {type(name).__name__}")
    key = _canon(name)
    key = _ALIASES.get(key, key)
    if key not in _REGISTRY:
        valid = ", ".join(list_losses())
        aliases = ", ".join(f"{a}->{c}" for a, c in sorted(_ALIASES.items()))
        raise ValueError(
            f"unknown loss {name!r}; valid names are: {valid}" + (f" (aliases: {aliases})" if aliases else "")
        )
    return key


def get_loss_class(name: str) -> type[nn.Module]:
    """The registered class for ``name`` (canonical or alias)."""
    return _REGISTRY[resolve_loss_name(name)]


def get_loss(name: str, **kwargs) -> nn.Module:
    """Instantiate the loss registered as ``name`` (canonical or alias) with ``kwargs``.

    Unknown names raise ``ValueError`` listing the valid names; missing or unknown keywords a ``ValueError``
    naming the loss and the keywords given.
    """
    cls = get_loss_class(name)
    try:  # the signature first: a TypeError from an inherited __init__ names its parent class
        inspect.signature(cls).bind(**kwargs)
    except TypeError as err:
        reason = str(err)
        try:  # the class's own message names every missing keyword where it has an __init__ of its own
            cls(**kwargs)
        except TypeError as own:
            reason = str(own) if f"{cls.__name__}.__init__()" in str(own) else reason
        raise ValueError(f"cannot build loss {name!r} with {sorted(kwargs)}: {reason}") from None
    return cls(**kwargs)


def check_loss_keywords(name: str, kwargs: Mapping[str, Any] | None, field: str = "loss_kwargs") -> None:
    """ValueError in one line when the loss registered as ``name`` takes no keyword of ``kwargs`` (``field``
    names the option), checked against its signature before any model or data is loaded."""
    cls = get_loss_class(name)
    try:
        inspect.signature(cls).bind_partial(**dict(kwargs or {}))
    except TypeError as err:
        raise ValueError(f"{field}: cannot build loss {name!r} with {sorted(kwargs or {})}: {err}") from None


def list_losses() -> list[str]:
    """Sorted canonical names of all registered losses (aliases excluded)."""
    return sorted(_REGISTRY)


@dataclass(frozen=True)
class LossSettings:
    """What a run knows that a contrastive loss may need: the temperature asked for (None: the loss paper's
    value), the size of the label space (msc's prototypes) and the width of the embeddings. A loss class
    names the ones it takes in ``run_settings``."""

    temperature: float | None = None
    num_labels: int | None = None
    embedding_dim: int | None = None

    def for_loss(self, cls: type, kwargs: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``kwargs`` plus the settings ``cls.run_settings`` names that are set and that ``kwargs`` does not
        give (the user's keywords win)."""
        out = dict(kwargs or {})
        for name in getattr(cls, "run_settings", ()):
            value = getattr(self, name)
            if value is not None:
                out.setdefault(name, value)
        return out


def build_contrastive_loss(
    name: str,
    loss_kwargs: Mapping[str, Any] | None = None,
    temperature: float | None = None,
    num_labels: int | None = None,
    embedding_dim: int | None = None,
) -> nn.Module:
    """The contrastive loss registered as ``name`` with ``loss_kwargs`` and the run's settings it declares
    (:class:`LossSettings`). ValueError for unknown or non-contrastive names and for keywords the loss
    does not take."""
    cls = check_contrastive_loss(name)
    kwargs = LossSettings(temperature, num_labels, embedding_dim).for_loss(cls, loss_kwargs)
    try:
        return cls(**kwargs)
    except TypeError as err:
        raise ValueError(f"cannot build loss {name!r} with keywords {sorted(kwargs)}: {err}") from err


def supervised_loss(
    name: str,
    loss_kwargs: Mapping[str, Any] | None = None,
    given: nn.Module | None = None,
    role: str = "loss_fn",
) -> nn.Module:
    """``given``, or the supervised loss registered as ``name`` with ``loss_kwargs``; ValueError in one line for
    keywords it does not take, a contrastive loss, or ``reduction="none"`` (a trainer backpropagates one
    number; ``role`` names the argument in the message)."""
    if given is None:
        kwargs = dict(loss_kwargs or {})
        try:
            given = get_loss(name, **kwargs)
        except TypeError as err:
            raise ValueError(f"cannot build supervised loss {name!r} with {sorted(kwargs)}: {err}") from err
    _require_supervised(given, f"{role} {type(given).__name__}", "a classifier's head trains")
    if getattr(given, "reduction", None) == "none":
        raise ValueError(
            f"{role} {type(given).__name__} has reduction='none' (one loss per entry); training backpropagates "
            "one number: use reduction 'mean' or 'sum'"
        )
    return given


_PROBE_INSTEAD = "use ProbingTrainer / train_probe for bce/focal/asymmetric/zlpr"


def check_contrastive_loss(name: str, instead: str = _PROBE_INSTEAD) -> type:
    """The class of the contrastive loss ``name``; ValueError in one line for an unknown or a supervised loss,
    ending with ``instead`` (where a supervised loss belongs)."""
    try:
        cls = get_loss_class(name)
    except ValueError as err:
        contrastive = list_contrastive_losses()
        aliases = ", ".join(f"{a}->{c}" for a, c in sorted(_ALIASES.items()) if c in contrastive)
        raise ValueError(
            f"unknown loss {name!r} for the contrastive term; the contrastive losses are: {', '.join(contrastive)}"
            + (f" (aliases: {aliases})" if aliases else "")
        ) from err
    if not getattr(cls, "is_contrastive", False):
        raise ValueError(
            f"loss {name!r} is a supervised loss (logits vs labels); the contrastive term needs a contrastive "
            f"loss such as 'sd', 'mulsupcon', 'msc' — {instead}"
        )
    return cls


def check_supervised_loss(
    name: str, field: str = "probing loss", trains: str = "the probe trains its head"
) -> str:
    """The canonical name of the supervised loss ``name`` (an alias too, e.g. ``"asl"``); ValueError in one line
    for an unknown or a contrastive loss, naming ``field`` and what ``trains`` with it. The registry alone
    answers whether a loss is supervised."""
    try:
        cls = get_loss_class(name)
    except ValueError as err:
        raise ValueError(f"unknown {field} {name!r}; choose one of {list_supervised_losses()}") from err
    _require_supervised(cls, repr(name), trains)
    return cls.loss_name


def check_joint_losses(loss: str, supervised_loss: str) -> str:
    """The joint objective's two losses: ``loss`` names its contrastive term, ``supervised_loss`` its head's loss.
    Returns the supervised loss's canonical name; ValueError in one line naming the field of the wrong kind."""
    check_contrastive_loss(
        loss, instead="the joint objective's head loss is supervised_loss (loss names the contrastive term)"
    )
    return check_supervised_loss(supervised_loss, "supervised_loss", "the joint objective trains its head")


def _require_supervised(loss: Any, what: str, trains: str) -> None:
    """ValueError in one line when ``loss`` (a loss or its class, named ``what`` in the message) is contrastive:
    ``trains`` (e.g. "the probe trains its head") with a supervised loss."""
    if getattr(loss, "is_contrastive", False):
        raise ValueError(
            f"{what} is a contrastive loss; {trains} with a supervised loss: one of {list_supervised_losses()}"
        )


def list_supervised_losses() -> list[str]:
    """Sorted canonical names of the registered supervised losses (``is_contrastive = False``)."""
    return [n for n in list_losses() if not getattr(_REGISTRY[n], "is_contrastive", False)]


def list_contrastive_losses() -> list[str]:
    """Sorted canonical names of the registered losses with ``is_contrastive = True``."""
    return [n for n in list_losses() if getattr(_REGISTRY[n], "is_contrastive", False)]
