"""The model registry (as timm's `_registry.py`): names -> constructors, and the
parameter sets that training treats specially.

Model modules register themselves with `@register_model("name")`; `attnconv.models`
imports them, so `build_model` sees every model once `attnconv.models` is imported.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnconv.errors import AttnconvError
from attnconv.limits import AllocationLimit, parameter_limit, shown_value
from attnconv.options import option

REGISTRY: dict[str, Callable[..., nn.Module]] = {}


@dataclass
class ImageModelConfig:
    """The options every image model takes, set from the dataset (each model's config extends it)."""

    in_channels: int = option(3, "input channels (set from the dataset)", low=1, high=4096)
    image_size: int = option(32, "image side (set from the dataset; for folder:PATH the size images are resized and "
                             "center-cropped to, default 32)", low=1, high=8192)
    num_classes: int = option(10, "classes (set from the dataset)", low=1, high=10**6)


def register_model(name: str) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register a model constructor under `name`."""

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in REGISTRY:
            raise RuntimeError(f"model {name!r} registered twice")
        REGISTRY[name] = fn
        return fn

    return wrap


def run_blocks(blocks: nn.ModuleList, h: Tensor, checkpointed: bool) -> Tensor:
    """h through each block in turn; with `checkpointed` (training with gradients) each block's forward
    runs again in backward instead of storing its intermediates (one activation kept per block)."""
    for block in blocks:
        h = checkpoint(block, h, use_reentrant=False) if checkpointed else block(h)
    return h


def list_models() -> list[str]:
    return sorted(REGISTRY)


def model_defaults(name: str) -> dict[str, Any]:
    """The options of the named model that a config may leave out, with the values the model then takes: its
    config class's field defaults (a constructor's `config_class`), else its keyword defaults ({} for an unknown
    name)."""
    fn = REGISTRY.get(name)
    if fn is None:
        return {}
    cls = getattr(fn, "config_class", None)
    if cls is not None:  # `fixed`: options the model's name sets (an attention classifier's encoding)
        return {**{f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()
                   for f in dataclasses.fields(cls) if f.init and (f.default is not dataclasses.MISSING
                                                                   or f.default_factory is not dataclasses.MISSING)},
                **getattr(fn, "fixed", {})}
    return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.default is not p.empty}


def build_model(name: str, **overrides: Any) -> nn.Module:
    """Build the named model with the paper's defaults, changed by `overrides`.

    Overrides that are None are ignored, so CLI flags can be passed straight through.
    """
    if not isinstance(name, str) or name not in REGISTRY:
        raise AttnconvError(f"unknown model {shown_value(name)}; choose one of: {', '.join(list_models())}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        with AllocationLimit(parameter_limit(), f"model {name!r} with {overrides}", "lower the sizes"):
            return REGISTRY[name](**overrides)  # one that no machine holds: refused before it is allocated
    except TypeError as err:  # an override this model does not take: name it, not the constructor
        # Python names the key raw between quotes; any key, whatever its characters, is found by comparing.
        unknown = next((k for k in overrides if f"unexpected keyword argument '{k}'" in str(err)), None)
        if unknown is None:
            raise AttnconvError(f"model {name!r}: {err}") from None
        shown = repr(unknown) if len(unknown) <= 40 else repr(unknown[:37]) + "..."  # repr: invisible ones escaped
        raise AttnconvError(f"model {name!r} has no option {shown}; leave it out (`attnconv train "
                            "--help` lists the model options)") from None


def no_weight_decay(model: nn.Module) -> set[str]:
    """Parameter names that take no weight decay.

    As in the paper: the quadratic encodings' attention centers and widths. A module
    opts its own parameters out with a class attribute `no_weight_decay = True`.
    """
    names = set()
    for module_name, module in model.named_modules():
        if getattr(module, "no_weight_decay", False):
            for pname, _ in module.named_parameters(recurse=False):
                names.add(f"{module_name}.{pname}" if module_name else pname)
    return names


def attention_placement(model: nn.Module) -> set[str]:
    """Parameter names that decide where attention looks, for `attnconv train --attention-lr-scale`.

    The `no_weight_decay` set (the quadratic encodings' and converted layers' centers and
    widths) plus the parameters of the child modules a module names in its class attribute
    `placement_children` (a converted layer's content `query` and `key` projections).
    """
    names = no_weight_decay(model)
    for module_name, module in model.named_modules():
        for child in getattr(module, "placement_children", ()):
            if hasattr(module, child):
                prefix = f"{module_name}.{child}" if module_name else child
                names.update(f"{prefix}.{pname}" for pname, _ in getattr(module, child).named_parameters())
    return names
