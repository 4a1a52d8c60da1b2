import copy
import math

import pytest
import torch
import torch.nn as nn

from attnconv.attention import SelfAttention2d, paths
from attnconv.errors import AttnconvError
from attnconv.positional import ENCODINGS

POSITION_ONLY = ["quadratic", "quadratic-diag", "quadratic-aniso", "learned"]


def _impls(layer):
    return [i for i in ("dense", "separable", "stacked", "fused", "sdpa")
            if (i not in ("separable", "fused") or layer.separable) and (i not in ("stacked", "fused") or layer.stackable)]


def _randomize(layer, scale=1.0):
    """Random parameters, with widths small enough that attention is spread (a harder test)."""
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "widths" in name else scale))
    return layer


def _independent_forwards(layer, x, n):
    """n forwards of x, each with its own dropout draws: (n, *output shape). vmap runs them as one batch."""
    return torch.func.vmap(layer, randomness="different")(x.expand(n, *x.shape).contiguous())


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def reference_mhsa(layer, x):
    """Eq. (1)-(3), (7) written out head by head, independent of the layer's paths."""
    B, C, H, W = x.shape
    tokens = x.permute(0, 2, 3, 1).reshape(B, H * W, C).double()
    out_w = layer.out.weight.double().view(layer.out_channels, layer.heads, layer.head_dim)
    y = layer.out.bias.double().expand(B, H * W, -1).clone() if layer.out.bias is not None else 0
    scores = layer.attention_scores(x.double() if not layer.position_only else None, size=(H, W))["combined"]
    for h in range(layer.heads):
        if layer.value_mode == "shared":
            v = tokens  # W_val^h = I
        else:
            wv = layer.value.weight.double().view(layer.heads, layer.head_dim, C)[h]
            bv = layer.value.bias.double().view(layer.heads, layer.head_dim)[h]
            v = tokens @ wv.T + bv
        p = torch.softmax(scores[:, h].double(), dim=-1)  # (B or 1, T, T)
        y = y + (p @ v) @ out_w[:, h, :].T
    return y.view(B, H, W, -1).permute(0, 3, 1, 2)


@pytest.mark.parametrize("value", ["shared", "project"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_path_matches_the_equations(encoding, value):
    layer = _randomize(SelfAttention2d(5, 7, heads=3, encoding=encoding, value=value, max_size=9)).double()
    x = torch.randn(2, 5, 4, 6, dtype=torch.float64)
    ref = reference_mhsa(layer, x)
    for impl in _impls(layer):
        layer.impl = impl
        assert _rel(layer(x), ref) < 1e-12, impl


# Seeded sweep over random shapes: all paths agree in float32, forward and backward.
_SWEEP = []
_g = torch.Generator().manual_seed(1234)
for _i in range(24):
    _r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=_g))  # noqa: E731
    _SWEEP.append(
        dict(
            encoding=ENCODINGS[_i % len(ENCODINGS)],
            value=("shared", "project")[_i % 2],
            heads=_r(1, 9),
            cin=_r(1, 12),
            cout=_r(1, 12),
            B=_r(1, 3),
            H=_r(1, 9),
            W=_r(1, 9),
        )
    )


