"""Where captured tokens lie on an image: each computation's own grid, the guess from a token count and the images'
shape, and what `grid=` and `leading=` settle."""

import math
import re
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


@pytest.mark.parametrize("pa,pb", [(8, 6), (12, 8), (6, 8), (6, 4)])
def test_each_site_is_read_on_its_own_grid_not_the_first_ones(pa, pb):
    """site_probs, site_maps and site_scores read every captured layer on its own grid: a 4x4 layer after a 3x3
    one is not 3x3 with 7 'leading tokens' dropped."""
    torch.manual_seed(pa * 10 + pb)
    model, x = TwoBranches(pa, pb), torch.randn(3, 1, 24, 24)
    sites = attention_sites(model, (1, 24, 24))
    grids = [(24 // pa, 24 // pa), (24 // pb, 24 // pb)]
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

    def __init__(self, patch: int, lead: int = 0, trail: int = 0, resize: tuple[int, int] | None = None, dim: int = 8,
                 pad: bool = False):
        super().__init__()
        self.embed, self.lead, self.resize, self.pad = nn.Conv2d(1, dim, patch, patch), lead, resize, pad
        self.tokens = nn.Parameter(torch.randn(1, lead + trail, dim))
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x):
        if self.resize is not None:
            x = nn.functional.interpolate(x, size=self.resize)
        if self.pad:  # to whole patches: the rounded-up grid
            p = self.embed.stride[0]
            x = nn.functional.pad(x, (0, -x.shape[-1] % p, 0, -x.shape[-2] % p))
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
    ((128, 256), 16, 9, None, (8, 16)),  # a class token and 8 registers: not 8x17 after one token
    ((28, 28), 7, 9, None, (4, 4)),  # not 5x5
    ((48, 64), 16, 9, None, (3, 4)),  # not 4x5 after one
    ((224, 224), 14, 5, None, (16, 16)),
    ((32, 32), 4, 17, None, (8, 8)),  # a class token and 16 registers: not 9x9
    ((100, 100), 16, 5, None, (6, 6)),  # a patch that leaves pixels over: not 5x5 after 16 (patch 20)
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
    (16, (16, 32), "16 tokens of 16x32 images are read as 2x4 after 8 leading tokens, a guess: 3x5 after 1 leading "
                   "token fits about as well; if the image positions lie there, pass grid=(3, 5), leading=1"),
    (36, (30, 20), "read as 7x5 after 1 leading token, a guess: 6x6 fits about as well"),
    (18, (96, 96), "read as 3x3 after 9 leading tokens, a guess: 4x4 after 2 leading tokens fits about as well; if the "
                   "image positions lie there, pass grid=(4, 4), leading=2"),  # patch 32 or patch 24?
    # sure: the images' patch grid after at most a class token
    (50, (28, 28), None), (197, (224, 224), None), (32, (16, 32), None), (17, (28, 28), None),
    # the best reading, with no rival, but not sure: said, with the grid= and leading= that confirm it
    (37, (16, 32), "37 tokens of 16x32 images are read as 4x8 after 5 leading tokens, a guess: not the images' patch "
                   "grid after at most a class token; pass grid=(4, 8), leading=5 to confirm it"),
    (64, (16, 32), "read as 8x8, a guess: not the images' patch grid after at most a class token; pass grid=(8, 8) "),
    (213, (224, 224), "read as 14x14 after 17 leading tokens"), (261, (224, 224), "read as 16x16 after 5 leading"),
    (137, (128, 256), "read as 8x16 after 9 leading tokens"), (35, (30, 20), "read as 7x5, a guess: not the images'"),
    (25, (16, 16), "read as 4x4 after 9 leading tokens, a guess: not the images' patch grid"),
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
        h, w, lead = re.search(r"pass grid=\((\d+), (\d+)\)(?:, leading=(\d+))?", words[0]).groups()
        with warnings.catch_warnings():
            warnings.simplefilter("error", AttnconvWarning)
            (r, _) = capture_attention(model, x, grid=(int(h), int(w)), leading=None if lead is None else int(lead))
        assert r.size == (int(h), int(w)) and r.left_out[0] == int(lead or count - int(h) * int(w))


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
    for bad, words in ((-1, "leading -1 is invalid"), (1.5, "leading 1.5 is invalid"),
                       (True, "leading True is invalid: give how many tokens come before the image positions")):
        with pytest.raises(AttnconvError, match=words):
            capture_attention(model, x, grid=(4, 4), leading=bad)
    with pytest.raises(AttnconvError, match=r"give grid=\(H, W\) with it"):
        capture_attention(model, x, leading=1)
    with pytest.raises(AttnconvError, match=r"give grid=\(H, W\) with it"):
        attention_sites(model, (1, 16, 16), leading=1)
    import numpy as np

    (r,) = capture_attention(model, x, grid=(4, 4), leading=np.int64(1))
    assert r.left_out == (1, 1, 1)


class Windows(nn.Module):
    """Patch 2, then `ws` x `ws` windows folded into the batch, each through nn.MultiheadAttention."""

    def __init__(self, ws: int, dim: int = 8):
        super().__init__()
        self.embed, self.ws = nn.Conv2d(1, dim, 2, 2), ws
        self.attn = nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x):
        t = self.embed(x)  # (B, C, H, W)
        B, C, H, W = t.shape
        ws = self.ws
        w = t.reshape(B, C, H // ws, ws, W // ws, ws).permute(0, 2, 4, 3, 5, 1).reshape(-1, ws * ws, C)
        return self.attn(w, w, w)[0]


@pytest.mark.parametrize("shape,ws", [((28, 28), 7), ((112, 84), 7), ((16, 32), 4), ((32, 24), 4), ((64, 48), 8)])
def test_windows_folded_into_the_batch_are_read_without_the_images_shape(shape, ws):
    """7x7 windows of 4:3 images were read as a class token and the images' 8x6 patch grid (49 = 1 + 48), 4x4
    windows of 16x32 images as 2x4 after 8 leading tokens: a call whose batch holds more entries than there are
    images has folded something (windows) into it, so its tokens are not on the images' grid."""
    model, x = Windows(ws).eval(), torch.randn(2, 1, *shape)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnconvWarning)
        (r,) = capture_attention(model, x)
        (site,) = attention_sites(model, (1, *shape))
    assert (r.size, r.left_out, tuple(site.size)) == ((ws, ws), (0, 0, 0), (ws, ws))
    assert r.images == 2 * (shape[0] // 2 // ws) * (shape[1] // 2 // ws)


class TwoStages(nn.Module):
    """Patch 2, attention whose keys are pooled 4x (queries and keys on two grids), then the tokens pooled 2x and
    attention again: three grids of one image, as a pyramid transformer has."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.embed = nn.Conv2d(1, dim, 2, 2)
        self.attn1, self.attn2 = nn.MultiheadAttention(dim, 2, batch_first=True), nn.MultiheadAttention(dim, 2, batch_first=True)

    def forward(self, x):
        t = self.embed(x)
        q = t.flatten(2).transpose(1, 2)
        k = nn.functional.avg_pool2d(t, 4).flatten(2).transpose(1, 2)
        t = t + self.attn1(q, k, k)[0].transpose(1, 2).reshape(t.shape)
        s = nn.functional.avg_pool2d(t, 2).flatten(2).transpose(1, 2)
        return self.attn2(s, s, s)[0]


def test_a_grid_given_for_one_computation_leaves_the_others_read_with_the_images_shape():
    """grid=(16, 8) for the first stage's queries read the keys on 4x2 as 4 leading tokens and 2x2, and the second
    stage's 8x4 as 7 leading tokens and 5x5: a sequence the grid does not fit was guessed from squares alone."""
    model, x = TwoStages().eval(), torch.randn(2, 1, 32, 16)
    for grid in (None, (16, 8), (8, 4)):
        r1, r2 = capture_attention(model, x, grid=grid)
        assert (r1.query_size, r1.size, r1.left_out) == ((16, 8), (4, 2), (0, 0, 0)), grid
        assert (r2.size, r2.left_out) == ((8, 4), (0, 0, 0)), grid


def test_a_grid_given_places_any_number_of_tokens_besides():
    """A class token and 16 registers (17 besides the grid) were past the limit: grid= and leading= were ignored in
    silence and the tokens read as a 9x9 grid, or as on no grid (whose error then asked for grid=)."""
    for shape, patch, grid in (((32, 32), 4, (8, 8)), ((224, 224), 16, (14, 14))):
        model, x = PatchTokens(patch, 17).eval(), torch.randn(1, 1, *shape)
        for kwargs in ({}, {"grid": grid}, {"grid": grid, "leading": 17}):
            (r,) = capture_attention(model, x, **kwargs)
            assert (r.size, r.left_out) == (grid, (17, 17, 0)), (shape, kwargs)
        model = PatchTokens(patch, 40).eval()  # more than a grid alone places: leading= says how many
        (r,) = capture_attention(model, x, grid=grid, leading=40)
        assert (r.size, r.left_out) == (grid, (40, 40, 0))
        assert [tuple(s.size) for s in attention_sites(model, (1, *shape), grid=grid, leading=40)] == [grid]


def test_sites_asked_of_images_of_another_size_are_refused_not_read_on_another_grid():
    """Sites found for 32x32 images gave 11x11 maps of 64x32 images (the site's 8x8 layout did not fit, and the
    tokens were guessed again): one error naming both grids and the fix."""
    model = PatchTokens(4, 1).eval()
    (site,) = attention_sites(model, (1, 32, 32))
    for shape in ((64, 32), (32, 16), (16, 32), (36, 32)):  # fewer, as many and more tokens than the site's 8x8
        with pytest.raises(AttnconvError, match=f"attn: the sites were found for 32x32 images, these are "
                                                f"{shape[0]}x{shape[1]}; find them again with these images' shape"):
            site_probs(model, [site], torch.randn(2, 1, *shape))
    assert site_probs(model, [site], torch.randn(2, 1, 32, 32))[0].shape == (2, 64, 64)


@pytest.mark.parametrize("shape,grid", [((4, 30), (1, 8)), ((62, 8), (16, 2)), ((30, 30), (8, 8))])
def test_a_padded_grid_is_read_or_said(shape, grid):
    """Patches padded to whole ones (the rounded-up grid) whose extra row holds 1 or 2 tokens were read as the
    grid without it after 1 or 2 leading tokens, in silence: read right, or said with the grid= that places them."""
    model, x = PatchTokens(4, pad=True).eval(), torch.randn(1, 1, *shape)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (r,) = capture_attention(model, x)
    said = [str(w.message) for w in seen if issubclass(w.category, AttnconvWarning)]
    assert r.size == grid or any(f"pass grid=({grid[0]}, {grid[1]})" in w for w in said), (r, said)


class Batched(nn.Module):
    """PatchTokens whose attention runs on a batch made otherwise: repeated (test-time augmentation), crops of the
    batch, or chunks of it."""

    def __init__(self, how: str):
        super().__init__()
        self.inner, self.how = PatchTokens(16, 1), how

    def forward(self, x):
        if self.how == "tta":
            return self.inner(torch.cat([x, x.flip(-1)]))
        if self.how == "repeat":
            return self.inner(x.repeat(3, 1, 1, 1))
        return torch.cat([self.inner(part) for part in x.split(1)])  # chunks of one image


@pytest.mark.parametrize("how", ["tta", "repeat", "chunks"])
def test_a_batch_repeated_or_cut_is_not_taken_for_windows(how):
    """Test-time augmentation, repeated crops and chunks changed the batch's size, and the images' shape was dropped
    (224x320 read as 16x16 after 25 tokens, silently): only a batch whose sequences tile a patch grid of the images
    is windows folded into it."""
    model, x = Batched(how).eval(), torch.randn(2, 1, 224, 320)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnconvWarning)
        records = capture_attention(model, x)
    assert {(r.size, r.left_out) for r in records} == {((14, 20), (1, 1, 0))}


