"""Results: a Section per benchmark (rows for people, raw numbers for --json), the Report, and their text.

Tables are printed by `attnconv.tables.format_table` (plain text, or Markdown for
benchmarks/RESULTS.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from attnconv.bench.timing import Timing
from attnconv.tables import format_table


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
    """The median, and 'min - max'."""
    return fmt_seconds(t.median), f"{fmt_seconds(t.min)} - {fmt_seconds(t.max)}"


def fmt_err(e: float | None) -> str:
    """A relative error in one significant digit ('-' when not measured)."""
    return "-" if e is None else f"{e:.1e}"


def format_section(section: Section, markdown: bool = False) -> str:
    took = f" ({fmt_seconds(section.seconds)})" if section.seconds is not None else ""
    head = f"### {section.title}" if markdown else f"== {section.title}{took} =="
    parts = [head, "", format_table(section.columns, section.rows, markdown=True)] if markdown else \
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


def report_json(report: Report) -> str:
    """Every number measured, as JSON."""
    return json.dumps(asdict(report), indent=2, default=str)


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
