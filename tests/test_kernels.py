"""Tests for attnconv.construct.kernels: the reverse direction (effective kernel, conv-likeness).

Relative error throughout: rel(a, b) = ||a - b||_F / max(||b||_F, tiny), b the reference.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_construct import rel
from torch import nn

from attnconv.construct import (
    EffectiveKernel,
    conv_likeness,
    conv_to_attention,
    effective_kernel,
)
from attnconv.errors import AttnconvError

# ---------------------------------------------------------------- effective kernel


def test_effective_kernel_at_an_interior_query_is_the_conv_weight():
    conv = nn.Conv2d(3, 2, 3, padding=1, dtype=torch.float64)
    ek = effective_kernel(conv_to_attention(conv), 6, 7)
    assert ek.in_size == ek.out_size == (6, 7)
    kernel = ek.at((2, 3))  # (C_out, C_in, 6, 7)
    assert kernel.shape == (2, 3, 6, 7)
    torch.testing.assert_close(kernel[:, :, 1:4, 2:5], conv.weight.detach(), rtol=0, atol=1e-14)
    kernel[:, :, 1:4, 2:5] = 0
    assert float(kernel.abs().max()) < 1e-14
    corner = ek.at(0)  # the zero padding drops the taps that fall outside
    torch.testing.assert_close(corner[:, :, :2, :2], conv.weight.detach()[:, :, 1:, 1:], rtol=0, atol=1e-14)


def test_effective_kernel_dense_matches_at_and_is_factored_by_default():
    conv = nn.Conv1d(2, 3, 3, stride=2, padding=1, padding_mode="replicate", dtype=torch.float64)
    ek = effective_kernel(conv_to_attention(conv), (9,))
    assert ek.probs.shape == (3, 5, 9) and ek.maps.shape == (3, 3, 2)  # factored storage
    dense = ek.dense()  # (T_out, T_in, C_out, C_in)
    assert dense.shape == (5, 9, 3, 2)
    for q in range(5):
        torch.testing.assert_close(dense[q].permute(1, 2, 0), ek.at(q))
    x = torch.randn(4, 2, 9, dtype=torch.float64)
    y = torch.einsum("qkoc,bck->boq", dense, x) + conv.bias[:, None]
    assert rel(y, conv(x)) <= 1e-12
    with pytest.raises(AttnconvError, match="query"):
        ek.at(5)


def test_replicated_padding_keys_fold_onto_the_edge_pixel():
    conv = nn.Conv1d(1, 1, 3, padding=1, padding_mode="replicate", dtype=torch.float64)
    probs = conv_to_attention(conv).attention_probs(size=(4,))[0]  # (3, 4, 4)
    torch.testing.assert_close(probs.sum(-1), torch.ones(3, 4, dtype=torch.float64))  # nothing drops out
    assert probs[0, 0, 0] == pytest.approx(1.0)  # head -1 at query 0 reads the copy of pixel 0
    zeros = conv_to_attention(nn.Conv1d(1, 1, 3, padding=1, dtype=torch.float64)).attention_probs(size=(4,))[0]
    assert float(zeros[0, 0].sum()) < 1e-15  # ... while a zero padding key drops out


class _StubLayer(nn.Module):
    """A position-only attention layer given by explicit probabilities (heads, T, T)."""

    def __init__(self, probs: torch.Tensor, maps: torch.Tensor, position_only: bool = True):
        super().__init__()
        self.probs, self.maps, self.position_only = probs, maps, position_only

    def attention_probs(self, x=None, size=None):
        return self.probs[None]

    def value_maps(self):
        return self.maps, torch.zeros(self.maps.shape[1], dtype=self.maps.dtype)


def _shift_probs(size: tuple[int, int], shift: tuple[int, int]) -> torch.Tensor:
    """One head attending exactly to q + shift (rows of border queries whose target is outside: 0)."""
    h, w = size
    probs = torch.zeros(1, h * w, h * w, dtype=torch.float64)
    for i in range(h):
        for j in range(w):
            ti, tj = i + shift[0], j + shift[1]
            if 0 <= ti < h and 0 <= tj < w:
                probs[0, i * w + j, ti * w + tj] = 1.0
    return probs


def test_effective_kernel_refuses_content_attention_and_bad_shapes():
    maps = torch.randn(1, 2, 2, dtype=torch.float64)
    with pytest.raises(AttnconvError, match="content"):
        effective_kernel(_StubLayer(_shift_probs((3, 3), (0, 0)), maps, position_only=False), 3, 3)
    with pytest.raises(AttnconvError, match="expected"):
        effective_kernel(_StubLayer(_shift_probs((3, 3), (0, 0)), maps), 4, 4)
    with pytest.raises(AttnconvError, match="not an attention layer"):
        effective_kernel(nn.Linear(2, 2), 3, 3)


# ---------------------------------------------------------------- conv-likeness


@pytest.mark.parametrize(
    "kwargs, size",
    [({"padding": 1}, (8, 8)), ({"padding": "same"}, (7, 9)), ({"stride": 2}, (9, 8))],
    ids=["pad1", "same", "valid-stride2"],
)
def test_conv_likeness_of_a_converted_conv_recovers_its_weights(kwargs, size):
    conv = nn.Conv2d(3, 5, 3, dtype=torch.float64, **kwargs)
    attn = conv_to_attention(conv)
    report = conv_likeness(attn, size, kernel_size=3)
    assert report.distance < 1e-12
    torch.testing.assert_close(report.kernel, conv.weight.detach(), rtol=0, atol=1e-14)
    torch.testing.assert_close(report.window_mass, torch.ones(9, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(report.centers, attn.centers.double())
    # a 5x5 window contains the 3x3 conv: still distance 0, with the outer ring of the kernel 0
    wide = conv_likeness(attn, size, kernel_size=5)
    assert wide.distance < 1e-12
    torch.testing.assert_close(wide.kernel[:, :, 1:4, 1:4], conv.weight.detach(), rtol=0, atol=1e-14)


def test_conv_likeness_of_a_dilated_conv_needs_a_wider_window():
    conv = nn.Conv2d(2, 2, 3, padding=2, dilation=2, dtype=torch.float64)
    attn = conv_to_attention(conv)
    assert conv_likeness(attn, 9, kernel_size=3).distance > 0.5
    assert conv_likeness(attn, 9, kernel_size=5).distance < 1e-12


def test_conv_likeness_of_uniform_attention_is_far_from_a_conv():
    h, w, k = 7, 9, 3
    t = h * w
    maps = torch.randn(2, 4, 3, dtype=torch.float64)
    layer = _StubLayer(torch.full((2, t, t), 1.0 / t, dtype=torch.float64), maps)
    report = conv_likeness(layer, (h, w), kernel_size=k)
    # L[q, k] is the same block for every pair: the best conv matches it on the pairs inside
    # the window and misses every other pair, so distance^2 = 1 - (# pairs in window) / T^2.
    pairs = sum((h - abs(a)) * (w - abs(b)) for a in range(-1, 2) for b in range(-1, 2))
    assert report.distance == pytest.approx(math.sqrt(1 - pairs / t**2), rel=1e-12)
    assert report.distance > 0.9
    torch.testing.assert_close(report.window_mass, torch.full((2,), k * k / t, dtype=torch.float64))
    torch.testing.assert_close(report.centers, torch.zeros(2, 2, dtype=torch.float64), rtol=0, atol=1e-12)
    kernel = maps.sum(0) / t
    torch.testing.assert_close(report.kernel, kernel[:, :, None, None].expand(4, 3, 3, 3))


def test_conv_likeness_of_a_shift_outside_the_window():
    maps = torch.randn(1, 2, 2, dtype=torch.float64)
    layer = _StubLayer(_shift_probs((6, 6), (2, 0)), maps)
    three = conv_likeness(layer, (6, 6), kernel_size=3)
    assert three.distance == pytest.approx(1.0, abs=1e-12)  # all of the map lies outside 3x3
    assert three.centers.tolist() == [[2.0, 0.0]]
    assert float(three.window_mass[0]) == pytest.approx(1.0)  # but it is one-hot around its center
    five = conv_likeness(layer, (6, 6), kernel_size=5)
    assert five.distance < 1e-12
    torch.testing.assert_close(five.kernel[:, :, 4, 2], maps[0])


def test_conv_likeness_1d_and_to_dict():
    conv = nn.Conv1d(2, 3, 3, padding=1, dtype=torch.float64)
    report = conv_likeness(conv_to_attention(conv), 10)
    assert report.distance < 1e-12 and report.kernel.shape == (3, 2, 3)
    ek = effective_kernel(conv_to_attention(conv), 10)
    assert isinstance(ek, EffectiveKernel)
    assert conv_likeness(ek, 10).distance == pytest.approx(report.distance, abs=1e-15)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["heads"] == 3 and data["size"] == [10] and data["kernel_shape"] == [3, 2, 3]
    with pytest.raises(AttnconvError, match="does not match"):
        conv_likeness(ek, 11)


def test_self_attention2d_with_conv_centers_is_a_replicate_padded_conv():
    """A real SelfAttention2d (quadratic encoding) set up as in Theorem 1. With no padding its
    softmax renormalizes over the pixels that exist, so a head whose target is one pixel
    outside lands on the edge pixel: the layer is the replicate-padded convolution."""
    SelfAttention2d = pytest.importorskip("attnconv.attention").SelfAttention2d
    layer = SelfAttention2d(3, 4, heads=9, encoding="quadratic").double()
    with torch.no_grad():
        layer.encoding.centers.copy_(torch.cartesian_prod(torch.arange(-1, 2), torch.arange(-1, 2)))
        layer.encoding.widths.fill_(math.sqrt(2 * 40.0))  # score -a^2/2 ||delta - mu||^2: alpha = 40
    maps, bias = layer.value_maps()  # (9, 4, 3)
    conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode="replicate", dtype=torch.float64)
    with torch.no_grad():
        conv.weight.copy_(maps.permute(1, 2, 0).reshape(4, 3, 3, 3))
        conv.bias.copy_(bias)
    x = torch.randn(2, 3, 7, 8, dtype=torch.float64)
    ek = effective_kernel(layer, 7, 8)
    assert rel(ek.apply(x), layer(x)) <= 1e-12  # the factored contract on the real layer
    assert rel(layer(x), conv(x)) <= 1e-12
    report = conv_likeness(layer, (7, 8))
    assert torch.equal(report.centers, layer.encoding.centers.detach())  # the head's own parameter
    reference = conv_likeness(conv_to_attention(conv), (7, 8))
    assert 0.1 < report.distance == pytest.approx(reference.distance, abs=1e-9)
    torch.testing.assert_close(report.kernel, reference.kernel)