@pytest.mark.parametrize("cfg", _SWEEP, ids=lambda c: "{encoding}-{value}-h{heads}-{H}x{W}".format(**c))
def test_paths_agree_forward_and_backward_float32(cfg):
    layer = _randomize(
        SelfAttention2d(cfg["cin"], cfg["cout"], heads=cfg["heads"], encoding=cfg["encoding"], value=cfg["value"], max_size=9)
    )
    x = torch.randn(cfg["B"], cfg["cin"], cfg["H"], cfg["W"])
    upstream = torch.randn(cfg["B"], cfg["cout"], cfg["H"], cfg["W"])
    results = {}
    for impl in _impls(layer):
        layer.impl = impl
        layer.zero_grad()
        xi = x.clone().requires_grad_()
        y = layer(xi)
        (y * upstream).sum().backward()
        grads = {n: p.grad.clone() for n, p in layer.named_parameters()}
        results[impl] = (y.detach(), xi.grad, grads)
    y0, gx0, gp0 = results["dense"]
    # Some gradients are exactly zero in exact arithmetic (key.bias: softmax is invariant to a
    # per-query shift; a 1-wide axis's factor); float32 paths return rounding noise for them.
    layer64 = layer.double()
    layer64.impl = "dense"
    layer64.zero_grad()
    (layer64(x.double()) * upstream.double()).sum().backward()
    zero = {n for n, p in layer64.named_parameters() if p.grad.norm() < 1e-9}
    scale = max(g.norm() for g in gp0.values())
    for impl, (y, gx, gp) in results.items():
        assert _rel(y, y0) <= 1e-5, impl
        assert _rel(gx, gx0) <= 1e-5, impl
        for n in zero:
            assert gp[n].norm() <= 1e-5 * scale, (impl, n)
        for n in set(gp0) - zero:
            # Gradients of positional parameters are sums over all (q, k) of softmax-Jacobian terms
            # that cancel (each row's sums to zero); in float32 they carry about eps * (number of
            # terms) of rounding relative to their small total (1.7e-5 seen). float64 agreement of
            # every gradient is checked to 1e-10 in test_paths_agree_in_float64_backward.
            tol = 1e-4 if n.startswith("encoding.") else 1e-5
            assert _rel(gp[n], gp0[n]) <= tol, (impl, n)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_paths_agree_in_float64_backward(encoding):
    layer = _randomize(SelfAttention2d(5, 4, heads=3, encoding=encoding, value="project", max_size=7)).double()
    x = torch.randn(2, 5, 7, 3, dtype=torch.float64)
    grads = {}
    for impl in _impls(layer):
        layer.impl = impl
        layer.zero_grad()
        layer(x).pow(2).sum().backward()
        grads[impl] = {n: p.grad.clone() for n, p in layer.named_parameters()}
    for impl, g in grads.items():
        for n in g:
            if n != "key.bias":  # exactly zero in exact arithmetic (softmax shift invariance)
                assert _rel(g[n], grads["dense"][n]) < 1e-10, (impl, n)
            else:
                assert g[n].abs().max() < 1e-10


def test_state_dict_moves_between_impls():
    a = SelfAttention2d(4, 6, heads=3, encoding="learned", impl="dense", max_size=8)
    b = SelfAttention2d(4, 6, heads=3, encoding="learned", impl="separable", max_size=8)
    assert set(a.state_dict()) == set(b.state_dict())
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 4, 5, 8)
    assert _rel(b(x), a(x)) < 1e-6


def test_drop_in_replacement_for_conv2d():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    net[2] = SelfAttention2d(8, 8, heads=4)
    y = net(torch.randn(2, 3, 10, 6))
    assert y.shape == (2, 8, 10, 6)
    y.sum().backward()
    assert net[2].encoding.centers.grad is not None and net[0].weight.grad is not None


@pytest.mark.parametrize("encoding", POSITION_ONLY)
def test_value_maps_and_probs_reproduce_the_layer(encoding):
    layer = _randomize(SelfAttention2d(4, 5, heads=3, encoding=encoding, value="project", max_size=6)).double()
    x = torch.randn(2, 4, 3, 6, dtype=torch.float64)
    P = layer.attention_probs(size=(3, 6))[0]  # (heads, T, T)
    maps, bias = layer.value_maps()  # (heads, C_out, C_in), (C_out,)
    tokens = x.permute(0, 2, 3, 1).reshape(2, 18, 4)
    y = torch.einsum("hqk,hoc,bkc->bqo", P, maps, tokens) + bias
    assert _rel(y.view(2, 3, 6, 5).permute(0, 3, 1, 2), layer(x)) < 1e-12
    assert torch.allclose(P.sum(-1), torch.ones(3, 18, dtype=torch.float64))


def test_attention_scores_split_content_and_position_terms():
    layer = _randomize(SelfAttention2d(4, 4, heads=2, encoding="learned-content", max_size=5))
    x = torch.randn(3, 4, 5, 4)
    s = layer.attention_scores(x)
    assert s["content"].shape == (3, 2, 20, 20)
    assert torch.allclose(s["combined"], s["content"] + s["position"])
    with pytest.raises(AttnconvError, match="needs the input"):
        layer.attention_probs(size=(5, 4))


@pytest.mark.parametrize("impl", ["dense", "separable", "stacked", "fused", "sdpa"])
def test_position_probabilities_are_computed_once_per_forward(impl, monkeypatch):
    layer = SelfAttention2d(4, 4, heads=2, encoding="quadratic", impl=impl)
    calls = []
    factors = layer.encoding.factors  # every path (dense logits too) goes through the factors once
    monkeypatch.setattr(layer.encoding, "factors", lambda *a: calls.append(a) or factors(*a))
    layer(torch.randn(16, 4, 5, 5))
    assert len(calls) == 1  # once per forward, not once per sample


