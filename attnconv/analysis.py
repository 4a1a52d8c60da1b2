"""What trained attention layers attend to: centers, widths, distances, conv-likeness.

The numbers behind Figures 4, 12 and 14 of the paper (each head's center and width per
layer) and Figures 5 and 6 (attention maps around a query pixel), for any run directory
of an attention classifier, or for a single layer:

    from attnconv.analysis import analyze_run, analyze_layer
    report = analyze_run("runs/sa")                 # dict, JSON-ready
    print(format_analysis(report))
    analyze_layer(layer, (7, 7))                    # one SelfAttention2d or ConvAttention

Coordinates. Everything lives on the layer's token grid (for the classifiers: the image
after the d x d downsampling, image_size // d tokens a side). A shift delta = k - q =
(row, column) goes from the query pixel q to the key pixel k, rows pointing down.

Per head:
  - center: the quadratic encoding's Delta_h (Lemma 2) when the layer has one
    ("parameter"), else the probability-weighted mean shift seen from the query in the
    middle of the grid ("mean shift"). `mean_shift` is reported for every head.
  - width: isotropic heads A = -alpha ||delta - Delta||^2, alpha = a^2 / 2 (the code's
    Sigma^-1 = a^2 I); every quadratic head also gets its inverse covariance Sigma^-1
    (A = -1/2 (delta - Delta)^T Sigma^-1 (delta - Delta)), its eigenvalues and condition number.
  - avg_distance: E ||delta|| under the head's probabilities, averaged over the interior
    queries (those not on the outer ring of the grid; all queries if the grid has no interior).
  - mass_3x3, mass_5x5: the attention mass inside the K x K window around the head's
    (rounded) center, averaged over the queries whose 5x5 window fits the grid (else
    whose 3x3 window fits, else all queries), the same queries for both sizes.
  - entropy: the Shannon entropy of the middle query's probabilities over log(T): 1 is uniform.
  - degenerate: True when any of these holds (the `reasons` list says which):
      alpha < UNIFORM_ALPHA = 1e-2 (largest alpha along any axis for non-isotropic heads):
          the scores barely vary over the grid, the head averages everything;
      condition number of Sigma^-1 > ILL_CONDITIONED = 1e3: the Gaussian is a line, not a
          point (the paper's code flags such heads);
      entropy > UNIFORM_ENTROPY = 0.98: nearly uniform attention, whatever the encoding
          (the only test available for learned and content heads, which have no width).

Per layer, `conv_likeness` is `attnconv.construct.conv_likeness(..., kernel_size=3)`:
the relative Frobenius distance of the layer's linear map to the nearest 3 x 3
zero-padded convolution. It needs input-independent probabilities: content layers are
measured on their probabilities averaged over test images (the average is a
position-only layer with the same value maps); the `probabilities` field says so.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnconv.construct import EffectiveKernel, conv_likeness, effective_kernel
from attnconv.errors import AttnconvError

UNIFORM_ALPHA = 1e-2
ILL_CONDITIONED = 1e3
UNIFORM_ENTROPY = 0.98
# Images per forward pass when averaging content attention (keeps (B, heads, T, T) small).
_BATCH = 25
# The same for converted content layers, whose maps span the padded grid of a full-resolution layer.
_CONVERTED_BATCH = 8

__all__ = [
    "ILL_CONDITIONED",
    "UNIFORM_ALPHA",
    "UNIFORM_ENTROPY",
    "analyze_layer",
    "analyze_model",
    "analyze_run",
    "analyze_converted",
    "attention_layers",
    "capture_inputs",
    "conv_head_geometry",
    "converted_inputs",
    "converted_layers",
    "converted_needs_images",
    "converted_probs",
    "converted_query",
    "format_analysis",
    "head_geometry",
    "load_attention_run",
    "mean_layer_probs",
    "needs_images",
    "run_images",
    "token_grid",
]


# ----------------------------------------------------------------------------------------
# Models and their inputs
# ----------------------------------------------------------------------------------------


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
def mean_layer_probs(model: nn.Module, x: Tensor | None = None, *, batch_size: int = _BATCH) -> list[Tensor]:
    """Attention probabilities of every layer, (heads, T, T) float32 each, T = H*W tokens.

    Position-only layers: their exact, input-independent probabilities (x is not needed).
    Content layers: the mean over the images x (N, C, H_img, W_img), normalized as the
    model was trained; each layer sees the hidden state the blocks before it produce.
    """
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
                    p = att.attention_probs(h.permute(0, 3, 1, 2)).sum(0)  # (heads, T, T)
                    sums[i] = p if sums[i] is None else sums[i] + p
                h = block(h)
    finally:
        model.train(was_training)
    return [s / len(x) for s in sums]


# ----------------------------------------------------------------------------------------
# One layer
# ----------------------------------------------------------------------------------------


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(size, int):
        size = (size, size)
    size = tuple(int(s) for s in size)
    if len(size) != 2 or min(size) < 1:
        raise AttnconvError(f"size must be (H, W) with positive sides, got {size}")
    return size


def _grid(size: Sequence[int]) -> Tensor:
    """Row-major (row, col) of every pixel: (H*W, 2) int64."""
    rows, cols = torch.meshgrid(torch.arange(size[0]), torch.arange(size[1]), indexing="ij")
    return torch.stack([rows.reshape(-1), cols.reshape(-1)], dim=-1)


def _own_centers(layer: nn.Module, heads: int) -> Tensor | None:
    """Lemma 2's Delta_h when the layer has them (ConvAttention.centers, QuadraticEncoding.centers)."""
    centers = getattr(layer, "centers", None)
    if centers is None:
        centers = getattr(getattr(layer, "encoding", None), "centers", None)
    if isinstance(centers, Tensor) and centers.shape == (heads, 2):
        return centers.detach().double().cpu()
    return None


