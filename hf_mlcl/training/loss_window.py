"""The logging window of contrastive training (:class:`LossWindow`): each loss part summed on the device over
the micro-batches since the last log (averaged over the processes when it is read), and the count of
non-finite training losses, read on the host only at a logging step or a checkpoint.
"""

from __future__ import annotations

import torch

from . import distributed as D

__all__ = ["LossWindow", "sum_dtype"]


def sum_dtype(device: torch.device) -> torch.dtype:
    """float64 for the on-device sums of logged values (float32 where the device has no float64: mps)."""
    return torch.float32 if device.type == "mps" else torch.float64


class LossWindow:
    """The loss parts of the micro-batches since the last log, summed on the device (float64: the values
    Python floats summed in the same order would give), and the count of non-finite training losses."""

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.count = 0
        self.nonfinite: torch.Tensor | None = None
        self.device: torch.device | None = None  # the losses' device (where the collective's tensor lives)

    def add(self, parts: dict[str, torch.Tensor]) -> None:
        self.device = parts["loss"].device
        for name, value in parts.items():
            if name != "loss":
                value = value.detach().to(sum_dtype(value.device))
                total = self.sums.get(name)
                self.sums[name] = value if total is None else total + value
        self.count += 1
        with torch.no_grad():
            loss = parts["loss"]
            bad = torch.ne(
                loss - loss, 0
            ).long()  # x - x is NaN exactly for NaN and +-inf (fewer ops than isfinite)
        self.nonfinite = bad if self.nonfinite is None else self.nonfinite + bad

    def averages(self) -> dict[str, float]:
        """``loss_<name>``: each part's window average over the micro-batches (a micro-batch without the part,
        e.g. one without an anchor that has a positive, adds 0) and over the processes, read on the host; the
        window restarts. Under several processes every one must call it at the same step, as Trainer's logging
        does: they agree on the parts' names (a process may lack one), then average them in one collective."""
        names = sorted(self.sums)
        if D.is_distributed():
            names = sorted({name for seen in D.all_gather_object(names) for name in seen})
        out = {}
        if self.count and names:
            zero = torch.zeros((), dtype=sum_dtype(self.device), device=self.device)
            sums = torch.stack([self.sums.get(name, zero) for name in names])
            D.all_reduce_mean_([sums])
            out = {f"loss_{name}": value / self.count for name, value in zip(names, sums.tolist())}
        self.sums, self.count = {}, 0
        return out

    def raise_if_not_finite(self) -> None:
        """ValueError when a training loss since the last check was NaN or inf (one host read)."""
        if self.nonfinite is None:
            return
        bad, self.nonfinite = int(self.nonfinite), None
        if bad:
            raise ValueError(
                f"the contrastive loss was NaN or inf in {bad} training micro-batch(es) since the last logging "
                "step or checkpoint: the embeddings contain NaN or inf values; check the encoder output (learning "
                "rate, fp16 overflow). Training stops here, before a checkpoint of these weights is written."
            )
