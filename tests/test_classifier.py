import json
import math

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
    for impl in ("auto", "sdpa", "separable", "stacked"):
        try:
            model = build_model(name, impl=impl, **small).eval()
        except AttnconvError:
            assert impl == "separable" and name in ("sa-quadratic-aniso", "sa-learned-content")
            continue
        model.load_state_dict(ref.state_dict())
        assert torch.allclose(model(x), y_ref, rtol=1e-5, atol=1e-5), impl


@pytest.mark.parametrize("name", list(PAPER_COUNTS))
def test_training_gradients_do_not_depend_on_impl(name):
    """Training mode (attention_out folded into the output projection: 3 images x 36 tokens > heads x
    hidden = 64; tests/test_attention.py checks the fold against the two Linears): every path gives the
    dense path's loss and gradients."""
    small = dict(hidden=16, heads=4, layers=2, intermediate=24, image_size=12, in_channels=1, dropout=0.0,
                 attn_dropout=0.0)
    torch.manual_seed(0)
    x, y = torch.randn(3, 1, 12, 12), torch.tensor([0, 3, 7])
    state = build_model(name, **small).state_dict()
    results = {}
    for impl in ("dense", "auto", "separable", "stacked", "sdpa"):
        try:
            model = build_model(name, impl=impl, **small).train()
        except AttnconvError:
            continue
        model.load_state_dict(state)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        results[impl] = (loss.item(), {n: p.grad for n, p in model.named_parameters()})
    loss0, grads0 = results.pop("dense")
    for impl, (loss, grads) in results.items():
        assert loss == pytest.approx(loss0, rel=1e-5), impl
        for n, g in grads.items():
            torch.testing.assert_close(g, grads0[n], rtol=1e-4, atol=1e-6), (impl, n)


def test_centers_and_widths_take_no_weight_decay():
    model = build_model("sa-quadratic", hidden=8, heads=2, layers=2, intermediate=8)
    names = no_weight_decay(model)
    assert names == {f"layers.{i}.attention.encoding.{p}" for i in range(2) for p in ("centers", "widths")}


def test_model_rejects_bad_overrides_and_inputs():
    with pytest.raises(AttnconvError, match="divisible"):
        build_model("sa-quadratic", image_size=27)
    with pytest.raises(AttnconvError, match="unknown model"):
        build_model("no-such-model")
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


# ------------------------------------------------------------- the authors' init, old checkpoints


def _layer0_position_statistics(model):
    scores = model.layers[0].attention.attention_scores(size=(16, 16))["position"]  # (1, 9, 256, 256)
    return scores.std().item(), scores.softmax(-1).amax(-1).mean().item()


def test_learned_heads_start_peaked_as_the_authors_and_uniform_with_bert_init():
    uniform = 1 / 256  # 16 x 16 tokens
    # The paper's sa-learned layer: D_p = 400, keys U(+-1/20), N(0, 1) tables: score variance
    # 2 * 400 * (1 / 1200) = 2/3 (std 0.816; 0.72-0.90 over 40 seeds). Mean max probability 0.019-0.028.
    std, peak = _layer0_position_statistics(build_model("sa-learned", layers=1))
    assert std == pytest.approx(math.sqrt(2 / 3), abs=0.12)
    assert peak > 4 * uniform
    # BERT's N(0, 0.02^2): variance 2 * 400 * 0.02^4, std 0.011; heads uniform to 3%
    std, peak = _layer0_position_statistics(build_model("sa-learned", layers=1, pos_init="bert"))
    assert std == pytest.approx(math.sqrt(2 * 400 * 0.02**4), rel=0.15)
    assert peak == pytest.approx(uniform, rel=0.03)


@pytest.mark.parametrize("name", list(PAPER_COUNTS))
def test_new_options_keep_parameter_names_and_shapes(name):
    small = dict(hidden=16, heads=4, layers=2, intermediate=24, image_size=12, in_channels=1)
    shapes = lambda m: {k: tuple(v.shape) for k, v in m.state_dict().items()}  # noqa: E731
    ref = shapes(build_model(name, **small))
    options = [dict(pos_init="bert")] if name.startswith("sa-learned") else []
    options += [] if name == "sa-learned-content" else [dict(attn_dropout_mask="shared")]
    for extra in options:
        assert shapes(build_model(name, **small, **extra)) == ref, extra
    assert not any("attention_dense" in k for k in ref)
    assert {f"layers.{i}.attention_out.{p}" for i in range(2) for p in ("weight", "bias")} <= set(ref)