def test_eval_dropout_is_identity_and_train_dropout_is_unbiased():
    torch.manual_seed(3)
    layer = _randomize(SelfAttention2d(3, 3, heads=2, encoding="quadratic", attn_dropout=0.3, impl="separable"))
    x = torch.randn(1, 3, 4, 4)
    layer.eval()
    ref = layer(x)
    assert torch.equal(ref, layer(x))
    layer.train()
    with torch.no_grad():
        for impl in ("separable", "dense", "stacked", "fused"):
            layer.impl = impl
            samples = _independent_forwards(layer, x, 3000)
            assert not torch.allclose(samples[0], samples[1])
            # E[dropout(P)] = P, and the layer is linear in P
            assert _rel(samples.mean(0), ref) < 0.03, impl


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_bf16_autocast_keeps_scores_in_float32(encoding):
    layer = SelfAttention2d(8, 8, heads=3, encoding=encoding, max_size=6)
    x = torch.randn(2, 8, 6, 6)
    ref = layer(x)
    for impl in _impls(layer):
        layer.impl = impl
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer(x)
            scores = layer.attention_scores(x)["combined"]
        assert scores.dtype == torch.float32, impl
        assert torch.isfinite(y).all() and _rel(y.float(), ref) < 5e-2, impl


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(AttnconvError, match="unknown encoding"):
        SelfAttention2d(4, encoding="gaussian")
    with pytest.raises(AttnconvError, match="separable"):
        SelfAttention2d(4, encoding="quadratic-aniso", impl="separable")
    with pytest.raises(AttnconvError, match="unknown impl"):
        SelfAttention2d(4, impl="fast")
    with pytest.raises(AttnconvError, match=r"\(B, 4, H, W\)"):
        SelfAttention2d(4)(torch.randn(2, 3, 5, 5))
    with pytest.raises(AttnconvError, match="max_size"):
        SelfAttention2d(4, encoding="learned", max_size=4)(torch.randn(1, 4, 5, 5))
    with pytest.raises(AttnconvError, match="positive integer"):
        SelfAttention2d(0)


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("value", ["shared", "project"])
def test_auto_runs_a_path_the_layer_accepts_with_the_dense_paths_output_and_gradients(encoding, value):
    # Whatever auto chooses on each grid (small and large, square and not), it is a path the layer
    # accepts when asked for by name, and it computes the dense path's function and gradients.
    torch.manual_seed(0)
    auto = _randomize(SelfAttention2d(6, 5, heads=3, encoding=encoding, value=value, max_size=12,
                                      attn_dropout=0.0)).double()
    dense = copy.deepcopy(auto)
    dense.impl = "dense"
    for size in ((3, 3), (4, 9), (12, 12)):
        chosen = auto.resolved_impl(size)
        SelfAttention2d(6, 5, heads=3, encoding=encoding, value=value, max_size=12, impl=chosen)  # accepted
        x = torch.randn(2, 6, *size, dtype=torch.float64, requires_grad=True)
        y_auto, y_dense = auto(x), dense(x)
        assert _rel(y_auto, y_dense) < 1e-10, (size, chosen)
        g = torch.randn_like(y_auto)
        ga = torch.autograd.grad(y_auto, [x, *auto.parameters()], g)
        gd = torch.autograd.grad(y_dense, [x, *dense.parameters()], g)
        for a, b in zip(ga, gd):  # some gradients are zero up to rounding (a key bias cancels in the softmax)
            torch.testing.assert_close(a, b, rtol=1e-8, atol=1e-10, msg=f"{size} {chosen}")
    with pytest.raises(AttnconvError, match="value='shared'"):
        SelfAttention2d(4, value="project", impl="stacked")


