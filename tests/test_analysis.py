"""Analysis of attention layers and runs: known answers (a converted conv, uniform heads, set centers)."""

import json
import math

import numpy as np
import pytest
import torch
import torch.nn as nn

from attnconv.analysis import (
    analyze_layer,
    analyze_sites,
    format_analysis,
    json_ready,
)
from attnconv.attention import SelfAttention2d
from attnconv.cli import main
from attnconv.construct import conv_to_attention
from attnconv.errors import AttnconvError
from attnconv.models import build_model
from attnconv.models.sites import AttentionLayer, attention_sites, site_probs
from attnconv.runs import load_run

MODELS = ("sa-quadratic", "sa-quadratic-aniso", "sa-learned", "sa-learned-content")
HEAD_KEYS = {"head", "center", "center_source", "mean_shift", "alpha", "inverse_covariance", "eigenvalues",
             "condition", "avg_distance", "mass_3x3", "mass_5x5", "entropy", "degenerate", "reasons"}
LAYER_KEYS = {"layer", "size", "encoding", "probabilities", "heads", "degenerate_heads", "mean_mass_3x3",
              "mean_mass_5x5", "conv_likeness"}


@pytest.fixture(scope="module")
def runs(tiny_attention_runs):
    return tiny_attention_runs


# ------------------------------------------------------------------------------ known layers


def test_converted_3x3_conv_is_analyzed_as_a_3x3_conv():
    layer = conv_to_attention(nn.Conv2d(3, 4, 3, padding=1).double())
    r = analyze_layer(layer, (8, 8))
    assert r["conv_likeness"]["distance"] < 1e-8
    assert r["degenerate_heads"] == []
    grid = [[a, b] for a in (-1, 0, 1) for b in (-1, 0, 1)]
    assert [h["center"] for h in r["heads"]] == grid
    for h in r["heads"]:
        assert h["center_source"] == "parameter"
        assert h["mass_3x3"] == pytest.approx(1.0, abs=1e-8)
        assert h["mass_5x5"] == pytest.approx(1.0, abs=1e-8)
        assert h["mean_shift"] == pytest.approx(h["center"], abs=1e-8)
        # a one-hot head attends exactly ||Delta_h|| away
        assert h["avg_distance"] == pytest.approx(math.hypot(*h["center"]), abs=1e-6)
        assert h["alpha"] == pytest.approx(layer.alpha)


def test_uniform_heads_are_degenerate_and_far_from_a_3x3_conv():
    layer = SelfAttention2d(4, 4, heads=4)
    with torch.no_grad():
        layer.encoding.widths.fill_(1e-3)  # alpha = a^2 / 2 = 5e-7: every key gets the same score
    r = analyze_layer(layer, (8, 8))
    assert r["degenerate_heads"] == [1, 2, 3, 4]  # heads numbered from 1, as in the paper and the figures
    for h in r["heads"]:
        assert any(reason.startswith("alpha <") for reason in h["reasons"])
        assert h["entropy"] > 0.999
        assert h["mass_3x3"] < 9 / 64 + 0.02
    assert r["conv_likeness"]["distance"] > 0.8


def test_quadratic_layer_reports_the_centers_it_was_given():
    layer = SelfAttention2d(2, 2, heads=3).double()
    centers = torch.tensor([[1.0, -2.0], [0.0, 0.0], [-1.5, 0.5]], dtype=torch.float64)
    with torch.no_grad():
        layer.encoding.centers.copy_(centers)
        layer.encoding.widths.copy_(torch.tensor([4.0, 2.0, 1.0]))
    r = analyze_layer(layer, 9)
    assert [h["center"] for h in r["heads"]] == centers.tolist()
    assert [h["alpha"] for h in r["heads"]] == pytest.approx([8.0, 2.0, 0.5])  # alpha = a^2 / 2
    assert r["heads"][0]["mean_shift"] == pytest.approx([1.0, -2.0], abs=1e-6)  # sharp head on a pixel
    assert r["heads"][2]["mean_shift"] == pytest.approx([-1.5, 0.5], abs=0.05)  # symmetric between pixels
    assert np.allclose(r["heads"][0]["inverse_covariance"], [[16.0, 0.0], [0.0, 16.0]])
    assert r["degenerate_heads"] == []


def test_ill_conditioned_covariance_is_flagged():
    layer = SelfAttention2d(2, 2, heads=2, encoding="quadratic-aniso")
    with torch.no_grad():
        layer.encoding.widths.copy_(torch.stack([torch.eye(2), torch.diag(torch.tensor([1.0, 0.01]))]))
    r = analyze_layer(layer, 7)
    assert r["heads"][0]["condition"] == pytest.approx(1.0)
    assert r["heads"][1]["condition"] == pytest.approx(1e4, rel=1e-3)
    assert r["degenerate_heads"] == [2]  # the second head, numbered from 1
    assert any("condition" in reason for reason in r["heads"][1]["reasons"])


def test_window_masses_are_nested_and_probabilities():
    layer = SelfAttention2d(3, 3, heads=5, encoding="learned")
    with torch.no_grad():
        layer.encoding.row_keys.normal_(0, 3.0)
        layer.encoding.col_keys.normal_(0, 3.0)
    for h in analyze_layer(layer, (6, 7))["heads"]:
        assert 0 <= h["mass_3x3"] <= h["mass_5x5"] <= 1 + 1e-6
        assert h["center_source"] == "mean shift" and h["alpha"] is None


