"""torch.compile(fullgraph=True) readiness: every named model traces as one graph, and a compiled
attention model computes what the eager one does, forward and backward."""

import pytest
import torch
import torch._dynamo as dynamo

from attnconv.models import build_model, list_models

_SMALL = dict(hidden=16, heads=4, layers=2, intermediate=16, image_size=16)


def _small(name: str) -> dict:
    return dict(width=4, image_size=16) if name.startswith("resnet") else dict(_SMALL)


@pytest.mark.slow
@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("name", list_models())
def test_every_model_traces_as_one_graph(name, amp):
    # checkpoint=True (attention models) also puts the blocks under torch.utils.checkpoint
    extra = {} if name.startswith("resnet") else dict(checkpoint=True)
    model = build_model(name, **_small(name), **extra).train()
    dynamo.reset()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        explained = dynamo.explain(model)(torch.randn(2, 3, 16, 16))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.slow
def test_compiled_attention_model_matches_eager_forward_and_backward():
    torch.manual_seed(0)
    small = dict(_small("sa-quadratic"), layers=1)  # compile time grows with the layers (about 15 s for one here)
    model = build_model("sa-quadratic", **small, dropout=0.0, attn_dropout=0.0).train()
    x = torch.randn(3, 3, 16, 16)
    dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    results = []
    for run in (model, compiled):
        model.zero_grad()
        y = run(x)
        y.square().sum().backward()
        results.append((y.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (y0, g0), (y1, g1) = results
    torch.testing.assert_close(y1, y0, rtol=1e-5, atol=1e-5)
    for n in g0:
        torch.testing.assert_close(g1[n], g0[n], rtol=1e-4, atol=1e-6, msg=n)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["sa-quadratic", "sa-learned"])
def test_the_fused_path_traces_as_one_graph(name):
    """impl='fused' (the output projection computed inside the fused products, in tiles of images when
    training) traces as one graph: its tiled autograd Function and path choice break nothing."""
    model = build_model(name, **_SMALL, impl="fused").train()
    assert {m.resolved_impl((8, 8)) for m in model.attention_layers} == {"fused"}
    dynamo.reset()
    explained = dynamo.explain(model)(torch.randn(2, 3, 16, 16))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


def test_a_converted_layer_and_network_compile_as_one_graph_and_match_eager():
    """Rounds 58-62's note: `torch.compile(fullgraph=True)` of a converted layer broke at its memory check (reading the
    machine's memory is no graph op) and at its torch.func test; the compiled layer follows the input's layout too."""
    from torch import nn

    from attnconv import cnn_to_attention, conv_to_attention

    torch.manual_seed(0)
    conv = nn.Conv2d(3, 4, 3, padding=1)
    x = torch.randn(2, 3, 8, 8)
    for model in (conv_to_attention(conv), conv_to_attention(conv, learnable=True),
                  cnn_to_attention(nn.Sequential(conv, nn.ReLU(), nn.Conv2d(4, 2, 3, padding=1, padding_mode="reflect")))):
        dynamo.reset()
        explained = dynamo.explain(model)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    layer = conv_to_attention(conv)
    dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    for given in (x, x.contiguous(memory_format=torch.channels_last), torch.randn(2, 3, 9, 11)):
        got, want = compiled(given), conv(given)  # round 66: another size recompiles with symbolic sizes
        assert torch.allclose(got, want, atol=1e-5) and got.stride() == want.stride()


@pytest.mark.slow
def test_a_refused_size_under_compile_leaves_later_compiled_layers_working():
    """Round 67: after a compiled converted layer refused a too-small input, layers compiled later in the process with
    fullgraph=True failed on sound inputs (`size (8, 8) is invalid`, or dynamo's `Attempt to trace generator`): the
    size check caught dynamo's own exception, and a generator expression in the forward could no longer be traced.
    Run in a fresh process, whose dynamo state the refusal changes."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = """
import torch, torch.nn as nn
from attnconv import AttnconvError, cnn_to_attention, conv_to_attention
first = torch.compile(conv_to_attention(nn.Conv2d(1, 1, 3)), dynamic=True)
first(torch.randn(1, 1, 6, 6))
try:
    first(torch.randn(1, 1, 2, 2))
    raise SystemExit("a 2x2 input was not refused")
except AttnconvError as err:
    assert "is too small" in str(err), err
for model in (conv_to_attention(nn.Conv2d(1, 1, 5)), conv_to_attention(nn.Conv2d(1, 1, 5), learnable=True),
              cnn_to_attention(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Conv2d(2, 1, 3, padding=1)))):
    x = torch.randn(1, 1, 8, 8)
    assert torch.allclose(torch.compile(model, fullgraph=True)(x), model(x), atol=1e-6)
print("ok")
"""
    repo = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