def test_fused_path_keeps_per_sample_dropout_masks_and_hooks_on_the_projection():
    # The fused factors are one pair for the batch: a layer asked for per-sample masks must still give
    # two copies of one image different masks; with a shared mask, the copies get the same one. A
    # hook on the output projection sees it run (FLOP counters count nn.Linear through such hooks).
    layer = SelfAttention2d(4, 4, heads=2, encoding="quadratic", impl="fused", attn_dropout=0.5).train()
    x = torch.randn(1, 4, 5, 5).expand(2, 4, 5, 5)
    torch.manual_seed(1)
    y = layer(x)
    assert not torch.allclose(y[0], y[1])
    layer.attn_dropout_mask = "shared"
    y = layer(x)
    torch.testing.assert_close(y[0], y[1])
    seen = []
    handle = layer.out.register_forward_hook(lambda m, args, out: seen.append(out.shape))
    layer.eval()(x)
    handle.remove()
    assert seen == [(2, 5, 5, 4)]
    for kwargs in ({"encoding": "quadratic-aniso"}, {"encoding": "learned-content"}, {"value": "project"}):
        with pytest.raises(AttnconvError, match="impl='fused' needs a separable encoding"):
            SelfAttention2d(4, impl="fused", **kwargs)


# The fused path runs a batch in tiles of images when gradients are recorded (a custom backward).
_TILE_SWEEP = []
for _i in range(12):
    _r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=_g))  # noqa: E731
    _B = _r(2, 5)
    _TILE_SWEEP.append(dict(encoding=("quadratic", "quadratic-diag", "learned")[_i % 3], heads=_r(1, 9),
                            cin=_r(1, 8), cout=_r(1, 8), B=_B, H=_r(1, 8), W=_r(1, 8), tile=_r(1, _B - 1),
                            bias=bool(_i % 2)))


def _tiles(monkeypatch, tile):
    """Make the fused path run tiles of `tile` images whatever their size."""
    monkeypatch.setattr(paths, "FUSED_TILE_BYTES", 1)
    monkeypatch.setattr(paths, "FUSED_MIN_TILE", tile)


@pytest.mark.parametrize("cfg", _TILE_SWEEP, ids=lambda c: "{encoding}-h{heads}-B{B}-{H}x{W}-tile{tile}".format(**c))
def test_fused_path_in_tiles_matches_the_equations_forward_and_backward(cfg, monkeypatch):
    """float64: the tiled forward against Eq. (1)-(3) head by head, and every gradient (input, encoding,
    projection) against the dense path's autograd, with a last tile smaller than the others."""
    layer = _randomize(SelfAttention2d(cfg["cin"], cfg["cout"], heads=cfg["heads"], encoding=cfg["encoding"],
                                       bias=cfg["bias"], max_size=9)).double()
    x = torch.randn(cfg["B"], cfg["cin"], cfg["H"], cfg["W"], dtype=torch.float64)
    upstream = torch.randn(cfg["B"], cfg["cout"], cfg["H"], cfg["W"], dtype=torch.float64)
    ran = []
    monkeypatch.setattr(paths._FusedTiles, "forward", _spy(paths._FusedTiles.forward, ran))
    results = {}
    for impl in ("dense", "fused"):
        with monkeypatch.context() as m:
            if impl == "fused":
                _tiles(m, cfg["tile"])
            layer.impl = impl
            layer.zero_grad()
            xi = x.clone().requires_grad_()
            y = layer(xi)
            (y * upstream).sum().backward()
            results[impl] = (y.detach(), xi.grad, {n: p.grad.clone() for n, p in layer.named_parameters()})
    assert ran == [cfg["tile"]]  # the tiled function ran, once, with the tile asked for
    assert _rel(results["fused"][0], reference_mhsa(layer, x)) < 1e-12
    (y0, gx0, gp0), (y1, gx1, gp1) = results["dense"], results["fused"]
    assert _rel(y1, y0) < 1e-12 and _rel(gx1, gx0) < 1e-12
    for n in gp0:
        assert (gp1[n] - gp0[n]).norm() <= 1e-10 * max(1.0, gp0[n].norm()), n


def _spy(forward, seen):
    def spy(ctx, row, col, x, weight, tile):
        seen.append(tile)
        return forward(ctx, row, col, x, weight, tile)
    return staticmethod(spy).__func__


