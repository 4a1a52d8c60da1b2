"""Where captured tokens lie on an image: each computation's own grid, the guess from a token count and the images'
shape, and what `grid=` and `leading=` settle."""

import pytest
import torch
import torch.nn as nn

from attnconv import attention_sites, capture_attention
from attnconv.analysis import analyze_sites
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
