"""Tests for attnconv.construct.network: whole CNNs -> exact attention networks (Theorem 1 per layer).

Relative error throughout: rel(a, b) = ||a - b||_F / ||b||_F, b the original network's output.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import attnconv
from attnconv import data
from attnconv.construct import ConvAttention
from attnconv.construct.network import cnn_to_attention
from attnconv.errors import AttnconvError

_RTOL = {torch.float32: 1e-4, torch.float64: 1e-10}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).norm() / b.norm().clamp_min(torch.finfo(b.dtype).tiny))


class RecordOps(TorchDispatchMode):
    """Records the name of every aten op that runs (a local copy of test_construct's recorder)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(f"{func.__name__} {func}")
        return func(*args, **(kwargs or {}))


def _randomize_bn(model: nn.Module, gen: torch.Generator) -> nn.Module:
    """Non-trivial BatchNorms: random running stats and affine parameters (else BN is ~identity)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=gen) * 0.5)
                m.running_var.copy_(torch.rand(n, generator=gen) * 1.5 + 0.5)
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=gen) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=gen) * 0.3)
    return model


def _state(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items()}


def _has(model: nn.Module, kind: type) -> bool:
    return any(isinstance(m, kind) for m in model.modules())


# ----------------------------------------------------------------------------------------
# ResNet-18 (the paper's baseline) on real Fashion-MNIST images
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fashion():
    """Normalized real Fashion-MNIST: (4 test images, 64 train images, their labels)."""
    try:
        train, test = data.load_dataset("fashion-mnist", download=False)
    except AttnconvError as err:
        pytest.skip(f"real Fashion-MNIST not available here ({err}); the random-image tests still run")
    info = data.dataset_info("fashion-mnist")
    return data.normalize(test.images[:4], info), data.normalize(train.images[:64], info), train.labels[:64]


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """ResNet-18 on a busy 2-core machine: one intra-op thread avoids oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _resnet18(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = attnconv.build_model("resnet18", in_channels=1, num_classes=10)
    return _randomize_bn(model, torch.Generator().manual_seed(seed)).eval()


@pytest.fixture(scope="module")
def resnet():
    """A random-weight ResNet-18 (random BN statistics), a snapshot of it, and both conversions."""
    model = _resnet18()
    snapshot = (_state(model), {name: type(m) for name, m in model.named_modules()})
    return model, snapshot, cnn_to_attention(model), cnn_to_attention(model, fold_bn=True)


@pytest.mark.parametrize("fold_bn", [False, True])
def test_resnet18_random_weights_matches_on_real_fashion_mnist(fashion, resnet, fold_bn):
    images = fashion[0]  # (4, 1, 28, 28), full size
    model, _, plain, folded = resnet
    converted = folded if fold_bn else plain
    with torch.no_grad():
        assert rel(converted(images), model(images)) <= _RTOL[torch.float32]
    assert not _has(converted, nn.Conv2d)
    assert _has(converted, nn.BatchNorm2d) != fold_bn  # fold_bn folds every BN of a ResNet


def _conversion(original: nn.Module, converted: nn.Module) -> dict:
    """What `cnn_to_attention` did, by module path of the original: convs converted or kept, BatchNorms folded
    (now nn.Identity) or kept, and the converted layers' heads."""
    after = dict(converted.named_modules())
    out = {"converted": [], "kept_convs": [], "folded_bn": [], "kept_bn": [], "heads": 0}
    for path, module in original.named_modules():
        new = after.get(path)
        if isinstance(module, nn.modules.conv._ConvNd):
            out["converted" if isinstance(new, ConvAttention) else "kept_convs"].append(path)
            out["heads"] += new.heads if isinstance(new, ConvAttention) else 0
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            out["folded_bn" if isinstance(new, nn.Identity) else "kept_bn"].append(path)
    return out


def test_resnet18_matches_on_random_images_and_fold_bn_removes_every_batchnorm(resnet):
    """Always runs (no dataset needed): the same equivalence on random 16x16 images."""
    model, _, plain, folded = resnet
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        ref = model(x)
        assert rel(plain(x), ref) <= _RTOL[torch.float32]
        assert rel(folded(x), ref) <= _RTOL[torch.float32]
    assert not _has(folded, nn.modules.batchnorm._BatchNorm) and not _has(folded, nn.Conv2d)
    report = _conversion(model, folded)
    assert len(report["converted"]) == 20 and len(report["folded_bn"]) == 20  # 17 convs + 3 shortcuts, each with a BN
    assert report["kept_convs"] == [] and report["kept_bn"] == []
    assert report["heads"] == 17 * 9 + 3  # one head per kernel tap: 3x3 convs and 1x1 shortcuts
    assert isinstance(folded.stages[1][0].shortcut[0], ConvAttention)
    assert isinstance(folded.stages[1][0].bn1, nn.Identity)


def test_resnet18_after_sgd_steps_matches(fashion):
    """'Trained' weights, cheaply: 5 SGD steps in train mode move the weights and BN statistics.

    The equivalence of a fully trained network is checked on real runs by the CLI.
    """
    test_images, train_images, labels = fashion
    model = _resnet18(seed=2).train()
    before = _state(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    crops = train_images[..., 6:22, 6:22]  # 16x16 centre crops keep the steps cheap
    for _ in range(5):
        loss = F.cross_entropy(model(crops), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    moved = model.stages[0][0].bn1.running_mean
    assert not torch.equal(moved, before["stages.0.0.bn1.running_mean"])
    model.eval()
    with torch.no_grad():
        ref = model(test_images)
        for fold_bn in (False, True):
            assert rel(cnn_to_attention(model, fold_bn=fold_bn)(test_images), ref) <= _RTOL[torch.float32]


def test_converted_resnet18_calls_no_convolution_op(resnet):
    model, _, _, converted = resnet
    x = torch.randn(1, 1, 16, 16)
    with torch.no_grad(), RecordOps() as recorder:
        converted(x)
    assert recorder.ops, "the dispatch mode recorded nothing"
    assert not [op for op in recorder.ops if "conv" in op]
    assert not [op for op in recorder.ops if "batch_norm" in op]
    with torch.no_grad(), RecordOps() as recorder:  # the recorder does see the original's convs
        model(x)
    assert any("convolution" in op for op in recorder.ops)


def test_original_model_is_unchanged(resnet):
    model, (state, kinds), plain, folded = resnet  # the fixture converted it twice
    assert {name: type(m) for name, m in model.named_modules()} == kinds
    after = model.state_dict()
    assert after.keys() == state.keys() and all(torch.equal(after[k], v) for k, v in state.items())
    originals = {id(p) for p in model.parameters()}
    assert not any(id(p) in originals for p in [*plain.parameters(), *folded.parameters()])


# ----------------------------------------------------------------------------------------
# Small CNNs of other shapes
# ----------------------------------------------------------------------------------------


class _Branches(nn.Module):
    """Convs inside a ModuleList and a ModuleDict, called from a custom forward."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 1)])
        self.heads = nn.ModuleDict({"a": nn.Conv2d(4, 2, 3, stride=2), "b": nn.Sequential(nn.Conv2d(4, 2, 2))})

    def forward(self, x):
        for conv in self.convs:
            x = torch.tanh(conv(x))
        return torch.cat([self.heads["a"](x).flatten(1), self.heads["b"][0](x).flatten(1)], dim=1)


_NETS = {
    "conv1d": (
        lambda: nn.Sequential(
            nn.Conv1d(2, 6, 5, padding=2), nn.BatchNorm1d(6), nn.ReLU(), nn.Conv1d(6, 3, 3, stride=2, dilation=2)
        ),
        (2, 2, 19),
    ),
    "conv3d": (
        lambda: nn.Sequential(
            nn.Conv3d(2, 4, 3, padding=1), nn.BatchNorm3d(4), nn.ReLU(), nn.Conv3d(4, 2, 2, stride=2)
        ),
        (2, 2, 5, 6, 4),
    ),
    "depthwise_separable": (
        lambda: nn.Sequential(
            nn.Conv2d(4, 4, 3, padding=1, groups=4, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
            nn.Conv2d(4, 8, 1), nn.BatchNorm2d(8),
        ),
        (2, 4, 9, 8),
    ),
    "strided_dilated": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 5, 3, stride=2, padding=1), nn.GELU(), nn.Conv2d(5, 4, 3, dilation=2, padding=2),
            nn.Conv2d(4, 4, (3, 5), stride=(1, 2), padding="valid", groups=2),
        ),
        (2, 3, 13, 14),
    ),
    "reflect_circular": (
        lambda: nn.Sequential(
            nn.Conv2d(3, 4, 3, padding=1, padding_mode="reflect"), nn.ReLU(),
            nn.Conv2d(4, 4, 3, padding=2, dilation=2, padding_mode="circular"), nn.BatchNorm2d(4, affine=False),
            nn.Conv2d(4, 2, 4, padding="same", padding_mode="replicate"),
        ),
        (2, 3, 8, 9),
    ),
    "module_list_dict": (_Branches, (2, 3, 9, 9)),
    "root_conv": (lambda: nn.Conv2d(3, 4, 3, stride=2, padding=1, padding_mode="reflect"), (2, 3, 7, 8)),
}


@pytest.mark.parametrize("fold_bn", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", list(_NETS))
def test_small_cnns_match(name, dtype, fold_bn):
    build, shape = _NETS[name]
    gen = torch.Generator().manual_seed(3)
    model = _randomize_bn(build(), gen).to(dtype).eval()
    x = torch.randn(*shape, generator=gen, dtype=dtype)
    converted = cnn_to_attention(model, fold_bn=fold_bn)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # 'same' + even kernel: PyTorch's padded-copy warning
        ref = model(x)
        out = converted(x)
    assert out.dtype == dtype
    assert rel(out, ref) <= _RTOL[dtype]
    assert not _has(converted, nn.modules.conv._ConvNd)
    if fold_bn:  # every BN of these nets follows a conv in a Sequential
        assert not _has(converted, nn.modules.batchnorm._BatchNorm)


def test_root_conv_becomes_an_attention_layer():
    conv = nn.Conv1d(2, 3, 3, padding=1)
    converted = cnn_to_attention(conv)
    assert isinstance(converted, ConvAttention) and isinstance(conv, nn.Conv1d)


def test_copy_keeps_modes_dtype_and_requires_grad():
    model = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3), nn.Conv2d(3, 3, 1)).double()
    model[0].train()
    model[1].eval()
    model[2].eval()
    model[2].weight.requires_grad_(False)
    converted = cnn_to_attention(model)
    assert [m.training for m in converted] == [True, False, False]
    assert all(p.dtype == torch.float64 for p in converted.parameters())
    assert converted[0].out_weight.requires_grad and not converted[2].out_weight.requires_grad
    assert converted[2].out_bias.requires_grad


def test_shared_conv_becomes_one_shared_attention_layer():
    conv = nn.Conv2d(2, 2, 3, padding=1)
    model = nn.Sequential(conv, nn.ReLU(), conv)
    converted = cnn_to_attention(model)
    assert converted[0] is converted[2] and isinstance(converted[0], ConvAttention)
    x = torch.randn(1, 2, 6, 6)
    assert rel(converted(x), model(x)) <= _RTOL[torch.float32]


# ----------------------------------------------------------------------------------------
# BatchNorm folding: what is detected and what is left in place
# ----------------------------------------------------------------------------------------


class _Block(nn.Module):
    def __init__(self, preact: bool = False, reuse: bool = False):
        super().__init__()
        self.preact, self.reuse = preact, reuse
        self.conv1, self.bn1 = nn.Conv2d(3, 3, 3, padding=1, bias=False), nn.BatchNorm2d(3)
        self.conv2, self.bn2 = nn.Conv2d(3, 3, 3, padding=1), nn.BatchNorm2d(3)

    def forward(self, x):
        if self.preact:  # pre-activation: bn1 comes *before* conv1, bn2 after conv1
            return self.conv2(F.relu(self.bn2(self.conv1(F.relu(self.bn1(x))))))
        y = self.conv1(x)
        out = F.relu(self.bn1(y))
        if self.reuse:  # conv1's output also feeds the residual: bn1 cannot be folded
            out = out + y
        return self.bn2(self.conv2(out)) + x


class _Stack(nn.Module):
    """conv/BN pairs held in two ModuleLists and paired in forward."""

    def __init__(self):
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 3, 3, padding=1) for _ in range(2)])
        self.norms = nn.ModuleList([nn.BatchNorm2d(3) for _ in range(2)])

    def forward(self, x):
        for conv, norm in zip(self.convs, self.norms):
            x = torch.relu(norm(conv(x)))
        return x


class _Untraceable(_Block):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: torch.fx cannot trace it
            return self.bn1(self.conv1(x))
        return self.bn2(self.conv2(x))


def _check(model: nn.Module, **kwargs) -> nn.Module:
    model = _randomize_bn(model, torch.Generator().manual_seed(4)).double().eval()
    x = torch.randn(2, 3, 6, 7, dtype=torch.float64)
    converted = cnn_to_attention(model, fold_bn=True, **kwargs)
    with torch.no_grad():
        assert rel(converted(x), model(x)) <= _RTOL[torch.float64]
    return converted


def test_fold_bn_attribute_pairs_are_verified_on_the_traced_forward():
    converted = _check(_Block())
    assert isinstance(converted.bn1, nn.Identity) and isinstance(converted.bn2, nn.Identity)
    assert converted.conv1.out_bias is not None  # created by the fold (the conv had no bias)


def test_fold_bn_finds_pairs_inside_module_lists():
    converted = _check(_Stack())
    assert all(isinstance(m, nn.Identity) for m in converted.norms)


def test_fold_bn_leaves_preactivation_and_shared_outputs_alone():
    pre = _check(_Block(preact=True))
    assert isinstance(pre.bn1, nn.BatchNorm2d)  # bn1 feeds conv1: not a conv -> BN pair
    assert isinstance(pre.bn2, nn.Identity)  # bn2 consumes conv1 only: folded into conv1
    reuse = _check(_Block(reuse=True))
    assert isinstance(reuse.bn1, nn.BatchNorm2d) and isinstance(reuse.bn2, nn.Identity)


def test_fold_bn_warns_and_keeps_bns_of_an_untraceable_forward():
    with pytest.warns(UserWarning, match=r"<root> \(_Untraceable\)"):
        converted = _check(_Untraceable())
    assert isinstance(converted.bn1, nn.BatchNorm2d) and isinstance(converted.conv1, ConvAttention)


def test_fold_bn_keeps_batchnorms_without_running_stats():
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3, track_running_stats=False)).eval()
    converted = cnn_to_attention(model, fold_bn=True)
    assert isinstance(converted[1], nn.BatchNorm2d)  # eval still uses batch statistics: not foldable
    x = torch.randn(4, 3, 6, 6)
    assert rel(converted(x), model(x)) <= _RTOL[torch.float32]


def test_fold_bn_refuses_a_model_in_training_mode():
    model = nn.Sequential(nn.Conv2d(3, 3, 3), nn.BatchNorm2d(3))
    with pytest.raises(AttnconvError, match=r"1 \(BatchNorm2d\).*model\.eval\(\)"):
        cnn_to_attention(model, fold_bn=True)
    assert isinstance(cnn_to_attention(model)[1], nn.BatchNorm2d)  # without folding, train mode is fine


# ----------------------------------------------------------------------------------------
# Modules that cannot be converted
# ----------------------------------------------------------------------------------------


class _UpBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(4, 4, 3, padding=1)
        self.conv2 = nn.ConvTranspose2d(4, 4, 3, padding=1)

    def forward(self, x):
        return self.conv2(self.conv1(x))


class _UpNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer3 = nn.Sequential(_UpBlock())

    def forward(self, x):
        return self.layer3(x)


def _with_transpose() -> nn.Module:
    return _UpNet()


def test_transposed_conv_is_refused_with_its_path_in_strict_mode():
    model = _with_transpose()
    with pytest.raises(AttnconvError, match=r"layer3\.0\.conv2 \(ConvTranspose2d\): .*strict=False"):
        cnn_to_attention(model)
    assert isinstance(model.layer3[0].conv1, nn.Conv2d)


def test_strict_false_warns_and_keeps_the_layer():
    model = _with_transpose()
    with pytest.warns(UserWarning, match=r"layer3\.0\.conv2 \(ConvTranspose2d\)"):
        converted = cnn_to_attention(model, strict=False)
    block = converted.layer3[0]
    assert isinstance(block.conv1, ConvAttention) and isinstance(block.conv2, nn.ConvTranspose2d)
    assert isinstance(model.layer3[0].conv1, nn.Conv2d)  # original untouched
    report = _conversion(model, converted)
    assert report["converted"] == ["layer3.0.conv1"] and report["kept_convs"] == ["layer3.0.conv2"]
    x = torch.randn(1, 4, 5, 5)
    assert rel(converted(x), model(x)) <= _RTOL[torch.float32]


class _CustomConv(nn.Conv2d):
    def forward(self, x):
        return super().forward(x) * 2


def _hooked() -> nn.Conv2d:
    conv = nn.Conv2d(2, 2, 3)
    conv.register_forward_hook(lambda m, i, o: o * 2)
    return conv


@pytest.mark.parametrize(
    "bad, reason",
    [
        (lambda: nn.LazyConv2d(4, 3), "lazy and uninitialized"),
        (lambda: _CustomConv(2, 2, 3), "its own forward"),
        (_hooked, "forward hooks"),
        (lambda: nn.ConvTranspose1d(2, 2, 3), "transposed"),
    ],
)
def test_unconvertible_modules_are_named_with_the_fix(bad, reason):
    model = nn.Sequential(nn.Conv2d(2, 2, 1), nn.Sequential(nn.ReLU(), bad()))
    name = type(model[1][1]).__name__
    with pytest.raises(AttnconvError, match=rf"1\.1 \({name}\): .*{reason}.*strict=False"):
        cnn_to_attention(model)
    with pytest.warns(UserWarning, match=rf"1\.1 \({name}\)"):
        converted = cnn_to_attention(model, strict=False)
    assert type(converted[1][1]) is type(model[1][1]) and isinstance(converted[0], ConvAttention)


def test_rejects_what_is_not_a_module():
    with pytest.raises(AttnconvError, match="nn.Module"):
        cnn_to_attention(torch.zeros(3))
    with pytest.raises(AttnconvError, match="alpha"):
        cnn_to_attention(nn.Conv2d(1, 1, 1), alpha=-1.0)


# ----------------------------------------------------------------------------------------
# Conversions never silently wrong
# ----------------------------------------------------------------------------------------


class _StaticSamePadding(nn.Conv2d):
    """EfficientNet's Conv2dStaticSamePadding: pads itself, then a 'valid' conv."""

    def __init__(self, c_in, c_out, k, stride=1):
        super().__init__(c_in, c_out, k, stride=stride)
        total = max(k - stride, 0)
        self.pad = (total // 2, total - total // 2) * 2

    def forward(self, x):
        return F.conv2d(F.pad(x, self.pad), self.weight, self.bias, self.stride)


class _OwnConvForward(nn.Conv2d):
    """Overrides only _conv_forward (as XConv2d-style layers do): here a doubled weight."""

    def _conv_forward(self, x, weight, bias):
        return F.conv2d(x, 2 * weight, bias, self.stride, self.padding, self.dilation, self.groups)


class _Tagged(nn.Conv2d):
    """A subclass that keeps the conv's computation: converts like nn.Conv2d."""


def _hooked_conv() -> nn.Conv2d:
    conv = nn.Conv2d(3, 4, 3)
    conv.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    return conv


class _CallConv(nn.Conv2d):
    """A subclass whose __call__ doubles the output (converted silently, relative error 0.5)."""

    def __call__(self, x):
        return super().__call__(x) * 2


def _reshaped_conv() -> nn.Conv2d:
    """A 3x3 conv given 5x5 weights after it was made (torch's bare size error at conversion)."""
    conv = nn.Conv2d(3, 4, 3)
    conv.weight = nn.Parameter(torch.randn(4, 3, 5, 5))
    return conv


@pytest.mark.parametrize("attr, value, padding, mode", [("padding", 1, 0, "zeros"), ("stride", 2, 1, "zeros"),
                                                        ("dilation", 2, 2, "zeros"), ("stride", 2, 1, "reflect"),
                                                        ("kernel_size", 3, 1, "zeros"), ("dilation", np.int64(2), 2,
                                                                                         "zeros")])
def test_conversions_never_silently_wrong_a_bare_int_set_after_the_conv_was_made(attr, value, padding, mode):
    """`conv.padding = 1` (or stride, dilation) after the conv was made: the conv runs (F.conv2d takes ints), the
    conversion raised a bare TypeError. A bare int counts for every axis, as in the conv's forward."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=padding, padding_mode=mode).double()
    setattr(conv, attr, value)
    x = torch.randn(2, 4, 10, 10, dtype=torch.float64)
    want = conv(x)
    for got in (attnconv.conv_to_attention(conv)(x), cnn_to_attention(nn.Sequential(conv))(x)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-10), (attr, mode)


@pytest.mark.parametrize("value", [torch.tensor(3), (3,)])
def test_conversions_never_silently_wrong_a_kernel_size_that_is_not_one_per_axis_is_named(value):
    """kernel_size set to a 0-d tensor, or one value for a 2-d kernel: a TypeError, or a line blaming the stride."""
    conv = nn.Conv2d(4, 6, 3, padding=1)
    conv.kernel_size = value
    with pytest.raises(AttnconvError, match=r"Conv2d has kernel_size .*, not a whole number or one per axis of its "
                                            r"2-d kernel; make the conv anew with that kernel_size"):
        attnconv.conv_to_attention(conv)


@pytest.mark.parametrize("mode", ["zeros", "reflect", "replicate", "circular"])
def test_conversions_never_silently_wrong_channels_last_output_laid_out_as_the_conv_s(mode):
    """A channels-last input through a circular-padded conv: the conv's output is contiguous (its padded copy is),
    the converted layer's was channels-last, so a `.view()` after it failed. Each mode now lays out as the conv."""
    x = torch.randn(2, 4, 10, 10).to(memory_format=torch.channels_last)
    conv = nn.Conv2d(4, 6, 3, stride=2, padding=1, padding_mode=mode).eval()
    want, got = conv(x), cnn_to_attention(nn.Sequential(conv)).eval()(x)
    for fmt in (torch.contiguous_format, torch.channels_last):
        assert got.is_contiguous(memory_format=fmt) == want.is_contiguous(memory_format=fmt), (mode, fmt)


@pytest.mark.parametrize("mode", ["reflect", "circular", "replicate"])
def test_conversions_never_silently_wrong_padding_set_after_the_conv_was_made(mode):
    """`padding` set after the conv was made: nn.Conv2d's forward pads by what it computed at construction for
    every mode but zeros, and the conversion read `padding` (a 12x12 output for the conv's 10x10)."""
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1, padding_mode=mode).double()
    conv.padding = (2, 2)
    x = torch.randn(2, 4, 10, 10, dtype=torch.float64)
    want = conv(x)
    for got in (attnconv.conv_to_attention(conv)(x), cnn_to_attention(nn.Sequential(conv))(x)):
        assert got.shape == want.shape and torch.allclose(got, want, atol=1e-10), mode


def _patched_conv(attr: str) -> nn.Conv2d:
    """A plain nn.Conv2d whose `attr` is replaced on the instance (converted silently, relative error 0.5-1.6)."""
    conv = nn.Conv2d(3, 4, 3)
    if attr == "forward":
        conv.forward = lambda x: F.conv2d(x, 2 * conv.weight, conv.bias)
    else:
        conv._conv_forward = lambda x, weight, bias: F.conv2d(x, weight.flip(-1), bias)
    return conv


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda: _StaticSamePadding(3, 4, 3, stride=2), "_StaticSamePadding subclasses Conv2d with its own forward"),
        (lambda: _OwnConvForward(3, 4, 3), "_OwnConvForward subclasses Conv2d with its own forward"),
        (_hooked_conv, "forward hooks"),
        (lambda: _patched_conv("forward"), r"Conv2d has its forward replaced on the module itself"),
        (lambda: _patched_conv("_conv_forward"), r"Conv2d has its _conv_forward replaced on the module itself"),
        (lambda: _CallConv(3, 4, 3), "_CallConv subclasses Conv2d with its own forward"),
        (_reshaped_conv, r"Conv2d has weights of shape \(4, 3, 5, 5\), not the \(4, 3, 3, 3\) of its out_channels"),
    ],
    ids=["static-same-padding", "own-conv-forward", "hooked", "instance-forward", "instance-conv-forward",
         "own-call", "weights-of-another-size"],
)
def test_conversions_never_silently_wrong_conv_to_attention_refuses_as_cnn_to_attention_does(make, reason):
    conv = make()
    with pytest.raises(AttnconvError, match=reason) as single:
        attnconv.conv_to_attention(conv)
    with pytest.raises(AttnconvError, match=reason) as whole:
        cnn_to_attention(nn.Sequential(nn.ReLU(), conv))
    for err in (single, whole):  # neither sends the user to the other function for the same module
        assert "with conv_to_attention" not in str(err.value) and "call conv_to_attention" not in str(err.value)
    assert str(single.value).split(": ", 1)[1] in str(whole.value)  # the same reason, word for word


@pytest.mark.parametrize("compile_", ["script", "trace", "script-inside"])
def test_conversions_never_silently_wrong_torchscript_is_refused_in_words(compile_):
    """A scripted or traced network gave torch's `register_forward_pre_hook is not supported on ScriptModules`."""
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    x = torch.randn(1, 3, 8, 8)
    scripted = {"script": lambda: torch.jit.script(net), "trace": lambda: torch.jit.trace(net, x),
                "script-inside": lambda: nn.Sequential(torch.jit.script(net), nn.ReLU())}[compile_]()
    for kwargs in ({}, {"example_input": x}, {"strict": False}):
        with pytest.raises(AttnconvError, match=r"not one compiled by torch.jit.script or traced by torch.jit.trace .*"
                                                r"convert the nn.Module first, then script or trace the result"):
            cnn_to_attention(scripted, **kwargs)
    conv = {"script": lambda: torch.jit.script(net[0]), "trace": lambda: torch.jit.trace(net[0], x),
            "script-inside": lambda: torch.jit.script(nn.Conv2d(3, 4, 1))}[compile_]()
    with pytest.raises(AttnconvError, match=r"^conv_to_attention: \w+ is compiled by torch.jit.script or traced by "
                                            r"torch.jit.trace; convert the nn.Module first"):
        attnconv.conv_to_attention(conv)  # said as cnn_to_attention says it, not "takes nn.Conv1d/2d/3d, got ..."


def test_conversions_never_silently_wrong_torch_compile_is_refused_in_words():
    """`conv_to_attention(torch.compile(conv))` said only `got OptimizedModule`; `cnn_to_attention` of a network
    holding one said at its first forward that its own forward calls a convolution op."""
    conv = nn.Conv2d(3, 4, 3)
    with pytest.raises(AttnconvError, match=r"^conv_to_attention: OptimizedModule is compiled by torch.compile; "
                                            r"convert the module it wraps \(its _orig_mod\), then compile the result"):
        attnconv.conv_to_attention(torch.compile(conv))
    x = torch.randn(1, 3, 8, 8)
    with pytest.raises(AttnconvError, match=r"without torch.compile'd modules inside \(0 is one\); convert the "
                                            r"module it wraps \(its _orig_mod\) first"):
        cnn_to_attention(nn.Sequential(torch.compile(conv)), example_input=x)
    converted = cnn_to_attention(torch.compile(nn.Sequential(conv)), example_input=x)  # compiled whole: converts
    assert not any(isinstance(m, nn.Conv2d) for m in converted.modules())
    torch.testing.assert_close(converted(x), conv(x), rtol=1e-4, atol=1e-5)


def test_conversions_never_silently_wrong_subclasses_keeping_the_conv_s_forward_convert():
    conv = _Tagged(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 7, 6)
    assert rel(attnconv.conv_to_attention(conv)(x), conv(x)) <= _RTOL[torch.float32]
    assert rel(cnn_to_attention(nn.Sequential(conv))(x), conv(x)) <= _RTOL[torch.float32]


class _Flatten(nn.Module):
    """ChannelNet-style: a conv whose output is flattened with .view() (needs a contiguous tensor)."""

    def __init__(self, groups: int):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1, groups=groups)

    def forward(self, x):
        y = self.conv(x)
        return y.view(y.size(0), -1)


