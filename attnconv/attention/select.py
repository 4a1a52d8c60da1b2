"""Which computation path a layer runs: the one place that decides what impl="auto" means."""

from __future__ import annotations

IMPLS = ("auto", "dense", "separable", "stacked", "fused", "sdpa")
# auto: the stacked path up to T = H * W <= STACKED_RATIO * (H + W) tokens (its FLOPs over the
# separable path's are T / (H + W)); above, the separable path's fewer FLOPs win, run as the
# fused path (the output projection between the factors) where the values are shared.
STACKED_RATIO = 4


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
) -> str:
    """The path a layer with `impl` runs on an H x W grid `size`: `impl` itself, or for "auto":

    with shared values, stacked where it is the cheaper path (crossovers in benchmarks/RESULTS.md,
    "Speed on the CPU"): position-only layers whose encoding is not separable, or on grids of at most
    STACKED_RATIO * (H + W) tokens; content layers on the CPU (where SDPA with a positional bias runs
    its math kernel, which copies the shared values once per head); fused on the larger grids of
    separable encodings. Otherwise separable, sdpa for content, dense.

    `shared_dropout`: training with one dropout mask for the batch. SDPA draws a mask per sample,
    so "sdpa" then runs the dense path. `per_sample_dropout`: training with a mask per sample,
    which the fused path's batch-wide factors cannot hold: "fused" then runs the separable path.
    """
    if impl == "auto":
        impl = _auto(size, shared_values=shared_values, position_only=position_only, separable=separable, on_cpu=on_cpu)
    if impl == "sdpa" and shared_dropout:
        return "dense"
    if impl == "fused" and per_sample_dropout:
        return "separable"
    return impl


def _auto(size: tuple[int, int], *, shared_values: bool, position_only: bool, separable: bool, on_cpu: bool) -> str:
    H, W = size
    if shared_values:
        if position_only and (not separable or H * W <= STACKED_RATIO * (H + W)):
            return "stacked"
        if not position_only and on_cpu:
            return "stacked"
        if position_only and separable:
            return "fused"
    if not position_only:
        return "sdpa"
    return "separable" if separable else "dense"
