"""The fused backend (shared values, separable encodings): the output projection run between the factors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from attnconv.ops.autocast import matmul_dtype
from attnconv.ops.fused_tiles import FusedTiles, fused_untiled
from attnconv.ops.separable import factor_dropout

# The fused path runs a batch in tiles of images whose row-factor output (heads x the tile's
# activations) takes about this many bytes, so that the three products of a tile and their
# gradients find their operands in cache rather than in memory; at least FUSED_MIN_TILE images a
# tile (smaller tiles lose more to per-product overhead than they gain). The measurements behind
# both numbers: benchmarks/RESULTS.md, "The fused path in tiles".
FUSED_TILE_BYTES = 4 * 2**20
FUSED_MIN_TILE = 4


_one_tile = False


@contextmanager
def fused_in_one_tile() -> Iterator[None]:
    """Within it, the fused path runs every batch as one tile (the benchmarks' comparison)."""
    global _one_tile
    before, _one_tile = _one_tile, True
    try:
        yield
    finally:
        _one_tile = before


def fused_tile(batch: int, H: int, W: int, C: int, heads: int, itemsize: int) -> int:
    """Images per tile of the fused path for x (batch, H, W, C); `batch` itself means one tile."""
    if _one_tile:
        return batch
    per_image = heads * H * W * C * itemsize
    return min(batch, max(FUSED_MIN_TILE, FUSED_TILE_BYTES // per_image))


def fused(row: Tensor, col: Tensor, x: Tensor, weight: Tensor, bias: Tensor | None = None,
          dropout_p: float = 0.0, tile: int | None = None) -> Tensor:
    """Shared values and separable probabilities, the output projection run between the two factors:
    x (B, H, W, C) -> MHSA(x) (B, H, W, C_out), with weight (C_out, heads * C) and bias (C_out,).

        y[i, j] = sum_h sum_l col_h[j, l] (sum_k row_h[i, k] x[k, l]) W_h^T + b

    The row factor and the projection act on different axes, so they commute with the column
    factor; ordering them row -> projection -> column lets the last product sum over the heads:
      1. rows, one matrix product for all heads: (H * heads, H) @ x as (H, W * B * C), its rows
         ordered (i, h) so that every later operand is a plain strided matrix;
      2. the projection, per (row, head): (W * B, C) @ W_h^T, as one batched product;
      3. columns and the sum over heads at once: (W, heads * W) @ (heads * W, B * C_out) per row.
    Two tensors of heads x the input's size are written (1 and 2), against three and a permuted
    copy for `separable` followed by the projection, and no product has a batch of tiny
    matrices (separable's (W, W) @ (W, C) per image, head and row). Same FLOPs as separable + the
    projection. Dropout: one mask per factor for the batch (`per-sample` masks take `separable`).

    With gradients on the CPU, the batch runs in tiles of `tile` images (default `fused_tile`: a few
    MB of intermediates a tile), forward and backward (`FusedTiles`), so each tile's products work
    in cache: the same products, plus the row factor recomputed once per tile. On a GPU, without
    gradients, under torch.compile and torch.func transforms and when tracing, one tile (Inductor
    and exporters see plain tensor operations).
    """
    dtype = matmul_dtype(x)
    B, H, W, C = x.shape
    heads = row.shape[0]
    row, col = factor_dropout(row.to(dtype), col.to(dtype), B, dropout_p, per_sample=False)
    x, weight = x.to(dtype), weight.to(dtype)
    # The tile is computed only where tiles can run: comparing it with a traced batch size (torch.export,
    # torch.jit.trace) would bind the export to the batch sizes of one tile (a guard `min(256, B) >= B`).
    untiled = (not torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.jit.is_tracing()
               or torch.jit.is_scripting() or functorch_wrapped(x))
    if not untiled and tile is None:  # tiles are for CPU caches; a GPU runs the whole batch's products best
        tile = fused_tile(B, H, W, C, heads, x.element_size()) if x.device.type == "cpu" else B
    if untiled or tile >= B:
        out = fused_untiled(row, col, x, weight)
    else:
        with torch.autocast(x.device.type, enabled=False):  # every operand is in `dtype` already
            out = FusedTiles.apply(row, col, x, weight, tile)
    return out if bias is None else out + bias.to(out.dtype)


def functorch_wrapped(x: Tensor) -> bool:
    """x is a torch.func transform's tensor (vmap, grad): the tiled function's written-out backward
    has no rules for them, so those transforms see the untiled products."""
    check = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    return bool(check is not None and check(x))
