"""One comparison (a "case"): dense against the fast paths, on copies of one module with the same parameters.

Shared by the layer and model benchmarks: build the variants, check each one's output
against the dense formulation in float64, pick the batch that fits in memory, run each
variant once alone (peak memory, FLOPs), then time them interleaved.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from attnconv.attention import SelfAttention2d
from attnconv.bench.config import BenchConfig
from attnconv.bench.estimates import fit_batch
from attnconv.bench.flex import flex_unavailable
from attnconv.bench.peakmem import PeakMemory
from attnconv.bench.profiling import describe_profile, profile_step
from attnconv.bench.results import fmt_bytes
from attnconv.bench.timing import attempt, autocast, rel_diff, speedup, target_status, time_variants
from attnconv.flops import flop_counter
from attnconv.training.step import train_step as train_step_of_the_loop

PEAK_NOTE = ("peak mem: during the variant's first run, the peak above the level before it (CPU: resident memory "
             "of this process after returning freed heap pages to the OS; CUDA: torch.cuda.max_memory_allocated)")
FLOP_NOTE = ("FLOPs dense/variant: the ratio of the FLOPs torch.utils.flop_counter counts in one run (matrix "
             "products; copies, softmax and other elementwise work not counted): the speedup if time followed FLOPs")
COMPILE_NOTE = "+compile: torch.compile'd copy; its peak mem is that of the first run, which compiles"


def comparison_notes(compiled: bool) -> list[str]:
    """The notes every dense-vs-fast section ends with (FLOPs, peak memory, and compile when it ran)."""
    return [FLOP_NOTE, PEAK_NOTE] + ([COMPILE_NOTE] if compiled else [])


def set_impl(module: nn.Module, impl: str) -> nn.Module:
    """Set `impl` on every SelfAttention2d in module (parameters are shared by all impls)."""
    for m in module.modules():
        if isinstance(m, SelfAttention2d):
            m.impl = impl
    return module


def _first_layer(module: nn.Module) -> SelfAttention2d:
    return next(m for m in module.modules() if isinstance(m, SelfAttention2d))


def _grid(module: nn.Module, layer: SelfAttention2d) -> tuple[int, int]:
    """The grid the layer runs on: a classifier's token grid, else the layer's max_size."""
    config = getattr(module, "config", None)
    side = getattr(config, "grid", None) or layer.max_size
    return side, side


def auto_impl(module: nn.Module) -> str:
    """The impl that impl='auto' runs in module's (first) attention layer ("separable", "stacked", "fused",
    "sdpa", "dense"), on the grid it runs on."""
    layer = _first_layer(module)
    saved = layer.impl
    layer.impl = "auto"
    name = layer.resolved_impl(_grid(module, layer))
    layer.impl = saved
    return name


def taken_impl(module: nn.Module) -> str:
    """The impl module's (first) attention layer runs as its impl is set, on the grid it runs on."""
    layer = _first_layer(module)
    return layer.resolved_impl(_grid(module, layer))


def fast_impls(module: nn.Module) -> list[str]:
    """Every impl other than dense that module's attention layers can run: separable (separable encodings),
    stacked (shared values), fused (both), sdpa (content attention; for position-only layers it is not a
    fast one)."""
    layer = _first_layer(module)
    valid = {"separable": layer.separable, "stacked": layer.stackable, "fused": layer.separable and layer.stackable,
             "sdpa": not layer.position_only}
    return [name for name, ok in valid.items() if ok]


def variant_modules(base: nn.Module, cfg: BenchConfig, content: bool, flex: Callable[[nn.Module], nn.Module],
                    every_impl: bool = False) -> dict[str, nn.Module]:
    """Copies of `base` with identical parameters: dense, the fast path (auto's; with `every_impl`, every fast
    path), [flex], [compiled]."""
    names = fast_impls(base) if every_impl else [auto_impl(base)]
    variants = {"dense": set_impl(copy.deepcopy(base), "dense")}
    variants.update({name: set_impl(copy.deepcopy(base), name) for name in names if name != "dense"})
    if content and flex_unavailable(cfg.device) is None:
        variants["flex"] = flex(copy.deepcopy(base))
    if cfg.compile:
        for name in [n for n in variants if n != "dense"]:
            variants[f"{name}+compile"] = torch.compile(copy.deepcopy(variants[name]))
    return variants


def train_step(model: nn.Module, x: Tensor, y: Tensor, cfg: BenchConfig) -> Callable[[], None]:
    """One SGD step (the paper's optimizer; lr does not change the cost)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    return training_step(model, x, y, opt, lambda: autocast(cfg))


def training_step(model: nn.Module, x: Tensor, y: Tensor, opt: torch.optim.Optimizer,
                  autocast_context: Callable[[], Any]) -> Callable[[], None]:
    """The training loop's own step (`attnconv.training.step.train_step`), as a no-argument callable to time."""
    return lambda: train_step_of_the_loop(model, opt, x, y, autocast_context())


def output_errors(variants: dict[str, nn.Module], base: nn.Module, x: Tensor, fits: bool = True
                  ) -> dict[str, float | None]:
    """Each variant's output on x (float32, no autocast) against `base` run densely in float64."""
    if not fits:
        return {name: None for name in variants}
    reference = set_impl(copy.deepcopy(base), "dense").double()
    reference.train(next(iter(variants.values())).training)
    errors: dict[str, float | None] = {}
    with torch.no_grad():
        ref = reference(x.double())
        for name, m in variants.items():
            out: list[Tensor] = []
            failed = attempt(lambda m=m, out=out: out.append(m(x)))  # a failing variant fails again, and is reported, when timed
            errors[name] = None if failed else rel_diff(out[0], ref)
    return errors