@pytest.mark.parametrize("groups", [1, 2, 4])
@pytest.mark.parametrize("learnable", [False, True], ids=["fixed", "learnable"])
def test_conversions_never_silently_wrong_view_after_a_converted_conv(groups, learnable):
    model = _Flatten(groups)
    x = torch.randn(3, 4, 5, 7)
    converted = cnn_to_attention(model, learnable=learnable, example_input=x)
    assert rel(converted(x), model(x)) <= _RTOL[torch.float32]


class _Blur(nn.Module):
    """An anti-aliasing filter (TResNet style): a fixed kernel applied with a functional conv."""

    def __init__(self, channels: int, op: str):
        super().__init__()
        self.op = op
        self.register_buffer("kernel", torch.ones(channels, 1, 3, 3) / 9)

    def forward(self, x):
        if self.op == "conv2d":
            return F.conv2d(x, self.kernel, padding=1, groups=x.shape[1])
        if self.op == "torch.conv2d":
            return torch.conv2d(x, self.kernel, padding=1, groups=x.shape[1])
        if self.op == "conv_transpose2d":
            return F.conv_transpose2d(x, self.kernel, padding=1, groups=x.shape[1])
        if self.op == "conv1d":  # rows as sequences
            b, c, h, w = x.shape
            rows = x.permute(0, 2, 1, 3).reshape(b * h, c, w)
            out = F.conv1d(rows, self.kernel[:, :, 0], padding=1, groups=c)
            return out.reshape(b, h, c, w).permute(0, 2, 1, 3)
        if self.op == "conv3d":
            return F.conv3d(x.unsqueeze(2), self.kernel.unsqueeze(2), padding=(0, 1, 1), groups=x.shape[1]).squeeze(2)
        raise AssertionError(self.op)


