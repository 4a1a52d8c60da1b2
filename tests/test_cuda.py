"""On a CUDA device: the layer's paths, the conversion, the models, the capture, training with its checkpoints and
resume, the Run API and the commands compute there what they compute on the CPU.

Skipped where torch sees no CUDA device (CI has none: these run on a GPU machine, by hand, see
benchmarks/RESULTS.md "On a GPU"). ATTNCONV_TEST_DEVICE=cpu runs them on the CPU, to check the tests themselves.
Float32 comparisons run with TF32 off (cuDNN's convolutions use TF32 by default, about 1e-3 off)."""

from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn as nn
from safetensors.torch import load_file
from test_train import data_dir, stop_after_checkpoint, tiny_args  # noqa: F401  (a fixture)

from attnconv import Run, build_model, capture_attention, cnn_to_attention, conv_to_attention, list_models
from attnconv.attention import SelfAttention2d
from attnconv.cli import main
from attnconv.positional import ENCODINGS
from attnconv.runs import load_state, read_heads, read_metrics

DEVICE = os.environ.get("ATTNCONV_TEST_DEVICE") or ("cuda" if torch.cuda.is_available() else None)
pytestmark = pytest.mark.skipif(DEVICE is None, reason="no CUDA device (set ATTNCONV_TEST_DEVICE=cpu to run on the CPU)")
PATHS = ("dense", "separable", "stacked", "fused", "sdpa")


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().cpu().double(), b.detach().cpu().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _paths(layer: SelfAttention2d) -> list[str]:
    return [i for i in PATHS if (i not in ("separable", "fused") or layer.separable)
            and (i not in ("stacked", "fused") or layer.stackable)]


def _randomized(layer: nn.Module) -> nn.Module:
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(torch.randn_like(p) * (0.3 if "widths" in name else 1.0))
    return layer


def _forward_backward(layer: nn.Module, x: torch.Tensor, upstream: torch.Tensor):
    layer.zero_grad()
    x = x.clone().requires_grad_()
    y = layer(x)
    (y * upstream).sum().backward()
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in layer.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("value", ["shared", "project"])
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_path_on_the_device_computes_the_cpus_values_and_gradients_in_float64(encoding, value):
    torch.manual_seed(0)
    cpu = _randomized(SelfAttention2d(5, 7, heads=3, encoding=encoding, value=value, max_size=9)).double()
    cpu.impl = "dense"
    x, up = torch.randn(2, 5, 4, 6, dtype=torch.float64), torch.randn(2, 7, 4, 6, dtype=torch.float64)
    y0, gx0, gp0 = _forward_backward(cpu, x, up)
    dev = _randomized(SelfAttention2d(5, 7, heads=3, encoding=encoding, value=value, max_size=9)).double().to(DEVICE)
    dev.load_state_dict(cpu.state_dict())
    for impl in _paths(dev) + ["auto"]:
        dev.impl = impl
        y, gx, gp = _forward_backward(dev, x.to(DEVICE), up.to(DEVICE))
        assert y.device.type == torch.device(DEVICE).type and y.dtype == torch.float64
        assert _rel(y, y0) < 1e-12 and _rel(gx, gx0) < 1e-10, impl
        for n, g in gp0.items():
            if n == "key.bias":  # zero in exact arithmetic (softmax's shift invariance)
                assert gp[n].abs().max() < 1e-10, impl
            else:
                assert _rel(gp[n], g) < 1e-9, (impl, n)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_float32_paths_on_the_device_agree_with_float64_on_a_grid_where_auto_runs_fused(encoding):
    """16x16 tokens: auto runs the fused path for the separable position-only encodings (its tiles on the device)."""
    torch.manual_seed(1)
    layer = _randomized(SelfAttention2d(16, 16, heads=4, encoding=encoding, max_size=16)).to(DEVICE)
    x = torch.randn(3, 16, 16, 16, device=DEVICE)
    up = torch.randn(3, 16, 16, 16, device=DEVICE)
    ref = layer.double()
    ref.impl = "dense"
    y64, gx64, _ = _forward_backward(ref, x.double(), up.double())
    layer.float()
    for impl in _paths(layer) + ["auto"]:
        layer.impl = impl
        y, gx, _ = _forward_backward(layer, x, up)
        assert y.dtype == torch.float32
        assert _rel(y, y64) < 1e-5 and _rel(gx, gx64) < 1e-4, impl


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_bf16_autocast_on_the_device_gives_the_cpus_dtypes_and_close_values(encoding):
    torch.manual_seed(2)
    layer = SelfAttention2d(8, 8, heads=3, encoding=encoding, max_size=16)
    x = torch.randn(2, 8, 12, 12)
    ref = layer(x)
    dev = SelfAttention2d(8, 8, heads=3, encoding=encoding, max_size=16).to(DEVICE)
    dev.load_state_dict(layer.state_dict())
    for impl in _paths(layer) + ["auto"]:
        layer.impl = dev.impl = impl
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y_cpu = layer(x)
        xd = x.to(DEVICE).requires_grad_()
        with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
            y = dev(xd)
            scores = dev.attention_scores(xd)["combined"]
        assert (y.dtype, scores.dtype) == (y_cpu.dtype, torch.float32), impl
        assert torch.isfinite(y).all() and _rel(y.float(), ref) < 5e-2, impl
        y.float().square().sum().backward()
        assert torch.isfinite(xd.grad).all(), impl


