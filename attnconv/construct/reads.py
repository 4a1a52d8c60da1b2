"""A converted layer asked for the `weight` or `bias` of the convolution it replaced (which it holds as value maps):
the refusal (`ConvParameterRead`, an `AttnconvError` and an `AttributeError`, so `hasattr` stays False), and the
refusals kept per thread with the module whose code read, for `cnn_to_attention`'s check: a read through a property
has its error replaced by Python's, and `getattr(conv, "weight", None)` or `hasattr` swallows it, yet a network that
probed its convolution's weight computes something else converted."""

from __future__ import annotations

import sys
import threading

from torch import nn

from attnconv.errors import AttnconvError


class ConvParameterRead(AttnconvError, AttributeError):
    """A converted layer asked for its convolution's `weight` or `bias`, which it holds as value maps instead."""


_READS = threading.local()  # this thread's: another thread's probe of its own layers is none of this check's


def refused_reads() -> list[tuple[str, nn.Module | None]]:
    """This thread's latest refusals, (words, the module whose code read), for cnn_to_attention's check to clear
    before its forward and read after it."""
    if not hasattr(_READS, "reads"):
        _READS.reads = []
    return _READS.reads


def _reading_module(converted: type) -> nn.Module | None:
    """The innermost module whose code is running (a frame's `self`), other than converted layers: who read."""
    frame = sys._getframe(3)  # past this function, conv_parameter_read and the layer's __getattr__: the reader's
    while frame is not None:
        module = frame.f_locals.get("self")
        if isinstance(module, nn.Module) and not isinstance(module, converted):
            return module
        frame = frame.f_back
    return None


def conv_parameter_read(layer: nn.Module, name: str, converted: type) -> None:
    """Raise the refusal of `layer.<name>` (`converted`: the converted layers' class), kept for the check."""
    words = (
        f"{type(layer).__name__} has no `{name}`: it is the attention layer that replaced a {layer.ndim}-d convolution "
        f"({layer.in_channels} to {layer.out_channels} channels), and a module read the convolution's `{name}` (to "
        f"compute with it itself, F.conv{layer.ndim}d(x, conv.weight) or the like, which no conversion replaces, or to "
        "test it); make that module call its convolution (conv(x)) and read nothing of it, or convert the network "
        "without it")
    reads = refused_reads()
    reads.append((words, _reading_module(converted)))
    del reads[:-8]  # the latest few: a model probing in a loop does not grow it
    raise ConvParameterRead(words)