def _widths(layer: nn.Module, heads: int) -> dict[str, Tensor | None]:
    """alpha (isotropic heads) and Sigma^-1 (every quadratic head), on the CPU in float64."""
    if isinstance(getattr(layer, "alpha", None), (int, float)):  # ConvAttention: A = -alpha_h ||delta - Delta||^2
        alpha = layer.alphas.detach().double().cpu()
        return {"alpha": alpha, "inverse_covariance": 2 * alpha[:, None, None] * torch.eye(2, dtype=torch.float64)}
    enc = getattr(layer, "encoding", None)
    if enc is None or not hasattr(enc, "inverse_covariance"):
        return {"alpha": None, "inverse_covariance": None}
    with torch.no_grad():
        s = enc.inverse_covariance().detach().double().cpu()  # (heads, 2, 2)
        alpha = enc.widths.detach().double().cpu() ** 2 / 2 if enc.kind == "isotropic" else None
    return {"alpha": alpha, "inverse_covariance": s}


def _kernel(layer: nn.Module, size: tuple[int, int], x: Tensor | None, probs: Tensor | None) -> EffectiveKernel:
    """The layer's (possibly averaged) probabilities and value maps as an EffectiveKernel."""
    if probs is None and not getattr(layer, "position_only", True):
        if x is None:
            raise AttnconvError("a content-attention layer needs inputs x (B, C, H, W) to average its attention over")
        with torch.no_grad():
            probs = layer.attention_probs(x)  # (B, heads, T_out, T_in)
    if probs is not None and probs.dim() == 4:
        probs = probs.mean(0)
    return effective_kernel(layer, size, probs=probs)


