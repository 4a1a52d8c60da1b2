"""What `attnconv bench` runs and at which sizes: BenchConfig, the quick and tiny sizes, the targets."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from attnconv.errors import AttnconvError

# What --only selects; "util" follows matmul + model. The CPU sections (presets, grid, compile, conv,
# fullsize) run only when asked for: `attnconv bench --only presets,grid,compile,conv,fullsize --threads 1`.
DEFAULT_SECTIONS = ("matmul", "layer", "model", "data", "memory")
CPU_SECTIONS = ("presets", "grid", "compile", "conv", "fullsize")
SECTIONS = DEFAULT_SECTIONS + CPU_SECTIONS
LAYER_ENCODINGS = ("quadratic", "learned", "learned-content")
PRECISIONS = ("fp32", "bf16")  # bf16: torch.autocast(dtype=torch.bfloat16) around the forward
GRID_SIDES = (7, 14, 16, 32)  # the grid section's token grids (inputs and factors: attnconv.bench.grid.GRIDS)

# The speed targets on a 2-core CPU: dense / fast time ratio, utilization, data / model speed.
LAYER_TARGETS = {"quadratic": {16: 1.3, 32: 2.5, 64: 6.0}}
MODEL_TARGETS = {"cifar": 1.2, "full-res": 2.5}
UTILIZATION_TARGET = 0.5
DATA_TARGET = 10.0
# "Speed on the CPU": the attention preset's images/s over the ResNet preset's, same precision; the
# paper's full-size step's FLOP/s over the matmul rate of the same precision.
PRESET_TARGET = 1.0
FULLSIZE_UTILIZATION_TARGET = 0.6
EPOCH_STEPS = 469  # Fashion-MNIST: 60,000 images at batch 128 (the compile section's break-even horizon)

EPOCH_IMAGES = 50_000  # CIFAR-10 training set
PAPER_EPOCHS = 300


@dataclass
class BenchConfig:
    """What to run and at which sizes (defaults: the issue's full sizes)."""

    mode: str = "full"  # "full", "quick" or "tiny" (the smoke test's)
    only: tuple[str, ...] = DEFAULT_SECTIONS
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
    # CPU sections: presets, compile (Fashion-MNIST sizes), conv (layer vs Conv2d vs Swin-style), fullsize
    precisions: tuple[str, ...] = PRECISIONS
    preset_batch: int = 128  # also the grid section's
    grids: tuple[int, ...] = (7, 14, 16, 32)  # grid section: tokens a side (attnconv.bench.grid.GRIDS)
    compile_models: tuple[str, ...] | None = None  # None: every named model
    compile_overrides: dict[str, Any] = field(default_factory=dict)  # on the attention models' preset sizes
    conv_channels: tuple[int, ...] = (64, 400)
    conv_sides: tuple[int, ...] = (16, 32)
    conv_batch: int = 8
    fullsize_batch: int = 100
    fullsize_overrides: dict[str, Any] = field(default_factory=dict)  # {} : the paper's 6 layers, hidden 400

    def validate(self) -> None:
        unknown = [s for s in self.only if s not in SECTIONS]
        if unknown:
            raise AttnconvError(f"--only: unknown benchmark {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
        bad = [p for p in self.precisions if p not in PRECISIONS]
        if bad or not self.precisions:
            raise AttnconvError(f"--precisions: choose from {', '.join(PRECISIONS)}, got {', '.join(bad) or 'none'}")
        for name in ("repeats", "layer_batch", "model_batch", "full_res_batch", "matmul_size", "data_images",
                     "data_batch", "memory_batch", "channels", "heads", "check_batch", "preset_batch", "conv_batch",
                     "fullsize_batch"):
            if getattr(self, name) < 1:
                raise AttnconvError(f"bench option {name} must be >= 1, got {getattr(self, name)}")
        if self.warmup < 1:
            raise AttnconvError(f"bench option warmup must be >= 1, got {self.warmup}")
        bad_grids = [g for g in self.grids if g not in GRID_SIDES]
        if bad_grids or not self.grids:
            raise AttnconvError(f"--grids: choose from {','.join(map(str, GRID_SIDES))}, "
                                f"got {','.join(map(str, bad_grids)) or 'none'}")
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
        profile=False, preset_batch=32, grids=(7, 14, 16), conv_sides=(16,), conv_batch=2, fullsize_batch=8,
        fullsize_overrides={"layers": 1},
    )
    return replace(cfg, **changes)


def tiny_config(**changes: Any) -> BenchConfig:
    """Toy sizes that run every code path in seconds (the smoke test)."""
    cfg = BenchConfig(
        mode="tiny", repeats=2, sides=(4, 8), layer_batch=2, channels=16, heads=4, model_batch=4, full_res_batch=2,
        model_overrides={"layers": 1, "hidden": 16, "heads": 4, "intermediate": 32}, matmul_size=128,
        data_images=200, data_batch=50, memory_sides=(12,), memory_batch=2, profile=False,
        preset_batch=4, grids=(7, 14), compile_models=("sa-quadratic",), conv_channels=(8,), conv_sides=(4,), conv_batch=2,
        compile_overrides={"layers": 1, "hidden": 16, "heads": 4, "intermediate": 32},
        fullsize_batch=2, fullsize_overrides={"layers": 1, "hidden": 16, "heads": 4, "intermediate": 32},
    )
    return replace(cfg, **changes)
