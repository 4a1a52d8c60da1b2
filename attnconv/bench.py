"""Benchmarks: the fast attention paths against the dense baseline, measured in one run.

Every comparison is made in one process, on the same inputs, after warm-up, with
the median of repeated runs; the variants' repeats are interleaved (A B B A ...)
so that a drifting machine load hits them alike, and the reported ratio is
dense median / variant median. Before timing, every variant's output is compared
with a float64 dense reference (relative error: max |a - b| / max |b|), which is
the evidence that the fast paths compute the same function to float32 rounding.

Sections (`run_benchmarks(config)` runs those in `config.only`, in this order; util
whenever matmul and model both run):

- matmul: square matrix product, GFLOP/s, the machine's reference rate.
- layer:  SelfAttention2d alone (quadratic, learned, learned + content), forward +
          backward, dense vs the fast path ("auto": separable or SDPA; on CUDA also
          FlexAttention for the content layer; with --compile also compiled).
- model:  one training step (forward, cross-entropy, backward, SGD) of the paper's
          CIFAR-shape classifiers, and of the full-resolution (32x32-token) variant.
- util:   model FLOPs (torch.utils.flop_counter, forward + backward) per second,
          divided by the matmul rate.
- data:   the tensor-side input pipeline (attnconv.data.iterate_batches with crop +
          flip) in images/s, against the model's training images/s.
- memory: peak memory of one training step at 32x32 and 64x64 tokens, each case in
          a fresh subprocess (CPU: peak resident set, VmHWM; CUDA: max_memory_allocated).

Cases that would not fit in memory are not run: their memory is estimated first
(`estimate_layer_bytes`, `estimate_step_bytes`) and compared with a budget; they
are reported as skipped, with the estimate. Where dense does not fit at the
requested batch, the comparison is also run at the largest halved batch where it
fits, and says so. Nothing is reported that was not measured in the run.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from attnconv.attention import SelfAttention2d
from attnconv.errors import AttnconvError
from attnconv.models import build_model

SECTIONS = ("matmul", "layer", "model", "data", "memory")  # what --only selects; "util" follows matmul + model
LAYER_ENCODINGS = ("quadratic", "learned", "learned-content")

# Targets from the issue (2-core CPU): dense / fast time ratio, utilization, data / model speed.
LAYER_TARGETS = {"quadratic": {16: 1.3, 32: 2.5, 64: 6.0}}
MODEL_TARGETS = {"cifar": 1.2, "full-res": 2.5}
UTILIZATION_TARGET = 0.5
DATA_TARGET = 10.0

EPOCH_IMAGES = 50_000  # CIFAR-10 training set
PAPER_EPOCHS = 300


# ---------------------------------------------------------------------------- configuration


@dataclass
class BenchConfig:
    """What to run and at which sizes (defaults: the issue's full sizes)."""

    mode: str = "full"  # "full", "quick" or "tiny" (the smoke test's)
    only: tuple[str, ...] = SECTIONS
    device: str = "cpu"
    amp: bool = False  # bf16 autocast around forward passes
    compile: bool = False  # add torch.compile'd variants
    threads: int | None = None
    repeats: int = 5
    warmup: int = 1  # untimed runs per variant; the first also measures peak memory and FLOPs
    # layer
    sides: tuple[int, ...] = (8, 16, 32, 64)
    layer_batch: int = 32
    channels: int = 400
    heads: int = 9
    # model: the paper's CIFAR shape; `model_overrides` shrinks it in quick mode
    model_batch: int = 100
    full_res_batch: int = 100
    model_overrides: dict[str, Any] = field(default_factory=dict)
    # matmul, data, memory
    matmul_size: int = 4096
    data_images: int = 5000
    data_batch: int = 100
    memory_sides: tuple[int, ...] = (32, 64)
    memory_batch: int = 8
    memory_budget: int | None = None  # bytes; None: default_memory_budget(device)
    check_batch: int = 1  # samples used for the float64 equality checks
    profile: bool = True  # torch.profiler on the cases that miss a target (one extra run each)

    def validate(self) -> None:
        unknown = [s for s in self.only if s not in SECTIONS]
        if unknown:
            raise AttnconvError(f"--only: unknown benchmark {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
        for name in ("repeats", "layer_batch", "model_batch", "full_res_batch", "matmul_size", "data_images",
                     "data_batch", "memory_batch", "channels", "heads", "check_batch"):
            if getattr(self, name) < 1:
                raise AttnconvError(f"bench option {name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 1:
            raise AttnconvError(f"bench option warmup must be >= 1, got {self.warmup}")
        if not self.sides or min(self.sides) < 1:
            raise AttnconvError(f"--sides must be positive integers, got {self.sides}")
        if self.threads is not None and self.threads < 1:
            raise AttnconvError(f"--threads must be >= 1, got {self.threads}")
        if self.device not in ("cpu", "cuda"):
            raise AttnconvError(f"--device {self.device!r}: choose cpu or cuda")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise AttnconvError("--device cuda: CUDA is not available here; run on a machine with a GPU or use --device cpu")


def quick_config(**changes: Any) -> BenchConfig:
    """Reduced sizes for `--quick` (a few minutes on 2 busy cores): the paper's width, fewer layers."""
    cfg = BenchConfig(
        mode="quick", repeats=3, sides=(8, 16, 32), layer_batch=2, model_batch=8, full_res_batch=2,
        model_overrides={"layers": 1}, matmul_size=2048, data_images=1000, memory_sides=(32,), memory_batch=2,
        profile=False,
    )
    return replace(cfg, **changes)


def tiny_config(**changes: Any) -> BenchConfig:
    """Toy sizes that run every code path in seconds (the smoke test)."""
    cfg = BenchConfig(
        mode="tiny", repeats=2, sides=(4, 8), layer_batch=2, channels=16, heads=4, model_batch=4, full_res_batch=2,
        model_overrides={"layers": 1, "hidden": 16, "heads": 4, "intermediate": 32}, matmul_size=128,
        data_images=200, data_batch=50, memory_sides=(8,), memory_batch=2, profile=False,
    )
    return replace(cfg, **changes)


def default_memory_budget(device: str) -> int:
    """Bytes a case may use: 60% of total RAM (CPU, at most 80% of what is available now), or of GPU memory."""
    if device == "cuda":
        return int(0.6 * torch.cuda.get_device_properties(0).total_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = _proc_kb("/proc/meminfo", "MemAvailable") or total
    return int(min(0.6 * total, 0.8 * available))


def _proc_kb(path: str, key: str) -> int | None:
    """A "<key>: N kB" field of a /proc file, in bytes (None where /proc is unavailable)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


# ---------------------------------------------------------------------------- timing


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


def first_runs(steps: dict[str, Callable[[], Any]], cfg: BenchConfig, count_flops: bool
               ) -> tuple[dict[str, int | None], dict[str, int | None], dict[str, str]]:
    """Each variant's first (warm-up) run, alone: its peak memory and, if asked, its FLOPs
    (torch.utils.flop_counter: matrix products and attention kernels; not for compiled variants).
    Returns peaks, FLOPs, and the errors of the variants that failed."""
    peaks: dict[str, int | None] = {}
    flops: dict[str, int | None] = {}
    failures: dict[str, str] = {}
    for name, step in steps.items():
        counter = _flop_counter() if count_flops and "+compile" not in name else None
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


def _flop_counter():
    from torch.utils.flop_counter import FlopCounterMode

    return FlopCounterMode(display=False, custom_mapping=_sdpa_cpu_formulas())


def _sdpa_cpu_formulas() -> dict[Any, Any]:
    """flop_counter has formulas for the CUDA SDPA kernels but not the CPU flash kernel: same cost formula."""
    from torch.utils import flop_counter

    mapping = {}
    for op_name, formula_name in (("_scaled_dot_product_flash_attention_for_cpu", "sdpa_flop"),
                                  ("_scaled_dot_product_flash_attention_for_cpu_backward", "sdpa_backward_flop")):
        op = getattr(torch.ops.aten, op_name, None)
        formula = getattr(flop_counter, formula_name, None)
        if op is not None and formula is not None and op not in flop_counter.flop_registry:
            mapping[op] = formula
    return mapping


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


# ---------------------------------------------------------------------------- memory


class PeakMemory:
    """Peak memory of a block above the level at its start.

    CUDA: torch.cuda.max_memory_allocated. CPU: the process's peak resident set
    (VmHWM, reset through /proc/self/clear_refs after returning freed heap pages to
    the OS; Linux only, else `None`), which counts everything the process touches,
    torch's allocations included.
    """

    def __init__(self, device: str):
        self.device = device
        self.bytes: int | None = None

    def __enter__(self) -> PeakMemory:
        if self.device == "cuda":
            synchronize("cuda")
            torch.cuda.reset_peak_memory_stats()
            self._start = torch.cuda.memory_allocated()
        else:
            _release_free_heap()
            self._start = _rss_bytes("VmHWM") if _reset_peak_rss() else None  # the reset sets VmHWM = VmRSS
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            synchronize("cuda")
            self.bytes = torch.cuda.max_memory_allocated() - self._start
        elif self._start is not None:
            peak = _rss_bytes("VmHWM")
            self.bytes = peak - self._start if peak is not None else None


def _release_free_heap() -> None:
    """Give freed heap pages back to the OS (glibc malloc_trim), so that the next peak of the
    resident set counts the memory a run touches, not memory earlier cases left cached."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
        return True
    except OSError:
        return False


def _rss_bytes(key: str) -> int | None:
    return _proc_kb("/proc/self/status", key)


def estimate_layer_bytes(impl: str, encoding: str, batch: int, side: int, channels: int, heads: int) -> int:
    """Rough upper estimate of the memory of one SelfAttention2d forward + backward (float32).

    Counts the big tensors alive at the peak: P = batch x heads x T x T probabilities
    (dense: the broadcast product copies the shared probabilities per sample, and the
    backward makes one more), V = batch x heads x T x C per-head values, X = batch x T x C.
    """
    T = side * side
    P, V, X = batch * heads * T * T, batch * heads * T * channels, batch * T * channels
    content = encoding == "learned-content"
    if impl == "dense":
        n = (5 * P if content else 2 * P + 3 * heads * T * T) + 6 * V
    elif impl == "sdpa":
        n = 4 * P + 4 * V  # the bias is (B, heads, T, T); CPU falls back to the math kernel when it needs a grad
    else:  # separable, flex: a few (B, heads, T, C) intermediates and their grads (measured: ~8.5 V)
        n = 9 * V
    if content:
        n += 6 * V  # queries and keys, (B, heads, T, key_dim = C), and their grads
    return 4 * (n + 4 * X)


def estimate_step_bytes(impl: str, model: nn.Module, batch: int) -> int:
    """Rough upper estimate of one training step's memory (float32): activations kept by
    every layer for the backward, one layer's backward transient, weights + grads + momentum."""
    cfg = model.config
    T, h, C = cfg.grid**2, cfg.heads, cfg.hidden
    P, V, X = batch * h * T * T, batch * h * T * C, batch * T * C
    content = cfg.encoding == "learned-content"
    if impl in ("dense", "sdpa"):
        kept, transient = (3 * P if content else 1.5 * P) + 3 * V, (3 * P if content else 2 * P) + V
    else:
        kept, transient = 3 * V, 2 * V
    if content:
        kept += 2 * V  # queries and keys
    kept += 8 * X + 4 * batch * T * cfg.intermediate
    params = sum(p.numel() for p in model.parameters())
    return int(4 * (cfg.layers * kept + transient + 3 * params))


def fit_batch(estimate: Callable[[int], int], batch: int, budget: int) -> int:
    """The largest of batch, batch/2, batch/4, ... whose estimate fits the budget (0: none does)."""
    while batch >= 1:
        if estimate(batch) <= budget:
            return batch
        batch //= 2
    return 0


# ---------------------------------------------------------------------------- results


@dataclass
class Section:
    """One benchmark's table: formatted rows for people, `data` (raw numbers) for --json."""

    key: str
    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    data: list[dict[str, Any]] = field(default_factory=list)
    seconds: float | None = None  # wall time of the whole section

    @property
    def failures(self) -> list[dict[str, Any]]:
        """Rows of variants or cases that raised an error (not those skipped for memory)."""
        return [r for r in self.data if r.get("failed")]


@dataclass
class Report:
    command: str
    machine: dict[str, Any]
    date: str
    config: dict[str, Any]
    sections: list[Section] = field(default_factory=list)

    def section(self, key: str) -> Section | None:
        return next((s for s in self.sections if s.key == key), None)

    @property
    def failures(self) -> list[dict[str, Any]]:
        return [r for s in self.sections for r in s.failures]


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s >= 1:
        return f"{s:.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.1f} ms"
    return f"{s * 1e6:.0f} us"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def fmt_timing(t: Timing) -> tuple[str, str]:
    return fmt_seconds(t.median), f"{fmt_seconds(t.min)} - {fmt_seconds(t.max)}"


def format_table(columns: list[str], rows: list[list[str]], markdown: bool = False) -> str:
    """A plain aligned table, or a Markdown one."""
    if markdown:
        lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
        return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(c)), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(columns)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([line(columns), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def format_section(section: Section, markdown: bool = False) -> str:
    took = f" ({fmt_seconds(section.seconds)})" if section.seconds is not None else ""
    head = f"### {section.title}" if markdown else f"== {section.title}{took} =="
    parts = [head, "", format_table(section.columns, section.rows, markdown)] if markdown else \
        [head, format_table(section.columns, section.rows)]
    if section.notes:
        parts.append("")
        parts.extend(f"- {n}" if markdown else f"  note: {n}" for n in section.notes)
    return "\n".join(parts) + "\n"


def format_report(report: Report, markdown: bool = False) -> str:
    """The whole report: header (command, machine, date), then every section."""
    m = report.machine
    machine = (f"{m['cpu']}, {m['cores']} cores, {m['threads']} torch threads, {fmt_bytes(m['ram'])} RAM, "
               f"torch {m['torch']}, Python {m['python']}" + (f", GPU {m['gpu']}" if m.get("gpu") else "")
               + f"; load average at start {m['load']}")
    if markdown:
        head = (f"## `{report.command}` ({report.date})\n\n- command: `{report.command}`\n- machine: {machine}\n"
                f"- date: {report.date}\n- mode: {report.config['mode']}"
                + (" (reduced sizes: targets apply to the full sizes)" if report.config["mode"] != "full" else "")
                + "\n")
    else:
        head = f"{report.command}\nmachine: {machine}\ndate: {report.date}\n"
    return "\n".join([head, *(format_section(s, markdown) for s in report.sections)])


def machine_info(device: str) -> dict[str, Any]:
    """CPU model, cores, RAM, torch version and threads, GPU name, load average."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        m = re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        cpu = m.group(1).strip() if m else cpu
    info = {
        "cpu": cpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(),
        "ram": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "torch": torch.__version__,
        "python": platform.python_version(),
        "load": " ".join(f"{v:.2f}" for v in os.getloadavg()) if hasattr(os, "getloadavg") else "n/a",
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _autocast(cfg: BenchConfig) -> contextlib.AbstractContextManager:
    return torch.autocast(cfg.device, dtype=torch.bfloat16) if cfg.amp else contextlib.nullcontext()


# ---------------------------------------------------------------------------- matmul


def bench_matmul(cfg: BenchConfig) -> Section:
    """Square matrix product: the machine's reference FLOP rate (float32; bf16 too under --amp)."""
    n = cfg.matmul_size
    sec = Section("matmul", f"Matrix multiply ({n}x{n} @ {n}x{n}), the reference rate",
                  ["dtype", "median", "min - max", "GFLOP/s"])
    dtypes = [torch.float32] + ([torch.bfloat16] if cfg.amp else [])
    for dtype in dtypes:
        gen = torch.Generator(device=cfg.device).manual_seed(0)
        a = torch.randn(n, n, device=cfg.device, generator=gen).to(dtype)
        b = torch.randn(n, n, device=cfg.device, generator=gen).to(dtype)
        t = time_variants({"mm": lambda: a @ b}, warmup=max(cfg.warmup, 1), repeats=cfg.repeats,
                          device=cfg.device)["mm"]
        rate = 2 * n**3 / t.median
        sec.rows.append([str(dtype).removeprefix("torch."), *fmt_timing(t), f"{rate / 1e9:.1f}"])
        sec.data.append({"dtype": str(dtype), "n": n, "seconds": t.samples, "flops_per_s": rate})
    return sec


def matmul_rate(report: Report, amp: bool) -> float | None:
    sec = report.section("matmul")
    if sec is None:
        return None
    want = "torch.bfloat16" if amp else "torch.float32"
    return next((d["flops_per_s"] for d in sec.data if d["dtype"] == want), None)


# ---------------------------------------------------------------------------- FlexAttention


def flex_unavailable(device: str, needs_grad: bool = True) -> str | None:
    """Why FlexAttention cannot run here, or None when it can."""
    try:
        from torch.nn.attention.flex_attention import flex_attention  # noqa: F401
    except ImportError as err:
        return f"FlexAttention not importable ({err})"
    if device == "cpu" and needs_grad:
        return "FlexAttention has no backward on CPU in this torch; it runs on CUDA"
    return None


_COMPILED_FLEX: Callable | None = None


def _flex_fn(device: str) -> Callable:
    """flex_attention, compiled on CUDA (eager FlexAttention is a slow reference implementation)."""
    global _COMPILED_FLEX
    from torch.nn.attention.flex_attention import flex_attention

    if device != "cuda":
        return flex_attention
    if _COMPILED_FLEX is None:
        _COMPILED_FLEX = torch.compile(flex_attention)
    return _COMPILED_FLEX


def flex_content_tokens(layer: SelfAttention2d, x: Tensor) -> Tensor:
    """A learned + content layer through FlexAttention: (B, H, W, C_in) -> (B, H, W, C_out).

    The layer's own parameters, its function (the dense path's, without attention
    dropout): score = q.k / sqrt(D_k) + q_row . r_row(delta_1) + q_col . r_col(delta_2),
    with the positional term added by a score_mod from per-query shift scores
    (B, heads, T, 2S - 1), so no (T x T) tensor is formed.
    """
    B, H, W, _ = x.shape
    T, heads, dk = H * W, layer.heads, layer.key_dim
    enc = layer.encoding
    q = layer.query(x).view(B, T, heads, dk).transpose(1, 2)  # (B, heads, T, D_k)
    k = layer.key(x).view(B, T, heads, dk).transpose(1, 2)
    row_scores = (q[..., : enc.row_dim] @ enc.row_embeddings.T).float()  # (B, heads, T, 2S-1), by row shift
    col_scores = (q[..., enc.row_dim :] @ enc.col_embeddings.T).float()  # (B, heads, T, 2S-1), by column shift
    S = enc.max_size

    def score_mod(score, b, h, q_idx, kv_idx):
        d_row = kv_idx // W - q_idx // W + S - 1
        d_col = kv_idx % W - q_idx % W + S - 1
        return score + row_scores[b, h, q_idx, d_row] + col_scores[b, h, q_idx, d_col]

    if layer.value_mode == "shared":
        v = x.reshape(B, 1, T, layer.in_channels).expand(B, heads, T, layer.in_channels)
    else:
        v = layer.value(x).view(B, T, heads, layer.head_dim).transpose(1, 2)
    out = _flex_fn(x.device.type)(q, k, v.to(q.dtype), score_mod=score_mod, scale=1.0 / math.sqrt(dk))
    return layer.out(out.transpose(1, 2).reshape(B, H, W, heads * layer.head_dim))


class FlexContentAttention(nn.Module):
    """Wraps a learned + content SelfAttention2d to run through FlexAttention (same parameters)."""

    def __init__(self, layer: SelfAttention2d):
        super().__init__()
        if layer.position_only:
            raise AttnconvError("FlexContentAttention wraps learned + content layers only")
        self.layer = layer

    def forward_tokens(self, x: Tensor) -> Tensor:
        return flex_content_tokens(self.layer, x)

    def forward(self, x: Tensor) -> Tensor:  # (B, C, H, W) like SelfAttention2d
        return self.forward_tokens(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


# ---------------------------------------------------------------------------- attention layer


def _set_impl(module: nn.Module, impl: str) -> nn.Module:
    """Set `impl` on every SelfAttention2d in module (parameters are shared by all impls)."""
    for m in module.modules():
        if isinstance(m, SelfAttention2d):
            m.impl = impl
    return module


def _variant_modules(base: nn.Module, cfg: BenchConfig, content: bool, flex: Callable[[nn.Module], nn.Module]
                     ) -> dict[str, nn.Module]:
    """Copies of `base` with identical parameters: dense, the fast path, [flex], [compiled]."""
    fast_name = _resolved(base)
    variants = {"dense": _set_impl(copy.deepcopy(base), "dense"), fast_name: _set_impl(copy.deepcopy(base), "auto")}
    if content and flex_unavailable(cfg.device) is None:
        variants["flex"] = flex(copy.deepcopy(base))
    if cfg.compile:
        for name in [n for n in variants if n != "dense"]:
            variants[f"{name}+compile"] = torch.compile(copy.deepcopy(variants[name]))
    return variants


def _resolved(module: nn.Module) -> str:
    """The path impl='auto' takes in module's (first) attention layer."""
    layer = next(m for m in module.modules() if isinstance(m, SelfAttention2d))
    saved = layer.impl
    layer.impl = "auto"
    name = layer.resolved_impl()
    layer.impl = saved
    return name


def _layer_step(layer: nn.Module, x: Tensor, grad: Tensor, cfg: BenchConfig) -> Callable[[], None]:
    def step() -> None:
        x.grad = None
        layer.zero_grad(set_to_none=True)
        with _autocast(cfg):
            y = layer(x)
        y.backward(grad.to(y.dtype))

    return step


def _output_errors(variants: dict[str, nn.Module], base: nn.Module, x: Tensor, fits: bool = True
                   ) -> dict[str, float | None]:
    """Each variant's output on x (float32, no autocast) against `base` run densely in float64."""
    if not fits:
        return {name: None for name in variants}
    reference = _set_impl(copy.deepcopy(base), "dense").double()
    reference.train(next(iter(variants.values())).training)
    errors: dict[str, float | None] = {}
    with torch.no_grad():
        ref = reference(x.double())
        for name, m in variants.items():
            out: list[Tensor] = []
            failed = attempt(lambda: out.append(m(x)))  # a failing variant fails again, and is reported, when timed
            errors[name] = None if failed else rel_diff(out[0], ref)
    return errors


def _plan_batch(label: str, batch: int, est: dict[str, Callable[[int], int]], fast: str, budget: int
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


def _explain_miss(label: str, steps: dict[str, Callable[[], Any]], best: dict[str, Any] | None,
                  target: float | None, cfg: BenchConfig) -> list[str]:
    """Where the fastest path misses its target, profile one run of it and of dense (torch.profiler)."""
    if not cfg.profile or best is None or target is None or best["speedup"] >= target:
        return []
    parts = [describe_profile(name, profile_step(steps[name], cfg.device)) for name in ("dense", best["variant"])]
    return [f"{label}: {best['speedup']:.2f}x misses {target:g}x; torch.profiler, one run each: " + "; ".join(parts)]


def _run_case(label: str, steps: dict[str, Callable[[], Any]], cfg: BenchConfig, batch: int,
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
    best = _best_speedup(rows)
    if best is not None and target is not None:
        best["target"] = target
    return rows, notes + _explain_miss(label, steps, best, target, cfg)


def _layer_case(cfg: BenchConfig, encoding: str, side: int, budget: int, target: float | None
                ) -> tuple[list[dict[str, Any]], list[str]]:
    """One layer comparison: results per variant (raw), and notes."""
    C, heads = cfg.channels, cfg.heads
    label = f"{encoding} {side}x{side}"
    torch.manual_seed(0)
    base = SelfAttention2d(C, C, heads=heads, encoding=encoding, impl="dense", max_size=side).to(cfg.device)
    fast = _resolved(base)
    est = {impl: (lambda b, impl=impl: estimate_layer_bytes(impl, encoding, b, side, C, heads))
           for impl in ("dense", fast)}
    batch, rows, notes = _plan_batch(label, cfg.layer_batch, est, fast, budget)
    if batch == 0:
        return rows, notes
    variants = _variant_modules(base, cfg, encoding == "learned-content", FlexContentAttention)
    if est["dense"](batch) > budget:
        variants.pop("dense")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, C, side, side, generator=gen).to(cfg.device).requires_grad_()
    grad = torch.randn(batch, C, side, side, generator=gen).to(cfg.device)
    errors = _output_errors(variants, base, x.detach()[: cfg.check_batch],
                            fits=2 * est["dense"](cfg.check_batch) <= budget)
    steps = {name: _layer_step(m, x, grad, cfg) for name, m in variants.items()}
    timed, why = _run_case(label, steps, cfg, batch, errors, target)
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
            _progress(f"layer {encoding} {side}x{side}")
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
    sec.notes.append(_FLOP_NOTE)
    sec.notes.append(_PEAK_NOTE)
    if cfg.compile:
        sec.notes.append(_COMPILE_NOTE)
    return sec


_PEAK_NOTE = ("peak mem: during the variant's first run, the peak above the level before it (CPU: resident memory "
              "of this process after returning freed heap pages to the OS; CUDA: torch.cuda.max_memory_allocated)")
_FLOP_NOTE = ("FLOPs dense/variant: the ratio of the FLOPs torch.utils.flop_counter counts in one run (matrix "
              "products; copies, softmax and other elementwise work not counted): the speedup if time followed FLOPs")
_COMPILE_NOTE = "+compile: torch.compile'd copy; its peak mem is that of the first run, which compiles"


def _best_speedup(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The non-dense row with the largest dense/variant ratio (the target applies to the fastest path)."""
    timed = [r for r in rows if r["variant"] != "dense" and r.get("speedup") is not None]
    return max(timed, key=lambda r: r["speedup"], default=None)


def _ratio_cells(r: dict[str, Any]) -> list[str]:
    """Time ratio, target status, FLOP ratio."""
    s, f = r.get("speedup"), r.get("flop_ratio")
    return ["-" if s is None else f"{s:.2f}x", target_status(s, r.get("target")), "-" if f is None else f"{f:.2f}x"]


def _layer_row(r: dict[str, Any]) -> list[str]:
    head = [r["encoding"], f"{r['side']}x{r['side']}", str(r["batch"]), r["variant"]]
    if "skipped" in r or "failed" in r:
        return head + ["skipped (see notes)" if "skipped" in r else "FAILED (see notes)"] + [""] * 6
    t = Timing(r["seconds"])
    return head + [*fmt_timing(t), *_ratio_cells(r), _fmt_err(r["error_vs_fp64"]), fmt_bytes(r["peak_bytes"])]


def _fmt_err(e: float | None) -> str:
    return "-" if e is None else f"{e:.1e}"


# ---------------------------------------------------------------------------- training step


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


def _train_step(model: nn.Module, x: Tensor, y: Tensor, cfg: BenchConfig) -> Callable[[], None]:
    """One SGD step (the paper's optimizer; lr does not change the cost)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)

    def step() -> None:
        with _autocast(cfg):
            logits = model(x)
        loss = F.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def _flex_model(model: nn.Module) -> nn.Module:
    for block in model.layers:
        block.attention = FlexContentAttention(block.attention)
    return model


def _model_case(cfg: BenchConfig, case: ModelCase, budget: int) -> tuple[list[dict[str, Any]], list[str], int]:
    """One model comparison: results per variant (raw), notes, and the token grid side."""
    torch.manual_seed(0)
    base = build_model(case.name, impl="dense", **case.overrides).to(cfg.device)
    fast = _resolved(base)
    grid = base.config.grid
    label = f"{case.name} {grid}x{grid}"
    _progress(f"model {label} tokens")
    est = {impl: (lambda b, impl=impl: estimate_step_bytes(impl, base, b)) for impl in ("dense", fast)}
    batch, rows, notes = _plan_batch(label, case.batch, est, fast, budget)
    if batch == 0:
        return rows, notes, grid
    variants = _variant_modules(base, cfg, base.config.encoding == "learned-content", _flex_model)
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
    errors = _output_errors(variants, base, x[: cfg.check_batch], fits=2 * est["dense"](cfg.check_batch) <= budget)
    for m in variants.values():
        m.train()  # dropout on, as in training
    steps = {name: _train_step(m, x, y, cfg) for name, m in variants.items()}
    target = MODEL_TARGETS.get(case.label) if case.name == "sa-quadratic" else None
    timed, why = _run_case(label, steps, cfg, batch, errors, target)
    if cfg.profile and case.name == "sa-quadratic" and case.label == "cifar":
        best = _best_speedup(timed) or next((r for r in timed if r["variant"] != "dense"), None)
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
    sec.notes.append(_FLOP_NOTE)
    sec.notes.append(_PEAK_NOTE)
    if cfg.compile:
        sec.notes.append(_COMPILE_NOTE)
    return sec


def _model_row(r: dict[str, Any]) -> list[str]:
    head = [r["model"], f"{r['grid']}x{r['grid']}", str(r["batch"]), r["variant"]]
    if "skipped" in r or "failed" in r:
        return head + ["skipped (see notes)" if "skipped" in r else "FAILED (see notes)"] + [""] * 8
    epochs_s = PAPER_EPOCHS * EPOCH_IMAGES / r["images_per_s"]
    return head + [*fmt_timing(Timing(r["seconds"])), *_ratio_cells(r), f"{r['images_per_s']:.1f}",
                   f"{epochs_s / 3600:.1f} h", _fmt_err(r["error_vs_fp64"]), fmt_bytes(r["peak_bytes"])]


# ---------------------------------------------------------------------------- utilization


def bench_utilization(report: Report, cfg: BenchConfig) -> Section:
    """Model FLOP/s over the matmul FLOP/s measured in this run."""
    sec = Section("util", "Utilization: model FLOP/s / matrix-multiply FLOP/s (same run)",
                  ["model", "tokens", "batch", "variant", "FLOPs/step", "GFLOP/s", "matmul GFLOP/s",
                   "utilization", "target"])
    rate = matmul_rate(report, cfg.amp)
    models = report.section("model")
    if rate is None or models is None:
        sec.notes.append("needs the matmul and model benchmarks in the same run (--only matmul,model)")
        return sec
    for r in models.data:
        if "median" not in r or r.get("flops") is None:
            continue
        achieved = r["flops"] / r["median"]
        util = achieved / rate
        target = UTILIZATION_TARGET if (r["model"] == "sa-quadratic" and r["case"] == "cifar"
                                        and r["variant"] != "dense") else None
        status = "" if target is None else f">= {target:.0%} {'met' if util >= target else 'missed'}"
        sec.rows.append([r["model"], f"{r['grid']}x{r['grid']}", str(r["batch"]), r["variant"], f"{r['flops']:.3g}",
                         f"{achieved / 1e9:.1f}", f"{rate / 1e9:.1f}", f"{util:.0%}", status])
        sec.data.append({"model": r["model"], "grid": r["grid"], "variant": r["variant"], "flops": r["flops"],
                         "flops_per_s": achieved, "matmul_flops_per_s": rate, "utilization": util, "target": target})
        if target is not None and util < target and "profile" in r:
            sec.notes.append(f"{r['model']} {r['grid']}x{r['grid']}: {util:.0%} misses {target:.0%}; torch.profiler, "
                             "one step: " + describe_profile(r["variant"], r["profile"]))
    sec.notes.append("FLOPs: torch.utils.flop_counter over forward + backward of one step (matrix products and "
                     "attention kernels, 2 per multiply-add; elementwise ops, softmax and normalization not counted)")
    return sec


# ---------------------------------------------------------------------------- data pipeline


def bench_data(report: Report, cfg: BenchConfig) -> Section:
    """attnconv.data's batches (crop + flip + normalize) over an in-memory synthetic CIFAR-shape set."""
    sec = Section("data", "Data pipeline (batching, random crop + flip, normalization) vs the model",
                  ["pipeline", "images", "batch", "median epoch", "min - max", "images/s",
                   "model images/s", "data/model", "target"])
    try:
        from attnconv import data as D

        info = D.dataset_info("cifar10")
        loader = D.iterate_batches
    except (ImportError, AttributeError) as err:
        sec.notes.append(f"attnconv.data is not usable here ({err}); skipped")
        return sec
    gen = torch.Generator().manual_seed(0)
    n = cfg.data_images
    images = torch.randint(0, 256, (n, info.channels, info.size, info.size), dtype=torch.uint8, generator=gen)
    imageset = D.ImageSet(images, torch.randint(0, info.num_classes, (n,), generator=gen))
    if cfg.device == "cuda":
        imageset = imageset.to("cuda")
    epoch = iter(range(10**9))

    def one_epoch() -> int:
        seen = 0
        for xb, _ in loader(imageset, info, cfg.data_batch, seed=0, epoch=next(epoch), train=True, augment=True,
                            device=cfg.device):
            seen += len(xb)
        return seen

    _progress("data pipeline")
    counts: list[int] = []
    error = attempt(lambda: counts.append(one_epoch()))  # the warm-up epoch
    if error:
        sec.data.append({"failed": error})
        sec.notes.append(f"iterate_batches failed: {error}")
        return sec
    images_per_epoch = counts[0]
    t = time_variants({"data": one_epoch}, warmup=max(cfg.warmup - 1, 0), repeats=cfg.repeats,
                      device=cfg.device)["data"]
    rate = images_per_epoch / t.median
    model_rate = _model_images_per_s(report)
    ratio = rate / model_rate if model_rate else None
    sec.rows.append([f"iterate_batches (augment, {cfg.device})", str(images_per_epoch), str(cfg.data_batch),
                     *fmt_timing(t), f"{rate:.0f}", f"{model_rate:.1f}" if model_rate else "-",
                     f"{ratio:.1f}x" if ratio else "-", target_status(ratio, DATA_TARGET)])
    sec.data.append({"images": images_per_epoch, "seconds": t.samples, "images_per_s": rate,
                     "model_images_per_s": model_rate, "ratio": ratio, "target": DATA_TARGET})
    sec.notes.append("synthetic uint8 images of CIFAR-10's shape held in memory (no files); model images/s: "
                     "the fastest sa-quadratic CIFAR-shape training step of this run" if model_rate else
                     "model images/s: run the model benchmark in the same run to get the ratio")
    return sec


def _model_images_per_s(report: Report) -> float | None:
    sec = report.section("model")
    if sec is None:
        return None
    rates = [r["images_per_s"] for r in sec.data if r["model"] == "sa-quadratic" and r["case"] == "cifar"
             and "images_per_s" in r and r["variant"] != "dense"]
    return max(rates, default=None)


# ---------------------------------------------------------------------------- memory


def memory_spec(cfg: BenchConfig, side: int, impl: str) -> dict[str, Any]:
    """What one memory case runs: a training step of sa-quadratic at side x side tokens (no downsampling)."""
    overrides = {**cfg.model_overrides, "downsample": 1, "image_size": side}
    return {"model": "sa-quadratic", "overrides": overrides, "batch": cfg.memory_batch, "impl": impl,
            "device": cfg.device, "amp": cfg.amp, "threads": torch.get_num_threads()}


def measure_step_memory(spec: dict[str, Any], limit: int | None = None) -> dict[str, Any]:
    """Build the spec's model and run one training step, measuring the step's peak memory.

    Meant to run in a fresh process (`python -m attnconv.bench SPEC_JSON`); `limit`
    caps the address space so a case that would not fit fails instead of swapping.
    """
    torch.set_num_threads(spec["threads"])
    torch.manual_seed(0)
    model = _set_impl(build_model(spec["model"], **spec["overrides"]), spec["impl"]).to(spec["device"])
    cfg = BenchConfig(device=spec["device"], amp=spec["amp"])
    c, s, b = model.config.in_channels, model.config.image_size, spec["batch"]
    x = torch.randn(b, c, s, s, device=spec["device"])
    y = torch.randint(0, model.config.num_classes, (b,), device=spec["device"])
    step = _train_step(model, x, y, cfg)
    if limit is not None and spec["device"] == "cpu":
        vm = _rss_bytes("VmSize") or 0
        resource.setrlimit(resource.RLIMIT_AS, (vm + limit, resource.RLIM_INFINITY))
    # warm-up: one-time allocations (momentum buffers, kernels' workspaces) are not the step's
    error = attempt(step)
    seconds: list[float] = []
    with PeakMemory(spec["device"]) as pm:
        error = error or attempt(lambda: seconds.append(time_call(step, spec["device"])))
    if error:
        return _memory_failure(error)
    peak = _rss_bytes("VmHWM") if spec["device"] == "cpu" else torch.cuda.max_memory_allocated()
    return {"step_bytes": pm.bytes, "peak_bytes": peak, "seconds": seconds[0]}


def _memory_failure(error: str) -> dict[str, str]:
    """An allocation failure means the case did not fit (skipped); anything else failed."""
    if re.search(r"can't allocate memory|out of memory|MemoryError|bad_alloc|SIGKILL", error, re.I):
        return {"skipped": f"did not fit: {error}"}
    return {"failed": error}


def _run_memory_child(spec: dict[str, Any], limit: int) -> dict[str, Any]:
    root = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "attnconv.bench", json.dumps({"spec": spec, "limit": limit})],
                          capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == -9:
        return _memory_failure("the subprocess was killed by SIGKILL (the kernel's out-of-memory killer?)")
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return _memory_failure(f"subprocess exit {proc.returncode}: {tail[:300]}")
    return json.loads(lines[-1])


def bench_memory(cfg: BenchConfig, budget: int) -> Section:
    """Peak memory of one training step at each token side, dense vs fast, each in a fresh process."""
    sec = Section("memory", f"Peak memory of one training step (sa-quadratic, no downsampling, batch "
                  f"{cfg.memory_batch})", ["tokens", "variant", "step peak", "process peak", "estimate",
                                          "dense/variant", "step time"])
    for side in cfg.memory_sides:
        _progress(f"memory {side}x{side} tokens")
        results = {}
        for impl in ("dense", "auto"):
            spec = memory_spec(cfg, side, impl)
            model = build_model(spec["model"], **spec["overrides"])
            name = "dense" if impl == "dense" else _resolved(model)
            estimate = estimate_step_bytes(name, model, cfg.memory_batch)
            if estimate > budget:
                r = {"skipped": f"needs ~{fmt_bytes(estimate)} (estimate) > budget {fmt_bytes(budget)}"}
            elif cfg.device == "cuda":
                r = measure_step_memory(spec)
            else:
                r = _run_memory_child(spec, budget)
            results[name] = {**r, "estimate_bytes": estimate, "side": side, "variant": name, "batch": cfg.memory_batch}
        dense = results.get("dense", {}).get("step_bytes")
        for name, r in results.items():
            sec.data.append(r)
            if "skipped" in r or "failed" in r:
                sec.rows.append([f"{side}x{side}", name, "skipped (see notes)" if "skipped" in r else
                                 "FAILED (see notes)", "", fmt_bytes(r["estimate_bytes"]), "", ""])
                sec.notes.append(f"{side}x{side} {name}: " + (f"skipped: {r['skipped']}" if "skipped" in r
                                                               else f"failed: {r['failed']}"))
                continue
            ratio = f"{dense / r['step_bytes']:.2f}x" if dense and r["step_bytes"] else "-"
            sec.rows.append([f"{side}x{side}", name, fmt_bytes(r["step_bytes"]), fmt_bytes(r["peak_bytes"]),
                             fmt_bytes(r["estimate_bytes"]), ratio, fmt_seconds(r["seconds"])])
    where = "GPU memory allocated (torch.cuda.max_memory_allocated)" if cfg.device == "cuda" else \
        "resident memory (VmHWM) of a fresh process per case"
    sec.notes.append(f"step peak: peak {where} during the second training step, above the level before it "
                     "(model, inputs, optimizer state); process peak: the absolute peak")
    if cfg.model_overrides:
        sec.notes.append(f"model overrides in this mode: {cfg.model_overrides}")
    sec.notes.append(f"memory budget for a case: {fmt_bytes(budget)}; estimate: estimate_step_bytes (used only to "
                     "skip cases that would not fit)")
    return sec


# ---------------------------------------------------------------------------- driver


def run_benchmarks(cfg: BenchConfig, command: str = "attnconv bench",
                   on_section: Callable[[Section], None] | None = None) -> Report:
    """Run the sections in `cfg.only` (in SECTIONS order); `on_section` sees each as it finishes."""
    cfg.validate()
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    budget = cfg.memory_budget or default_memory_budget(cfg.device)
    report = Report(command=command, machine=machine_info(cfg.device),
                    date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                    config={**asdict(cfg), "memory_budget": budget})
    runners: dict[str, Callable[[], Section]] = {
        "matmul": lambda: bench_matmul(cfg),
        "layer": lambda: bench_layers(cfg, budget),
        "model": lambda: bench_models(cfg, budget),
        "util": lambda: bench_utilization(report, cfg),
        "data": lambda: bench_data(report, cfg),
        "memory": lambda: bench_memory(cfg, budget),
    }
    wanted = set(cfg.only) | ({"util"} if {"matmul", "model"} <= set(cfg.only) else set())
    for key in runners:
        if key in wanted:
            start = time.perf_counter()
            section = runners[key]()
            section.seconds = time.perf_counter() - start
            report.sections.append(section)
            if on_section is not None:
                on_section(section)
    return report


def report_json(report: Report) -> str:
    return json.dumps(asdict(report), indent=2, default=str)


def _child_main(argv: list[str]) -> int:
    """`python -m attnconv.bench '{"spec": ..., "limit": ...}'`: one memory case, JSON on stdout."""
    request = json.loads(argv[0])
    print(json.dumps(measure_step_memory(request["spec"], request.get("limit"))))
    return 0


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1:]))
