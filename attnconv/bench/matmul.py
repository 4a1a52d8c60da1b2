"""The matmul benchmark: a square matrix product, the machine's reference FLOP rate."""

from __future__ import annotations

import torch

from attnconv.bench.config import BenchConfig
from attnconv.bench.results import Report, Section, fmt_timing
from attnconv.bench.timing import time_variants


def bench_matmul(cfg: BenchConfig) -> Section:
    """Square matrix product: the machine's reference FLOP rate (float32; bf16 too under --amp)."""
    n = cfg.matmul_size
    sec = Section("matmul", f"Matrix multiply ({n}x{n} @ {n}x{n}), the reference rate",
                  ["dtype", "median", "min - max", "GFLOP/s"])
    dtypes = [torch.float32] + ([torch.bfloat16] if cfg.amp else [])
    for dtype in dtypes:
        gen = torch.Generator(device=cfg.device).manual_seed(0)
        a = torch.randn(n, n, device=cfg.device, generator=gen).to(dtype)
        b = torch.randn(n, n, device=cfg.device, generator=gen).to(dtype)
        t = time_variants({"mm": lambda a=a, b=b: a @ b}, warmup=max(cfg.warmup, 1), repeats=cfg.repeats,
                          device=cfg.device)["mm"]
        rate = 2 * n**3 / t.median
        sec.rows.append([str(dtype).removeprefix("torch."), *fmt_timing(t), f"{rate / 1e9:.1f}"])
        sec.data.append({"dtype": str(dtype), "n": n, "seconds": t.samples, "flops_per_s": rate})
    return sec


def matmul_rate(report: Report, amp: bool) -> float | None:
    """The FLOP/s the matmul section measured in this run (bf16 under --amp), or None."""
    sec = report.section("matmul")
    if sec is None:
        return None
    want = "torch.bfloat16" if amp else "torch.float32"
    return next((d["flops_per_s"] for d in sec.data if d["dtype"] == want), None)