def _blurred(op: str) -> nn.Module:
    """conv -> BN -> Blur, and a nested Sequential(ReLU, Blur): two modules that call a conv op."""
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.BatchNorm2d(4), _Blur(4, op),
                         nn.Sequential(nn.ReLU(), _Blur(4, op)))


_FUNCTIONAL = ["conv2d", "torch.conv2d", "conv_transpose2d", "conv1d", "conv3d"]


@pytest.mark.parametrize("op", _FUNCTIONAL)
def test_conversions_never_silently_wrong_functional_convs_found_with_an_example_input(op):
    model = _blurred(op).train()
    x = torch.randn(2, 2, 6, 5)
    with pytest.raises(AttnconvError, match=r"2 modules still run a convolution.*strict=False") as err:
        cnn_to_attention(model, example_input=x)
    assert r"2 (_Blur), 3.1 (_Blur): its own forward calls a convolution op" in str(err.value)
    with pytest.warns(UserWarning, match=r"kept a convolution in 2 \(_Blur\), 3\.1 \(_Blur\)"):
        converted = cnn_to_attention(model, strict=False, example_input=x)
    # the check pass changed nothing: training modes and BatchNorm statistics as the copy had them
    assert converted.training and converted[1].training
    assert torch.equal(converted[1].running_mean, model[1].running_mean)
    assert converted[1].num_batches_tracked.item() == 0
    assert not converted._forward_hooks and not converted._forward_pre_hooks
    assert rel(converted.eval()(x), model.eval()(x)) <= _RTOL[torch.float32]


