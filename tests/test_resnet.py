"""CIFAR ResNet-18 and the sweep over every registered model."""

import pytest
import torch
import torch.nn.functional as F

from attnconv.errors import AttnconvError
from attnconv.models import build_model, list_models
from attnconv.models.resnet import ResNet

# Small settings per model family so the sweep stays fast; a new model family gets
# an entry here (an unknown name fails loudly rather than running at full size).
_SMALL = {
    "resnet": dict(width=4),
    "sa-": dict(hidden=16, heads=4, layers=1, intermediate=32),
    "vit": dict(hidden=16, heads=4, layers=1, intermediate=32),
}


def _small(name: str) -> dict:
    for prefix, overrides in _SMALL.items():
        if name.startswith(prefix):
            return dict(overrides)
    raise AssertionError(f"add small overrides for model {name!r} to _SMALL")


def test_resnet18_has_the_papers_parameter_count():
    model = build_model("resnet18")
    assert sum(p.numel() for p in model.parameters()) == 11_173_962  # Table 1: 11.2M


def test_resnet18_is_the_cifar_variant():
    model = build_model("resnet18")
    stem = model.stem[0]
    assert stem.kernel_size == (3, 3) and stem.stride == (1, 1)
    assert not any(isinstance(m, torch.nn.MaxPool2d) for m in model.modules())
    assert [len(stage) for stage in model.stages] == [2, 2, 2, 2]
    assert [stage[0].conv2.out_channels for stage in model.stages] == [64, 128, 256, 512]


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_runs_forward_and_backward(name):
    torch.manual_seed(0)
    model = build_model(name, in_channels=3, image_size=16, num_classes=7, **_small(name))
    x = torch.randn(2, 3, 16, 16)
    logits = model(x)
    assert logits.shape == (2, 7)
    features = model.forward_features(x)
    assert features.ndim == 2 and features.shape[0] == 2
    model.eval()  # no dropout, so the split can be compared exactly
    torch.testing.assert_close(model.forward_head(model.forward_features(x)), model(x))
    model.train()
    F.cross_entropy(model(x), torch.tensor([0, 6])).backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: {pname} got no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: {pname} has a non-finite gradient"


@pytest.mark.parametrize("name", list_models())
def test_every_registered_model_rejects_an_unknown_override(name):
    with pytest.raises(AttnconvError, match="no_such_option"):
        build_model(name, no_such_option=3)


def test_resnet18_takes_grayscale_28x28_and_a_width():
    model = build_model("resnet18", in_channels=1, image_size=28, num_classes=10, width=8)
    assert isinstance(model, ResNet) and model.num_features == 64
    assert model(torch.randn(3, 1, 28, 28)).shape == (3, 10)
    assert model.forward_features(torch.randn(3, 1, 28, 28)).shape == (3, 64)


@pytest.mark.parametrize("bad", [dict(width=0), dict(num_classes=-1), dict(in_channels=2.5)])
def test_resnet18_rejects_bad_sizes(bad):
    with pytest.raises(AttnconvError, match="is invalid: give a whole number"):
        build_model("resnet18", **bad)


def test_resnet18_rejects_attention_options():
    with pytest.raises(AttnconvError, match="hidden"):
        build_model("resnet18", hidden=64)


def test_round_76_a_resnet_scripts_and_traces_and_refuses_empty_images():
    """Round 76: the image check added to the ResNet in round 75 made `torch.jit.script` and `torch.fx.symbolic_trace`
    of a plain CNN fail; a 0x0 image passed the ResNet's and the sa-* models' checks to torch's kernels."""
    model = build_model("resnet18", in_channels=1, width=4).eval()
    x = torch.randn(2, 1, 28, 28)
    for made in (torch.jit.script(model), torch.fx.symbolic_trace(model)):
        torch.testing.assert_close(made(x), model(x))
    for name in ("resnet18", "sa-quadratic"):
        other = build_model(name, in_channels=1, image_size=16, **({"width": 4} if name == "resnet18" else {})).eval()
        with pytest.raises(AttnconvError, match=r"got \(1, 1, 0, 0\)( \(images of no pixels\))?$"):
            other(torch.zeros(1, 1, 0, 0))
        with pytest.raises(AttnconvError, match=r"got \(16, 16\) \(one image: give x\[None\]\[None\]\)$"):
            other(torch.zeros(16, 16))


@pytest.mark.parametrize("name", ["sa-quadratic", "sa-learned-content", "vit", "resnet18"])
def test_round_77_a_an_empty_batch_gives_an_empty_batch(name):
    """Round 77: the sa-* models given a batch of no images failed in torch's words ("mat1 and mat2 shapes cannot
    be multiplied (0x1 and 4x16)": torch's PixelUnshuffle gives an empty batch another shape)."""
    size = 32 if name == "vit" else 28
    model = build_model(name, in_channels=1, image_size=size, num_classes=10).eval()
    assert model(torch.zeros(0, 1, size, size)).shape == (0, 10)
