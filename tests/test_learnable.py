"""LearnableConvAttention: Theorem 1's layer with trainable head centers and widths (and
optionally content attention), and `attnconv train --init-from`, which trains a converted
CNN further as attention."""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from fixtures_data import write_random_fashion
from fixtures_runs import unrecord
from test_construct import _random_case, rel
from torch import nn
from torch.func import functional_call
from torch.nn import functional as F

from attnconv.analysis import analyze_layer
from attnconv.cli import main
from attnconv.construct import (
    ConvAttention,
    LearnableConvAttention,
    cnn_to_attention,
    conv_to_attention,
    effective_kernel,
)
from attnconv.errors import AttnconvError
from attnconv.models import no_weight_decay
from attnconv.runs import load_run
from attnconv.training import make_optimizer


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
        s = -layer.alphas[h] * (d - layer.centers[h]).square().sum(-1)
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
    np.testing.assert_allclose(alphas, layer.alphas.detach().double().numpy(), rtol=1e-6)
    centers = [h["center"] for h in result["heads"]]
    np.testing.assert_allclose(centers, layer.centers.detach().double().numpy(), rtol=1e-6)


def test_positions_take_no_weight_decay_and_follow_dtype_and_state_dict():
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 3, stride=2))
    attn = cnn_to_attention(model, alpha=1.5, learnable=True)
    assert {n for n in no_weight_decay(attn)} == {
        "0.positions.center", "0.positions.log_alpha", "2.positions.center", "2.positions.log_alpha"}
    assert set(attn.state_dict()) >= {"0.out_weight", "0.positions.center", "2.positions.log_alpha"}
    torch.testing.assert_close(attn[0].alphas, torch.full((9,), 1.5))
    assert attn.double()[0].positions.center.dtype == torch.float64
    from attnconv.config import TrainConfig

    opt = make_optimizer(attn, TrainConfig(model="resnet18", dataset="fashion-mnist", weight_decay=0.1))
    decay = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert id(attn[0].positions.center) not in decay and id(attn[0].out_weight) in decay


# ---------------------------------------------------------------- content attention