@pytest.mark.parametrize("op", _FUNCTIONAL)
def test_conversions_never_silently_wrong_functional_convs_found_at_the_first_forward(op):
    model = _blurred(op).eval()
    x = torch.randn(2, 2, 6, 5)
    converted = cnn_to_attention(model)
    for _ in range(2):  # strict: the first forward raises, and every later one
        with pytest.raises(AttnconvError, match=r"2 \(_Blur\), 3\.1 \(_Blur\): its own forward calls"):
            converted(x)
    lenient = cnn_to_attention(model, strict=False)
    with pytest.warns(UserWarning, match=r"kept a convolution in 2 \(_Blur\), 3\.1 \(_Blur\)"):
        out = lenient(x)
    assert rel(out, model(x)) <= _RTOL[torch.float32]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once: the check is gone after the first forward
        lenient(x)
    assert not lenient._forward_hooks and not lenient._forward_pre_hooks
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in lenient.modules())


def test_conversions_never_silently_wrong_a_clean_network_passes_and_keeps_no_hooks():
    model = _Flatten(1)
    x = torch.randn(2, 4, 5, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        checked = cnn_to_attention(model, example_input=x)
        later = cnn_to_attention(model)
        assert rel(later(x), model(x)) <= _RTOL[torch.float32]  # the first forward: checked, no warning
    for converted in (checked, later):
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in converted.modules())


