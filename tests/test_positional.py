import itertools
import math

import pytest
import torch

from attnconv.errors import AttnconvError
from attnconv.positional import (
    LearnedContentEncoding,
    LearnedRelativeEncoding,
    QuadraticEncoding,
    relative_offsets,
)


def _pairs(H, W):
    """All (q, k, delta) with row-major token indices."""
    for (i, j), (k, l) in itertools.product(itertools.product(range(H), range(W)), repeat=2):
        yield i * W + j, k * W + l, (k - i, l - j)


def test_relative_offsets_is_key_minus_query():
    d = relative_offsets(4)
    assert d[1, 3] == 2 and d[3, 1] == -2 and torch.all(d.diagonal() == 0)


@pytest.mark.parametrize("kind", ["isotropic", "diagonal", "full"])
@pytest.mark.parametrize("H,W", [(3, 4), (5, 2)])
def test_quadratic_logits_match_gaussian_formula(kind, H, W):
    enc = QuadraticEncoding(3, kind, width_std=0.3).double()
    S = enc.inverse_covariance()
    logits = enc.logits(H, W)
    for q, k, delta in _pairs(H, W):
        for h in range(3):
            e = torch.tensor(delta, dtype=torch.float64) - enc.centers[h]
            assert logits[h, q, k].item() == pytest.approx((-0.5 * e @ S[h] @ e).item(), abs=1e-12)


def test_isotropic_logits_equal_lemma2_encoding_up_to_constant():
    # Lemma 2: v^h . r_delta with r = (||delta||^2, d1, d2), v = -alpha (1, -2 Delta1, -2 Delta2)
    enc = QuadraticEncoding(2, "isotropic").double()
    H, W = 4, 5
    alpha = enc.widths**2 / 2
    logits = enc.logits(H, W)
    for q, k, (d1, d2) in _pairs(H, W):
        for h in range(2):
            c = enc.centers[h]
            lemma = -alpha[h] * ((d1**2 + d2**2) - 2 * c[0] * d1 - 2 * c[1] * d2)
            const = -alpha[h] * (c @ c)  # independent of the key: cancels in the softmax
            assert logits[h, q, k].item() == pytest.approx((lemma + const).item(), abs=1e-10)


def test_paper_initialization_statistics():
    enc = QuadraticEncoding(20000, "isotropic")
    assert enc.centers.std().item() == pytest.approx(2.0, rel=0.03)
    assert enc.widths.mean().item() == pytest.approx(1.0, abs=1e-3)
    assert enc.widths.std().item() == pytest.approx(0.01, rel=0.05)
    full = QuadraticEncoding(5000, "full")
    assert torch.allclose(full.widths.mean(0), torch.eye(2), atol=2e-3)


def test_learned_relative_logits_match_table_lookup():
    S = 6
    enc = LearnedRelativeEncoding(3, dim=5, max_size=S, init_std=1.0).double()
    H, W = 4, 6
    logits = enc.logits(H, W)
    for q, k, (d1, d2) in _pairs(H, W):
        for h in range(3):
            ref = enc.row_keys[h] @ enc.row_embeddings[d1 + S - 1] + enc.col_keys[h] @ enc.col_embeddings[d2 + S - 1]
            assert logits[h, q, k].item() == pytest.approx(ref.item(), abs=1e-12)


def test_learned_content_position_logits_match_lookup():
    S, Dk, H, W = 5, 6, 3, 5
    enc = LearnedContentEncoding(Dk, S, init_std=1.0).double()
    q = torch.randn(2, 3, H * W, Dk, dtype=torch.float64)
    out = enc.position_logits(q, H, W)
    for b, h in [(0, 0), (1, 2)]:
        for qi, ki, (d1, d2) in _pairs(H, W):
            ref = q[b, h, qi, :3] @ enc.row_embeddings[d1 + S - 1] + q[b, h, qi, 3:] @ enc.col_embeddings[d2 + S - 1]
            assert out[b, h, qi, ki].item() == pytest.approx(ref.item(), abs=1e-12)


@pytest.mark.parametrize(
    "enc",
    [QuadraticEncoding(4, "isotropic"), QuadraticEncoding(4, "diagonal"), LearnedRelativeEncoding(4, 8, 9, init_std=0.5)],
    ids=["isotropic", "diagonal", "learned"],
)
def test_separable_softmax_is_kronecker_product_of_factor_softmaxes(enc):
    enc = enc.double()
    H, W = 7, 9
    row, col = enc.factors(H, W)
    full = enc.logits(H, W).softmax(-1)  # (heads, HW, HW)
    kron = torch.stack([torch.kron(r, c) for r, c in zip(row.softmax(-1), col.softmax(-1))])
    assert torch.allclose(full, kron, rtol=0, atol=1e-15)


def test_full_covariance_is_not_separable():
    enc = QuadraticEncoding(2, "full")
    assert not enc.separable
    with pytest.raises(AttnconvError, match="not separable"):
        enc.factors(3, 3)


def test_learned_encoding_rejects_images_beyond_its_tables():
    enc = LearnedRelativeEncoding(2, 4, max_size=5)
    with pytest.raises(AttnconvError, match="max_size=5"):
        enc.logits(6, 3)


def test_unknown_kind_is_rejected():
    with pytest.raises(AttnconvError, match="isotropic"):
        QuadraticEncoding(2, "round")


def test_widths_control_locality():
    # alpha -> large concentrates all mass on the pixel at the center offset.
    enc = QuadraticEncoding(1, "isotropic").double()
    with torch.no_grad():
        enc.centers.copy_(torch.tensor([[1.0, -1.0]]))
        enc.widths.fill_(math.sqrt(2 * 40.0))
    probs = enc.logits(5, 5).softmax(-1)
    q = 2 * 5 + 2  # query (2, 2) -> key (3, 1)
    assert probs[0, q, 3 * 5 + 1].item() == pytest.approx(1.0, abs=1e-15)
