"""The attention layers of a trained model and what they see: layers, their inputs, mean probabilities.

For the classifiers, every block's `SelfAttention2d` on one token grid; for networks converted
from a CNN (`convert`, `train --init-from`), every multi-head 2-d `ConvAttention` with its own
input size. `capture_inputs` is the one place that records layer inputs with forward pre-hooks.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnconv.errors import AttnconvError

# Images per forward pass when averaging content attention (keeps (B, heads, T, T) small).
BATCH = 25
# The same for converted content layers, whose maps span the padded grid of a full-resolution layer.
CONVERTED_BATCH = 8


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The attention layers of an attention classifier, first to last."""
    layers = getattr(model, "attention_layers", None)
    if not layers:
        raise AttnconvError(
            f"{type(model).__name__} has no attention layers to analyze; give a run of an attention model "
            "(sa-quadratic, sa-quadratic-aniso, sa-learned, sa-learned-content)"
        )
    return list(layers)


def converted_layers(model: nn.Module, input_shape: Sequence[int]) -> list[tuple[str, nn.Module, tuple[int, int]]]:
    """The multi-head 2-d `ConvAttention` layers of a network converted from a CNN, with their input grids.

    For runs of `attnconv convert` and `attnconv train --init-from`: (module path, layer,
    (H, W) of the input it sees), in forward order, found by one forward pass of a zero
    image of `input_shape` (C, H, W). 1x1 convolutions (one head, nothing to locate) are
    left out. Empty when the model has no such layer.
    """
    from attnconv.construct import ConvAttention

    found = {m: name for name, m in model.named_modules()
             if isinstance(m, ConvAttention) and m.ndim == 2 and m.heads > 1}
    if not found:
        return []
    seen = capture_inputs(model, list(found), torch.zeros(1, *input_shape, device=next(model.parameters()).device))
    return [(found[m], m, tuple(int(s) for s in inp.shape[-2:])) for m, inp in seen.items()]


