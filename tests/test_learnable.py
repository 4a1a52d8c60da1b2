"""LearnableConvAttention: Theorem 1's layer with trainable head centers and widths,
and `attnconv train --init-from`, which trains a converted CNN further as attention."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from fixtures_data import write_random_fashion
from test_construct import _random_case, rel
from torch import nn
from torch.func import functional_call

from attnconv.analysis import analyze_layer
from attnconv.cli import main
from attnconv.construct import (
    ConvAttention,
    LearnableConvAttention,
    conv_to_attention,
    effective_kernel,
)
from attnconv.convert import cnn_to_attention
from attnconv.errors import AttnconvError
from attnconv.models import no_weight_decay
from attnconv.train import load_run, make_optimizer


def _moved(layer: LearnableConvAttention, seed: int) -> LearnableConvAttention:
    """Move every head off its tap and change its width, as training would."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        p = layer.positions
        p.center.add_(0.7 * torch.randn(p.center.shape, generator=gen, dtype=p.center.dtype))
        p.log_alpha.add_(0.5 * torch.randn(p.log_alpha.shape, generator=gen, dtype=p.log_alpha.dtype))
    return layer


@pytest.mark.parametrize("seed", range(0, 80, 4))
def test_starts_as_the_conv_at_the_default_alpha(seed):
    conv, x, y = _random_case(seed, torch.float64)
    layer = conv_to_attention(conv, learnable=True)
    assert isinstance(layer, LearnableConvAttention)
    assert torch.equal(layer.centers.detach(), ConvAttention.centers.fget(layer).double())
    assert rel(layer(x), y) <= 1e-10
    assert layer.error_bound(x) >= 0  # still the construction: the bound applies


@pytest.mark.parametrize("seed", range(1, 80, 4))
def test_moved_heads_compute_the_attention_their_probabilities_say(seed):
    """forward == sum_h P_h x W_h with P from attention_probs, for any centers and widths."""
    conv, x, _ = _random_case(seed, torch.float64)
    layer = _moved(conv_to_attention(conv, alpha=0.8, learnable=True), seed)
    ek = effective_kernel(layer, tuple(x.shape[2:]))
    out = layer(x)
    assert rel(out, ek.apply(x)) <= 1e-10
    probs = layer.attention_probs(x)[0]
    if conv.padding_mode != "zeros":  # copies of pixels: every row's mass lands on the input
        torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs[..., 0]))


def test_per_head_probabilities_are_the_full_quadratic_softmax():
    """The per-axis product equals softmax(-alpha_h ||k - q - Delta_h||^2) over the padded grid."""
    conv = nn.Conv2d(2, 3, 3, padding=1, dtype=torch.float64)
    layer = _moved(conv_to_attention(conv, alpha=1.3, learnable=True), 0)
    size = (5, 6)
    probs = layer.attention_probs(size=size)[0]  # (9, 30, 30): zero padding keys dropped
    q = torch.stack(torch.meshgrid(torch.arange(5), torch.arange(6), indexing="ij"), -1).reshape(-1, 2)
    k = torch.stack(torch.meshgrid(torch.arange(-1, 6), torch.arange(-1, 7), indexing="ij"), -1).reshape(-1, 2)
    d = (k[None, :, :] - q[:, None, :]).double()  # (Tq, Tk_padded, 2)
    for h in range(9):
        s = -layer.widths[h] * (d - layer.centers[h]).square().sum(-1)
        full = torch.softmax(s, -1).reshape(30, 7, 8)[:, 1:6, 1:7].reshape(30, 30)  # keep input pixels
        torch.testing.assert_close(probs[h], full.detach(), rtol=1e-12, atol=1e-14)


def test_gradients_reach_centers_and_widths_and_match_finite_differences():
    conv = nn.Conv2d(2, 3, 3, stride=2, padding=1, dtype=torch.float64)
    layer = _moved(conv_to_attention(conv, alpha=1.0, learnable=True), 3)
    x = torch.randn(2, 2, 7, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda c, a: functional_call(layer, {"positions.center": c, "positions.log_alpha": a}, (x,)).square().sum(),
        (layer.positions.center.detach().clone().requires_grad_(), layer.positions.log_alpha.detach().clone()
         .requires_grad_()),
    )


