"""Convert a trained CNN into an all-attention network and check that it predicts the same.

    python examples/convert_cnn.py

A small ResNet-18 is trained for a few steps on random labelled images (any trained CNN
works the same way), then `cnn_to_attention` turns every convolution into the multi-head
self-attention layer of Theorem 1. The converted network calls no convolution, and its
predictions equal the CNN's; the largest logit difference is float32 rounding.
"""

import torch
from torch import nn

from attnconv import ConvAttention, build_model, cnn_to_attention


def main() -> None:
    torch.manual_seed(0)
    cnn = build_model("resnet18", width=8)
    x, y = torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(cnn.parameters(), lr=0.05, momentum=0.9)
    for _ in range(5):
        opt.zero_grad()
        nn.functional.cross_entropy(cnn(x), y).backward()
        opt.step()
    cnn.eval()

    attn = cnn_to_attention(cnn, fold_bn=True)  # BatchNorms folded into the attention layers' value maps
    layers = [m for m in attn.modules() if isinstance(m, ConvAttention)]
    with torch.no_grad():
        a, b = cnn(x), attn(x)
    same = (a.argmax(1) == b.argmax(1)).float().mean().item()
    rel = ((a - b).norm() / a.norm()).item()
    assert same == 1.0, "the converted network predicts differently"
    print(f"{len(layers)} convolutions -> attention layers ({sum(m.heads for m in layers)} heads); "
          f"same predictions on {same:.0%} of {len(x)} images; relative logit difference {rel:.1e}")


if __name__ == "__main__":
    main()
