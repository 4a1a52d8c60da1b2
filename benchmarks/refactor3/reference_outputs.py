"""Record, or compare against, float64 outputs and gradients of every attention path.

    python benchmarks/refactor3/reference_outputs.py record /tmp/ref.safetensors
    python benchmarks/refactor3/reference_outputs.py compare /tmp/ref.safetensors [--tol 1e-12]

For fixed seeds: SelfAttention2d on every impl (each encoding, value mode, stride, heads; the fused
path in tiles too), its analysis probabilities and scores; conv_to_attention (and the learnable
variant, with content) on Conv1d/2d/3d with strides, dilation, groups, padding modes and even
kernels; the attention classifiers and a converted ResNet-18. Forward outputs and the gradients of
the input and every parameter, all in float64, through the modules' `__call__` only, so a refactor
of the internals can be checked against a recording made before it (max abs difference <= tol).
"""

from __future__ import annotations

import argparse
import sys

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from attnconv import SelfAttention2d, build_model, cnn_to_attention, conv_to_attention

DT = torch.float64


def _grads(prefix: str, module: nn.Module, x: torch.Tensor, y: torch.Tensor, out: dict) -> None:
    """y's value, and the gradients of (y * a fixed random tensor).sum() w.r.t. x and every parameter."""
    out[f"{prefix}/y"] = y.detach().clone()
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(99), dtype=DT)
    (y * g).sum().backward()
    out[f"{prefix}/dx"] = x.grad.detach().clone()
    for name, p in module.named_parameters():
        if p.grad is not None:
            out[f"{prefix}/d.{name}"] = p.grad.detach().clone()


def _layer_cases():
    for enc in ("quadratic", "quadratic-diag", "quadratic-aniso", "learned", "learned-content"):
        for value in ("shared", "project"):
            for impl in ("dense", "separable", "stacked", "fused", "sdpa", "auto"):
                separable = enc not in ("quadratic-aniso", "learned-content")
                if impl == "separable" and not separable:
                    continue
                if impl == "stacked" and value != "shared":
                    continue
                if impl == "fused" and not (separable and value == "shared"):
                    continue
                for heads, size, stride in ((3, (5, 7), 1), (4, (6, 6), 2), (1, (4, 3), 1)):
                    yield enc, value, impl, heads, size, stride


