"""torch.profiler on one run of a case that misses its target: where its time goes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from attnconv.bench.results import fmt_seconds
from attnconv.bench.timing import synchronize

_MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_dot_product")
_MATMUL_KERNELS = ("gemm", "matmul", "cutlass", "flash", "sm80", "sm90", "attention")


def profile_step(fn: Callable[[], Any], device: str, top: int = 5) -> dict[str, Any]:
    """One run of fn under torch.profiler: the ops with the most self time, and the share
    spent in matrix products (CUDA: kernels; CPU: aten ops)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        fn()
        synchronize(device)
    attr = "self_device_time_total" if cuda else "self_cpu_time_total"
    times = [(e.key, getattr(e, attr)) for e in prof.key_averages() if getattr(e, attr) > 0]
    if cuda:
        times = [(k, t) for k, t in times if not k.startswith("aten::")]  # device kernels only
    total = sum(t for _, t in times) or 1.0
    is_mm = (lambda k: any(s in k.lower() for s in _MATMUL_KERNELS)) if cuda else \
        (lambda k: k.startswith(_MATMUL_OPS))
    ranked = sorted(times, key=lambda kt: -kt[1])[:top]
    return {"seconds": total / 1e6, "matmul_share": sum(t for k, t in times if is_mm(k)) / total,
            "top": [(k, t / total) for k, t in ranked]}


def describe_profile(name: str, p: dict[str, Any]) -> str:
    """'separable: 1.23 s profiled, 64% in matrix products; top: aten::addmm 50%, ...'."""
    top = ", ".join(f"{k} {share:.0%}" for k, share in p["top"])
    return f"{name}: {fmt_seconds(p['seconds'])} of op time, {p['matmul_share']:.0%} in matrix products; top: {top}"
