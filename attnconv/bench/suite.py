"""run_benchmarks: the sections a BenchConfig asks for, in order, into one Report."""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable
from dataclasses import asdict

import torch

from attnconv.bench.compiled import bench_compile
from attnconv.bench.config import BenchConfig
from attnconv.bench.conv import bench_conv
from attnconv.bench.fullsize import bench_fullsize
from attnconv.bench.grid import bench_grid
from attnconv.bench.layer import bench_layers
from attnconv.bench.matmul import bench_matmul
from attnconv.bench.memory import bench_memory
from attnconv.bench.model import bench_models
from attnconv.bench.peakmem import default_memory_budget
from attnconv.bench.pipeline import bench_data
from attnconv.bench.presets import bench_presets
from attnconv.bench.results import Report, Section, machine_info
from attnconv.bench.utilization import bench_utilization


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
        "presets": lambda: bench_presets(cfg),
        "grid": lambda: bench_grid(cfg),
        "conv": lambda: bench_conv(cfg),
        "fullsize": lambda: bench_fullsize(cfg),
        "compile": lambda: bench_compile(cfg),
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
