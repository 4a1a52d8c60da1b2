"""Named models, created through one factory (timm-style registry).

    build_model("sa-quadratic", hidden=64, layers=2)

Every model maps a normalized float batch (B, C, H, W) to logits (B, num_classes)
and exposes `forward_features` (pooled features) and `forward_head`.
"""

from __future__ import annotations

from typing import Callable

import torch.nn as nn

from attnconv.errors import AttnconvError

_REGISTRY: dict[str, Callable[..., nn.Module]] = {}


def register_model(name: str):
    """Decorator: register a model constructor under `name`."""

    def wrap(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        if name in _REGISTRY:
            raise RuntimeError(f"model {name!r} registered twice")
        _REGISTRY[name] = fn
        return fn

    return wrap


def list_models() -> list[str]:
    return sorted(_REGISTRY)


def build_model(name: str, **overrides) -> nn.Module:
    """Build the named model with the paper's defaults, changed by `overrides`.

    Overrides that are None are ignored, so CLI flags can be passed straight through.
    """
    if name not in _REGISTRY:
        raise AttnconvError(f"unknown model {name!r}; choose one of: {', '.join(list_models())}")
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        return _REGISTRY[name](**overrides)
    except TypeError as err:  # an override this model does not take
        raise AttnconvError(f"model {name!r}: {err}") from None


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


# Importing the model modules fills the registry.
from attnconv.models import classifier  # noqa: E402,F401
from attnconv.models import resnet  # noqa: E402,F401
