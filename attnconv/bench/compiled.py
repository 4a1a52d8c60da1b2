"""The compile section: torch.compile on the CPU, its cost and its steady-state gain, per named model.

Every named model at the Fashion-MNIST CPU sizes (attention models with the
fmnist-sa-quadratic sizes, ResNet-18 at width 16), each precision: an eager copy and a
torch.compile'd copy with the same parameters and the preset's optimizer. The compiled
copy's first step (tracing, Inductor's C++ build, then the step) is timed alone after
torch._dynamo.reset(); then both copies' steps are timed interleaved. Compile cost =
first compiled step - steady compiled step; compile pays within an epoch when the
per-step saving times EPOCH_STEPS (469: 60,000 images at batch 128) exceeds it.
"""

from __future__ import annotations

import copy

import torch

from attnconv.bench.cases import training_step
from attnconv.bench.config import EPOCH_STEPS, BenchConfig
from attnconv.bench.presets import ATTENTION_PRESET, FASHION_SHAPE, RESNET_PRESET, preset_model
from attnconv.bench.results import Section, fmt_seconds
from attnconv.bench.timing import attempt, precision_autocast, progress, time_call, time_variants
from attnconv.config import make_config
from attnconv.models import list_models
from attnconv.training.schedule import make_optimizer


def _preset_for(name: str) -> str:
    return RESNET_PRESET if name.startswith("resnet") else ATTENTION_PRESET


def _compile_case(name: str, precision: str, cfg: BenchConfig) -> dict:
    import torch._dynamo as dynamo

    preset = _preset_for(name)
    torch.manual_seed(0)
    overrides = {} if preset == RESNET_PRESET else cfg.compile_overrides
    eager = preset_model(preset, name, **overrides).to(cfg.device).train()
    compiled_copy = copy.deepcopy(eager)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(cfg.preset_batch, *FASHION_SHAPE, generator=gen).to(cfg.device)
    y = torch.randint(0, 10, (cfg.preset_batch,), generator=gen).to(cfg.device)
    config = make_config(preset=preset)
    context = lambda: precision_autocast(cfg.device, precision)  # noqa: E731
    dynamo.reset()
    compiled = torch.compile(compiled_copy)
    steps = {"eager": training_step(eager, x, y, make_optimizer(eager, config), context),
             "compiled": training_step(compiled, x, y, make_optimizer(compiled_copy, config), context)}
    row: dict = {"model": name, "precision": precision, "batch": cfg.preset_batch}
    first: list[float] = []
    error = attempt(lambda: first.append(time_call(steps["compiled"], cfg.device)))
    if error:
        row["failed"] = error
        return row
    first_eager = time_call(steps["eager"], cfg.device)
    timings = time_variants(steps, warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device)
    eager_t, compiled_t = timings["eager"].median, timings["compiled"].median
    cost = first[0] - compiled_t
    saving = eager_t - compiled_t
    row.update(first_compiled=first[0], first_eager=first_eager, eager=eager_t, compiled=compiled_t,
               eager_seconds=timings["eager"].samples, compiled_seconds=timings["compiled"].samples,
               speedup=eager_t / compiled_t, compile_cost=cost,
               break_even_steps=cost / saving if saving > 0 else None,
               pays_in_epoch=saving > 0 and saving * EPOCH_STEPS > cost)
    return row


def bench_compile(cfg: BenchConfig) -> Section:
    """torch.compile against eager for every named model, each precision: cost and steady-state speed."""
    names = list(cfg.compile_models or list_models())
    sec = Section("compile", f"torch.compile on the CPU: training step at batch {cfg.preset_batch}, "
                             "Fashion-MNIST sizes",
                  ["model", "precision", "eager", "compiled", "eager/compiled", "first compiled step",
                   "compile cost", "break-even", f"pays in one epoch ({EPOCH_STEPS} steps)"])
    for name in names:
        for precision in cfg.precisions:
            progress(f"compile {name} {precision}")
            r = _compile_case(name, precision, cfg)
            sec.data.append(r)
            if "failed" in r:
                sec.rows.append([name, precision, "FAILED (see notes)"] + [""] * 6)
                sec.notes.append(f"{name} {precision}: compiled step failed: {r['failed']}")
                continue
            even = "never" if r["break_even_steps"] is None else f"{r['break_even_steps']:.0f} steps"
            sec.rows.append([name, precision, fmt_seconds(r["eager"]), fmt_seconds(r["compiled"]),
                             f"{r['speedup']:.2f}x", fmt_seconds(r["first_compiled"]), fmt_seconds(r["compile_cost"]),
                             even, "yes" if r["pays_in_epoch"] else "no"])
    if cfg.compile_overrides:
        sec.notes.append(f"attention models' overrides in this mode: {cfg.compile_overrides}")
    sec.notes.append(f"attention models: the {ATTENTION_PRESET} sizes (hidden 96, 4 layers, 9 heads, 7x7 tokens) on "
                     f"28x28x1 inputs; resnet18: the {RESNET_PRESET} width 16; each with its preset's optimizer")
    sec.notes.append("torch.compile(model) with default options (Inductor), as `attnconv train --compile` does; "
                     "torch._dynamo.reset() before each case; the first compiled step is timed alone, then eager "
                     f"and compiled steps interleaved ({cfg.warmup} warm-up, median of {cfg.repeats})")
    sec.notes.append("compile cost: first compiled step - steady compiled step; break-even: compile cost / "
                     "(eager step - compiled step)")
    return sec
