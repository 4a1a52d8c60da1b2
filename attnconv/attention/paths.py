"""The computation paths of SelfAttention2d, one function per `impl`, all computing the same function.

Each takes tensors and a few settings, never the layer. Shapes: T = H * W tokens, row-major pixels.
Values `v` (but sdpa's) are the input itself, x (B, H, W, C), for shared values (W_val^h = I), or
(B, H, W, heads, D) for per-head values. Probabilities are in at least float32; the paths cast
them to the dtype the matmul runs in. `dropout_p` (> 0 in training only) drops probabilities
keeping their expectation; `per_sample` draws a mask per sample, else one mask for the batch
(position-only probabilities, which have no batch dimension). `fused` alone also applies the
output projection (its weight and bias are arguments) and returns the layer's output.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.attention.autocast import matmul_dtype


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


def separable(row: Tensor, col: Tensor, v: Tensor, dropout_p: float = 0.0, per_sample: bool = True) -> Tensor:
    """P_h = P_h^row (x) P_h^col applied as two small matmuls -> (B, H, W, heads, D).

    row (heads, H, H) and col (heads, W, W) are the factors' probabilities. Costs
    O(B h H W (H + W) D) instead of O(B h (HW)^2 D); the T x T matrix is never formed.
    """
    dtype = matmul_dtype(v)
    row, col = _factor_dropout(row.to(dtype), col.to(dtype), v.shape[0], dropout_p, per_sample)
    if v.ndim == 4:
        return _apply_factors_shared(row, col, v.to(dtype))
    if row.ndim == 4:
        tmp = torch.einsum("bhjl,bilhd->bhijd", col, v)
        return torch.einsum("bhik,bhkjd->bijhd", row, tmp)
    tmp = torch.einsum("hjl,bilhd->hbijd", col, v)  # (heads, B, H, W, D): mix columns
    return torch.einsum("hik,hbkjd->bijhd", row, tmp)  # (B, H, W, heads, D): mix rows


def _factor_dropout(row: Tensor, col: Tensor, B: int, dropout_p: float, per_sample: bool) -> tuple[Tensor, Tensor]:
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
    MB of intermediates a tile), forward and backward (`_FusedTiles`), so each tile's products work
    in cache: the same products, plus the row factor recomputed once per tile. On a GPU, without
    gradients, under torch.compile and torch.func transforms and when tracing, one tile (Inductor
    and exporters see plain tensor operations).
    """
    dtype = matmul_dtype(x)
    B, H, W, C = x.shape
    heads = row.shape[0]
    row, col = _factor_dropout(row.to(dtype), col.to(dtype), B, dropout_p, per_sample=False)
    x, weight = x.to(dtype), weight.to(dtype)
    if tile is None:  # tiles are for CPU caches; a GPU runs the whole batch's products best
        tile = fused_tile(B, H, W, C, heads, x.element_size()) if x.device.type == "cpu" else B
    if (tile >= B or not torch.is_grad_enabled() or torch.compiler.is_compiling() or torch.jit.is_tracing()
            or torch.jit.is_scripting() or _functorch_wrapped(x)):
        out = _fused_untiled(row, col, x, weight)
    else:
        with torch.autocast(x.device.type, enabled=False):  # every operand is in `dtype` already
            out = _FusedTiles.apply(row, col, x, weight, tile)
    return out if bias is None else out + bias.to(out.dtype)


def _functorch_wrapped(x: Tensor) -> bool:
    """x is a torch.func transform's tensor (vmap, grad): the tiled function's written-out backward
    has no rules for them, so those transforms see the untiled products."""
    check = getattr(getattr(torch._C, "_functorch", None), "is_functorch_wrapped_tensor", None)
    return bool(check is not None and check(x))


def _owned(t: Tensor) -> Tensor:
    """t itself if it owns its storage, else a copy: a tensor saved for the backward must not be a
    view of an input that the caller may change in place after the forward."""
    return t if t._base is None else t.clone()


