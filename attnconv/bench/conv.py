"""The conv section: the quadratic attention layer against nn.Conv2d and a Swin-style attention, per FLOP.

Three drop-ins for a C -> C layer on (B, C, S, S) images, forward + backward on the same
input: the paper's quadratic SelfAttention2d (9 heads, shared values, impl="auto"),
`nn.Conv2d(C, C, 3, padding=1)`, and `RelativeBiasAttention`, global multi-head attention
with a learned relative position bias gathered from a (2S - 1)^2 table as Swin does,
through F.scaled_dot_product_attention. Each gets its counted FLOPs
(attnconv.flops.flop_counter, forward + backward), so the table gives the achieved GFLOP/s
of each next to its time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from attnconv.attention import SelfAttention2d
from attnconv.bench.cases import taken_impl
from attnconv.bench.config import BenchConfig
from attnconv.bench.presets import count_step_flops
from attnconv.bench.results import Section, fmt_timing
from attnconv.bench.timing import precision_autocast, progress, time_variants


class RelativeBiasAttention(nn.Module):
    """Swin-style multi-head self-attention over all S x S tokens, (B, C, S, S) -> (B, C, S, S).

    q, k, v = Linear(C -> 3C); per head a learned bias B[h, q, k] = table[index(k - q), h] from a
    ((2S - 1)^2, heads) table (Swin's relative position bias, without windows); softmax(q k^T / sqrt(d)
    + B) v through F.scaled_dot_product_attention; Linear(C -> C).
    """

    def __init__(self, channels: int, heads: int, size: int):
        super().__init__()
        if channels % heads:
            raise ValueError(f"channels {channels} not divisible by heads {heads}")
        self.heads, self.size = heads, size
        self.qkv = nn.Linear(channels, 3 * channels)
        self.proj = nn.Linear(channels, channels)
        self.table = nn.Parameter(torch.randn((2 * size - 1) ** 2, heads) * 0.02)
        coords = torch.cartesian_prod(torch.arange(size), torch.arange(size))  # (T, 2), row-major
        delta = coords[None, :, :] - coords[:, None, :] + size - 1  # (T, T, 2): k - q, shifted to >= 0
        self.register_buffer("index", delta[..., 0] * (2 * size - 1) + delta[..., 1], persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        B, C, H, W = x.shape
        T, h = H * W, self.heads
        tokens = x.flatten(2).transpose(1, 2)  # (B, T, C)
        q, k, v = self.qkv(tokens).view(B, T, 3, h, C // h).permute(2, 0, 3, 1, 4).unbind(0)  # (B, h, T, d) each
        bias = self.table[self.index].permute(2, 0, 1)[None]  # (1, h, T, T)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype))
        return self.proj(out.transpose(1, 2).reshape(B, T, C)).transpose(1, 2).reshape(B, C, H, W)


def swin_heads(channels: int) -> int:
    """The most heads with width >= 32 (Swin's head width) that divide the channels."""
    return max(h for h in range(1, channels + 1) if channels % h == 0 and channels // h >= min(32, channels))


def _layer_step(module: nn.Module, x: Tensor, grad: Tensor, precision: str, device: str) -> Callable[[], None]:
    def step() -> None:
        x.grad = None
        module.zero_grad(set_to_none=True)
        with precision_autocast(device, precision):
            y = module(x)
        y.backward(grad.to(y.dtype))

    return step


def bench_conv(cfg: BenchConfig) -> Section:
    """Quadratic attention vs Conv2d 3x3 vs Swin-style attention: forward + backward time, FLOPs, GFLOP/s."""
    sec = Section("conv", f"Quadratic attention layer vs nn.Conv2d 3x3 vs Swin-style attention, forward + backward "
                          f"(batch {cfg.conv_batch})",
                  ["C", "tokens", "precision", "layer", "median", "min - max", "FLOPs", "GFLOP/s", "time / conv"])
    for C in cfg.conv_channels:
        for side in cfg.conv_sides:
            torch.manual_seed(0)
            modules = {
                "conv 3x3": nn.Conv2d(C, C, 3, padding=1),
                "quadratic": SelfAttention2d(C, C, heads=9, encoding="quadratic", max_size=side),
                "swin-style": RelativeBiasAttention(C, swin_heads(C), side),
            }
            names = {"conv 3x3": "conv 3x3", "quadratic": f"quadratic ({taken_impl(modules['quadratic'])})",
                     "swin-style": f"swin-style ({swin_heads(C)} heads, sdpa)"}
            gen = torch.Generator().manual_seed(1)
            x = torch.randn(cfg.conv_batch, C, side, side, generator=gen).to(cfg.device).requires_grad_()
            grad = torch.randn(cfg.conv_batch, C, side, side, generator=gen).to(cfg.device)
            for precision in cfg.precisions:
                progress(f"conv C={C} {side}x{side} {precision}")
                steps = {n: _layer_step(m.to(cfg.device), x, grad, precision, cfg.device) for n, m in modules.items()}
                flops = {n: count_step_flops(step) for n, step in steps.items()}
                timings = time_variants(steps, warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device)
                for n, t in timings.items():
                    rate = None if flops[n] is None else flops[n] / t.median
                    ratio = t.median / timings["conv 3x3"].median
                    sec.data.append({"channels": C, "side": side, "precision": precision, "layer": names[n],
                                     "batch": cfg.conv_batch, "seconds": t.samples, "median": t.median,
                                     "flops": flops[n], "flops_per_s": rate, "time_vs_conv": ratio})
                    sec.rows.append([str(C), f"{side}x{side}", precision, names[n], *fmt_timing(t),
                                     "-" if flops[n] is None else f"{flops[n]:.3g}",
                                     "-" if rate is None else f"{rate / 1e9:.1f}", f"{ratio:.2f}x"])
    sec.notes.append("quadratic: SelfAttention2d(C, C, heads=9, encoding='quadratic'), impl='auto' (path in "
                     "parentheses), on (B, C, S, S) like the conv; swin-style: global attention with a learned "
                     "relative position bias from a (2S-1)^2 table, qkv and output Linears, "
                     "F.scaled_dot_product_attention with the bias as a float mask")
    sec.notes.append("FLOPs: attnconv.flops.flop_counter over forward + backward (matrix products, convolutions, "
                     "attention kernels; softmax and elementwise work not counted); each precision's three layers "
                     f"timed interleaved, {cfg.warmup} warm-up, median of {cfg.repeats}")
    return sec
