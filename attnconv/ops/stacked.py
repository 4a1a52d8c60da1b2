"""The stacked backend (shared values): the heads' probabilities as one (T * heads, T) matrix per image."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.ops.autocast import matmul_dtype


def stacked(probs: Tensor, x: Tensor, dropout_p: float = 0.0, per_sample: bool = True) -> Tensor:
    """Shared values: x (B, H, W, C) -> (B, T * heads, C), row q * heads + h = SA_h(X)_q.

    probs: (heads, T, T) position-only (batch-independent) or (B, heads, T, T). They are laid out
    as a (T * heads, T) matrix per image, rows (q, h), so one batched matmul writes every head's
    output where the output projection reads it: no per-head copies of the values, no permutes of
    the outputs. Batch-independent probabilities are one matrix broadcast over the batch (a stride-0
    operand of bmm, not a copy); its backward sums the gradients over the batch. Per-sample
    probabilities are transposed to (B, T, heads, T) once (T * heads * T numbers per image, against
    T * heads * C for expanded values). Costs the dense FLOPs, O(B h T^2 C), in large matmuls.
    """
    B, H, W, C = x.shape
    T, heads = H * W, probs.shape[-3]
    dtype = matmul_dtype(x)
    if probs.ndim == 3:
        # cast before the batch expand: autocast would cast the expanded operand, i.e. copy it per sample
        p = probs.transpose(0, 1).reshape(T * heads, T).to(dtype)  # [(q, h), k] = P_h[q, k]
        if dropout_p > 0 and per_sample:
            p = p.expand(B, -1, -1)  # a mask per sample: the batch's copies are materialized
    else:
        p = probs.to(dtype).transpose(1, 2).reshape(B, T * heads, T)
    if dropout_p > 0:
        p = F.dropout(p, dropout_p, training=True)
    if p.ndim == 2:
        p = p.expand(B, -1, -1)
    return torch.bmm(p, x.reshape(B, T, C).to(dtype))
