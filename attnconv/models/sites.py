"""Where a model attends: one list of attention sites for every kind of attention network.

An attention classifier (sa-*) has one `SelfAttention2d` per block, all on the token grid; a
CNN converted to attention (`attnconv convert`, `train --init-from`) has one `ConvAttention`
per convolution, each on its own input grid. Both are described the same way, so the
analysis, the figures, the report and the explorer need no branch on which one they hold:

    sites = attention_sites(model, (C, H, W))     # [AttentionSite(path, layer, size), ...]
    probs = site_probs(model, sites, x)           # (heads, T_out, T_in) per site

Every site's layer follows the `AttentionLayer` protocol.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from attnconv.attention import SelfAttention2d
from attnconv.construct import ConvAttention
from attnconv.errors import AttnconvError

# Images per forward pass when averaging content attention (keeps (B, heads, T_out, T_in) small).
BATCH = 16
TERMS = ("combined", "position")


@runtime_checkable
class AttentionLayer(Protocol):
    """What every attention layer offers (`SelfAttention2d`, `ConvAttention`, `LearnableConvAttention`).

    attention_probs(x=None, size=None, term="combined"): (1 or B, heads, T_out, T_in) probabilities
    of the input x (B, C, H, W), or of an (H, W) grid for position-only layers; term "position":
    the softmax of the positional score term alone (content layers). value_maps(): Lemma 1's
    W_val^h W_out^h, (maps (heads, C_out, C_in), bias (C_out,)).
    """

    heads: int

    @property
    def position_only(self) -> bool: ...

    def attention_probs(self, x: Tensor | None = None, size: Sequence[int] | None = None,
                        term: str = "combined") -> Tensor: ...

    def value_maps(self) -> tuple[Tensor, Tensor]: ...


@dataclass(frozen=True)
class AttentionSite:
    """One attention layer of a model: its module path, the layer, and the (H, W) grid it attends over.

    Every layer is called as a module, so a forward pre-hook on `layer` sees its (B, C, H, W) input.
    """

    path: str
    layer: nn.Module
    size: tuple[int, int]

    @property
    def position_only(self) -> bool:
        return bool(self.layer.position_only)


def attention_sites(model: nn.Module, input_shape: Sequence[int] | None = None) -> list[AttentionSite]:
    """Every attention layer of `model`, first to last (AttnconvError for a model without one, a CNN).

    input_shape (C, H, W): needed for converted networks, whose layers' grids are found by one
    forward pass of a zero image; classifiers know their token grid.
    """
    layers = getattr(model, "attention_layers", None)
    if layers:
        grid = model.config.grid
        return [AttentionSite(f"layers.{i}.attention", layer, (grid, grid)) for i, layer in enumerate(layers)]
    # Converted CNNs' multi-head 2-d ConvAttention (1x1 convs: one head, nothing to see), and the
    # SelfAttention2d layers of any other model (called as modules, so pre-hooks see their inputs).
    found = {m: name for name, m in model.named_modules()
             if (isinstance(m, ConvAttention) and m.ndim == 2 and m.heads > 1) or isinstance(m, SelfAttention2d)}
    if found:
        if input_shape is None:
            raise AttnconvError("this network's attention layers need its input shape (C, H, W) to find their grids")
        device = next(model.parameters()).device
        seen = capture_inputs(model, list(found), torch.zeros(1, *input_shape, device=device))
        return [AttentionSite(found[m], m, (int(x.shape[-2]), int(x.shape[-1]))) for m, x in seen.items()]
    raise AttnconvError(
        f"{type(model).__name__} has no attention layers to analyze; give a run of an attention model "
        "(sa-quadratic, sa-quadratic-aniso, sa-learned, sa-learned-content) or of a CNN converted to attention")


def needs_inputs(sites: Sequence[AttentionSite]) -> bool:
    """True when some site's attention depends on its input (content attention)."""
    return any(not site.position_only for site in sites)


def site_inputs(model: nn.Module, sites: Sequence[AttentionSite], x: Tensor) -> list[Tensor]:
    """What each site's layer receives when `model` runs on the images x: (B, C, H, W) per site."""
    seen = capture_inputs(model, [site.layer for site in sites], x)
    return [seen[s.layer] for s in sites]


@torch.no_grad()
def site_probs(model: nn.Module, sites: Sequence[AttentionSite], x: Tensor | None = None, *,
               term: str = "combined", batch_size: int = BATCH) -> list[Tensor]:
    """Each site's attention probabilities, (heads, T_out, T_in) float32.

    Position-only layers: exact and input-independent (x is not needed). Content layers: the
    mean over the normalized images x (N, C, H, W), each layer seeing what the network before it
    produces. term: "combined" (the layer's attention) or "position" (the softmax of the
    positional score term alone, Eq. 6 without the content term; the same for position-only layers).
    """
    if term not in TERMS:
        raise AttnconvError(f"term must be one of {', '.join(TERMS)}, got {term!r}")
    exact = [site.layer.attention_probs(size=site.size)[0].float() if site.position_only else None for site in sites]
    if not needs_inputs(sites):
        return exact
    if x is None or len(x) == 0:
        raise AttnconvError("content attention depends on the input: give test images to average over")
    sums: list[Tensor | float] = [0.0] * len(sites)
    for batch in x.split(batch_size):
        inputs = site_inputs(model, sites, batch)
        for i, (site, inp) in enumerate(zip(sites, inputs)):
            if exact[i] is None:
                sums[i] = sums[i] + site.layer.attention_probs(inp, term=term).float().sum(0)
    return [p if p is not None else s / len(x) for p, s in zip(exact, sums)]


def capture_inputs(model: nn.Module, modules: Sequence[nn.Module], x: Tensor) -> dict[nn.Module, Tensor]:
    """What each of `modules` receives when `model` runs on x: {module: its first positional argument}.

    One forward pass in eval mode without autograd, with a forward pre-hook on each module; a
    module called more than once keeps its first input, one never called is absent, and the
    dict is in call order. The hooks are removed and the training mode restored however the pass
    ends. Pre-hooks fire on `module(...)` calls only. Two passes of
    one model at once would see each other's hooks: callers sharing a model across threads lock.
    """
    seen: dict[nn.Module, Tensor] = {}

    def grab(module, args):
        seen.setdefault(module, args[0].detach())

    was_training = model.training
    with contextlib.ExitStack() as hooks, torch.no_grad():
        hooks.callback(model.train, was_training)
        for m in modules:
            hooks.callback(m.register_forward_pre_hook(grab).remove)
        model.eval()(x)
    return seen


def query_on_site(site: AttentionSite, image_size: Sequence[int], i: int, j: int) -> tuple[int, tuple[int, int]]:
    """Image pixel (i, j) as a query of a site whose grid may be smaller (strided or downsampled layers).

    Returns (index of the nearest output pixel, row-major; that query's position on the site's
    input grid). Layers without `output_size` (the classifiers' SelfAttention2d) keep their grid.
    """
    size = site.size
    if hasattr(site.layer, "output_size"):
        oh, ow = site.layer.output_size(size)
    else:
        oh, ow = size
    q = min(oh - 1, i * oh // image_size[0]) * ow + min(ow - 1, j * ow // image_size[1])
    if hasattr(site.layer, "query_positions"):
        pos = site.layer.query_positions(size)[q]
        return q, (int(pos[0]), int(pos[1]))
    return q, divmod(q, ow)
