"""The fullsize section: the paper's full-size sa-quadratic training step against the matmul rate, per precision.

The paper's model (6 layers, hidden 400, 9 heads, MLP 512, 16x16 tokens from 32x32x3,
dropout 0.1 and attention dropout 0.1, SGD) at batch `fullsize_batch` (100, the paper's,
unless reduced), on the path impl='auto' takes. For each precision the matmul reference
(4096 x 4096, the same dtype) and the step are measured in this process, the matmul
before and after the steps (the median of both runs is the reference). Utilization =
counted FLOPs of one step / median step time / matmul rate.
"""

from __future__ import annotations

import torch

from attnconv.bench.cases import taken_impl, training_step
from attnconv.bench.config import FULLSIZE_UTILIZATION_TARGET, BenchConfig
from attnconv.bench.presets import count_step_flops
from attnconv.bench.profiling import describe_profile, profile_step
from attnconv.bench.results import Section, fmt_seconds
from attnconv.bench.timing import Timing, precision_autocast, progress, time_variants
from attnconv.models import build_model

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def matmul_timing(n: int, precision: str, cfg: BenchConfig) -> Timing:
    """Timing of an n x n @ n x n product in the precision's dtype."""
    gen = torch.Generator(device=cfg.device).manual_seed(0)
    a = torch.randn(n, n, device=cfg.device, generator=gen).to(_DTYPES[precision])
    b = torch.randn(n, n, device=cfg.device, generator=gen).to(_DTYPES[precision])
    return time_variants({"mm": lambda: a @ b}, warmup=max(cfg.warmup, 1), repeats=cfg.repeats,
                         device=cfg.device)["mm"]


def bench_fullsize(cfg: BenchConfig) -> Section:
    """Utilization of the paper's full-size sa-quadratic training step, fp32 and bf16."""
    sec = Section("fullsize", f"The paper's sa-quadratic training step (batch {cfg.fullsize_batch}) against the "
                              "matmul rate of the same precision",
                  ["precision", "impl", "layers", "batch", "step median", "images/s", "FLOPs/step", "GFLOP/s",
                   "matmul GFLOP/s", "utilization", "target"])
    torch.manual_seed(0)
    model = build_model("sa-quadratic", **cfg.fullsize_overrides).to(cfg.device).train()
    layers, impl = model.config.layers, taken_impl(model)
    gen = torch.Generator().manual_seed(1)
    c, s = model.config.in_channels, model.config.image_size
    x = torch.randn(cfg.fullsize_batch, c, s, s, generator=gen).to(cfg.device)
    y = torch.randint(0, model.config.num_classes, (cfg.fullsize_batch,), generator=gen).to(cfg.device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    n = cfg.matmul_size
    for precision in cfg.precisions:
        progress(f"fullsize {precision}")
        before = matmul_timing(n, precision, cfg)
        step = training_step(model, x, y, opt, lambda p=precision: precision_autocast(cfg.device, p))
        flops = count_step_flops(step)  # also the first warm-up run
        t = time_variants({"step": step}, warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device)["step"]
        after = matmul_timing(n, precision, cfg)
        rate = 2 * n**3 / Timing(before.samples + after.samples).median
        achieved = flops / t.median if flops else None
        util = achieved / rate if achieved else None
        target = FULLSIZE_UTILIZATION_TARGET
        row = {"precision": precision, "impl": impl, "layers": layers, "batch": cfg.fullsize_batch,
               "seconds": t.samples, "median": t.median, "images_per_s": cfg.fullsize_batch / t.median,
               "flops": flops, "flops_per_s": achieved, "matmul_flops_per_s": rate,
               "matmul_seconds": before.samples + after.samples, "utilization": util, "target": target}
        sec.data.append(row)
        status = "" if util is None else f">= {target:.0%} {'met' if util >= target else 'missed'}"
        sec.rows.append([precision, impl, str(layers), str(cfg.fullsize_batch), fmt_seconds(t.median),
                         f"{row['images_per_s']:.1f}", "-" if flops is None else f"{flops:.3g}",
                         "-" if achieved is None else f"{achieved / 1e9:.1f}", f"{rate / 1e9:.1f}",
                         "-" if util is None else f"{util:.0%}", status])
        if cfg.profile and util is not None and util < target:
            sec.notes.append(f"{precision}: {util:.0%} misses {target:.0%}; torch.profiler, one step: "
                             + describe_profile(impl, profile_step(step, cfg.device, top=8)))
    if cfg.fullsize_overrides:
        sec.notes.append(f"model overrides in this mode: {cfg.fullsize_overrides} (the paper: 6 layers, hidden 400)")
    sec.notes.append(f"matmul: {n}x{n} @ {n}x{n} in the precision's dtype, {cfg.repeats} runs before and after the "
                     "steps, median; FLOPs: attnconv.flops.flop_counter over forward + backward of one step "
                     "(matrix products; elementwise work not counted)")
    sec.notes.append("the step: train mode (dropout 0.1, attention dropout 0.1 per sample), cross-entropy, backward, "
                     "SGD with momentum; bf16 = torch.autocast(bfloat16) around the forward")
    return sec
