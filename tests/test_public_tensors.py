"""Every tensor the public API takes goes through one check (attnconv.limits: tensor_argument, probabilities_argument):
something that is no tensor, a bool, integer or complex tensor where the layers compute in floating point, a tensor on
the meta device (which holds no values) given to a layer with weights, a tensor on another device or, outside
autocast, in another floating dtype than the layer's weights, and probabilities that are not (NaN, negative, a row
past 1) are one AttnconvError naming the argument: never an AttributeError, IndexError or RuntimeError from torch,
and never an answer computed from a meta tensor as if it held values.

The table below names a call for every tensor parameter of the public callables and methods of `attnconv`,
`attnconv.analysis`, `attnconv.construct`, `attnconv.plots`, `attnconv.models` and `attnconv.training`; the coverage
test fails when one gains a tensor parameter the table does not try.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import typing
import warnings

import pytest
import torch
from test_public_numbers import _refused  # one line naming the argument, said as the numbers' table says it
from torch import nn

import attnconv
from attnconv.errors import AttnconvError

MODULES = ("attnconv", "attnconv.analysis", "attnconv.construct", "attnconv.plots", "attnconv.models",
           "attnconv.training")
# Records attnconv builds and hands back (their fields are its own results), and protocols without code.
NOT_ARGUMENTS = {("CapturedAttention.__init__", "*"), ("ConvLikeness.__init__", "*"),
                 ("EffectiveKernel.__init__", "*"), ("AttentionLayer.attention_probs", "x")}


def public_callables(modules, extra=()) -> list[tuple[str, typing.Callable]]:
    """(qualified name, function) for the public functions of `modules` (their `__all__`) and `extra` ((name, object)
    pairs), and the public methods (and `__init__`) the public classes among them define themselves (not nn.Module's)."""
    objects = [(name, getattr(importlib.import_module(module), name)) for module in modules
               for name in importlib.import_module(module).__all__]
    found = []
    for name, obj in [*objects, *extra]:
        if inspect.isclass(obj):
            found += [(f"{name}.{m}", fn) for m, fn in inspect.getmembers(obj, inspect.isfunction)
                      if (not m.startswith("_") or m == "__init__") and fn.__module__.startswith("attnconv")]
        elif callable(obj) and getattr(obj, "__module__", "").startswith("attnconv"):
            found.append((name, obj))
    return found


def public_tensor_parameters() -> set[tuple[str, str]]:
    """(callable, parameter) for every parameter annotated with Tensor of the public functions, and of the public
    methods the public classes define themselves (not nn.Module's)."""
    found = set()
    for qual, fn in public_callables(MODULES):
        try:
            parameters = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            continue
        tensors = [p.name for p in parameters if "Tensor" in str(p.annotation)]
        if tensors and (qual, "*") in NOT_ARGUMENTS:
            continue
        found.update((qual, p) for p in tensors)
    return found


NOT_TENSORS = ("x", [[1.0]], 3)
KINDS = (torch.ones(1, 2, 8, 8, dtype=torch.bool), torch.ones(1, 2, 8, 8, dtype=torch.long),
         torch.ones(1, 2, 8, 8, dtype=torch.cfloat))


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(*shape, device="meta")


def _odd(t: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`t` in the forms round 59 found taken: float8 (a floating dtype with no arithmetic), sparse, nested."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's prototype and beta notes about nested and sparse tensors
        return t.to(torch.float8_e4m3fn), t.to_sparse(), torch.nested.nested_tensor(list(t))


def cases(run_dir) -> dict[tuple[str, str], tuple[typing.Callable, str, tuple]]:
    """(callable, parameter) -> (call taking the value, the name its error says, the values it must refuse)."""
    from attnconv import analysis as A
    from attnconv import plots as P
    from attnconv.construct import ConvAttention, LearnableConvAttention

    conv = nn.Conv2d(2, 3, 3, padding=1)
    layer = attnconv.conv_to_attention(conv)
    learnable = attnconv.conv_to_attention(conv, learnable=True, key_dim=2)
    assert isinstance(layer, ConvAttention) and isinstance(learnable, LearnableConvAttention)
    sa = attnconv.SelfAttention2d(2, heads=4, max_size=8)
    kernel = attnconv.effective_kernel(layer, (8, 8))
    probs = kernel.probs
    x = torch.randn(1, 2, 8, 8)
    images = NOT_TENSORS + KINDS + _odd(x) + (_meta(1, 2, 8, 8), torch.randn(1, 3, 8, 8))
    tokens = NOT_TENSORS + KINDS + _odd(x.permute(0, 2, 3, 1)) + (_meta(1, 8, 8, 2), x)  # x: channels first
    given = NOT_TENSORS + _odd(probs) + (probs.bool(), probs.cfloat(), _meta(*probs.shape), probs * float("nan"),
                                         -probs, probs * 2, probs[:, :5])
    def run() -> attnconv.Run:  # read when a case is tried (`cases_keys` builds the table without a run)
        return attnconv.Run(run_dir)

    table = {
        ("ConvAttention.forward", "x"): (layer, "x", images),
        ("ConvAttention.error_bound", "x"): (layer.error_bound, "x", images),
        ("ConvAttention.attention_probs", "x"): (lambda v: layer.attention_probs(v), "x", images),
        ("ConvAttention.attention_scores", "x"): (lambda v: layer.attention_scores(v), "x", images),
        ("LearnableConvAttention.forward", "x"): (learnable, "x", images),
        ("LearnableConvAttention.error_bound", "x"): (learnable.error_bound, "x", images),
        ("LearnableConvAttention.attention_probs", "x"): (lambda v: learnable.attention_probs(v), "x", images),
        ("LearnableConvAttention.attention_scores", "x"): (lambda v: learnable.attention_scores(v), "x", images),
        ("LearnableConvAttention.padded_scores", "x"): (learnable.padded_scores, "x", images),
        ("SelfAttention2d.forward", "x"): (sa, "x", images),
        ("SelfAttention2d.attention_probs", "x"): (lambda v: sa.attention_probs(v), "x", images),
        ("SelfAttention2d.attention_scores", "x"): (lambda v: sa.attention_scores(v), "x", images),
        ("SelfAttention2d.folded_linears", "x"): (sa.folded_linears, "x", images),
        ("SelfAttention2d.forward_tokens", "x"): (sa.forward_tokens, "x", tokens),
        ("SelfAttention2d.forward_projected", "x"): (lambda v: sa.forward_projected(v, sa.out.weight, None), "x",
                                                     tokens),
        ("SelfAttention2d.forward_projected", "weight"): (
            lambda v: sa.forward_projected(x.permute(0, 2, 3, 1), v, None), "weight",
            NOT_TENSORS + (sa.out.weight.bool(), sa.out.weight.double(), _meta(2, sa.out.in_features),
                           sa.out.weight.T)),
        ("SelfAttention2d.forward_projected", "bias"): (
            lambda v: sa.forward_projected(x.permute(0, 2, 3, 1), sa.out.weight, v), "bias",
            NOT_TENSORS + (torch.ones(2, dtype=torch.long), _meta(2), torch.ones(3))),
        ("EffectiveKernel.apply", "x"): (kernel.apply, "x", images + (torch.randn(1, 2, 6, 6), torch.randn(4))),
        ("effective_kernel", "probs"): (lambda v: attnconv.effective_kernel(layer, (8, 8), probs=v), "probs", given),
        ("analyze_layer", "probs"): (lambda v: A.analyze_layer(layer, (8, 8), probs=v), "probs", given),
        ("analyze_layer", "x"): (lambda v: A.analyze_layer(learnable, (8, 8), v), "x",
                                 images + (x * float("inf"),)),
        ("head_geometry", "probs"): (lambda v: A.head_geometry(layer, (8, 8), probs=v), "probs", given),
        ("analyze_sites", "probs"): (lambda v: A.analyze_sites(run().sites, [v]), "probs",
                                     NOT_TENSORS + (_meta(4, 49, 49), torch.full((4, 49, 49), float("nan")))),
        ("head_snapshot", "x"): (lambda v: A.head_snapshot(run().model, v), "x",
                                 NOT_TENSORS + KINDS + (_meta(2, 1, 28, 28),)),  # NaN: site_probs' own line
        ("maps_figure", "probs"): (lambda v: P.maps_figure(v, (8, 8), (3, 3), 3), "probs",
                                   ("x", 3, [], [probs[0]]) + tuple([p] for p in given[len(NOT_TENSORS):-1])),
        ("capture_attention", "images"): (lambda v: attnconv.capture_attention(nn.Sequential(sa), v), "images",
                                          NOT_TENSORS + (_meta(1, 2, 8, 8), x * float("nan"))),
        ("Run.predict", "images"): (lambda v: run().predict(v), "images",
                                    (3, b"x", [3], torch.zeros(1, 1, 28, 28), _meta(1, 1, 28, 28).to(torch.uint8))),
        ("Run.transform", "images"): (lambda v: run().transform(v), "images",
                                      (3, b"x", [3], torch.zeros(1, 1, 28, 28), _meta(1, 1, 28, 28).to(torch.uint8))),
    }
    return table


def cases_keys() -> set[tuple[str, str]]:
    return set(cases(None))


def test_every_tensor_parameter_of_the_public_api_is_tried():
    missing = sorted(public_tensor_parameters() - cases_keys() - NOT_ARGUMENTS)
    assert not missing, f"public tensor parameters no case tries (add them to the table in this file): {missing}"


@pytest.fixture(scope="module")
def table(tiny_attention_runs):
    return cases(tiny_attention_runs["sa-quadratic"])


@pytest.mark.parametrize("key", sorted(cases_keys()), ids="-".join)
def test_public_tensors_refused_in_one_line_naming_the_argument(key, table):
    call, name, bad = table[key]
    for value in bad:
        _refused(call, value, name)


def test_round_58_b_what_the_tensor_checks_take_and_refuse(tiny_attention_runs, tmp_path):
    """Round 58: a meta tensor given to a converted layer or to effective_kernel(probs=) was computed with as if it held
    values (a CPU tensor of numbers came back); bool, complex and integer inputs reached torch's errors, and
    error_bound answered for a complex input forward refuses; Run(123), Run(device="meta") and Run.predict(123) failed
    inside; axis_offsets took any axis. What the checks must still take: a layer and its input both on the meta device
    (shapes without values), another floating dtype under autocast, float64 probabilities for a float32 layer,
    a zero-padded layer's own probabilities (rows summing to less than 1), one image file for predict."""
    conv = nn.Conv2d(2, 3, 3, padding=1)
    layer = attnconv.conv_to_attention(conv)
    with pytest.raises(AttnconvError, match=r"^x is on the meta device, which holds no values"):
        layer(_meta(1, 2, 8, 8))
    for made in (lambda: attnconv.conv_to_attention(conv), lambda: attnconv.conv_to_attention(conv, learnable=True,
                                                                                                  key_dim=2),
                 lambda: attnconv.SelfAttention2d(2, heads=4, max_size=8)):
        on_meta = made().to("meta")
        assert on_meta(_meta(2, 2, 8, 8)).shape[:2] == (2, on_meta(_meta(1, 2, 8, 8)).shape[1])
        if hasattr(on_meta, "error_bound"):
            with pytest.raises(AttnconvError, match=r"^x is on the meta device"):
                on_meta.error_bound(_meta(1, 2, 8, 8))
        with pytest.raises(AttnconvError, match=r"^the layer's weights are on the meta device, which holds no values: "
                                                r"load them first \(layer.to_empty\(device='cpu'\)"):
            on_meta(torch.ones(1, 2, 8, 8))
    with pytest.raises(AttnconvError, match=r"^x is a tensor of complex64"):
        layer.error_bound(torch.ones(1, 2, 8, 8, dtype=torch.cfloat))
    x = torch.randn(2, 2, 8, 8)
    with pytest.raises(AttnconvError, match=r"^x is float64, the layer's weights float32: give x in float32"):
        layer(x.double())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x.bfloat16()).shape == (2, 3, 8, 8)
    assert torch.allclose(layer.double()(x.double()), conv.double()(x.double()), atol=1e-12)
    layer.float()

    kernel = attnconv.effective_kernel(layer, (8, 8))
    assert float(kernel.probs.sum(-1).amin()) < 0.9  # the zero padding's keys dropped out at the border
    again = attnconv.effective_kernel(layer, (8, 8), probs=kernel.probs.double())
    assert torch.allclose(again.apply(x.double()), conv.double()(x.double()), atol=1e-9)
    assert again.apply(x).dtype == torch.float32 and again.at(3).dtype == torch.float64
    with pytest.raises(AttnconvError, match=r"^probs has a row summing to 2"):
        attnconv.effective_kernel(layer, (8, 8), probs=kernel.probs * 2)
    with pytest.raises(AttnconvError, match=r"^the layer's weights are on the meta device"):
        attnconv.effective_kernel(attnconv.conv_to_attention(conv).to("meta"), (8, 8))
    with pytest.raises(AttnconvError, match=r"^conv_likeness: the kernel is on the meta device"):
        attnconv.conv_likeness(dataclasses.replace(kernel, probs=kernel.probs.to("meta")))
    for axis in (2, -1, "0", 0.0, True):
        with pytest.raises(AttnconvError, match=r"^axis .* is invalid: give a spatial axis of this 2-d layer"):
            layer.axis_offsets(axis)
    assert layer.axis_offsets(1).tolist() == [-1, 0, 1]

    run_dir = tiny_attention_runs["sa-quadratic"]
    for call, words in ((lambda: attnconv.Run(123), r"^run 123 is invalid: give the run's directory"),
                        (lambda: attnconv.Run(run_dir, device="meta"), r"^device 'meta' is not a device")):
        with pytest.raises(AttnconvError, match=words):
            call()
    from PIL import Image

    Image.new("L", (28, 28), 128).save(tmp_path / "one.png")
    run = attnconv.Run(run_dir, device=torch.device("cpu"))
    assert run.predict(str(tmp_path / "one.png")) == run.predict([tmp_path / "one.png"])


def test_round_59_a_odd_tensors_and_probabilities_nowhere_measured(tiny_attention_runs):
    """Round 59: float8, sparse and nested tensors passed the check (float8 was even advised as the layer's dtype) and
    failed inside torch; `analyze_layer` blamed probs it was not given for an input of another size; `maps_figure`
    drew NaN, negative and doubled probabilities; `conv_likeness` of a kernel with NaN probabilities measured a
    distance of 0; `site_scores` and `site_maps` did not check the images `site_probs` checks."""
    from attnconv import analysis as A
    from attnconv.models.sites import site_maps, site_probs, site_scores

    conv = nn.Conv2d(2, 3, 3, padding=1)
    layer = attnconv.conv_to_attention(conv)
    x = torch.randn(1, 2, 8, 8)
    eight, sparse, nested = _odd(x)
    for value, words in ((eight, r"^x is a tensor of float8_e4m3fn, which is not computed with: give x in a floating-"
                                 r"point dtype, float16, bfloat16, float32 or float64"),
                         (sparse, r"^x is a sparse coo tensor: give .* as a dense tensor of one shape \(x.to_dense\(\)"),
                         (nested, r"^x is a nested tensor \(a list of tensors of their own shapes\)")):
        with pytest.raises(AttnconvError, match=words):
            layer(value)
    learnable = attnconv.conv_to_attention(conv, learnable=True, key_dim=2)
    with pytest.raises(AttnconvError, match=r"^x of size \(7, 7\) does not match size \(8, 8\)"):
        A.analyze_layer(learnable, (8, 8), torch.randn(1, 2, 7, 7))
    kernel = attnconv.effective_kernel(layer, (8, 8))
    with pytest.raises(AttnconvError, match=r"^the kernel's probs has \d+ NaN or infinite values"):
        attnconv.conv_likeness(dataclasses.replace(kernel, probs=kernel.probs * float("nan")))
    assert attnconv.conv_likeness(kernel).distance < 1e-6  # a converted layer: a convolution

    run = attnconv.Run(tiny_attention_runs["sa-quadratic"])
    for call in (site_probs, site_scores, site_maps):
        for value, words in ((torch.zeros(1, 1, 28, 28, dtype=torch.long), r"^x is a tensor of int64"),
                             (torch.zeros(1, 1, 28, 28).to_sparse(), r"^x is a sparse coo tensor"),
                             (torch.zeros(1, 1, 28, 28).to(torch.float8_e5m2), r"^x is a tensor of float8_e5m2")):
            with pytest.raises(AttnconvError, match=words):
                call(run.model, run.sites, value)
    with pytest.raises(AttnconvError, match=r"^probs \[\] is invalid: give one \(heads, T_out, T_in\) tensor per site"):
        A.analyze_sites(run.sites, [])


def test_round_60_a_vmap_gradients_and_nested_images():
    """Round 60: a converted layer failed under torch.func.vmap (its output's layout was queried from a batched
    input: "NYI"), where nn.Conv2d runs; `maps_figure` failed on sound probabilities that require grad (`.numpy()`),
    which the analyses take; `capture_attention` of a nested tensor failed inside torch (its length was asked first)."""
    from attnconv import plots as P

    conv = nn.Conv2d(4, 4, 3, padding=1)
    layer = attnconv.conv_to_attention(conv)
    x = torch.randn(2, 4, 6, 6)
    mapped = torch.func.vmap(lambda xi: layer(xi[None])[0])(x)
    assert torch.allclose(mapped, conv(x), atol=1e-5) and torch.allclose(mapped, layer(x), atol=1e-6)
    logits = torch.randn(4, 36, 36, requires_grad=True)
    probs = torch.softmax(logits, -1)
    assert P.maps_figure([probs], (6, 6), (2, 2), 3) is not None and probs.requires_grad
    (_, sparse, nested) = _odd(torch.randn(2, 1, 16, 16))

    class Patches(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.attention = nn.Conv2d(1, 16, 4, 4), nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, images):
            tokens = self.embed(images).flatten(2).transpose(1, 2)
            return self.attention(tokens, tokens, tokens)[0]

    for images, words in ((nested, "a nested tensor"), (sparse, "a sparse coo tensor")):
        with pytest.raises(AttnconvError, match=rf"^capture_attention: the images are {words}"):
            attnconv.capture_attention(Patches().eval(), images)


def test_round_75_a_stacked_dropout_estimate_resnet_images_and_converted_shapes(monkeypatch, memory_asked):
    """Round 75: the stacked path's dropout (its transposed copy, then the mask and output beside it) peaked at 1.34x
    the forward's memory estimate of three matrices; the ResNet of `build_model` took images of any dtype, device or
    shape to torch's kernels ("expected scalar type Byte but found Float"); a converted convolution said an unbatched
    input of the wrong channels as the batch of one it makes of it, "got (1, 2, 6, 6)"."""
    from attnconv import SelfAttention2d, build_model, conv_to_attention

    T2 = float(5 * 5) ** 2
    cases = [(SelfAttention2d(2, heads=3, impl="stacked", attn_dropout=0.1, attn_dropout_mask="shared"), 1),
             (SelfAttention2d(2, heads=3, impl="stacked", attn_dropout=0.1), 2),
             (SelfAttention2d(2, heads=3, impl="stacked", encoding="learned-content", attn_dropout=0.1), 2)]
    asked = memory_asked()  # every check refuses: what it counted is recorded
    for layer, images in cases:
        for training, matrices in ((True, 4), (False, 3)):
            with pytest.raises(AttnconvError, match="the attention of 5x5 tokens"):
                layer.train(training)(torch.randn(2, 2, 5, 5))
            expected = matrices * 4 * (images if training else 1 + layer.encoding_name.endswith("content")) * 3 * T2
            assert asked[-1] == expected, (layer.encoding_name, training, asked[-1], expected)
    monkeypatch.undo()

    model = build_model("resnet18", width=4).eval()
    for x, said in ((torch.zeros(1, 3, 8, 8, dtype=torch.uint8), "x is a tensor of uint8, which is not computed with"),
                    (torch.zeros(1, 3, 8, 8, dtype=torch.float64), "x is float64, the model's weights float32"),
                    (torch.zeros(1, 3, 8, 8, device="meta"), "x is on the meta device"),
                    (torch.zeros(3, 8, 8), r"expects images \(B, 3, H, W\), got \(3, 8, 8\) \(one image: give x\[None\]\)"),
                    (torch.zeros(1, 1, 8, 8), r"expects images \(B, 3, H, W\), got \(1, 1, 8, 8\)$")):
        with pytest.raises(AttnconvError, match=said):
            model(x)
    assert model(torch.zeros(2, 3, 8, 8)).shape == (2, 10)
    for name, size in (("sa-quadratic", 8), ("vit", 32)):
        other = build_model(name, **({"hidden": 8, "heads": 2, "layers": 1} if name != "vit" else {}))
        with pytest.raises(AttnconvError, match=r"one image: give x\[None\]"):
            other(torch.zeros(3, size, size))

    for conv, x in ((nn.Conv2d(3, 4, 3), torch.randn(2, 6, 6)), (nn.Conv1d(3, 4, 3), torch.randn(2, 10)),
                    (nn.Conv3d(3, 4, 3), torch.randn(5, 5, 5, 5)), (nn.Conv2d(3, 4, 3), torch.randn(6, 6))):
        with pytest.raises(AttnconvError, match=rf"or unbatched \(3, .*\), got {re.escape(str(tuple(x.shape)))}$"):
            conv_to_attention(conv)(x)
    conv = nn.Conv2d(3, 4, 3)
    x = torch.randn(3, 6, 6)
    torch.testing.assert_close(conv_to_attention(conv)(x), conv(x), rtol=1e-4, atol=1e-5)


def test_round_75_a_shapes_said_with_the_forms_taken(tiny_attention_runs):
    """Round 75: `attention_probs` of a 2-d input named only the batched form, though it takes one unbatched image too;
    `Run.predict` of one uint8 image opened with "must be uint8 ... got torch.uint8 (1, 28, 28)", its dtype as
    the fault, and did not say how to make it a batch."""
    from attnconv import Run, SelfAttention2d

    with pytest.raises(AttnconvError, match=r"expects input \(B, 3, H, W\) or unbatched \(3, H, W\), got \(5, 5\)$"):
        SelfAttention2d(3, heads=4).attention_probs(torch.randn(5, 5))
    run = Run(tiny_attention_runs["sa-quadratic"])
    one = torch.zeros(1, 28, 28, dtype=torch.uint8)
    with pytest.raises(AttnconvError, match=r"got shape \(1, 28, 28\) \(one image: give images\[None\]\)$"):
        run.predict(one)
    with pytest.raises(AttnconvError, match=r"got shape \(28, 28\) \(one image: give images\[None\]\[None\]\)$"):
        run.predict(one[0])
    with pytest.raises(AttnconvError, match=r"got int64 where uint8 \(0\.\.255\) is read and shape \(2, 1, 7, 7\)$"):
        run.predict(torch.zeros(2, 1, 7, 7, dtype=torch.int64))
    assert len(run.predict(one[None])) == 1