def test_a_grid_that_fits_no_computation_is_said():
    """A class token and 50 prompt tokens with grid=(14, 14): the grid was dropped in silence, the tokens read as
    15x15 after 22."""
    model, x = PatchTokens(16, 51).eval(), torch.randn(1, 1, 224, 224)
    with pytest.warns(AttnconvWarning, match=r"grid=\(14, 14\) fits none of the model's attention computations \(of "
                                             r"247 tokens\): a grid alone places at most 32 tokens besides it; give leading="):
        capture_attention(model, x, grid=(14, 14))
    (r,) = capture_attention(model, x, grid=(14, 14), leading=51)
    assert (r.size, r.left_out) == ((14, 14), (51, 51, 0))


def test_a_layout_the_model_declares_needs_no_guess():
    """attnconv's ViT (token_layout) and timm's convention (num_prefix_tokens, patch_embed.patch_size) say where
    their tokens lie: read there, with no warning (attnconv's own ViT at 24x24, patch 6, warned on every command)."""
    from attnconv.models import build_model

    vit = build_model("vit", in_channels=1, num_classes=2, image_size=24, patch=6, hidden=8, layers=1, heads=2).eval()

    class TimmLike(nn.Module):  # a class token and 8 registers, patch 16, on 100x100 images (a floor grid)
        num_prefix_tokens = 9

        def __init__(self):
            super().__init__()
            self.patch_embed, self.inner = nn.Module(), PatchTokens(16, 9)
            self.patch_embed.patch_size = (16, 16)

        def forward(self, x):
            return self.inner(x)

    for model, shape, want in ((vit, (24, 24), ((4, 4), (1, 1, 0))), (TimmLike().eval(), (100, 100), ((6, 6), (9, 9, 0)))):
        with warnings.catch_warnings():
            warnings.simplefilter("error", AttnconvWarning)
            records = capture_attention(model, torch.randn(2, 1, *shape))
            sites = attention_sites(model, (1, *shape))
        assert {(r.size, r.left_out) for r in records} == {want}
        assert {tuple(s.size) for s in sites} == {want[0]}


def test_a_vit_of_one_patch_is_not_called_a_convolutional_network():
    """A ViT whose one patch leaves no grid was "no attention layers (a convolutional network)" in its report."""
    from attnconv.models import build_model
    from attnconv.models.sites import NoAttentionLayers

    vit = build_model("vit", in_channels=1, num_classes=2, image_size=8, patch=8, hidden=8, layers=1, heads=2)
    with pytest.raises(NoAttentionLayers) as err:
        attention_sites(vit, (1, 8, 8))
    assert err.value.computations and "not self-attention over one image grid" in str(err.value)
    with pytest.raises(NoAttentionLayers) as err:
        attention_sites(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()), (1, 8, 8))
    assert not err.value.computations


class Declares(nn.Module):
    """PatchTokens(16) with `lead` learned tokens first and a `token_layout` that says `layout` (or raises it)."""

    def __init__(self, lead: int, layout):
        super().__init__()
        self.inner, self.layout = PatchTokens(8, lead), layout

    def token_layout(self, size):
        if isinstance(self.layout, Exception):
            raise self.layout
        return self.layout

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize("layout", [(1, (8, 8)), (10, (8, 8)), RuntimeError("no"), AttributeError("config"),
                                    KeyError("k"), (1, (-8, -8)), (-1, (8, 8)), (True, (8, 8)), "8x8"])
def test_a_declared_layout_counts_only_where_it_fits_exactly_and_a_broken_one_declares_nothing(layout):
    """A declaration that covers part of the tokens (prompts after the class token under num_prefix_tokens=1) laid
    its grid on the sequence with the rest as 'trailing'; one that raised gave a traceback, and (-8, -8) a -8x-8
    record. Either now leaves the tokens to the guess, which reads 11 leading tokens and 8x8 right."""
    model, x = Declares(11, layout).eval(), torch.randn(1, 1, 64, 64)
    (r,) = capture_attention(model, x)
    assert (r.size, r.left_out) == ((8, 8), (11, 11, 0))


def test_windows_are_told_from_a_repeated_batch_and_padded_windows_are_windows():
    """A batch repeated 4 times (14x20 tokens of 224x320 images) was taken for windows (24 leading tokens and
    16x16); windows padded to whole windows (9x13 tokens to 12x16, 4x4 windows) were not, and warned. A warning
    points at the caller's line, not inside attnconv."""
    (r,) = capture_attention(_Repeat4().eval(), torch.randn(1, 1, 224, 320))
    assert (r.size, r.left_out) == ((14, 20), (0, 0, 0))

    class PaddedWindows(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.attn = nn.Conv2d(1, 8, 4, 4), nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, x):
            t = nn.functional.pad(self.embed(x), (0, 3, 0, 3))  # 9x13 -> 12x16
            B, C, H, W = t.shape
            w = t.reshape(B, C, H // 4, 4, W // 4, 4).permute(0, 2, 4, 3, 5, 1).reshape(-1, 16, C)
            return self.attn(w, w, w)[0]

    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnconvWarning)
        (r,) = capture_attention(PaddedWindows().eval(), torch.randn(1, 1, 36, 52))
    assert r.size == (4, 4) and r.images == 12
    with pytest.warns(AttnconvWarning) as seen:
        capture_attention(PatchTokens(8, 2).eval(), torch.randn(1, 1, 32, 64), grid=(10, 10))
    assert all(w.filename == __file__ for w in seen), [w.filename for w in seen]


