"""Every number the public API takes goes through one check (attnconv.limits: whole_number, positive_ints,
real_number, or a config field's range): a bool, a string, a float where a whole number belongs, NaN, inf, a value
out of range or of the wrong kind is one AttnconvError naming the argument, never a silent truncation and never
a traceback from torch, numpy or matplotlib.

The table below names a call for every numeric parameter of the public callables of `attnconv`,
`attnconv.analysis`, `attnconv.construct`, `attnconv.plots`, `attnconv.models` and `attnconv.training`, and every
numeric field of the model and training configs (through `make_config` and `build_model`); the coverage test
fails when a public function gains a numeric parameter the table does not try, so none is added unchecked.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import typing

import numpy as np
import pytest
import torch
from torch import nn

import attnconv
from attnconv import options
from attnconv.errors import AttnconvError

MODULES = ("attnconv", "attnconv.analysis", "attnconv.construct", "attnconv.plots", "attnconv.models",
           "attnconv.training")
# Records attnconv builds and hands back (not arguments a user chooses), and data rather than sizes or settings.
NOT_ARGUMENTS = {
    ("AttentionSite", "size"), ("CapturedAttention", "call"), ("CapturedAttention", "size"),
    ("CapturedAttention", "query_size"), ("CapturedAttention", "left_out"), ("CapturedAttention", "images"),
    ("CapturedAttention", "image_size"), ("ConvLikeness", "kernel_size"), ("ConvLikeness", "size"),
    ("ConvLikeness", "distance"), ("EffectiveKernel", "in_size"), ("EffectiveKernel", "out_size"),
    ("confusion_figure", "confusion"), ("curves_figure", "rows"), ("flat_map_label", "values"),
    ("gaussian_ellipse", "inverse_covariance"), ("misclassified_figure", "true"),
    ("misclassified_figure", "predicted"), ("misclassified_figure", "probabilities"), ("spread_epochs", "available"),
    # the configs' base class: its fields are tried through each model's config below
    ("ImageModelConfig", "*"),
}
WHOLE_BAD = (True, 7.5, "3", float("nan"), float("inf"), -1, 2**70, np.array([3, 3]), object())
REAL_BAD = (True, "3", float("nan"), float("inf"), -1, np.array([0.5, 0.5]), 1j, object())


def _numeric(annotation: object) -> bool:
    return any(word in str(annotation) for word in ("int", "float"))


def public_numeric_parameters() -> set[tuple[str, str]]:
    found = set()
    for module in MODULES:
        mod = importlib.import_module(module)
        for name in mod.__all__:
            obj = getattr(mod, name)
            if dataclasses.is_dataclass(obj) and options.option_fields(obj):
                found.add((name, "*"))
                continue
            fn = obj.__init__ if inspect.isclass(obj) else obj
            if not callable(fn):
                continue
            try:
                signature = inspect.signature(fn)
            except (TypeError, ValueError):
                continue
            found.update((name, p.name) for p in signature.parameters.values() if _numeric(p.annotation))
    return found


@pytest.fixture(scope="module")
def run_dir(tiny_attention_runs):
    return tiny_attention_runs["sa-quadratic"]


def cases(run_dir) -> dict[tuple[str, str], tuple[typing.Callable, str, tuple]]:
    """(owner, parameter) -> (call taking the value, the name its error says, the values it must refuse)."""
    from matplotlib.figure import Figure

    from attnconv import analysis as A
    from attnconv import construct as C
    from attnconv import plots as P
    from attnconv.training import learning_rate

    conv = nn.Conv2d(2, 3, 3, padding=1)
    layer = attnconv.SelfAttention2d(4, heads=4, max_size=8)
    model = nn.Sequential(layer)
    kw = {"stride": (1, 1), "padding": ((1, 1), (1, 1)), "dilation": (1, 1), "alpha": 10.0}
    probs = [torch.softmax(torch.randn(2, 16, 16), -1)]
    snapshots = [{"epoch": 1, "step": 1, "layers": [[{"center": [0.0, 1.0], "attention_distance": 1.0}] * 4]}]
    images = np.zeros((2, 1, 4, 4), np.uint8)
    figure = Figure()
    W, R = WHOLE_BAD, REAL_BAD
    none_bad = (None,)
    table = {
        ("ConvAttention", "in_channels"): (lambda v: C.ConvAttention(v, 2, (3, 3), **kw), "in_channels", W + none_bad),
        ("ConvAttention", "out_channels"): (lambda v: C.ConvAttention(2, v, (3, 3), **kw), "out_channels", W + none_bad),
        ("ConvAttention", "kernel_size"): (lambda v: C.ConvAttention(2, 2, (3, v), **kw), "kernel_size", W + none_bad),
        ("ConvAttention", "stride"): (lambda v: C.ConvAttention(2, 2, (3, 3), **{**kw, "stride": (1, v)}), "stride",
                                      W + none_bad),
        ("ConvAttention", "padding"): (lambda v: C.ConvAttention(2, 2, (3, 3), **{**kw, "padding": ((1, v), (1, 1))}),
                                       "padding", W + none_bad),
        ("ConvAttention", "dilation"): (lambda v: C.ConvAttention(2, 2, (3, 3), **{**kw, "dilation": (v, 1)}),
                                        "dilation", W + none_bad),
        ("ConvAttention", "groups"): (lambda v: C.ConvAttention(2, 2, (3, 3), groups=v, **kw), "groups",
                                      W + none_bad),
        ("ConvAttention", "alpha"): (lambda v: C.ConvAttention(2, 2, (3, 3), **{**kw, "alpha": v}), "alpha",
                                     R + none_bad),
        ("LearnableConvAttention", "key_dim"): (lambda v: C.conv_to_attention(conv, learnable=True, key_dim=v),
                                                "key_dim", W + none_bad),
        ("conv_to_attention", "alpha"): (lambda v: attnconv.conv_to_attention(conv, alpha=v), "alpha", R),
        ("conv_to_attention", "key_dim"): (lambda v: attnconv.conv_to_attention(conv, learnable=True, key_dim=v),
                                           "key_dim", W + none_bad),
        ("cnn_to_attention", "alpha"): (lambda v: attnconv.cnn_to_attention(nn.Sequential(conv), alpha=v), "alpha",
                                        R),
        ("cnn_to_attention", "key_dim"): (lambda v: attnconv.cnn_to_attention(nn.Sequential(conv), learnable=True,
                                                                              key_dim=v), "key_dim", W + none_bad),
        ("conv_likeness", "size"): (lambda v: attnconv.conv_likeness(layer, (6, v)), "size", W + none_bad),
        ("conv_likeness", "kernel_size"): (lambda v: attnconv.conv_likeness(layer, 6, kernel_size=v), "kernel_size",
                                           W + none_bad),
        ("effective_kernel", "size"): (lambda v: attnconv.effective_kernel(layer, 6, v), "size", W + none_bad),
        ("analyze_layer", "size"): (lambda v: attnconv.analyze_layer(layer, (6, v)), "size", W + none_bad),
        ("analyze_run", "images"): (lambda v: attnconv.analyze_run(run_dir, images=v), "images", W + none_bad),
        ("attention_sites", "input_shape"): (lambda v: attnconv.attention_sites(model, (4, 6, v)), "input_shape",
                                             W + none_bad),
        ("attention_sites", "grid"): (lambda v: attnconv.attention_sites(model, (4, 6, 6), grid=(6, v)), "grid",
                                      W + none_bad),
        ("attention_sites", "leading"): (lambda v: attnconv.attention_sites(model, (4, 6, 6), leading=v), "leading",
                                         W),
        ("attention_sites", "trailing"): (lambda v: attnconv.attention_sites(model, (4, 6, 6), trailing=v),
                                          "trailing", W),
        ("capture_attention", "grid"): (lambda v: attnconv.capture_attention(model, torch.rand(1, 4, 6, 6),
                                                                             grid=(6, v)), "grid", W + none_bad),
        ("capture_attention", "leading"): (lambda v: attnconv.capture_attention(model, torch.rand(1, 4, 6, 6),
                                                                                leading=v), "leading", W),
        ("capture_attention", "trailing"): (lambda v: attnconv.capture_attention(model, torch.rand(1, 4, 6, 6),
                                                                                 trailing=v), "trailing", W),
        ("capture_attention", "max_bytes"): (lambda v: attnconv.capture_attention(model, torch.rand(1, 4, 6, 6),
                                                                                  max_bytes=v), "max_bytes",
                                             tuple(x for x in W if x is not W[6]) + none_bad),
        ("train", "log_every"): (lambda v: attnconv.train(attnconv.make_config(preset="fmnist-sa-quadratic"),
                                                          run_dir.parent / "never-written", log_every=v),
                                 "log_every", W),
        ("analyze_sites", "images"): (lambda v: A.analyze_sites([], [], images=v), "images", W + none_bad),
        ("grid_likeness", "kernel"): (lambda v: A.grid_likeness(snapshots, kernel=v), "kernel", W + none_bad),
        ("grid_likeness", "tol"): (lambda v: A.grid_likeness(snapshots, tol=v), "tol", R + none_bad),
        ("grid_points", "kernel"): (A.grid_points, "kernel", W + none_bad),
        ("head_geometry", "size"): (lambda v: A.head_geometry(layer, (6, v)), "size", W + none_bad),
        ("match_to_grid", "kernel"): (lambda v: A.match_to_grid(np.zeros((4, 2)), v), "kernel", W + none_bad),
        ("match_to_grid", "tol"): (lambda v: A.match_to_grid(np.zeros((4, 2)), 3, tol=v), "tol", R + none_bad),
        ("default_alpha", "ndim"): (lambda v: C.default_alpha(torch.float32, v), "ndim", W + none_bad),
        ("leakage_bound", "alpha"): (lambda v: C.leakage_bound(v, 2), "alpha", R + none_bad),
        ("leakage_bound", "ndim"): (lambda v: C.leakage_bound(10.0, v), "ndim", W + none_bad),
        ("centers_figure", "grid"): (lambda v: P.centers_figure([{"centers": [[0.0, 1.0]]}], v), "grid",
                                     W + none_bad),
        ("centers_figure", "ncols"): (lambda v: P.centers_figure([{"centers": [[0.0, 1.0]]}], 3, ncols=v), "ncols",
                                      W),
        ("conv_heads_figure", "size"): (lambda v: P.conv_heads_figure(attnconv.conv_to_attention(conv), (4, v)), "size",
                                        W + none_bad),
        ("figure_png", "dpi"): (lambda v: P.figure_png(figure, v), "dpi", W + none_bad),
        ("save_figure", "dpi"): (lambda v: P.save_figure(figure, run_dir.parent / "never.png", v), "dpi",
                                 W + none_bad),
        ("figure_writer", "dpi"): (lambda v: P.figure_writer(figure, "png", v), "dpi", W + none_bad),
        ("gaussian_ellipse", "mass"): (lambda v: P.gaussian_ellipse(np.eye(2), v), "mass", R + (1.0,)),
        ("mass_level", "mass"): (lambda v: P.mass_level(np.ones(9) / 9, v), "mass", R + none_bad),
        ("head_colors", "n"): (P.head_colors, "n", W + none_bad),
        ("maps_figure", "size"): (lambda v: P.maps_figure(probs, (4, v), (1, 1), 3), "size", W + none_bad),
        ("maps_figure", "query"): (lambda v: P.maps_figure(probs, (4, 4), (1, v), 3), "query", W + none_bad),
        ("maps_figure", "zoom"): (lambda v: P.maps_figure(probs, (4, 4), (1, 1), v), "zoom", W + none_bad),
        ("maps_figure", "downsample"): (lambda v: P.maps_figure(probs, (4, 4), (1, 1), 3, downsample=v),
                                        "downsample", W + none_bad),
        ("maps_of_run", "query"): (lambda v: P.maps_of_run(attnconv.Run(run_dir), probs, query=(1, v)), "query", W),
        ("maps_of_run", "zoom"): (lambda v: P.maps_of_run(attnconv.Run(run_dir), probs, zoom=v), "zoom", W),
        ("misclassified_figure", "limit"): (lambda v: P.misclassified_figure(images, [0, 1], [1, 0], ["a", "b"],
                                                                             [0.5, 0.6], limit=v), "limit",
                                            W + none_bad),
        ("plot_centers", "images"): (lambda v: P.plot_centers(run_dir, run_dir.parent / "c.png", images=v), "images",
                                     W + none_bad),
        ("plot_centers_history", "layer"): (lambda v: P.plot_centers_history(run_dir, run_dir.parent / "h.png",
                                                                             layer=v), "layer", W + none_bad),
        ("plot_centers_history", "epochs"): (lambda v: P.plot_centers_history(run_dir, run_dir.parent / "h.png",
                                                                              epochs=[v]), "epochs", W),
        ("plot_figures", "images"): (lambda v: P.plot_figures(run_dir, run_dir.parent / "f", images=v), "images",
                                     W + none_bad),
        ("plot_maps", "images"): (lambda v: P.plot_maps(run_dir, run_dir.parent / "m.png", images=v), "images",
                                  W + none_bad),
        ("plot_maps", "query"): (lambda v: P.plot_maps(run_dir, run_dir.parent / "m.png", query=(1, v)), "query", W),
        ("plot_maps", "zoom"): (lambda v: P.plot_maps(run_dir, run_dir.parent / "m.png", zoom=v), "zoom", W),
        ("plot_maps", "image"): (lambda v: P.plot_maps(run_dir, run_dir.parent / "m.png", image=v), "image", W),
        ("spread_epochs", "count"): (lambda v: P.spread_epochs([1, 2, 3, 4], v), "count", W + none_bad),
        ("learning_rate", "step"): (lambda v: learning_rate(attnconv.make_config(preset="fmnist-sa-quadratic"), v, 20),
                                    "step", tuple(x for x in W if x is not W[6]) + none_bad),
        ("learning_rate", "total_steps"): (lambda v: learning_rate(attnconv.make_config(preset="fmnist-sa-quadratic"),
                                                                   3, v), "total_steps",
                                           tuple(x for x in W if x is not W[6]) + none_bad),
    }
    sa_bad = W + none_bad
    for name in ("in_channels", "heads", "max_size", "stride"):
        table["SelfAttention2d", name] = (lambda v, n=name: attnconv.SelfAttention2d(**{"in_channels": 4, n: v}),
                                          name, sa_bad)
    for name in ("out_channels", "head_dim", "key_dim", "pos_dim"):
        encoding = {"pos_dim": "learned", "key_dim": "learned"}.get(name, "quadratic")
        value = "project" if name == "head_dim" else "shared"
        table["SelfAttention2d", name] = (lambda v, n=name, e=encoding, m=value: attnconv.SelfAttention2d(
            4, heads=4, encoding=e, value=m, **{n: v}), name, W)
    table["SelfAttention2d", "attn_dropout"] = (lambda v: attnconv.SelfAttention2d(4, heads=4, attn_dropout=v),
                                                "attn_dropout", R + none_bad + (1.0,))
    return table


def config_cases() -> list[tuple[str, str, typing.Callable, tuple]]:
    """(config class, field, call, values it must refuse) for every numeric options field."""
    from attnconv import models as M
    from attnconv.models.registry import build_model

    out = []
    owners = {attnconv.TrainConfig: lambda n, v: attnconv.make_config(preset="fmnist-sa-quadratic", **{n: v}),
              M.ClassifierConfig: lambda n, v: build_model("sa-learned" if n == "pos_dim" else "sa-quadratic",
                                                           **{n: v}),
              M.ViTConfig: lambda n, v: build_model("vit", **{n: v}),
              M.ResNetConfig: lambda n, v: build_model("resnet18", **{n: v})}
    for cls, make in owners.items():
        hints = typing.get_type_hints(cls)
        for f in options.option_fields(cls):
            kind = options._scalar(hints[f.name])
            if kind not in (int, float):
                continue
            low, high = f.metadata["low"], f.metadata["high"]
            bad = [True, "3", float("nan"), float("inf"), np.array([1, 1]), object()]
            bad += [low - 1] if low is not None else []
            bad += [high * 2 + 1] if high is not None and math.isfinite(high) else []
            bad += [7.5] if kind is int and (low is None or low <= 7.5) and (high is None or 7.5 <= high) else []
            if typing.get_origin(hints[f.name]) is tuple:
                call = lambda v, n=f.name, mk=make: mk(n, (v,))  # noqa: E731 - milestones: a tuple of them
            else:
                call = lambda v, n=f.name, mk=make: mk(n, v)  # noqa: E731
            out.append((cls.__name__, f.name, call, tuple(bad)))
    return out


def test_every_numeric_parameter_of_the_public_api_is_tried():
    configs = {(owner, "*") for owner, *_ in config_cases()}
    missing = sorted(public_numeric_parameters() - cases_keys() - configs - NOT_ARGUMENTS)
    assert not missing, f"public numeric parameters no case tries (add them to the table in this file): {missing}"


def cases_keys() -> set[tuple[str, str]]:
    return set(cases(None))


def _refused(call: typing.Callable, value: object, name: str) -> None:
    try:
        call(value)
    except AttnconvError as err:
        message = str(err)
    except Exception as err:  # noqa: BLE001 - said as the failure, with the value that caused it
        pytest.fail(f"{name}={value!r}: {type(err).__name__}: {err}")
    else:
        pytest.fail(f"{name}={value!r} was taken")
    assert name in message, f"{value!r}: the error does not name {name}: {message}"
    assert "\n" not in message and len(message) < 400, message


@pytest.mark.parametrize("key", sorted(cases_keys()), ids="-".join)
def test_public_numbers_refused_in_one_line_naming_the_argument(key, run_dir):
    call, name, bad = cases(run_dir)[key]
    for value in bad:
        _refused(call, value, name)


@pytest.mark.parametrize("owner,field,call,bad", config_cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_config_numbers_refused_in_one_line_naming_the_field(owner, field, call, bad):
    for value in bad:
        _refused(call, value, field)


def test_real_numbers_taken_from_numpy_and_0d_tensors_as_python_floats():
    from attnconv.construct import leakage_bound
    from attnconv.limits import real_number

    for value in (2.5, 2, np.float32(2.5), np.int64(2), torch.tensor(2.5), np.array(2.5)):
        got = real_number(value, "alpha", "a width", low=0, low_open=True)
        assert type(got) is float and got == float(value)
    conv = nn.Conv2d(2, 3, 3, padding=1)
    assert attnconv.conv_to_attention(conv, alpha=np.float64(12.0)).alpha == 12.0
    assert leakage_bound(torch.tensor(12.0), 2) == leakage_bound(12.0, 2)


# A value each cheap call takes (as a Python number and as numpy's): the refusals above are of wrong values only.
TAKEN = {("ConvAttention", "in_channels"): 2, ("ConvAttention", "out_channels"): 4, ("ConvAttention", "kernel_size"): 2,
         ("ConvAttention", "stride"): 2, ("ConvAttention", "padding"): 0, ("ConvAttention", "dilation"): 2,
         ("ConvAttention", "groups"): 2, ("ConvAttention", "alpha"): 3.5, ("conv_to_attention", "alpha"): 3.5,
         ("conv_to_attention", "key_dim"): 2, ("cnn_to_attention", "alpha"): 3.5, ("conv_likeness", "size"): 5,
         ("conv_likeness", "kernel_size"): 5, ("effective_kernel", "size"): 5, ("analyze_layer", "size"): 5,
         ("attention_sites", "grid"): 6, ("capture_attention", "max_bytes"): 10**6,
         ("analyze_sites", "images"): 3, ("grid_likeness", "kernel"): 5, ("grid_likeness", "tol"): 0.25,
         ("grid_points", "kernel"): 5, ("head_geometry", "size"): 5, ("match_to_grid", "kernel"): 1,
         ("match_to_grid", "tol"): 2, ("default_alpha", "ndim"): 3, ("leakage_bound", "alpha"): 2,
         ("leakage_bound", "ndim"): 1, ("centers_figure", "grid"): 5, ("centers_figure", "ncols"): 2,
         ("figure_png", "dpi"): 20, ("figure_writer", "dpi"): 20, ("gaussian_ellipse", "mass"): 0.5,
         ("mass_level", "mass"): 0.5, ("head_colors", "n"): 3, ("maps_figure", "zoom"): 5,
         ("maps_figure", "query"): 2, ("maps_figure", "downsample"): 2, ("misclassified_figure", "limit"): 1,
         ("spread_epochs", "count"): 2, ("SelfAttention2d", "heads"): 2, ("SelfAttention2d", "max_size"): 9,
         ("SelfAttention2d", "stride"): 2, ("SelfAttention2d", "head_dim"): 3, ("SelfAttention2d", "pos_dim"): 3,
         ("SelfAttention2d", "attn_dropout"): 0.5, ("learning_rate", "step"): 7, ("learning_rate", "total_steps"): 9}


@pytest.mark.parametrize("key", sorted(TAKEN), ids="-".join)
def test_public_numbers_take_sound_values_from_python_and_numpy(key):
    call, _, _ = cases(None)[key]
    value = TAKEN[key]
    call(value)
    call(np.float64(value) if isinstance(value, float) else np.int64(value))


def test_numpy_and_tensor_numbers_in_a_config_are_stored_as_python_numbers():
    """Round 54: numpy floats in make_config's float fields were kept (state.pt then pickled a numpy scalar and the
    resume called it corrupt), np.float32 and 0-d float tensors were refused as not numbers, and numpy integers in
    model_overrides made `train` die writing config.json."""
    import json

    config = attnconv.make_config(preset="fmnist-sa-quadratic", lr=np.float64(0.01), momentum=np.float32(0.5),
                                  warmup=torch.tensor(0.25), milestones=(np.float64(0.3), 0.6),
                                  model_overrides={"hidden": np.int64(16), "dropout": np.float32(0.5),
                                                   "heads": torch.tensor(2)})
    assert (type(config.lr), type(config.momentum), type(config.warmup)) == (float, float, float)
    assert config.momentum == 0.5 and config.warmup == 0.25
    assert [type(m) for m in config.milestones] == [float, float]
    assert config.model_overrides == {**config.model_overrides, "hidden": 16, "dropout": 0.5, "heads": 2}
    assert all(type(v) in (int, float, str, bool) for v in config.model_overrides.values())
    assert json.loads(json.dumps(config.to_dict())) == config.to_dict()
    with pytest.raises(AttnconvError, match=r"milestones \('0.5',\) is invalid"):
        attnconv.make_config(preset="fmnist-sa-quadratic", milestones=("0.5",))
    with pytest.raises(AttnconvError, match=r"milestones \(0.5, 0.5\) is invalid: give increasing"):  # round 55
        attnconv.make_config(preset="fmnist-sa-quadratic", milestones=(0.5, 0.5))


def test_round_55_b_configs_alpha_padding_and_steps_past_their_ranges_are_one_line():
    """Round 55: `learning_rate` took 10**400 (an OverflowError traceback); a 0-d array or a one-element tensor in
    model_overrides, or a key that is no string, passed make_config and `train` died writing config.json; an alpha
    past the layer dtype's largest number made every output NaN; padding of 2**20 failed in torch's allocator; a
    field's fix asked for what was given (`lr 1e-13 ...: give a positive number`), 10**400 was "not a number", and an
    array was shown on several lines; numpy's bool was refused for a bool field."""
    import json

    from attnconv.construct import ConvAttention
    from attnconv.training import learning_rate

    config = attnconv.make_config(preset="fmnist-sa-quadratic")
    for call, name in ((lambda: learning_rate(config, 10**400, 10), "step"),
                       (lambda: learning_rate(config, 1, 10**400), "total_steps")):
        with pytest.raises(AttnconvError, match=name):
            call()
    config = attnconv.make_config(preset="fmnist-sa-quadratic", amp=np.bool_(False), model_overrides={
        "hidden": torch.tensor([16]), "dropout": np.array(0.25), "extra": (np.int64(2), [np.float32(0.5)])})
    assert config.model_overrides["hidden"] == 16 and config.model_overrides["dropout"] == 0.25 and config.amp is False
    assert json.loads(json.dumps(config.to_dict()))["model_overrides"]["extra"] == [2, [0.5]]
    for overrides, words in (({1: 16}, "model_overrides key 1 is not a string"),
                             ({"hidden": np.ones(3)}, r"model_overrides\['hidden'\] an array of shape \(3,\) cannot")):
        with pytest.raises(AttnconvError, match=words):
            attnconv.make_config(preset="fmnist-sa-quadratic", model_overrides=overrides)
    conv = nn.Conv2d(2, 2, 3, padding=1)
    for call in (lambda: attnconv.conv_to_attention(conv, alpha=1e39),
                 lambda: attnconv.conv_to_attention(conv, alpha=1e5, learnable=True),
                 lambda: attnconv.cnn_to_attention(nn.Sequential(conv), alpha=3.5e38)):
        with pytest.raises(AttnconvError, match=r"alpha .* is invalid: .* in \(0, 10000\]"):
            call()
    x = torch.randn(1, 2, 5, 5)
    assert (attnconv.conv_to_attention(conv.half().float(), alpha=1e4)(x) - conv(x)).abs().max() < 1e-5
    layer = ConvAttention(1, 1, (3, 3), stride=(1, 1), padding=((2**20, 2**20), (1, 1)), dilation=(1, 1), alpha=20.0)
    with pytest.raises(AttnconvError, match="with padding .* needs about .* of memory"):
        layer(torch.randn(1, 1, 5, 5))
    for changes, words in ((dict(lr=1e-13), "lr 1e-13 is invalid: give a positive number; the range: from 1e-12 to"),
                           (dict(momentum=10**400), "momentum 1000.* is invalid: give a number >= 0 and below 1"),
                           (dict(lr=np.ones((3, 3))), r"lr an array of shape \(3, 3\) is invalid")):
        with pytest.raises(AttnconvError, match=words) as err:
            attnconv.make_config(preset="fmnist-sa-quadratic", **changes)
        assert "\n" not in str(err.value)


