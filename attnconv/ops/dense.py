"""The dense backend: the plain formulation (Eq. 1-3), probabilities (1 or B, heads, T, T) times the values."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def dense(probs: Tensor, v: Tensor, dropout_p: float = 0.0, per_sample: bool = True) -> Tensor:
    """The plain formulation (Eq. 1-3): probs (1 or B, heads, T, T) times the values -> (B, T, heads, D)."""
    B, T = v.shape[0], probs.shape[-1]
    probs = probs.to(v.dtype)
    if dropout_p > 0:
        if per_sample:
            probs = probs.expand(B, -1, -1, -1)
        probs = F.dropout(probs, dropout_p, training=True)  # (B, heads, T, T), or (1, ...) for a shared mask
    if v.ndim == 4:
        v = v.reshape(B, 1, T, v.shape[-1])  # every head sees the same values
    else:
        v = v.reshape(B, T, v.shape[-2], v.shape[-1]).transpose(1, 2)  # (B, heads, T, D)
    out = probs @ v  # (B, heads, T, D)
    return out.transpose(1, 2)