@pytest.mark.parametrize("frozen", ["input", "encoding", "projection"])
def test_fused_tiles_give_the_gradients_asked_for(frozen, monkeypatch):
    """An input or parameters without requires_grad get none, and the others are unchanged."""
    _tiles(monkeypatch, 2)
    torch.manual_seed(3)
    layer = _randomize(SelfAttention2d(3, 4, heads=2, encoding="quadratic", impl="fused")).double()
    x = torch.randn(5, 3, 4, 6, dtype=torch.float64)
    want = {}
    layer(x.clone().requires_grad_()).square().sum().backward()
    want = {n: p.grad.clone() for n, p in layer.named_parameters()}
    layer.zero_grad()
    for n, p in layer.named_parameters():
        p.requires_grad_(not n.startswith({"encoding": "encoding.", "projection": "out."}.get(frozen, "-")))
    xi = x.clone().requires_grad_(frozen != "input")
    y = layer(xi)
    assert y.requires_grad
    y.square().sum().backward()
    for n, p in layer.named_parameters():
        if p.requires_grad:
            assert _rel(p.grad, want[n]) < 1e-12, n
        else:
            assert p.grad is None, n
    assert (xi.grad is None) == (frozen == "input")


def test_fused_tiles_under_bf16_autocast_and_with_a_shared_dropout_mask(monkeypatch):
    layer = SelfAttention2d(6, 6, heads=3, encoding="learned", impl="fused", attn_dropout=0.3,
                            attn_dropout_mask="shared").train()
    x = torch.randn(5, 6, 7, 7)
    outs = []
    for tile in (5, 2):  # one tile (the untiled products) and tiles of 2
        with monkeypatch.context() as m:
            _tiles(m, tile)
            layer.zero_grad()
            torch.manual_seed(0)  # the same dropout masks
            with torch.autocast("cpu", dtype=torch.bfloat16):
                y = layer(x)
            assert y.dtype == torch.bfloat16
            y.float().square().sum().backward()
            outs.append((y.float(), {n: p.grad.clone() for n, p in layer.named_parameters()}))
    (y0, g0), (y1, g1) = outs
    assert _rel(y1, y0) < 1e-2
    for n in g0:
        assert _rel(g1[n], g0[n]) < 3e-2, n


@pytest.mark.parametrize("seed", range(20))
def test_fused_tile_size_rule(seed):
    # The rule's promises, whatever its constants: between one image (or the batch, if smaller than the
    # minimum) and the batch; within the byte budget unless at the minimum; more images for narrower
    # intermediates; never more images for a larger image.
    g = torch.Generator().manual_seed(seed)
    batch, H, W, C, heads = (int(torch.randint(1, hi, (1,), generator=g)) for hi in (300, 40, 40, 512, 16))
    tile = paths.fused_tile(batch, H, W, C, heads, 4)
    assert min(batch, paths.FUSED_MIN_TILE) <= tile <= batch
    assert tile * heads * H * W * C * 4 <= paths.FUSED_TILE_BYTES or tile <= paths.FUSED_MIN_TILE
    assert paths.fused_tile(batch, H, W, C, heads, 2) >= tile
    assert paths.fused_tile(batch, H + 1, W, C, heads, 4) <= tile


def test_fused_path_without_gradients_runs_one_tile(monkeypatch):
    """Inference (and torch.compile, tracing) see the plain products: no custom autograd function."""
    _tiles(monkeypatch, 1)
    monkeypatch.setattr(paths._FusedTiles, "apply", lambda *a: pytest.fail("tiled under no_grad"))
    layer = SelfAttention2d(4, 4, heads=2, impl="fused")
    with torch.no_grad():
        layer(torch.randn(3, 4, 9, 9))


def test_separable_path_never_forms_the_token_by_token_matrix(monkeypatch):
    layer = SelfAttention2d(4, 4, heads=2, encoding="quadratic", impl="separable")
    monkeypatch.setattr(layer.encoding, "logits", lambda *a: pytest.fail("dense logits formed"))
    H = W = 12
    seen = []

    def hook(mod, args, out):
        seen.append(out.numel())

    layer.out.register_forward_hook(hook)
    layer(torch.randn(1, 4, H, W))
    assert seen  # ran, without calling logits()


def test_quadratic_layer_with_large_alpha_attends_to_its_center():
    layer = SelfAttention2d(1, 1, heads=1, encoding="quadratic", bias=False).double()
    with torch.no_grad():
        layer.encoding.centers.copy_(torch.tensor([[0.0, 1.0]]))
        layer.encoding.widths.fill_(math.sqrt(2 * 60))
        layer.out.weight.fill_(1.0)
    x = torch.randn(1, 1, 4, 5, dtype=torch.float64)
    y = layer(x)
    # every query but the last column reads its right neighbour (Lemma 2)
    assert torch.allclose(y[..., :-1], x[..., 1:], atol=1e-12)


