"""attnconv.data augmentation: normalize, batched crop + flip against per-image references."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attnconv import data

CIFAR = data.dataset_info("cifar10")


def test_normalize_matches_formula():
    images = torch.randint(0, 256, (4, 3, 5, 6), dtype=torch.uint8)
    expected = (images.double() / 255 - torch.tensor(CIFAR.mean).view(1, 3, 1, 1).double()) / torch.tensor(
        CIFAR.std
    ).view(1, 3, 1, 1).double()
    got = data.normalize(images, CIFAR)
    assert got.dtype == torch.float32 and torch.allclose(got.double(), expected, atol=1e-5)


def test_normalize_does_not_modify_float_input():
    x = torch.rand(2, 3, 4, 4) * 255
    before = x.clone()
    data.normalize(x, CIFAR)
    assert torch.equal(x, before)


@pytest.mark.parametrize("pad", [0, 1, 4])
def test_centered_crop_is_identity(pad):
    x = torch.randint(0, 256, (5, 3, 7, 9), dtype=torch.uint8)
    offsets = torch.full((5, 2), pad)
    assert torch.equal(data.crop_flip(x, offsets, torch.zeros(5, dtype=torch.bool), pad), x)


def test_flip_equals_torch_flip():
    x = torch.randn(5, 3, 7, 9)
    got = data.crop_flip(x, torch.full((5, 2), 4), torch.ones(5, dtype=torch.bool), 4)
    assert torch.equal(got, x.flip(-1))


def test_corner_crop_shows_zero_padding():
    x = torch.randint(1, 256, (2, 1, 6, 6), dtype=torch.uint8)
    got = data.crop_flip(x, torch.zeros(2, 2, dtype=torch.long), torch.zeros(2, dtype=torch.bool), 2)
    assert (got[:, :, :2, :] == 0).all() and (got[:, :, :, :2] == 0).all()
    assert torch.equal(got[:, :, 2:, 2:], x[:, :, :4, :4])


@pytest.mark.parametrize("dtype", [torch.uint8, torch.float32])
def test_random_crop_flip_matches_per_image_reference(dtype):
    g = torch.Generator().manual_seed(3)
    B, C, H, W, pad = 16, 3, 7, 10, 3
    x = torch.randint(0, 256, (B, C, H, W), generator=g).to(dtype)
    offsets = torch.randint(0, 2 * pad + 1, (B, 2), generator=g)
    flips = torch.randint(0, 2, (B,), generator=g).bool()
    got = data.crop_flip(x, offsets, flips, pad)
    padded = F.pad(x, (pad, pad, pad, pad))
    for i in range(B):  # reference: slice the padded image, then mirror
        top, left = offsets[i].tolist()
        ref = padded[i, :, top : top + H, left : left + W]
        assert torch.equal(got[i], ref.flip(-1) if flips[i] else ref)
    assert got.dtype == dtype


def test_random_crop_flip_depends_only_on_generator():
    x = torch.randint(0, 256, (64, 1, 8, 8), dtype=torch.uint8)
    a = data.random_crop_flip(x, torch.Generator().manual_seed(5))
    torch.manual_seed(123)  # the global RNG must not matter
    b = data.random_crop_flip(x, torch.Generator().manual_seed(5))
    c = data.random_crop_flip(x, torch.Generator().manual_seed(6))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_random_crop_flip_draws_every_offset_and_both_flips():
    offsets, flips = data.draw_crop_flip(2000, torch.Generator().manual_seed(0), pad=4, flip=True)
    assert set(offsets.flatten().tolist()) == set(range(9))
    assert 900 < int(flips.sum()) < 1100
    _, no_flips = data.draw_crop_flip(100, torch.Generator().manual_seed(0), pad=4, flip=False)
    assert not no_flips.any()

