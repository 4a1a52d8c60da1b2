"""head_snapshot (the per-head record of heads.jsonl) against the definitions written out; grid-likeness."""

import itertools
import math

import pytest
import torch

from attnconv import conv_to_attention
from attnconv.analysis import grid_likeness, head_snapshot, match_to_grid
from attnconv.models import build_model

SIZES = {"hidden": 16, "layers": 2, "heads": 4, "intermediate": 32, "in_channels": 1, "image_size": 12,
         "downsample": 2, "num_classes": 3, "dropout": 0.0, "attn_dropout": 0.0}


def _model(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return build_model(name, **SIZES).eval()


def _expected(p: torch.Tensor, side: int):
    """Attention distance (mean over queries of E||k - q||) and the middle query's center of mass, by loops."""
    heads = p.shape[0]
    mid = (side // 2) * side + side // 2
    dist, com = torch.zeros(heads, dtype=torch.float64), torch.zeros(heads, 2, dtype=torch.float64)
    for h in range(heads):
        for q in range(side * side):
            for k in range(side * side):
                dr, dc = k // side - q // side, k % side - q % side
                dist[h] += p[h, q, k] * math.hypot(dr, dc) / side**2
                if q == mid:
                    com[h] += p[h, q, k] * torch.tensor([dr, dc], dtype=torch.float64)
    return dist, com


@pytest.mark.parametrize("name", ["sa-quadratic", "sa-quadratic-aniso", "sa-learned"])
def test_position_only_heads_match_their_definitions(name):
    model = _model(name)
    snap = head_snapshot(model)
    assert len(snap) == 2 and all(len(layer) == 4 for layer in snap)
    for layer, heads in zip(model.attention_layers, snap):
        p = layer.attention_probs(size=(6, 6))[0].double()
        dist, com = _expected(p, 6)
        assert [h["attention_distance"] for h in heads] == pytest.approx(dist.tolist(), abs=1e-9)
        centers = torch.tensor([h["center"] for h in heads], dtype=torch.float64)
        enc = layer.encoding
        if name == "sa-learned":  # no parameter: the middle query's center of mass
            assert torch.allclose(centers, com, atol=1e-9)
            assert all(set(h) == {"center", "attention_distance"} for h in heads)
        else:
            assert torch.equal(centers, enc.centers.detach().double())
        if name == "sa-quadratic":
            assert [h["alpha"] for h in heads] == pytest.approx((enc.widths.detach().double() ** 2 / 2).tolist())
        if name == "sa-quadratic-aniso":
            s = torch.tensor([h["inverse_covariance"] for h in heads], dtype=torch.float64)
            assert torch.allclose(s, enc.inverse_covariance().detach().double())


def test_content_heads_average_over_the_images_and_center_on_the_position_term():
    model = _model("sa-learned-content")
    x = torch.randn(5, 1, 12, 12)
    snap = head_snapshot(model, x)
    assert snap == head_snapshot(model, x)  # deterministic: no dropout, no RNG
    assert snap != head_snapshot(model, torch.randn(5, 1, 12, 12))  # content attention depends on the images
    # Layer 0 sees the embedded images: its mean attention and its position-term attention, by hand.
    layer = model.attention_layers[0]
    with torch.no_grad():
        scores = layer.attention_scores(model.tokens(x).permute(0, 3, 1, 2))
    combined = scores["combined"].softmax(-1).mean(0).double()
    position = scores["position"].softmax(-1).mean(0).double()
    dist, _ = _expected(combined, 6)
    _, com = _expected(position, 6)
    heads = snap[0]
    assert [h["attention_distance"] for h in heads] == pytest.approx(dist.tolist(), abs=1e-6)
    assert torch.allclose(torch.tensor([h["center"] for h in heads], dtype=torch.float64), com, atol=1e-6)
    with pytest.raises(Exception, match="content attention depends on the input"):
        head_snapshot(model)


def test_a_head_attending_to_one_shifted_token_has_that_center_and_distance():
    model = _model("sa-quadratic")
    enc = model.attention_layers[0].encoding
    with torch.no_grad():
        enc.centers.copy_(torch.tensor([[0.0, 1.0], [1.0, 1.0], [-2.0, 0.0], [0.0, 0.0]]))
        enc.widths.fill_(30.0)  # alpha = 450: each head looks at one token (where it exists)
    heads = head_snapshot(model)[0]
    assert [h["center"] for h in heads] == [[0.0, 1.0], [1.0, 1.0], [-2.0, 0.0], [0.0, 0.0]]
    # Queries whose target token is off the grid attend to the nearest existing one (6 x 6 grid):
    # (0, 1): 30 queries at distance 1, the last column at 0; (1, 1): 25 at sqrt(2), 10 at 1, one at 0;
    # (-2, 0): 24 at 2, the first row at 0, the second at 1.
    assert heads[3]["attention_distance"] == pytest.approx(0.0, abs=1e-9)
    assert heads[0]["attention_distance"] == pytest.approx(30 / 36, abs=1e-9)
    assert heads[1]["attention_distance"] == pytest.approx((25 * math.sqrt(2) + 10) / 36, abs=1e-9)
    assert heads[2]["attention_distance"] == pytest.approx((24 * 2 + 6) / 36, abs=1e-9)


# ---------------------------------------------------------------------------------- grid-likeness


def test_grid_likeness_of_heads_on_the_kernel_grid_is_nine_of_nine_at_distance_zero():
    model = build_model("sa-quadratic", **{**SIZES, "heads": 9})
    for layer in model.attention_layers:
        layer.encoding.init_grid(locality=4.0)  # Theorem 1's layout, permuted below in layer 1
    with torch.no_grad():
        enc = model.attention_layers[1].encoding
        enc.centers.copy_(enc.centers[torch.randperm(9)])
    snaps = [{"epoch": 0, "step": 0, "layers": head_snapshot(model)}]
    (entry,) = grid_likeness(snaps)
    assert entry["epoch"] == 0 and len(entry["layers"]) == 2
    for layer in entry["layers"]:
        assert (layer["mean_distance"], layer["within"], layer["heads"]) == (pytest.approx(0.0, abs=1e-12), 9, 9)
        assert layer["attention_distance"] > 0


def test_grid_likeness_of_a_converted_3x3_conv_is_nine_of_nine():
    attn = conv_to_attention(torch.nn.Conv2d(4, 5, 3, padding=1))
    m = match_to_grid(attn.centers.numpy(), 3)
    assert m["within"] == 9 and m["mean_distance"] == pytest.approx(0.0, abs=1e-12)


def test_grid_likeness_counts_heads_near_distinct_offsets_only():
    # Two heads on one offset: one-to-one matching sends one of them elsewhere.
    centers = [[0.0, 0.0], [0.1, 0.0], [1.0, 1.0], [2.4, 0.0]]
    (entry,) = grid_likeness([{"epoch": 3, "step": 30, "layers": [[{"center": c, "attention_distance": 1.0} for c in centers]]}])
    (layer,) = entry["layers"]
    assert layer["within"] == 2 and layer["heads"] == 4  # (0,0)/(0.1,0), one of them; (1,1); not (2.4,0)
    brute = min(
        sum(math.dist(c, g) for c, g in zip(centers, perm))
        for perm in itertools.permutations([[r, c] for r in (-1, 0, 1) for c in (-1, 0, 1)], 4)
    )
    assert layer["mean_distance"] == pytest.approx(brute / 4)


def test_round_82_a_head_snapshot_of_a_model_whose_config_was_replaced_or_images_of_another_size():
    """Round 82: an sa-* model whose `config` a user replaced (a dict, None) or deleted failed in Python's words
    ("'dict' object has no attribute 'grid'"), and sa-learned-content given images of another size than its config's
    (which its forward takes) failed inside torch (an IndexError, a size mismatch)."""
    from attnconv.errors import AttnconvError

    for config in ({"input_shape": (3, 32, 32)}, None):
        model = build_model("sa-quadratic")
        model.config = config
        with pytest.raises(AttnconvError, match=r"^AttentionClassifier.config is .*, not the config build_model gave "
                                                r"it, whose grid says its attention layers' grids; leave model.config "
                                                r"as built$"):
            head_snapshot(model, torch.randn(2, 3, 32, 32))
    model = build_model("sa-learned-content")
    for shape in ((2, 3, 16, 16), (2, 3, 30, 30)):
        assert model(torch.randn(*shape)).shape == (2, 10)
        with pytest.raises(AttnconvError, match=rf"^x is \({shape[0]}, 3, {shape[2]}, {shape[3]}\): head_snapshot "
                                                r"takes images of the model's own shape \(N, 3, 32, 32\)"):
            head_snapshot(model, torch.randn(*shape))
    assert len(head_snapshot(model, torch.randn(2, 3, 32, 32))) == len(model.attention_layers)


def test_round_83_a_head_snapshot_of_a_model_whose_edited_config_breaks_its_forward():
    """Round 83: a config a user replaced that still has a whole-number grid (a namespace, a dataclasses.replace with
    other channels) reached the model's forward, which failed in Python's or torch's words; a ViT whose config is None
    was told to give the input shape it had been given."""
    import dataclasses
    import types

    from attnconv.errors import AttnconvError

    x = torch.randn(2, 1, 28, 28)
    model = build_model("sa-learned-content", in_channels=1, image_size=28, hidden=16, layers=1)
    model.config = types.SimpleNamespace(in_channels=1, image_size=28, grid=14)
    with pytest.raises(AttnconvError, match=r"^head_snapshot: AttentionClassifier's forward failed \(AttributeError: "
                                            r".*\); a model computes as it was built, and its config replaced or "
                                            r"edited since is not followed: build the model again, or mend its "
                                            r"forward$"):
        head_snapshot(model, x)
    model = build_model("sa-learned-content", in_channels=1, image_size=28, hidden=16, layers=1)
    model.config = dataclasses.replace(model.config, in_channels=3)
    with pytest.raises(AttnconvError, match=r"^head_snapshot: AttentionClassifier's forward failed \(RuntimeError"):
        head_snapshot(model, torch.randn(2, 3, 28, 28))
    vit = build_model("vit", in_channels=1, image_size=28)
    vit.config = None
    with pytest.raises(AttnconvError, match=r"failed \(AttributeError: .*\); give the input shape it takes, or, if it "
                                            r"takes this one, mend what makes its forward fail"):
        head_snapshot(vit, x)