def _window_masses(p: Tensor, keys: Tensor, pos: Tensor, centers: Tensor, size) -> dict[int, Tensor]:
    """Per head, the mass within the 3x3 and 5x5 windows around the rounded center.

    Averaged over the same queries for both sizes, so mass_5x5 >= mass_3x3: those whose
    5x5 window fits the grid, else those whose 3x3 window does, else all queries.
    (`conv_likeness` picks the queries per window size, so its 3x3 and 5x5 masses can
    disagree for heads near the border.)
    """
    shift = centers.round()  # (heads, 2)
    rel = keys[None, :, :] - pos[:, None, :]  # (T_out, T_in, 2)
    limit = torch.tensor(size, dtype=torch.float64)
    first = pos[None] + shift[:, None, :]  # (heads, T_out, 2): the window's middle
    fits = {k: ((first - k // 2 >= 0) & (first + k // 2 < limit)).all(-1) for k in (3, 5)}  # (heads, T_out)
    out = {}
    for k in (3, 5):
        inside = ((rel[None] - shift[:, None, None, :]).abs() <= k // 2).all(-1)  # (heads, T_out, T_in)
        out[k] = (p * inside).sum(-1)  # (heads, T_out)
    result = {3: torch.empty(p.shape[0], dtype=torch.float64), 5: torch.empty(p.shape[0], dtype=torch.float64)}
    for h in range(p.shape[0]):
        use = fits[5][h] if fits[5][h].any() else fits[3][h] if fits[3][h].any() else torch.ones_like(fits[3][h])
        for k in (3, 5):
            result[k][h] = out[k][h][use].mean()
    return result


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _json_ready(obj: Any) -> Any:
    """Non-finite floats (a diverged run's NaNs) become None, so the result is strict JSON."""
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_ready(v) for v in obj]
    return obj


def analyze_layer(
    layer: nn.Module, size: int | Sequence[int], x: Tensor | None = None, *, probs: Tensor | None = None
) -> dict[str, Any]:
    """Centers, widths, distances, window masses and degenerate heads of one attention layer.

    layer: a position-only `SelfAttention2d` or a `ConvAttention` (no input needed), or a
    content `SelfAttention2d` with inputs x (B, C_in, H, W) whose probabilities are averaged.
    size: the input grid (H, W). probs: (heads, T, T) or (B, heads, T, T) probabilities to
    use instead of the layer's own (e.g. a content layer's average inside a model).
    Returns a JSON-ready dict (see the module docstring for each number); non-finite
    numbers (an infinite condition number) are None.
    """
    size = _size(size)
    ek = _kernel(layer, size, x, probs)
    p = ek.probs.double().cpu()  # (heads, T_out, T_in)
    heads, t_out, _ = p.shape
    keys = _grid(size).double()  # (T_in, 2)
    pos = ek.query_pos.double().cpu()  # (T_out, 2): input-frame position of each query
    out_h, out_w = ek.out_size
    mid = (out_h // 2) * out_w + out_w // 2
    rel_mid = keys - pos[mid]  # (T_in, 2)
    p_mid = p[:, mid]  # (heads, T_in)
    mean_shift = (p_mid @ rel_mid) / p_mid.sum(-1, keepdim=True).clamp_min(1e-300)  # (heads, 2)
    own = _own_centers(layer, heads)
    centers = own if own is not None else mean_shift

    # E ||delta|| over interior queries (not on the outer ring of the input grid).
    dist = torch.cdist(pos, keys)  # (T_out, T_in)
    interior = ((pos >= 1) & (pos <= torch.tensor(size, dtype=torch.float64) - 2)).all(-1)
    if not interior.any():
        interior = torch.ones_like(interior)
    avg_distance = (p * dist).sum(-1)[:, interior].mean(-1)  # (heads,)

    pm = p_mid / p_mid.sum(-1, keepdim=True).clamp_min(1e-300)
    entropy = -(pm * pm.clamp_min(1e-300).log()).sum(-1) / math.log(max(p.shape[2], 2))

    like3 = conv_likeness(ek, kernel_size=3)
    like5 = conv_likeness(ek, kernel_size=5)
    masses = _window_masses(p, keys, pos, centers, size)
    widths = _widths(layer, heads)
    s = widths["inverse_covariance"]
    eig = torch.linalg.eigvalsh(s) if s is not None else None  # (heads, 2), ascending

    out_heads = []
    for h in range(heads):
        reasons = []
        alpha = None if widths["alpha"] is None else float(widths["alpha"][h])
        head: dict[str, Any] = {
            "head": h,
            "center": centers[h].tolist(),
            "center_source": "parameter" if own is not None else "mean shift",
            "mean_shift": mean_shift[h].tolist(),
            "alpha": alpha,
            "inverse_covariance": None if s is None else s[h].tolist(),
            "eigenvalues": None if eig is None else eig[h].tolist(),
            "condition": None,
            "avg_distance": float(avg_distance[h]),
            "mass_3x3": float(masses[3][h]),
            "mass_5x5": float(masses[5][h]),
            "entropy": float(entropy[h]),
        }
        if eig is not None:
            lo, hi = float(eig[h, 0]), float(eig[h, 1])
            cond = hi / lo if lo > 0 else math.inf
            head["condition"] = _finite(cond)
            if hi / 2 < UNIFORM_ALPHA:  # alpha along the sharpest axis (= alpha for isotropic heads)
                reasons.append(f"alpha < {UNIFORM_ALPHA:g}: attends almost uniformly")
            if cond > ILL_CONDITIONED:
                reasons.append(f"condition number of the inverse covariance > {ILL_CONDITIONED:g}")
        if head["entropy"] > UNIFORM_ENTROPY:
            reasons.append(f"entropy > {UNIFORM_ENTROPY:g} of uniform at the middle query")
        head["degenerate"] = bool(reasons)
        head["reasons"] = reasons
        out_heads.append(head)

    likeness = like3.to_dict()
    likeness["distance_5x5"] = like5.distance
    return _json_ready({
        "size": list(size),
        "encoding": getattr(layer, "encoding_name", type(layer).__name__),
        "probabilities": (
            "given" if probs is not None else f"mean over {len(x)} inputs" if x is not None else "exact (position-only)"
        ),
        "heads": out_heads,
        "degenerate_heads": [h["head"] for h in out_heads if h["degenerate"]],
        "mean_mass_3x3": float(masses[3].mean()),
        "mean_mass_5x5": float(masses[5].mean()),
        "conv_likeness": likeness,
    })


# ----------------------------------------------------------------------------------------
# Whole models and runs
# ----------------------------------------------------------------------------------------


def analyze_model(model: nn.Module, x: Tensor | None = None, *, probs: list[Tensor] | None = None) -> dict[str, Any]:
    """`analyze_layer` for every attention layer of an attention classifier.

    x: normalized test images (N, C, H, W), needed (and used) only for content attention.
    probs: the per-layer probabilities from `mean_layer_probs`, if already computed.
    """
    layers = attention_layers(model)
    size = token_grid(model)
    content = needs_images(model)
    if probs is None:
        probs = mean_layer_probs(model, x)
    results = []
    for i, (layer, p) in enumerate(zip(layers, probs)):
        r = {"layer": i, **analyze_layer(layer, size, probs=p)}
        r["probabilities"] = (
            f"mean over {len(x)} test images (content attention)" if not layer.position_only
            else "exact (position-only)"
        )
        results.append(r)
    return {
        "size": list(size),
        "thresholds": {"uniform_alpha": UNIFORM_ALPHA, "ill_conditioned": ILL_CONDITIONED,
                       "uniform_entropy": UNIFORM_ENTROPY},
        "images": len(x) if content else 0,
        "layers": results,
    }


def analyze_run(
    run_dir: str | os.PathLike, images: int = 100, *, data_dir: str | os.PathLike | None = None,
    device: str = "cpu",
) -> dict[str, Any]:
    """`analyze_model` of a run directory's weights (content models: over the first `images` test images)."""
    model, config, convs = load_attention_run(run_dir, device)
    if convs:  # converted from a CNN: each layer on its own input grid
        x = run_images(config, images, data_dir=data_dir)[1].to(device) if converted_needs_images(convs) else None
        return {"run": str(run_dir), "model": config.model, "dataset": config.dataset,
                **analyze_converted(convs, converted_probs(model, convs, x), images=0 if x is None else len(x))}
    x = None
    if needs_images(model):
        _, x = run_images(config, images, data_dir=data_dir)
        x = x.to(device)
    result = analyze_model(model, x)
    return {"run": str(run_dir), "model": config.model, "dataset": config.dataset, **result}


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
                    x: Tensor | None = None, *, batch_size: int = _CONVERTED_BATCH) -> list[Tensor]:
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


def analyze_converted(layers: list[tuple[str, nn.Module, tuple[int, int]]], probs: list[Tensor] | None = None,
                      *, images: int = 0) -> dict[str, Any]:
    """`analyze_layer` for each (path, layer, input size) of `converted_layers`.

    probs: `converted_probs` over `images` test images, needed when some layer has
    content attention.
    """
    if probs is None and converted_needs_images(layers):
        raise AttnconvError("content attention depends on the input: give converted_probs over test images")
    results = []
    for i, (path, layer, size) in enumerate(layers):
        r = {"layer": i, "path": path, **analyze_layer(layer, size, probs=None if probs is None else probs[i])}
        r["probabilities"] = ("exact (position-only)" if layer.position_only
                              else f"mean over {images} test images (content attention)")
        results.append(r)
    return {
        "size": None,  # one grid per layer
        "thresholds": {"uniform_alpha": UNIFORM_ALPHA, "ill_conditioned": ILL_CONDITIONED,
                       "uniform_entropy": UNIFORM_ENTROPY},
        "images": images if converted_needs_images(layers) else 0,
        "layers": results,
    }


def conv_head_geometry(layer: nn.Module, size: tuple[int, int], probs: Tensor | None = None) -> dict[str, Any]:
    """`head_geometry` of a (possibly strided) `ConvAttention` on its input grid `size`.

    The query is the middle output pixel, placed on the input grid; the map is its
    attention over the input pixels (from `probs` (heads, T_out, T_in) when given: a
    content layer's mean over images).
    """
    ek = effective_kernel(layer, size, probs=probs)
    out_h, out_w = ek.out_size
    mid = (out_h // 2) * out_w + out_w // 2
    query = tuple(int(v) for v in ek.query_pos[mid])
    p_mid = ek.probs[:, mid].double().cpu()  # (heads, T_in)
    rel = (_grid(size) - torch.tensor(query)).double()
    mean_shift = (p_mid @ rel) / p_mid.sum(-1, keepdim=True).clamp_min(1e-300)
    own = _own_centers(layer, p_mid.shape[0])
    return {
        "centers": own if own is not None else mean_shift,
        "inverse_covariance": _widths(layer, p_mid.shape[0])["inverse_covariance"],
        "query": query,
        "map": p_mid.reshape(-1, *size),
    }


def head_geometry(layer: nn.Module, probs: Tensor, size: tuple[int, int]) -> dict[str, Any]:
    """What the centers figure draws for one layer.

    Returns centers (heads, 2) (the parameter, else the middle query's mean shift),
    inverse_covariance (heads, 2, 2) or None, the middle query `query` (row, col) and its
    probability map `map` (heads, H, W) over the keys.
    """
    H, W = size
    mid = (H // 2) * W + W // 2
    p_mid = probs[:, mid].double().cpu()  # (heads, T)
    rel = (_grid(size) - torch.tensor([H // 2, W // 2])).double()  # (T, 2)
    mean_shift = (p_mid @ rel) / p_mid.sum(-1, keepdim=True).clamp_min(1e-300)
    own = _own_centers(layer, probs.shape[0])
    return {
        "centers": own if own is not None else mean_shift,
        "inverse_covariance": _widths(layer, probs.shape[0])["inverse_covariance"],
        "query": (H // 2, W // 2),
        "map": p_mid.reshape(-1, H, W),
    }


# ----------------------------------------------------------------------------------------
# Text
# ----------------------------------------------------------------------------------------


def _num(v: float | None, fmt: str = ".3g") -> str:
    return "-" if v is None else format(v, fmt)


def format_analysis(result: dict[str, Any]) -> str:
    """A readable table per layer of `analyze_run` / `analyze_model` output."""
    lines = []
    if "run" in result:
        grid = ("each layer on its own input grid (converted from a CNN)" if result["size"] is None
                else f"token grid {result['size'][0]}x{result['size'][1]}")
        lines.append(f"run {result['run']}: {result['model']} on {result['dataset']}, {grid}")
    t = result["thresholds"]
    lines.append(f"degenerate: alpha < {t['uniform_alpha']:g}, condition > {t['ill_conditioned']:g}, "
                 f"or entropy > {t['uniform_entropy']:g}; shifts are (row, col) in tokens")
    for layer in result["layers"]:
        like = layer["conv_likeness"]
        lines.append("")
        where = f"{layer['path']}, {layer['size'][0]}x{layer['size'][1]} input; " if "path" in layer else ""
        lines.append(f"layer {layer['layer']} ({where}{layer['encoding']}; probabilities: {layer['probabilities']})")
        lines.append(f"  distance to the nearest 3x3 conv {like['distance']:.3f} (5x5: {like['distance_5x5']:.3f}); "
                     f"mean window mass 3x3 {layer['mean_mass_3x3']:.3f}, 5x5 {layer['mean_mass_5x5']:.3f}; "
                     f"degenerate heads: {len(layer['degenerate_heads'])}/{len(layer['heads'])}")
        lines.append(f"  {'head':>4} {'center':>15} {'alpha':>8} {'eig(S^-1)':>17} {'cond':>8} "
                     f"{'avg dist':>8} {'m3x3':>6} {'m5x5':>6} {'entropy':>7}  flags")
        for h in layer["heads"]:
            center = f"({h['center'][0]:+.2f}, {h['center'][1]:+.2f})"
            eig = "-" if h["eigenvalues"] is None else f"{h['eigenvalues'][0]:.3g}, {h['eigenvalues'][1]:.3g}"
            flags = "DEGENERATE: " + "; ".join(h["reasons"]) if h["degenerate"] else ""
            lines.append(
                f"  {h['head']:>4} {center:>15} {_num(h['alpha']):>8} {eig:>17} {_num(h['condition']):>8} "
                f"{h['avg_distance']:>8.2f} {h['mass_3x3']:>6.3f} {h['mass_5x5']:>6.3f} {h['entropy']:>7.3f}  {flags}"
            )
    return "\n".join(lines) + "\n"