def test_conversions_never_silently_wrong_the_check_waits_while_traced():
    """torch.jit.trace runs the forward on traced values: the check waits for an eager forward."""
    converted = cnn_to_attention(_blurred("conv2d").eval())
    x = torch.randn(1, 2, 6, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the tracer's own warnings
        torch.jit.trace(converted, x, check_trace=False)
    with pytest.raises(AttnconvError, match="still run a convolution"):
        converted(x)


def test_conversions_never_silently_wrong_a_bad_example_input_is_named():
    with pytest.raises(AttnconvError, match="example_input must be a tensor"):
        cnn_to_attention(nn.Conv2d(1, 1, 3), example_input="image")
    with pytest.raises(AttnconvError, match=r"failed on example_input \(.*give an input the network accepts"):
        cnn_to_attention(nn.Conv2d(1, 1, 3), example_input=torch.randn(1, 2, 5, 5))


def test_conversions_never_silently_wrong_strict_refusal_is_grouped_and_readable():
    """EfficientNet's 81 static-padding convs once gave 16 KB on one line: now a line per reason."""
    blocks = [nn.Sequential(_StaticSamePadding(4, 4, 3), nn.ReLU()) for _ in range(30)]
    model = nn.Sequential(*blocks, nn.ConvTranspose2d(4, 4, 3), nn.Conv2d(4, 4, 1), nn.ConvTranspose2d(4, 4, 1))
    with pytest.raises(AttnconvError) as err:
        cnn_to_attention(model)
    lines = str(err.value).splitlines()
    assert lines[0].startswith("cnn_to_attention: 32 modules cannot be converted exactly; pass strict=False")
    assert len(lines) == 3 and max(len(line) for line in lines) < 1000
    assert lines[1].startswith("  0.0 (_StaticSamePadding), 1.0 (_StaticSamePadding), ")
    assert "... and 22 more (30 in all): _StaticSamePadding subclasses Conv2d" in lines[1]
    assert lines[2] == "  30 (ConvTranspose2d), 32 (ConvTranspose2d): " + (
        "ConvTranspose2d is a transposed convolution, which conv_to_attention does not construct; "
        "replace it by an upsampling + Conv, or keep it")
    with pytest.warns(UserWarning) as caught:  # strict=False: one warning per reason, every path in it
        converted = cnn_to_attention(model, strict=False)
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2 and all(f"{i}.0 (_StaticSamePadding)" in messages[0] for i in range(30))
    assert isinstance(converted[31], ConvAttention)


def test_conversions_never_silently_wrong_a_module_computing_with_its_convolutions_weight_is_named():
    """Round 75: a module whose forward computes with its child convolution's weight itself (`F.conv2d(x,
    self.c.weight * 2)`) made the conversion blame example_input ("failed on example_input (AttributeError: ...);
    give an input the network accepts", though the CNN takes it), and without example_input the converted network's
    first call was torch's raw AttributeError. Both name the module and what it did; hasattr stays False."""

    class Reads(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return F.conv2d(x, self.c.weight * 2, self.c.bias, padding=1)

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.d = Reads(), nn.Conv2d(4, 4, 1)

        def forward(self, x):
            return self.d(self.inner(x))

    x = torch.randn(2, 3, 8, 8)
    for model, label in ((Reads().eval(), "<root> (Reads)"), (Outer().eval(), "inner (Reads)")):
        assert model(x).shape == (2, 4, 8, 8)  # the CNN takes the input
        with pytest.raises(AttnconvError, match=rf"^cnn_to_attention: {re.escape(label)}: ConvAttention has no "
                                                r"`weight`: .* a module read the convolution's `weight` \(to "
                                                r"compute with it itself"):
            cnn_to_attention(model, example_input=x)
        converted = cnn_to_attention(model)
        with pytest.raises(AttnconvError, match=r"^ConvAttention has no `weight`") as info:
            converted(x)
        assert isinstance(info.value, AttributeError)
        layer = converted.c if label.startswith("<root>") else converted.inner.c
        assert not hasattr(layer, "weight") and not hasattr(layer, "bias") and hasattr(layer, "out_weight")


def test_conversions_never_silently_wrong_a_weight_read_through_a_property_is_named_and_user_tensors_kept():
    """Round 76: a module reading its convolution's weight through a property met Python's fallback for the
    property's own name ("'Prop' object has no attribute 'w'"), and the conversion blamed example_input; a `weight`
    buffer or `bias` parameter a user registers on a converted layer could not be read back."""

    class Prop(nn.Module):
        def __init__(self):
            super().__init__()
            self.c = nn.Conv1d(2, 3, 3, padding=1)

        @property
        def w(self):
            return self.c.weight

        def forward(self, x):
            return F.conv1d(x, self.w, padding=1)

    x = torch.randn(1, 2, 8)
    with pytest.raises(AttnconvError, match=r"^cnn_to_attention: <root> \(Prop\): ConvAttention has no `weight`: .*"
                                            r"F\.conv1d\(x, conv\.weight\)"):
        cnn_to_attention(Prop(), example_input=x)
    converted = cnn_to_attention(Prop())
    for _ in range(2):  # the first forward and the next: Python's error, with what attnconv knows as its note
        with pytest.raises(AttributeError, match="'Prop' object has no attribute 'w'") as info:
            converted(x)
        assert any(note.startswith("attnconv: ConvAttention has no `weight`") for note in info.value.__notes__)
    layer = attnconv.conv_to_attention(nn.Conv2d(2, 3, 3, padding=1))
    layer.register_buffer("weight", torch.ones(1))
    layer.register_parameter("bias", nn.Parameter(torch.zeros(2)))
    assert layer.weight.tolist() == [1.0] and layer.bias.shape == (2,) and "weight" in layer.state_dict()


def test_conversions_never_silently_wrong_a_weight_probed_and_swallowed_is_refused():
    """Round 77: a module that read its convolution's weight by `getattr(conv, "weight", None)` (or hasattr, or an
    except) went on without it once converted and computed something else (off by 1.7 where the CNN's largest output
    was 0.0012), with no word; and a model of its own AttributeError after such a probe was said as a weight read."""

    class Probe(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 4, 3, padding=1)

        def forward(self, x):
            w = getattr(self.conv, "weight", None)
            return self.conv(x) if w is None else self.conv(x) * w.mean()

    class OwnBug(Probe):
        def forward(self, x):
            y = self.conv(x) * (2 if hasattr(self.conv, "weight") else 1)
            return self.missing_attr_bug(y)

    x = torch.randn(2, 3, 8, 8)
    refused = r"^cnn_to_attention: <root> \(Probe\): ConvAttention has no `weight`"
    with pytest.raises(AttnconvError, match=refused):
        cnn_to_attention(Probe().eval(), example_input=x)
    with pytest.raises(AttnconvError, match=refused):  # at the first forward, without example_input
        cnn_to_attention(Probe().eval())(x)
    with pytest.warns(UserWarning, match=r"will not compute as the CNN: <root> \(Probe\): ConvAttention has no"):
        cnn_to_attention(Probe().eval(), strict=False)(x)
    with pytest.raises(AttnconvError, match=r"failed on example_input \(AttributeError: 'OwnBug' object has no "
                                            r"attribute 'missing_attr_bug'\)"):
        cnn_to_attention(OwnBug().eval(), example_input=x)


def test_conversions_never_silently_wrong_another_threads_probe_is_not_the_networks():
    """Round 78: the refused reads were one list for the process: `hasattr(layer, "weight")` of any converted layer in
    another thread (an init loop in a server thread) while a network was checked made that clean network refused as
    "<unknown module>: ConvAttention has no `weight`", and its first forwards raise."""
    import threading
    import time

    other = cnn_to_attention(nn.Conv2d(3, 3, 3))
    stop = threading.Event()

    def probe():
        while not stop.is_set():
            hasattr(other, "weight")
            time.sleep(0.0002)  # a probe every fraction of a millisecond, leaving the conversions their time

    thread = threading.Thread(target=probe)
    thread.start()
    clean = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    x = torch.randn(1, 3, 8, 8)
    try:
        for _ in range(5):
            cnn_to_attention(clean, example_input=x)
            cnn_to_attention(clean)(x)
    finally:
        stop.set()
        thread.join()
    hasattr(other, "weight")  # this thread, outside the checked network: not the network's read either
    torch.testing.assert_close(cnn_to_attention(clean, example_input=x)(x), clean(x), rtol=1e-4, atol=1e-5)


def test_conversions_never_silently_wrong_two_threads_run_the_first_forward_at_once():
    """The first-forward check of a network converted without `example_input` was one finder for every thread: a
    second thread's forward, run while the first thread's was checked, ended the first thread's dispatch mode from its
    own thread ("RuntimeError: trying to pop from empty mode stack") and left it on the first thread's stack, and
    went unchecked. Each thread's first forward is checked under its own finder."""
    import threading

    inside, done = threading.Event(), threading.Event()

    class Waits(nn.Module):  # the first thread waits in its forward until the second thread's forward is over
        def forward(self, x):
            if threading.current_thread().name == "first":
                inside.set()
                assert done.wait(10)
            return F.conv2d(x, torch.ones(4, 1, 1, 1), groups=4)  # a conv op the check must still name

    torch.manual_seed(0)
    cnn = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), Waits(), nn.Conv2d(4, 4, 3, padding=1)).eval()
    x = torch.randn(2, 3, 8, 8)
    net = cnn_to_attention(cnn, strict=False)
    outs, errors = {}, []

    def run(name):
        try:
            outs[name] = net(x)
        except BaseException as e:  # noqa: BLE001 - recorded for the assertion
            errors.append(e)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = threading.Thread(target=run, args=("first",), name="first")
        first.start()
        assert inside.wait(10)
        second = threading.Thread(target=run, args=("second",), name="second")
        second.start()
        second.join()
        done.set()
        first.join()
    assert errors == []
    for out in outs.values():
        torch.testing.assert_close(out, cnn(x), rtol=1e-4, atol=1e-5)
    assert sum("Waits" in str(w.message) for w in seen) == 2  # both threads' forwards were checked
    assert torch._C._len_torch_dispatch_stack() == 0
    torch.testing.assert_close(net(x), cnn(x), rtol=1e-4, atol=1e-5)
    assert not net._forward_hooks and not net._forward_pre_hooks  # passed: the check is gone