def _with_content(layer: LearnableConvAttention, seed: int) -> LearnableConvAttention:
    """Turn the content score on (as training would): random query weights and bias."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in (layer.query.weight, layer.query.bias):
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return layer


def _naive_probs(layer: LearnableConvAttention, x: torch.Tensor) -> torch.Tensor:
    """softmax over the padded grid of -alpha_h ||k - q - Delta_h||^2 + q_h(x_q) . k_h(x_k) / sqrt(d), head by
    head and query by query from the definitions, then each padding token's probability moved to the pixel
    it holds (dropped for zero padding): (B, heads, T_out, T_in)."""
    size = tuple(x.shape[2:])
    z = layer._pad(x)  # (B, C, *P), F.pad: independent of the layer's own index bookkeeping
    padded = tuple(z.shape[2:])
    keys = torch.stack(torch.meshgrid(*[torch.arange(n) for n in padded], indexing="ij"), -1).reshape(-1, len(size))
    pad_lo = torch.tensor([lo for lo, _ in layer.padding])
    queries = layer.query_positions(size) + pad_lo  # on the padded grid
    tokens = z.flatten(2).transpose(1, 2)  # (B, P, C)
    strides = torch.tensor([math.prod(padded[a + 1 :]) for a in range(len(padded))])  # row-major
    q_tok = tokens[:, queries @ strides]
    d = layer.key_dim
    qc = layer.query(q_tok).unflatten(-1, (layer.heads, d))  # (B, T_out, heads, d)
    kc = layer.key(tokens).unflatten(-1, (layer.heads, d))  # (B, P, heads, d)
    content = torch.einsum("bqhd,bkhd->bhqk", qc, kc) / d ** 0.5
    diff = keys[None, None].double() - queries[None, :, None].double() - layer.centers.double()[:, None, None]
    position = -layer.alphas.double()[:, None, None] * diff.square().sum(-1)  # (heads, T_out, P)
    probs = torch.softmax(position[None] + content, -1)
    # where each padding token's value comes from: run F.pad on a tensor of pixel indices
    index = torch.arange(1, x[0, 0].numel() + 1, dtype=torch.float64).reshape(1, 1, *size)
    src = layer._pad(index).reshape(-1).long() - 1  # -1: a zero padding token
    out = torch.zeros(*probs.shape[:-1], x[0, 0].numel(), dtype=probs.dtype)
    out.index_add_(-1, src[src >= 0], probs[..., src >= 0])
    return out


@pytest.mark.parametrize("seed", range(2, 80, 5))
def test_content_starts_as_the_position_only_layer(seed):
    """The query projection starts at zero: adding content changes nothing until training moves it."""
    conv, x, _ = _random_case(seed, torch.float32)
    plain = _moved(conv_to_attention(conv, alpha=1.5, learnable=True), seed)
    content = conv_to_attention(conv, alpha=1.5, learnable=True, key_dim=3)
    content.load_state_dict(plain.state_dict(), strict=False)
    assert not content.position_only and content.query.weight.abs().sum() == 0
    # float32: the positional terms folded into the dot product round at ~1e-7 of their size
    assert rel(content(x), plain(x)) <= 2e-5


@pytest.mark.parametrize("seed", range(3, 80, 5))
def test_content_layer_computes_the_softmax_of_position_plus_content(seed):
    """forward == sum_h P_h x W_h, and attention_probs == the softmax written out from the definitions."""
    conv, x, _ = _random_case(seed, torch.float64)
    layer = _with_content(_moved(conv_to_attention(conv, alpha=0.9, learnable=True, key_dim=2), seed), seed)
    with torch.no_grad():
        probs = layer.attention_probs(x)  # (B, heads, T_out, T_in)
        torch.testing.assert_close(probs, _naive_probs(layer, x), rtol=1e-10, atol=1e-12)
        maps, bias = layer.value_maps()
        want = torch.einsum("bhqk,hoc,bck->boq", probs, maps, x.flatten(2)) + bias[:, None]
        assert rel(layer(x).flatten(2), want) <= 1e-10
    assert probs.shape[0] == x.shape[0]
    if probs.shape[-1] > 1:  # one map per input (with one key, every map is 1)
        assert not torch.allclose(probs[0], probs[-1])


def test_a_non_finite_pixel_spoils_every_output_of_its_image_in_a_content_layer_as_documented():
    """Its key enters every query's softmax, whose probabilities every channel shares: with
    groups=2 and the bad value in group 0, group 1 of that image is non-finite too (unlike a
    position-only layer); the other image is untouched."""
    conv = nn.Conv2d(4, 4, 3, padding=1, groups=2, dtype=torch.float64)
    layer = _with_content(conv_to_attention(conv, alpha=1.5, learnable=True, key_dim=2), 0)
    x = torch.randn(2, 4, 6, 5, dtype=torch.float64)
    clean = layer(x)
    x[0, 0, 2, 2] = float("nan")
    with torch.no_grad():
        y = layer(x)
    assert (~y[0].isfinite()).all()
    assert rel(y[1], clean[1]) <= 1e-12


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_precision_content_layer_runs_and_agrees_with_its_float32_copy(dtype):
    """Half-precision layers (no autocast) compute their scores in float32, as position-only layers do."""
    conv = nn.Conv2d(3, 4, 3, padding=1, dtype=dtype)
    layer = _with_content(_moved(conv_to_attention(conv, alpha=1.2, learnable=True, key_dim=4), 5), 5)
    wide = copy.deepcopy(layer).float()
    x = torch.randn(2, 3, 7, 6, dtype=dtype)
    with torch.no_grad():
        out = layer(x)
        assert out.dtype == dtype and rel(out.float(), wide(x.float())) <= 2e-2
        probs = layer.attention_probs(x)
        assert probs.dtype == dtype
        torch.testing.assert_close(probs.float(), wide.attention_probs(x.float()), atol=1e-2, rtol=0)
        scores = layer.padded_scores(x)
        assert scores["content"].dtype == torch.float32


def test_sdpa_inputs_are_padded_to_widths_the_fused_kernels_take():
    from attnconv.construct.learnable import pad_for_fused_sdpa

    q, k, v = torch.randn(2, 3, 5, 7), torch.randn(2, 3, 9, 7), torch.randn(2, 3, 9, 1)
    cpu = pad_for_fused_sdpa(q, k, v)
    assert [t.shape[-1] for t in cpu] == [7, 7, 7]
    want = F.scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(F.scaled_dot_product_attention(*cpu, scale=1.0)[..., :1], want)  # other kernel
    meta = pad_for_fused_sdpa(*(t.to("meta") for t in (q, k, v)))  # any non-CPU device: multiples of 8
    assert [t.shape[-1] for t in meta] == [8, 8, 8]
    wide = pad_for_fused_sdpa(*(torch.empty(1, 1, 2, n, device="meta") for n in (16, 16, 20)))
    assert [t.shape[-1] for t in wide] == [16, 16, 24]


def test_dense_scores_and_probabilities_of_a_content_layer_are_refused_when_too_large(monkeypatch):
    import attnconv.construct.learnable as learnable

    layer = conv_to_attention(nn.Conv2d(2, 2, 3, padding=1), learnable=True, key_dim=2)
    x = torch.randn(2, 2, 4, 4)  # 2 inputs x 9 heads x 16 queries x 36 padded tokens = 10368 entries
    monkeypatch.setattr(learnable, "MAX_DENSE", 10367)
    for compute in (layer.padded_scores, layer.attention_scores, layer.attention_probs):
        with pytest.raises(AttnconvError, match="10368 entries; pass fewer inputs"):
            compute(x)
        compute(x[:1])  # one input fits


def test_content_gradients_match_finite_differences():
    conv = nn.Conv2d(2, 3, 3, stride=2, padding=1, padding_mode="reflect", dtype=torch.float64)
    layer = _with_content(_moved(conv_to_attention(conv, alpha=1.0, learnable=True, key_dim=2), 4), 4)
    x = torch.randn(2, 2, 5, 6, dtype=torch.float64)
    names = ("positions.center", "positions.log_alpha", "query.weight", "key.weight", "key.bias")
    params = dict(layer.named_parameters())
    assert torch.autograd.gradcheck(
        lambda *ts: functional_call(layer, dict(zip(names, ts)), (x,)).square().sum(),
        tuple(params[n].detach().clone().requires_grad_() for n in names),
    )


def test_a_fresh_content_layer_can_learn_content_and_keeps_the_bound_until_it_does():
    conv = nn.Conv2d(3, 4, 3, padding=1)
    layer = conv_to_attention(conv, alpha=2.0, learnable=True, key_dim=4)
    x = torch.randn(2, 3, 6, 6)
    layer(x).square().sum().backward()
    assert layer.query.weight.grad.abs().max() > 1e-4  # zero start, non-zero gradient
    assert layer.key.weight.grad.abs().max() == 0  # (keys only matter once queries do)
    fixed = conv_to_attention(conv, alpha=2.0)
    assert layer.error_bound(x) == fixed.error_bound(x)
    _with_content(layer, 0)
    with pytest.raises(AttnconvError, match="content attention is no longer zero"):
        layer.error_bound(x)
    assert "key_dim=4" in repr(layer)


def test_content_options_are_checked_and_1x1_convs_stay_position_only():
    conv = nn.Conv2d(2, 2, 3, padding=1)
    with pytest.raises(AttnconvError, match="pass learnable=True"):
        conv_to_attention(conv, key_dim=4)
    with pytest.raises(AttnconvError, match="key_dim must be an integer >= 0"):
        conv_to_attention(conv, learnable=True, key_dim=-1)
    with pytest.raises(AttnconvError, match="pass learnable=True"):
        cnn_to_attention(nn.Sequential(conv), key_dim=4)
    with pytest.raises(AttnconvError, match="key_dim must be an integer >= 0"):  # the value first
        conv_to_attention(conv, key_dim=-1)
    with pytest.raises(AttnconvError, match="key_dim must be an integer >= 0"):  # even with no layer to use it
        cnn_to_attention(nn.Sequential(nn.Conv2d(2, 2, 1)), learnable=True, key_dim=-3)
    model = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Conv2d(4, 2, 1))
    attn = cnn_to_attention(model, alpha=2.0, learnable=True, key_dim=5)
    assert attn[0].key_dim == 5 and not attn[0].position_only
    assert attn[1].key_dim == 0 and attn[1].position_only and not hasattr(attn[1], "query")
    layer = attn[0]
    with pytest.raises(AttnconvError, match="needs the input x"):
        layer.attention_probs(size=(5, 5))
    with pytest.raises(AttnconvError, match="unknown score term"):
        layer.attention_probs(torch.randn(1, 1, 5, 5), term="both")
    with pytest.raises(AttnconvError, match="no content attention"):
        attn[1].attention_probs(size=(5, 5), term="content")
    with pytest.raises(AttnconvError, match="content attention"):
        effective_kernel(layer, 5, 5)
    x = torch.randn(3, 1, 5, 5)
    with pytest.raises(AttnconvError, match=r"size \(4, 4\) does not match the input's \(5, 5\)"):
        layer.attention_probs(x, size=(4, 4))
    assert torch.equal(layer.attention_probs(x, size=(5, 5)), layer.attention_probs(x))
    avg = layer.attention_probs(x).mean(0)
    ek = effective_kernel(layer, 5, 5, probs=avg)  # the mean over inputs: a position-only layer
    assert ek.probs.shape == (9, 25, 25)


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
    assert meta["config"]["init_from"] == {"run": str(cnn_run), "alpha": 3.0, "fold_bn": False, "content": 0}
    assert meta["config"]["model"] == "resnet18" and meta["config"]["model_overrides"]["width"] == 4
    assert meta["config"]["lr"] == 0.01

    model, config = load_run(out)
    layers = [m for m in model.modules() if isinstance(m, LearnableConvAttention)]
    assert len(layers) == 20 and not any(isinstance(m, nn.Conv2d) for m in model.modules())
    assert any(isinstance(m, nn.BatchNorm2d) for m in model.modules())  # kept (trained) by default
    # the heads trained: they left the taps and alpha 3 (the CNN's weights were the start)
    assert any(not torch.equal(m.centers, ConvAttention.centers.fget(m).float()) for m in layers if m.heads > 1)
    assert any(not torch.allclose(m.alphas, torch.full_like(m.alphas, 3.0)) for m in layers)

    # starting point: the CNN's weights with heads on the taps
    cnn, _ = load_run(cnn_run)
    start = cnn_to_attention(cnn, alpha=3.0, learnable=True)
    torch.manual_seed(0)
    from attnconv.runs import build_run_model

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


@pytest.mark.parametrize("saved", [{}, {"content": 0}], ids=["no-content-key", "content-0"])
def test_init_from_runs_of_either_config_form_resume_with_their_own_command(
    cnn_run, data_dir, tmp_path, capsys, saved
):
    """Runs written before --init-content had no "content" key, later ones "content": 0; both mean none."""
    out = tmp_path / "attn"
    command = ["train", "--init-from", str(cnn_run), "--epochs", "2", "--max-steps", "2", *_common(data_dir, out)]
    assert main(command) == 0
    record = json.loads((out / "config.json").read_text())
    record["config"]["init_from"].pop("content", None)
    record["config"]["init_from"].update(saved)
    (out / "config.json").write_text(json.dumps(record))
    unrecord(out)  # as written then: its weights record nothing of config.json
    assert main([*command, "--resume"]) == 0, capsys.readouterr().err
    assert "different config" not in capsys.readouterr().err


def test_init_from_resumes_with_the_cnn_run_named_by_a_link(cnn_run, data_dir, tmp_path, capsys):
    """`--resume --init-from LINK` naming the run's own CNN run through a link is the same config (it was compared
    as a path: 'different config (init_from: ...)'); another CNN run, or another alpha, is a difference."""
    import shutil

    out = tmp_path / "attn"
    command = ["train", "--epochs", "2", "--max-steps", "2", *_common(data_dir, out)]
    assert main(["train", "--init-from", str(cnn_run), *command[1:]]) == 0
    (tmp_path / "link").symlink_to(cnn_run)
    other = tmp_path / "other"
    shutil.copytree(cnn_run, other)
    capsys.readouterr()
    assert main(["train", "--init-from", str(tmp_path / "link"), "--resume", *command[1:]]) == 0
    assert "different config" not in capsys.readouterr().err
    for flags in (["--init-from", str(other)], ["--init-from", str(tmp_path / "link"), "--init-alpha", "2"]):
        assert main(["train", *flags, "--resume", *command[1:]]) == 2
        assert "different config (init_from: " in capsys.readouterr().err


def test_attention_lr_scale_multiplies_the_first_step_of_positions_and_content_only(cnn_run, data_dir, tmp_path):
    """SGD's first step is lr * grad (momentum starts at the gradient): with --attention-lr-scale 10 the
    centers, widths and content query/key move exactly 10x as far, every other weight the same."""
    from attnconv.models import attention_placement
    from attnconv.runs import build_run_model

    moved = {}
    for scale in ("1", "10"):
        out = tmp_path / f"scale-{scale}"
        assert main(["train", "--init-from", str(cnn_run), "--init-alpha", "1.5", "--init-content", "2",
                     "--attention-lr-scale", scale, "--max-steps", "1", *_common(data_dir, out)]) == 0
        model, config = load_run(out)
        torch.manual_seed(config.seed)  # as train does: the same random content keys
        start = build_run_model(config, source_weights=True).state_dict()
        moved[scale] = {n: t - start[n] for n, t in model.state_dict().items() if t.is_floating_point()}
        if scale == "10":
            groups = make_optimizer(model, config).param_groups
            assert sorted(g["lr_scale"] for g in groups) == [1.0, 10.0, 10.0]  # rest; positions; query, key
    placed = attention_placement(model)
    assert any(".positions.center" in n for n in placed) and any(".query.weight" in n for n in placed)
    assert not any("value" in n or "out_weight" in n for n in placed)
    for name, delta in moved["1"].items():  # atol: float32 rounding of (w + delta) - w at |w| ~ 1, times 10
        if name in placed and delta.abs().max() > 0:
            torch.testing.assert_close(moved["10"][name], 10 * delta, rtol=1e-3, atol=1e-6, msg=name)
        elif name.endswith(("weight", "bias")) and "running" not in name:
            torch.testing.assert_close(moved["10"][name], delta, rtol=1e-3, atol=1e-6, msg=name)
    assert moved["1"][next(n for n in placed if n.endswith("query.weight"))].abs().max() > 0


def test_attention_lr_scale_is_refused_where_there_is_nothing_to_scale(cnn_run, data_dir, tmp_path, capsys):
    out = tmp_path / "cnn2"
    args = ["train", "--model", "resnet18", "--width", "4", "--dataset", "fashion-mnist", "--max-steps", "1"]
    assert main([*args, "--attention-lr-scale", "3", *_common(data_dir, out)]) == 2
    err = capsys.readouterr().err
    assert "--attention-lr-scale 3.0 is invalid: model 'resnet18' has no attention centers" in err and not out.exists()
    assert main([*args, "--attention-lr-scale", "0", *_common(data_dir, out)]) == 2
    assert "--attention-lr-scale 0.0 is out of range" in capsys.readouterr().err and not out.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "fmnist-sa-quadratic"], "--preset: with --init-from"),
        (["--width", "8"], "--width: with --init-from"),
        (["--init-alpha", "0"], "--init-alpha 0"),
        (["--init-alpha", "nan"], "--init-alpha nan"),
        (["--init-content", "-1"], "--init-content -1"),
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
    assert f"error: --init-from {converted}: is already an attention network" in capsys.readouterr().err
    sa = tmp_path / "sa"
    assert main(["train", "--model", "sa-quadratic", "--hidden", "8", "--layers", "1", "--heads", "4",
                 "--intermediate", "8", "--downsample", "4", "--dataset", "fashion-mnist", "--max-steps", "1",
                 *_common(data_dir, sa)]) == 0
    capsys.readouterr()
    assert main(["train", "--init-from", str(sa), "--max-steps", "1", *_common(data_dir, out)]) == 2
    assert f"error: --init-from {sa}: model 'sa-quadratic' has no convolution to start from" in capsys.readouterr().err
    assert main(["train", "--model", "resnet18", "--dataset", "fashion-mnist", "--init-alpha", "2",
                 *_common(data_dir, out)]) == 2
    assert "go with --init-from" in capsys.readouterr().err
    assert not (out / "config.json").exists()


def test_an_image_pixel_is_placed_on_each_strided_layers_grid():
    from attnconv.models.sites import AttentionSite, query_on_site

    layer = conv_to_attention(nn.Conv2d(1, 2, 3, stride=2, padding=1))
    q, pos = query_on_site(AttentionSite("c", layer, (28, 28)), (28, 28), 20, 9)  # output grid 14x14
    assert q == 10 * 14 + 4 and pos == (20, 8)
    q, pos = query_on_site(AttentionSite("c", layer, (14, 14)), (28, 28), 27, 0)  # later: 14x14 -> 7x7
    assert q == 6 * 7 + 0 and pos == (12, 0)


def test_init_from_with_fold_bn_trains_without_batchnorms(cnn_run, data_dir, tmp_path, capsys):
    out = tmp_path / "folded"
    assert main(["train", "--init-from", str(cnn_run), "--fold-bn", "--max-steps", "1", "--lr", "0.001",
                 *_common(data_dir, out)]) == 0
    capsys.readouterr()
    model, config = load_run(out)
    assert config.init_from.fold_bn is True
    assert not any(isinstance(m, nn.BatchNorm2d) for m in model.modules())
    assert sum(isinstance(m, LearnableConvAttention) for m in model.modules()) == 20


@pytest.fixture
def content_run(tmp_path, cnn_run, data_dir):
    out = tmp_path / "content"
    assert main(["train", "--init-from", str(cnn_run), "--init-content", "4", "--init-alpha", "2", "--max-steps", "2",
                 "--lr", "0.1", "--data-dir", str(data_dir), "--batch-size", "8", "--workers", "1", "--no-progress",
                 "--out", str(out)]) == 0
    return out


def test_init_content_trains_content_attention_that_analyze_plot_report_and_explore_show(
    content_run, cnn_run, data_dir, tmp_path, capsys
):
    """One run (content attention is the costly part): trained, then read by every command over real inputs."""
    from attnconv.explorer.server import Explorer
    from attnconv.models.sites import query_on_site, site_inputs, site_probs
    from attnconv.runs import Run

    capsys.readouterr()
    meta = json.loads((content_run / "config.json").read_text())
    assert meta["config"]["init_from"] == {"run": str(cnn_run), "alpha": 2.0, "fold_bn": False, "content": 4}
    model, _ = load_run(content_run)
    layers = [m for m in model.modules() if isinstance(m, LearnableConvAttention)]
    kxk = [m for m in layers if m.heads > 1]
    assert len(kxk) == 17 and all(m.key_dim == 4 and not m.position_only for m in kxk)
    assert all(m.position_only for m in layers if m.heads == 1)  # the 1x1 shortcuts
    assert any(m.query.weight.abs().max() > 0 for m in kxk)  # content was trained in from zero
    assert main(["eval", str(content_run)]) == 0
    assert "resnet18 (attention + content, from CNN)" in capsys.readouterr().out

    run = Run(content_run, data_dir=data_dir)
    model, sites = run.model, run.sites
    _, x = run.test_images(3)
    probs = site_probs(model, sites, x, batch_size=2)  # two batches: the mean must weigh them right
    inputs = site_inputs(model, sites, x)
    for site, p, inp in zip(sites, probs, inputs):
        assert inp.shape[-2:] == site.size
        torch.testing.assert_close(p, site.layer.attention_probs(inp).mean(0), rtol=1e-5, atol=1e-7)
    with pytest.raises(AttnconvError, match="give test images"):
        site_probs(model, sites)

    capsys.readouterr()
    assert main(["analyze", str(content_run), "--images", "3", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["images"] == 3 and "mean over 3 test images" in result["layers"][0]["probabilities"]
    for name in (["plot", "centers", "--images", "2"], ["plot", "maps", "--image", "1"]):
        assert main([*name, str(content_run)]) == 0
    assert (content_run / "centers.png").stat().st_size > 0 and (content_run / "maps-image-1.png").exists()
    assert main(["report", str(content_run), "--images", "2", "--out", str(tmp_path / "r.html")]) == 0
    text = (tmp_path / "r.html").read_text()
    assert "content attention with 4 query/key channels per head" in text and "mean over 2 test images" in text
    capsys.readouterr()

    explorer = Explorer(content_run, images=3)
    assert explorer.info()["encoding"] == "converted convolution + content"
    assert explorer.terms == ("combined", "content", "position")
    own = site_inputs(model, sites, explorer.x[2:3])
    for mode, term in (("probs", "combined"), ("scores", "content"), ("probs", "position")):
        result = explorer.attention(2, 20, 9, mode=mode, term=term)
        for n, site in enumerate(sites):
            layer, size = site.layer, site.size
            q = result["queries"][n]
            oh, ow = layer.output_size(size)
            qi = min(oh - 1, 20 * oh // 28) * ow + min(ow - 1, 9 * ow // 28)
            if mode == "probs":
                want = layer.attention_probs(own[n], term=term)[0, :, qi]
            else:
                want = layer.attention_scores(own[n])[term][0, :, qi]
            np.testing.assert_allclose(result["layers"][n], want.detach().numpy(), rtol=1e-5, atol=1e-6)
            assert tuple(q) == query_on_site(site, (28, 28), 20, 9)[1]
    # content makes the maps depend on the image
    assert explorer.attention(0, 20, 9)["layers"][0] != explorer.attention(2, 20, 9)["layers"][0]
    explorer.layers[1].position_only = True  # as a position-only layer in a content model: no content term
    try:
        for mode in ("probs", "scores"):
            shown = explorer.attention(2, 20, 9, mode=mode, term="content")["layers"]
            assert all(v is None for head in shown[1] for v in head)
            assert all(v is not None for head in shown[0] for v in head)
    finally:
        explorer.layers[1].position_only = False

    # the page: pick image 2 and the content term; it shows the layer's own content scores
    import threading

    from test_explorer import _chromium_page, _max_readout

    from attnconv.explorer.server import make_server

    server = make_server(explorer, port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with _chromium_page(f"http://127.0.0.1:{server.server_address[1]}/") as (page, errors):
            page.wait_for_selector('#maps[data-status="ready"][data-image="0"][data-query="14,14"]')
            page.click("#thumb-2")
            page.check('input[name="mode"][value="scores"]')
            page.check('input[name="term"][value="content"]')
            page.wait_for_selector(
                '#maps[data-status="ready"][data-image="2"][data-mode="scores"][data-term="content"]')
            shown = page.evaluate("window.__lastAttention")
            layer, first = 0, sites[0].layer
            want = first.attention_scores(own[0])["content"][0, :, shown["i"] * 28 + shown["j"]].detach()
            np.testing.assert_allclose(np.array(shown["layers"][layer]), want.numpy(), rtol=1e-5, atol=1e-6)
            value, _ = _max_readout(page, layer, 4)
            assert abs(value - float(want[4].max())) <= 1e-5 * max(1.0, abs(value))
            explorer.layers[1].position_only = True  # a layer without the term says so
            try:
                page.check('input[name="mode"][value="probs"]')
                page.wait_for_selector(
                    '#maps[data-status="ready"][data-image="2"][data-mode="probs"][data-term="content"]')
                assert page.text_content("#map-1-0 figcaption") == "no content term in this layer"
                assert page.text_content("#map-0-0 figcaption").startswith("max ")
            finally:
                explorer.layers[1].position_only = False
            assert not errors, errors
    finally:
        server.shutdown()
        server.server_close()


def test_an_init_from_config_written_before_content_attention_still_loads():
    from attnconv.config import InitFrom, TrainConfig

    old = {"run": "runs/cnn", "alpha": 3.0, "fold_bn": False}  # no "content" key
    base = TrainConfig(model="resnet18", dataset="fashion-mnist").to_dict()
    config = TrainConfig.from_dict({**base, "init_from": old})
    assert config.init_from == InitFrom(run="runs/cnn", alpha=3.0, fold_bn=False, content=0)
    config.validate()
    with pytest.raises(AttnconvError, match="field init_from has keys"):
        TrainConfig.from_dict({**base, "init_from": {**old, "heads": 2}})