def plan_batch(label: str, batch: int, est: dict[str, Callable[[int], int]], fast: str, budget: int
               ) -> tuple[int, list[dict[str, Any]], list[str]]:
    """The batch to compare at: `batch`, or where dense does not fit, the largest halved batch where it
    does (0: not even the fast path fits). Returns it with the rows and notes that say so."""
    if est["dense"](batch) <= budget:
        return batch, [], []
    reason = f"needs ~{fmt_bytes(est['dense'](batch))} (estimate) > budget {fmt_bytes(budget)}"
    rows = [{"variant": "dense", "batch": batch, "skipped": reason}]
    notes = [f"{label}: dense at batch {batch} skipped: {reason}"]
    smaller = fit_batch(lambda b: max(est["dense"](b), est[fast](b)), batch, budget)
    if smaller:
        notes.append(f"{label}: compared at batch {smaller}, the largest halved batch where dense fits")
        return smaller, rows, notes
    notes.append(f"{label}: dense does not fit even at batch 1; {fast} alone")
    alone = fit_batch(est[fast], batch, budget)
    if not alone:
        reason = f"needs ~{fmt_bytes(est[fast](1))} at batch 1 (estimate) > budget {fmt_bytes(budget)}"
        rows.append({"variant": fast, "batch": batch, "skipped": reason})
        notes.append(f"{label}: {fast} skipped: {reason}")
    elif alone != batch:
        notes.append(f"{label}: {fast} at batch {alone}, the largest halved batch where it fits")
    return alone, rows, notes


def first_runs(steps: dict[str, Callable[[], Any]], cfg: BenchConfig, count_flops: bool
               ) -> tuple[dict[str, int | None], dict[str, int | None], dict[str, str]]:
    """Each variant's first (warm-up) run, alone: its peak memory and, if asked, its FLOPs
    (attnconv.flops.flop_counter: matrix products and attention kernels; not for compiled variants, nor for
    FlexAttention, whose higher-order op does not run under a dispatch mode). Returns peaks, FLOPs, and the errors
    of the variants that failed."""
    peaks: dict[str, int | None] = {}
    flops: dict[str, int | None] = {}
    failures: dict[str, str] = {}
    for name, step in steps.items():
        counter = flop_counter() if count_flops and "+compile" not in name and not name.startswith("flex") else None
        with PeakMemory(cfg.device) as pm, counter or contextlib.nullcontext():
            error = attempt(step)
        if error:
            failures[name] = error
            continue
        peaks[name] = pm.bytes
        flops[name] = int(counter.get_total_flops()) if counter is not None else None
    return peaks, flops, failures


def _more_warmup(cfg: BenchConfig) -> int:
    """Warm-up runs after the first one (compiled variants may recompile on their second call)."""
    return max(cfg.warmup - 1, 0) + (1 if cfg.compile else 0)


def best_speedup(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The non-dense row with the largest dense/variant ratio (the target applies to the fastest path)."""
    timed = [r for r in rows if r["variant"] != "dense" and r.get("speedup") is not None]
    return max(timed, key=lambda r: r["speedup"], default=None)


def _explain_miss(label: str, steps: dict[str, Callable[[], Any]], best: dict[str, Any] | None,
                  target: float | None, cfg: BenchConfig) -> list[str]:
    """Where the fastest path misses its target, profile one run of it and of dense (torch.profiler)."""
    if not cfg.profile or best is None or target is None or best["speedup"] >= target:
        return []
    parts = [describe_profile(name, profile_step(steps[name], cfg.device)) for name in ("dense", best["variant"])]
    return [f"{label}: {best['speedup']:.2f}x misses {target:g}x; torch.profiler, one run each: " + "; ".join(parts)]


def run_case(label: str, steps: dict[str, Callable[[], Any]], cfg: BenchConfig, batch: int,
             errors: dict[str, float | None], target: float | None
             ) -> tuple[list[dict[str, Any]], list[str]]:
    """Time the variants (first run alone for peak memory and FLOPs, then interleaved), one row each.

    A row's `flop_ratio` (dense FLOPs / its FLOPs) is the speedup the variant would have if
    time followed the counted FLOPs: the bound its time ratio is read against."""
    peaks, flops, failures = first_runs(steps, cfg, count_flops=True)
    rows = [{"variant": name, "batch": batch, "failed": error} for name, error in failures.items()]
    notes = [f"{label}: {name} failed: {error}" for name, error in failures.items()]
    steps = {name: step for name, step in steps.items() if name not in failures}
    timings = time_variants(steps, warmup=_more_warmup(cfg), repeats=cfg.repeats, device=cfg.device)
    for name, t in timings.items():
        row = {"variant": name, "batch": batch, "seconds": t.samples, "median": t.median,
               "speedup": speedup(timings["dense"], t) if "dense" in timings else None,
               "error_vs_fp64": errors[name], "peak_bytes": peaks[name]}
        row["flops"] = flops.get(name.removesuffix("+compile"))
        dense_flops = flops.get("dense")
        row["flop_ratio"] = dense_flops / row["flops"] if dense_flops and row["flops"] else None
        rows.append(row)
    best = best_speedup(rows)
    if best is not None and target is not None:
        best["target"] = target
    return rows, notes + _explain_miss(label, steps, best, target, cfg)


def ratio_cells(r: dict[str, Any]) -> list[str]:
    """Time ratio, target status, FLOP ratio."""
    s, f = r.get("speedup"), r.get("flop_ratio")
    return ["-" if s is None else f"{s:.2f}x", target_status(s, r.get("target")), "-" if f is None else f"{f:.2f}x"]
