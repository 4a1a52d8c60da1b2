"""The sdpa backend: torch's scaled_dot_product_attention with the positional logits as a float bias."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def heads_first(v: Tensor, heads: int) -> Tensor:
    """Values (B, H, W, C) shared or (B, H, W, heads, D) -> (B, heads, T, D); shared values are expanded, not copied."""
    B, H, W = v.shape[:3]
    T = H * W
    if v.ndim == 4:
        return v.reshape(B, 1, T, v.shape[-1]).expand(B, heads, T, v.shape[-1])
    return v.reshape(B, T, heads, v.shape[-1]).transpose(1, 2)


def sdpa(v: Tensor, bias: Tensor, q: Tensor | None = None, k: Tensor | None = None, dropout_p: float = 0.0) -> Tensor:
    """torch's scaled_dot_product_attention with the positional logits as a float bias -> (B, T, heads, D).

    v (B, heads, T, D) (`heads_first`); bias (1 or B, heads, T, T), the positional logits; q, k
    (B, heads, T, D_k) for content attention, None for position-only attention. Dropout draws a
    mask per sample.
    """
    B, heads, T = v.shape[:3]
    if q is None:
        # No content term: zero-width queries and keys would be rejected, so give SDPA a single
        # zero channel; q.k = 0 and the positional logits are the whole score.
        zeros = v.new_zeros(B, heads, T, 1)
        out = F.scaled_dot_product_attention(zeros, zeros, v, attn_mask=bias.to(v.dtype), dropout_p=dropout_p)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout_p)
    return out.transpose(1, 2)