CONVS = [
    lambda: nn.Conv2d(3, 4, 3, padding=1),
    lambda: nn.Conv2d(4, 6, 5, stride=2, padding=2, dilation=1, groups=2, bias=False),
    lambda: nn.Conv2d(3, 3, 3, padding="same", dilation=2, padding_mode="reflect"),
    lambda: nn.Conv2d(2, 5, (3, 1), stride=(1, 2), padding=(1, 0), padding_mode="circular"),
    lambda: nn.Conv1d(3, 4, 5, padding=2),
    lambda: nn.Conv3d(2, 3, 3, padding=1),
]


@pytest.mark.parametrize("make", CONVS, ids=lambda m: repr(m()).split("(")[0] + str(CONVS.index(m)))
def test_a_converted_convolution_on_the_device_is_the_convolution_within_its_bound(make):
    torch.manual_seed(3)
    conv = make().double()
    attn = conv_to_attention(conv)
    shape = {1: (2, conv.in_channels, 11), 2: (2, conv.in_channels, 9, 7), 3: (2, conv.in_channels, 5, 4, 6)}
    x = torch.randn(*shape[conv.weight.dim() - 2], dtype=torch.float64)
    on_cpu = attn(x)
    loose = conv_to_attention(conv, alpha=4.0).to(DEVICE)  # the leakage well above rounding: the bound is tested
    conv, attn, xd = conv.to(DEVICE), attn.to(DEVICE), x.to(DEVICE)
    expected, got = conv(xd), attn(xd)
    assert got.device == expected.device and got.shape == expected.shape
    assert (got - expected).abs().max().item() < 1e-12  # the default alpha: exact to rounding
    assert _rel(got, on_cpu) < 1e-12
    assert 1e-6 < (loose(xd) - expected).abs().max().item() <= loose.error_bound(xd)
    if conv.weight.dim() == 4:  # a channels-last batch: the layout the device's convolution gives, in either dtype
        for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
            conv, attn = conv.to(dtype), attn.to(dtype)
            xl = xd.to(dtype).contiguous(memory_format=torch.channels_last)
            expected, got = conv(xl), attn(xl)
            assert (got - expected).abs().max().item() < tol, dtype
            cl = torch.channels_last
            assert got.is_contiguous(memory_format=cl) == expected.is_contiguous(memory_format=cl), dtype
            assert got.is_contiguous() == expected.is_contiguous(), dtype


