"""The grid section: the attention preset's training step at 7x7, 14x14, 16x16 and 32x32 tokens.

Each grid is an input size and a space-to-depth factor: 28x28 / 4 (the Fashion-MNIST preset),
28x28 / 2 (the paper's grid on Fashion-MNIST), 32x32 / 2 (CIFAR-10 at the paper's 2x2 patches)
and 32x32 / 1. At every grid the attention preset's model (`fmnist-sa-quadratic`: hidden 96,
4 layers, 9 heads) runs the path `impl="auto"` picks and the runners-up (`RUNNERS_UP`: beside
fused, fused in one tile and separable; fused beside stacked on the small grids), and ResNet-18 at
width 16 (the ResNet preset) runs on the same input. Everything is timed interleaved in one
process, at one batch and precision, so every ratio in the table is measured against rows of
the same run:

- vs 7x7: images/s over the 7x7 preset step's; and GFLOP/s over the 7x7 step's (1.0 = as fast
  per FLOP as the preset);
- vs ResNet: images/s over the ResNet step's at the same input size.

The layer rows time SelfAttention2d alone (the preset's width and heads, forward + backward)
at each grid, with their GFLOP/s against the 7x7 layer's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch

from attnconv.attention import SelfAttention2d
from attnconv.bench.cases import set_impl, taken_impl, training_step
from attnconv.bench.config import GRID_SIDES, BenchConfig
from attnconv.bench.presets import ATTENTION_PRESET, RESNET_PRESET, count_step_flops
from attnconv.bench.results import Section, fmt_timing
from attnconv.bench.timing import precision_autocast, progress, target_status, time_variants
from attnconv.config import make_config
from attnconv.models import build_model
from attnconv.ops import fused_in_one_tile
from attnconv.training.schedule import make_optimizer

# (tokens a side, input side, space-to-depth factor)
GRIDS = ((7, 28, 4), (14, 28, 2), (16, 32, 2), (32, 32, 1))
assert tuple(g for g, _, _ in GRIDS) == GRID_SIDES
# Targets (ratios in one process): 14x14 images/s over 7x7's; the 16x16 layer's GFLOP/s over 7x7's.
GRID_IMAGES_TARGET = {14: 0.25}
GRID_LAYER_FLOPS_TARGET = {16: 0.8}
# Beside auto's path, the runner-up: where auto takes the fused path, the same path in one tile (the
# batch's products at once, as before tiles) and separable (auto's path before the fused one); fused
# beside stacked on the small grids.
ONE_TILE = ", one tile"
RUNNERS_UP = {"fused": ["fused" + ONE_TILE, "separable"], "stacked": ["fused"]}


def _model(preset: str, side: int, **overrides: Any) -> torch.nn.Module:
    cfg = make_config(preset=preset)
    return build_model(cfg.model, **{**cfg.model_overrides, "in_channels": 1, "image_size": side, **overrides})


def _step(model: torch.nn.Module, preset: str, batch: int, side: int, precision: str, device: str
          ) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 1, side, side, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    opt = make_optimizer(model, make_config(preset=preset))
    return training_step(model, x, y, opt, lambda: precision_autocast(device, precision))


def _layer_step(grid: int, impl: str, batch: int, precision: str, device: str
                ) -> tuple[Callable[[], None], SelfAttention2d]:
    sizes = make_config(preset=ATTENTION_PRESET).model_overrides
    torch.manual_seed(0)
    layer = SelfAttention2d(sizes["hidden"], heads=sizes["heads"], impl=impl, max_size=grid).to(device)
    x = torch.randn(batch, sizes["hidden"], grid, grid, device=device, requires_grad=True)
    grad = torch.randn(batch, sizes["hidden"], grid, grid, device=device)

    def step() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with precision_autocast(device, precision):
            y = layer(x)
        y.backward(grad.to(y.dtype))

    return step, layer


def grid_cases(cfg: BenchConfig, precision: str) -> list[dict[str, Any]]:
    """Every row's step, unmeasured: kind ("model" or "layer"), grid, name, impl, auto (auto's path), step."""
    batch, cases = cfg.preset_batch, []
    for grid, side, factor in GRIDS:
        if grid not in cfg.grids:
            continue
        torch.manual_seed(0)
        attention = _model(ATTENTION_PRESET, side, downsample=factor).to(cfg.device).train()
        auto = taken_impl(attention)
        impls = [auto] + RUNNERS_UP.get(auto, [])
        for impl in impls:
            path = impl.removesuffix(ONE_TILE)
            model = attention if impl == auto else set_impl(copy.deepcopy(attention), path)  # the same weights
            step = _step(model, ATTENTION_PRESET, batch, side, precision, cfg.device)
            cases.append({"kind": "model", "grid": grid, "input": side, "name": "sa-quadratic", "impl": impl,
                          "auto": impl == auto, "step": _in_one_tile(step) if path != impl else step})
        resnet = _model(RESNET_PRESET, side).to(cfg.device).train()
        cases.append({"kind": "model", "grid": grid, "input": side, "name": "resnet18 (width 16)", "impl": "-", "auto": False,
                      "step": _step(resnet, RESNET_PRESET, batch, side, precision, cfg.device)})
        for impl in impls:
            path = impl.removesuffix(ONE_TILE)
            step, layer = _layer_step(grid, path, batch, precision, cfg.device)
            cases.append({"kind": "layer", "grid": grid, "input": side, "name": "SelfAttention2d",
                          "impl": layer.resolved_impl((grid, grid)) + impl.removeprefix(path), "auto": impl == auto,
                          "step": _in_one_tile(step) if path != impl else step})
    return cases


def _in_one_tile(step: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        with fused_in_one_tile():
            step()
    return run


def bench_grid(cfg: BenchConfig) -> Section:
    """Training-step images/s and GFLOP/s of the attention preset at each token grid, against ResNet and 7x7."""
    sec = Section("grid", f"token grids: the attention preset's training step (and its layer) at 7x7 to 32x32 "
                          f"tokens, batch {cfg.preset_batch}",
                  ["kind", "tokens", "input", "model", "precision", "impl", "median", "min - max", "images/s",
                   "GFLOP/s", "vs 7x7", "GFLOP/s vs 7x7", "vs ResNet", "target"])
    for precision in cfg.precisions:
        progress(f"grid {precision}")
        cases = grid_cases(cfg, precision)
        steps = {f"{c['kind']} {c['grid']} {c['name']} {c['impl']}": c["step"] for c in cases}
        flops = {key: count_step_flops(step) for key, step in steps.items()}  # also the first warm-up run
        timings = time_variants(steps, warmup=cfg.warmup, repeats=cfg.repeats, device=cfg.device)
        rows = []
        for case, (key, t) in zip(cases, timings.items()):
            rate = None if flops[key] is None else flops[key] / t.median / 1e9
            rows.append({**{k: v for k, v in case.items() if k != "step"}, "precision": precision,
                         "batch": cfg.preset_batch, "seconds": t.samples, "median": t.median,
                         "images_per_s": cfg.preset_batch / t.median, "flops": flops[key], "gflops_per_s": rate})
        _add_ratios(rows)
        for r, t in zip(rows, timings.values()):
            sec.data.append(r)
            sec.rows.append([r["kind"], f"{r['grid']}x{r['grid']}", f"{r['input']}x{r['input']}", r["name"],
                             precision, r["impl"], *fmt_timing(t), f"{r['images_per_s']:.0f}",
                             _fmt(r["gflops_per_s"], ".1f"), _fmt(r.get("vs_7x7"), ".3f", "x"),
                             _fmt(r.get("flops_vs_7x7"), ".2f", "x"), _fmt(r.get("vs_resnet"), ".2f", "x"),
                             target_status(r.get("target_value"), r.get("target")) if r.get("target") else "-"])
    sec.notes.append(
        "one process, every row of a precision timed interleaved after warm-up; attention rows: "
        f"{ATTENTION_PRESET}'s model (AdamW) at the input size and space-to-depth factor of the grid, the path "
        "impl='auto' takes and the runner-up (fused in one tile and separable beside fused, fused beside stacked); "
        "ResNet: "
        f"{RESNET_PRESET}'s model (SGD) on the same input; layer rows: SelfAttention2d(96, heads=9) alone, forward + backward")
    sec.notes.append(
        "vs 7x7: images/s over the 7x7 row of the same kind (the preset); GFLOP/s vs 7x7: GFLOP/s over it; "
        "FLOPs: attnconv.flops.flop_counter over forward + backward. Targets: 14x14 model images/s >= "
        f"{GRID_IMAGES_TARGET[14]}x the 7x7 preset's; 16x16 layer GFLOP/s >= {GRID_LAYER_FLOPS_TARGET[16]}x the 7x7 "
        "layer's")
    return sec


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """vs_7x7, flops_vs_7x7 (against the first 7x7 row of the same kind), vs_resnet and the targets
    (on auto's rows)."""
    base = {kind: next((r for r in rows if r["kind"] == kind and r["grid"] == 7), None) for kind in ("model", "layer")}
    resnet = {r["grid"]: r for r in rows if r["name"].startswith("resnet")}
    for r in rows:
        if r["name"].startswith("resnet"):
            continue
        b = base[r["kind"]]
        if b is not None:
            r["vs_7x7"] = r["images_per_s"] / b["images_per_s"]
            if r["gflops_per_s"] and b["gflops_per_s"]:
                r["flops_vs_7x7"] = r["gflops_per_s"] / b["gflops_per_s"]
        if r["kind"] == "model" and r["grid"] in resnet:
            r["vs_resnet"] = r["images_per_s"] / resnet[r["grid"]]["images_per_s"]
        if r["auto"] and r["kind"] == "model" and r["grid"] in GRID_IMAGES_TARGET:
            r["target"], r["target_value"] = GRID_IMAGES_TARGET[r["grid"]], r.get("vs_7x7")
        if r["auto"] and r["kind"] == "layer" and r["grid"] in GRID_LAYER_FLOPS_TARGET:
            r["target"], r["target_value"] = GRID_LAYER_FLOPS_TARGET[r["grid"]], r.get("flops_vs_7x7")


def _fmt(v: float | None, spec: str, suffix: str = "") -> str:
    return "-" if v is None else f"{v:{spec}}{suffix}"
