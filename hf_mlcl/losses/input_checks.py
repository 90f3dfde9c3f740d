"""When a loss checks its inputs: on every call (the default), or on the first call only (trainers, integrations).

A loss's input checks — labels 0/1, finite embeddings or logits — read values on the host, a device-to-host
synchronisation on an accelerator. :class:`FirstCallChecks` turns them on for the first batch a trainer or an
integration hands the loss and off afterwards, so later training steps read nothing on the host
(``hf_mlcl.host_sync`` counts such reads); :func:`set_input_checks` switches them for a loss and every loss
inside it (e.g. the base loss of hbl).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.nn as nn

__all__ = ["FirstCallChecks", "set_input_checks"]


def set_input_checks(module: nn.Module, enabled: bool) -> None:
    """Set ``check_inputs`` on ``module`` and on every loss inside it (e.g. the base loss of hbl).

    Trainers validate the labels once and turn the per-call checks off, so that a training step reads
    no value on the host (see :class:`ContrastiveLoss`).
    """
    for sub in module.modules():
        if hasattr(sub, "check_inputs"):
            sub.check_inputs = bool(enabled)


class FirstCallChecks:
    """A loss's input checks on the first call made through this object only (trainers, integrations).

    Construction turns ``check_inputs`` off (:func:`set_input_checks`); ``with checks(): loss(...)``
    turns it on for the block until one block has run without raising, so the first batch is
    validated (labels 0/1, finite embeddings: ValueError naming the problem) and later batches cost
    no host read. ``pending`` tells whether the next block still checks.
    """

    def __init__(self, loss: nn.Module) -> None:
        self.loss = loss
        self.pending = True
        set_input_checks(loss, False)

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if not self.pending:
            yield
            return
        set_input_checks(self.loss, True)
        try:
            yield
            self.pending = False
        finally:
            set_input_checks(self.loss, False)