def test_conversions_never_silently_wrong_a_probe_in_first_forwards_of_several_threads_is_refused_in_each():
    """Threads running a probing network's first forward at once: one was refused (or met torch's error), the others
    took the converted branch and answered something else without a word."""
    import threading

    class Probes(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(1, 2, 3, padding=1)

        def forward(self, x):
            return x * 0 if hasattr(self.conv, "weight") else self.conv(x)

    net, x = cnn_to_attention(Probes()), torch.randn(2, 1, 8, 8)
    start, results = threading.Barrier(4), []

    def run():
        start.wait()
        try:
            net(x)
            results.append("answered")
        except AttnconvError as e:
            results.append(str(e).split(":")[0] + ":" + str(e).split(":")[1])

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == ["cnn_to_attention: <root> (Probes)"] * 4
    assert torch._C._len_torch_dispatch_stack() == 0


def test_conversions_never_silently_wrong_a_forward_returning_none_inside_an_except_block_is_checked():
    """A forward that keeps its result and returns None, called first inside the caller's own except block, was taken
    for a failing forward (no output, an exception in sys.exc_info): it answered from the converted branch and was
    refused only at the next call."""

    class Keeps(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv, self.out = nn.Conv2d(1, 2, 3, padding=1), None

        def forward(self, x):
            self.out = x * 0 if hasattr(self.conv, "weight") else self.conv(x)

    net = cnn_to_attention(Keeps())
    try:
        raise KeyError("the caller's own")
    except KeyError:
        with pytest.raises(AttnconvError, match=r"<root> \(Keeps\): ConvAttention has no `weight`"):
            net(torch.randn(2, 1, 8, 8))


def test_conversions_never_silently_wrong_a_first_forward_inside_an_except_block_is_checked():
    """The first-forward check took an exception the caller was handling (`except ...: model(x)`) for the forward's
    own failure, and let that forward's refusal wait for the next one."""

    class Direct(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("k", torch.ones(4, 3, 1, 1))

        def forward(self, x):
            return F.conv2d(nn.functional.relu(x), self.k)

    model = nn.Sequential(nn.Conv2d(3, 3, 1), Direct())
    converted = cnn_to_attention(model)
    try:
        raise ValueError("the caller's own")
    except ValueError:
        with pytest.raises(AttnconvError, match=r"still run a convolution|calls a convolution op"):
            converted(torch.randn(1, 3, 4, 4))