@pytest.mark.parametrize("key_dim", [0, 4])
def test_a_learnable_layer_on_the_device_pads_once_and_lays_out_as_the_convolution(key_dim, monkeypatch):
    """Its forward pads the input once and hands that copy to the layout check (a reflect-padded convolution's
    layout is its padded copy's, which the device's padding kernel decides): no second padded copy per step."""
    from attnconv.construct.learnable import LearnableConvAttention

    torch.manual_seed(5)
    conv = nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect").to(DEVICE)
    attn = conv_to_attention(conv, learnable=True, key_dim=key_dim)
    calls = []
    pad = LearnableConvAttention._pad
    monkeypatch.setattr(LearnableConvAttention, "_pad", lambda self, x: calls.append(1) or pad(self, x))
    x = torch.randn(2, 3, 9, 7, device=DEVICE).contiguous(memory_format=torch.channels_last)
    got, expected = attn(x), conv(x)
    assert len(calls) == 1
    assert (got - expected).abs().max().item() < 1e-4
    assert got.is_contiguous() == expected.is_contiguous()


def test_a_converted_cnn_on_the_device_computes_the_cnn():
    torch.manual_seed(4)
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, stride=2),
                        nn.ReLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 10)).double().eval()
    converted = cnn_to_attention(cnn, fold_bn=True).to(DEVICE)
    cnn = cnn.to(DEVICE)
    x = torch.randn(4, 3, 16, 16, dtype=torch.float64, device=DEVICE)
    with torch.no_grad():
        assert _rel(converted(x), cnn(x)) < 1e-9


@pytest.mark.parametrize("name", list_models())
def test_every_model_on_the_device_computes_the_cpus_outputs_and_trains(name):
    torch.manual_seed(5)
    small = dict(width=4, image_size=16) if name.startswith("resnet") else \
        dict(hidden=16, heads=4, layers=2, intermediate=16, image_size=16)
    model = build_model(name, **small).double().eval()
    x = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    with torch.no_grad():
        ref = model(x)
        got = model.to(DEVICE)(x.to(DEVICE))
    assert _rel(got, ref) < 1e-10
    model.float().train()
    loss = nn.functional.cross_entropy(model(x.float().to(DEVICE)), torch.tensor([0, 1, 2], device=DEVICE))
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_captured_attention_on_the_device_is_the_cpus():
    torch.manual_seed(6)
    model = build_model("vit", in_channels=1, image_size=28, hidden=12, heads=3, layers=2, intermediate=16).eval()
    x = torch.randn(2, 1, 28, 28)
    on_cpu = capture_attention(model, x)
    on_dev = capture_attention(model.to(DEVICE), x.to(DEVICE))
    assert [(r.path, r.kind, r.size) for r in on_dev] == [(r.path, r.kind, r.size) for r in on_cpu]
    for a, b in zip(on_dev, on_cpu):
        assert _rel(a.probs, b.probs) < 1e-5


# --------------------------------------------------------------------------- runs trained on the device


def _device_args(out, data_dir, *extra) -> list[str]:  # noqa: F811
    return [*tiny_args(out, data_dir, "--device", DEVICE), *extra]


@pytest.fixture(scope="module")
def device_run(tmp_path_factory, data_dir):  # noqa: F811
    out = tmp_path_factory.mktemp("cuda") / "run"
    assert main(_device_args(out, data_dir, "--checkpoint-every", "5")) == 0
    return out


def _weights(run) -> dict[str, torch.Tensor]:
    return load_file(run / "model.safetensors")


def test_a_run_trained_on_the_device_reads_and_predicts_on_either_device(device_run, data_dir):  # noqa: F811
    config = json.loads((device_run / "config.json").read_text())["config"]
    assert config["device"] == DEVICE and len(read_metrics(device_run)) == 2 and len(read_heads(device_run)) == 3
    assert all(t.device.type == "cpu" for t in _weights(device_run).values())  # written from the host
    images = torch.randint(0, 256, (6, 1, 28, 28), dtype=torch.uint8)
    on_cpu, on_dev = Run(device_run).predict(images, top=10), Run(device_run, device=DEVICE).predict(images, top=10)
    for a, b in zip(on_cpu, on_dev):
        a, b = dict(a), dict(b)
        assert a.keys() == b.keys() and max(abs(a[c] - b[c]) for c in a) < 1e-4


