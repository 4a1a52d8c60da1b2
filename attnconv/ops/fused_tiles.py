"""The fused backend's products, and `FusedTiles`: them over tiles of images with a written-out backward.

`fused_untiled` is the fused path's three products on the whole batch (what runs without
gradients, under torch.compile and when tracing); `FusedTiles` runs the same products a tile of
images at a time, forward and backward, with buffers reused by every tile (see its docstring).
"""

from __future__ import annotations

import torch
from torch import Tensor


def owned(t: Tensor) -> Tensor:
    """t itself if it owns its storage, else a copy: a tensor saved for the backward must not be a
    view of an input that the caller may change in place after the forward."""
    return t if t._base is None else t.clone()


def accumulate(acc: Tensor, a: Tensor, b: Tensor) -> None:
    """acc += a @ b (2-D) or a batched @ b (3-D); acc may be float32 for bf16/fp16 products, so
    that summing over many tiles does not lose the low-precision dtype's few bits each time."""
    if acc.dtype == a.dtype:
        (acc.addmm_ if a.ndim == 2 else acc.baddbmm_)(a, b)
    else:
        acc.add_(torch.mm(a, b) if a.ndim == 2 else torch.bmm(a, b))


def fused_operands(row: Tensor, col: Tensor, weight: Tensor, C: int) -> tuple[Tensor, Tensor, Tensor]:
    """The factors and the projection as the products take them: rows R [(i, h), k] (H * heads, H),
    columns [j, (h, l)] (W, heads * W), weights per head (heads, C, C_out)."""
    heads, H, W, c_out = row.shape[0], row.shape[1], col.shape[1], weight.shape[0]
    rows = row.transpose(0, 1).reshape(H * heads, H)
    cols = col.transpose(0, 1).reshape(W, heads * W)
    w = weight.view(c_out, heads, C).permute(1, 2, 0)
    return rows, cols, w


def fused_untiled(row: Tensor, col: Tensor, x: Tensor, weight: Tensor) -> Tensor:
    """The three products of `attnconv.ops.fused.fused` on the whole batch: x (B, H, W, C) -> (B, H, W, C_out), no bias."""
    B, H, W, C = x.shape
    heads, c_out = row.shape[0], weight.shape[0]
    rows, cols, w = fused_operands(row, col, weight, C)
    xp = x.permute(1, 2, 0, 3).reshape(H, W * B * C)  # [k, (l, b, c)]: one copy of the input
    z = torch.mm(rows, xp)  # [(i, h), (l, b, c)]
    y = torch.matmul(z.view(H, heads, W * B, C), w)  # (H, heads, W * B, C_out): (i, h, l, b, o)
    out = torch.bmm(cols.expand(H, -1, -1), y.view(H, heads * W, B * c_out))  # (i, j, (b, o))
    return out.view(H, W, B, c_out).permute(2, 0, 1, 3)  # (B, H, W, C_out), a view


class FusedTiles(torch.autograd.Function):
    """`fused_untiled` over tiles of images, forward and backward (the gradients written out).

    Per tile (b images): z = R @ x_t, y = z @ W_h, out_t = cols @ y, as in `fused_untiled`.
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
    backward then differentiates `fused_untiled` on the forward's inputs instead, so the
    gradients it returns are themselves differentiable (the whole batch at once, as without tiles).
    The inputs are kept for that as references (not copies: the tiles' own saved tensors are);
    changing one in place after the forward is an error there, as autograd's saved tensors make it.
    """

    @staticmethod
    def forward(ctx, row: Tensor, col: Tensor, x: Tensor, weight: Tensor, tile: int) -> Tensor:
        B, H, W, C = x.shape
        heads, c_out = row.shape[0], weight.shape[0]
        rows, cols, w = fused_operands(row, col, weight, C)
        rows, cols = owned(rows.contiguous()), owned(cols.contiguous())
        w_rows = owned(w.expand(H, heads, C, c_out).reshape(H * heads, C, c_out))  # W_h for every (i, h)
        z_buf = x.new_empty(H * heads * W * tile * C)
        out = x.new_empty(H, W, B, c_out)
        saved = []
        for b0 in range(0, B, tile):
            b = min(tile, B - b0)
            xp = owned(x[b0:b0 + b].permute(1, 2, 0, 3).reshape(H, W * b * C))  # [k, (l, b, c)]
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
            return FusedTiles._differentiable_backward(ctx, grad)
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
                accumulate(d_cols, g_t, y.view(H, heads * W, b * c_out).transpose(1, 2))
            if not (need_row or need_x or need_w):
                continue
            n = H * heads * W * b
            dy = torch.bmm(cols_t, g_t, out=dy_buf[:n * c_out].view(H, heads * W, b * c_out))
            dy = dy.view(H * heads, W * b, c_out)
            if need_w:
                z = torch.mm(rows, xp, out=z_buf[:n * C].view(H * heads, W * b * C))
                accumulate(d_w, z.view(H * heads, W * b, C).transpose(1, 2), dy)
            if not (need_row or need_x):
                continue
            dz = torch.bmm(dy, w_rows.transpose(1, 2), out=dz_buf[:n * C].view(H * heads, W * b, C))
            dz = dz.view(H * heads, W * b * C)
            if need_row:
                accumulate(d_rows, dz, xp.t())
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
        """The gradients of `fused_untiled` at the forward's inputs, with their own graph."""
        names = ("row factor", "column factor", "input", "projection weight")
        for name, t, version in zip(names, ctx.inputs, ctx.versions):
            if t._version != version:
                raise RuntimeError(
                    f"attnconv fused path: the {name} of an attention layer was changed in place after the "
                    "forward, so its double backward (create_graph=True) cannot be taken; change a copy "
                    "instead, or run the layer with impl='separable'")
        wanted = [t for t, need in zip(ctx.inputs, ctx.needs_input_grad) if need]
        with torch.autocast(grad.device.type, enabled=False):
            out = fused_untiled(*ctx.inputs)
            grads = iter(torch.autograd.grad(out, wanted, grad, create_graph=True, allow_unused=True))
        return (*(next(grads) if need else None for need in ctx.needs_input_grad[:4]), None)
