"""Attention scores from tensors: the quadratic (Lemma 2), learned relative and content terms, and their softmax.

Tokens are pixels in row-major order; the shift from query q to key k is delta = k - q. A score
that is a sum of per-axis terms is kept as its factors (one (G, n_q, n_k) tensor per axis): the
softmax over a box-shaped grid of such a score is the outer product of the per-axis softmaxes,
which is what the separable and fused paths and Theorem 1's construction apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor


def relative_offsets(n: int, device=None, dtype=torch.float32) -> Tensor:
    """(n, n) tensor with [q, k] = k - q along one axis."""
    r = torch.arange(n, device=device, dtype=dtype)
    return r[None, :] - r[:, None]


def quadratic_axis_scores(delta: Tensor, centers: Tensor, weight: Tensor | float) -> Tensor:
    """One axis of Lemma 2's isotropic or axis-aligned score: -w_g (delta - c_g)^2.

    delta (n_q, n_k), the shift from each query to each key along the axis; centers (G,), one per
    factor (head, or family of heads sharing the coordinate); weight a float or (G,) (alpha, or
    half the axis's precision). Returns (G, n_q, n_k) in the operands' dtype.
    """
    if isinstance(weight, Tensor):
        weight = weight[:, None, None]
    return -weight * (delta[None] - centers[:, None, None]).square()


def quadratic_full_scores(d1: Tensor, d2: Tensor, centers: Tensor, inverse_covariance: Tensor) -> Tensor:
    """Lemma 2's score with a full 2x2 inverse covariance, -1/2 (delta - c_h)^T S_h (delta - c_h):
    d1 (H, H), d2 (W, W) row and column shifts, centers (heads, 2), S (heads, 2, 2) -> (heads, T, T)."""
    heads, H, W = centers.shape[0], d1.shape[0], d2.shape[0]
    e1 = d1[None, :, None, :, None] - centers[:, 0, None, None, None, None]  # (heads, H, 1, H, 1)
    e2 = d2[None, None, :, None, :] - centers[:, 1, None, None, None, None]  # (heads, 1, W, 1, W)
    S = inverse_covariance[:, :, :, None, None, None, None]  # (heads, 2, 2, 1, 1, 1, 1)
    quad = S[:, 0, 0] * e1**2 + 2 * S[:, 0, 1] * e1 * e2 + S[:, 1, 1] * e2**2  # (heads, H, W, H, W)
    return (-0.5 * quad).reshape(heads, H * W, H * W)


def outer_sum(row: Tensor, col: Tensor) -> Tensor:
    """Separable scores as one matrix: (..., H, H) and (..., W, W) -> (..., H*W, H*W),
    [(i, j), (k, l)] = row[i, k] + col[j, l]."""
    H, W = row.shape[-1], col.shape[-1]
    full = row[..., :, None, :, None] + col[..., None, :, None, :]  # (..., H, W, H, W)
    return full.reshape(*row.shape[:-2], H * W, H * W)


def gather_shifts(scores: Tensor, n: int, max_size: int) -> Tensor:
    """A learned table's scores per shift, (heads, 2S-1) -> (heads, n, n) with [h, q, k] = scores[h, k - q + S - 1]."""
    idx = relative_offsets(n, scores.device, torch.long) + max_size - 1  # (n, n)
    return scores[:, idx]


def learned_relative_factors(row_keys: Tensor, row_table: Tensor, col_keys: Tensor, col_table: Tensor,
                             H: int, W: int, max_size: int) -> tuple[Tensor, Tensor]:
    """The learned relative encoding's factors u_row^h . r_row(delta_1), u_col^h . r_col(delta_2):
    keys (heads, D_p), tables (2S - 1, D_p) -> row (heads, H, H), col (heads, W, W)."""
    row_scores = row_keys @ row_table.T  # (heads, 2S-1): score per row shift
    col_scores = col_keys @ col_table.T  # (heads, 2S-1)
    return gather_shifts(row_scores, H, max_size), gather_shifts(col_scores, W, max_size)


def content_position_scores(q: Tensor, row_table: Tensor, col_table: Tensor, H: int, W: int,
                            max_size: int) -> Tensor:
    """The content-dependent positional term q_row . r_row(delta_1) + q_col . r_col(delta_2):
    q (B, heads, H*W, D_k), tables (2S - 1, D_row) and (2S - 1, D_k - D_row) in q's dtype
    -> (B, heads, H*W, H*W)."""
    B, heads = q.shape[:2]
    q = q.reshape(B, heads, H, W, q.shape[-1])
    # split, not slicing: a slice's backward fills a zero tensor of q's size per half
    q_row, q_col = q.split([row_table.shape[1], col_table.shape[1]], dim=-1)
    row_scores = q_row @ row_table.T  # (B, heads, H, W, 2S-1)
    col_scores = q_col @ col_table.T  # (B, heads, H, W, 2S-1)
    # score of key row k for query row i sits at shift index k - i + S - 1
    row_idx = relative_offsets(H, q.device, torch.long) + max_size - 1  # (H_q, H_k)
    col_idx = relative_offsets(W, q.device, torch.long) + max_size - 1  # (W_q, W_k)
    row = torch.gather(row_scores, -1, row_idx[:, None, :].expand(B, heads, H, W, H))  # (B, h, H, W, H_k)
    col = torch.gather(col_scores, -1, col_idx[None, :, :].expand(B, heads, H, W, W))  # (B, h, H, W, W_k)
    full = row[..., :, None] + col[..., None, :]  # (B, h, H, W, H_k, W_k)
    return full.reshape(B, heads, H * W, H * W)


def content_scores(q: Tensor, k: Tensor) -> Tensor:
    """The content term q . k / sqrt(D_k): q (..., T_q, D_k), k (..., T_k, D_k) -> (..., T_q, T_k)."""
    return q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])


def factor_softmax(factors: Sequence[Tensor]) -> list[Tensor]:
    """Each factor's softmax over its keys: a separable score's probabilities, factor by factor (exact:
    the softmax of a sum of per-axis terms over a box is the outer product of the per-axis softmaxes)."""
    return [f.softmax(-1) for f in factors]


def kronecker_probs(row: Tensor, col: Tensor) -> Tensor:
    """Separable probabilities as one matrix: row (heads, H, H), col (heads, W, W) -> P (heads, T, T)."""
    heads, H, W = row.shape[0], row.shape[-1], col.shape[-1]
    return (row[:, :, None, :, None] * col[:, None, :, None, :]).reshape(heads, H * W, H * W)
