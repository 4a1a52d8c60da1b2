import copy
import math
import re

import pytest
import torch
import torch.nn as nn

from attnconv import ops
from attnconv.attention import SelfAttention2d
from attnconv.attention.select import IMPLS, resolve_impl
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


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_an_unbatched_image_gives_what_it_gives_in_a_batch_of_one_as_conv2d_does(encoding, stride):
    torch.manual_seed(0)
    layer = _randomize(SelfAttention2d(3, 5, heads=2, encoding=encoding, stride=stride, max_size=8)).eval()
    x = torch.randn(3, 7, 6)
    y = layer(x)
    assert y.shape == (5, *layer.output_size((7, 6))) == nn.Conv2d(3, 5, 3, stride=stride, padding=1)(x).shape
    assert torch.equal(y, layer(x[None])[0])
    with pytest.raises(AttnconvError, match=r"\(B, 3, H, W\)"):
        layer(torch.randn(4, 7, 6))  # unbatched, but 4 channels


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
def test_a_batch_gives_each_image_what_it_gives_alone(impl):
    layer = _randomize(SelfAttention2d(4, 4, heads=2, encoding="quadratic", impl=impl)).double()
    x = torch.randn(5, 4, 5, 6, dtype=torch.float64)
    y = layer(x)
    for b in range(5):
        assert _rel(y[b:b + 1], layer(x[b:b + 1])) < 1e-12


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


def test_fused_path_keeps_per_sample_dropout_masks_and_reports_its_projection():
    # The fused factors are one pair for the batch: a layer asked for per-sample masks must still give
    # two copies of one image different masks; with a shared mask, the copies get the same one. The
    # output projection runs inside the fused products, which the layer reports (FLOP counters).
    layer = SelfAttention2d(4, 4, heads=2, encoding="quadratic", impl="fused", attn_dropout=0.5).train()
    x = torch.randn(1, 4, 5, 5).expand(2, 4, 5, 5)
    torch.manual_seed(1)
    y = layer(x)
    assert not torch.allclose(y[0], y[1])
    layer.attn_dropout_mask = "shared"
    y = layer(x)
    torch.testing.assert_close(y[0], y[1])
    assert layer.eval().folded_linears(x) == [(layer.out, 2 * 5 * 5)]
    layer.impl = "separable"
    assert layer.folded_linears(x) == []
    for kwargs in ({"encoding": "quadratic-aniso"}, {"encoding": "learned-content"}, {"value": "project"}):
        with pytest.raises(AttnconvError, match="impl='fused' needs a separable encoding"):
            SelfAttention2d(4, impl="fused", **kwargs)


# The fused op runs a batch in tiles of images when gradients are recorded (a written-out backward);
# whatever the tile, it computes the same function and gradients.
_TILE_SWEEP = []
for _i in range(12):
    _r = lambda lo, hi: int(torch.randint(lo, hi + 1, (1,), generator=_g))  # noqa: E731
    _B = _r(2, 5)
    _TILE_SWEEP.append(dict(heads=_r(1, 9), cin=_r(1, 8), cout=_r(1, 8), B=_B, H=_r(1, 8), W=_r(1, 8),
                            tile=_r(1, _B - 1), bias=bool(_i % 2)))