def _accumulate(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b (2-D) or a batched @ b (3-D); acc may be float32 for bf16/fp16 products, so
    that summing over many tiles does not lose the low-precision dtype's few bits each time."""
    if acc.dtype == a.dtype:
        (acc.addmm_ if a.ndim == 2 else acc.baddbmm_)(a, b)
    else:
        acc.add_(torch.mm(a, b) if a.ndim == 2 else torch.bmm(a, b))


def _fused_operands(row: Tensor, col: Tensor, weight: Tensor, C: int) -> tuple[Tensor, Tensor, Tensor]:
    """The factors and the projection as the products take them: rows R [(i, h), k] (H * heads, H),
    columns [j, (h, l)] (W, heads * W), weights per head (heads, C, C_out)."""
    heads, H, W, c_out = row.shape[0], row.shape[1], col.shape[1], weight.shape[0]
    rows = row.transpose(0, 1).reshape(H * heads, H)
    cols = col.transpose(0, 1).reshape(W, heads * W)
    w = weight.view(c_out, heads, C).permute(1, 2, 0)
    return rows, cols, w


def _fused_untiled(row: Tensor, col: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    B, H, W, C = x.shape
    heads, c_out = row.shape[0], weight.shape[0]
    rows, cols, w = _fused_operands(row, col, weight, C)
    xp = x.permute(1, 2, 0, 3).reshape(H, W * B * C)  # [k, (l, b, c)]: one copy of the input
    z = torch.mm(rows, xp)  # [(i, h), (l, b, c)]
    y = torch.matmul(z.view(H, heads, W * B, C), w)  # (H, heads, W * B, C_out): (i, h, l, b, o)
    out = torch.bmm(cols.expand(H, -1, -1), y.view(H, heads * W, B * c_out))  # (i, j, (b, o))
    return out.view(H, W, B, c_out).permute(2, 0, 1, 3)  # (B, H, W, C_out), a view


class _FusedTiles(torch.autograd.Function):
    """`_fused_untiled` over tiles of images, forward and backward (the gradients written out).

    Per tile (b images): z = R @ x_t, y = z @ W_h, out_t = cols @ y, as in `_fused_untiled`.
    Backward per tile, from g_t = dL/d out_t [i, j, (b, o)]:
        d cols += sum_i g_t[i] @ y[i]^T,      dy = cols^T @ g_t[i] (per i),
        dW_h   += sum_i z[i, h]^T @ dy[i, h],  dz = dy @ W_h^T,
        dR     += dz @ x_t^T,                  dx_t = R^T @ dz.
    Memory traffic is what bounds these products (the factors contract over H or W positions
    only), so the tensors of heads x a tile's activations are written where they stay in cache:
    z, dy and dz into one buffer each, reused by every tile (z is recomputed in the backward, a
    cheap product: the tiled path counts one more row-factor product per tile than the untiled
    one); only y, which the column gradient needs, is kept per tile. The projection runs as one
    batched product over (row, head) with the weights laid out per (row, head) once (an H-fold
    copy of the weight, kept for the backward). The factors' and the weight's gradients are
    summed over tiles in at least float32.

    Double backward (`create_graph=True`: gradient penalties, Hessian-vector products): the
    backward then differentiates `_fused_untiled` on the forward's inputs instead, so the
    gradients it returns are themselves differentiable (the whole batch at once, as without tiles).
    The inputs are kept for that as references (not copies: the tiles' own saved tensors are);
    changing one in place after the forward is an error there, as autograd's saved tensors make it.
    """

    @staticmethod
    def forward(ctx, row: Tensor, col: Tensor, x: Tensor, weight: Tensor, tile: int) -> Tensor:
        B, H, W, C = x.shape
        heads, c_out = row.shape[0], weight.shape[0]
        rows, cols, w = _fused_operands(row, col, weight, C)
        rows, cols = _owned(rows.contiguous()), _owned(cols.contiguous())
        w_rows = _owned(w.expand(H, heads, C, c_out).reshape(H * heads, C, c_out))  # W_h for every (i, h)
        z_buf = x.new_empty(H * heads * W * tile * C)
        out = x.new_empty(H, W, B, c_out)
        saved = []
        for b0 in range(0, B, tile):
            b = min(tile, B - b0)
            xp = _owned(x[b0:b0 + b].permute(1, 2, 0, 3).reshape(H, W * b * C))  # [k, (l, b, c)]
            z = torch.mm(rows, xp, out=z_buf[:H * heads * W * b * C].view(H * heads, W * b * C))
            y = torch.bmm(z.view(H * heads, W * b, C), w_rows)  # [(i, h), (l, b), o]
            out[:, :, b0:b0 + b] = torch.bmm(cols.expand(H, -1, -1), y.view(H, heads * W, b * c_out)).view(H, W, b, c_out)
            saved += [xp, y]
        ctx.save_for_backward(rows, cols, w_rows, *saved)
        ctx.tile, ctx.shape = tile, (B, H, W, C, heads, c_out)
        # For a double backward only: references, so that the gradients can be taken on the graph again.
        ctx.inputs = (row, col, x, weight)
        ctx.versions = tuple(t._version for t in ctx.inputs)
        return out.permute(2, 0, 1, 3)

    @staticmethod
    def backward(ctx, grad: Tensor):
        if torch.is_grad_enabled():  # create_graph=True: gradients that are differentiable again
            return _FusedTiles._differentiable_backward(ctx, grad)
        rows, cols, w_rows, *saved = ctx.saved_tensors
        B, H, W, C, heads, c_out = ctx.shape
        tile = ctx.tile
        need_row, need_col, need_x, need_w, _ = ctx.needs_input_grad
        acc = torch.promote_types(grad.dtype, torch.float32)  # gradients summed over tiles in at least float32
        d_rows = rows.new_zeros(rows.shape, dtype=acc) if need_row else None
        d_cols = grad.new_zeros((H, W, heads * W), dtype=acc) if need_col else None  # summed over rows i at the end
        d_w = w_rows.new_zeros(w_rows.shape, dtype=acc) if need_w else None  # per (i, h), summed over i at the end
        dx = grad.new_empty(H, W, B, C) if need_x else None
        cols_t = cols.t().expand(H, -1, -1)
        z_buf, dy_buf, dz_buf = (grad.new_empty(H * heads * W * tile * n) for n in (C, c_out, C))
        g = grad.permute(1, 2, 0, 3)  # (H, W, B, C_out), a view
        for t, b0 in enumerate(range(0, B, tile)):
            b = min(tile, B - b0)
            xp, y = saved[2 * t: 2 * t + 2]
            g_t = g[:, :, b0:b0 + b].reshape(H, W, b * c_out)
            if need_col:
                _accumulate(d_cols, g_t, y.view(H, heads * W, b * c_out).transpose(1, 2))
            if not (need_row or need_x or need_w):
                continue
            n = H * heads * W * b
            dy = torch.bmm(cols_t, g_t, out=dy_buf[:n * c_out].view(H, heads * W, b * c_out))
            dy = dy.view(H * heads, W * b, c_out)
            if need_w:
                z = torch.mm(rows, xp, out=z_buf[:n * C].view(H * heads, W * b * C))
                _accumulate(d_w, z.view(H * heads, W * b, C).transpose(1, 2), dy)
            if not (need_row or need_x):
                continue
            dz = torch.bmm(dy, w_rows.transpose(1, 2), out=dz_buf[:n * C].view(H * heads, W * b, C))
            dz = dz.view(H * heads, W * b * C)
            if need_row:
                _accumulate(d_rows, dz, xp.t())
            if need_x:
                dx[:, :, b0:b0 + b] = torch.mm(rows.t(), dz).view(H, W, b, C)
        dtype = grad.dtype
        return (
            None if d_rows is None else d_rows.view(H, heads, H).transpose(0, 1).to(dtype),
            None if d_cols is None else d_cols.sum(0).view(W, heads, W).transpose(0, 1).to(dtype),
            None if dx is None else dx.permute(2, 0, 1, 3),
            None if d_w is None else d_w.view(H, heads, C, c_out).sum(0).permute(2, 0, 1).reshape(c_out, heads * C).to(dtype),
            None,
        )

    @staticmethod
    def _differentiable_backward(ctx, grad: Tensor):
        """The gradients of `_fused_untiled` at the forward's inputs, with their own graph."""
        names = ("row factor", "column factor", "input", "projection weight")
        for name, t, version in zip(names, ctx.inputs, ctx.versions):
            if t._version != version:
                raise RuntimeError(
                    f"attnconv fused path: the {name} of an attention layer was changed in place after the "
                    "forward, so its double backward (create_graph=True) cannot be taken; change a copy "
                    "instead, or run the layer with impl='separable'")
        wanted = [t for t, need in zip(ctx.inputs, ctx.needs_input_grad) if need]
        with torch.autocast(grad.device.type, enabled=False):
            out = _fused_untiled(*ctx.inputs)
            grads = iter(torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True))
        return (*(next(grads) if need else None for need in ctx.needs_input_grad[:4]), None)


def _apply_factors_shared(row: Tensor, col: Tensor, x: Tensor) -> Tensor:
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


def kronecker_probs(row: Tensor, col: Tensor) -> Tensor:
    """Separable probabilities as one matrix: row (heads, H, H), col (heads, W, W) -> P (heads, T, T).

    Exact: the softmax of a row term plus a column term is the Kronecker product of their softmaxes.
    """
    heads, H, W = row.shape[0], row.shape[-1], col.shape[-1]
    return (row[:, :, None, :, None] * col[:, None, :, None, :]).reshape(heads, H * W, H * W)


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
