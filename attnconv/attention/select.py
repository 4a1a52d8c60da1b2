"""Which computation path a layer runs: the one place that decides what impl="auto" means."""

from __future__ import annotations

import logging

import torch

from attnconv.errors import AttnconvError
from attnconv.limits import positive_ints

IMPLS = ("auto", "dense", "separable", "stacked", "fused", "sdpa")
# auto: the stacked path up to T = H * W <= STACKED_RATIO * (H + W) tokens (its FLOPs over the
# separable path's are T / (H + W)); above, the separable path's fewer FLOPs win, run as the
# fused path (the output projection between the factors) where the values are shared.
STACKED_RATIO = 4

_log = logging.getLogger(__name__)


def resolve_impl(
    impl: str,
    size: tuple[int, int],
    *,
    shared_values: bool,
    position_only: bool,
    separable: bool,
    on_cpu: bool,
    shared_dropout: bool = False,
    per_sample_dropout: bool = False,
    explain: bool = False,
) -> str | tuple[str, str]:
    """The path a layer with `impl` runs on an H x W grid `size`: `impl` itself, or for "auto":

    with shared values, stacked where it is the cheaper path (crossovers in benchmarks/RESULTS.md,
    "Speed on the CPU"): position-only layers whose encoding is not separable, or on grids of at most
    STACKED_RATIO * (H + W) tokens; content layers on the CPU (where SDPA with a positional bias runs
    its math kernel, which copies the shared values once per head); fused on the larger grids of
    separable encodings. Otherwise separable, sdpa for content, dense.

    `shared_dropout`: training with one dropout mask for the batch. SDPA draws a mask per sample,
    so "sdpa" then runs the dense path. `per_sample_dropout`: training with a mask per sample,
    which the fused path's batch-wide factors cannot hold: "fused" then runs the separable path.

    `explain=True` returns (path, reason), the reason one line saying why that path runs; the
    choice is also logged at DEBUG level (logger "attnconv.attention.select"). An impl not in IMPLS, or a size
    that is not two positive integers, is one AttnconvError (a layer's forward, whose inputs are checked, calls
    `choose_impl` directly).
    """
    if not isinstance(impl, str) or impl not in IMPLS:
        raise AttnconvError(f"unknown impl {impl!r}; choose one of: {', '.join(IMPLS)}")
    size = positive_ints(size, 2, "size", "the input grid (H, W)")
    return choose_impl(impl, size, shared_values=shared_values, position_only=position_only, separable=separable,
                       on_cpu=on_cpu, shared_dropout=shared_dropout, per_sample_dropout=per_sample_dropout,
                       explain=explain)


def choose_impl(impl: str, size: tuple[int, int], *, shared_values: bool, position_only: bool, separable: bool,
                on_cpu: bool, shared_dropout: bool = False, per_sample_dropout: bool = False,
                explain: bool = False) -> str | tuple[str, str]:
    """`resolve_impl` of an impl and size already checked: what a layer's forward calls, once per call."""
    if impl == "auto":
        chosen, why = _auto(size, shared_values=shared_values, position_only=position_only, separable=separable,
                            on_cpu=on_cpu)
    else:
        chosen, why = impl, f"impl={impl!r} asked for"
    if chosen == "sdpa" and shared_dropout:
        chosen, why = "dense", why + "; sdpa draws a dropout mask per sample, the layer wants one for the batch: dense"
    if chosen == "fused" and per_sample_dropout:
        chosen, why = "separable", why + "; the fused factors hold one dropout mask for the batch: separable"
    if not torch.compiler.is_compiling() and _log.isEnabledFor(logging.DEBUG):  # no graph break
        _log.debug("%s on %dx%d: %s", chosen, size[0], size[1], why)
    return (chosen, why) if explain else chosen


def _auto(size: tuple[int, int], *, shared_values: bool, position_only: bool, separable: bool,
          on_cpu: bool) -> tuple[str, str]:
    H, W = size
    small = H * W <= STACKED_RATIO * (H + W)
    grid = f"{H}x{W} = {H * W} tokens {'<=' if small else '>'} {STACKED_RATIO} * (H + W)"
    if shared_values:
        if position_only and not separable:
            return "stacked", "auto: shared values and a non-separable encoding: stacked (dense FLOPs in large matmuls)"
        if position_only and small:
            return "stacked", f"auto: shared values, {grid}: stacked is cheaper than the per-axis factors"
        if not position_only and on_cpu:
            return "stacked", "auto: content attention with shared values on the CPU: stacked (SDPA with a bias " \
                              "would copy the values per head)"
        if position_only and separable:
            return "fused", f"auto: shared values, a separable encoding, {grid}: fused (per-axis factors with the " \
                            "output projection between them)"
    if not position_only:
        return "sdpa", "auto: content attention: sdpa"
    if separable:
        return "separable", "auto: per-head values and a separable encoding: separable (per-axis factors)"
    return "dense", "auto: per-head values and a non-separable encoding: dense"