class _Repeat4(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = PatchTokens(16)

    def forward(self, x):
        return self.inner(x.repeat(4, 1, 1, 1))


def test_round_34_a_repeat_is_no_windows_a_wrapped_declaration_counts_and_captured_sites_know_their_images():
    """A batch repeated 2x of 9x16 tokens (144, a square count) was read as 12x12 windows; a layout declared on a
    wrapped model (a backbone, DataParallel) was not found; sites from captured_sites read images of any size; an
    unbatched image was called other images."""
    from attnconv import captured_sites

    class Repeat(nn.Module):
        def __init__(self, times):
            super().__init__()
            self.inner, self.times = PatchTokens(16), times

        def forward(self, x):
            return self.inner(x.repeat(self.times, 1, 1, 1))

    for times in (2, 4):
        (r,) = capture_attention(Repeat(times).eval(), torch.randn(1, 1, 144, 256))
        assert (r.size, r.left_out) == ((9, 16), (0, 0, 0)), times

    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.backbone = Declares(5, (5, (7, 4)))

        def forward(self, x):
            return self.backbone(x)

    wrapped = Wrapper().eval()
    wrapped.backbone.inner = PatchTokens(8, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", AttnconvWarning)
        (r,) = capture_attention(wrapped, torch.randn(1, 1, 56, 32))
    assert (r.size, r.left_out) == ((7, 4), (5, 5, 0))
    model, x = PatchTokens(4, 1).eval(), torch.randn(2, 1, 32, 64)
    sites, _ = captured_sites(capture_attention(model, x))
    for shape in ((64, 32), (48, 48)):
        with pytest.raises(AttnconvError, match=f"the sites were found for 32x64 images, these are {shape[0]}x{shape[1]}"):
            site_probs(model, sites, torch.randn(2, 1, *shape))
    with pytest.raises(AttnconvError, match=r"images of shape \(1, 32, 64\): give a batch \(N, C, H, W\)"):
        site_probs(model, sites, torch.randn(1, 32, 64))


def test_round_35_a_repeat_as_many_as_windows_is_said_unbatched_images_are_refused_and_a_raising_property_declares_nothing():
    """A batch repeated 6x of 9x16 tokens was read as six 12x12 windows (6 = 2x3 windows of 12 on a patch-7 grid),
    silently; an unbatched (C, H, W) image was read without its shape (60 tokens as 7x7 after 11); a `token_layout`
    property raising RuntimeError escaped the pass; 57 registers before 8x8 tokens were read as an 11x11 grid the
    images' patches do not give, silently."""

    class Repeat(nn.Module):
        def __init__(self, times, patch=16, lead=0):
            super().__init__()
            self.inner, self.times = PatchTokens(patch, lead), times

        def forward(self, x):
            return self.inner(x.repeat(self.times, 1, 1, 1))

    for times, shape, grid in ((6, (144, 256), (9, 16)), (8, (64, 144), (4, 9)), (10, (96, 384), (6, 24))):
        model, x = Repeat(times).eval(), torch.randn(1, 1, *shape)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            capture_attention(model, x)
        words = [str(w.message) for w in seen if issubclass(w.category, AttnconvWarning)]
        assert len(words) == 1 and f"is the images' own patch grid (a batch repeated inside the model); if the " \
            f"image positions lie there, pass grid=({grid[0]}, {grid[1]})" in words[0], words
        with warnings.catch_warnings():
            warnings.simplefilter("error", AttnconvWarning)
            (r,) = capture_attention(model, x, grid=grid)
        assert (r.size, r.left_out) == (grid, (0, 0, 0))
    for shape in ((1, 96, 160), (2, 3, 1, 96, 160), (60, 8)):  # one image; frames; tokens: the image's shape unknown
        with pytest.raises(AttnconvError, match=re.escape(f"images of shape {shape} are no batch of images (N, C, H, W), "
                                                          "whose shape places the tokens: give images as a batch")):
            capture_attention(PatchTokens(16).eval(), torch.randn(*shape))

    class Tokens(nn.Module):  # a user's own attention block, given token sequences (N, T, D) with their grid
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, t):
            return self.attn(t, t, t)[0]

    (r,) = capture_attention(Tokens().eval(), torch.randn(2, 61, 8), grid=(6, 10))
    assert (r.size, r.left_out) == ((6, 10), (1, 1, 0))

    class Raises(Declares):
        @property
        def token_layout(self):
            raise RuntimeError("its own bug")

    (r,) = capture_attention(Raises(1, None).eval(), torch.randn(2, 1, 24, 40))
    assert (r.size, r.left_out) == ((3, 5), (1, 1, 0))  # guessed, as where nothing is declared
    model, x = PatchTokens(8, 57).eval(), torch.randn(2, 1, 64, 64)
    with pytest.warns(AttnconvWarning, match=r"121 tokens of 64x64 images are read as 11x11, a guess: 8x8 after 57 "
                                             r"leading tokens is the images' patch grid .*pass grid=\(8, 8\), "
                                             r"leading=57"):
        capture_attention(model, x)
    (r,) = capture_attention(model, x, grid=(8, 8), leading=57)
    assert (r.size, r.left_out) == ((8, 8), (57, 57, 0))


def test_round_36_windows_in_a_row_or_repeated_a_repeated_class_token_model_appended_tokens_and_nan():
    """Windows in one row (wide images) or a batch repeated around a windowed model were read with the images' shape,
    silently; a class-token model repeated 6x (1 + 7x9 = 64 tokens) was read as 8x8 windows, silently; with more than
    32 leading tokens the warning named one patch grid where two fit; 40 appended tokens could not be placed (grid=
    with leading=0 was dropped); NaN images gave zero attention averaged in. And a guess that is not the images'
    patch grid after at most a class token is said, with the grid= and leading= that confirm it."""

    class Around(nn.Module):  # a batch repeated (flipped) around a windowed model
        def __init__(self, inner, times):
            super().__init__()
            self.inner, self.times = inner, times

        def forward(self, x):
            return self.inner(torch.cat([x.flip(-1) if i % 2 else x for i in range(self.times)]))

    with warnings.catch_warnings():  # 2 copies of 2x2 windows of 4x4, or 8 copies of the patch-4 grid: both 4x4
        warnings.simplefilter("error", AttnconvWarning)
        (r,) = capture_attention(Around(Windows(4), 2).eval(), torch.randn(2, 1, 16, 16))
    assert (r.size, r.left_out) == ((4, 4), (0, 0, 0))
    for model, shape in ((Windows(4), (8, 64)), (Around(Windows(4), 2), (16, 24)), (Around(Windows(4), 3), (24, 16))):
        with pytest.warns(AttnconvWarning, match=r"16 tokens of images \(windows folded into the batch\) are read as "
                                                 r"4x4, a guess: windows in one row or column, or several sets"):
            (r,) = capture_attention(model.eval(), torch.randn(2, 1, *shape))
        assert (r.size, r.left_out) == ((4, 4), (0, 0, 0))
        with warnings.catch_warnings():
            warnings.simplefilter("error", AttnconvWarning)
            (r,) = capture_attention(model.eval(), torch.randn(2, 1, *shape), grid=(4, 4))  # confirmed

    class Repeated(nn.Module):  # a class token and 7x9 patches, the batch repeated 6x inside
        def __init__(self):
            super().__init__()
            self.inner = PatchTokens(4, 1)

        def forward(self, x):
            return self.inner(x.repeat(6, 1, 1, 1))

    with pytest.warns(AttnconvWarning, match=r"read as 8x8, a guess: 7x9 after 1 leading token is the images' own "
                                             r"patch grid \(a batch repeated inside the model\); .*pass grid=\(7, 9\), "
                                             r"leading=1"):
        capture_attention(Repeated().eval(), torch.randn(1, 1, 28, 36))
    (r,) = capture_attention(Repeated().eval(), torch.randn(1, 1, 28, 36), grid=(7, 9), leading=1)
    assert (r.size, r.left_out) == ((7, 9), (1, 1, 0))

    with pytest.warns(AttnconvWarning, match=r"a guess: 8x8 after 33 leading tokens or 7x7 after 48 leading tokens are "
                                             r"patch grids of the images \(more tokens before them than the guess "
                                             r"places\); .*pass grid=\(8, 8\), leading=33 or grid=\(7, 7\), leading=48"):
        capture_attention(PatchTokens(8, 48).eval(), torch.randn(2, 1, 56, 56))

    appended = PatchTokens(4, 0, trail=40).eval()
    with pytest.warns(AttnconvWarning, match=r"fits none of the model's attention computations .*: give the grid, "
                                             r"leading= and trailing= the image positions have"):
        capture_attention(appended, torch.randn(1, 1, 28, 36), grid=(7, 9), leading=0)
    (r,) = capture_attention(appended, torch.randn(1, 1, 28, 36), grid=(7, 9), leading=0, trailing=40)
    assert (r.size, r.left_out) == ((7, 9), (0, 0, 40))
    (site,) = attention_sites(appended, (1, 28, 36), grid=(7, 9), trailing=40)
    assert tuple(site.size) == (7, 9)
    with pytest.raises(AttnconvError, match="trailing -1 is invalid: give how many tokens come after the image"):
        capture_attention(appended, torch.randn(1, 1, 28, 36), grid=(7, 9), trailing=-1)

    x = torch.randn(2, 1, 28, 36)
    x[1, 0, 0, 0] = float("nan")
    with pytest.raises(AttnconvError, match="the images hold 1 NaN or infinite value, which make attention undefined"):
        capture_attention(appended, x)
    broken = PatchTokens(4, 1).eval()
    with torch.no_grad():
        broken.tokens.fill_(float("inf"))
    with pytest.raises(AttnconvError, match=r"attn: its (attention scores|queries and keys) hold NaN .*so its attention "
                                            r"is undefined"):
        capture_attention(broken, torch.randn(2, 1, 28, 36))


def test_round_37_a_grid_given_for_one_computation_keeps_the_others_sure_readings_trailing_sites_and_masks():
    """grid=(2, 2) laid the 4x4 stage of a pyramid on 12 leading tokens and a 2x2 grid, silently (a grid advised for
    one computation overrode others' sure readings); sites found with trailing= over 32 could not be read by
    site_probs; NaN or +inf in a mask, or +inf in the queries, gave rows of zeros averaged in."""
    import torch.nn.functional as F

    class Pyramid(nn.Module):  # 16x16, 8x8, 4x4 and 2x2 tokens of 64x64 images, one SDPA call each
        def forward(self, x):
            for p in (4, 8, 16, 32):
                t = F.avg_pool2d(x, p).flatten(2).transpose(1, 2).repeat(1, 1, 8)
                F.scaled_dot_product_attention(t[:, None], t[:, None], t[:, None])
            return x

    with pytest.warns(AttnconvWarning, match=r"16 tokens fit grid=\(2, 2\) only with 12 tokens besides it, while they "
                                             r"read surely as 4x4: read so; pass grid=\(2, 2\), leading=12 to lay"):
        records = capture_attention(Pyramid(), torch.randn(1, 1, 64, 64), grid=(2, 2))
    assert [(r.size, r.left_out) for r in records] == [((16, 16), (0, 0, 0)), ((8, 8), (0, 0, 0)),
                                                       ((4, 4), (0, 0, 0)), ((2, 2), (0, 0, 0))]
    with warnings.catch_warnings():  # what the warning says places it there
        warnings.simplefilter("error", AttnconvWarning)
        records = capture_attention(Pyramid(), torch.randn(1, 1, 64, 64), grid=(2, 2), leading=12)
    assert records[2].left_out == (12, 12, 0)

    appended = PatchTokens(4, 0, trail=40).eval()
    (site,) = attention_sites(appended, (1, 28, 36), grid=(7, 9), trailing=40)
    x = torch.randn(2, 1, 28, 36)
    (p,) = site_probs(appended, [site], x)
    (r,) = capture_attention(appended, x, grid=(7, 9), trailing=40)
    torch.testing.assert_close(p.double(), r.image_probs().double(), rtol=1e-5, atol=1e-6)

    class Masked(nn.Module):
        def __init__(self, value, where):
            super().__init__()
            self.value, self.where = value, where

        def forward(self, x):
            t = x.flatten(2).transpose(1, 2).repeat(1, 1, 4)[:, None]  # 16 tokens of 4x4 images
            mask = torch.zeros(16, 16)
            if self.where == "mask":
                mask[3, 5] = self.value
            else:
                t = t.clone()
                t[..., 0, 0] = self.value
            return F.scaled_dot_product_attention(t, t, t, attn_mask=mask)

    for value, where in ((float("nan"), "mask"), (float("inf"), "mask"), (float("inf"), "queries")):
        with pytest.raises(AttnconvError, match="its attention scores hold NaN or infinite values .*a mask may hold "
                                                "-inf, not NaN or \\+inf"):
            capture_attention(Masked(value, where), torch.randn(2, 1, 4, 4))
    (r,) = capture_attention(Masked(float("-inf"), "mask"), torch.randn(2, 1, 4, 4))  # -inf masks: as ever
    assert r.probs[:, 3, 5].abs().max() == 0


def test_round_38_a_grid_given_keeps_sure_and_declared_readings_and_scores_past_the_models_precision_are_refused():
    """grid=(7, 7) given for a pooled 7x7 computation read the 50 tokens of 80x160 images (5x10, sure) as a class
    token and 7x7, silently; a grid laid with leading tokens it inferred replaced a layout the model declares; scores
    past what float32 holds (scale 1e200) gave a finite map where the model's own attention was NaN."""
    import torch.nn.functional as F

    def attend(t):
        q = t.reshape(len(t), t.shape[1], 2, 4).transpose(1, 2)
        return F.scaled_dot_product_attention(q, q, q)

    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Conv2d(1, 8, 16, 16)

        def forward(self, x):
            g = self.embed(x)
            attend(g.flatten(2).transpose(1, 2))
            return attend(F.adaptive_avg_pool2d(g, 7).flatten(2).transpose(1, 2))

    with pytest.warns(AttnconvWarning, match=r"50 tokens fit grid=\(7, 7\) only with 1 token besides it, while they read "
                                             r"surely as 5x10: read so; pass grid=\(7, 7\), leading=1 to lay the grid"):
        records = capture_attention(Pooled().eval(), torch.randn(1, 1, 80, 160), grid=(7, 7))
    assert [(r.size, r.left_out) for r in records] == [((5, 10), (0, 0, 0)), ((7, 7), (0, 0, 0))]

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.patch_size, self.proj = (16, 16), nn.Conv2d(1, 8, 16, 16)

    class Declares(nn.Module):  # timm's convention: 5 tokens before the 14x14 patch grid, then a pooled 13x15
        num_prefix_tokens = 5

        def __init__(self):
            super().__init__()
            self.patch_embed = Embed()

        def forward(self, x):
            g = self.patch_embed.proj(x)
            attend(torch.cat([torch.zeros(len(x), 5, 8), g.flatten(2).transpose(1, 2)], 1))
            return attend(F.adaptive_avg_pool2d(g, (13, 15)).flatten(2).transpose(1, 2))

    with pytest.warns(AttnconvWarning, match=r"201 tokens fit grid=\(13, 15\) only with 6 tokens besides it, while they "
                                             r"read as the model declares as 14x14 after 5 leading tokens"):
        records = capture_attention(Declares().eval(), torch.randn(1, 1, 224, 224), grid=(13, 15))
    assert [(r.size, r.left_out) for r in records] == [((14, 14), (5, 5, 0)), ((13, 15), (0, 0, 0))]

    class Scaled(nn.Module):
        def __init__(self, scale, dtype):
            super().__init__()
            self.embed, self.scale = nn.Conv2d(1, 8, 4, 4).to(dtype), scale

        def forward(self, x):
            q = self.embed(x).flatten(2).transpose(1, 2).reshape(len(x), 16, 2, 4).transpose(1, 2)
            return F.scaled_dot_product_attention(q, q, q, scale=self.scale)

    for dtype in (torch.float32, torch.bfloat16):
        model, x = Scaled(1e200, dtype).eval(), torch.randn(2, 1, 16, 16, dtype=dtype)
        assert not torch.isfinite(model(x)).all()  # the model's own attention
        with pytest.raises(AttnconvError, match=r"its attention scores reach .*, past what float32 holds, where the "
                                                r"model computes them"):
            capture_attention(model, x)
    (r,) = capture_attention(Scaled(1e30, torch.float32).eval(), torch.randn(2, 1, 16, 16))  # within float32: as ever
    assert torch.isfinite(r.probs).all()


def test_round_39_a_models_own_attention_that_is_not_a_number_is_refused_and_site_images_are_checked():
    """The model's own attention was NaN where the recomputation in float64 was finite, and a map was given: q k^T
    past float32 before the scale, a float mask that overflows the scores, is_causal with scale 0 (torch's kernel
    masks with -inf, then scales), a float16 nn.MultiheadAttention whose scores pass float16 (need_weights computes
    them in float16), an attnconv layer in float16 whose weights are past it. Now the model's own output (or the
    weights it returns) decides, where only its attention can make it NaN; legitimate models are not refused (fully
    masked rows, causal masks, -inf masks, half precision). NaN images given to the site functions were blamed on the
    model. A grid given with leading= for one computation, laid with trailing tokens it inferred, replaced another's
    sure reading of as many leading tokens."""
    import torch.nn.functional as F

    from attnconv.attention.layer import SelfAttention2d
    from attnconv.models.captured import given_layout

    class Sdpa(nn.Module):
        def __init__(self, gain=1.0, mask=None, **kw):
            super().__init__()
            self.embed, self.gain, self.mask, self.kw = nn.Conv2d(1, 8, 4, 4), gain, mask, kw

        def forward(self, x):
            t = self.embed(x).flatten(2).transpose(1, 2)[:, None].contiguous()  # (B, 1, 16, 8)
            t = 4 * t / t.norm(dim=-1, keepdim=True)  # q.k at most 16 gain^2
            self.out = F.scaled_dot_product_attention(t * self.gain, t * self.gain, t, attn_mask=self.mask, **self.kw)
            return self.out

    x = torch.randn(2, 1, 16, 16)
    overflowing = torch.zeros(16, 16)
    overflowing[:, 0] = 3.3e38
    for model in (Sdpa(1e19, scale=1e-30), Sdpa(3e18, mask=overflowing), Sdpa(is_causal=True, scale=0.0)):
        model.eval()
        with torch.no_grad():
            model(x)
        if model.out.isfinite().all():  # is_causal with scale 0: NaN in the kernel CPUs take for contiguous inputs
            assert model.kw.get("is_causal")
            capture_attention(model, x)
            continue
        with pytest.raises(AttnconvError, match=r"its own attention is not a number in \d+ of 32 query rows, whose "
                                                r"keys are not all masked \(its output holds NaN or inf there"):
            capture_attention(model, x)
    rows = torch.ones(16, 16, dtype=torch.bool)
    rows[3] = False  # a query row attending nowhere: NaN in the model's output, legitimately
    minus = torch.zeros(16, 16).masked_fill(~rows, -math.inf)
    for model in (Sdpa(mask=rows), Sdpa(mask=minus), Sdpa(is_causal=True), Sdpa(scale=0.0)):
        (r,) = capture_attention(model.eval(), x)
        assert torch.isfinite(r.probs).all()
        assert model.mask is None or r.probs[0, 3].sum() == 0  # the row attending nowhere: zeros

    class Multihead(nn.Module):
        def __init__(self, gain, need_weights):
            super().__init__()
            self.embed, self.mha, self.need = nn.Conv2d(1, 16, 8, 8), nn.MultiheadAttention(16, 2, batch_first=True), \
                need_weights
            with torch.no_grad():
                self.mha.in_proj_weight.mul_(gain)

        def forward(self, x, kpm=None):
            t = self.embed(x).flatten(2).transpose(1, 2)
            return self.mha(t, t, t, need_weights=self.need, key_padding_mask=kpm)[0]

    torch.manual_seed(1)
    half = torch.randn(2, 1, 32, 32).half()
    with pytest.raises(AttnconvError, match=r"mha: its own attention is not a number .* \(the attention weights it "
                                            r"returns hold NaN or inf there\), although it is one in float64: its "
                                            r"scores, scale or mask are past what float16"):
        capture_attention(Multihead(300, True).half().eval(), half)
    for need in (True, False):  # within float16: as ever
        (r,) = capture_attention(Multihead(1, need).half().eval(), half)
        assert torch.isfinite(r.probs).all()
    kpm = torch.zeros(2, 16, dtype=torch.bool)
    kpm[1] = True  # the second entry attends nowhere: NaN rows of the model's own, not refused

    class Padded(nn.Module):
        def __init__(self, need):
            super().__init__()
            self.inner = Multihead(1, need)

        def forward(self, x):
            return self.inner(x, kpm)

    for need in (True, False):
        (r,) = capture_attention(Padded(need).eval(), torch.randn(2, 1, 32, 32))
        assert torch.isfinite(r.probs).all()

    layer = SelfAttention2d(8, heads=2, encoding="quadratic", max_size=16)
    with torch.no_grad():
        for p in layer.parameters():
            if p.dim() >= 2:
                p.mul_(1e10)  # finite in float32, past float16
    with pytest.raises(AttnconvError, match=r"its attention probabilities hold NaN or inf \(the layer's weights do, or "
                                            r"its scores are past float16\)"):
        capture_attention(layer.half().eval(), torch.randn(2, 8, 8, 8).half())

    nan = torch.randn(2, 1, 16, 16)
    nan[0, 0, 0, 0] = math.nan
    sites = attention_sites(Sdpa().eval(), (1, 16, 16))
    for name, call in (("site_probs", lambda: site_probs(Sdpa().eval(), sites, nan)),
                       ("site_maps", lambda: site_maps(Sdpa().eval(), sites, nan[:1])),
                       ("site_scores", lambda: site_scores(Sdpa().eval(), sites, nan[:1]))):
        with pytest.raises(AttnconvError, match=rf"^{name}: the images hold 1 NaN or infinite value, which make "
                                                "attention undefined"):
            call()

    reading, said = given_layout(65, (7, 7), 1, None, (64, 64), 2, 2)  # 1 + 8x8, sure; the grid 7x7 + 15 after
    assert reading == (1, (8, 8)) and said.endswith("read surely as 8x8 after 1 leading token: read so; pass "
                                                    "grid=(7, 7), leading=1, trailing=15 to lay the grid there")
    reading, said = given_layout(17, (4, 4), 0, None, (16, 16), 2, 2)  # leading=0: a token appended, as given
    assert reading == (0, (4, 4)) and "with 1 token besides it, a guess" in said


def test_round_40_an_output_made_non_finite_by_its_values_is_not_blamed_on_the_attention_and_odd_calls_are_taken():
    """The output check blamed the attention where the values made the output inf (values near float32's limit that
    a kernel's unnormalized sums overflow, float32 values that autocast casts past float16, a float16 value
    projection past its limit with need_weights=False, a NaN bias_v): it now judges only where the values cannot.
    Queries broadcast against larger keys, and nested (jagged) tensors, crashed the recomputation with a raw
    RuntimeError: the first is captured, the second said and skipped."""
    import torch.nn.functional as F

    def capture(forward):
        class M(nn.Module):
            def forward(self, x):
                return forward()

        return capture_attention(M().eval(), torch.zeros(1, 3, 16, 16))

    torch.manual_seed(0)
    q = torch.randn(1, 1, 16, 8)
    big = torch.full((1, 1, 16, 8), 1e38)  # finite values, summed unnormalized by a fast kernel: inf
    (r,) = capture(lambda: F.scaled_dot_product_attention(q, q, big))
    assert torch.isfinite(r.probs).all()
    q2, v2 = torch.randn(2, 2, 16, 8), torch.randn(2, 2, 16, 8) * 1e5  # past float16 once autocast casts them

    def autocast_sdpa():
        with torch.autocast("cpu", dtype=torch.float16):
            return F.scaled_dot_product_attention(q2, q2, v2)

    (r,) = capture(autocast_sdpa)
    assert torch.isfinite(r.probs).all()

    mha = nn.MultiheadAttention(16, 2, batch_first=True).half().eval()
    with torch.no_grad():
        mha.in_proj_weight[32:] *= 30000  # the value projection past float16, the output projection tiny
        mha.out_proj.weight.mul_(1e-5)
    x = torch.randn(2, 16, 16).half()
    assert not mha(x, x, x, need_weights=False)[0].isfinite().all() and mha(x, x, x)[1].isfinite().all()
    (r,) = capture(lambda: mha(x, x, x, need_weights=False)[0])
    assert torch.isfinite(r.probs).all()
    nan_v = nn.MultiheadAttention(16, 2, batch_first=True, add_bias_kv=True).eval()
    with torch.no_grad():
        nan_v.bias_v.fill_(math.nan)
    x32 = torch.randn(2, 16, 16)
    (r,) = capture(lambda: nan_v(x32, x32, x32, need_weights=False)[0])
    assert torch.isfinite(r.probs).all()

    k = torch.randn(2, 2, 16, 8)  # the queries broadcast over the keys' batch
    (r,) = capture(lambda: F.scaled_dot_product_attention(torch.randn(1, 2, 16, 8), k, k))
    assert r.probs.shape == (2, 16, 16) and r.images == 2
    jagged = torch.nested.nested_tensor([torch.randn(12, 2, 8), torch.randn(16, 2, 8)], layout=torch.jagged)
    jagged = jagged.transpose(1, 2)
    with pytest.warns(AttnconvWarning, match="a scaled_dot_product_attention call on nested tensors is not captured"):
        assert capture(lambda: F.scaled_dot_product_attention(jagged, jagged, jagged)) == []
    from attnconv.models.sites import site_probs as probs_of

    own = _Wrapped(heads=2, encoding="learned-content", max_size=16).eval()
    sites = attention_sites(own, (3, 8, 8))
    with torch.no_grad():
        own.sa.query.weight.fill_(math.nan)
    with pytest.raises(AttnconvError, match=r"sa: its attention probabilities hold NaN or inf"):
        probs_of(own, sites, torch.randn(2, 3, 8, 8))


def test_round_41_calls_torch_takes_are_taken_site_maps_are_the_attention_and_queries_shared_by_every_image_are_none():
    """Unbatched (L, E) queries and grouped-query attention on 3-d tensors, which torch takes, were refused or ended in
    a raw RuntimeError; scores past float32 only below (-inf there: a key left out) were refused as "not a number".
    `site_maps` gave NaN maps for an attnconv layer with NaN weights, a NaN row for a fully masked one, and for windows
    the softmax of averaged scores, not the attention (0.11 from `site_probs`). Learned queries shared by every image
    (batch 1, broadcast over the images' keys) were read as image positions; queries and keys on grids of their own
    were blamed on a class token left out."""
    import torch.nn.functional as F


    def model(forward):
        class M(nn.Module):
            def __init__(self):
                super().__init__()
                self.pe = nn.Conv2d(3, 16, 8, 8)

            def forward(self, x):
                return forward(self, x)

        return M().eval()

    torch.manual_seed(0)
    img = torch.randn(2, 3, 32, 32)
    q, k = torch.randn(16, 8), torch.randn(16, 8)
    (r,) = capture_attention(model(lambda m, x: F.scaled_dot_product_attention(q, k, k)), img)
    assert r.probs.shape == (1, 16, 16)
    q4, k2 = torch.randn(4, 16, 8), torch.randn(2, 16, 8)
    (r,) = capture_attention(model(lambda m, x: F.scaled_dot_product_attention(q4, k2, k2, enable_gqa=True)), img)
    expected = torch.softmax(q4.double() @ k2.double().repeat_interleave(2, 0).transpose(-1, -2) / 8 ** 0.5, -1)
    assert torch.allclose(r.probs.double(), expected.mean(0, keepdim=True), atol=1e-6)  # 3-d: the first dim a batch

    def below(m, x):
        qq = torch.full((2, 2, 16, 1), 1e20)
        kk = torch.full((2, 2, 16, 1), -1e19)
        kk[..., 0, :] = 1e-3  # every key but the first past float32 below: left out; the model attends to key 0
        return F.scaled_dot_product_attention(qq, kk, torch.randn(2, 2, 16, 4))

    (r,) = capture_attention(model(below), img)
    assert torch.isfinite(r.probs).all()

    def masked(m, x):
        t = m.pe(x).flatten(2).transpose(1, 2)[:, None]
        keep = torch.ones(16, 16, dtype=torch.bool)
        keep[5] = False  # query 5 attends nowhere
        return F.scaled_dot_product_attention(t, t, t, attn_mask=keep)

    def windows(m, x):
        t = m.pe(x)  # 4x4 patch tokens in four 2x2 windows folded into the batch
        B, E = t.shape[:2]
        t = t.reshape(B, E, 2, 2, 2, 2).permute(0, 2, 4, 3, 5, 1).reshape(-1, 4, E) * 3
        qq = t.reshape(len(t), 4, 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(qq, qq, qq)

    for forward in (masked, windows):
        m = model(forward)
        sites = attention_sites(m, (3, 32, 32))
        probs, maps = site_probs(m, sites, img[:1])[0], site_maps(m, sites, img[:1])[0]
        assert torch.isfinite(maps).all() and torch.allclose(maps, probs, atol=1e-6), forward.__name__

    own = _Wrapped(heads=2, encoding="learned-content", max_size=16).eval()
    sites = attention_sites(own, (3, 8, 8))
    with torch.no_grad():
        own.sa.query.weight.fill_(math.nan)
    for call in (lambda: site_maps(own, sites, torch.randn(1, 3, 8, 8)),
                 lambda: site_scores(own, sites, torch.randn(1, 3, 8, 8))):
        with pytest.raises(AttnconvError, match=r"sa: its attention (probabilities|scores) hold NaN or inf"):
            call()

    learned = torch.randn(1, 2, 16, 8)  # 16 queries of every image: a 4x4 count, no image positions

    def pooled(m, x):
        t = m.pe(x).flatten(2).transpose(1, 2).reshape(len(x), 16, 2, 8).transpose(1, 2)
        return F.scaled_dot_product_attention(learned, t, t)

    (r,) = capture_attention(model(pooled), img)
    assert r.query_size is None and r.size == (4, 4) and "queries of every image, on no image grid" in r.note()

    def pyramid(m, x):  # 4x4 queries over 2x2 pooled keys with a class token
        t = m.pe(x)
        keys = torch.cat([torch.zeros(len(x), 1, 16), F.avg_pool2d(t, 2).flatten(2).transpose(1, 2)], 1)
        return F.scaled_dot_product_attention(t.flatten(2).transpose(1, 2), keys, keys)

    from attnconv.models.sites import captured_sites

    with pytest.raises(AttnconvError, match=r"not one image grid \(queries on 4x4, keys on 2x2\)"):
        captured_sites(capture_attention(model(pyramid), img))


def test_round_42_queries_broadcast_over_heads_are_the_images_and_site_maps_take_every_term():
    """Round 41's rule for queries shared by every image compared all batch dimensions, so queries broadcast over
    heads (multi-query attention, one image too) were put on no grid, and learned queries over one-head keys were read
    as the images' grid when there were fewer images than heads. Only the images' dimension counts now. `site_maps`
    of a captured site's content term failed ("term must be one of combined, position"), and a position-only attnconv
    layer with NaN weights gave NaN maps without a word."""
    import torch.nn.functional as F


    class MultiQuery(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.kv = nn.Conv2d(3, 8, 4, 4), nn.Linear(8, 32)

        def forward(self, x):
            t = self.emb(x).flatten(2).transpose(1, 2)  # (B, 16, 8)
            k = self.kv(t).reshape(len(x), 16, 4, 8).transpose(1, 2)  # (B, 4, 16, 8)
            return F.scaled_dot_product_attention(t[:, None], k, k)  # queries (B, 1, 16, 8) broadcast over heads

    class Learned(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.queries = nn.Conv2d(3, 8, 4, 4), nn.Parameter(torch.randn(1, 4, 16, 8))

        def forward(self, x):
            t = self.emb(x).flatten(2).transpose(1, 2)[:, None]  # (B, 1, 16, 8): one key head
            return F.scaled_dot_product_attention(self.queries, t, t)

    torch.manual_seed(0)
    for n in (1, 2):
        (r,) = capture_attention(MultiQuery().eval(), torch.randn(n, 3, 16, 16))
        assert r.query_size == r.size == (4, 4), n
    for n in (2, 3, 8):
        (r,) = capture_attention(Learned().eval(), torch.randn(n, 3, 16, 16))
        assert r.query_size is None and r.size == (4, 4), n

    m = MultiQuery().eval()
    sites = attention_sites(m, (3, 16, 16))
    x = torch.randn(1, 3, 16, 16)
    content = site_maps(m, sites, x, term="content")[0]
    assert torch.allclose(content, site_scores(m, sites, x)[0]["content"][0].softmax(-1), atol=1e-6)

    own = _Wrapped(heads=4, encoding="quadratic", max_size=8).eval()
    sites = attention_sites(own, (3, 8, 8))
    with torch.no_grad():
        for p in own.sa.parameters():
            p.fill_(math.nan)
    with pytest.raises(AttnconvError, match=r"sa: its attention probabilities hold NaN or inf"):
        site_maps(own, sites, torch.randn(1, 3, 8, 8))


class _Wrapped(nn.Module):
    """One attnconv SelfAttention2d of 3 channels inside a user's model (its path: `sa`)."""

    def __init__(self, **options):
        super().__init__()
        from attnconv.attention.layer import SelfAttention2d

        self.sa = SelfAttention2d(3, **options)

    def forward(self, x):
        return self.sa(x)


def test_round_42_e_learned_queries_copied_to_every_image_with_expand_are_no_image_positions():
    """Learned queries copied to every image with `.expand` (as DETR does; a stride of 0 over the images) were read as
    the images' grid; queries that differ from image to image still are."""
    import torch.nn.functional as F

    class Decoder(nn.Module):
        def __init__(self, copy):
            super().__init__()
            self.emb, self.queries, self.copy = nn.Conv2d(3, 8, 4, 4), nn.Parameter(torch.randn(1, 2, 16, 4)), copy

        def forward(self, x):
            t = self.emb(x).flatten(2).transpose(1, 2).reshape(len(x), 16, 2, 4).transpose(1, 2)
            q = self.queries.expand(len(x), -1, -1, -1) if self.copy else t
            return F.scaled_dot_product_attention(q, t, t)

    torch.manual_seed(0)
    (r,) = capture_attention(Decoder(True).eval(), torch.randn(3, 3, 16, 16))
    assert r.query_size is None and r.size == (4, 4)
    (r,) = capture_attention(Decoder(False).eval(), torch.randn(3, 3, 16, 16))
    assert r.query_size == r.size == (4, 4)


class _LearnedQueries(nn.Module):
    """A DETR-like decoder: learned queries of every image (broadcast over the images through SDPA, or copied with
    `.expand` into nn.MultiheadAttention) attending to the patch tokens."""

    def __init__(self, queries: int, mha: bool, expand_keys: bool = False):
        super().__init__()
        self.emb, self.mha, self.expand_keys = nn.Conv2d(1, 8, 4, 4), mha, expand_keys
        self.q = nn.Parameter(torch.randn(1, queries, 8) if mha else torch.randn(1, 2, queries, 4))
        self.dec = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        t = self.emb(x).flatten(2).transpose(1, 2)
        if self.mha:
            if self.expand_keys:  # one image's tokens copied to every image, queries too: the images are one
                t = t[:1].expand(len(x), -1, -1)
            return self.dec(self.q.expand(len(x), -1, -1), t, t)[0]
        k = t.reshape(len(t), -1, 2, 4).transpose(1, 2)
        return torch.nn.functional.scaled_dot_product_attention(self.q, k, k)


def test_round_43_learned_queries_are_told_by_every_path_and_site_maps_names_its_terms():
    """Round 43: learned queries copied with `.expand` into nn.MultiheadAttention (DETR's decoder) were read as the
    images' own on a grid of their count (16 as 4x4, 5 as a class token and 2x2), as only SDPA calls were checked;
    attention_sites' one zero image read broadcast learned queries as a site, on which site_probs then crashed
    (TypeError); site_maps took any term and gave None for every site."""
    torch.manual_seed(0)
    x = torch.randn(3, 1, 16, 16)
    for count in (16, 5, 100):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            (r,) = capture_attention(_LearnedQueries(count, mha=True).eval(), x)
        assert r.query_size is None and r.size == (4, 4), (count, r)
        assert not said, [str(w.message) for w in said]  # no guess said of queries that are no positions
        assert "queries of every image" in r.note()
    # Queries and keys both copied to every image: learned tokens on either side (round 44: no grid, all kept).
    (r,) = capture_attention(_LearnedQueries(16, mha=True, expand_keys=True).eval(), x)
    assert r.query_size is None and r.size is None and r.shared == ("queries", "keys"), r
    for mha in (False, True):
        with pytest.raises(AttnconvError, match="queries of every image, on no image grid") as err:
            attention_sites(_LearnedQueries(16, mha=mha).eval(), (1, 16, 16))
        assert "give grid=" not in str(err.value)  # no grid tells learned queries' positions
    # Sites found where the queries could not be told (one image) are refused in words on a batch that tells them.
    model = _LearnedQueries(16, mha=False).eval()
    from attnconv.models.sites import captured_sites

    sites, _ = captured_sites(capture_attention(model, x[:1]))
    with pytest.raises(AttnconvError, match="queries are the same for every image"):
        site_probs(model, sites, x)
    model = PatchTokens(4).eval()
    sites = attention_sites(model, (1, 16, 16))
    for mode in ("probs", "scores"):
        with pytest.raises(AttnconvError, match="term must be one of combined, content, position, got 'contnet'"):
            site_maps(model, sites, x[:1], mode=mode, term="contnet")
    assert site_maps(model, sites, x[:1], term="content")[0] is not None


def test_round_43_a_warning_of_a_capture_asked_for_by_python_c_or_stdin_is_shown_not_an_import_error(tmp_path):
    """Round 43: a capture's warning, asked for from `python -c`, a script on stdin, exec or `python -m`, crashed
    with ImportError ('__main__' is not a built-in module): the warnings machinery asked __main__'s loader for its
    source."""
    import subprocess
    import sys

    code = (
        "import torch, torch.nn as nn, torch.nn.functional as F\n"
        "from attnconv import capture_attention\n"
        "class M(nn.Module):\n"
        "    def __init__(s):\n"
        "        super().__init__(); s.pe = nn.Conv2d(1, 8, 4, 4); s.reg = nn.Parameter(torch.randn(1, 3, 8))\n"
        "    def forward(s, x):\n"
        "        t = s.pe(x).flatten(2).transpose(1, 2); t = torch.cat([s.reg.expand(len(t), -1, -1), t], 1)\n"
        "        q = t.reshape(len(t), -1, 2, 4).transpose(1, 2); return F.scaled_dot_product_attention(q, q, q)\n"
        "print('records', len(capture_attention(M(), torch.randn(2, 1, 16, 16))))\n")
    (tmp_path / "warner.py").write_text(code)
    for how in (["-c", code], ["-"], ["-m", "warner"]):
        done = subprocess.run([sys.executable, *how], input=code if how == ["-"] else None, capture_output=True,
                              text=True, cwd=tmp_path, timeout=120)
        assert done.returncode == 0 and "records 1" in done.stdout, (how, done.stderr[-800:])
        assert "AttnconvWarning" in done.stderr and "Traceback" not in done.stderr, (how, done.stderr[-800:])


class _LearnedTokens(nn.Module):
    """Learned tokens copied to every image with `.expand`: a DETR-like decoder layer (its self-attention among
    learned queries, then their cross-attention to the patches), or patches attending learned memory."""

    def __init__(self, memory: bool, sdpa: bool = False, one_image: bool = False):
        super().__init__()
        self.tok, self.memory, self.sdpa, self.one = nn.Conv2d(1, 16, 7, 7), memory, sdpa, one_image
        self.learned = nn.Parameter(torch.randn(16, 16))
        self.dec = nn.TransformerDecoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)

    def forward(self, x):
        if self.one:
            x = x.view(1, *x.shape[1:])  # a model that takes one image a call
        t = self.tok(x).flatten(2).transpose(1, 2)
        learned = self.learned.unsqueeze(0).expand(len(x), -1, -1)
        if not self.memory:
            return self.dec(learned, t)
        if self.sdpa:
            return torch.nn.functional.scaled_dot_product_attention(t, learned, learned)
        return self.attn(t, learned, learned)[0]


def test_round_44_learned_keys_are_no_image_grid_and_sites_of_one_image_models_are_found(capsys):
    """Round 44: learned tokens copied with `.expand` on both sides (a decoder's self-attention among its queries)
    were read as the images' grid when they were as many as its positions, and so were learned memory keys, both
    then taken as attention sites over the image; attention_sites' two images refused a model that takes one image a
    call, blaming the shape; a warning turned into an error was reworded as the model's failure; a capture asked for
    from code exec'd with globals of no name lost its warning; the site functions took any object as images."""
    import subprocess
    import sys

    torch.manual_seed(0)
    x = torch.randn(4, 1, 28, 28)
    self_attn, cross = capture_attention(_LearnedTokens(memory=False).eval(), x)
    assert self_attn.size is None and self_attn.query_size is None and "queries and keys" in self_attn.note()
    assert cross.query_size is None and cross.size == (4, 4)  # queries computed from the copies: equal by value

    class Repeated(nn.Module):  # DETR's own: learned queries copied with .repeat (no stride tells)
        def __init__(self):
            super().__init__()
            self.tok, self.queries = nn.Conv2d(1, 16, 7, 7), nn.Parameter(torch.randn(16, 1, 16))
            self.attn = nn.MultiheadAttention(16, 2)

        def forward(self, x):
            t = self.tok(x).flatten(2).permute(2, 0, 1)  # (T, N, E)
            return self.attn(self.queries.repeat(1, len(x), 1), t, t)[0]

    (r,) = capture_attention(Repeated().eval(), x)
    assert r.query_size is None and r.size == (4, 4), r
    same = x[:1].expand(4, -1, -1, -1).contiguous()  # one image repeated: its tokens equal on both sides, read as its
    (r,) = capture_attention(PatchTokens(7).eval(), same)
    assert r.query_size == r.size == (4, 4), r
    with pytest.raises(AttnconvError, match="queries and keys of a decoder's target"):  # round 45's rule first
        attention_sites(_LearnedTokens(memory=False).eval(), (1, 28, 28))
    for sdpa in (False, True):
        (r,) = capture_attention(_LearnedTokens(memory=True, sdpa=sdpa).eval(), x)
        assert r.size is None and r.query_size is None and r.note() == "keys of every image, on no image grid: all kept"
        with pytest.raises(AttnconvError, match="keys of every image") as err:
            attention_sites(_LearnedTokens(memory=True, sdpa=sdpa).eval(), (1, 28, 28))
        assert "give grid=" not in str(err.value)

    one = PatchTokens(7).eval()
    one.forward = lambda x, f=one.forward: f(x.view(1, *x.shape[1:]))  # takes one image a call
    assert [s.size for s in attention_sites(one, (1, 28, 28))] == [(4, 4)]

    class Guessed(nn.Module):  # 10 tokens of 28x28 images: a reading that is said
        def __init__(self):
            super().__init__()
            self.p = nn.Linear(49, 8)

        def forward(self, x):
            t = self.p(x.unfold(2, 7, 7).unfold(3, 7, 7).reshape(len(x), 16, 49))[:, :10]
            return torch.nn.functional.scaled_dot_product_attention(t, t, t)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttnconvWarning, match="a guess"):
            attention_sites(Guessed(), (1, 28, 28))
    code = ("import torch, torch.nn as nn, torch.nn.functional as F\nfrom attnconv import capture_attention\n"
            "class M(nn.Module):\n    def __init__(s):\n        super().__init__(); s.p = nn.Linear(49, 8)\n"
            "    def forward(s, x):\n        t = s.p(x.unfold(2, 7, 7).unfold(3, 7, 7).reshape(len(x), 16, 49))[:, :10]\n"
            "        return F.scaled_dot_product_attention(t, t, t)\n"
            "print('records', len(capture_attention(M(), torch.randn(2, 1, 28, 28))))\n")
    for globs in ("{}", "{'__name__': None}"):
        done = subprocess.run([sys.executable, "-c", f"exec(compile({code!r}, '<cell-1>', 'exec'), {globs})"],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and "records 1" in done.stdout, (globs, done.stderr[-800:])
        assert "<cell-1>:9: AttnconvWarning" in done.stderr, (globs, done.stderr[-800:])

    model = PatchTokens(7).eval()
    sites = attention_sites(model, (1, 28, 28))
    for bad in (None, x[:1].numpy(), [x[:1]], torch.tensor(1.0)):
        for call in (lambda b: site_maps(model, sites, b), lambda b: site_scores(model, sites, b),
                     lambda b: site_probs(model, sites, b)):
            with pytest.raises(AttnconvError):
                call(bad)


def test_round_45_a_torch_decoders_target_is_no_image_grid_in_any_layer_and_the_probe_images_are_no_constants():
    """Round 45: from the second layer of an nn.TransformerDecoder on, the learned queries have attended to the image
    and differ per image, so its self- and cross-attention were read on a grid of the queries' count (16 queries as a
    silent 4x4 site); attention_sites' zero probe image turned per-image min-max scaling into NaN, blamed on the
    model."""

    class DetrLike(nn.Module):
        def __init__(self, batch_first: bool):
            super().__init__()
            self.conv, self.pos, self.bf = nn.Conv2d(1, 16, 7, 7), nn.Parameter(torch.randn(1, 16, 16)), batch_first
            layer = nn.TransformerDecoderLayer(16, 2, 32, 0.0, batch_first=batch_first)
            self.dec, self.query = nn.TransformerDecoder(layer, 2), nn.Parameter(torch.randn(16, 16))

        def forward(self, x):
            memory = self.conv(x).flatten(2).transpose(1, 2) + self.pos
            queries = self.query.unsqueeze(0).repeat(len(x), 1, 1)
            if not self.bf:
                memory, queries = memory.transpose(0, 1), queries.transpose(0, 1)
            return self.dec(queries, memory)

    torch.manual_seed(0)
    for batch_first in (True, False):
        records = capture_attention(DetrLike(batch_first).eval(), torch.randn(3, 1, 28, 28))
        assert [r.path for r in records] == [f"dec.layers.{i}.{a}" for i in (0, 1) for a in ("self_attn",
                                                                                             "multihead_attn")]
        for r in records:
            assert r.query_size is None and "decoder's target" in r.note(), r
            assert r.size == ((4, 4) if r.path.endswith("multihead_attn") else None), r
        with pytest.raises(AttnconvError, match="decoder's target"):
            attention_sites(DetrLike(batch_first).eval(), (1, 28, 28))

    class Scaled(PatchTokens):  # each image scaled to 0..1 by its own range, as some pipelines do
        def forward(self, x):
            lo, hi = x.amin((1, 2, 3), keepdim=True), x.amax((1, 2, 3), keepdim=True)
            return super().forward((x - lo) / (hi - lo))

    assert [s.size for s in attention_sites(Scaled(7).eval(), (1, 28, 28))] == [(4, 4)]


class _SdpaAttention(nn.Module):
    """A drop-in for a batch-first nn.MultiheadAttention (two heads) that computes with SDPA."""

    def __init__(self, dim: int = 16):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(dim, dim) for _ in range(4))
        self.batch_first = True

    def forward(self, q, k, v, **kwargs):
        heads = [w(t).view(len(t), t.shape[1], 2, -1).transpose(1, 2) for t, w in ((q, self.q), (k, self.k), (v, self.v))]
        out = torch.nn.functional.scaled_dot_product_attention(*heads)
        return self.o(out.transpose(1, 2).reshape(q.shape)), None


def test_round_46_a_decoder_layer_computing_with_sdpa_a_tied_attention_and_a_model_that_sees_the_probes_alike():
    """Round 46: the decoder-target rule held only for nn.MultiheadAttention under its registered name, so a
    TransformerDecoderLayer subclass computing with SDPA had its later layers read as silent 4x4 sites, and one
    attention module shared by an encoder and a decoder layer was read by whichever registered it first; a model
    taking the sign of its input saw attention_sites' two positive probe images as one, and its learned queries
    became a site."""

    class Layer(nn.TransformerDecoderLayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.self_attn, self.multihead_attn = _SdpaAttention(), _SdpaAttention()

    class Model(nn.Module):
        def __init__(self, tied: bool):
            super().__init__()
            self.pe = nn.Conv2d(1, 16, 4, 4)
            self.enc = nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True)
            self.dec = nn.TransformerDecoder((nn.TransformerDecoderLayer if tied else Layer)(16, 2, 32, 0.0,
                                                                                             batch_first=True), 2)
            if tied:  # the decoder's second self-attention is the encoder's module
                self.dec.layers[1].self_attn = self.enc.self_attn
            self.queries = nn.Parameter(torch.randn(16, 16))

        def forward(self, x):
            memory = self.enc(self.pe(x).flatten(2).transpose(1, 2))
            return self.dec(self.queries.expand(len(x), -1, -1), memory)

    torch.manual_seed(0)
    for tied in (False, True):
        model = Model(tied).eval()
        records = capture_attention(model, torch.rand(3, 1, 16, 16))
        assert records[0].query_size == records[0].size == (4, 4), records[0]  # the encoder over the patches
        assert all("decoder's target" in r.note() and r.query_size is None for r in records[1:]), records
        assert [s.path for s in attention_sites(model, (1, 16, 16))] == ["enc.self_attn"], tied

    class Signs(nn.Module):  # the sign of each pixel: both positive probe images are one image to it
        def __init__(self):
            super().__init__()
            self.pe, self.queries = nn.Conv2d(1, 16, 4, 4), nn.Parameter(torch.randn(1, 16, 16))

        def forward(self, x):
            t = self.pe(torch.sign(x)).flatten(2).transpose(1, 2)
            q = self.queries.repeat(len(x), 1, 1)
            return torch.nn.functional.scaled_dot_product_attention(q, t, t)

    with pytest.raises(AttnconvError, match="queries of every image, on no image grid"):
        attention_sites(Signs().eval(), (1, 16, 16))


def test_round_47_a_decoder_layers_own_self_attention_an_encoder_inside_it_and_a_model_that_rounds_its_input():
    """Round 47: a TransformerDecoderLayer subclass computing its self-attention in the layer itself had its target
    keys read as an image grid; an encoder layer over the patches inside a decoder layer was read as the decoder's
    target (no site at all); a model that rounds its input to integer pixels saw both probe images as one, the retry
    with negative values failed in silence, and its learned pooling queries were listed as a site."""

    class Own(nn.TransformerDecoderLayer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.mem_enc = nn.TransformerEncoderLayer(16, 2, 32, 0.0, batch_first=True)

        def _sa_block(self, x, attn_mask, key_padding_mask, is_causal=False):
            q = x.view(len(x), x.shape[1], 2, -1).transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(q, q, q)
            return out.transpose(1, 2).reshape(x.shape)

        def _mha_block(self, x, mem, attn_mask, key_padding_mask, is_causal=False):
            return super()._mha_block(x, self.mem_enc(mem), attn_mask, key_padding_mask, is_causal)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.pe = nn.Conv2d(1, 16, 7, 7)
            self.dec = nn.TransformerDecoder(Own(16, 2, 32, 0.0, batch_first=True), 2)
            self.queries = nn.Parameter(torch.randn(16, 16))

        def forward(self, x):
            return self.dec(self.queries.expand(len(x), -1, -1), self.pe(x).flatten(2).transpose(1, 2))

    torch.manual_seed(0)
    model = Model().eval()
    for r in capture_attention(model, torch.rand(3, 1, 28, 28)):
        if r.path.endswith("mem_enc.self_attn"):  # the encoder over the patches: the image's grid
            assert r.query_size == r.size == (4, 4), r
        else:
            assert r.query_size is None and "decoder's target" in r.note(), r
    assert [s.path for s in attention_sites(model, (1, 28, 28))] == [f"dec.layers.{i}.mem_enc.self_attn" for i in (0, 1)]

    class Pixels(nn.Module):  # pixel values 0..255 embedded as integers: the probes 0.1..0.9 are all 0 to it
        def __init__(self):
            super().__init__()
            self.emb, self.q = nn.Embedding(256, 32), nn.Parameter(torch.randn(1, 16, 32))
            self.pool = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            t = self.emb(x.long().clamp(0, 255)[:, 0, ::7, ::7].flatten(1))
            return self.pool(self.q.repeat(len(x), 1, 1), t, t)[0]

    with pytest.raises(AttnconvError, match="queries of every image, on no image grid"):
        attention_sites(Pixels().eval(), (1, 28, 28))


def test_round_48_attention_sites_says_each_warning_once_with_its_module_and_registry():
    """Round 48: where the retry's probe pair looked alike too (a model that clamps its input), the retry pass's
    warnings were said although its records were dropped, then the first pass's: each twice; and the first pass's
    warnings, issued again by hand, lost their module and registry, so a filter by module did not apply and a
    warning shown once per line by default was shown at every call."""

    class Net(nn.Module):
        def __init__(self, low=None):
            super().__init__()
            self.low, self.c = low, nn.Conv2d(1, 16, 4, 4)
            self.sa = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            warnings.warn("this forward is deprecated", DeprecationWarning, stacklevel=1)  # the model's own
            t = self.c(x if self.low is None else x.clamp(min=self.low)).flatten(2).transpose(1, 2)
            return self.sa(t, t, t, need_weights=False)[0].mean((1, 2))

    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        sites = attention_sites(Net(low=2.0).eval(), (1, 28, 28), grid=(5, 5))
    texts = [str(w.message) for w in said]
    assert [s.path for s in sites] == ["sa"]
    assert sum("fit grid=(5, 5)" in t for t in texts) == 1, texts  # the kept (first) pass's, once
    assert sum("same for both probe images" in t for t in texts) == 1, texts
    with warnings.catch_warnings(record=True) as said:  # filters by module apply, as to capture_attention
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=re.escape(__name__))
        attention_sites(Net().eval(), (1, 28, 28), grid=(5, 5))
    assert [str(w.message) for w in said] == []
    with warnings.catch_warnings(record=True) as said:  # once per line by default, at the caller's line
        warnings.simplefilter("default")
        for _ in range(2):
            attention_sites(Net().eval(), (1, 28, 28), grid=(5, 5))
    grid_said = [w for w in said if "fit grid=(5, 5)" in str(w.message)]
    assert len(grid_said) == 1 and grid_said[0].filename == __file__, [str(w.message) for w in said]
    assert sum(w.category is DeprecationWarning for w in said) == 1, [str(w.message) for w in said]


def test_round_49_capture_warnings_at_the_callers_line_after_the_model_ran_and_not_again_per_batch():
    """Round 49: the could-not-be-told warning of attention_sites was said at attnconv's line where attnconv called it
    (head_snapshot), out of the caller's filters; capture_attention said its warnings inside the model's forward, so
    a model's own catch_warnings lost them (ignore) or, as errors, took them for its own failure (no record at all);
    site_probs said a guess about a computation that is no site again on every batch of images."""
    from types import SimpleNamespace

    import torch.nn.functional as F

    from attnconv.analysis import head_snapshot

    class Clamped(nn.Module):  # both probe pairs alike: its learned leading tokens cannot be told
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(in_channels=1, image_size=28)
            self.c, self.cls = nn.Conv2d(1, 16, 4, 4), nn.Parameter(torch.randn(1, 3, 16))
            self.sa = nn.MultiheadAttention(16, 2, batch_first=True)

        def forward(self, x):
            t = self.c(x.clamp(min=2.0)).flatten(2).transpose(1, 2)
            t = torch.cat([self.cls.expand(len(t), -1, -1), t], 1)
            return self.sa(t, t, t, need_weights=False)[0].mean((1, 2))

    torch.manual_seed(0)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        head_snapshot(Clamped().eval(), torch.rand(2, 1, 28, 28))
    told = [w for w in said if "could not be told" in str(w.message)]
    assert len(told) == 1 and told[0].filename == __file__, [(str(w.message), w.filename) for w in said]

    class Guarded(nn.Module):  # 3 leading tokens of each image and 7x7 patches: the layout is a guess, said
        def __init__(self, mode):
            super().__init__()
            self.mode, self.c, self.lead = mode, nn.Conv2d(1, 16, 4, 4), nn.Conv2d(1, 48, 28)
            self.queries = nn.Parameter(torch.randn(1, 2, 4, 8))

        def forward(self, x):
            t = torch.cat([self.lead(x).view(len(x), 3, 16), self.c(x).flatten(2).transpose(1, 2)], 1)
            q = t.view(len(x), -1, 2, 8).transpose(1, 2)
            with warnings.catch_warnings():
                warnings.simplefilter(self.mode)
                try:
                    o = F.scaled_dot_product_attention(q, q, q)
                except Warning:
                    o = torch.zeros_like(q)
            return o.mean((1, 2, 3)) + F.scaled_dot_product_attention(
                self.queries.expand(len(x), -1, -1, -1), q, q).mean((1, 2, 3))

    for mode in ("ignore", "error"):
        model = Guarded(mode).eval()
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            records = capture_attention(model, torch.rand(2, 1, 28, 28))
        assert len(records) == 2 and records[0].size == (7, 7), (mode, records)
        assert [w.filename for w in said] == [__file__], (mode, [str(w.message) for w in said])
    sites = attention_sites(model, (1, 28, 28), grid=(7, 7), leading=3)
    assert [s.size for s in sites] == [(7, 7)]
    with warnings.catch_warnings(record=True) as said:  # the learned queries' guess is no site's: not said per batch
        warnings.simplefilter("always")
        probs = site_probs(model, sites, torch.rand(40, 1, 28, 28))
        site_maps(model, sites, torch.rand(1, 1, 28, 28))
    assert probs[0].shape[-1] == 49 and [str(w.message) for w in said] == []


def test_round_49_head_geometry_and_grid_arguments_of_the_wrong_kind_are_one_line():
    """Round 49 (a note): head_geometry given a model and images (it takes a layer and its grid) failed with torch's
    own message from deep inside; a grid given as a tensor or a long list was shown whole, over many lines."""
    from attnconv.analysis import head_geometry

    layer = nn.Sequential(nn.Conv2d(1, 4, 3))
    with pytest.raises(AttnconvError) as err:
        head_geometry(layer, torch.rand(2, 1, 28, 28))
    assert str(err.value).startswith("size a tensor of shape (2, 1, 28, 28) is invalid: give the layer's input grid")
    for grid, shown in ((torch.zeros(2, 40, 40), "a tensor of shape (2, 40, 40)"), (list(range(100)), "a list")):
        with pytest.raises(AttnconvError, match=re.escape(f"grid {shown} is invalid")) as err:
            capture_attention(layer, torch.rand(1, 1, 8, 8), grid=grid)
        assert "\n" not in str(err.value)


def test_round_50_site_probs_says_why_a_site_was_not_captured():
    """Round 50: site_probs, site_maps and site_scores dropped every warning of their capture pass, the one saying why
    a site's computation was not captured too (an nn.MultiheadAttention subclass computing something else on these
    images), and said only that it "did not run"."""

    class Sub(nn.MultiheadAttention):
        bright = False

        def forward(self, q, k, v, **kw):
            return (q * 2, None) if self.bright else super().forward(q, k, v, **kw)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.c, self.sa = nn.Conv2d(1, 16, 4, 4), Sub(16, 2, batch_first=True)

        def forward(self, x):
            self.sa.bright = bool(x.mean() > 5)
            t = self.c(x).flatten(2).transpose(1, 2)
            return self.sa(t, t, t, need_weights=False)[0].mean()

    torch.manual_seed(0)
    model = Model()
    sites = attention_sites(model, (1, 28, 28))
    for call in (lambda x: site_probs(model, sites, x), lambda x: site_maps(model, sites, x[:1]),
                 lambda x: site_scores(model, sites, x[:1])):
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            with pytest.raises(AttnconvError, match="sa: this attention computation was not captured on these images"):
                call(torch.rand(2, 1, 28, 28) + 10)
        assert [w.filename for w in said] == [__file__] and "its attention is not captured" in str(said[0].message)


def test_round_51_sizes_and_counts_of_the_wrong_kind_and_the_not_captured_error_alone():
    """Round 51: analyze_layer, effective_kernel and conv_likeness took their size through int() (7.5 read as 7,
    strings and bools taken, None or a 0-d tensor a traceback, a long list printed whole); whole numbers had no upper
    bound (10**30 reached torch); a batch_size past the images failed in torch; and the not-captured error of the
    site functions came with another computation's layout guess, as if it said why."""
    import torch.nn.functional as F

    from attnconv import SelfAttention2d, analyze_layer, conv_likeness, effective_kernel
    from attnconv.analysis.heads import head_geometry

    layer = SelfAttention2d(4, 4, heads=4, encoding="quadratic")
    for call in (lambda s: analyze_layer(layer, s), lambda s: effective_kernel(layer, s),
                 lambda s: conv_likeness(layer, s), lambda s: head_geometry(layer, s),
                 lambda s: layer.attention_probs(size=s)):
        for size in ((7.5, 7), "77", (True, True), (None, 7), torch.tensor(7.0), [[7, 7]], list(range(100000)),
                     (10**30, 10**30), (float("nan"), 7)):
            with pytest.raises(AttnconvError) as err:
                call(size)
            assert str(err.value).startswith("size ") and len(str(err.value)) < 300 and "\n" not in str(err.value)
    assert analyze_layer(layer, (7, 5))["size"] == [7, 5] and effective_kernel(layer, 6, 6).in_size == (6, 6)

    class Aux(nn.Module):  # sa: a site skipped on bright images; an SDPA of learned queries over 12 tokens besides
        def __init__(self):
            super().__init__()
            self.c, self.sa = nn.Conv2d(1, 16, 4, 4), nn.MultiheadAttention(16, 2, batch_first=True)
            self.p, self.q = nn.Linear(1, 8), nn.Parameter(torch.randn(3, 8))

        def forward(self, x):
            t = self.c(x).flatten(2).transpose(1, 2)
            a = self.p(x.flatten(1)[:, :12, None])
            out = F.scaled_dot_product_attention(self.q.expand(len(x), 3, 8)[:, None], a[:, None], a[:, None]).mean()
            return out if x.mean() > 5 else out + self.sa(t, t, t, need_weights=False)[0].mean()

    torch.manual_seed(0)
    model = Aux()
    with pytest.warns(AttnconvWarning, match="12 tokens"):
        sites = attention_sites(model, (1, 28, 28))
    with pytest.raises(AttnconvError, match="input_shape .* of at most"):
        attention_sites(model, (1, 10**30, 10**30))
    assert len(site_probs(model, sites, torch.rand(3, 1, 28, 28), batch_size=10**30)[0]) == 2  # all at once
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(AttnconvError, match=re.escape("not captured on these images (it did not run)")):
            site_probs(model, sites, torch.rand(2, 1, 28, 28) + 10)
    assert [str(w.message) for w in said] == []


def test_round_52_every_size_and_count_through_the_one_check():
    """Round 52: arguments that skipped the one check (conv_likeness' kernel_size, SelfAttention2d's sizes,
    ConvAttention's and SelfAttention2d's size methods, EffectiveKernel.at, leading=) took 7.5 as 7, True as 1 or gave
    tracebacks; numpy's and 0-d integer tensors given as one number were refused; a meta tensor, or a size the check
    passed but no machine holds, gave torch's own traceback."""
    import numpy as np

    from attnconv import SelfAttention2d, analyze_layer, conv_likeness, conv_to_attention, effective_kernel

    layer = SelfAttention2d(np.int64(4), heads=np.int64(4))
    assert isinstance(layer.heads, int) and analyze_layer(layer, torch.tensor(6))["size"] == [6, 6]
    assert conv_likeness(layer, np.int64(6), kernel_size=np.uint8(3)).distance == conv_likeness(layer, 6).distance
    ek = effective_kernel(layer, 6, 6)
    assert torch.equal(ek.at(np.int64(3)), ek.at(torch.tensor(3)))
    conv = conv_to_attention(nn.Conv2d(2, 2, 3, padding=1))
    for call, name in ((lambda v: conv_likeness(layer, 6, kernel_size=v), "kernel_size"),
                       (lambda v: SelfAttention2d(4, heads=v), "heads"),
                       (lambda v: conv.attention_probs(size=(6, v)), "size"), (lambda v: layer.output_size((v, 8)), "size"),
                       (lambda v: ek.at((1, v)), "query"), (lambda v: analyze_layer(layer, (6, v)), "size")):
        for v in (7.5, True, "3", None, float("nan"), 10**30, torch.tensor(3, device="meta")):
            with pytest.raises(AttnconvError, match=name) as err:
                call(v)
            assert "\n" not in str(err.value) and len(str(err.value)) < 300
    with pytest.raises(AttnconvError, match="needs about .* of memory"):
        layer.attention_probs(size=(6, 2**20))
    with pytest.raises(AttnconvError, match=r"leading an array of shape \(100,\)"):
        capture_attention(layer, torch.rand(1, 4, 6, 6), grid=(6, 6), leading=np.arange(100))


def test_round_53_configs_converters_grids_plots_and_bounds_take_numbers_through_the_one_check():
    """Round 53: build_model's and make_config's whole-number fields and the converters' key_dim refused numpy's
    integers; grid_points, analyze_sites' images, default_alpha's and leakage_bound's ndim, and the plots' sizes and
    counts (maps_figure, spread_epochs, head_colors) took 7.5 or True, or gave tracebacks."""
    import numpy as np

    import attnconv as ac
    from attnconv import models as M
    from attnconv.analysis.grid import grid_points
    from attnconv.construct.bound import default_alpha, leakage_bound
    from attnconv.plots.figures import head_colors, maps_figure, spread_epochs

    config = ac.make_config(preset="fmnist-sa-quadratic", epochs=np.int64(3))
    assert type(config.epochs) is int and config.epochs == 3
    assert M.build_model("sa-quadratic", hidden=np.int64(36)) is not None
    layer = ac.conv_to_attention(nn.Conv2d(2, 2, 3, padding=1), learnable=True, key_dim=np.int64(4))
    assert layer is not None
    probs = [torch.softmax(torch.randn(2, 16, 16), -1)]
    for call, name in ((grid_points, "kernel"), (lambda v: analyze_sites([], [], images=v), "images"),
                       (lambda v: default_alpha(torch.float32, v), "ndim"), (lambda v: leakage_bound(20.0, v), "ndim"),
                       (lambda v: spread_epochs(range(10), v), "count"), (head_colors, "n"),
                       (lambda v: maps_figure(probs, (4, 4), (1, 1), v), "zoom"),
                       (lambda v: maps_figure(probs, (4, 4), (1, v), 3), "query")):
        for v in (7.5, True, "3", None, float("nan"), 10**30):
            with pytest.raises(AttnconvError, match=name) as err:
                call(v)
            assert "\n" not in str(err.value)
    with pytest.raises(AttnconvError, match="query"):
        maps_figure(probs, (4, 4), (-1, 1), 3)  # it wrapped to the last row
