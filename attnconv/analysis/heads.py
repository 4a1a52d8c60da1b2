"""Per-head and per-layer numbers of trained attention: centers, widths, distances, masses, conv-likeness.

See the `attnconv.analysis` package docstring for the definitions.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from attnconv.analysis.grid import grid_likeness
from attnconv.attention import SelfAttention2d
from attnconv.construct import ConvAttention, EffectiveKernel, conv_likeness, effective_kernel
from attnconv.errors import AttnconvError
from attnconv.limits import (
    is_whole,
    one_image_hint,
    positive_ints,
    probabilities_argument,
    shown_value,
    tensor_argument,
    whole_number,
)
from attnconv.models.capture import CapturedAttention
from attnconv.models.sites import (
    AttentionSite,
    attention_sites,
    captured_sites,
    check_records,
    needs_inputs,
    site_probs,
)
from attnconv.runs import Run, as_run

UNIFORM_ALPHA = 1e-2
ILL_CONDITIONED = 1e3
UNIFORM_ENTROPY = 0.98


def _size(size: int | Sequence[int]) -> tuple[int, int]:
    """(H, W) from `size`, one side for a square too; one AttnconvError naming `size` for anything else."""
    if is_whole(size):
        size = (size, size)
    return positive_ints(size, 2, "size", "the layer's input grid (H, W)")


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


def _check_given(x: Tensor | None, probs: Tensor | None) -> None:
    """One AttnconvError for inputs x or probabilities given that are no tensor with values, or probabilities that
    are not (NaN, negative, rows past 1), before any is computed with (`limits.tensor_argument`)."""
    if x is not None:
        tensor_argument(x, "x", "inputs (B, C_in, H, W)", values=True, finite=True)
    if probs is not None:
        probabilities_argument(probs, "probs", "probabilities (heads, T_out, T_in) or (B, heads, T_out, T_in)")


def _linear(layer: nn.Module) -> bool:
    """Whether the layer's value maps are known, so that it is a linear map with a conv-likeness (captured
    attention from a module whose projections are unknown is not)."""
    return bool(getattr(layer, "has_value_maps", True))


def _probs_on_grid(layer: nn.Module, size: tuple[int, int], x: Tensor | None, probs: Tensor | None
                   ) -> tuple[EffectiveKernel | None, Tensor, Tensor, tuple[int, int]]:
    """(the effective kernel or None, probs (heads, T_out, T_in), each query's input-frame position, the output
    grid): from the kernel when the layer has value maps, else from the given probabilities on the input grid."""
    if _linear(layer):
        ek = _kernel(layer, size, x, probs)
        return ek, ek.probs, ek.query_pos, tuple(ek.out_size)
    if probs is None:
        probs = layer.attention_probs()
    if probs.dim() == 4:
        probs = probs.mean(0)
    return None, probs.detach(), _grid(size), size


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


def json_ready(obj: Any) -> Any:
    """Non-finite floats (a diverged run's NaNs) become None, so the result is strict JSON."""
    if isinstance(obj, float):
        return _finite(obj)
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_ready(v) for v in obj]
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
    numbers (an infinite condition number) are None. Heads are numbered from 1 ("head",
    "degenerate_heads"), as in the paper and the figures; "heads" is in head order.
    """
    size = _size(size)
    _check_given(x, probs)
    if x is not None and x.dim() >= 2 and tuple(x.shape[-2:]) != tuple(size):
        raise AttnconvError(f"x of size {tuple(x.shape[-2:])} does not match size {tuple(size)}: give the layer's "
                            f"inputs at {tuple(size)}, or size={tuple(x.shape[-2:])}")
    ek, p, pos, (out_h, out_w) = _probs_on_grid(layer, size, x, probs)
    p = p.double().cpu()  # (heads, T_out, T_in)
    heads, t_out, _ = p.shape
    keys = _grid(size).double()  # (T_in, 2)
    pos = pos.double().cpu()  # (T_out, 2): input-frame position of each query
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

    likeness = None
    if ek is not None:
        likeness = conv_likeness(ek, kernel_size=3).to_dict()
        likeness["distance_5x5"] = conv_likeness(ek, kernel_size=5).distance
    masses = _window_masses(p, keys, pos, centers, size)
    widths = _widths(layer, heads)
    s = widths["inverse_covariance"]
    eig = torch.linalg.eigvalsh(s) if s is not None else None  # (heads, 2), ascending

    out_heads = []
    for h in range(heads):
        reasons = []
        alpha = None if widths["alpha"] is None else float(widths["alpha"][h])
        head: dict[str, Any] = {
            "head": h + 1,  # numbered from 1, as the paper and the figures number heads
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

    return json_ready({
        "size": list(size),
        "encoding": getattr(layer, "encoding_name", type(layer).__name__),
        "probabilities": (
            "given" if probs is not None else f"mean over {len(x)} inputs" if x is not None else "exact (position-only)"
        ),
        "heads": out_heads,
        "degenerate_heads": [h["head"] for h in out_heads if h["degenerate"]],
        "mean_mass_3x3": float(masses[3].mean()),
        "mean_mass_5x5": float(masses[5].mean()),
        "conv_likeness": likeness,  # None: the layer's value maps are unknown (captured attention)
    })


# Test images a content model's snapshot averages its attention over: the FIRST 64 of the test set, as
# `attnconv train` has always taken them for heads.jsonl. Not `runs.run_data.sample_across_classes` (which the
# explorer, report, plot and analyze use): recorded runs' heads.jsonl depend on these images, and a resumed
# run must append snapshots computed the same way. In an image folder they may all be of one class.
SNAPSHOT_IMAGES = 64


@torch.no_grad()
def head_snapshot(model: nn.Module, x: Tensor | None = None) -> list[list[dict[str, Any]]]:
    """Where every head of an attention classifier looks: one line of `heads.jsonl` (its "layers").

    Per layer, a list of heads, each with
      - center: [row, col] in tokens; the quadratic encoding's Delta_h (Lemma 2), else the
        center of mass of the middle query's position-only attention (Eq. 6 without the
        content term; content layers: averaged over the images x);
      - attention_distance: E ||k - q|| under the head's attention, averaged over all queries
        (ViT's "mean attention distance"; content layers: averaged over the images x);
      - alpha (isotropic quadratic heads: A = -alpha ||delta - Delta||^2), or
        inverse_covariance (other quadratic heads: Sigma^-1, 2x2).
    x: normalized images (N, C, H, W), needed only when some layer has content attention
    (training passes the first `SNAPSHOT_IMAGES` test images, see there).
    Costs a forward of x through the model at most; the model's mode is kept.
    """
    if not isinstance(model, nn.Module):
        raise AttnconvError(f"head_snapshot takes an nn.Module, got {type(model).__name__}")
    if not getattr(model, "attention_layers", None) and any(isinstance(m, (ConvAttention, SelfAttention2d))
                                                            for m in model.modules()):
        raise AttnconvError("head_snapshot takes an attention classifier (build_model's sa-* models) or a model whose "
                            "attention is captured (a ViT), as training records them; this network's own attention "
                            "layers (a CNN converted by cnn_to_attention, say) are analysed by analyze_layer, or by "
                            "capture_attention and analyze_captured")
    _check_given(x, None)
    config = getattr(model, "config", None)
    sized = hasattr(config, "in_channels") and hasattr(config, "image_size")  # build_model's: its own input shape
    if x is not None and sized and tuple(x.shape[1:]) != (config.in_channels, config.image_size, config.image_size):
        raise AttnconvError(f"x is {tuple(x.shape)}: head_snapshot takes images of the model's own shape (N, "
                            f"{config.in_channels}, {config.image_size}, {config.image_size}), on whose grid training "
                            f"records the heads{one_image_hint(x, config.in_channels)}")
    try:  # a model of no config of its own (a user's, a CNN) is probed on the shape of x
        sites = attention_sites(model, None if x is None or sized else tuple(x.shape[1:]))
    except AttnconvError as err:
        if "give its input shape" not in str(err):
            raise
        raise AttnconvError(f"head_snapshot: {type(model).__name__} has no config saying its input shape: give its "
                            "images x (N, C, H, W), on which its attention is found") from None
    size = sites[0].size
    try:
        combined = site_probs(model, sites, x)
        position = site_probs(model, sites, x, term="position") if needs_inputs(sites) else combined
    except AttnconvError:
        raise
    except Exception as err:  # the model's own forward: a config replaced or edited after building, say
        first = (str(err).strip().splitlines() or [""])[0]
        raise AttnconvError(f"head_snapshot: {type(model).__name__}'s forward failed ({type(err).__name__}: {first}); "
                            "a model computes as it was built, and its config replaced or edited since is not followed: "
                            "build the model again, or mend its forward") from None
    keys = _grid(size).double()  # (T, 2)
    distance = torch.cdist(keys, keys)  # (T, T): ||k - q|| in tokens
    mid = (size[0] // 2) * size[1] + size[1] // 2
    rel_mid = keys - keys[mid]  # (T, 2)
    out = []
    for layer, p, pp in zip((site.layer for site in sites), combined, position):
        p, p_mid = p.double().cpu(), pp[:, mid].double().cpu()  # (heads, T, T), (heads, T)
        heads = p.shape[0]
        mean_distance = (p * distance).sum(-1).mean(-1)  # (heads,)
        centers = _own_centers(layer, heads)
        if centers is None:
            centers = (p_mid @ rel_mid) / p_mid.sum(-1, keepdim=True).clamp_min(1e-300)
        widths = _widths(layer, heads)
        entries = []
        for h in range(heads):
            head: dict[str, Any] = {"center": centers[h].tolist(), "attention_distance": float(mean_distance[h])}
            if widths["alpha"] is not None:
                head["alpha"] = float(widths["alpha"][h])
            elif widths["inverse_covariance"] is not None:
                head["inverse_covariance"] = widths["inverse_covariance"][h].tolist()
            entries.append(head)
        out.append(entries)
    return json_ready(out)


def analyze_sites(sites: list[AttentionSite], probs: list[Tensor], *, images: int = 0) -> dict[str, Any]:
    """`analyze_layer` for every attention site of a model (`attnconv.models.sites.attention_sites`).

    probs: each site's probabilities (`site_probs`), averaged over `images` test images where
    some layer has content attention. The result's "size" is the common grid, or None when the
    layers see different grids (a converted CNN). Layers are numbered from 1 ("layer"), heads too.
    """
    images = whole_number(images, "images", "how many test images the probabilities average (0: exact)", least=0)
    if not isinstance(probs, (list, tuple)) or len(probs) != len(sites):
        raise AttnconvError(f"probs {shown_value(probs)} is invalid: give one (heads, T_out, T_in) tensor per site "
                            f"({len(sites)}), as site_probs gives them")
    for i, p in enumerate(probs):
        probabilities_argument(p, f"probs[{i}]", f"site {i + 1}'s probabilities (heads, T_out, T_in)")
    results = []
    for i, (site, p) in enumerate(zip(sites, probs)):
        r = {"layer": i + 1, "path": site.path, **analyze_layer(site.layer, site.size, probs=p)}
        r["probabilities"] = ("exact (position-only)" if site.position_only
                              else f"mean over {images} test images ({getattr(site.layer, 'note', 'content attention')})")
        results.append(r)
    sizes = {site.size for site in sites}
    return {
        "size": list(next(iter(sizes))) if len(sizes) == 1 else None,
        "thresholds": {"uniform_alpha": UNIFORM_ALPHA, "ill_conditioned": ILL_CONDITIONED,
                       "uniform_entropy": UNIFORM_ENTROPY},
        "images": images if needs_inputs(sites) else 0,
        "layers": results,
    }


def analyze_captured(records: Sequence[CapturedAttention]) -> dict[str, Any]:
    """`analyze_sites` of `capture_attention`'s records (each computation a layer, numbered from 1 in call order).

    The measures see each captured head's attention over the image positions, renormalized over them
    (a class token's share left out; `CapturedAttention.extra_mass` keeps it); conv-likeness where the
    value maps are known (`nn.MultiheadAttention`, modules with `value_maps()`), else None.
    """
    check_records(records)
    if not records:
        raise AttnconvError("capture_attention saw no attention computation: nothing to analyze")
    sites, probs = captured_sites(records)
    return analyze_sites(sites, probs, images=max(r.images for r in records))


def analyze_run(run: Run | str | os.PathLike, images: int = 100, *, data_dir: str | os.PathLike | None = None,
                dataset: str | None = None, device: str | None = None) -> dict[str, Any]:
    """`analyze_sites` of a run's trained model (content layers over `images` test images sampled across
    the classes, `Run.test_images`), plus the grid-likeness over training from heads.jsonl ("history"; [] where
    the run recorded none, a CNN or a run trained before heads.jsonl: the same keys for every run). Layers and heads
    are numbered from 1, as in the paper and the figures."""
    run = as_run(run, device, data_dir=data_dir, dataset=dataset)
    probs, n = run.site_probs(images)
    result = analyze_sites(run.sites, probs, images=n)
    history = grid_likeness(run.heads)  # [] for runs trained before heads.jsonl
    return {"run": str(run.path), "model": run.config.model, "dataset": run.config.dataset, **result, "history": history}


def head_geometry(layer: nn.Module, size: tuple[int, int], probs: Tensor | None = None) -> dict[str, Any]:
    """What the centers figure draws for one attention layer on its input grid `size`.

    The query is the middle output pixel, placed on the input grid (strided layers have fewer
    outputs); the map is its attention over the input pixels (from `probs` (heads, T_out, T_in)
    when given: a content layer's mean over images). Returns centers (heads, 2) (the parameter,
    else the mean shift of the map), inverse_covariance (heads, 2, 2) or None, the query
    (row, col) and its map (heads, H, W).
    """
    size = positive_ints(size, 2, "size", "the layer's input grid (H, W), as an AttentionSite's size holds it")
    _check_given(None, probs)
    if _linear(layer):
        ek = effective_kernel(layer, size, probs=probs)
        p, query_pos, (out_h, out_w) = ek.probs, ek.query_pos, ek.out_size
    else:
        _, p, query_pos, (out_h, out_w) = _probs_on_grid(layer, tuple(size), None, probs)
    mid = (out_h // 2) * out_w + out_w // 2
    query = tuple(int(v) for v in query_pos[mid])
    p_mid = p[:, mid].double().cpu()  # (heads, T_in)
    rel = (_grid(size) - torch.tensor(query)).double()
    mean_shift = (p_mid @ rel) / p_mid.sum(-1, keepdim=True).clamp_min(1e-300)
    own = _own_centers(layer, p_mid.shape[0])
    return {
        "centers": own if own is not None else mean_shift,
        "inverse_covariance": _widths(layer, p_mid.shape[0])["inverse_covariance"],
        "query": query,
        "map": p_mid.reshape(-1, *size),
    }


def _num(v: float | None, fmt: str = ".3g") -> str:
    return "-" if v is None else format(v, fmt)


def format_analysis(result: dict[str, Any]) -> str:
    """A readable table per layer of `analyze_run` / `analyze_sites` output."""
    lines = []
    if "run" in result:
        grid = ("each layer on its own input grid" if result["size"] is None
                else f"token grid {result['size'][0]}x{result['size'][1]}")
        lines.append(f"run {result['run']}: {result['model']} on {result['dataset']}, {grid}")
    t = result["thresholds"]
    lines.append(f"degenerate: alpha < {t['uniform_alpha']:g}, condition > {t['ill_conditioned']:g}, "
                 f"or entropy > {t['uniform_entropy']:g}; shifts are (row, col) in tokens")
    for layer in result["layers"]:
        like = layer["conv_likeness"]
        lines.append("")
        where = (f"{layer['path']}, {layer['size'][0]}x{layer['size'][1]} input; " if result.get("size", 0) is None
                 else "")
        lines.append(f"layer {layer['layer']} ({where}{layer['encoding']}; probabilities: {layer['probabilities']})")
        conv = ("no distance to the nearest conv (value maps unknown)" if like is None else
                f"distance to the nearest 3x3 conv {like['distance']:.3f} (5x5: {like['distance_5x5']:.3f})")
        lines.append(f"  {conv}; mean window mass 3x3 {layer['mean_mass_3x3']:.3f}, 5x5 {layer['mean_mass_5x5']:.3f}; "
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
    if result.get("history"):
        lines.append("")
        lines.append("over training (heads.jsonl): per layer, heads within 0.5 token of a distinct 3x3 kernel offset "
                     "(Hungarian matching), the mean matched distance, and the mean attention distance (tokens)")
        n = len(result["history"][0]["layers"])
        lines.append(f"  {'epoch':>5}  " + "  ".join(f"{f'layer {i + 1}':>19}" for i in range(n)))
        for snap in result["history"]:
            cells = []
            for x in snap["layers"]:
                within = f"{x['within']}/{x['heads']}"
                cells.append(f"{within:>5} {_num(x['mean_distance'], '.2f'):>5} {x['attention_distance']:>6.2f}")
            lines.append(f"  {snap['epoch']:>5}  " + "  ".join(f"{c:>19}" for c in cells))
    return "\n".join(lines) + "\n"
