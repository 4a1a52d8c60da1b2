"""The layer benchmark: SelfAttention2d alone, forward + backward, dense vs the fast paths, at every side."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn as nn
from torch import Tensor

from attnconv.attention import SelfAttention2d
from attnconv.bench.cases import (
    auto_impl,
    comparison_notes,
    fast_impls,
    output_errors,
    plan_batch,
    ratio_cells,
    run_case,
    variant_modules,
)
from attnconv.bench.config import LAYER_ENCODINGS, LAYER_TARGETS, BenchConfig
from attnconv.bench.estimates import estimate_layer_bytes
from attnconv.bench.flex import FlexContentAttention, flex_unavailable
from attnconv.bench.results import Section, fmt_bytes, fmt_err, fmt_timing
from attnconv.bench.timing import Timing, autocast, progress


def _layer_step(layer: nn.Module, x: Tensor, grad: Tensor, cfg: BenchConfig) -> Callable[[], None]:
    def step() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with autocast(cfg):
            y = layer(x)
        y.backward(grad.to(y.dtype))

    return step


def _layer_case(cfg: BenchConfig, encoding: str, side: int, budget: int, target: float | None
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """One layer comparison: results per variant (raw), and notes."""
    C, heads = cfg.channels, cfg.heads
    label = f"{encoding} {side}x{side}"
    torch.manual_seed(0)
    base = SelfAttention2d(C, C, heads=heads, encoding=encoding, impl="dense", max_size=side).to(cfg.device)
    fast = auto_impl(base)
    est = {impl: (lambda b, impl=impl: estimate_layer_bytes(impl, encoding, b, side, C, heads))
           for impl in ("dense", *fast_impls(base))}
    batch, rows, notes = plan_batch(label, cfg.layer_batch, est, fast, budget)
    if batch == 0:
        return rows, notes
    variants = variant_modules(base, cfg, encoding == "learned-content", FlexContentAttention, every_impl=True)
    for name in [n for n in variants if n in est and est[n](batch) > budget]:
        variants.pop(name)
        if name != "dense":
            reason = f"needs ~{fmt_bytes(est[name](batch))} (estimate) > budget {fmt_bytes(budget)}"
            rows.append({"variant": name, "batch": batch, "skipped": reason})
            notes.append(f"{label}: {name} at batch {batch} skipped: {reason}")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, C, side, side, generator=gen).to(cfg.device).requires_grad_()
    grad = torch.randn(batch, C, side, side, generator=gen).to(cfg.device)
    errors = output_errors(variants, base, x.detach()[: cfg.check_batch],
                           fits=2 * est["dense"](cfg.check_batch) <= budget)
    steps = {name: _layer_step(m, x, grad, cfg) for name, m in variants.items()}
    timed, why = run_case(label, steps, cfg, batch, errors, target)
    for r in timed:
        r["auto"] = r["variant"] == fast
    return rows + timed, notes + why


def bench_layers(cfg: BenchConfig, budget: int) -> Section:
    """SelfAttention2d alone, forward + backward, dense vs the fast paths, at every side."""
    sec = Section(
        "layer",
        f"Attention layer alone, forward + backward ({cfg.heads} heads, {cfg.channels} -> {cfg.channels} channels)",
        ["encoding", "tokens", "batch", "variant", "median", "min - max", "dense/variant", "target",
         "FLOPs dense/variant", "err vs fp64", "peak mem"],
    )
    for encoding in LAYER_ENCODINGS:
        for side in cfg.sides:
            progress(f"layer {encoding} {side}x{side}")
            rows, notes = _layer_case(cfg, encoding, side, budget, LAYER_TARGETS.get(encoding, {}).get(side))
            sec.notes.extend(notes)
            for r in rows:
                r.update(encoding=encoding, side=side)
                sec.data.append(r)
                sec.rows.append(_layer_row(r))
    flex_reason = flex_unavailable(cfg.device)
    if flex_reason:
        sec.notes.append(f"learned-content: no FlexAttention variant: {flex_reason}")
    sec.notes.append("err vs fp64: max |out - ref| / max |ref| against the dense path in float64, on "
                     f"{cfg.check_batch} sample(s) of the same input, float32 without autocast")
    sec.notes.append("(auto): the path impl='auto' takes at that side; every fast path the layer has is timed")
    sec.notes.extend(comparison_notes(cfg.compile))
    return sec


def _layer_row(r: dict[str, Any]) -> list[str]:
    head = [r["encoding"], f"{r['side']}x{r['side']}", str(r["batch"]), r["variant"] + (" (auto)" if r.get("auto") else "")]
    if "skipped" in r or "failed" in r:
        return head + ["skipped (see notes)" if "skipped" in r else "FAILED (see notes)"] + [""] * 6
    t = Timing(r["seconds"])
    return head + [*fmt_timing(t), *ratio_cells(r), fmt_err(r["error_vs_fp64"]), fmt_bytes(r["peak_bytes"])]
