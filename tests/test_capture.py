"""attnconv.capture_attention: the attention of any model, and the per-head measures on it."""

import dataclasses
import math
import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import attnconv
from attnconv import AttnconvError, SelfAttention2d, analyze_captured, capture_attention, captured_sites
from attnconv.analysis import head_geometry, match_to_grid
from attnconv.errors import AttnconvWarning
from attnconv.models.capture import image_tokens, multihead_value_maps
from attnconv.models.sites import attention_sites, site_inputs
from attnconv.plots import maps_figure


class SDPABlock(nn.Module):
    """A timm-style attention module: one qkv Linear, F.scaled_dot_product_attention, a projection."""

    def __init__(self, dim, heads, *, causal=False, mask=None, scale=None, kv_heads=None):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads or heads, dim // heads
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, 2 * self.kv_heads * self.d)
        self.proj = nn.Linear(dim, dim)
        self.causal, self.mask, self.scale = causal, mask, scale

    def qk(self, x):
        B, N, _ = x.shape
        q = self.q(x).reshape(B, N, self.heads, self.d).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, self.kv_heads, self.d).permute(2, 0, 3, 1, 4)
        return q, k, v

    def forward(self, x):
        q, k, v = self.qk(x)
        extra = {"enable_gqa": True} if self.kv_heads != self.heads else {}
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal, scale=self.scale,
                                             **extra)
        return self.proj(out.transpose(1, 2).reshape(x.shape))


class Tokens(nn.Module):
    """Images (B, C, H, W) -> a class token and H*W pixel tokens, then `body` over them."""

    def __init__(self, channels, dim, body, cls=1):
        super().__init__()
        self.embed = nn.Linear(channels, dim)
        self.cls = nn.Parameter(torch.randn(1, cls, dim)) if cls else None
        self.body = body

    def tokens(self, x):
        t = self.embed(x.flatten(2).transpose(1, 2))
        return t if self.cls is None else torch.cat([self.cls.expand(len(x), -1, -1), t], dim=1)

    def forward(self, x):
        return self.body(self.tokens(x))


def hand_probs(scores: torch.Tensor) -> torch.Tensor:
    return scores.softmax(-1).mean(0)


# ------------------------------------------------------------------------------------------ SelfAttention2d


@pytest.mark.parametrize("encoding", ["learned-content", "quadratic", "quadratic-aniso"])
def test_self_attention_2d_gives_its_own_attention_probs_in_float64(encoding):
    torch.manual_seed(0)
    model = attnconv.build_model(f"sa-{encoding}", hidden=12, heads=4, layers=2, intermediate=8, image_size=12,
                                 downsample=2).double()
    x = torch.randn(3, 3, 12, 12, dtype=torch.float64)
    records = capture_attention(model, x)
    sites = attention_sites(model)
    assert [(r.path, r.kind, r.call) for r in records] == [(s.path, "SelfAttention2d", 0) for s in sites]
    for r, site, inp in zip(records, sites, site_inputs(model, sites, x)):
        want = site.layer.attention_probs(inp).mean(0)  # (heads, T, T): the layer's own, float64
        assert r.probs.dtype == torch.float64 and r.size == (6, 6) and r.extra_mass is None and r.images == 3
        torch.testing.assert_close(r.probs, want, rtol=1e-13, atol=1e-15)


def test_a_plain_self_attention_2d_module_and_its_output_unchanged():
    torch.manual_seed(1)
    layer = SelfAttention2d(5, 5, heads=3, encoding="learned-content").double()
    x = torch.randn(2, 5, 4, 6, dtype=torch.float64)
    before = layer(x)
    (r,) = capture_attention(layer, x)
    assert r.path == "" and r.size == (4, 6) and r.name == "(model)"
    torch.testing.assert_close(r.probs, layer.attention_probs(x).mean(0), rtol=1e-13, atol=1e-15)
    torch.testing.assert_close(layer(x), before, rtol=0, atol=0)


# ------------------------------------------------------------------------------------------ nn.MultiheadAttention


class MHABody(nn.Module):
    def __init__(self, mha, kwargs_of):
        super().__init__()
        self.mha, self.kwargs_of = mha, kwargs_of

    def forward(self, t):
        x = t if self.mha.batch_first else t.transpose(0, 1)
        return self.mha(x, x, x, **self.kwargs_of(t))[0]