def test_round_56_b_padding_overrides_ranges_and_the_diverged_runs_advice(tmp_path, capsys):
    """Round 56: a 2-d converted layer's padded input was made before the memory check (padding 2**17: the allocator's
    traceback); a namedtuple or a list holding itself in model_overrides, or an int of 5000 digits, gave tracebacks; the
    CLI said "from 0 to 1" for a range that excludes 1; a diverged run under a schedule without warm-up was told to
    raise --warmup, and one with a raised --attention-lr-scale was not told to lower it."""
    import collections

    from attnconv.cli import main
    from attnconv.limits import shown_value
    from attnconv.training.stopping import rate_fix

    layer = attnconv.conv_to_attention(nn.Conv2d(1, 1, 3, padding=2**17))
    with pytest.raises(AttnconvError, match=r"input size \(4, 4\) with padding .* needs about .* of memory"):
        layer(torch.randn(1, 1, 4, 4))
    loop: list = []
    loop.append(loop)
    pair = collections.namedtuple("pair", "a b")
    config = attnconv.make_config(preset="fmnist-sa-quadratic", model_overrides={"x": pair(np.int64(1), 2)})
    assert config.model_overrides["x"] == (1, 2) and type(config.model_overrides["x"]) is tuple
    for value, shown in ((loop, r"\[\[\[\.\.\.\]\]\]"), (10**5000, "an int")):
        with pytest.raises(AttnconvError, match=rf"model_overrides\['x'\] {shown} cannot be written to config.json"):
            attnconv.make_config(preset="fmnist-sa-quadratic", model_overrides={"x": value})
    with pytest.raises(AttnconvError, match=r"milestones '0.5' is invalid"):
        attnconv.make_config(preset="fmnist-sa-quadratic", milestones="0.5")
    assert shown_value(torch.tensor(3.5)) == "tensor(3.5000)" and shown_value(np.array(2)) == "array(2)"
    capsys.readouterr()
    for flag in ("--momentum", "--warmup"):
        assert main(["train", "--preset", "fmnist-sa-quadratic", flag, "nan", "--out", str(tmp_path / "r")]) == 2
        assert capsys.readouterr().err.strip().endswith(f"{flag} nan is out of range: give a number >= 0 and below 1")
    assert rate_fix(attnconv.make_config(preset="fmnist-sa-quadratic", schedule="constant")) == \
        "lower {lr} and train into a new {out}"
    assert rate_fix(attnconv.make_config(preset="fmnist-sa-quadratic", attention_lr_scale=10.0)) == \
        "lower {lr} or {attention_lr_scale} or raise {warmup} and train into a new {out}"