def record() -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for enc, value, impl, heads, (H, W), stride in _layer_cases():
        torch.manual_seed(0)
        layer = SelfAttention2d(6, 5, heads=heads, encoding=enc, value=value, impl=impl, max_size=8,
                                stride=stride, key_dim=4, pos_dim=5).to(DT)
        x = torch.randn(2, 6, H, W, dtype=DT, requires_grad=True)
        key = f"sa/{enc}/{value}/{impl}/h{heads}/{H}x{W}/s{stride}"
        _grads(key, layer, x, layer(x), out)
        with torch.no_grad():
            arg = {"x": x.detach()} if enc == "learned-content" else {"size": (H, W)}
            for term, s in layer.attention_scores(**arg).items():
                out[f"{key}/scores.{term}"] = s.clone()
            out[f"{key}/probs"] = layer.attention_probs(**arg).clone()
    # the fused path in tiles of images (large enough images per tile for more than one tile)
    for B in (6, 9):
        torch.manual_seed(1)
        layer = SelfAttention2d(160, 24, heads=4, encoding="quadratic", impl="fused", max_size=16).to(DT)
        x = torch.randn(B, 160, 16, 16, dtype=DT, requires_grad=True)
        _grads(f"sa-tiles/B{B}", layer, x, layer(x), out)

    convs = {
        "c1d": nn.Conv1d(4, 6, 3, stride=2, padding=1),
        "c1d-reflect-dil": nn.Conv1d(4, 6, 3, padding=2, dilation=2, padding_mode="reflect"),
        "c2d": nn.Conv2d(4, 6, 3, padding=1),
        "c2d-s2-g2": nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2),
        "c2d-dil-circ": nn.Conv2d(4, 6, 3, padding=2, dilation=2, padding_mode="circular"),
        "c2d-even-repl": nn.Conv2d(4, 6, (2, 4), padding=(1, 2), padding_mode="replicate", bias=False),
        "c2d-same": nn.Conv2d(4, 6, 4, padding="same"),
        "c2d-1x1": nn.Conv2d(4, 6, 1),
        "c3d": nn.Conv3d(2, 3, 3, stride=(1, 2, 1), padding=1),
    }
    for name, conv in convs.items():
        torch.manual_seed(2)
        conv = conv.to(DT)
        nn.init.normal_(conv.weight)
        nd = conv.weight.dim() - 2
        shape = {1: (9,), 2: (7, 6), 3: (5, 6, 4)}[nd]
        for kind, kwargs in (("exact", {}), ("learn", {"learnable": True, "alpha": 3.0}),
                             ("content", {"learnable": True, "alpha": 3.0, "key_dim": 3})):
            torch.manual_seed(3)
            layer = conv_to_attention(conv, **kwargs)
            if kind == "content":
                with torch.no_grad():
                    layer.query.weight.normal_()
                    layer.query.bias.normal_()
            x = torch.randn(2, conv.in_channels, *shape, dtype=DT, requires_grad=True)
            key = f"conv/{name}/{kind}"
            _grads(key, layer, x, layer(x), out)
            if nd == 2:
                with torch.no_grad():
                    out[f"{key}/probs"] = layer.attention_probs(x.detach()).clone()

    models = {
        "sa-quadratic": {}, "sa-quadratic-aniso": {}, "sa-learned": {}, "sa-learned-content": {},
        "sa-quadratic-fused": {"impl": "fused"}, "sa-quadratic-dense": {"impl": "dense"},
    }
    for name, extra in models.items():
        torch.manual_seed(4)
        model = build_model(name.removesuffix("-fused").removesuffix("-dense"), hidden=16, heads=4, layers=2,
                            intermediate=20, dropout=0.0, attn_dropout=0.0, image_size=12, num_classes=3,
                            **extra).to(DT)
        x = torch.randn(3, 3, 12, 12, dtype=DT, requires_grad=True)
        _grads(f"model/{name}", model, x, model(x), out)
        model.zero_grad()
        x.grad = None
        with torch.no_grad():  # without gradients (no output-projection fold)
            out[f"model/{name}/y-nograd"] = model(x).clone()
    torch.manual_seed(5)
    resnet = build_model("resnet18", width=4, num_classes=3, image_size=16).to(DT).eval()
    for kind, kwargs in (("exact", {}), ("learn", {"learnable": True, "alpha": 3.0})):
        converted = cnn_to_attention(resnet, **kwargs)
        x = torch.randn(2, 3, 16, 16, dtype=DT, requires_grad=True)
        _grads(f"resnet/{kind}", converted, x, converted(x), out)
    return {k: v.contiguous() for k, v in out.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=("record", "compare"))
    parser.add_argument("file")
    parser.add_argument("--tol", type=float, default=1e-12)
    args = parser.parse_args()
    now = record()
    if args.mode == "record":
        save_file(now, args.file)
        print(f"recorded {len(now)} tensors to {args.file}")
        return 0
    ref = load_file(args.file)
    bad, worst = [], 0.0
    for key, want in ref.items():
        got = now.get(key)
        if got is None or got.shape != want.shape:
            bad.append(f"{key}: {'missing' if got is None else f'shape {tuple(got.shape)} != {tuple(want.shape)}'}")
            continue
        diff = float((got - want).abs().max()) if want.numel() else 0.0
        worst = max(worst, diff)
        if not diff <= args.tol:
            bad.append(f"{key}: max abs diff {diff:.3g}")
    extra = sorted(set(now) - set(ref))
    print(f"{len(ref)} recorded tensors, {len(extra)} new; largest difference {worst:.3g}; {len(bad)} over {args.tol:g}")
    for line in bad[:40]:
        print("  " + line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