def _fused_operands(heads, cin, cout, B, H, W, bias=True, dtype=torch.float64, seed=0):
    """Random probability factors, input, projection weight and bias for `ops.fused`, all requiring grad."""
    g = torch.Generator().manual_seed(seed)
    row = torch.randn(heads, H, H, generator=g, dtype=dtype).softmax(-1).requires_grad_()
    col = torch.randn(heads, W, W, generator=g, dtype=dtype).softmax(-1).requires_grad_()
    x = torch.randn(B, H, W, cin, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(cout, heads * cin, generator=g, dtype=dtype, requires_grad=True)
    b = torch.randn(cout, generator=g, dtype=dtype, requires_grad=True) if bias else None
    return row, col, x, weight, b


def _fused_reference(row, col, x, weight, bias):
    """The fused op's function written out: every head's P_h = row_h (x) col_h on x, concatenated, projected."""
    heads_out = torch.einsum("hik,hjl,bklc->bijhc", row, col, x).flatten(3)
    out = heads_out @ weight.T
    return out if bias is None else out + bias


@pytest.mark.parametrize("cfg", _TILE_SWEEP, ids=lambda c: "h{heads}-B{B}-{H}x{W}-tile{tile}".format(**c))
def test_fused_op_in_tiles_matches_the_equations_forward_and_backward(cfg):
    """float64: the fused op at the sweep's tile (a last tile smaller than the others) and as one tile,
    against the products written out: the output and the gradients of every operand."""
    operands = _fused_operands(**{k: v for k, v in cfg.items() if k != "tile"})
    upstream = torch.randn(cfg["B"], cfg["H"], cfg["W"], cfg["cout"], dtype=torch.float64)
    want = None
    for compute in (_fused_reference, lambda *a: ops.fused(*a, tile=cfg["tile"]),
                    lambda *a: ops.fused(*a, tile=cfg["B"])):
        y = compute(*operands)
        wanted = [t for t in operands if t is not None]
        got = (y.detach(), *torch.autograd.grad(y, wanted, upstream))
        if want is None:
            want = got
            continue
        for a, b in zip(got, want):
            assert (a - b).norm() <= 1e-12 * max(1.0, b.norm())


@pytest.mark.parametrize("frozen", [0, 1, 2, 3])
def test_fused_tiles_give_the_gradients_asked_for(frozen):
    """An operand without requires_grad gets none, and the others are unchanged."""
    operands = _fused_operands(2, 3, 4, 5, 4, 6, bias=False)[:4]
    want = torch.autograd.grad(ops.fused(*operands, tile=2).square().sum(), operands)
    frozen_ops = [t.detach().requires_grad_(i != frozen) for i, t in enumerate(operands)]
    y = ops.fused(*frozen_ops, tile=2)
    y.square().sum().backward()
    for i, (t, w) in enumerate(zip(frozen_ops, want)):
        assert (t.grad is None) == (i == frozen)
        if t.grad is not None:
            assert _rel(t.grad, w) < 1e-12, i


def test_fused_tiles_under_bf16_autocast_and_with_a_shared_dropout_mask():
    row, col, x, weight, bias = _fused_operands(3, 6, 6, 5, 7, 7, dtype=torch.float32)
    outs = []
    for tile in (5, 2):  # one tile (the untiled products) and tiles of 2
        torch.manual_seed(0)  # the same dropout masks
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = ops.fused(row, col, x, weight, bias, dropout_p=0.3, tile=tile)
        assert y.dtype == torch.bfloat16
        outs.append((y.float(), torch.autograd.grad(y.float().square().sum(), (row, col, x, weight))))
    (y0, g0), (y1, g1) = outs
    assert _rel(y1, y0) < 1e-2
    for a, b in zip(g1, g0):
        assert _rel(a, b) < 3e-2


def test_fused_op_without_gradients_matches_with_gradients():
    operands = _fused_operands(2, 4, 3, 6, 5, 5, dtype=torch.float32)
    with torch.no_grad():
        y0 = ops.fused(*operands, tile=1)
    assert _rel(ops.fused(*operands, tile=1).detach(), y0) < 1e-6


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
    with pytest.raises(AttnconvError, match=r"size .* is invalid: give the input grid \(H, W\)"):
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


# ------------------------------------------------------------------ the fused op under FLOP counters and transforms


def test_flop_counters_see_inside_the_fused_tiles():
    """FLOP counters see the tiled products, the written-out backward's in-place accumulating ones (addmm_,
    baddbmm_) too: the forward counts the same in any tile, and forward + backward in tiles counts at least
    what the untiled products do (nothing runs unseen)."""
    from attnconv.flops import flop_counter

    B, H, W, C, c_out, heads = 7, 5, 4, 6, 3, 3
    row, col, x, weight, _ = _fused_operands(heads, C, c_out, B, H, W, bias=False, dtype=torch.float32)
    forward, both = [], []
    for tile in (B, 2):
        with torch.no_grad(), flop_counter() as counter:
            ops.fused(row, col, x, weight, tile=tile)
        forward.append(counter.get_total_flops())
        with flop_counter() as counter:
            ops.fused(row, col, x, weight, tile=tile).sum().backward()
        both.append(counter.get_total_flops())
    assert forward[0] == forward[1] > 0
    assert both[1] >= both[0] > 2 * forward[0]  # a backward costs about two forwards: it was counted


def test_fused_tiles_under_torch_func_transforms_and_inplace_changes_after_the_forward():
    """torch.func.grad / vmap give what autograd gives; an input changed in place after the forward
    does not change the backward."""
    row, col, x, weight, _ = (t.detach() if t is not None else None for t in _fused_operands(1, 3, 2, 3, 4, 5))
    weight.requires_grad_()
    fused = lambda xx: ops.fused(row, col, xx, weight, tile=1)  # noqa: E731
    want = torch.autograd.grad(fused(x.clone().requires_grad_()).square().sum(), weight)[0]
    grad_x = torch.func.grad(lambda xx: fused(xx).square().sum())(x)
    xr = x.clone().requires_grad_()
    assert _rel(grad_x, torch.autograd.grad(fused(xr).square().sum(), xr)[0]) < 1e-12
    batched = torch.func.vmap(fused)(torch.stack([x, 2 * x]))
    assert _rel(batched[1], fused(2 * x)) < 1e-12
    xi = x.clone().requires_grad_()
    y = xi * 1
    out = fused(y)
    with torch.no_grad():
        y.mul_(3)  # after the forward: the backward uses what the forward saw
    got = torch.autograd.grad(out.square().sum(), weight)[0]
    assert _rel(got, want) < 1e-12


def test_fused_tiles_have_a_double_backward():
    """create_graph=True through the tiles: gradgradcheck in float64, and a gradient penalty (the input
    gradient's norm, differentiated for the operands) equal to the untiled products'."""
    row, col, x, weight, _ = _fused_operands(2, 2, 3, 5, 3, 4, bias=False, seed=5)
    assert torch.autograd.gradgradcheck(lambda *a: ops.fused(*a, tile=2), (row, col, x, weight))
    penalties = []
    for tile in (2, 5):
        (gx,) = torch.autograd.grad(ops.fused(row, col, x, weight, tile=tile).sin().sum(), x, create_graph=True)
        penalties.append(torch.autograd.grad(gx.square().sum(), (row, col, weight)))
    for a, b in zip(*penalties):
        assert _rel(a, b) < 1e-10


def test_fused_tiles_double_backward_after_an_inplace_change_names_the_input():
    row, col, x, weight, _ = _fused_operands(1, 3, 2, 3, 4, 5, bias=False)
    y = x * 1
    out = ops.fused(row, col, y, weight, tile=1)
    with torch.no_grad():
        y.mul_(3)
    with pytest.raises(RuntimeError, match="the input of an attention layer was changed in place"):
        torch.autograd.grad(out.sum(), weight, create_graph=True)


# ------------------------------------------------------------------ the path choice, and the layer as a module


@pytest.mark.parametrize("seed", range(8))
def test_resolve_impl_returns_a_path_the_layer_accepts_with_a_reason(seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(20):
        flag = lambda: bool(torch.randint(0, 2, (1,), generator=g))  # noqa: E731
        encoding = ENCODINGS[int(torch.randint(0, len(ENCODINGS), (1,), generator=g))]
        value = ("shared", "project")[int(flag())]
        size = tuple(int(n) for n in torch.randint(1, 40, (2,), generator=g))
        layer = SelfAttention2d(4, heads=2, encoding=encoding, value=value, max_size=40)
        impl, why = resolve_impl("auto", size, shared_values=layer.stackable, position_only=layer.position_only,
                                 separable=layer.separable, on_cpu=flag(), shared_dropout=flag() and layer.position_only,
                                 per_sample_dropout=flag(), explain=True)
        layer.impl = impl  # a path this layer accepts by name
        assert isinstance(why, str) and why and "\n" not in why
        assert layer.resolved_impl(size) in IMPLS[1:]


def test_hooks_on_the_layer_fire_with_its_input_and_output():
    torch.manual_seed(7)
    layer = SelfAttention2d(4, 3, heads=2, stride=2)
    x = torch.randn(2, 4, 5, 6, requires_grad=True)
    seen = {}
    layer.register_forward_pre_hook(lambda m, args: seen.setdefault("in", args[0]))
    layer.register_forward_hook(lambda m, args, out: seen.setdefault("out", out))
    y = layer(x)
    assert seen["in"] is x and seen["out"] is y and y.shape == (2, 3, 3, 3)


def test_round_71_a_refused_impls_suggest_only_what_the_layer_takes_and_unbatched_output_is_contiguous():
    """Round 71: `impl='fused'` refused for a non-separable encoding said "use impl='separable' or 'dense'", and
    'separable' is refused for it too; an unbatched image gave a channels-last (C, H, W) output, so `.view()` after the
    layer failed where it works after nn.Conv2d, and a wrong channel count was said of the batch of one made of it."""
    for kwargs in ({"encoding": "quadratic-aniso"}, {"encoding": "learned-content"}, {"value": "project"}):
        for impl in ("separable", "stacked", "fused"):
            try:
                SelfAttention2d(4, heads=2, impl=impl, **kwargs)
            except AttnconvError as err:
                taken = re.search(r"use one of impl=(.*)$", str(err)).group(1).replace("'", "").split(", ")
                for other in taken:
                    SelfAttention2d(4, heads=2, impl=other, **kwargs)  # each suggestion is taken
                assert impl not in taken
    layer = SelfAttention2d(3, 5, heads=2)
    y = layer(torch.randn(3, 6, 4))
    assert y.is_contiguous() and y.view(-1).shape == (5 * 6 * 4,)
    with pytest.raises(AttnconvError, match=r"expects input \(B, 3, H, W\) or unbatched \(3, H, W\), got \(4, 6, 4\)"):
        layer(torch.randn(4, 6, 4))


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_analysis_methods_take_an_unbatched_image_as_a_batch_of_one(encoding):
    """Round 71's note: `forward` takes an unbatched (C, H, W) image, and `attention_probs` / `attention_scores`
    refused it; they give its attention as a batch of one now, as the converted layers' do."""
    torch.manual_seed(1)
    layer = _randomize(SelfAttention2d(3, 4, heads=2, encoding=encoding, stride=2, max_size=8)).eval()
    x = torch.randn(3, 6, 5)
    for term in ("combined", "position"):
        assert torch.equal(layer.attention_probs(x, term=term), layer.attention_probs(x[None], term=term))
    scores = layer.attention_scores(x)
    assert all(v.shape[0] == 1 for v in scores.values())
    with pytest.raises(AttnconvError, match=r"or unbatched \(3, H, W\), got \(2, 6, 5\)"):
        layer.attention_probs(torch.randn(2, 6, 5))


def test_round_72_a_resolved_impl_checks_its_size_and_impl_and_layers_no_machine_holds_are_refused():
    """Round 72: `resolved_impl(size)` and `select.resolve_impl` took any size (`(-3, 4)` answered 'stacked', `(5,)` a
    ValueError from unpacking) and any impl (`'bogus'` returned as the path); `SelfAttention2d(65536, heads=64)` and
    `build_model` of such a model ended in torch's allocator error, where the CLI refuses the same model in one line."""
    layer = SelfAttention2d(4, heads=2)
    for size in [(5,), 5, (-3, 4), (0, 0), (2.5, 3), ("a", "b"), (2**40, 2**40)]:
        with pytest.raises(AttnconvError, match=r"size .* is invalid: give the input grid \(H, W\)"):
            layer.resolved_impl(size)
    assert layer.resolved_impl((7, 7)) == resolve_impl("auto", (7, 7), shared_values=True, position_only=True,
                                                       separable=True, on_cpu=True)
    with pytest.raises(AttnconvError, match="unknown impl 'bogus'"):
        resolve_impl("bogus", (5, 5), shared_values=True, position_only=True, separable=True, on_cpu=True)
    with pytest.raises(AttnconvError, match=r"size \(-1, 5\) is invalid"):
        resolve_impl("auto", (-1, 5), shared_values=True, position_only=True, separable=True, on_cpu=True)
    from attnconv import build_model

    for make in (lambda: SelfAttention2d(65536, heads=64),
                 lambda: SelfAttention2d(4, encoding="learned", pos_dim=2**20, max_size=2**20),
                 lambda: build_model("sa-quadratic", hidden=65536, heads=64, layers=1)):
        with pytest.raises(AttnconvError, match=r"SelfAttention2d\(in_channels=.*: its tensors would take more than"):
            make()
    with torch.device("meta"):  # shapes without values: nothing allocated, nothing refused
        assert SelfAttention2d(65536, heads=64).out.weight.shape == (65536, 65536 * 64)
    import numpy as np

    layer.impl = np.str_("dense")
    assert type(layer.impl) is str and "impl='dense'" in repr(layer)


def test_round_73_a_a_forward_whose_attention_no_machine_holds_and_models_named_wrong():
    """Round 73: `SelfAttention2d.forward` of a 512x512 input on the dense path (or a content layer's stacked one)
    ended in torch's allocator error where `attention_scores` refuses it first; `build_model('sa-quadratic',
    encoding=...)` was Python's "ClassifierConfig() got multiple values for keyword argument 'encoding'", and
    `build_model(['vit'])` a bare "unhashable type"."""
    from attnconv import build_model

    for layer, side in ((SelfAttention2d(2, heads=1, impl="dense"), 512),
                        (SelfAttention2d(2, heads=1, encoding="learned-content", max_size=1024), 1024)):
        with pytest.raises(AttnconvError, match=rf"the attention of {side}x{side} tokens .*: needs about .* of memory"):
            layer(torch.randn(1, 2, side, side))
    assert SelfAttention2d(2, heads=1)(torch.randn(1, 2, 512, 512)).shape == (1, 2, 512, 512)  # fused: no T x T
    with pytest.raises(AttnconvError, match=r"model 'sa-quadratic' has the 'quadratic' encoding, which its name says: "
                                            r"leave encoding out, or build 'sa-learned' for 'learned'"):
        build_model("sa-quadratic", encoding="learned")
    with pytest.raises(AttnconvError, match=r"leave encoding out, or build one named for another \(sa-quadratic, "
                                            r"sa-quadratic-aniso, sa-learned-content\)"):
        build_model("sa-learned", encoding="bogus")
    assert build_model("sa-learned", encoding="learned", hidden=8, heads=2, layers=1).config.encoding == "learned"
    with pytest.raises(AttnconvError, match=r"unknown model \['vit'\]; choose one of: resnet18"):
        build_model(["vit"])


def test_round_74_a_memory_estimates_defaults_and_image_dtypes(monkeypatch, memory_asked):
    """Round 74: the forward's memory check counted 8 bytes a token pair whatever the dtype and path (float64 dense
    peaked at 2x that, sdpa at 3.1x, a content layer at 1.5x), and one matrix for a batch on the stacked path even
    where a dropout mask per image copies it per image; `model_defaults` gave every sa-* model encoding 'quadratic'
    (so `build_model(n, **model_defaults(n))` failed); the sa-* and ViT models took images of any dtype to torch's
    first matmul ("expected m1 and m2 to have the same dtype")."""
    from attnconv import build_model
    from attnconv.models.registry import model_defaults

    T2 = float(6 * 6) ** 2
    cases = [(SelfAttention2d(2, heads=3, impl="dense").double(), 3 * 8 * 2 * 3 * T2),
             (SelfAttention2d(2, heads=3, impl="sdpa"), 4 * 4 * 2 * 3 * T2),
             (SelfAttention2d(2, heads=3, impl="stacked"), 3 * 4 * 1 * 3 * T2),
             (SelfAttention2d(2, heads=3, impl="stacked", attn_dropout=0.1).train(), 4 * 4 * 2 * 3 * T2)]  # round 75
    asked = memory_asked()  # every check refuses: what it counted is recorded
    for layer, need in cases:
        x = torch.randn(2, 2, 6, 6, dtype=layer.out.weight.dtype)
        with pytest.raises(AttnconvError, match="the attention of 6x6 tokens"):
            layer(x)
        assert asked[-1] == need, (layer, asked[-1], need)
    monkeypatch.undo()
    for name in ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content"):
        defaults = model_defaults(name)
        assert defaults["encoding"] == name.removeprefix("sa-")
        model = build_model(name, **{**defaults, "hidden": 8, "heads": 2, "layers": 1, "image_size": 8})
        assert model.config.encoding == defaults["encoding"]
    for name, size in (("sa-quadratic", 8), ("vit", 32)):
        model = build_model(name, **({"hidden": 8, "heads": 2, "layers": 1} if name != "vit" else {}))
        for dtype in (torch.uint8, torch.float64):
            with pytest.raises(AttnconvError, match=r"^x is .*(not computed with|float64).*"):
                model(torch.zeros(1, 3, size, size, dtype=dtype))
