"""Peak memory of a block of code, and the memory a case may use.

CPU numbers come from /proc (Linux): the process's peak resident set (VmHWM), reset
through /proc/self/clear_refs; CUDA numbers from torch.cuda.max_memory_allocated.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import re
from pathlib import Path

import torch

from attnconv.bench.timing import synchronize


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
            self._start = rss_bytes("VmHWM") if _reset_peak_rss() else None  # the reset sets VmHWM = VmRSS
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device == "cuda":
            synchronize("cuda")
            self.bytes = torch.cuda.max_memory_allocated() - self._start
        elif self._start is not None:
            peak = rss_bytes("VmHWM")
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


def proc_kb(path: str, key: str) -> int | None:
    """A "<key>: N kB" field of a /proc file, in bytes (None where /proc is unavailable)."""
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(rf"^{key}:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def rss_bytes(key: str) -> int | None:
    """A memory field of this process (VmHWM: peak resident set, VmSize: address space), in bytes."""
    return proc_kb("/proc/self/status", key)


def default_memory_budget(device: str) -> int:
    """Bytes a case may use: 60% of total RAM (CPU, at most 80% of what is available now), or of GPU memory."""
    if device == "cuda":
        return int(0.6 * torch.cuda.get_device_properties(0).total_memory)
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    available = proc_kb("/proc/meminfo", "MemAvailable") or total
    return int(min(0.6 * total, 0.8 * available))
