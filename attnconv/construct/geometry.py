"""Grid geometry shared by the construction and its reverse: token coordinates, padding as indexing.

Tokens are pixels in row-major order over the spatial axes (for 2-D, q = i * W + j).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["MAX_DENSE", "PADDING_MODES", "channels_last_like", "grid_points", "source_index"]

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


def channels_last_like(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a 4-d or 5-d tensor of `shape` and `strides` is laid out channels-last, as a convolution decides it
    for its output (torch's `Tensor.suggest_memory_format`, the C++ rule: each of C, the spatial axes from the last and N
    at least the extent of the axis before it, C not of stride 0, N's stride not C's). An input of one channel or of
    size-1 axes fits both layouts; this says which a convolution takes. Plain comparisons of the strides: torch.func.vmap
    cannot ask a batched tensor whether it is contiguous in a memory format."""
    if len(shape) not in (4, 5) or strides[1] == 0:
        return False
    least = 0
    for d in (1, *range(len(shape) - 1, 1, -1), 0):
        if shape[d] == 0 or strides[d] < least or (d == 0 and least == strides[1]):
            return False
        least = strides[d] * shape[d]
    return True


def backend_channels_last(x: torch.Tensor, weight_shape: Sequence[int], stride: Sequence[int],
                          padding: Sequence[int], dilation: Sequence[int], groups: int) -> bool | None:
    """Whether torch's convolution returns a channels-last output for input `x` and a contiguous weight of
    `weight_shape` on `x`'s device: the backend torch selects there and that backend's memory format, the question
    torch's fake tensors ask (on a GPU the backend decides: cuDNN keeps a channels-last float32 input channels-last,
    a float64 one comes back contiguous). None where this torch cannot tell (its private helpers changed)."""
    try:
        weight = torch.empty(tuple(weight_shape), dtype=x.dtype, device=x.device)
        backend = torch._C._select_conv_backend(x, weight, None, list(stride), list(padding), list(dilation), False,
                                                [0] * len(stride), groups)
        fmt = torch._C._conv_determine_backend_memory_format(x, weight, backend)
    except (AttributeError, TypeError, RuntimeError):
        return None
    return fmt in (torch.channels_last, torch.channels_last_3d)
