"""Dtypes of the attention computation: scores and softmax in at least float32, matmuls in autocast's dtype."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

from attnconv.limits import autocast_on


@contextmanager
def float32_scores() -> Iterator[None]:
    """Disable autocast so scores and softmax stay in float32 (fp16 softmax overflows to NaN).

    Plain nested `with torch.autocast(...)` blocks (no ExitStack), which torch.compile traces
    without a graph break.
    """
    with torch.autocast("cpu", enabled=False):
        if torch.cuda.is_available():
            with torch.autocast("cuda", enabled=False):
                yield
        else:
            yield


def matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype a matmul on x runs in: autocast's where it is on for x's device, else x's own."""
    device = x.device.type
    if autocast_on(device) and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.get_autocast_dtype(device)
    return x.dtype


def at_least_float32(t: Tensor) -> Tensor:
    """t in float32 if it is narrower (float16, bfloat16); float32 and float64 unchanged."""
    return t if t.dtype in (torch.float32, torch.float64) else t.float()