def test_sharp_start_has_vanishing_position_gradients_soft_start_does_not():
    conv = nn.Conv2d(3, 3, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    grads = {}
    for alpha in (2.0, None):
        layer = conv_to_attention(conv, alpha=alpha, learnable=True)
        layer(x).square().sum().backward()
        grads[alpha] = layer.positions.center.grad.abs().max().item()
    assert grads[None] < 1e-5 * grads[2.0] and grads[2.0] > 1e-3


def test_error_bound_of_an_unmoved_float32_layer_is_the_construction_bound():
    conv = nn.Conv2d(2, 3, 3, padding=1)
    x = torch.randn(1, 2, 6, 6)
    fixed, learnable = conv_to_attention(conv), conv_to_attention(conv, learnable=True)
    assert learnable.error_bound(x) == fixed.error_bound(x)
    assert (learnable(x) - conv(x)).abs().max().item() <= learnable.error_bound(x) + 1e-5


def test_error_bound_refuses_once_the_heads_moved_and_analysis_sees_the_trained_widths():
    conv = nn.Conv2d(2, 2, 3, padding=1)
    layer = _moved(conv_to_attention(conv, alpha=2.0, learnable=True), 1)
    with pytest.raises(AttnconvError, match="no longer a convolution"):
        layer.error_bound(torch.randn(1, 2, 5, 5))
    result = analyze_layer(layer, (6, 6))
    alphas = [h["alpha"] for h in result["heads"]]
    np.testing.assert_allclose(alphas, layer.widths.detach().double().numpy(), rtol=1e-6)
    centers = [h["center"] for h in result["heads"]]
    np.testing.assert_allclose(centers, layer.centers.detach().double().numpy(), rtol=1e-6)


def test_positions_take_no_weight_decay_and_follow_dtype_and_state_dict():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, stride=2))
    attn = cnn_to_attention(model, alpha=1.5, learnable=True)
    assert {n for n in no_weight_decay(attn)} == {
        "0.positions.center", "0.positions.log_alpha", "2.positions.center", "2.positions.log_alpha"}
    assert set(attn.state_dict()) >= {"0.out_weight", "0.positions.center", "2.positions.log_alpha"}
    torch.testing.assert_close(attn[0].widths, torch.full((9,), 1.5))
    assert attn.double()[0].positions.center.dtype == torch.float64
    from attnconv.train import TrainConfig

    opt = make_optimizer(attn, TrainConfig(model="resnet18", dataset="fashion-mnist", weight_decay=0.1))
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(attn[0].positions.center) not in decay and id(attn[0].out_weight) in decay


# ---------------------------------------------------------------- attnconv train --init-from


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_random_fashion(tmp_path_factory.mktemp("fmnist-init"), 96, 48, seed=2)


@pytest.fixture(scope="module")
def cnn_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("runs") / "cnn"
    assert main(["train", "--model", "resnet18", "--width", "4", "--dataset", "fashion-mnist", "--data-dir",
                 str(data_dir), "--epochs", "1", "--batch-size", "32", "--workers", "1", "--no-progress",
                 "--out", str(out)]) == 0
    return out


def _common(data_dir, out):
    return ["--data-dir", str(data_dir), "--batch-size", "32", "--workers", "1", "--no-progress", "--out", str(out)]