def test_content_layer_is_averaged_over_its_inputs():
    layer = SelfAttention2d(4, 4, heads=2, encoding="learned-content")
    with pytest.raises(AttnconvError, match="content"):
        analyze_layer(layer, (5, 5))
    x = torch.randn(3, 4, 5, 5)
    r = analyze_layer(layer, (5, 5), x)
    assert r["probabilities"] == "mean over 3 inputs"
    given = analyze_layer(layer, (5, 5), probs=layer.attention_probs(x).mean(0))
    assert given["heads"][0]["center"] == pytest.approx(r["heads"][0]["center"])


def test_json_ready_turns_non_finite_numbers_into_null():
    assert json_ready({"a": [1.0, math.inf, (math.nan, 2)]}) == {"a": [1.0, None, [None, 2]]}


# ------------------------------------------------------------------------------ models and runs


def test_content_model_average_is_the_mean_of_single_images(runs):
    model, _ = load_run(runs["sa-learned-content"])
    x = torch.randn(3, 1, 28, 28)
    sites = attention_sites(model)
    both = site_probs(model, sites, x, batch_size=2)  # two batches: the mean must weigh them right
    singles = [site_probs(model, sites, x[i : i + 1]) for i in range(3)]
    for layer in range(2):
        torch.testing.assert_close(both[layer], sum(s[layer] for s in singles) / 3)
    # layer 0 sees the embedded tokens
    direct = model.attention_layers[0].attention_probs(model.tokens(x).permute(0, 3, 1, 2)).mean(0)
    torch.testing.assert_close(both[0], direct)


def test_a_cnn_has_no_attention_layers_to_analyze():
    with pytest.raises(AttnconvError, match="no attention layers"):
        attention_sites(build_model("resnet18", width=2, in_channels=1), (1, 28, 28))
    with pytest.raises(AttnconvError, match=r"model expects images \(B, 3, H, W\), got \(2, 1, 28, 28\)"):
        attention_sites(build_model("resnet18", width=2), (1, 28, 28))  # an input shape the model does not take


def test_every_attention_layer_follows_the_protocol(runs):
    model, _ = load_run(runs["sa-learned-content"])
    converted = conv_to_attention(torch.nn.Conv2d(2, 3, 3, padding=1))
    for layer in [*model.attention_layers, converted]:
        assert isinstance(layer, AttentionLayer)
    assert not isinstance(torch.nn.Conv2d(2, 3, 3), AttentionLayer)


def test_analyze_sites_position_only_needs_no_images(runs):
    model, _ = load_run(runs["sa-quadratic"])
    sites = attention_sites(model)
    r = analyze_sites(sites, site_probs(model, sites))
    assert r["images"] == 0 and len(r["layers"]) == 2
    assert all(layer["probabilities"] == "exact (position-only)" for layer in r["layers"])


@pytest.mark.parametrize("model", MODELS)
def test_analyze_json_has_the_documented_keys(runs, model, capsys):
    assert main(["analyze", str(runs[model]), "--json", "--images", "5"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["model"] == model and r["size"] == [7, 7]
    assert r["images"] == (5 if model == "sa-learned-content" else 0)
    assert len(r["layers"]) == 2
    assert [layer["layer"] for layer in r["layers"]] == [1, 2]  # numbered from 1, as in the figures and the paper
    for layer in r["layers"]:
        assert [h["head"] for h in layer["heads"]] == [1, 2, 3, 4]
        assert LAYER_KEYS <= set(layer)
        assert {"distance", "distance_5x5", "window_mass", "centers"} <= set(layer["conv_likeness"])
        assert 0 <= layer["conv_likeness"]["distance"] <= 1 + 1e-9
        assert len(layer["heads"]) == 4
        for h in layer["heads"]:
            assert set(h) == HEAD_KEYS
            assert h["center_source"] == ("parameter" if model.startswith("sa-quadratic") else "mean shift")
    if model == "sa-learned-content":
        assert r["layers"][1]["probabilities"] == "mean over 5 test images (content attention)"


def test_analyze_text_is_a_table_per_layer(runs, capsys):
    assert main(["analyze", str(runs["sa-quadratic-aniso"])]) == 0
    text = capsys.readouterr().out
    assert "layer 1 (quadratic-aniso" in text and "layer 2 (quadratic-aniso" in text
    assert "layer 0 " not in text
    assert "distance to the nearest 3x3 conv" in text
    assert len(text.splitlines()) >= 2 * (4 + 3)


def test_format_analysis_marks_degenerate_heads():
    layer = SelfAttention2d(2, 2, heads=2)
    with torch.no_grad():
        layer.encoding.widths.fill_(1e-3)
    r = {"layer": 0, **analyze_layer(layer, 5)}
    text = format_analysis({"thresholds": {"uniform_alpha": 0.01, "ill_conditioned": 1e3, "uniform_entropy": 0.98},
                            "layers": [r]})
    assert text.count("DEGENERATE") == 2


@pytest.mark.parametrize(
    "argv, message",
    [
        (["analyze", "{missing}"], "not a run directory"),
        (["analyze", "{content}", "--images", "0"], "--images 0"),
    ],
)
def test_analyze_bad_input_is_one_line(runs, tmp_path, capsys, argv, message):
    argv = [a.format(missing=tmp_path / "nope", content=runs["sa-learned-content"]) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_a_users_own_model_with_selfattention2d_layers_has_sites():
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 4, stride=4), torch.nn.ReLU(),
        SelfAttention2d(8, 8, heads=4, encoding="learned-content", max_size=7),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 3),
    ).eval()
    (site,) = attention_sites(model, (1, 28, 28))
    assert (site.path, site.size, site.layer) == ("2", (7, 7), model[2])
    x = torch.randn(3, 1, 28, 28)
    (p,) = site_probs(model, [site], x)
    direct = model[2].attention_probs(model[1](model[0](x))).mean(0)
    torch.testing.assert_close(p, direct)
