"""Grid geometry shared by the construction and its reverse: token coordinates, padding as indexing.

Tokens are pixels in row-major order over the spatial axes (for 2-D, q = i * W + j).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["MAX_DENSE", "PADDING_MODES", "grid_points", "source_index"]

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
# Dense probability tensors above this many elements are refused (they would not fit anyway).
MAX_DENSE = 2**28


def grid_points(size: Sequence[int]) -> Tensor:
    """Row-major coordinates of every pixel of a grid: (prod(size), ndim) int64."""
    grids = torch.meshgrid(*[torch.arange(n) for n in size], indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=-1)


def source_index(n: int, lo: int, hi: int, mode: str) -> Tensor:
    """For each position of a padded axis (lo + n + hi,), the input pixel it copies (-1: zero)."""
    p = torch.arange(-lo, n + hi)  # positions in input coordinates
    if mode == "zeros":
        return torch.where((p >= 0) & (p < n), p, torch.full_like(p, -1))
    if mode == "replicate":
        return p.clamp(0, n - 1)
    if mode == "circular":
        return p.remainder(n)
    if mode == "reflect":  # mirror about the edge pixels, without repeating them
        p = p.abs()
        return torch.where(p > n - 1, 2 * (n - 1) - p, p)
    raise AssertionError(mode)