def test_init_from_trains_the_cnn_further_as_attention(cnn_run, data_dir, tmp_path, capsys):
    out = tmp_path / "attn"
    assert main(["train", "--init-from", str(cnn_run), "--init-alpha", "3", "--max-steps", "2", "--lr", "0.01",
                 *_common(data_dir, out)]) == 0
    capsys.readouterr()
    meta = json.loads((out / "config.json").read_text())
    assert meta["config"]["init_from"] == {"run": str(cnn_run), "alpha": 3.0, "fold_bn": False}
    assert meta["config"]["model"] == "resnet18" and meta["config"]["model_overrides"]["width"] == 4
    assert meta["config"]["lr"] == 0.01

    model, config = load_run(out)
    layers = [m for m in model.modules() if isinstance(m, LearnableConvAttention)]
    assert len(layers) == 20 and not any(isinstance(m, nn.Conv2d) for m in model.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # kept (trained) by default
    # the heads trained: they left the taps and alpha 3 (the CNN's weights were the start)
    assert any(not torch.equal(m.centers, ConvAttention.centers.fget(m).float()) for m in layers if m.heads > 1)
    assert any(not torch.allclose(m.widths, torch.full_like(m.widths, 3.0)) for m in layers)

    # starting point: the CNN's weights with heads on the taps
    cnn, _ = load_run(cnn_run)
    start = cnn_to_attention(cnn, alpha=3.0, learnable=True)
    torch.manual_seed(0)
    from attnconv.train import build_run_model

    built = build_run_model(config, source_weights=True)
    for name, tensor in start.state_dict().items():
        torch.testing.assert_close(built.state_dict()[name], tensor, msg=name)

    assert main(["eval", str(out), "--data-dir", str(data_dir)]) == 0
    assert "from CNN" in capsys.readouterr().out


def test_init_from_resumes_without_the_source_run(cnn_run, data_dir, tmp_path, capsys):
    import shutil

    src = tmp_path / "src"
    shutil.copytree(cnn_run, src)
    out = tmp_path / "attn"
    assert main(["train", "--init-from", str(src), "--epochs", "2", "--max-steps", "4", *_common(data_dir, out)]) == 0
    first = json.loads((out / "config.json").read_text())["config"]
    assert first["init_from"]["alpha"] == 3.0  # the default
    shutil.rmtree(src)
    assert main(["train", "--resume", *_common(data_dir, out)]) == 0
    capsys.readouterr()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "fmnist-sa-quadratic"], "--preset: with --init-from"),
        (["--width", "8"], "--width: with --init-from"),
        (["--init-alpha", "0"], "--init-alpha 0"),
        (["--init-alpha", "nan"], "--init-alpha nan"),
    ],
)
def test_init_from_bad_requests_are_one_clear_error(cnn_run, data_dir, tmp_path, capsys, args, message):
    out = tmp_path / "attn"
    assert main(["train", "--init-from", str(cnn_run), *args, "--max-steps", "1", *_common(data_dir, out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (out / "config.json").exists()


def test_init_from_needs_a_cnn_run(cnn_run, data_dir, tmp_path, capsys):
    out = tmp_path / "x"
    assert main(["train", "--init-from", str(tmp_path / "missing"), *_common(data_dir, out)]) == 2
    assert "not a run directory" in capsys.readouterr().err
    converted = tmp_path / "converted"
    assert main(["convert", str(cnn_run), "--out", str(converted), "--data-dir", str(data_dir)]) == 0
    capsys.readouterr()
    assert main(["train", "--init-from", str(converted), "--max-steps", "1", *_common(data_dir, out)]) == 2
    assert "already an attention network" in capsys.readouterr().err
    sa = tmp_path / "sa"
    assert main(["train", "--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4",
                 "--intermediate", "8", "--downsample", "4", "--dataset", "fashion-mnist", "--max-steps", "1",
                 *_common(data_dir, sa)]) == 0
    capsys.readouterr()
    assert main(["train", "--init-from", str(sa), "--max-steps", "1", *_common(data_dir, out)]) == 2
    assert "no convolution to start from" in capsys.readouterr().err
    assert main(["train", "--model", "resnet18", "--dataset", "fashion-mnist", "--init-alpha", "2",
                 *_common(data_dir, out)]) == 2
    assert "go with --init-from" in capsys.readouterr().err
    assert not (out / "config.json").exists()


def test_an_image_pixel_is_placed_on_each_strided_layers_grid():
    from attnconv.analysis import converted_query

    layer = conv_to_attention(nn.Conv2d(1, 2, 3, stride=2, padding=1))
    q, pos = converted_query(layer, (28, 28), (28, 28), 20, 9)  # output grid 14x14
    assert q == 10 * 14 + 4 and pos == (20, 8)
    q, pos = converted_query(layer, (14, 14), (28, 28), 27, 0)  # a later layer: 14x14 -> 7x7
    assert q == 6 * 7 + 0 and pos == (12, 0)


def test_init_from_with_fold_bn_trains_without_batchnorms(cnn_run, data_dir, tmp_path, capsys):
    out = tmp_path / "folded"
    assert main(["train", "--init-from", str(cnn_run), "--fold-bn", "--max-steps", "1", "--lr", "0.001",
                 *_common(data_dir, out)]) == 0
    capsys.readouterr()
    model, config = load_run(out)
    assert config.init_from["fold_bn"] is True
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert sum(isinstance(m, LearnableConvAttention) for m in model.modules()) == 20