# ------------------------------------------------------------------ dtypes, dropout masks, bad arguments


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_half_and_bfloat16_layers_match_their_float32_copy(encoding, dtype):
    # learned-content used to fail in every impl: float32 queries against half tables.
    layer = SelfAttention2d(8, 6, heads=3, encoding=encoding, value="project", max_size=7)
    x = torch.randn(2, 8, 5, 7)
    for impl in _impls(layer):
        layer.impl = impl
        ref = layer(x)
        low = copy.deepcopy(layer).to(dtype)
        y = low(x.to(dtype))
        scores = low.attention_scores(x.to(dtype), size=(5, 7))["combined"]
        assert y.dtype == dtype and scores.dtype == torch.float32, impl
        # measured: 1-1.5 eps of the dtype (inputs and weights rounded once); 4 eps leaves room
        assert _rel(y.float(), ref) < 4 * torch.finfo(dtype).eps, impl
        ref_scores = layer.attention_scores(x, size=(5, 7))["combined"]
        assert _rel(scores, ref_scores) < 4 * torch.finfo(dtype).eps, impl


@pytest.mark.parametrize("impl", ["dense", "separable", "stacked", "fused", "sdpa"])
def test_shared_dropout_mask_is_one_mask_for_the_batch(impl):
    torch.manual_seed(4)
    x = torch.randn(1, 3, 4, 5).expand(6, -1, -1, -1)  # six copies of one image
    for mask, same in (("shared", True), ("per-sample", False)):
        layer = _randomize(SelfAttention2d(3, 3, heads=2, encoding="learned", attn_dropout=0.3, impl=impl,
                                           attn_dropout_mask=mask, max_size=5)).train()
        y = layer(x)
        copies_agree = all(torch.equal(y[0], y[b]) for b in range(1, 6))
        assert copies_agree == same, (impl, mask)


@pytest.mark.parametrize("impl", ["dense", "separable", "stacked", "fused", "sdpa"])
@pytest.mark.parametrize("mask", ["shared", "per-sample"])
def test_attention_dropout_keeps_the_expectation_with_either_mask(impl, mask):
    torch.manual_seed(5)
    layer = _randomize(SelfAttention2d(3, 3, heads=2, encoding="quadratic", attn_dropout=0.3, impl=impl,
                                       attn_dropout_mask=mask))
    x = torch.randn(2, 3, 4, 4)
    ref = layer.eval()(x)
    layer.train()
    with torch.no_grad():
        mean = _independent_forwards(layer, x, 3000).mean(0)
    assert _rel(mean, ref) < 0.03


def test_shared_dropout_mask_needs_a_position_only_encoding():
    with pytest.raises(AttnconvError, match="position-only"):
        SelfAttention2d(4, encoding="learned-content", attn_dropout_mask="shared")
    with pytest.raises(AttnconvError, match="per-sample"):
        SelfAttention2d(4, attn_dropout_mask="batch")


