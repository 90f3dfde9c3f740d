"""Building blocks of the hf_mlcl models: pooling of token states and the heads (projection, label attention).

Copied beside the weights with ``modeling_mlcl.py`` (Hub remote code, ``trust_remote_code=True``): it
imports only the standard library and ``torch``, never ``hf_mlcl``.

References: Khosla et al., 2020, "Supervised Contrastive Learning" (the two-layer projection head);
Huang et al., 2022, "PLM-ICD" (segment pooling, label-wise attention); Vu et al., 2020 (LAAT).
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = [
    "LabelAttentionHead",
    "ProjectionHead",
    "last_token_index",
    "masked_mean",
    "pool_states",
    "unpack_rows",
]


def masked_mean(states: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``states`` (B, N, H) over the positions where ``mask`` (B, N) is 1."""
    weights = mask.to(states.dtype).unsqueeze(-1)
    return (states * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def last_token_index(mask: torch.Tensor) -> torch.Tensor:
    """Index of the last non-pad position per row of ``mask`` (B, N); works for left and right padding."""
    positions = torch.arange(1, mask.shape[-1] + 1, device=mask.device)
    return ((positions * mask.long()).argmax(-1)).long()


def unpack_rows(
    states: torch.Tensor, position_ids: torch.Tensor, cu_seq_lens: torch.Tensor, max_seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token states of rows packed into one (1, T, H) back as right-padded (B, max_seq_len, H) states and
    their mask (B, max_seq_len): a row starts where ``position_ids`` (1, T) is 0, B is ``cu_seq_lens``'s
    length less one. Reads no tensor value on the host; gradients flow back to the packed states."""
    flat = states.reshape(-1, states.shape[-1])
    positions = position_ids.reshape(-1)
    row = (positions == 0).long().cumsum(0) - 1
    rows = cu_seq_lens.shape[0] - 1
    padded = flat.new_zeros(rows, max_seq_len, flat.shape[-1]).index_put((row, positions), flat)
    lengths = (cu_seq_lens[1:] - cu_seq_lens[:-1]).long()
    mask = (torch.arange(max_seq_len, device=states.device)[None, :] < lengths[:, None]).long()
    return padded, mask


def pool_states(
    states: torch.Tensor, mask: torch.Tensor | None, pooling: str, segment_length: int | None = None
) -> torch.Tensor:
    """Pool token states (B, N, H) with the attention mask (B, N); None: every position is a real token.

    ``cls``: first real token (with ``segment_length``: mean of the first token of every non-empty segment);
    ``mean``: masked mean over all real tokens; ``last_token``: the last real token.
    """
    if mask is None and segment_length is None:  # no padding: plain reductions, no mask arithmetic
        if pooling == "mean":
            return states.mean(1)
        if pooling == "last_token":
            return states[:, -1]
        if pooling == "cls":
            return states[:, 0]
    if mask is None:
        mask = torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
    if pooling == "mean":
        return masked_mean(states, mask)
    if pooling == "last_token":
        idx = last_token_index(mask)
        return states[torch.arange(states.shape[0], device=states.device), idx]
    if pooling == "cls":
        if segment_length is None:  # the first real token: position 0 under right padding, later under left
            first = mask.long().argmax(-1)
            return states[torch.arange(states.shape[0], device=states.device), first]
        batch, length, hidden = states.shape
        seg = states.view(batch, length // segment_length, segment_length, hidden)[:, :, 0]
        seg_mask = mask.view(batch, length // segment_length, segment_length).any(-1)
        return masked_mean(seg, seg_mask)
    raise ValueError(f"unknown pooling {pooling!r}; choose one of ('cls', 'mean', 'last_token')")


class ProjectionHead(nn.Module):
    """Two linear layers with a ReLU between them (Khosla et al., 2020, Sec. 3: z = W2 ReLU(W1 r))."""

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int) -> None:
        super().__init__()
        self.dense = nn.Linear(in_dim, hidden_dim)
        self.activation = nn.ReLU()
        self.out_proj = nn.Linear(hidden_dim, out_dim)

    def forward(self, pooled: torch.Tensor) -> torch.Tensor:
        return self.out_proj(self.activation(self.dense(pooled)))


class LabelAttentionHead(nn.Module):
    """PLM-ICD label-wise attention (Huang et al., 2022, Eq. 2-4; Vu et al., 2020 LAAT).

    Z = tanh(H W1) (B, N, d_a); A = softmax over tokens of (Z W2)^T with padding masked (B, L, N);
    V = A H (B, L, hidden); logit_k = w3_k . V_k + b_k.
    """

    def __init__(self, hidden_size: int, attention_dim: int, num_labels: int) -> None:
        super().__init__()
        self.first_linear = nn.Linear(hidden_size, attention_dim, bias=False)
        self.second_linear = nn.Linear(attention_dim, num_labels, bias=False)
        self.third_linear = nn.Linear(hidden_size, num_labels)

    def forward(self, states: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        """Label logits (B, L) from token states (B, N, H) and their mask (B, N; None: no padding)."""
        z = torch.tanh(self.first_linear(states))  # (B, N, d_a)
        scores = self.second_linear(z).transpose(1, 2)  # (B, L, N)
        if mask is not None:
            scores = scores.masked_fill(~mask.bool().unsqueeze(1), torch.finfo(scores.dtype).min)
        attention = torch.softmax(scores, dim=-1)
        label_states = attention @ states  # (B, L, hidden)
        return torch.einsum("blh,lh->bl", label_states, self.third_linear.weight) + self.third_linear.bias
