"""attnconv: self-attention and convolution (Cordonnier, Loukas, Jaggi, ICLR 2020).

    from attnconv import SelfAttention2d, conv_to_attention, make_config, train, Run

    layer = SelfAttention2d(64, 64, heads=9, encoding="quadratic")   # a drop-in for nn.Conv2d(64, 64, 3)
    attn = conv_to_attention(conv)                                    # Theorem 1: the same function
    train(make_config(preset="fmnist-sa-quadratic"), "runs/sa")       # a run directory
    run = Run("runs/sa")                                              # config, metrics, heads, model, sites
    records = capture_attention(vit, images)                          # the attention of any model, per call
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The public names and their homes. They are imported on first use (PEP 562 `__getattr__`), so that
# `import attnconv.cli` (the `attnconv` command, `python -m attnconv`) costs no torch import until the
# command's own code runs: Ctrl-C while torch loads is then the command's one `interrupted` line.
_HOMES = {
    "analyze_captured": "attnconv.analysis", "analyze_layer": "attnconv.analysis",
    "analyze_run": "attnconv.analysis", "head_snapshot": "attnconv.analysis",
    "SelfAttention2d": "attnconv.attention",
    "PRESETS": "attnconv.config", "TrainConfig": "attnconv.config", "make_config": "attnconv.config",
    "ConvAttention": "attnconv.construct", "LearnableConvAttention": "attnconv.construct",
    "conv_likeness": "attnconv.construct", "conv_to_attention": "attnconv.construct",
    "effective_kernel": "attnconv.construct", "cnn_to_attention": "attnconv.construct",
    "AttnconvError": "attnconv.errors",
    "build_model": "attnconv.models", "list_models": "attnconv.models", "register_model": "attnconv.models",
    "CapturedAttention": "attnconv.models.capture", "capture_attention": "attnconv.models.capture",
    "AttentionLayer": "attnconv.models.sites", "AttentionSite": "attnconv.models.sites",
    "attention_sites": "attnconv.models.sites", "captured_sites": "attnconv.models.sites",
    "Run": "attnconv.runs", "load_run": "attnconv.runs",
    "train": "attnconv.training",
}

if TYPE_CHECKING:  # what type checkers and IDEs see: the same names, imported eagerly
    from attnconv.analysis import analyze_captured, analyze_layer, analyze_run, head_snapshot
    from attnconv.attention import SelfAttention2d
    from attnconv.config import PRESETS, TrainConfig, make_config
    from attnconv.construct import (
        ConvAttention,
        LearnableConvAttention,
        cnn_to_attention,
        conv_likeness,
        conv_to_attention,
        effective_kernel,
    )
    from attnconv.errors import AttnconvError
    from attnconv.models import build_model, list_models, register_model
    from attnconv.models.capture import CapturedAttention, capture_attention
    from attnconv.models.sites import AttentionLayer, AttentionSite, attention_sites, captured_sites
    from attnconv.runs import Run, load_run
    from attnconv.training import train


def __getattr__(name: str) -> Any:
    """A public name, imported from its home on first use and kept; `__version__` from the package metadata."""
    if name == "__version__":
        globals()[name] = _version()
        return globals()[name]
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'attnconv' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOMES) | {"__version__"})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnconv")  # one home: pyproject.toml
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "0+unknown"

__all__ = [
    "PRESETS",
    "AttentionLayer",
    "AttentionSite",
    "AttnconvError",
    "CapturedAttention",
    "ConvAttention",
    "LearnableConvAttention",
    "Run",
    "SelfAttention2d",
    "TrainConfig",
    "analyze_captured",
    "analyze_layer",
    "analyze_run",
    "attention_sites",
    "build_model",
    "capture_attention",
    "captured_sites",
    "cnn_to_attention",
    "conv_likeness",
    "conv_to_attention",
    "effective_kernel",
    "head_snapshot",
    "list_models",
    "load_run",
    "make_config",
    "register_model",
    "train",
]