@pytest.mark.parametrize(
    "kwargs,name",
    [
        (dict(in_channels=0), "in_channels"),
        (dict(in_channels=-3), "in_channels"),
        (dict(in_channels=True), "in_channels"),
        (dict(in_channels=4.0), "in_channels"),
        (dict(out_channels=-1), "out_channels"),
        (dict(heads=0), "heads"),
        (dict(heads=-2), "heads"),
        (dict(key_dim=-1, encoding="learned-content"), "key_dim"),
        (dict(key_dim=0, encoding="learned-content"), "key_dim"),
        (dict(pos_dim=0, encoding="learned"), "pos_dim"),
        (dict(pos_dim=-4, encoding="learned"), "pos_dim"),
        (dict(max_size=0, encoding="learned"), "max_size"),
        (dict(max_size=-5), "max_size"),
        (dict(head_dim=0, value="project"), "head_dim"),
        (dict(head_dim=-2, value="project"), "head_dim"),
        (dict(attn_dropout=1.0), "attn_dropout"),
        (dict(attn_dropout=-0.1), "attn_dropout"),
        (dict(attn_dropout="0.1"), "attn_dropout"),
        (dict(pos_init="xavier"), "pos_init"),
        (dict(pos_init="bert", encoding="quadratic"), "pos_init"),
    ],
    ids=lambda v: str(v) if isinstance(v, dict) else None,
)
def test_bad_constructor_arguments_raise_one_clear_error(kwargs, name):
    kwargs = {"in_channels": 4, **kwargs}
    with pytest.raises(AttnconvError, match=name) as err:
        SelfAttention2d(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("size", [(-1, 3), (3, 0), (3,), (2.5, 3), (True, 3), 5, "ab"])
def test_attention_probs_rejects_a_bad_size(size):
    layer = SelfAttention2d(4, heads=2)
    with pytest.raises(AttnconvError, match=r"size must be \(H, W\)"):
        layer.attention_probs(size=size)


def test_attention_probs_takes_integer_like_sizes():
    layer = SelfAttention2d(4, heads=2)
    assert layer.attention_probs(size=torch.Size([3, 4])).shape == (1, 2, 12, 12)
    assert layer.attention_probs(size=(torch.tensor(2), 5)).shape == (1, 2, 10, 10)


@pytest.mark.parametrize("encoding", ["learned", "learned-content"])
def test_pos_init_changes_values_not_names(encoding):
    a = SelfAttention2d(6, heads=3, encoding=encoding, max_size=5)
    b = SelfAttention2d(6, heads=3, encoding=encoding, max_size=5, pos_init="bert")
    assert {k: v.shape for k, v in a.state_dict().items()} == {k: v.shape for k, v in b.state_dict().items()}
    b.load_state_dict(a.state_dict())
    x = torch.randn(2, 6, 4, 5)
    assert torch.equal(a(x), b(x))


# ------------------------------------------------------------------ a following Linear folded into the output projection


@pytest.mark.parametrize("impl", ["separable", "stacked", "fused", "dense"])
@pytest.mark.parametrize("bias,then_bias", [(True, True), (False, True), (True, False), (False, False)])
def test_a_following_linear_is_folded_with_the_same_function_and_gradients(impl, bias, then_bias):
    torch.manual_seed(6)
    layer = _randomize(SelfAttention2d(5, 6, heads=3, encoding="quadratic", impl=impl, bias=bias), scale=0.5)
    then = nn.Linear(6, 4, bias=then_bias)
    x = torch.randn(4, 5, 3, 3).permute(0, 2, 3, 1)  # 36 tokens > heads * C_in = 15: folded
    upstream = torch.randn(4, 3, 3, 4)
    results = []
    for fold in (True, False):
        layer.zero_grad()
        then.zero_grad()
        xi = x.clone().requires_grad_()
        y = layer.forward_tokens(xi, then=then) if fold else then(layer.forward_tokens(xi))
        (y * upstream).sum().backward()
        grads = {n: p.grad.clone() for n, p in [*layer.named_parameters(), *then.named_parameters(prefix="then")]}
        results.append((y.detach(), xi.grad, grads))
    (y0, gx0, g0), (y1, gx1, g1) = results
    assert _rel(y0, y1) < 1e-6 and _rel(gx0, gx1) < 1e-6
    for n in g0:
        assert _rel(g0[n], g1[n]) < 1e-5, n


def test_without_gradients_the_output_linears_run_as_modules():
    """FLOP counters count Linear layers with forward hooks; under no_grad nothing is folded."""
    layer = SelfAttention2d(4, 4, heads=2)
    then = nn.Linear(4, 4)
    seen = []
    for module in (layer.out, then):
        module.register_forward_hook(lambda m, args, out: seen.append(m))
    x = torch.randn(8, 6, 6, 4)
    with torch.no_grad():
        y = layer.forward_tokens(x, then=then)
    assert seen == [layer.out, then]
    assert _rel(y, then(layer.forward_tokens(x)).detach()) < 1e-6
    seen.clear()
    layer.forward_tokens(x, then=then)  # 288 tokens > 8: folded in training
    assert seen == []


def test_fused_tiles_count_the_untiled_flops_plus_the_recomputed_row_factor():
    """FLOP counters see the tiled backward's in-place accumulating products (addmm_, baddbmm_); the
    tiles add exactly one row-factor product per image (z, recomputed for the weight's gradient).
    Called on the path itself: a FlopCounterMode's module hooks make the layer take `separable`."""
    from attnconv.flops import flop_counter

    B, H, W, C, c_out, heads = 7, 5, 4, 6, 3, 3
    g = torch.Generator().manual_seed(0)
    row = torch.randn(heads, H, H, generator=g).softmax(-1).requires_grad_()
    col = torch.randn(heads, W, W, generator=g).softmax(-1).requires_grad_()
    x = torch.randn(B, H, W, C, generator=g, requires_grad=True)
    weight = torch.randn(c_out, heads * C, generator=g, requires_grad=True)
    counts = []
    for tile in (B, 2):
        with flop_counter() as counter:
            paths.fused(row, col, x, weight, tile=tile).sum().backward()
        counts.append(counter.get_total_flops())
    assert counts[1] - counts[0] == 2 * H * heads * H * W * B * C > 0


def test_fused_tiles_under_torch_func_transforms_and_inplace_changes_after_the_forward(monkeypatch):
    """torch.func.grad / vmap see the untiled products (the tiled function has no rules for them);
    an input changed in place after the forward does not change the backward (saved copies)."""
    _tiles(monkeypatch, 1)
    torch.manual_seed(4)
    layer = _randomize(SelfAttention2d(3, 2, heads=1, impl="fused")).double()
    x = torch.randn(3, 3, 4, 5, dtype=torch.float64)
    want = torch.autograd.grad(layer(x.clone().requires_grad_()).square().sum(), layer.out.weight)[0]
    grad_x = torch.func.grad(lambda xx: layer(xx).square().sum())(x)
    xr = x.clone().requires_grad_()
    assert _rel(grad_x, torch.autograd.grad(layer(xr).square().sum(), xr)[0]) < 1e-12
    batched = torch.func.vmap(layer)(torch.stack([x, 2 * x]))  # batches of 3 inside: tiles of 1 without the check
    assert _rel(batched[1], layer(2 * x)) < 1e-12
    xi = x.clone().requires_grad_()
    y = xi * 1
    out = layer(y)
    with torch.no_grad():
        y.mul_(3)  # after the forward: the saved tiles keep what the forward saw
    got = torch.autograd.grad(out.square().sum(), layer.out.weight)[0]
    assert _rel(got, want) < 1e-12


def test_fused_tiles_have_a_double_backward(monkeypatch):
    """create_graph=True through the tiled path: gradgradcheck in float64, and a gradient penalty
    (the input gradient's norm, differentiated for the parameters) equal to the dense path's."""
    _tiles(monkeypatch, 2)
    g = torch.Generator().manual_seed(5)
    B, H, W, C, c_out, heads = 5, 3, 4, 2, 3, 2
    row = torch.randn(heads, H, H, generator=g, dtype=torch.float64).softmax(-1).requires_grad_()
    col = torch.randn(heads, W, W, generator=g, dtype=torch.float64).softmax(-1).requires_grad_()
    x = torch.randn(B, H, W, C, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(c_out, heads * C, generator=g, dtype=torch.float64, requires_grad=True)
    ran = []
    monkeypatch.setattr(paths._FusedTiles, "forward", _spy(paths._FusedTiles.forward, ran))
    assert torch.autograd.gradgradcheck(lambda *a: paths.fused(*a), (row, col, x, weight))
    assert ran and set(ran) == {2}  # every call took the tiles

    calls_before = len(ran)
    torch.manual_seed(6)
    layer = _randomize(SelfAttention2d(3, 4, heads=3, encoding="quadratic", max_size=6)).double()
    xs = torch.randn(5, 3, 4, 5, dtype=torch.float64)
    penalties = {}
    for impl in ("dense", "fused"):
        layer.impl = impl
        layer.zero_grad()
        xi = xs.clone().requires_grad_()
        (gx,) = torch.autograd.grad(layer(xi).sin().sum(), xi, create_graph=True)
        gx.square().sum().backward()
        penalties[impl] = {n: p.grad.clone() for n, p in layer.named_parameters()}
    assert len(ran) > calls_before  # the layer's fused run took the tiles
    for n, want in penalties["dense"].items():
        assert _rel(penalties["fused"][n], want) < 1e-10, n


def test_fused_tiles_double_backward_after_an_inplace_change_names_the_input(monkeypatch):
    _tiles(monkeypatch, 1)
    layer = SelfAttention2d(3, 2, heads=1, impl="fused").double()
    y = torch.randn(3, 3, 4, 5, dtype=torch.float64, requires_grad=True) * 1
    out = layer(y)
    with torch.no_grad():
        y.mul_(3)
    with pytest.raises(RuntimeError, match="the input of an attention layer was changed in place"):
        torch.autograd.grad(out.sum(), layer.out.weight, create_graph=True)
