import pytest
import torch

from attnconv.errors import AttnconvError
from attnconv.models import build_model, no_weight_decay

# The exact integers the paper's architectures give (Table 1: 12.1M, 12.1M, 12.3M, 29.5M).
PAPER_COUNTS = {
    "sa-quadratic": 12_086_844,
    "sa-quadratic-aniso": 12_087_006,
    "sa-learned": 12_278_682,
    "sa-learned-content": 29_484_282,
}


@pytest.mark.parametrize("name,count", PAPER_COUNTS.items())
def test_parameter_counts_are_the_papers(name, count):
    model = build_model(name)
    assert sum(p.numel() for p in model.parameters()) == count
    assert round(count / 1e6, 1) == {"sa-quadratic": 12.1, "sa-quadratic-aniso": 12.1, "sa-learned": 12.3,
                                     "sa-learned-content": 29.5}[name]


@pytest.mark.parametrize("name", list(PAPER_COUNTS))
def test_output_does_not_depend_on_impl(name):
    small = dict(hidden=16, heads=4, layers=2, intermediate=24, image_size=12, in_channels=1, dropout=0.0, attn_dropout=0.0)
    torch.manual_seed(0)
    ref = build_model(name, impl="dense", **small).eval()
    x = torch.randn(3, 1, 12, 12)
    y_ref = ref(x)
    for impl in ("auto", "sdpa", "separable"):
        try:
            model = build_model(name, impl=impl, **small).eval()
        except AttnconvError:
            assert impl == "separable" and name in ("sa-quadratic-aniso", "sa-learned-content")
            continue
        model.load_state_dict(ref.state_dict())
        assert torch.allclose(model(x), y_ref, rtol=1e-5, atol=1e-5), impl


def test_centers_and_widths_take_no_weight_decay():
    model = build_model("sa-quadratic", hidden=8, heads=2, layers=2, intermediate=8)
    names = no_weight_decay(model)
    assert names == {f"layers.{i}.attention.encoding.{p}" for i in range(2) for p in ("centers", "widths")}


def test_model_rejects_bad_overrides_and_inputs():
    with pytest.raises(AttnconvError, match="divisible"):
        build_model("sa-quadratic", image_size=27)
    with pytest.raises(AttnconvError, match="unknown model"):
        build_model("vit")
    with pytest.raises(AttnconvError, match="sa-quadratic"):
        build_model("sa-quadratic", colour=True)
    model = build_model("sa-learned", hidden=8, heads=2, layers=1, intermediate=8)
    with pytest.raises(AttnconvError, match=r"\(B, 3, H, W\)"):
        model(torch.randn(1, 1, 32, 32))


def test_downsample_is_invertible_space_to_depth():
    model = build_model("sa-quadratic", hidden=8, heads=2, layers=1, intermediate=8, image_size=8, in_channels=2)
    x = torch.randn(2, 2, 8, 8)
    down = model.downsample(x)
    assert down.shape == (2, 8, 4, 4)
    assert torch.equal(torch.nn.PixelShuffle(2)(down), x)


def test_grid_init_puts_centers_on_the_kernel_grid():
    model = build_model("sa-quadratic", hidden=8, heads=9, layers=2, intermediate=8, init="grid", locality=2.0)
    enc = model.layers[1].attention.encoding
    expected = {(i, j) for i in (-1, 0, 1) for j in (-1, 0, 1)}
    assert {tuple(c) for c in enc.centers.tolist()} == expected
    # alpha = a^2 / 2 = locality: the score of a head is -2 ||delta - Delta_h||^2
    assert torch.allclose(enc.widths**2 / 2, torch.full((9,), 2.0))
    probs = model.layers[0].attention.attention_probs(size=(7, 7))[0]  # (9, 49, 49)
    q = 3 * 7 + 3
    for h, (di, dj) in enumerate(enc.centers.tolist()):
        assert probs[h, q].argmax().item() == (3 + int(di)) * 7 + (3 + int(dj))


def test_grid_init_needs_a_quadratic_encoding():
    with pytest.raises(AttnconvError, match="quadratic"):
        build_model("sa-learned", init="grid")
    aniso = build_model("sa-quadratic-aniso", hidden=8, heads=4, layers=1, intermediate=8, init="grid")
    assert torch.allclose(aniso.layers[0].attention.encoding.centers,
                          torch.tensor([[-0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]]))


def test_activation_checkpointing_gives_the_same_gradients():
    small = dict(hidden=16, heads=4, layers=2, intermediate=16, image_size=8, in_channels=1, dropout=0.0, attn_dropout=0.0)
    torch.manual_seed(0)
    plain = build_model("sa-quadratic", **small)
    ckpt = build_model("sa-quadratic", checkpoint=True, **small)
    ckpt.load_state_dict(plain.state_dict())
    x = torch.randn(3, 1, 8, 8)
    for m in (plain, ckpt):
        m(x).square().sum().backward()
    for (n, a), (_, b) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), n
