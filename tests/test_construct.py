"""Tests for attnconv.construct: Theorem 1 (conv -> attention), its leakage bound and default alpha.
(The reverse direction is tested in test_kernels.py, the learnable layer in test_learnable.py, whole networks in
test_network.py.)

Relative error throughout: rel(a, b) = ||a - b||_F / max(||b||_F, tiny), b the reference.
"""

from __future__ import annotations

import copy
import math
import random
import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from attnconv.construct import (
    ConvAttention,
    cnn_to_attention,
    conv_to_attention,
    default_alpha,
    effective_kernel,
    leakage_bound,
)
from attnconv.errors import AttnconvError

_CONVS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
_MODES = ("zeros", "reflect", "replicate", "circular")
_RTOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(torch.finfo(b.dtype).tiny))


def _conv_forward(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with warnings.catch_warnings():  # 'same' + even kernel: PyTorch warns about a padded copy
        warnings.simplefilter("ignore", UserWarning)
        return conv(x)


def _random_case(seed: int, dtype: torch.dtype):
    """A random valid (conv, x): any dim, kernel, stride, padding, dilation, groups, mode, size."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(200):
        dim = rng.choice((1, 2, 2, 3))
        kernels = (1, 3, 5, 2, 4) if dim < 3 else (1, 3, 2)
        kernel = tuple(rng.choice(kernels) for _ in range(dim))
        stride = tuple(rng.choice((1, 1, 2, 3)) for _ in range(dim))
        dilation = tuple(rng.choice((1, 1, 2)) for _ in range(dim))
        padding = rng.choice(("int", "tuple", "same", "valid"))
        if padding == "int":
            padding = rng.randint(0, 3)
        elif padding == "tuple":
            padding = tuple(rng.randint(0, 3) for _ in range(dim))
        elif padding == "same" and max(stride) > 1:
            continue  # PyTorch rejects 'same' for strided convolutions
        kind = rng.choice(("plain", "grouped", "depthwise"))
        if kind == "plain":
            groups, c_in, c_out = 1, rng.randint(1, 4), rng.randint(1, 4)
        elif kind == "grouped":
            groups = rng.choice((2, 3))
            c_in, c_out = groups * rng.randint(1, 2), groups * rng.randint(1, 2)
        else:
            c_in = rng.randint(2, 4)
            groups, c_out = c_in, c_in * rng.randint(1, 2)
        mode = rng.choice(_MODES)
        max_side = {1: 13, 2: 9, 3: 6}[dim]
        size = tuple(rng.randint(1, max_side) for _ in range(dim))
        conv = _CONVS[dim](
            c_in,
            c_out,
            kernel,
            stride=stride,
            padding=padding,
            dilation=dilation,
            groups=groups,
            bias=rng.random() < 0.5,
            padding_mode=mode,
            dtype=dtype,
        )
        with torch.no_grad():
            conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, dtype=dtype))
        x = torch.randn(2, c_in, *size, generator=gen, dtype=dtype)
        try:
            y = _conv_forward(conv, x)
        except RuntimeError:  # input too small for this padding/kernel: draw again
            continue
        return conv, x, y
    raise AssertionError("no valid configuration drawn")


# ---------------------------------------------------------------- Theorem 1: exactness


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("seed", range(80))
def test_conv_to_attention_matches_random_convs(seed, dtype):
    conv, x, y = _random_case(seed, dtype)
    attn = conv_to_attention(conv)
    out = attn(x)
    assert out.shape == y.shape and out.dtype == dtype
    assert rel(out, y) <= _RTOL[dtype], conv


@pytest.mark.parametrize("seed", range(0, 80, 3))
def test_attention_probs_and_value_maps_reproduce_the_conv(seed):
    """The contract effective_kernel relies on: y[q] = sum_h sum_k P[h,q,k] maps[h] x[k] + bias."""
    conv, x, y = _random_case(seed, torch.float64)
    attn = conv_to_attention(conv)
    ek = effective_kernel(attn, tuple(x.shape[2:]))
    assert ek.probs.shape == (attn.heads, math.prod(y.shape[2:]), math.prod(x.shape[2:]))
    assert rel(ek.apply(x), y) <= 1e-10


@pytest.mark.parametrize("mode", _MODES)
def test_borders_use_the_padding_mode(mode):
    """Tiny image, big padding: most keys are padding tokens, yet the result is exact."""
    conv = nn.Conv2d(3, 2, 5, padding=(2, 3), padding_mode=mode, dtype=torch.float64)
    x = torch.randn(1, 3, 3, 4, dtype=torch.float64)
    assert rel(conv_to_attention(conv)(x), conv(x)) <= 1e-12


def test_unbatched_input_like_conv():
    conv = nn.Conv2d(2, 3, 3, padding=1, dtype=torch.float64)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    assert rel(conv_to_attention(conv)(x), conv(x)) <= 1e-12


@pytest.mark.parametrize("dim", [1, 2, 3])
def test_even_kernels_are_exact_with_asymmetric_centers(dim):
    """Even K: the query is tap (K-1)//2 and the centers run -(K/2-1)..K/2 (no half shift)."""
    conv = _CONVS[dim](2, 3, 4, padding="same", dtype=torch.float64)
    x = torch.randn(2, 2, *([7] * dim), dtype=torch.float64)
    attn = conv_to_attention(conv)
    assert rel(attn(x), _conv_forward(conv, x)) <= 1e-12
    assert attn.centers[:, 0].unique().tolist() == [-1, 0, 1, 2]


def test_centers_and_heads_follow_the_kernel_taps():
    conv = nn.Conv2d(1, 1, (3, 5), dilation=(2, 1))
    attn = conv_to_attention(conv)
    assert attn.heads == 15
    # row-major taps, Delta_h = dilation * (tap - center)  (Lemma 2)
    expected = [(2 * (a - 1), b - 2) for a in range(3) for b in range(5)]
    assert [tuple(c) for c in attn.centers.tolist()] == expected
    maps, bias = attn.value_maps()
    assert torch.equal(maps, conv.weight.detach().flatten(2).permute(2, 0, 1))
    assert torch.equal(bias, conv.bias.detach())


def test_value_maps_are_block_diagonal_for_groups():
    conv = nn.Conv2d(4, 6, 3, groups=2, bias=False)
    maps, bias = conv_to_attention(conv).value_maps()
    assert maps.shape == (9, 6, 4)
    assert torch.all(maps[:, :3, 2:] == 0) and torch.all(maps[:, 3:, :2] == 0)
    assert torch.equal(maps[:, 3:, 2:], conv.weight.detach()[3:].flatten(2).permute(2, 0, 1))
    assert torch.all(bias == 0)


def test_per_axis_softmax_equals_the_full_quadratic_softmax():
    """Lemma 2 scores over the whole padded grid, softmaxed jointly == product of axis softmaxes."""
    conv = nn.Conv2d(1, 1, 3, padding=1, stride=(1, 2), dtype=torch.float64)
    attn = conv_to_attention(conv, alpha=0.7)  # small alpha: the probabilities are far from one-hot
    size = (4, 5)
    fy, fx = attn.axis_probs(size)  # (3, n_1, P_1), (3, n_2, P_2)
    padded = (size[0] + 2, size[1] + 2)
    keys = torch.cartesian_prod(torch.arange(padded[0]), torch.arange(padded[1])).double()  # (P, 2)
    out = attn.output_size(size)
    queries = torch.cartesian_prod(torch.arange(out[0]) + 1, torch.arange(out[1]) * 2 + 1).double()
    for h, center in enumerate(attn.centers.double()):
        scores = -attn.alpha * (keys[None] - queries[:, None] - center).square().sum(-1)  # (T_out, P)
        full = torch.softmax(scores, dim=-1)
        t1, t2 = divmod(h, 3)
        factored = torch.einsum("qi,pj->qpij", fy[t1], fx[t2]).reshape(full.shape)
        torch.testing.assert_close(factored, full, rtol=0, atol=1e-15)


def test_no_convolution_op_is_called():
    class RecordOps(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, padding_mode="reflect")
    attn = conv_to_attention(conv)
    x = torch.randn(2, 4, 9, 8, requires_grad=True)
    with RecordOps() as recorder:
        attn(x).square().sum().backward()
        attn.attention_probs(size=(9, 8))
    assert recorder.ops, "the dispatch mode recorded nothing"
    assert any("einsum" in op or "bmm" in op or "mm" in op for op in recorder.ops)
    assert not [op for op in recorder.ops if "conv" in op]
    # and the same op recorder does see a real convolution
    with RecordOps() as recorder:
        conv(x)
    assert any("convolution" in op for op in recorder.ops)


@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
@pytest.mark.parametrize("seed", range(0, 80, 4))
def test_conversions_never_silently_wrong_output_laid_out_as_the_conv_s(seed, learnable):
    """A converted layer hands on its output in the layout the conv would (code after a conv may
    call .view() on it): contiguous for a contiguous input, channels-last for a channels-last one."""
    conv, x, y = _random_case(seed, torch.float32)
    attn = conv_to_attention(conv, learnable=learnable)
    out = attn(x)
    assert y.is_contiguous() and out.is_contiguous(), (out.shape, out.stride())
    assert torch.equal(out.view(x.shape[0], -1), out.reshape(x.shape[0], -1))
    unbatched = attn(x[0])
    assert unbatched.is_contiguous() and rel(unbatched, y[0]) <= 1e-5
    if conv.weight.dim() == 4 and x.shape[1] > 1 and min(x.shape[2:]) > 1:
        last = x.to(memory_format=torch.channels_last)
        ref = _conv_forward(conv, last)
        got = attn(last)
        assert got.is_contiguous(memory_format=torch.channels_last) == ref.is_contiguous(
            memory_format=torch.channels_last
        )
        assert rel(got, ref) <= 1e-5
    strided = x.transpose(1, -1).contiguous().transpose(1, -1)  # neither layout: as a conv, contiguous
    if not strided.is_contiguous() and conv.weight.dim() != 4:
        assert attn(strided).is_contiguous()


def test_gradients_match_the_conv():
    """The value maps are parameters: training the attention layer trains the conv's weights."""
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2, padding_mode="circular", dtype=torch.float64)
    attn = conv_to_attention(conv)
    assert {n for n, _ in attn.named_parameters()} == {"out_weight", "out_bias"}
    x = torch.randn(2, 4, 7, 8, dtype=torch.float64, requires_grad=True)
    g = torch.randn(2, 6, 4, 4, dtype=torch.float64)
    (conv(x) * g).sum().backward()
    grad_x_conv, x.grad = x.grad, None
    (attn(x) * g).sum().backward()
    torch.testing.assert_close(x.grad, grad_x_conv, rtol=1e-10, atol=1e-12)
    grad_w = conv.weight.grad.flatten(2).permute(2, 0, 1)  # (heads, C_out, C_in / groups)
    torch.testing.assert_close(attn.out_weight.grad, grad_w, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(attn.out_bias.grad, conv.bias.grad, rtol=1e-10, atol=1e-12)


def test_follows_the_conv_device_and_dtype_and_keeps_alpha_on_to():
    conv = nn.Conv2d(3, 4, 3, padding=1, dtype=torch.float64)
    attn = conv_to_attention(conv)
    assert attn.out_weight.dtype == torch.float64 and attn.alpha == default_alpha(torch.float64, 2)
    attn32 = attn.to(torch.float32)
    assert attn32.alpha == default_alpha(torch.float64, 2)
    x = torch.randn(2, 3, 6, 6)
    assert attn32(x).dtype == torch.float32
    assert rel(attn32(x), conv.float()(x)) <= 1e-5


def test_rejects_what_is_not_a_conv_and_input_the_conv_rejects():
    with pytest.raises(AttnconvError, match="Conv1d/2d/3d"):
        conv_to_attention(nn.ConvTranspose2d(2, 2, 3))
    with pytest.raises(AttnconvError, match=r"alpha 0.0 is invalid: .* in \(0, 10000\]"):
        conv_to_attention(nn.Conv2d(1, 1, 3), alpha=0.0)
    attn = conv_to_attention(nn.Conv2d(2, 2, 3, padding=1))
    with pytest.raises(AttnconvError, match="expected input"):
        attn(torch.randn(1, 3, 5, 5))
    # every input size where nn.ConvNd fails also fails here, with an AttnconvError
    for mode, pad, side in [("zeros", 0, 2), ("reflect", 2, 2), ("circular", 3, 2), ("replicate", 0, 1)]:
        conv = nn.Conv2d(1, 1, 3, padding=pad, padding_mode=mode)
        x = torch.randn(1, 1, side, 6)
        with pytest.raises(RuntimeError):
            conv(x)
        with pytest.raises(AttnconvError, match="axis 0"):
            conv_to_attention(conv)(x)


@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
@pytest.mark.parametrize(
    "dim, c_in, c_out", [(2, 0, 3), (2, 3, 0), (2, 0, 0), (1, 0, 2), (3, 2, 0)],
    ids=["no-in", "no-out", "neither", "1d-no-in", "3d-no-out"],
)
def test_a_conv_without_channels_is_one_clear_error(dim, c_in, c_out, learnable):
    with warnings.catch_warnings():  # PyTorch warns that initializing its empty weight is a no-op
        warnings.simplefilter("ignore", UserWarning)
        conv = _CONVS[dim](c_in, c_out, 3)
    with pytest.raises(AttnconvError, match=r"at least one input and one output channel.*build the conv with both >= 1"):
        conv_to_attention(conv, learnable=learnable)


@pytest.mark.parametrize(
    "channels, groups, kernel, stride, padding",
    [((0, 3), 1, (3,), (1,), ((1, 1),)), ((3, 0), 1, (3,), (1,), ((1, 1),)), ((2, 2), 0, (3,), (1,), ((1, 1),)),
     ((2, 2), 1, (0,), (1,), ((0, 0),)), ((2, 2), 1, (3,), (0,), ((1, 1),)), ((2, 2), 1, (3,), (1,), ((-1, 1),))],
    ids=["no-in", "no-out", "no-groups", "empty-kernel", "stride-0", "negative-padding"],
)
def test_the_constructor_refuses_degenerate_geometry_with_an_attnconv_error(channels, groups, kernel, stride, padding):
    with pytest.raises(AttnconvError, match="is invalid: give .*(from 1 to|positive integers|>= 0)"):
        ConvAttention(*channels, kernel, stride=stride, padding=padding, dilation=(1,), groups=groups, alpha=20.0)


def test_alphas_are_each_heads_alpha_itself_not_the_encodings_widths():
    """`alphas` is Lemma 2's alpha_h (the score is -alpha_h ||delta - Delta_h||^2), unlike
    QuadraticEncoding.widths (a_h, alpha = a_h^2 / 2); the ambiguous name is gone."""
    attn = conv_to_attention(nn.Conv2d(1, 1, 3, padding=1, dtype=torch.float64), alpha=3.5)
    assert torch.equal(attn.alphas, torch.full((9,), 3.5, dtype=torch.float64))
    assert not hasattr(attn, "widths")
    scores = attn.attention_scores(size=(3, 3))["position"][0, :, 4]  # middle query: (heads, 9 pixels)
    # Lemma 2's -alpha ||k - q - Delta_h||^2: head h (tap h) scores 0 on the pixel of its tap, 8 alpha on the far corner
    taps = torch.tensor([(r, c) for r in range(3) for c in range(3)], dtype=torch.float64)
    want = -3.5 * (taps[None, :] - taps[:, None]).square().sum(-1)  # [head, key]
    torch.testing.assert_close(scores, want)
    assert scores.argmax(-1).tolist() == list(range(9))  # every head sits on its kernel tap


@pytest.mark.parametrize("dim", [1, 2, 3])
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
def test_scores_are_the_probabilities_before_the_softmax_on_every_axis_count(dim, learnable):
    """Without padding every key is a pixel, so attention_probs is the softmax of attention_scores; the learnable
    layer at its start has the fixed layer's scores (its heads in the same tap order)."""
    conv = _CONVS[dim](2, 3, (3, 2, 3)[:dim], stride=(2, 1, 1)[:dim], dilation=(1, 2, 1)[:dim], dtype=torch.float64)
    size = (7, 6, 5)[:dim]
    attn = conv_to_attention(conv, alpha=0.7, learnable=learnable)
    scores = attn.attention_scores(size=size)
    assert set(scores) == {"combined", "position"} and scores["combined"].shape == attn.attention_probs(size=size).shape
    torch.testing.assert_close(scores["combined"].softmax(-1), attn.attention_probs(size=size))
    x = torch.randn(1, 2, *size, dtype=torch.float64)
    torch.testing.assert_close(attn.attention_scores(x)["position"], scores["position"])  # x gives its size
    fixed = conv_to_attention(conv, alpha=0.7).attention_scores(size=size)["position"]
    torch.testing.assert_close(scores["position"], fixed)


# ---------------------------------------------------------------- non-finite inputs (documented, not local)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
def test_one_non_finite_pixel_spoils_its_images_channel_group_as_documented(bad, learnable):
    """The equivalence covers finite inputs. With one bad value in image 0, channel 1 (group 0 of 2),
    the conv has non-finite outputs only in that pixel's receptive field and group; the attention
    layer, as ConvAttention's docstring says, in every output of image 0, group 0. Image 1 and
    group 1 stay exact, and error_bound says there is no finite bound."""
    conv = nn.Conv2d(4, 6, 3, padding=1, groups=2, dtype=torch.float64)
    attn = conv_to_attention(conv, learnable=learnable)
    x = torch.randn(2, 4, 7, 8, dtype=torch.float64)
    assert rel(attn(x), conv(x)) <= 1e-12  # finite: exact
    assert attn.error_bound(x) < 1e-12
    x[0, 1, 3, 4] = bad
    y_conv, y_attn = conv(x), attn(x)
    conv_bad = ~y_conv.isfinite()
    assert conv_bad[0, :3, 2:5, 3:6].all() and conv_bad.sum() == 3 * 9  # local in the conv
    assert (~y_attn[0, :3].isfinite()).all()  # every output of image 0 in the bad pixel's group
    assert rel(y_attn[0, 3:], y_conv[0, 3:]) <= 1e-12  # the other group is untouched
    assert rel(y_attn[1], y_conv[1]) <= 1e-12  # and so is the other image
    assert attn.error_bound(x) == math.inf


# ---------------------------------------------------------------- leakage bound and alpha


def test_leakage_bound_covers_the_exact_one_axis_leakage():
    for alpha in (0.5, 1.0, 2.0, 4.0, 8.0, 16.0):
        wrong = sum(math.exp(-alpha * d * d) for d in range(-50, 51) if d)
        exact = wrong / (1.0 + wrong)  # mass off target on an unbounded axis
        bound = leakage_bound(alpha, 1)
        assert exact <= bound
        if alpha >= 4:
            assert bound <= exact * (1 + 1e-4)  # and it is tight once alpha is large
    assert leakage_bound(3.0, 2) > leakage_bound(3.0, 1)
    assert leakage_bound(3.0, 2) == pytest.approx(1 - (1 - leakage_bound(3.0, 1)) ** 2)


def test_error_decreases_with_alpha_and_stays_under_the_bound():
    torch.manual_seed(1)
    conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect", dtype=torch.float64)
    x = torch.randn(2, 3, 8, 7, dtype=torch.float64)
    y = conv(x)
    errors = []
    for alpha in (1.0, 2.0, 4.0, 8.0, 16.0):
        attn = conv_to_attention(conv, alpha=alpha)
        err = float((attn(x) - y).detach().abs().max())
        assert err <= attn.error_bound(x), alpha
        errors.append(err)
    assert all(a > b for a, b in zip(errors, errors[1:])), errors
    assert errors[-1] < 1e-5 < errors[0]


def test_probability_mass_off_target_is_within_the_leakage_bound():
    conv = nn.Conv3d(1, 1, 3, padding=1, dtype=torch.float64)
    attn = conv_to_attention(conv, alpha=2.0)
    probs = attn.attention_probs(size=(5, 4, 6))[0]  # (27, T, T) with zero padding: rows may sum < 1
    targets = attn.query_positions((5, 4, 6))[None] + attn.centers[:, None]  # (27, T, 3)
    inside = ((targets >= 0) & (targets < torch.tensor([5, 4, 6]))).all(-1)
    flat = (targets[..., 0] * 4 + targets[..., 1]) * 6 + targets[..., 2]
    on_target = probs.gather(2, flat.clamp(0, 119)[..., None])[..., 0]
    assert float((1 - on_target[inside]).max()) <= leakage_bound(2.0, 3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("ndim", [1, 2, 3])
def test_default_alpha_is_the_smallest_width_within_a_sixteenth_of_eps(dtype, ndim):
    eps = torch.finfo(dtype).eps
    alpha = default_alpha(dtype, ndim)
    assert 2 * leakage_bound(alpha, ndim) <= eps / 16
    assert 2 * leakage_bound(alpha - 0.02, ndim) > eps / 16
    assert alpha == pytest.approx(math.log(64 * ndim / eps), abs=0.02)


def test_default_alpha_values():
    assert 40 < default_alpha(torch.float64, 2) < 46
    assert 19 < default_alpha(torch.float32, 2) < 23


def test_error_bound_at_the_default_alpha_is_a_sixteenth_of_eps_times_the_output_scale():
    conv = nn.Conv2d(8, 8, 3, padding=1)
    x = torch.randn(2, 8, 10, 10)
    attn = conv_to_attention(conv)
    eps = torch.finfo(torch.float32).eps
    scale = float(conv.weight.detach().abs().sum((1, 2, 3)).max()) * float(x.abs().max())  # ||W||_inf,1 max|x|
    assert attn.error_bound(x) <= eps / 16 * scale


def test_conv_attention_is_a_module_of_its_own():
    layer = ConvAttention(
        4, 4, (3, 3), stride=(1, 1), padding=((1, 1), (1, 1)), dilation=(1, 1), groups=4, alpha=20.0
    )
    out = layer(torch.randn(1, 4, 5, 5))
    assert out.shape == (1, 4, 5, 5)
    assert "heads=9" in repr(layer)


def test_round_60_a_the_output_layout_is_the_convs_for_every_input_layout():
    """Round 60: the layout of a converted layer's output was decided by comparing the input's strides with each
    layout's (unlike the convolution for inputs of one channel or size-1 axes, which fit both: 48 of 408 here), a
    comparison torch.func.vmap refuses ("NYI") and torch.compile failed to recompile for a channels-last input after a
    contiguous one. Now as the convolution decides (`suggest_memory_format`)."""
    import itertools

    for c_in, h, w, b, mode in itertools.product((1, 3), (1, 2, 5), (1, 5), (1, 2), ("zeros", "reflect", "circular")):
        if mode != "zeros" and min(h, w) < 2:
            continue
        conv = nn.Conv2d(c_in, 2, 3, padding=1, padding_mode=mode)
        attn = conv_to_attention(conv)
        for x in (torch.randn(b, c_in, h, w), torch.randn(b, c_in, h, w).to(memory_format=torch.channels_last),
                  torch.randn(b, h, w, c_in).permute(0, 3, 1, 2), torch.randn(b, c_in, w, h).transpose(2, 3)):
            y, z = conv(x), attn(x)
            assert (y.is_contiguous(), y.is_contiguous(memory_format=torch.channels_last)) == \
                (z.is_contiguous(), z.is_contiguous(memory_format=torch.channels_last)), (x.shape, x.stride(), mode)
    conv = nn.Conv2d(4, 4, 3, padding=1)
    compiled, x = torch.compile(conv_to_attention(conv)), torch.randn(2, 4, 8, 8)
    assert rel(compiled(x), conv(x)) <= 1e-5
    last = compiled(x.to(memory_format=torch.channels_last))
    assert rel(last, conv(x)) <= 1e-5 and last.is_contiguous(memory_format=torch.channels_last)


def test_round_61_a_vmap_of_channels_last_samples_and_a_trace_that_says_its_size():
    """Round 61: vmap of a converted layer still failed for channels-last samples (its output was made channels-last
    with contiguous(memory_format=...), which vmap refuses: "NYI"); a converted layer traced by torch.jit.trace
    computed for the traced size only, for any input, without a word of its own."""
    import warnings

    conv = nn.Conv2d(3, 4, 3, padding=1)
    attn = conv_to_attention(conv)
    xs = torch.randn(5, 2, 6, 6, 3).permute(0, 1, 4, 2, 3)  # each sample channels-last
    got, want = torch.func.vmap(attn)(xs), torch.func.vmap(conv)(xs)
    assert rel(got, want) <= 1e-5
    x = torch.randn(2, 3, 6, 6).to(memory_format=torch.channels_last)
    assert attn(x).is_contiguous(memory_format=torch.channels_last) and rel(attn(x), conv(x)) <= 1e-5
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        traced = torch.jit.trace(attn, torch.randn(1, 3, 6, 6))
    said = [str(w.message) for w in caught if issubclass(w.category, torch.jit.TracerWarning)]
    assert any(s.startswith("ConvAttention traced at input size (6, 6): the trace computes for that size only")
               for s in said), said
    same = torch.randn(2, 3, 6, 6)
    assert rel(traced(same), conv(same)) <= 1e-5  # at the size it was traced at (another batch too), the conv


def test_round_62_a_under_vmap_the_output_is_contiguous_so_view_after_it_works():
    """Round 62: under torch.func.vmap the converted layer laid out channels-last samples' outputs channels-last, where
    the convolution's batching rule (the mapped axis elsewhere in memory: in_dims=1) gives them contiguous, and
    `.view()` after the layer failed inside vmap where it runs after the convolution (a converted CNN too)."""
    conv = nn.Conv2d(3, 4, 3, padding=1)
    attn = conv_to_attention(conv)
    xs = torch.randn(2, 5, 6, 6, 3).permute(0, 1, 4, 2, 3)  # mapped over axis 1: samples (2, 3, 6, 6) channels-last
    for layer in (conv, attn):
        flat = torch.func.vmap(lambda t, m=layer: m(t).view(t.shape[0], -1), in_dims=1)(xs)
        assert flat.shape == (5, 2, 144)
    assert rel(torch.func.vmap(attn, in_dims=1)(xs), torch.func.vmap(conv, in_dims=1)(xs)) <= 1e-5
    net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Conv2d(2, 2, 3, padding=1))
    converted = cnn_to_attention(copy.deepcopy(net))
    images = torch.randn(3, 4, 1, 5, 5)  # chunks of one-channel images

    def head(model):
        return lambda chunk: model(chunk).view(chunk.shape[0], -1)

    assert rel(torch.func.vmap(head(converted))(images), torch.func.vmap(head(net))(images)) <= 1e-5


def test_the_backends_layout_is_what_the_convolution_returns():
    """backend_channels_last (what the converted layer asks on every device) answers as torch's convolution lays out its
    output, over seeded random convolutions, dtypes and input layouts on the CPU (tests/test_cuda.py on a GPU)."""
    from attnconv.construct.geometry import backend_channels_last

    rng = random.Random(7)
    for _ in range(120):
        nd, dtype = rng.choice([2, 2, 3]), rng.choice([torch.float32, torch.float64, torch.bfloat16])
        g = rng.choice([1, 1, 2])
        conv = (nn.Conv2d if nd == 2 else nn.Conv3d)(g * rng.choice([1, 2, 3]), g * rng.choice([1, 2]), rng.choice([1, 3]),
                                                     stride=rng.choice([1, 2]), padding=1, groups=g).to(dtype)
        x = torch.randn(rng.choice([1, 2, 3]), conv.in_channels, *[rng.choice([1, 3, 6]) for _ in range(nd)], dtype=dtype)
        fmt = torch.channels_last if nd == 2 else torch.channels_last_3d
        layout = rng.choice(["contiguous", "channels-last", "transposed", "sliced"])
        if layout == "channels-last":
            x = x.contiguous(memory_format=fmt)
        elif layout == "transposed":
            x = x.transpose(-1, -2).contiguous().transpose(-1, -2)
        elif layout == "sliced":
            x = torch.cat([x, x], -1)[..., ::2]
        with torch.no_grad():
            y = conv(x)
        if y.is_contiguous() and y.is_contiguous(memory_format=fmt):
            continue  # both layouts at once: nothing to tell
        said = backend_channels_last(x, conv.weight.shape, conv.stride, conv.padding, conv.dilation, conv.groups)
        assert said == y.is_contiguous(memory_format=fmt), (conv, tuple(x.shape), x.stride(), dtype)


def test_a_converted_3d_layer_lays_out_one_channels_last_image_as_the_convolution_does():
    """A left note of round 69: on the CPU a Conv3d of one channels-last image returns a contiguous output (its
    backend's choice; a batch of two stays channels-last) where the converted layer followed the input's layout. It
    asks the backend on the CPU too now, so `.view()` after it works where it works after the convolution."""
    rng = random.Random(11)
    for _ in range(40):
        conv = nn.Conv3d(rng.choice([1, 2, 3]), rng.choice([2, 4]), rng.choice([1, 3]), stride=rng.choice([1, 2]),
                         padding=1, padding_mode=rng.choice(["zeros", "reflect"]))
        attn = conv_to_attention(conv)
        x = torch.randn(rng.choice([1, 1, 2]), conv.in_channels, *[rng.choice([3, 4, 6]) for _ in range(3)])
        for given in (x, x.contiguous(memory_format=torch.channels_last_3d)):
            with torch.no_grad():
                want, got = conv(given), attn(given)
            assert rel(got, want) <= 1e-5
            assert (got.is_contiguous(), got.is_contiguous(memory_format=torch.channels_last_3d)) == \
                (want.is_contiguous(), want.is_contiguous(memory_format=torch.channels_last_3d)), (conv, x.shape)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_under_autocast_a_converted_layer_returns_the_convolutions_dtype(dtype):
    """Rounds 57-62's note: under autocast a converted layer returned float32 (its float32 scores and bias promoted
    the sum) where the convolution returns autocast's dtype; code after it (a cat with the conv's output, a dtype
    check) saw another tensor. Float64 stays float64, as the convolution's."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    for layer in (conv_to_attention(conv), conv_to_attention(conv, learnable=True)):
        for given in (x, x.to(dtype)):
            with torch.autocast("cpu", dtype=dtype):
                want, got = conv(given), layer(given)
            assert got.dtype == want.dtype == dtype
            assert torch.allclose(got.float(), want.float(), atol=0.05, rtol=0.05)
    net = cnn_to_attention(nn.Sequential(conv, nn.ReLU(), nn.Conv2d(4, 2, 3)))
    with torch.autocast("cpu", dtype=dtype):
        assert net(x).dtype == dtype
    assert conv_to_attention(conv.double())(x.double()).dtype == torch.float64


def test_a_convolutions_state_dict_loads_into_its_converted_layer_and_network():
    """Rounds 62-65's note: loading an nn.Conv2d's state_dict into its converted layer was torch's key error; a CNN's
    checkpoint now loads into its converted network (BatchNorm kept), and a weight of another shape is one line."""
    torch.manual_seed(0)
    conv, x = nn.Conv2d(3, 4, 3, padding=1), torch.randn(2, 3, 8, 8)
    layer = conv_to_attention(nn.Conv2d(3, 4, 3, padding=1))
    assert not torch.allclose(layer(x), conv(x), atol=1e-3)
    layer.load_state_dict(conv.state_dict())
    assert torch.allclose(layer(x), conv(x), atol=1e-5)

    def cnn():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Conv2d(8, 4, 3, groups=2, bias=False)).eval()

    trained, converted = cnn(), cnn_to_attention(cnn()).eval()
    converted.load_state_dict(trained.state_dict())
    assert torch.allclose(converted(x), trained(x), atol=1e-5)
    assert set(converted.state_dict()) == {"0.out_weight", "0.out_bias", "1.weight", "1.bias", "1.running_mean",
                                           "1.running_var", "1.num_batches_tracked", "3.out_weight"}
    with pytest.raises(AttnconvError, match=r"^weight of shape \(5, 3, 3, 3\) is not this layer's convolution's weight "
                                            r"\(4, 3, 3, 3\)"):
        layer.load_state_dict(nn.Conv2d(3, 5, 3).state_dict())


def test_a_state_dict_weight_that_is_no_tensor_is_said_as_such():
    """Round 68: a convolution's weight given as a numpy array was said to be of the wrong shape, naming two equal
    shapes; a list was "shape ()"."""
    layer = conv_to_attention(nn.Conv2d(3, 4, 3))
    for given in (nn.Conv2d(3, 4, 3).weight.detach().numpy(), [[0.0]]):
        with pytest.raises(AttnconvError, match=rf"^weight is a {type(given).__name__}, not a tensor"):
            layer.load_state_dict({"weight": given, "bias": torch.zeros(4)})
