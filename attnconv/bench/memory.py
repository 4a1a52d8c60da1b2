"""The memory benchmark: peak memory of one training step at each token side, each case in a fresh process.

A fresh process per case (CPU) makes the peak resident set honest: nothing an earlier
case allocated is counted. The child runs `python -m attnconv.bench '{"spec": ..., "limit": ...}'`
(`child_main`) and prints its result as one JSON line.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from attnconv.bench.cases import auto_impl, set_impl, train_step
from attnconv.bench.config import BenchConfig
from attnconv.bench.estimates import estimate_step_bytes
from attnconv.bench.peakmem import PeakMemory, rss_bytes
from attnconv.bench.results import Section, fmt_bytes, fmt_seconds
from attnconv.bench.timing import attempt, progress, time_call
from attnconv.models import build_model

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding attnconv/, for the child's PYTHONPATH


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
    model = set_impl(build_model(spec["model"], **spec["overrides"]), spec["impl"]).to(spec["device"])
    cfg = BenchConfig(device=spec["device"], amp=spec["amp"])
    c, s, b = model.config.in_channels, model.config.image_size, spec["batch"]
    x = torch.randn(b, c, s, s, device=spec["device"])
    y = torch.randint(0, model.config.num_classes, (b,), device=spec["device"])
    step = train_step(model, x, y, cfg)
    if limit is not None and spec["device"] == "cpu":
        vm = rss_bytes("VmSize") or 0
        resource.setrlimit(resource.RLIMIT_AS, (vm + limit, resource.RLIM_INFINITY))
    # warm-up: one-time allocations (momentum buffers, kernels' workspaces) are not the step's
    error = attempt(step)
    seconds: list[float] = []
    with PeakMemory(spec["device"]) as pm:
        error = error or attempt(lambda: seconds.append(time_call(step, spec["device"])))
    if error:
        return _memory_failure(error)
    peak = rss_bytes("VmHWM") if spec["device"] == "cpu" else torch.cuda.max_memory_allocated()
    return {"step_bytes": pm.bytes, "peak_bytes": peak, "seconds": seconds[0]}


def _memory_failure(error: str) -> dict[str, str]:
    """An allocation failure means the case did not fit (skipped); anything else failed."""
    if re.search(r"can't allocate memory|out of memory|MemoryError|bad_alloc|SIGKILL", error, re.I):
        return {"skipped": f"did not fit: {error}"}
    return {"failed": error}


def _run_memory_child(spec: dict[str, Any], limit: int) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_PACKAGE_ROOT),
                                                                     os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "attnconv.bench", json.dumps({"spec": spec, "limit": limit})],
                          capture_output=True, text=True, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == -9:
        return _memory_failure("the subprocess was killed by SIGKILL (the kernel's out-of-memory killer?)")
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return _memory_failure(f"subprocess exit {proc.returncode}: {tail[:300]}")
    return json.loads(lines[-1])


def child_main(argv: list[str]) -> int:
    """`python -m attnconv.bench '{"spec": ..., "limit": ...}'`: one memory case, JSON on stdout."""
    request = json.loads(argv[0])
    print(json.dumps(measure_step_memory(request["spec"], request.get("limit"))))
    return 0


def bench_memory(cfg: BenchConfig, budget: int) -> Section:
    """Peak memory of one training step at each token side, dense vs fast, each in a fresh process."""
    sec = Section("memory", f"Peak memory of one training step (sa-quadratic, no downsampling, batch "
                  f"{cfg.memory_batch})", ["tokens", "variant", "step peak", "process peak", "estimate",
                                          "dense/variant", "step time"])
    for side in cfg.memory_sides:
        progress(f"memory {side}x{side} tokens")
        results = {}
        for impl in ("dense", "auto"):
            spec = memory_spec(cfg, side, impl)
            model = build_model(spec["model"], **spec["overrides"])
            name = "dense" if impl == "dense" else auto_impl(model)
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