@pytest.mark.parametrize("seed", range(8))
def test_multihead_attention_is_recomputed_by_hand_with_the_class_token_left_out(seed):
    g = torch.Generator().manual_seed(seed)
    rnd = lambda *s: torch.rand(s, generator=g).item()  # noqa: E731
    heads = [1, 2, 3][seed % 3]
    dim, side, batch = heads * 4, 3 + seed % 2, 2 + seed % 3
    n = side * side + 1
    mha = nn.MultiheadAttention(dim, heads, batch_first=bool(seed % 2), add_bias_kv=seed in (2, 5),
                                add_zero_attn=seed in (3, 5), bias=seed != 4).double()
    bool_mask = torch.rand(n, n, generator=g) < 0.3
    bool_mask.fill_diagonal_(False)  # every query keeps itself
    float_mask = torch.randn(n, n, generator=g, dtype=torch.float64)
    kpm = torch.zeros(batch, n, dtype=torch.bool)
    kpm[0, -1] = True  # the first image's last pixel is padding
    use = {"attn_mask": bool_mask if rnd() < 0.5 else float_mask} if seed % 4 else {}
    if seed in (1, 6, 7):  # of the attn_mask's kind (torch warns about mixing them)
        floats = use.get("attn_mask", bool_mask).dtype != torch.bool
        use["key_padding_mask"] = torch.zeros(kpm.shape, dtype=torch.float64).masked_fill(kpm, -math.inf) \
            if floats else kpm
    model = Tokens(2, dim, MHABody(mha, lambda t: use)).double()
    x = torch.randn(batch, 2, side, side, dtype=torch.float64, generator=g)
    out = model(x)
    (r,) = capture_attention(model, x)
    assert (r.path, r.kind, r.size, r.query_size) == ("body.mha", "MultiheadAttention", (side, side), (side, side))
    t = model.tokens(x)
    tt = t if mha.batch_first else t.transpose(0, 1)
    weights = mha(tt, tt, tt, need_weights=True, average_attn_weights=False, **use)[1].mean(0)  # (heads, n, S')
    s = n  # keys beyond the sequence (bias_k, zero attention) are not image positions either
    torch.testing.assert_close(r.probs, weights[:, 1:, 1:s], rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(r.extra_mass, weights[:, 1:, 0] + weights[:, 1:, s:].sum(-1), rtol=1e-12, atol=1e-14)
    assert r.left_out == (1, 1, int(mha.bias_k is not None) + int(mha.add_zero_attn))
    assert "1 leading token" in r.note()
    torch.testing.assert_close(model(x), out, rtol=0, atol=0)  # the pass changed nothing


def test_multihead_value_maps_reproduce_the_layer():
    torch.manual_seed(3)
    mha = nn.MultiheadAttention(6, 3, batch_first=True).double()
    x = torch.randn(1, 16, 6, dtype=torch.float64)
    y, w = mha(x, x, x, need_weights=True, average_attn_weights=False)
    maps, bias = multihead_value_maps(mha)
    mine = torch.einsum("hqk,hoc,kc->qo", w[0], maps, x[0]) + bias
    torch.testing.assert_close(mine, y[0], rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------------------------------ scaled_dot_product_attention


@pytest.mark.parametrize("variant", ["plain", "causal", "float-mask", "bool-mask", "scale", "gqa", "float32"])
def test_sdpa_modules_are_recomputed_by_hand_and_left_unchanged(variant):
    torch.manual_seed(4)
    side, dim, heads, batch, cls = 4, 12, 3, 3, 2
    n = side * side + cls
    opts = {"causal": dict(causal=True), "float-mask": dict(mask=torch.randn(heads, n, n, dtype=torch.float64)),
            "bool-mask": dict(mask=torch.rand(n, n) < 0.7), "scale": dict(scale=0.3),
            "gqa": dict(heads=6, kv_heads=2, dim=12)}.get(variant, {})
    if variant == "bool-mask":
        opts["mask"].fill_diagonal_(True)
    heads = opts.pop("heads", heads)
    body = SDPABlock(opts.pop("dim", dim), heads, **opts)
    dtype = torch.float32 if variant == "float32" else torch.float64
    model = Tokens(3, dim, nn.Sequential(body, nn.GELU()), cls=cls).to(dtype)
    x = torch.randn(batch, 3, side, side, dtype=dtype)
    with torch.no_grad():
        before = model(x)
        q, k, _ = body.qk(model.tokens(x))
    (r,) = capture_attention(model, x)
    # By hand: softmax(q k^T * scale + mask), causal from the top left; grouped keys serve several query heads.
    k = k.repeat_interleave(heads // k.shape[1], dim=1).double()
    scores = q.double() @ k.transpose(-1, -2) * (body.scale or 1 / math.sqrt(body.d))
    if body.mask is not None:
        scores = scores.masked_fill(~body.mask, -math.inf) if body.mask.dtype == torch.bool else scores + body.mask
    if body.causal:
        scores = scores.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)
    want = hand_probs(scores)
    assert (r.path, r.kind, r.call, r.size, r.left_out) == ("body.0", "sdpa", 0, (side, side), (cls, cls, 0))
    assert r.probs.dtype == dtype
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(r.probs, want[:, cls:, cls:].to(dtype), **tol)
    torch.testing.assert_close(r.extra_mass, want[:, cls:, :cls].sum(-1).to(dtype), **tol)
    with torch.no_grad():
        torch.testing.assert_close(model(x), before, rtol=0, atol=0)  # the module's output, as it was


def test_calls_in_order_with_a_module_called_twice_and_sdpa_inside_multihead_not_counted_twice():
    torch.manual_seed(5)
    block = SDPABlock(8, 2)
    mha = nn.MultiheadAttention(8, 2, batch_first=True)

    class Body(nn.Module):
        def __init__(self):
            super().__init__()
            self.block, self.mha = block, mha

        def forward(self, t):
            t = self.block(t)
            t = self.mha(t, t, t, need_weights=False)[0]  # takes the SDPA path inside: counted once, as itself
            return self.block(t)

    model = Tokens(1, 8, Body(), cls=1)
    records = capture_attention(model, torch.randn(2, 1, 5, 5))
    assert [(r.name, r.kind) for r in records] == [("body.block", "sdpa"), ("body.mha", "MultiheadAttention"),
                                                   ("body.block#1", "sdpa")]
    assert [r.call for r in records] == [0, 0, 1]
    assert model.training  # the pass ran in eval mode; the mode is restored
    model.eval()
    capture_attention(model, torch.randn(1, 1, 5, 5))
    assert not model.training


def test_tokens_on_no_grid_are_kept_and_said_so_and_the_grid_argument_places_them():
    assert image_tokens(50) == (1, (7, 7)) and image_tokens(49) == (0, (7, 7)) and image_tokens(21) == (5, (4, 4))
    assert image_tokens(3) is None and image_tokens(7, (2, 3)) == (1, (2, 3))
    assert image_tokens(7, aspect=(2, 3)) == (1, (2, 3)) and image_tokens(32, aspect=(16, 32)) == (0, (4, 8))
    assert image_tokens(36, aspect=(3, 12)) == (0, (3, 12)) and image_tokens(36, aspect=(5, 5)) == (0, (6, 6))
    # 8x8 tokens of 16x32 images (a model that resized them) stay a square (they were read as 5x10 + 14 "class
    # tokens"); 4x4 windows folded into the batch are read without the images' shape (tests/test_capture_grids.py)
    assert image_tokens(64, aspect=(16, 32)) == (0, (8, 8)) and image_tokens(16) == (0, (4, 4))
    assert image_tokens(33, aspect=(16, 32)) == (1, (4, 8)) and image_tokens(65, aspect=(16, 32)) == (1, (8, 8))
    torch.manual_seed(6)
    row = Tokens(1, 6, Prefix(SDPABlock(6, 2), 3), cls=0)  # 2 x 2 images, 3 of their tokens: no grid fits
    (r,) = capture_attention(row, torch.randn(2, 1, 2, 2))
    assert r.size is None and r.probs.shape == (2, 3, 3) and r.extra_mass is None and "no image grid" in r.note()
    with pytest.raises(AttnconvError, match="not one image grid"):
        captured_sites([r])
    # 2 x 3 images and a class token: 7 tokens, which the count alone would take for 3 extra and 2 x 2: the
    # images' shape places them (it was the grid argument's to say)
    model = Tokens(1, 6, SDPABlock(6, 2), cls=1)
    x = torch.randn(2, 1, 2, 3)
    for grid in (None, (2, 3)):
        (r,) = capture_attention(model, x, grid=grid)
        assert r.size == (2, 3) and r.probs.shape == (2, 6, 6) and r.left_out == (1, 1, 0)
        torch.testing.assert_close(r.probs.sum(-1) + r.extra_mass, torch.ones(2, 6))
    # attention_sites took every grid for a square (4 x 8 pixels: 7 "class tokens" and 5 x 5): the input's shape
    # places them; grid= says where it cannot
    mha = Tokens(1, 8, MHABody(nn.MultiheadAttention(8, 2, batch_first=True), lambda t: {}), cls=0)
    assert [(s.size, s.layer.left_out) for s in attention_sites(mha, (1, 4, 8))] == [((4, 8), (0, 0, 0))]
    assert [(s.size, s.layer.left_out) for s in attention_sites(mha, (1, 3, 12))] == [((3, 12), (0, 0, 0))]
    assert [s.size for s in attention_sites(mha, (1, 4, 4), grid=(2, 8))] == [(2, 8)]


class Prefix(nn.Module):
    """`body` over the first `n` tokens only."""

    def __init__(self, body, n):
        super().__init__()
        self.body, self.n = body, n

    def forward(self, t):
        return self.body(t[:, :self.n])


# ------------------------------------------------------------------------------------------ limits and inputs


def test_the_memory_limit_refuses_before_allocating():
    torch.manual_seed(7)
    model = Tokens(1, 8, nn.Sequential(SDPABlock(8, 2), SDPABlock(8, 2)), cls=1)
    x = torch.randn(2, 1, 8, 8)
    one = 2 * 64 * 64 * 4  # heads x tokens x tokens x 4 bytes
    assert len(capture_attention(model, x, max_bytes=2 * one)) == 2
    with pytest.raises(AttnconvError, match=r"body\.1 \(2 heads x 64 x 64 tokens\) brings the captured attention "
                       r"to 64\.0 KiB, more than max_bytes 32\.0 KiB; give smaller images"):
        capture_attention(model, x, max_bytes=one + 1)
    # 65,536 tokens: 48 GiB of probabilities (and as much for the model's own attention), refused at once by the
    # default limit, before either is allocated
    big = attnconv.build_model("vit", in_channels=1, image_size=256, patch=1, hidden=6, heads=3, layers=1,
                               intermediate=4)
    with pytest.raises(AttnconvError, match=r"blocks\.0\.attn \(3 heads x 65536 x 65536 tokens\).*48\.0 GiB"):
        capture_attention(big, torch.randn(1, 1, 256, 256))
    assert model.training  # restored after the refusal too
    with pytest.raises(AttnconvError, match="non-empty batch"):
        capture_attention(model, torch.zeros(0, 1, 8, 8))
    with pytest.raises(AttnconvError, match="grid"):
        capture_attention(model, x, grid=(0, 3))


# ------------------------------------------------------------------------------------------ the measures on a capture


class Shift(nn.Module):
    """SDPA whose mask lets each pixel attend only to the pixel `shift` away (itself at the border)."""

    def __init__(self, side, shift, heads=2):
        super().__init__()
        n = side * side
        rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        pos = torch.stack([rows.reshape(-1), cols.reshape(-1)], -1)
        target = pos + torch.tensor(shift)
        inside = ((target >= 0) & (target < side)).all(-1)
        keep = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        keep[0, :] = True
        for q in range(n):
            t = target[q] if inside[q] else pos[q]
            keep[q + 1, 1 + int(t[0]) * side + int(t[1])] = True
        self.register_buffer("keep", keep)
        self.heads = heads

    def forward(self, t):
        B, N, D = t.shape
        q = t.reshape(B, N, self.heads, D // self.heads).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q, attn_mask=self.keep).transpose(1, 2).reshape(B, N, D)


def test_center_of_mass_distance_grid_likeness_and_maps_work_on_the_result():
    side = 5
    model = Tokens(1, 4, Shift(side, (0, 1)), cls=1)
    records = capture_attention(model, torch.randn(3, 1, side, side))
    result = analyze_captured(records)
    (layer,) = result["layers"]
    assert layer["encoding"] == "captured sdpa" and "1 leading token" in layer["probabilities"]
    assert layer["conv_likeness"] is None  # no value maps known for this module
    for h in layer["heads"]:
        assert h["center"] == pytest.approx([0.0, 1.0]) and h["center_source"] == "mean shift"
        assert h["avg_distance"] == pytest.approx(1.0)  # interior queries all look one column right
        assert h["mass_3x3"] == pytest.approx(1.0)
    sites, probs = captured_sites(records)
    geometry = head_geometry(sites[0].layer, sites[0].size, probs[0])
    assert geometry["query"] == (2, 2) and np.allclose(geometry["centers"], [[0, 1], [0, 1]])
    assert match_to_grid(geometry["centers"], kernel=3)["within"] == 1  # both heads on one offset: one matched
    fig = maps_figure(probs, sites[0].size, (2, 2), 5)
    assert len(fig.axes) == 2  # one layer x two heads


def test_conv_likeness_applies_where_value_maps_are_known():
    torch.manual_seed(8)
    model = Tokens(3, 6, MHABody(nn.MultiheadAttention(6, 3, batch_first=True), lambda t: {}), cls=1)
    result = analyze_captured(capture_attention(model, torch.randn(2, 3, 4, 4)))
    like = result["layers"][0]["conv_likeness"]
    assert like is not None and 0 <= like["distance"] <= 1 and like["heads"] == 3
    vit = attnconv.build_model("vit", in_channels=1, image_size=12, hidden=12, heads=3, layers=2, intermediate=8)
    result = analyze_captured(capture_attention(vit, torch.randn(2, 1, 12, 12)))
    assert [x["path"] for x in result["layers"]] == ["blocks.0.attn", "blocks.1.attn"]
    assert all(x["conv_likeness"] is not None for x in result["layers"]) and result["size"] == [3, 3]
    with pytest.raises(AttnconvError, match="saw no attention"):
        analyze_captured([])


# ------------------------------------------------------------------------------------------ modes and refusals


class FrozenNormDropout(nn.Module):
    """A Tokens model with a BatchNorm kept in eval mode while the rest trains (frozen statistics) and a dropout
    kept in train mode while the rest evaluates (Monte-Carlo dropout): each module's flag is its own."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(2)
        self.drop = nn.Dropout(0.5)
        self.body = Tokens(2, 4, MHABody(nn.MultiheadAttention(4, 2, batch_first=True), lambda t: {}))
        self.head = nn.Linear(4, 3)

    def forward(self, x):
        return self.head(self.drop(self.body(self.norm(x)).mean(1)))


@pytest.mark.parametrize("outer", [True, False])
def test_every_pass_puts_back_each_modules_own_training_flag(outer):
    """`model.train(was_training)` after a pass set every submodule to the model's flag: a frozen BatchNorm came back
    training (its statistics then updated by the next step), an MC dropout came back off. Each pass that switches
    to eval mode (capture_attention, capture_inputs of the sites, count_flops, evaluate, predict_all) leaves each
    module's flag as it found it, whether the model was training or not."""
    from attnconv.data import ImageSet, dataset_info
    from attnconv.evaluate import count_flops, evaluate, predict_all
    from attnconv.models.sites import capture_inputs

    torch.manual_seed(3)
    model = FrozenNormDropout().train(outer)
    model.norm.train(not outer)
    model.drop.train(not outer)
    flags = {name: m.training for name, m in model.named_modules()}
    x = torch.randn(4, 2, 3, 3)
    info = dataclasses.replace(dataset_info("fashion-mnist"), channels=2, size=3, mean=(0.5, 0.5), std=(0.25, 0.25))
    images = ImageSet((torch.rand(4, 2, 3, 3) * 255).to(torch.uint8), torch.tensor([0, 1, 2, 0]))
    passes = {"capture_attention": lambda: capture_attention(model, x),
              "capture_inputs": lambda: capture_inputs(model, [model.body.body.mha], x),
              "count_flops": lambda: count_flops(model, (2, 3, 3)),
              "evaluate": lambda: evaluate(model, images, info, batch_size=2),
              "predict_all": lambda: predict_all(model, images, info, batch_size=2)}
    for name, run in passes.items():
        run()
        now = {n: m.training for n, m in model.named_modules()}
        assert now == flags, (name, {n: v for n, v in now.items() if v != flags[n]})


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
@pytest.mark.parametrize("how", ["trace", "script", "compile", "inner trace"])
def test_a_model_whose_forward_runs_outside_python_is_refused_in_words(how):
    """A traced model gave no records (an empty list, silently: its forward runs no Python hooks), a scripted one a
    torch error, a compiled one a dynamo AssertionError: each is one AttnconvError naming it and the fix, from
    capture_attention and from attention_sites."""
    torch.manual_seed(0)
    model = Tokens(2, 4, SDPABlock(4, 2)).eval()
    x = torch.randn(1, 2, 3, 3)
    if how == "trace":
        model = torch.jit.trace(model, x)
    elif how == "script":
        model = torch.jit.script(nn.Sequential(nn.Conv2d(2, 4, 1), nn.Flatten()))
    elif how == "compile":
        model = torch.compile(model)
    else:
        model.body = torch.jit.trace(model.body, model.tokens(x))
    want = ("torch.compile", "_orig_mod") if how == "compile" else ("torch.jit", "the nn.Module it was made from")
    for call in (lambda: capture_attention(model, x), lambda: attention_sites(model, tuple(x.shape[1:]))):
        with pytest.raises(AttnconvError) as err:
            call()
        assert all(w in str(err.value) for w in want), str(err.value)
        assert ("its module body" in str(err.value)) == (how == "inner trace"), str(err.value)


def test_a_layer_called_with_its_input_as_a_keyword_is_captured():
    """`self.sa(x=x)` ran the layer, but its pre-hook saw no positional argument: no record, and attention_sites
    said the model had no attention layers."""
    torch.manual_seed(0)

    class Keyword(nn.Module):
        def __init__(self):
            super().__init__()
            self.sa = SelfAttention2d(4, 4, heads=4, encoding="learned-content")

        def forward(self, x):
            return self.sa(x=x)

    model, x = Keyword(), torch.randn(2, 4, 5, 5)
    (r,) = capture_attention(model, x)
    torch.testing.assert_close(r.probs, model.sa.attention_probs(x).mean(0))
    sites = attention_sites(model, (4, 5, 5))
    assert [s.path for s in sites] == ["sa"] and site_inputs(model, sites, x)[0].shape == x.shape


def test_arguments_and_models_that_cannot_be_captured_are_one_error_each():
    """max_bytes NaN switched the budget off, a text one gave a TypeError; a negative input_shape, site_probs'
    batch_size 0 and a model on the meta device (records without values, then NotImplementedError) gave torch
    errors; numpy's integers as the grid were refused as "not two positive integers"."""
    from attnconv.models.sites import site_probs

    vit = attnconv.build_model("vit", in_channels=1, image_size=8, patch=2, hidden=8, heads=2, layers=1,
                               intermediate=8)
    x = torch.randn(1, 1, 8, 8)
    for call, words in ((lambda: capture_attention(vit, x, max_bytes=float("nan")), "max_bytes nan is invalid"),
                        (lambda: capture_attention(vit, x, max_bytes="1000"), "max_bytes '1000' is invalid"),
                        (lambda: attention_sites(vit, (1, -8, 8)), "input_shape (1, -8, 8) is invalid"),
                        (lambda: site_probs(vit, attention_sites(vit), x, batch_size=0), "batch_size 0 is invalid"),
                        (lambda: capture_attention(vit, x, grid=(4, 0)), "grid (4, 0) is invalid")):
        with pytest.raises(AttnconvError, match=re.escape(words)):
            call()
    assert capture_attention(vit, x, grid=(np.int64(4), np.int64(4)))[0].size == (4, 4)
    with torch.device("meta"):
        meta = attnconv.build_model("vit", in_channels=1, image_size=8, patch=2, hidden=8, heads=2, layers=1,
                                    intermediate=8)
    for call in (lambda: capture_attention(meta, x), lambda: attention_sites(meta)):
        with pytest.raises(AttnconvError, match="on the meta device, which holds no values; load its weights"):
            call()


def test_a_call_torch_refuses_fails_with_torchs_own_words():
    """The recomputation ran before the call: grouped heads that do not divide failed inside attnconv with an
    unrelated expand error. The call runs first."""

    class Uneven(nn.Module):
        def forward(self, x):
            q, k = torch.randn(2, 6, 16, 4), torch.randn(2, 4, 16, 4)
            return F.scaled_dot_product_attention(q, k, k, enable_gqa=True)

    with pytest.raises(RuntimeError) as err:
        Uneven()(torch.zeros(1))
    with pytest.raises(RuntimeError) as captured:
        capture_attention(Uneven(), torch.zeros(2, 1, 4, 4))
    assert str(captured.value) == str(err.value)


def test_a_multihead_attention_with_a_forward_of_its_own_is_not_recomputed_as_the_plain_one():
    """A subclass of nn.MultiheadAttention that changes the scores (here a locality bias) was recomputed from the
    base class's weights, its own SDPA call dropped: wrong by up to 0.58. Its SDPA call is captured (with no
    warning: its attention is seen); the plain module still is recomputed, value maps included."""
    torch.manual_seed(3)

    class Local(nn.MultiheadAttention):
        def forward(self, q, k, v, **kwargs):
            B, L, E = q.shape
            h, d = self.num_heads, E // self.num_heads
            (wq, wk, wv), (bq, bk, bv) = self.in_proj_weight.chunk(3), self.in_proj_bias.chunk(3)
            Q, K, V = (F.linear(t, w, b).view(B, L, h, d).transpose(1, 2)
                       for t, w, b in ((q, wq, bq), (k, wk, bk), (v, wv, bv)))
            self.bias = -(torch.arange(L)[None] - torch.arange(L)[:, None]).abs().float()
            out = F.scaled_dot_product_attention(Q, K, V, attn_mask=self.bias)
            return self.out_proj(out.transpose(1, 2).reshape(B, L, E)), None

    model = Tokens(1, 8, MHABody(Local(8, 2, batch_first=True), lambda t: {}), cls=0)
    x = torch.randn(2, 1, 4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnconvWarning)
        (r,) = capture_attention(model, x)
    assert (r.kind, r.path) == ("sdpa", "body.mha")
    mha = model.body.mha
    t = model.tokens(x)
    (wq, wk, _), (bq, bk, _) = mha.in_proj_weight.chunk(3), mha.in_proj_bias.chunk(3)
    Q, K = (F.linear(t, w, b).view(2, 16, 2, 4).transpose(1, 2).double() for w, b in ((wq, bq), (wk, bk)))
    want = ((Q @ K.transpose(-1, -2)) / 2 + mha.bias.double()).softmax(-1).mean(0)
    torch.testing.assert_close(r.probs.double(), want, rtol=1e-5, atol=1e-6)
    assert not captured_sites([r])[0][0].layer.has_value_maps


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_entry_larger_than_a_chunk_is_recomputed_in_pieces_of_rows_with_the_same_result(seed, monkeypatch):
    """One batch entry's float64 intermediates were never split: a capture within max_bytes peaked near 8 times it
    (128 MiB kept, about 1 GiB used). Past the chunk size the query rows come in pieces; every record (probabilities,
    the class token's share, both score terms) is what one piece gives, for SDPA (causal, masks) and
    MultiheadAttention (bias_k, zero attention, masks)."""
    import attnconv.models.capture_numbers as numbers_module

    g = torch.Generator().manual_seed(seed)
    side, dim = 3 + seed % 2, 8
    n = side * side + 1
    mask = torch.randn(n, n, generator=g, dtype=torch.float64) if seed % 2 else None
    sdpa = Tokens(2, dim, SDPABlock(dim, 2, causal=seed == 2, mask=mask), cls=1).double()
    mha = Tokens(2, dim, MHABody(nn.MultiheadAttention(dim, 2, batch_first=True, add_bias_kv=seed in (1, 3),
                                                       add_zero_attn=seed >= 2).double(),
                                 lambda t: {"attn_mask": mask} if mask is not None else {}), cls=1).double()
    x = torch.randn(3, 2, side, side, dtype=torch.float64, generator=g)
    for model in (sdpa, mha):
        whole = capture_attention(model, x, scores=True)
        monkeypatch.setattr(numbers_module, "CHUNK_BYTES", 3 * 2 * n * 8 * 3 + 1)  # 3 rows of one entry a piece
        assert numbers_module.row_pieces(n, 2 * n * 8 * 3)[:2] == [(0, 3), (3, 6)]
        pieces = capture_attention(model, x, scores=True)
        monkeypatch.undo()
        for a, b in zip(whole, pieces):
            torch.testing.assert_close(b.probs, a.probs, rtol=1e-12, atol=1e-14)
            torch.testing.assert_close(b.extra_mass, a.extra_mass, rtol=1e-12, atol=1e-14)
            for term in ("combined", "content"):
                torch.testing.assert_close(b.scores[term], a.scores[term], rtol=1e-12, atol=1e-12)
            assert (b.images, b.size, b.left_out) == (a.images, a.size, a.left_out)


def test_a_multihead_attention_subclass_whose_output_is_the_plain_ones_is_recomputed_as_it():
    """A subclass whose forward calls super().forward (or only adds attributes) gave no record at all after the last
    round (its own forward: not recomputed; nn.MultiheadAttention's forward calls no SDPA). Its output is compared
    with nn.MultiheadAttention's on the same call: equal, it is recomputed as the plain module is, value maps too;
    torch's quantizable MultiheadAttention computes with other weights: a warning, nothing recorded. A call torch
    refuses (a key_padding_mask of another batch) fails with torch's own error, not the recomputation's."""
    from torch.ao.nn.quantizable import MultiheadAttention as Quantizable

    class Super(nn.MultiheadAttention):
        def forward(self, q, k, v, **kwargs):
            return super().forward(q, k, v, **kwargs)

    torch.manual_seed(5)
    x = torch.randn(2, 1, 4, 4)
    sub = Tokens(1, 8, MHABody(Super(8, 2, batch_first=True), lambda t: {}), cls=0).eval()
    plain = Tokens(1, 8, MHABody(nn.MultiheadAttention(8, 2, batch_first=True), lambda t: {}), cls=0).eval()
    plain.load_state_dict(sub.state_dict())
    (a,), (b,) = capture_attention(sub, x), capture_attention(plain, x)
    assert (a.kind, a.path) == ("MultiheadAttention", "body.mha")
    torch.testing.assert_close(a.probs, b.probs, rtol=0, atol=0)
    assert captured_sites([a])[0][0].layer.has_value_maps
    with pytest.warns(AttnconvWarning, match="computes something else than nn.MultiheadAttention's forward"):
        assert capture_attention(Tokens(1, 8, MHABody(Quantizable(8, 2, batch_first=True), lambda t: {}), cls=0).eval(),
                                 x) == []
    bad = Tokens(1, 8, MHABody(nn.MultiheadAttention(8, 2, batch_first=True),
                               lambda t: {"key_padding_mask": torch.zeros(5, 16, dtype=torch.bool)}), cls=0).eval()
    with pytest.raises(AssertionError) as err:
        bad(x)
    with pytest.raises(AssertionError) as captured:
        capture_attention(bad, x)
    assert str(captured.value) == str(err.value)


def test_cross_attention_alone_is_named_and_the_python_api_takes_numpy_and_whole_numbers():
    """A model whose only attention is cross-attention was "no attention layers ... give a run of an attention
    model"; it says which computation it saw and why the measures cannot take it. max_bytes 1.5 was taken as 1 byte;
    site_probs' batch_size of numpy's int64 passed its check and failed in torch."""
    from attnconv.models.sites import site_probs

    class Cross(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.attn = nn.Conv2d(4, 8, 2, 2), nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            t = self.emb(x).flatten(2).transpose(1, 2)
            return self.attn(query=t[:, :4], key=t, value=t)[0]

    with pytest.raises(AttnconvError, match=r"Cross: its attention computations are not self-attention over one "
                       r"image grid \(attn: queries on 2x2, keys on 4x4\)"):
        attention_sites(Cross().eval(), (4, 8, 8))
    vit = attnconv.build_model("vit", in_channels=1, image_size=8, patch=2, hidden=8, heads=2, layers=1,
                               intermediate=8)
    x = torch.randn(2, 1, 8, 8)
    with pytest.raises(AttnconvError, match=r"max_bytes 1\.5 is invalid: give a positive whole number"):
        capture_attention(vit, x, max_bytes=1.5)
    assert len(capture_attention(vit, x, max_bytes=1e12)) == 1
    (one,) = site_probs(vit, attention_sites(vit), x, batch_size=np.int64(1))
    torch.testing.assert_close(one, site_probs(vit, attention_sites(vit), x)[0])
