"""The presets section: the Fashion-MNIST CPU presets' training steps, attention against ResNet, same precision.

`fmnist-sa-quadratic` (the paper's block at hidden 96, 4 layers, 9 heads, 7x7 tokens) and
`fmnist-resnet-small` (ResNet-18 at width 16), each with its preset's optimizer (AdamW,
SGD), at the same batch on the same random 28x28x1 images, timed interleaved in one
process for each precision (float32; bf16 autocast). Also timed, for the record: the
attention preset on the separable path (auto's choice before the stacked path), and
sa-learned-content with the preset's sizes (content attention's cost at this shape).
Rows carry the counted FLOPs of one step (forward + backward), so time ratios can be
read against FLOP ratios.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from attnconv.bench.cases import taken_impl, training_step
from attnconv.bench.config import PRESET_TARGET, BenchConfig
from attnconv.bench.profiling import describe_profile, profile_step
from attnconv.bench.results import Section, fmt_timing
from attnconv.bench.timing import attempt, precision_autocast, progress, target_status, time_variants
from attnconv.config import make_config
from attnconv.flops import flop_counter
from attnconv.models import build_model
from attnconv.training.schedule import make_optimizer

ATTENTION_PRESET, RESNET_PRESET = "fmnist-sa-quadratic", "fmnist-resnet-small"
# (row name, preset, model (None: the preset's), model overrides on top of the preset's): the baseline last
PRESET_ROWS = (
    ("sa-quadratic", ATTENTION_PRESET, None, {}),
    ("sa-quadratic, separable path", ATTENTION_PRESET, None, {"impl": "separable"}),
    ("sa-learned-content", ATTENTION_PRESET, "sa-learned-content", {}),
    ("resnet18 (width 16)", RESNET_PRESET, None, {}),
)
FASHION_SHAPE = (1, 28, 28)


def preset_model(preset: str, model: str | None = None, **overrides: Any) -> torch.nn.Module:
    """The preset's model (or `model` with the preset's sizes) at the Fashion-MNIST shape, with
    `overrides` on top of the preset's own."""
    cfg = make_config(preset=preset)
    c, s, _ = FASHION_SHAPE
    return build_model(model or cfg.model, **{**cfg.model_overrides, "in_channels": c, "image_size": s, **overrides})


def preset_steps(rows: tuple, batch: int, precision: str, device: str
                 ) -> tuple[dict[str, Callable[[], None]], dict[str, torch.nn.Module]]:
    """One training step per row (its preset's optimizer), on shared random inputs."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, *FASHION_SHAPE, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    steps, models = {}, {}
    for name, preset, model_name, overrides in rows:
        torch.manual_seed(0)
        model = preset_model(preset, model_name, **overrides).to(device).train()
        opt = make_optimizer(model, make_config(preset=preset))
        steps[name] = training_step(model, x, y, opt, lambda: precision_autocast(device, precision))
        models[name] = model
    return steps, models


def count_step_flops(step: Callable[[], None]) -> int | None:
    """FLOPs of one run of step (attnconv.flops.flop_counter: matrix products, convolutions, attention kernels)."""
    with flop_counter() as counter:
        if attempt(step):
            return None
    return int(counter.get_total_flops())


def bench_presets(cfg: BenchConfig) -> Section:
    """The attention preset's training images/s against the ResNet preset's, per precision."""
    sec = Section("presets", f"Fashion-MNIST CPU presets: training step at batch {cfg.preset_batch}, "
                             f"{ATTENTION_PRESET} vs {RESNET_PRESET}",
                  ["model", "precision", "impl", "median", "min - max", "images/s", "vs ResNet", "target",
                   "FLOPs/step", "GFLOP/s"])
    baseline = PRESET_ROWS[-1][0]
    for precision in cfg.precisions:
        progress(f"presets {precision}")
        steps, models = preset_steps(PRESET_ROWS, cfg.preset_batch, precision, cfg.device)
        flops = {name: count_step_flops(step) for name, step in steps.items()}  # also the first warm-up run
        timings = time_variants(steps, warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device)
        for name, t in timings.items():
            model = models[name]
            impl = taken_impl(model) if hasattr(model, "attention_layers") else "-"
            ratio = timings[baseline].median / t.median
            target = PRESET_TARGET if name == PRESET_ROWS[0][0] else None
            row = {"model": name, "precision": precision, "impl": impl, "batch": cfg.preset_batch,
                   "seconds": t.samples, "median": t.median, "images_per_s": cfg.preset_batch / t.median,
                   "vs_resnet": ratio, "target": target, "flops": flops[name]}
            sec.data.append(row)
            rate = "-" if flops[name] is None else f"{flops[name] / t.median / 1e9:.1f}"
            sec.rows.append([name, precision, impl, *fmt_timing(t), f"{row['images_per_s']:.0f}", f"{ratio:.2f}x",
                             target_status(ratio, target), "-" if flops[name] is None else f"{flops[name]:.3g}",
                             rate])
            if target is not None and ratio < target and cfg.profile:
                sec.notes.append(f"{name} {precision}: {ratio:.2f}x misses {target:g}x; torch.profiler, one step: "
                                 + describe_profile(impl, profile_step(steps[name], cfg.device, top=8)))
    sec.notes.append(f"each precision: the four steps timed interleaved in one process after {cfg.warmup} warm-up "
                     f"run(s), median of {cfg.repeats}; the preset's optimizer (AdamW for attention, SGD for ResNet); "
                     "bf16 = torch.autocast(bfloat16) around the forward, loss in float32")
    sec.notes.append("vs ResNet: the ResNet preset's median step time / this one's (images/s ratio), same precision; "
                     "FLOPs/step: attnconv.flops.flop_counter over forward + backward (matrix products and "
                     "convolutions; elementwise work not counted)")
    return sec