def test_a_run_written_before_the_new_options_loads(tmp_path):
    from fixtures_data import write_random_fashion
    from safetensors.torch import load_file

    from attnconv.config import make_config
    from attnconv.runs import load_run
    from attnconv.training import train

    (tmp_path / "data").mkdir()
    write_random_fashion(tmp_path / "data", 16, 4, seed=0)
    overrides = dict(hidden=8, layers=1, heads=4, intermediate=8, downsample=4)
    cfg = make_config(model="sa-learned", dataset="fashion-mnist", batch_size=16, workers=1, epochs=1, max_steps=1,
                      data_dir=str(tmp_path / "data"), model_overrides=overrides)
    train(cfg, tmp_path / "run", progress=False)
    # config.json as a run written before pos_init and attn_dropout_mask
    path = tmp_path / "run" / "config.json"
    meta = json.loads(path.read_text())
    for key in ("pos_init", "attn_dropout_mask"):
        meta["config"]["model_overrides"].pop(key, None)
    path.write_text(json.dumps(meta))
    weights = load_file(str(tmp_path / "run" / "model.safetensors"))
    model, _ = load_run(tmp_path / "run")
    for k, v in model.state_dict().items():
        assert torch.equal(v, weights[k]), k


def test_new_options_are_checked():
    with pytest.raises(AttnconvError, match="pos_init"):
        build_model("sa-quadratic", pos_init="bert")
    with pytest.raises(AttnconvError, match="pos_init"):
        build_model("sa-learned", pos_init="normal")
    with pytest.raises(AttnconvError, match="per-sample"):
        build_model("sa-learned-content", attn_dropout_mask="shared")
    with pytest.raises(AttnconvError, match="attn_dropout_mask"):
        build_model("sa-learned", attn_dropout_mask="per-batch")


@pytest.mark.parametrize("grad", [False, True], ids=["no-grad", "training"])
@pytest.mark.parametrize("name", ["sa-quadratic", "sa-learned-content"])
def test_hooks_on_a_classifiers_attention_layers_fire_with_the_layers_input_and_output(name, grad):
    model = build_model(name, hidden=12, heads=4, layers=2, intermediate=8, image_size=8, dropout=0.0,
                        attn_dropout=0.0).train(grad)
    seen = []
    handles = [layer.register_forward_pre_hook(lambda m, args, kwargs: seen.append(("pre", m, args[0])), with_kwargs=True)
               for layer in model.attention_layers]
    handles += [layer.register_forward_hook(lambda m, args, out: seen.append(("post", m, out)))
                for layer in model.attention_layers]
    x = torch.randn(3, 3, 8, 8)
    with torch.set_grad_enabled(grad):
        model(x)
    for h in handles:
        h.remove()
    assert [(kind, m) for kind, m, _ in seen] == [(k, m) for m in model.attention_layers for k in ("pre", "post")]
    first = seen[0][2]
    assert first.shape == (3, 12, 4, 4)  # (B, C, H, W) on the 4x4 token grid
    torch.testing.assert_close(first, model.tokens(x).permute(0, 3, 1, 2))
    for (_, layer, inp), (_, _, out) in zip(seen[::2], seen[1::2]):
        torch.testing.assert_close(out, layer(inp))  # what the layer itself gives


@pytest.mark.parametrize("name", ["sa-quadratic", "sa-learned", "sa-learned-content"])
def test_folding_attention_out_into_the_projection_changes_no_number(name):
    """In training the block folds attention_out into the layer's output projection; with a hook on the layer
    (which must see the layer's output) it runs both: the same outputs and gradients in float64."""
    torch.manual_seed(1)
    model = build_model(name, hidden=8, heads=3, layers=2, intermediate=8, image_size=12, dropout=0.0,
                        attn_dropout=0.0).double().train()
    x = torch.randn(2, 3, 12, 12, dtype=torch.float64)
    results = []
    for watched in (False, True):
        handles = [layer.register_forward_hook(lambda *a: None) for layer in model.attention_layers if watched]
        model.zero_grad()
        y = model(x)
        y.square().sum().backward()
        results.append((y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
        for h in handles:
            h.remove()
    (y0, g0), (y1, g1) = results
    torch.testing.assert_close(y0, y1, rtol=1e-12, atol=1e-12)
    for n in g0:
        torch.testing.assert_close(g0[n], g1[n], rtol=1e-10, atol=1e-12, msg=n)
