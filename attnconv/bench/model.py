"""The model benchmark: one training step of the paper's classifiers, dense vs fast.

The CIFAR-shape models (16x16 tokens after the 2x2 downsampling) and the
full-resolution variant (32x32 tokens, no downsampling).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from attnconv.bench.cases import (
    auto_impl,
    best_speedup,
    comparison_notes,
    output_errors,
    plan_batch,
    ratio_cells,
    run_case,
    train_step,
    variant_modules,
)
from attnconv.bench.config import EPOCH_IMAGES, MODEL_TARGETS, PAPER_EPOCHS, BenchConfig
from attnconv.bench.estimates import estimate_step_bytes
from attnconv.bench.flex import flex_model
from attnconv.bench.profiling import profile_step
from attnconv.bench.results import Section, fmt_bytes, fmt_err, fmt_timing
from attnconv.bench.timing import Timing, progress
from attnconv.models import build_model


@dataclass
class ModelCase:
    label: str  # "cifar" or "full-res" (the target's key)
    name: str
    overrides: dict[str, Any]
    batch: int


def model_cases(cfg: BenchConfig) -> list[ModelCase]:
    """The paper's CIFAR-shape models (batch 100, 16x16 tokens) and the full-resolution variant."""
    o = cfg.model_overrides
    return [
        ModelCase("cifar", "sa-quadratic", dict(o), cfg.model_batch),
        ModelCase("cifar", "sa-learned", dict(o), cfg.model_batch),
        ModelCase("cifar", "sa-learned-content", dict(o), cfg.model_batch),
        ModelCase("full-res", "sa-quadratic", {**o, "downsample": 1}, cfg.full_res_batch),
    ]


def _model_case(cfg: BenchConfig, case: ModelCase, budget: int) -> tuple[list[dict[str, Any]], list[str], int]:
    """One model comparison: results per variant (raw), notes, and the token grid side."""
    torch.manual_seed(0)
    base = build_model(case.name, impl="dense", **case.overrides).to(cfg.device)
    fast = auto_impl(base)
    grid = base.config.grid
    label = f"{case.name} {grid}x{grid}"
    progress(f"model {label} tokens")
    est = {impl: (lambda b, impl=impl: estimate_step_bytes(impl, base, b)) for impl in ("dense", fast)}
    batch, rows, notes = plan_batch(label, case.batch, est, fast, budget)
    if batch == 0:
        return rows, notes, grid
    variants = variant_modules(base, cfg, base.config.encoding == "learned-content", flex_model)
    if est["dense"](batch) > budget:
        variants.pop("dense")
    if "flex" in variants and base.config.attn_dropout > 0:
        notes.append(f"{label}: the flex variant has no attention dropout (FlexAttention has none)")
    gen = torch.Generator().manual_seed(1)
    c, s = base.config.in_channels, base.config.image_size
    x = torch.randn(batch, c, s, s, generator=gen).to(cfg.device)
    y = torch.randint(0, base.config.num_classes, (batch,), generator=gen).to(cfg.device)
    for m in variants.values():
        m.eval()
    errors = output_errors(variants, base, x[: cfg.check_batch], fits=2 * est["dense"](cfg.check_batch) <= budget)
    for m in variants.values():
        m.train()  # dropout on, as in training
    steps = {name: train_step(m, x, y, cfg) for name, m in variants.items()}
    target = MODEL_TARGETS.get(case.label) if case.name == "sa-quadratic" else None
    timed, why = run_case(label, steps, cfg, batch, errors, target)
    if cfg.profile and case.name == "sa-quadratic" and case.label == "cifar":
        best = best_speedup(timed) or next((r for r in timed if r["variant"] != "dense"), None)
        if best is not None:  # kept for the utilization section's explanation
            best["profile"] = profile_step(steps[best["variant"]], cfg.device)
    for r in timed:
        if "median" in r:
            r["images_per_s"] = r["batch"] / r["median"]
    return rows + timed, notes + why, grid


def bench_models(cfg: BenchConfig, budget: int) -> Section:
    """One training step of the paper's models, dense vs fast."""
    sec = Section("model", "Training step (forward, loss, backward, SGD) of the paper's models",
                  ["model", "tokens", "batch", "variant", "median", "min - max", "dense/variant", "target",
                   "FLOPs dense/variant", "images/s", f"{PAPER_EPOCHS} epochs", "err vs fp64", "peak mem"])
    for case in model_cases(cfg):
        rows, notes, grid = _model_case(cfg, case, budget)
        sec.notes.extend(notes)
        for r in rows:
            r.update(model=case.name, case=case.label, grid=grid, overrides=case.overrides)
            sec.data.append(r)
            sec.rows.append(_model_row(r))
    if cfg.model_overrides:
        sec.notes.append(f"model overrides in this mode: {cfg.model_overrides} (the paper: hidden 400, 9 heads, 6 layers)")
    sec.notes.append(f"{PAPER_EPOCHS} epochs: projected from images/s for {PAPER_EPOCHS} x {EPOCH_IMAGES} images "
                     "(the paper's CIFAR-10 schedule), training steps only")
    sec.notes.append("err vs fp64: the logits in eval mode against the dense model in float64; timing in train mode")
    sec.notes.extend(comparison_notes(cfg.compile))
    return sec


def _model_row(r: dict[str, Any]) -> list[str]:
    head = [r["model"], f"{r['grid']}x{r['grid']}", str(r["batch"]), r["variant"]]
    if "skipped" in r or "failed" in r:
        return head + ["skipped (see notes)" if "skipped" in r else "FAILED (see notes)"] + [""] * 8
    epochs_s = PAPER_EPOCHS * EPOCH_IMAGES / r["images_per_s"]
    return head + [*fmt_timing(Timing(r["seconds"])), *ratio_cells(r), f"{r['images_per_s']:.1f}",
                   f"{epochs_s / 3600:.1f} h", fmt_err(r["error_vs_fp64"]), fmt_bytes(r["peak_bytes"])]