def capture_inputs(model: nn.Module, modules: Sequence[nn.Module], x: Tensor) -> dict[nn.Module, Tensor]:
    """What each of `modules` receives when `model` runs on x: {module: its first positional argument}.

    One forward pass in eval mode without autograd, with a forward pre-hook on each module;
    a module called more than once keeps its first input, one never called is absent, and
    the dict is in call order. The hooks are removed and the model's training mode restored
    however the pass ends, an exception included. Pre-hooks fire on `module(...)` calls
    only: a layer its owner reaches through another method (the classifier's blocks call
    `attention.forward_tokens`) is captured on the caller. Two passes of the same model at
    once would see each other's hooks: callers that share a model between threads hold a
    lock around this (the explorer does).
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


def load_attention_run(run_dir: str | os.PathLike, device: str = "cpu"):
    """`load_run` of a run whose attention the analysis can show: (model, config, converted).

    `converted` is `converted_layers` for a network converted from a CNN (`attnconv
    convert`, `train --init-from`) and [] for an attention classifier; a plain CNN run
    raises AttnconvError (from `attention_layers`).
    """
    from attnconv.runs import load_run, run_info

    model, config = load_run(run_dir, device)
    if getattr(model, "attention_layers", None):
        return model, config, []
    info = run_info(config)
    convs = converted_layers(model, (info.channels, info.size, info.size))
    if not convs:
        attention_layers(model)  # raises: a CNN
    return model, config, convs


def token_grid(model: nn.Module) -> tuple[int, int]:
    """(H, W) of the token grid the attention layers see (image_size // downsample)."""
    cfg = getattr(model, "config", None)
    if cfg is None or not hasattr(cfg, "grid"):
        raise AttnconvError(f"{type(model).__name__} does not say its token grid (no config.grid)")
    return cfg.grid, cfg.grid


def needs_images(model: nn.Module) -> bool:
    """True when some attention layer depends on its input (content attention)."""
    return any(not getattr(layer, "position_only", True) for layer in attention_layers(model))


def run_images(
    config, count: int | None = None, *, index: int | None = None, data_dir: str | os.PathLike | None = None
) -> tuple[Tensor, Tensor]:
    """Test images of a run's dataset: (raw uint8 (N, C, H, W), normalized float32 (N, C, H, W)).

    The first `count` test images (all if fewer), or the single image `index`. The data is
    looked up in `data_dir`, else in the run's own data_dir, else where `load_dataset` searches.
    """
    from attnconv import data as D
    from attnconv.runs import run_info, run_test_set

    if count is not None and count < 1:
        raise AttnconvError(f"--images {count} is invalid: give a number of test images >= 1")
    test = run_test_set(config, data_dir)
    if index is not None:
        if not 0 <= index < len(test):
            raise AttnconvError(
                f"--image {index} is out of range: the {config.dataset} test set has {len(test)} images "
                f"(0..{len(test) - 1})"
            )
        raw = test.images[index : index + 1]
    else:
        raw = test.images[: count if count is not None else len(test)]
    return raw, D.normalize(raw, run_info(config))


@torch.no_grad()
def mean_layer_probs(model: nn.Module, x: Tensor | None = None, *, batch_size: int = BATCH,
                     term: str = "combined") -> list[Tensor]:
    """Attention probabilities of every layer, (heads, T, T) float32 each, T = H*W tokens.

    Position-only layers: their exact, input-independent probabilities (x is not needed).
    Content layers: the mean over the images x (N, C, H_img, W_img), normalized as the
    model was trained; each layer sees the hidden state the blocks before it produce.
    term: "combined" (the layer's attention) or "position" (the softmax of the positional
    score term alone, Eq. 6 without q.k; the same as "combined" for position-only layers).
    """
    if term not in ("combined", "position"):
        raise AttnconvError(f"term must be 'combined' or 'position', got {term!r}")
    layers = attention_layers(model)
    size = token_grid(model)
    if not needs_images(model):
        return [layer.attention_probs(size=size)[0].float() for layer in layers]
    if x is None or len(x) == 0:
        raise AttnconvError("content attention depends on the input: give test images to average over")
    was_training = model.training
    model.eval()
    try:
        sums: list[Tensor | None] = [None] * len(layers)
        for batch in x.split(batch_size):
            h = model.tokens(batch)  # (B, H, W, hidden)
            for i, block in enumerate(model.layers):
                att = block.attention
                if att.position_only:
                    if sums[i] is None:
                        sums[i] = att.attention_probs(size=size)[0].float() * len(x)
                else:
                    p = att.attention_scores(h.permute(0, 3, 1, 2))[term].softmax(-1).sum(0)  # (heads, T, T)
                    sums[i] = p if sums[i] is None else sums[i] + p
                h = block(h)
    finally:
        model.train(was_training)
    return [s / len(x) for s in sums]


def converted_query(layer: nn.Module, size: tuple[int, int], image_size: Sequence[int], i: int, j: int
                    ) -> tuple[int, tuple[int, int]]:
    """Image pixel (i, j) as a query of a converted layer with input grid `size`.

    Returns (index of the nearest output pixel, row-major; that query's position on the
    layer's input grid). Strided layers have fewer output pixels than the image.
    """
    oh, ow = layer.output_size(size)
    q = min(oh - 1, i * oh // image_size[0]) * ow + min(ow - 1, j * ow // image_size[1])
    pos = layer.query_positions(size)[q]
    return q, (int(pos[0]), int(pos[1]))


def converted_needs_images(layers: list[tuple[str, nn.Module, tuple[int, int]]]) -> bool:
    """True when some converted layer has content attention (`train --init-from --init-content`)."""
    return any(not layer.position_only for _, layer, _ in layers)


def converted_inputs(model: nn.Module, layers: list[tuple[str, nn.Module, tuple[int, int]]], x: Tensor
                     ) -> list[Tensor]:
    """What each converted layer receives when the model runs on the images x: (N, C, H, W) per layer."""
    seen = capture_inputs(model, [layer for _, layer, _ in layers], x)
    return [seen[layer] for _, layer, _ in layers]


@torch.no_grad()
def converted_probs(model: nn.Module, layers: list[tuple[str, nn.Module, tuple[int, int]]],
                    x: Tensor | None = None, *, batch_size: int = CONVERTED_BATCH) -> list[Tensor]:
    """Attention probabilities of every converted layer, (heads, T_out, T_in) float32 over its input grid.

    Position-only layers: exact and input-independent (x is not needed). Content layers:
    the mean over the normalized images x (N, C, H, W), each layer seeing what the
    network before it produces for them.
    """
    if not converted_needs_images(layers):
        return [layer.attention_probs(size=size)[0].float() for _, layer, size in layers]
    if x is None or len(x) == 0:
        raise AttnconvError("content attention depends on the input: give test images to average over")
    sums: list[Tensor | None] = [None] * len(layers)
    for batch in x.split(batch_size):
        for i, ((_, layer, size), inp) in enumerate(zip(layers, converted_inputs(model, layers, batch))):
            if layer.position_only:
                p = layer.attention_probs(size=size)[0].float() * len(batch)
            else:
                p = layer.attention_probs(inp).float().sum(0)
            sums[i] = p if sums[i] is None else sums[i] + p
    return [s / len(x) for s in sums]