def test_eval_on_the_device_and_on_the_cpu_agree(device_run, capsys):
    answers = []
    for device in (DEVICE, "cpu"):
        assert main(["eval", str(device_run), "--json", "--device", device]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert abs(answers[0]["test_acc"] - answers[1]["test_acc"]) <= 1 / 128  # one of 128 test images at most
    assert answers[0]["test_loss"] == pytest.approx(answers[1]["test_loss"], rel=1e-4)


def test_resume_on_the_device_replays_the_interrupted_run(tmp_path, data_dir, monkeypatch, device_run):  # noqa: F811
    stop_after_checkpoint(monkeypatch, 10)
    out = tmp_path / "run"
    assert main(_device_args(out, data_dir, "--checkpoint-every", "5")) == 130
    state = load_state(out / "state.pt")
    assert state["progress"]["step"] == 10
    assert (state["rng"]["cuda"] is not None) == (torch.device(DEVICE).type == "cuda")  # the device's generator kept
    monkeypatch.undo()
    assert main(_device_args(out, data_dir, "--checkpoint-every", "5", "--resume")) == 0
    ref, got = _weights(device_run), _weights(out)
    assert ref.keys() == got.keys()
    for k in ref:  # the same dropout draws after the resume: equal up to the device's nondeterministic sums
        assert _rel(got[k], ref[k]) < 1e-4, k
    assert [r["test_acc"] for r in read_metrics(out)] == [r["test_acc"] for r in read_metrics(device_run)]


def test_a_run_checkpointed_on_the_device_resumes_on_the_cpu(tmp_path, data_dir, monkeypatch):  # noqa: F811
    stop_after_checkpoint(monkeypatch, 5)
    out = tmp_path / "run"
    assert main(_device_args(out, data_dir, "--checkpoint-every", "5")) == 130
    monkeypatch.undo()
    assert main(tiny_args(out, data_dir, "--checkpoint-every", "5", "--device", "cpu", "--resume")) == 0
    assert len(read_metrics(out)) == 2  # config.json keeps the device the run began on (a resumable change)
    assert all(torch.isfinite(t).all() for t in _weights(out).values()) and Run(out).predict(
        torch.zeros(1, 1, 28, 28, dtype=torch.uint8))


def test_amp_training_on_the_device_records_bfloat16(tmp_path, data_dir):  # noqa: F811
    from attnconv.precision import bf16_supported

    out = tmp_path / "run"
    if not bf16_supported(torch.device(DEVICE)):
        assert main(_device_args(out, data_dir, "--amp", "--max-steps", "3")) == 2
        return
    assert main(_device_args(out, data_dir, "--amp", "--max-steps", "3")) == 0
    assert json.loads((out / "config.json").read_text())["precision"].startswith("bfloat16")
    assert all(torch.isfinite(t).all() for t in _weights(out).values())


def test_predict_and_bench_on_the_device(device_run, tmp_path, capsys):
    from PIL import Image

    for i in range(3):
        Image.new("L", (28, 28), 40 * i).save(tmp_path / f"{i}.png")
    answers = []
    for device in (DEVICE, "cpu"):
        assert main(["predict", str(device_run), str(tmp_path), "--json", "--device", device]) == 0
        answers.append(json.loads(capsys.readouterr().out))
    assert answers[0].keys() == answers[1].keys()
    assert main(["bench", "--device", torch.device(DEVICE).type, "--tiny"]) == 0


@pytest.mark.slow
def test_compiled_training_on_the_device(tmp_path, data_dir):  # noqa: F811
    out = tmp_path / "run"
    assert main(_device_args(out, data_dir, "--compile", "--max-steps", "3")) == 0
    assert all(torch.isfinite(t).all() for t in _weights(out).values())
