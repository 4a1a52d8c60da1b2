"""A model in eval mode for one pass, and every module's own training flag back afterwards.

`model.train(was_training)` would set the flag of every submodule to the model's: a user's frozen
BatchNorm (kept in eval while the rest trains) or Monte-Carlo dropout (kept in train while the rest
evaluates) would come back changed. `eval_mode` records each module's flag and restores each.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """`model` in eval mode inside the block; each module's `training` as it was afterwards, however the
    block ends (the flags are set directly, so no module's own `train()` override runs on the way back)."""
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        yield model
    finally:
        for m, training in flags:
            m.training = training
