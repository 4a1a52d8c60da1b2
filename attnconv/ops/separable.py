"""The separable backend: P_h = P_h^row (x) P_h^col applied as two small products, never the T x T matrix."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.ops.autocast import matmul_dtype


def separable(row: Tensor, col: Tensor, v: Tensor, dropout_p: float = 0.0, per_sample: bool = True) -> Tensor:
    """P_h = P_h^row (x) P_h^col applied as two small matmuls -> (B, H, W, heads, D).

    row (heads, H, H) and col (heads, W, W) are the factors' probabilities. Costs
    O(B h H W (H + W) D) instead of O(B h (HW)^2 D); the T x T matrix is never formed.
    """
    dtype = matmul_dtype(v)
    row, col = factor_dropout(row.to(dtype), col.to(dtype), v.shape[0], dropout_p, per_sample)
    if v.ndim == 4:
        return apply_factors_shared(row, col, v.to(dtype))
    if row.ndim == 4:
        tmp = torch.einsum("bhjl,bilhd->bhijd", col, v)
        return torch.einsum("bhik,bhkjd->bijhd", row, tmp)
    tmp = torch.einsum("hjl,bilhd->hbijd", col, v)  # (heads, B, H, W, D): mix columns
    return torch.einsum("hik,hbkjd->bijhd", row, tmp)  # (B, H, W, heads, D): mix rows


def factor_dropout(row: Tensor, col: Tensor, B: int, dropout_p: float, per_sample: bool) -> tuple[Tensor, Tensor]:
    """Factorized dropout: each factor drops entries with rate r, 1 - (1 - r)^2 = p, so an entry of
    P = P^row (x) P^col survives with probability 1 - p and keeps its expectation as in the dense
    path (the masks of one row/column are correlated, unlike dense dropout). `per_sample`: factors
    (B, heads, n, n), a mask per sample; else one mask per factor for the batch."""
    if dropout_p <= 0:
        return row, col
    r = 1.0 - math.sqrt(1.0 - dropout_p)
    if per_sample:
        row, col = row.expand(B, -1, -1, -1), col.expand(B, -1, -1, -1)  # (B, heads, H, H), (B, heads, W, W)
    return F.dropout(row, r, training=True), F.dropout(col, r, training=True)


def apply_factors_shared(row: Tensor, col: Tensor, x: Tensor) -> Tensor:
    """Shared values: factors row ([B,] heads, H, H), col ([B,] heads, W, W) on x (B, H, W, C) -> (B, H, W, heads, C).

    Rows first with the heads stacked into the matrix, (heads * H, H) @ (H, W * C) per image, which
    reads x in place and writes (B, heads, H, W, C); then every (image, head, row) is a (W, W) @ (W, C)
    product. One permute of the result remains (to the output projection's layout), where two
    einsums need three.
    """
    B, H, W, C = x.shape
    heads = row.shape[-3]
    rows = row.reshape(-1, heads * H, H).expand(B, -1, -1)  # batch-independent: a stride-0 broadcast
    tmp = torch.bmm(rows, x.reshape(B, H, W * C))  # (B, heads * H, W * C): (b, h, i, l, c)
    cols = col.reshape(-1, heads, 1, W, W).expand(B, heads, H, W, W).reshape(B * heads * H, W, W)
    out = torch.bmm(cols, tmp.view(B * heads * H, W, C))  # (b, h, i, j, c)
    return out.view(B, heads, H, W, C).permute(0, 2, 3, 1, 4)
