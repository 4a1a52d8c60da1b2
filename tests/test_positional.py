import copy
import itertools
import math

import pytest
import torch

from attnconv.errors import AttnconvError
from attnconv.ops.scores import relative_offsets
from attnconv.positional import (
    LearnedContentEncoding,
    LearnedRelativeEncoding,
    QuadraticEncoding,
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
    enc = LearnedRelativeEncoding(3, dim=5, max_size=S).double()
    H, W = 4, 6
    logits = enc.logits(H, W)
    for q, k, (d1, d2) in _pairs(H, W):
        for h in range(3):
            ref = enc.row_keys[h] @ enc.row_embeddings[d1 + S - 1] + enc.col_keys[h] @ enc.col_embeddings[d2 + S - 1]
            assert logits[h, q, k].item() == pytest.approx(ref.item(), abs=1e-12)


def test_learned_content_position_logits_match_lookup():
    S, Dk, H, W = 5, 6, 3, 5
    enc = LearnedContentEncoding(Dk, S).double()
    q = torch.randn(2, 3, H * W, Dk, dtype=torch.float64)
    out = enc.position_logits(q, H, W)
    for b, h in [(0, 0), (1, 2)]:
        for qi, ki, (d1, d2) in _pairs(H, W):
            ref = q[b, h, qi, :3] @ enc.row_embeddings[d1 + S - 1] + q[b, h, qi, 3:] @ enc.col_embeddings[d2 + S - 1]
            assert out[b, h, qi, ki].item() == pytest.approx(ref.item(), abs=1e-12)


@pytest.mark.parametrize(
    "enc",
    [QuadraticEncoding(4, "isotropic"), QuadraticEncoding(4, "diagonal"), LearnedRelativeEncoding(4, 8, 9)],
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


# --------------------------------------------------------------------------- initialization


def test_authors_init_draws_what_their_embedding_and_linear_modules_draw():
    # The paper's code: nn.Embedding row/col tables, then nn.Linear(D_p, heads, bias=False) keys,
    # created in this order; same seed, same numbers.
    torch.manual_seed(11)
    enc = LearnedRelativeEncoding(5, dim=12, max_size=4)
    torch.manual_seed(11)
    row, col = torch.nn.Embedding(7, 12), torch.nn.Embedding(7, 12)
    keys_row, keys_col = torch.nn.Linear(12, 5, bias=False), torch.nn.Linear(12, 5, bias=False)
    for ours, theirs in ((enc.row_embeddings, row.weight), (enc.col_embeddings, col.weight),
                         (enc.row_keys, keys_row.weight), (enc.col_keys, keys_col.weight)):
        assert torch.equal(ours, theirs)


def test_learned_init_statistics():
    authors = LearnedRelativeEncoding(400, dim=400, max_size=16)
    bert = LearnedRelativeEncoding(400, dim=400, max_size=16, init="bert")
    assert authors.row_embeddings.std().item() == pytest.approx(1.0, rel=0.02)
    bound = 1 / math.sqrt(400)  # U(-1/sqrt(D_p), 1/sqrt(D_p)), std bound / sqrt(3)
    assert authors.row_keys.abs().max().item() <= bound
    assert authors.col_keys.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    for p in bert.parameters():
        assert p.std().item() == pytest.approx(0.02, rel=0.02)


@pytest.mark.parametrize("key_dim", [8, 64, 401])
def test_content_authors_init_gives_their_score_scale(key_dim):
    # Theirs: q.r / sqrt(D_k) with N(0, 1) tables; ours: q.r with N(0, 1/D_k) tables. Same scores.
    torch.manual_seed(2)
    enc = LearnedContentEncoding(key_dim, max_size=40)
    torch.manual_seed(2)
    theirs_row = torch.nn.Embedding(79, key_dim // 2).weight
    torch.testing.assert_close(enc.row_embeddings, theirs_row / math.sqrt(key_dim), rtol=1e-6, atol=0)
    assert enc.col_embeddings.shape == (79, key_dim - key_dim // 2)
    bert = LearnedContentEncoding(key_dim, max_size=40, init="bert")
    assert bert.row_embeddings.std().item() == pytest.approx(0.02, rel=0.1)


def test_unknown_init_is_rejected():
    with pytest.raises(AttnconvError, match="authors, bert"):
        LearnedRelativeEncoding(2, 4, 5, init="normal")
    with pytest.raises(AttnconvError, match="authors, bert"):
        LearnedContentEncoding(4, 5, init="xavier")


@pytest.mark.parametrize(
    "enc",
    [QuadraticEncoding(3, "isotropic"), QuadraticEncoding(3, "full"), LearnedRelativeEncoding(3, 6, 5)],
    ids=["isotropic", "full", "learned"],
)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_encodings_score_in_float32(enc, dtype):
    ref = enc.logits(4, 5)
    low = copy.deepcopy(enc).to(dtype)
    logits = low.logits(4, 5)
    assert logits.dtype == torch.float32
    # the parameters were rounded to the dtype, the scores were not
    exact = copy.deepcopy(low).float().logits(4, 5)
    assert torch.equal(logits, exact)
    assert ((logits - ref).norm() / ref.norm()).item() < 4 * torch.finfo(dtype).eps
