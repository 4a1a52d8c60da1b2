"""Where a model attends: one list of attention sites for every kind of attention network.

An attention classifier (sa-*) has one `SelfAttention2d` per block, all on the token grid; a
CNN converted to attention (`attnconv convert`, `train --init-from`) has one `ConvAttention`
per convolution, each on its own input grid; any other model (the ViT, a model built from
`nn.MultiheadAttention` or `scaled_dot_product_attention`) has the attention computations
`attnconv.models.capture` sees, each a `CapturedLayer`. All are described the same way, so the
analysis, the figures, the report and the explorer need no branch on which one they hold:

    sites = attention_sites(model, (C, H, W))     # [AttentionSite(path, layer, size), ...]
    probs = site_probs(model, sites, x)           # (heads, T_out, T_in) per site

Every site's layer follows the `AttentionLayer` protocol.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from attnconv.attention import SelfAttention2d
from attnconv.construct import ConvAttention
from attnconv.errors import AttnconvError, caller_warning, user_frame
from attnconv.limits import (
    MAX_SIDE,
    check_memory,
    is_whole,
    positive_ints,
    shown_value,
    tensor_argument,
    whole_number,
)
from attnconv.models.capture import (
    MAX_BYTES,
    CapturedAttention,
    CapturedLayer,
    capture_pass,
    check_capturable,
    first_input,
    native_layer,
)
from attnconv.models.capture_numbers import check_grid, check_leading, check_native_probs, check_values
from attnconv.modes import eval_mode

# Images per forward pass when averaging content attention (keeps (B, heads, T_out, T_in) small).
BATCH = 16
TERMS = ("combined", "position")
ALL_TERMS = ("combined", "content", "position")  # a content layer's terms (`site_terms`)


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


class NoAttentionLayers(AttnconvError):
    """A model in which `attention_sites` finds no attention layer (a CNN; `computations` True where it saw attention
    that the measures cannot take: cross-attention, tokens on no grid, a ViT of one patch)."""

    computations = False

    @classmethod
    def seen(cls, message: str) -> NoAttentionLayers:
        err = cls(message)
        err.computations = True
        return err


def attention_sites(model: nn.Module, input_shape: Sequence[int] | None = None,
                    grid: Sequence[int] | None = None, *, leading: int | None = None,
                    trailing: int | None = None) -> list[AttentionSite]:
    """Every attention layer of `model`, first to last (NoAttentionLayers for a model without one, a CNN).

    input_shape (C, H, W): needed for converted networks and captured attention, whose grids are
    found by one forward pass of two images (fixed draws), or of one for a model that takes no more (default:
    the model's config, in_channels and image_size, when it has one); classifiers know their token grid. Other models get, in call
    order, their `SelfAttention2d` and multi-head 2-d `ConvAttention` layers and the other
    computations `capture_attention` sees on an image grid (`nn.MultiheadAttention`,
    `scaled_dot_product_attention`: a ViT with a converted patch embedding has both), these as
    grid: the token grid (H, W) of the captured computations, when their token count cannot tell
    (`capture_attention`'s `grid`, and `leading` and `trailing` where tokens follow the image positions; without
    them the count
    and input_shape's (H, W) decide);
    `CapturedLayer`s (their probabilities come from running the model: `site_probs`). A TorchScript
    or torch.compile'd model is refused in words (`capture.check_capturable`).
    """
    if not isinstance(model, nn.Module):
        raise AttnconvError(f"attention_sites takes an nn.Module, got {type(model).__name__}")
    layers = getattr(model, "attention_layers", None)
    if layers:
        config = getattr(model, "config", None)
        grid = getattr(config, "grid", None)
        if not is_whole(grid, 1, MAX_SIDE):  # a user's own config put in its place, or none left
            raise AttnconvError(f"{type(model).__name__}.config is {shown_value(config)}, not the config build_model "
                                "gave it, whose grid says its attention layers' grids; leave model.config as built")
        return [AttentionSite(f"layers.{i}.attention", layer, (grid, grid)) for i, layer in enumerate(layers)]
    config = getattr(model, "config", None)
    if input_shape is None and hasattr(config, "in_channels") and hasattr(config, "image_size"):
        input_shape = (config.in_channels, config.image_size, config.image_size)
    grid = check_grid(grid)
    leading, trailing = check_leading(leading, grid), check_leading(trailing, grid, "trailing")
    if input_shape is not None:
        input_shape = positive_ints(input_shape, 3, "input_shape", "the images' (C, H, W)")
    # Converted CNNs' multi-head 2-d ConvAttention (1x1 convs: one head, nothing to see), the SelfAttention2d
    # layers of any other model (called as modules, so pre-hooks see their inputs), and every other attention
    # computation the pass sees (nn.MultiheadAttention, scaled_dot_product_attention: a ViT whose patch
    # embedding was converted keeps its own attention blocks), in call order.
    native = any(native_layer(m) for m in model.modules())
    if input_shape is None:
        if native:
            raise AttnconvError("this network's attention layers need its input shape (C, H, W) to find their grids")
        raise AttnconvError(f"{type(model).__name__}: give its input shape (C, H, W) to find its attention")
    check_capturable(model, "attention_sites")
    param = next(iter(model.parameters()), None)
    # Two images, not one: queries shared by every image (learned queries broadcast or expanded) are told apart
    # from the images' own only where there is more than one image; one for a model that takes one image a call.
    # Two fixed draws, in 0.1 to 0.9 (no constant image, which per-image scaling or a log would turn into NaN):
    # tokens the same for both are not the images' own.
    check_memory(16 * math.prod(input_shape), f"probe images of shape {tuple(input_shape)}", "give the input shape the "
                 "model takes (C, H, W)")  # two float32 draws, and as much again for the model's first layer
    draw = torch.rand(2, *input_shape, generator=torch.Generator().manual_seed(0)) * 0.8 + 0.1
    probe = draw.to(device=param.device if param is not None else "cpu",
                    dtype=param.dtype if param is not None and param.is_floating_point() else torch.float32)
    said: list = []  # the pass's own warnings (a grid guess), said once the pass whose records are kept is known
    try:
        try:
            records = capture_pass(model, probe, grid, MAX_BYTES, False, native_probs=False, leading=leading,
                                   trailing=trailing, deferred=said)
        except (AttnconvError, Warning):
            raise
        except Exception:  # a model that takes one image a call: shared queries are then not told
            records = capture_pass(model, probe[:1], grid, MAX_BYTES, False, native_probs=False, leading=leading,
                                   trailing=trailing)
        else:
            records = _probed_again(model, probe, records, said, grid, leading, trailing)
    except (AttnconvError, Warning):  # a warning the caller turned into an error is theirs, not the model's failure
        raise
    except Exception as err:  # a model that does not take this shape: say so, naming the shape tried
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise NoAttentionLayers(
            f"{type(model).__name__}: no attention layers were found: a forward pass of {tuple(input_shape)} "
            f"images (two, then one), to find its attention, failed ({type(err).__name__}: {first}); give the input "
            "shape it takes, or, if it takes this one, mend what makes its forward fail (a config replaced or edited "
            "after building: build it again)") from None
    sites, seen = [], set()
    for r in records:
        if native_layer(r.module):
            if r.module not in seen:  # a layer called more than once: its first call's grid
                seen.add(r.module)
                sites.append(AttentionSite(r.path, r.module, r.size))
        elif r.size is not None and r.query_size == r.size:
            sites.append(AttentionSite(r.name, CapturedLayer(r.path, r.kind, r.call, r.heads, r.module, r.size,
                                                             r.left_out, image_size=tuple(input_shape[1:])), r.size))
    if sites:
        return sites
    if records:  # attention was seen, none of it self-attention over one image grid: say which and why
        shown = "; ".join(f"{r.name}: {_not_one_grid(r)}" for r in records[:3])
        raise NoAttentionLayers.seen(
            f"{type(model).__name__}: its attention computations are not self-attention over one image grid ({shown}"
            f"{'; ...' if len(records) > 3 else ''}); the per-head measures need that"
            + (" (give grid= where the tokens lie on a grid their count does not tell)"
               if any(r.size is None and "keys" not in r.shared for r in records) else ""))
    raise NoAttentionLayers(
        f"{type(model).__name__} has no attention layers; give a run of an attention model "
        "(sa-quadratic, sa-quadratic-aniso, sa-learned, sa-learned-content, vit) or of a CNN converted to attention")


def check_records(records: Any) -> None:
    """One AttnconvError unless `records` is a sequence of `CapturedAttention` (what capture_attention returns)."""
    if isinstance(records, (str, bytes, torch.Tensor)) or not isinstance(records, Sequence) \
            or not all(isinstance(r, CapturedAttention) for r in records):
        raise AttnconvError(f"records {shown_value(records)} is invalid: give the list capture_attention returns")


def captured_sites(records: Sequence[CapturedAttention]) -> tuple[list[AttentionSite], list[Tensor]]:
    """`capture_attention`'s records as attention sites and their probabilities, for `analysis.analyze_sites`,
    `head_geometry` and the figures: (sites, probs (heads, T_out, T_in) each). Native layers keep their own
    probabilities; captured computations give theirs over the image positions, renormalized
    (`CapturedAttention.image_probs`). A record whose queries and keys are not one image grid (cross-attention,
    tokens on no grid) is one AttnconvError naming it."""
    check_records(records)
    sites, probs = [], []
    for r in records:
        if r.kind in ("SelfAttention2d", "ConvAttention"):  # strided layers have fewer queries than keys
            sites.append(AttentionSite(r.name, r.module, r.size))  # a second call: 'sa#1'
            probs.append(r.probs)
            continue
        if r.size is None or r.query_size != r.size:
            raise AttnconvError(f"{r.name}: its queries and keys are not one image grid ({_not_one_grid(r)}); the "
                                "per-head measures need self-attention over an image")
        sites.append(AttentionSite(r.name, CapturedLayer(r.path, r.kind, r.call, r.heads, r.module, r.size, r.left_out,
                                                         r.image_probs(), image_size=r.image_size), r.size))
        probs.append(r.image_probs())
    return sites, probs


def _not_one_grid(r: CapturedAttention) -> str:
    """Why a record's queries and keys are not one image grid, in words: tokens on no grid, queries on none, or
    queries and keys on grids of their own (a pooled key grid), not what was left out besides."""
    if r.size is None or r.query_size is None:  # tokens on no grid; queries of every image, the keys on theirs
        return r.note()
    return f"queries on {r.query_size[0]}x{r.query_size[1]}, keys on {r.size[0]}x{r.size[1]}" \
        if r.query_size != r.size else r.note() or "cross-attention"


def _probed_again(model: nn.Module, probe: Tensor, records: list[CapturedAttention], said: list,
                  grid: Sequence[int] | None, leading: int | None, trailing: int | None) -> list[CapturedAttention]:
    """`attention_sites`' records, probed again with a zero image and one of 1 to 2 where the two probe images left a
    computation's queries and keys equal by value ("alike": a model that takes the sign of its input, thresholds it,
    or rounds it to integers sees two equal images): the other pair's records where they tell more, else the
    first's, with a warning naming the sites whose learned tokens, if any, could not be told. Only the kept pass's own
    warnings are said (`said` holds the first's; the model's and torch's are said as they occur, by their filters)."""
    alike = sum("alike" in r.shared for r in records)
    if alike:
        other, again_said = torch.zeros_like(probe), []
        other[1] = 1 + torch.rand(probe.shape[1:], generator=torch.Generator().manual_seed(1)).to(other)
        try:
            again = capture_pass(model, other, grid, MAX_BYTES, False, native_probs=False, leading=leading,
                                 trailing=trailing, deferred=again_said)
        except Exception:  # noqa: BLE001 - a model the second pair does not suit (a warning made an error too): the first
            again = None
        if again is not None and sum("alike" in r.shared for r in again) < alike:
            for say in again_said:
                say()
            return again
    for say in said:
        say()
    untold = [r.name for r in records if "alike" in r.shared and r.size is not None and r.query_size == r.size]
    if untold:
        caller_warning(user_frame(), f"{', '.join(untold[:3])}: its queries and keys were the same for both probe "
                       "images (a model that rounds, thresholds or takes the sign of its input), so learned tokens there "
                       "could not be told from the image's positions; capture_attention on real images tells them")()
    return records


def records_heads(model: nn.Module) -> bool:
    """Whether training records the model's heads (heads.jsonl): attention classifiers and models whose attention
    is captured (the ViT); not CNNs, nor networks converted from one. Costs a forward of two images at most."""
    if getattr(model, "attention_layers", None):
        return True
    if any(isinstance(m, (ConvAttention, SelfAttention2d)) for m in model.modules()):
        return False
    try:
        return bool(attention_sites(model))
    except AttnconvError:
        return False


def _captured(sites: Sequence[AttentionSite]) -> list[int]:
    return [i for i, site in enumerate(sites) if isinstance(site.layer, CapturedLayer)]


def _capture_key(layer: CapturedLayer) -> tuple[str, int]:
    return layer.path, layer.call


def _captured_records(model: nn.Module, sites: Sequence[AttentionSite], x: Tensor, *, scores: bool = False) -> list:
    """capture_attention of x, one record per captured site (in the sites' order), each computation read on its
    own site's grid (not one grid for all: a layer of 5x5 tokens is not 4x4 and 9 leading ones)."""
    captured = [sites[i] for i in _captured(sites)]
    check_capturable(model, "the attention sites' model")
    if x.dim() != 4:
        raise AttnconvError(f"images of shape {tuple(x.shape)}: give a batch (N, C, H, W), one image as (1, C, H, W)")
    grids = {_capture_key(site.layer): (site.layer.left_out[1], tuple(site.size)) for site in captured}
    # What the pass says is of computations that are no site (their layout guessed), which attention_sites said when
    # it found the sites: not said again on every batch; but where a site was not captured, it may say why.
    said: list = []
    by_key = {(r.path, r.call): r for r in capture_pass(model, x, None, MAX_BYTES, scores, native_probs=True,
                                                        grids=grids, deferred=said)}
    out = []
    for i in _captured(sites):
        key = _capture_key(sites[i].layer)
        if key not in by_key:
            why = list({say.text: say for say in said if not say.guess  # not layouts guessed; of this site; once each
                        and say.text.startswith(f"{sites[i].layer.path or '(model)'}:")}.values())
            for say in why:
                say()
            raise AttnconvError(f"{sites[i].path}: this attention computation was not captured on these images (it "
                                "did not run" + (", or ran as capture cannot record: see the warnings said)" if why
                                                 else ")"))
        r, size, found = by_key[key], tuple(sites[i].size), getattr(sites[i].layer, "image_size", None)
        if found is not None and tuple(x.shape[-2:]) != tuple(found):  # a grid of as many tokens may be another
            raise AttnconvError(f"{sites[i].path}: the sites were found for {found[0]}x{found[1]} images, these are "
                                f"{x.shape[-2]}x{x.shape[-1]}; find them again with these images' shape "
                                "(attention_sites(model, (C, H, W)))")
        if r.size is not None and r.query_size is None:  # queries of every image that the sites' pass could not tell
            raise AttnconvError(f"{sites[i].path}: on these images its queries are the same for every image "
                                "(learned queries, on no image grid), not the image's own positions: it is no "
                                "self-attention over the image, which the per-head measures need")
        if r.size != size or r.query_size != size:  # other images than the sites were found for: another grid
            where = "no image grid" if r.size is None else f"{r.query_size[0]}x{r.query_size[1]} queries and " \
                f"{r.size[0]}x{r.size[1]} keys"
            raise AttnconvError(f"{sites[i].path}: on these images ({'x'.join(map(str, x.shape[-2:]))}) its tokens lie "
                                f"on {where}, not on the site's {size[0]}x{size[1]}: the sites were found for other "
                                "images; find them again with these images' shape (attention_sites(model, (C, H, W)))")
        out.append(r)
    return out


def needs_inputs(sites: Sequence[AttentionSite]) -> bool:
    """True when some site's attention depends on its input (content attention)."""
    return any(not site.position_only for site in sites)


def site_images(x: Tensor, who: str, sites: Sequence[AttentionSite]) -> None:
    """One AttnconvError naming x unless it is a dense tensor with values (not on the meta device), of dimensions,
    all finite (`capture_numbers.check_values`: NaN make attention undefined); in a dtype attnconv's layers compute
    in where a site is one of them (their models take normalized images). Images for captured sites only may be of
    any dtype: a user's model may take uint8 images and normalize them itself, as `capture_attention` takes them."""
    native = len(_captured(sites)) < len(sites)
    tensor_argument(x, "x", f"{'normalized ' * native}images (N, C, H, W) for {who}", values=True, floating=native)
    check_values(x, who)


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
    Captured sites (`CapturedLayer`): the mean attention between image positions, renormalized over
    them (a class token's share left out); they have no positional term alone, so "position" gives
    the same.
    """
    if term not in TERMS:
        raise AttnconvError(f"term must be one of {', '.join(TERMS)}, got {term!r}")
    batch_size = whole_number(batch_size, "batch_size", "a number of images", most=math.inf)  # past them: all
    exact = [site.layer.attention_probs(size=site.size)[0].float() if site.position_only else None for site in sites]
    for site, probs in zip(sites, exact):
        if probs is not None:
            check_native_probs(probs, site.path, probs.dtype)
    if x is not None:  # checked even where no layer needs it: what is given is what the caller thinks is used
        site_images(x, "site_probs", sites)
    if not needs_inputs(sites):
        return exact
    if x is None:
        raise AttnconvError("content attention depends on the input: give test images to average over")
    if len(x) == 0:
        raise AttnconvError("content attention depends on the input: give test images to average over")
    captured = _captured(sites)
    native = [i for i in range(len(sites)) if i not in captured]
    sums: list[Tensor | float] = [0.0] * len(sites)
    for batch in x.split(max(1, min(batch_size, len(x)))):  # more than the images: all at once
        if native:
            inputs = site_inputs(model, [sites[i] for i in native], batch)
            for i, inp in zip(native, inputs):
                if exact[i] is None:
                    sums[i] = sums[i] + sites[i].layer.attention_probs(inp, term=term).float().sum(0)
        if captured:  # no positional term of their own: "position" is their attention too
            for i, r in zip(captured, _captured_records(model, sites, batch)):
                sums[i] = sums[i] + r.probs.double() * len(batch)
    out = [p if p is not None else s / len(x) for p, s in zip(exact, sums)]
    for i in native:  # a layer's weights of NaN: refused, as capture_attention refuses them
        if exact[i] is None:
            check_native_probs(out[i], sites[i].path, out[i].dtype)
    for i in captured:  # over the image positions, renormalized (what the measures see)
        total = out[i].sum(-1, keepdim=True)
        out[i] = torch.where(total > 0, out[i] / total.clamp_min(1e-300), out[i]).float()
    return out


def site_scores(model: nn.Module, sites: Sequence[AttentionSite], x: Tensor) -> list[dict[str, Tensor]]:
    """Each site's score terms (each (1, heads, T_out, T_in), float32) for ONE image x (1, C, H, W).

    `attention_scores` of the layer on its input ("combined", "position"[, "content"]); captured
    sites: "combined" and "content" (q k^T * scale) over the image positions (`capture_attention`).
    Their softmax over the keys is the attention over the image positions, renormalized.
    """
    site_images(x, "site_scores", sites)
    if len(x) != 1:
        raise AttnconvError(f"site_scores takes one image, got {len(x)}")
    captured = _captured(sites)
    native = [i for i in range(len(sites)) if i not in captured]
    out: list[dict[str, Tensor]] = [{} for _ in sites]
    with torch.no_grad():
        if native:
            inputs = site_inputs(model, [sites[i] for i in native], x)
            for i, inp in zip(native, inputs):
                out[i] = sites[i].layer.attention_scores(inp)
                for scores in out[i].values():  # weights of NaN: refused, as capture_attention refuses them
                    check_native_probs(scores.masked_fill(scores.isneginf(), 0.0), sites[i].path, scores.dtype,
                                       "scores")
        if captured:
            for i, r in zip(captured, _captured_records(model, sites, x, scores=True)):
                out[i] = {t: s.float().unsqueeze(0) for t, s in r.scores.items()}
    return out


def site_terms(site: AttentionSite) -> tuple[str, ...]:
    """The score terms a site's layer has: its own `score_terms` (captured layers: combined and content), else
    combined and position, and content for content layers."""
    own = getattr(site.layer, "score_terms", None)
    if own is not None:
        return tuple(own)
    return TERMS if site.position_only else ALL_TERMS


def site_maps(model: nn.Module, sites: Sequence[AttentionSite], x: Tensor, *, mode: str = "probs",
              term: str = "combined") -> list[Tensor | None]:
    """Each site's attention for ONE image x (1, C, H, W): (heads, T_out, T_in) float32, None where the layer has
    no such term (`site_terms`: a position-only layer's content term).

    mode "scores": the pre-softmax term (`site_scores`). "probs": the layer's own probabilities of it, its
    `attention_probs` (a padded layer folds its padding keys onto the pixels they copy, so these are not always
    the softmax of the scores over the pixels); captured sites: the softmax of their scores over the image
    positions. Position-only layers need no forward pass for probabilities.
    """
    if mode not in ("probs", "scores"):
        raise AttnconvError(f"mode must be probs or scores, got {mode!r}")
    site_images(x, "site_maps", sites)
    if len(x) != 1:
        raise AttnconvError(f"site_maps takes one image, got {len(x)}")
    if term not in ALL_TERMS:
        raise AttnconvError(f"term must be one of {', '.join(ALL_TERMS)}, got {term!r}")
    out: list[Tensor | None] = [None] * len(sites)
    have = [i for i, site in enumerate(sites) if term in site_terms(site)]
    captured = set(_captured(sites))
    own = [i for i in have if mode == "probs" and i not in captured]  # the layer's attention_probs
    mean = [i for i in have if mode == "probs" and i in captured and term != "content"]  # as site_probs takes them
    scored = [i for i in have if i not in own and i not in mean]  # from their scores (windows: averaged scores)
    with torch.no_grad():
        for i, probs in zip(mean, site_probs(model, [sites[i] for i in mean], x, term=term) if mean else []):
            out[i] = probs
        fixed = [i for i in own if sites[i].position_only]
        for i in fixed:
            out[i] = sites[i].layer.attention_probs(size=sites[i].size, term=term)[0].float()
            check_native_probs(out[i], sites[i].path, out[i].dtype)
        content = [i for i in own if i not in fixed]
        if content:
            for i, inp in zip(content, site_inputs(model, [sites[i] for i in content], x)):
                out[i] = sites[i].layer.attention_probs(inp, term=term)[0].float()
                check_native_probs(out[i], sites[i].path, out[i].dtype)
        if scored:
            for i, terms in zip(scored, site_scores(model, [sites[i] for i in scored], x)):
                values = terms[term][0].float()
                out[i] = values.softmax(-1) if mode == "probs" else values
    return out


def capture_inputs(model: nn.Module, modules: Sequence[nn.Module], x: Tensor) -> dict[nn.Module, Tensor]:
    """What each of `modules` receives when `model` runs on x: {module: its first positional argument, or `x=`}.

    One forward pass in eval mode without autograd, with a forward pre-hook on each module; a
    module called more than once keeps its first input, one never called is absent, and the
    dict is in call order. The hooks are removed and the training mode restored however the pass
    ends. Pre-hooks fire on `module(...)` calls only. Two passes of
    one model at once would see each other's hooks: callers sharing a model across threads lock.
    """
    seen: dict[nn.Module, Tensor] = {}

    def grab(module, args, kwargs):
        x = first_input(args, kwargs)  # `layer(x)` or `layer(x=...)`
        if x is not None:
            seen.setdefault(module, x.detach())

    with contextlib.ExitStack() as hooks, torch.no_grad(), eval_mode(model):
        for m in modules:
            hooks.callback(m.register_forward_pre_hook(grab, with_kwargs=True).remove)
        model(x)
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
