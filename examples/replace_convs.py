"""Replace a ResNet's 3x3 convolutions by quadratic self-attention layers (drop-in, same shapes).

    python examples/replace_convs.py

Every stride-1 3x3 `nn.Conv2d` of a small CIFAR ResNet-18 becomes a `SelfAttention2d` with
9 heads and the paper's quadratic positional encoding; strided and 1x1 convolutions stay.
The script checks the network still maps (B, 3, 32, 32) to (B, 10) and trains one step.
"""

import torch
from torch import nn

from attnconv import SelfAttention2d, build_model


def replace_3x3(module: nn.Module) -> int:
    """Swap every stride-1, padding-1 3x3 Conv2d under `module` for attention; return how many."""
    count = 0
    for name, child in module.named_children():
        if isinstance(child, nn.Conv2d) and child.kernel_size == (3, 3) and child.stride == (1, 1) \
                and child.padding == (1, 1) and child.groups == 1:
            setattr(module, name, SelfAttention2d(child.in_channels, child.out_channels, heads=9,
                                                  encoding="quadratic", bias=child.bias is not None))
            count += 1
        else:
            count += replace_3x3(child)
    return count


def main() -> None:
    torch.manual_seed(0)
    net = build_model("resnet18", width=8)  # a narrow ResNet-18, so this runs in seconds on a CPU
    convs = sum(p.numel() for p in net.parameters())
    replaced = replace_3x3(net)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 10, (4,))
    logits = net(x)
    assert logits.shape == (4, 10)
    loss = nn.functional.cross_entropy(logits, y)
    loss.backward()
    torch.optim.SGD(net.parameters(), lr=0.1).step()
    print(f"replaced {replaced} 3x3 convolutions by SelfAttention2d; parameters {convs:,} -> "
          f"{sum(p.numel() for p in net.parameters()):,}; logits {tuple(logits.shape)}; loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
