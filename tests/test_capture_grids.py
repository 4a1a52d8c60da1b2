"""Where captured tokens lie on an image: each computation's own grid, the guess from a token count and the images'
shape, and what `grid=` and `leading=` settle."""

import warnings

import pytest
import torch
import torch.nn as nn

from attnconv import AttnconvError, attention_sites, capture_attention
from attnconv.analysis import analyze_sites
from attnconv.errors import AttnconvWarning
from attnconv.models.sites import site_maps, site_probs, site_scores


class TwoBranches(nn.Module):
    """Two patch embeddings of one image, each with its own attention: patch `pa` then patch `pb`."""

    def __init__(self, pa: int, pb: int, dim: int = 8):
        super().__init__()
        self.ea, self.eb = nn.Conv2d(1, dim, pa, pa), nn.Conv2d(1, dim, pb, pb)
        self.aa, self.ab = nn.MultiheadAttention(dim, 2, batch_first=True), nn.MultiheadAttention(dim, 4, batch_first=True)

    def forward(self, x):
        a, b = (e(x).flatten(2).transpose(1, 2) for e in (self.ea, self.eb))
        return self.aa(a, a, a)[0].mean(1) + self.ab(b, b, b)[0].mean(1)


@pytest.mark.parametrize("pa,pb", [(4, 3), (3, 4), (8, 4), (8, 3)])
def test_each_site_is_read_on_its_own_grid_not_the_first_ones(pa, pb):
    """site_probs, site_maps and site_scores read every captured layer on its own grid: a 5x5 layer after a 4x4
    one is not 4x4 with 9 'leading tokens' dropped."""
    torch.manual_seed(pa * 10 + pb)
    model, x = TwoBranches(pa, pb), torch.randn(3, 1, 16, 16)
    sites = attention_sites(model, (1, 16, 16))
    grids = [(16 // pa, 16 // pa), (16 // pb, 16 // pb)]
    assert [tuple(s.size) for s in sites] == grids
    records = capture_attention(model, x)
    probs = site_probs(model, sites, x)
    for r, p, (h, w) in zip(records, probs, grids):
        assert p.shape == (r.heads, h * w, h * w)
        assert torch.allclose(p, r.image_probs().float(), atol=1e-6)
    one = capture_attention(model, x[:1], scores=True)
    for r, m, s, (h, w) in zip(one, site_maps(model, sites, x[:1]), site_scores(model, sites, x[:1]), grids):
        assert m.shape[-1] == h * w and torch.allclose(m, r.image_probs().float(), atol=1e-6)
        assert s["combined"].shape[-2:] == (h * w, h * w)
    assert [layer["path"] for layer in analyze_sites(sites, probs)["layers"]] == ["aa", "ab"]


class PatchTokens(nn.Module):
    """A patch embedding (patch p, optionally resizing the images first), `lead` learned tokens before the patches
    and `trail` after them, one nn.MultiheadAttention over all."""

    def __init__(self, patch: int, lead: int = 0, trail: int = 0, resize: tuple[int, int] | None = None, dim: int = 8):
        super().__init__()
        self.embed, self.lead, self.resize = nn.Conv2d(1, dim, patch, patch), lead, resize
        self.tokens = nn.Parameter(torch.randn(1, lead + trail, dim))
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x):
        if self.resize is not None:
            x = nn.functional.interpolate(x, size=self.resize)
        t = self.embed(x).flatten(2).transpose(1, 2)
        extra = self.tokens.expand(len(t), -1, -1)
        t = torch.cat([extra[:, :self.lead], t, extra[:, self.lead:]], 1)
        return self.attn(t, t, t)[0]


@pytest.mark.parametrize("shape,patch,lead,resize,grid", [
    ((16, 32), 4, 5, None, (4, 8)),     # a class token and 4 registers: not a 6x6 square after one token
    ((32, 16), 4, 5, None, (8, 4)),
    ((12, 20), 4, 1, None, (3, 5)),     # 16 tokens: not a 4x4 square with the class token on it
    ((16, 32), 4, 4, None, (4, 8)),
    ((16, 48), 4, 4, None, (4, 12)),
    ((16, 32), 4, 16, None, (4, 8)),
    ((30, 20), 4, 0, None, (7, 5)),     # a patch size that leaves pixels over: not 6x4 after 11 leading tokens
    ((30, 20), 4, 1, None, (7, 5)),
    ((16, 32), 4, 0, (32, 32), (8, 8)),  # resized inside: not 5x10 after 14
    ((16, 32), 4, 1, (32, 32), (8, 8)),
    ((28, 28), 4, 1, None, (7, 7)),
    ((28, 28), 7, 1, None, (4, 4)),
    ((224, 320), 16, 1, None, (14, 20)),
])
def test_the_guess_reads_the_images_patch_grid_before_a_square(shape, patch, lead, resize, grid):
    """A token count is read with the images' shape: their patch grid after a class token and registers comes
    before a square with fewer leading tokens (16x32 images, 37 tokens: 4x8 after 5, not 6x6 after 1), and a
    square the model resized to before a patch grid with many (64 tokens of 16x32: 8x8, not 5x10 after 14)."""
    torch.manual_seed(sum(shape) + lead)
    model = PatchTokens(patch, lead, resize=resize)
    x = torch.randn(2, 1, *shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AttnconvWarning)  # a close reading is said: tested below
        (r,) = capture_attention(model, x)
        (site,) = attention_sites(model, (1, *shape))
    assert (r.size, r.left_out) == (grid, (lead, lead, 0)) and tuple(site.size) == grid
    torch.testing.assert_close(r.probs.sum(-1) + (r.extra_mass if lead else 0), torch.ones(2, grid[0] * grid[1]),
                               check_dtype=False)


@pytest.mark.parametrize("count,images,said", [
    (37, (16, 32), "37 tokens of 16x32 images are read as 4x8 after 5 leading tokens, a guess: 6x6 after 1 leading "
                   "token fits about as well; if the image positions lie there, pass grid=(6, 6)"),
    (36, (30, 20), "read as 7x5 after 1 leading token, a guess: 6x6 fits about as well"),
    (16, (16, 32), "read as 4x4, a guess: 2x4 after 8 leading tokens fits about as well"),  # windows of 16 tokens
    (50, (28, 28), None), (197, (224, 224), None), (32, (16, 32), None), (64, (16, 32), None), (17, (28, 28), None),
])
def test_a_guess_that_another_reading_fits_about_as_well_is_said_once_and_grid_silences_it(count, images, said):
    class Sequence(nn.Module):  # `count` tokens of any images, through one SDPA call
        def __init__(self):
            super().__init__()
            self.tokens = nn.Parameter(torch.randn(1, 2, count, 4))

        def forward(self, x):
            t = self.tokens.expand(len(x), -1, -1, -1) + x.mean()
            return nn.functional.scaled_dot_product_attention(t, t, t) + nn.functional.scaled_dot_product_attention(t, t, t)

    model, x = Sequence(), torch.randn(1, 1, *images)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        records = capture_attention(model, x)
    words = [str(w.message) for w in seen if issubclass(w.category, AttnconvWarning)]
    assert len(records) == 2
    if said is None:
        assert words == []
    else:
        assert len(words) == 1 and said in words[0], words  # once for the pass, not once a call
        other = tuple(int(v) for v in words[0].rsplit("grid=(", 1)[1].rstrip(")").split(", "))
        with warnings.catch_warnings():
            warnings.simplefilter("error", AttnconvWarning)
            (r, _) = capture_attention(model, x, grid=other)
        assert r.size == other


@pytest.mark.parametrize("lead,trail", [(0, 2), (1, 3), (2, 0), (0, 1)])
def test_tokens_after_the_image_positions_are_placed_by_leading(lead, trail):
    """Tokens a model appends after the patches were read as leading tokens (the first patches dropped, every map
    shifted), and grid= could not say otherwise. grid= with leading= places them: the image positions' attention
    is torch's own, between the right tokens, and the sites and site_probs keep that layout."""
    torch.manual_seed(lead * 7 + trail)
    model, x = PatchTokens(4, lead, trail).eval(), torch.randn(3, 1, 16, 16)
    (r,) = capture_attention(model, x, grid=(4, 4), leading=lead)
    assert r.size == (4, 4) and r.left_out == (lead, lead, trail)
    t = torch.cat([model.tokens.expand(3, -1, -1)[:, :lead], model.embed(x).flatten(2).transpose(1, 2),
                   model.tokens.expand(3, -1, -1)[:, lead:]], 1)
    with torch.no_grad():
        full = model.attn(t, t, t, need_weights=True, average_attn_weights=False)[1].double().mean(0)
    image = slice(lead, lead + 16)
    torch.testing.assert_close(r.probs.double(), full[:, image, image], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(r.extra_mass.double() if r.extra_mass is not None else torch.zeros(2, 16),
                               1 - full[:, image, image].sum(-1), rtol=1e-5, atol=1e-6)
    if trail:
        assert f"{trail} trailing token" in repr(r)
    (site,) = attention_sites(model, (1, 16, 16), grid=(4, 4), leading=lead)
    (p,) = site_probs(model, [site], x)
    torch.testing.assert_close(p.double(), r.image_probs().double(), rtol=1e-5, atol=1e-6)


def test_leading_is_checked():
    model, x = PatchTokens(4, 1, 1), torch.randn(1, 1, 16, 16)
    for bad, words in ((-1, "leading -1 is invalid"), (17, "from 0 to 16"), (1.5, "leading 1.5 is invalid"),
                       (True, "leading True is invalid")):
        with pytest.raises(AttnconvError, match=words):
            capture_attention(model, x, grid=(4, 4), leading=bad)
    with pytest.raises(AttnconvError, match=r"give grid=\(H, W\) with it"):
        capture_attention(model, x, leading=1)
    with pytest.raises(AttnconvError, match=r"give grid=\(H, W\) with it"):
        attention_sites(model, (1, 16, 16), leading=1)
    import numpy as np

    (r,) = capture_attention(model, x, grid=(4, 4), leading=np.int64(1))
    assert r.left_out == (1, 1, 1)
