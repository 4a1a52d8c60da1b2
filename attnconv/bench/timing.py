"""Timing: warm-up, interleaved repeats, medians, ratios, and the error against a float64 reference.

The variants' repeats are interleaved (A B, B A, A B, ...) so that a drifting machine
load hits them alike; a ratio is baseline median / variant median.
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attnconv.bench.config import BenchConfig


@dataclass
class Timing:
    """Seconds of repeated runs of one variant."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)


def synchronize(device: str) -> None:
    """Wait for queued device work (CUDA timings are meaningless without it)."""
    if device == "cuda":
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], device: str = "cpu", clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds one call of fn takes, device work included."""
    synchronize(device)
    start = clock()
    fn()
    synchronize(device)
    return clock() - start


def interleaved_order(names: Sequence[str], repeats: int) -> list[str]:
    """Run order A B, B A, A B, ...: each variant runs `repeats` times, alternating direction to cancel drift."""
    order: list[str] = []
    for r in range(repeats):
        order.extend(names if r % 2 == 0 else reversed(names))
    return order


def time_variants(
    variants: dict[str, Callable[[], Any]], *, warmup: int, repeats: int, device: str = "cpu",
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, Timing]:
    """Warm every variant up, then time them interleaved; one Timing per variant."""
    for _ in range(warmup):
        for fn in variants.values():
            fn()
    synchronize(device)
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for name in interleaved_order(list(variants), repeats):
        samples[name].append(time_call(variants[name], device, clock))
    return {name: Timing(s) for name, s in samples.items()}


def attempt(fn: Callable[[], Any]) -> str | None:
    """Run fn: None when it succeeds, else its error in one line (a failing variant is
    reported, and the other variants and cases still run)."""
    try:
        fn()
    except Exception as err:  # noqa: BLE001 - reported in the results, never silenced
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else ""
        return f"{type(err).__name__}: {first}"
    return None


def speedup(baseline: Timing, other: Timing) -> float:
    """baseline median / other median: > 1 means `other` is faster."""
    return baseline.median / other.median


def rel_diff(a: Tensor, ref: Tensor) -> float:
    """max |a - ref| / max |ref| (0 when both are zero), computed in float64."""
    a, ref = a.detach().double(), ref.detach().double()
    scale = ref.abs().max().item()
    err = (a - ref).abs().max().item()
    return err / scale if scale > 0 else err


def target_status(value: float | None, target: float | None) -> str:
    """'>= 2.5x met' / '>= 2.5x missed' / '' when there is no target."""
    if target is None or value is None:
        return ""
    return f">= {target:g}x {'met' if value >= target else 'missed'}"


def autocast(cfg: BenchConfig) -> contextlib.AbstractContextManager:
    """bf16 autocast on the config's device under --amp, else nothing."""
    return precision_autocast(cfg.device, "bf16" if cfg.amp else "fp32")


def precision_autocast(device: str, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on the device for precision "bf16", nothing for "fp32"."""
    return torch.autocast(device, dtype=torch.bfloat16) if precision == "bf16" else contextlib.nullcontext()


def progress(message: str) -> None:
    """One line on stderr: which case is running (the tables go to stdout)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)
