"""FLOP counting: `torch.utils.flop_counter` with the CPU attention kernel added, and `count_flops`.

FLOPs are 2 per multiply-add. `count_flops(model, (C, H, W))` counts them two ways,
per image, at batch size 1:

- ``total``: every op that ``FlopCounterMode`` counts, i.e. the matrix products and
  convolutions (mm, addmm, bmm, baddbmm and their in-place forms, einsum and matmul through them, conv,
  scaled_dot_product_attention), attention's score and probability-times-value
  products included.
  FlopCounterMode does not count elementwise and reduction ops: softmax, exp,
  GELU/ReLU, LayerNorm/BatchNorm, residual adds, pooling, and scores built
  elementwise (the quadratic encoding's -alpha ||delta - Delta||^2). They are
  O(elements), small next to the products for these models, and left out.
- ``linear_only``: the paper's convention, 2 x in_features x out_features per token
  for every nn.Linear call (counted with forward hooks, plus the Linears a module's
  `folded_linears(x)` says its forward applied without calling them), nothing else. It reproduces
  the paper's 6.2B for the quadratic attention model. For ResNet-18 it is almost
  nothing (one 512 x 10 layer): the paper's 0.56B for ResNet-18 counts the
  convolutions' multiply-adds (0.56 G MACs = ``total`` / 2).

Position-only attention probabilities are computed once per forward and shared by
the batch, so at batch size 1 their cost is charged fully to the one image (the
conservative choice; larger batches amortize it).

Scaled dot-product attention: torch 2.13's counter has formulas for the CUDA kernels
(flash, memory-efficient, cuDNN) but none for the CPU flash kernel that
`F.scaled_dot_product_attention` runs on the CPU when no mask is given, so it would
count that attention as 0. `sdpa_flops` / `sdpa_backward_flops` are the CUDA kernels'
formulas, added for the CPU kernel by `flop_counter()`. With queries (B, h, L, D),
keys (B, h, S, D) and values (B, h, S, D_v):

- forward: scores q k^T and probs v, 2 B h L S (D + D_v), which is exactly what the
  math kernel (plain bmm's) counts;
- backward: the flash kernels recompute the scores, then form dV, dP, dQ and dK:
  2 B h L S (3 D + 2 D_v), one q k^T product more than the math kernel's backward.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
from torch.utils import flop_counter as _torch_flop_counter
from torch.utils.flop_counter import FlopCounterMode

from attnconv.errors import AttnconvError
from attnconv.modes import eval_mode


def sdpa_flops(query_shape: torch.Size, key_shape: torch.Size, value_shape: torch.Size, *args: Any,
               out_shape: Any = None, **kwargs: Any) -> int:
    """Forward FLOPs of attention: q k^T (B, h, L, S) and probs v (B, h, L, D_v).

    Shapes (B, h, L, D), (B, h_kv, S, D), (B, h_kv, S, D_v); key/value heads shared by
    groups of query heads (h a multiple of h_kv) cost what h separate heads cost.
    """
    b, h, length, d = query_shape
    s, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h * length * s * (d + d_v)


def sdpa_backward_flops(grad_out_shape: torch.Size, query_shape: torch.Size, key_shape: torch.Size,
                        value_shape: torch.Size, *args: Any, out_shape: Any = None, **kwargs: Any) -> int:
    """Backward FLOPs of a flash attention kernel: the scores recomputed (q k^T), then
    dV = P^T dO, dP = dO v^T, dQ = dS k, dK = dS^T q."""
    b, h, length, d = query_shape
    s, d_v = key_shape[-2], value_shape[-1]
    return 2 * b * h * length * s * (3 * d + 2 * d_v)


def addmm_inplace_flops(self_shape: torch.Size, a_shape: torch.Size, b_shape: torch.Size, *args: Any,
                        out_shape: Any = None, **kwargs: Any) -> int:
    """acc.addmm_(a, b): the product's 2 m k n, as torch counts addmm (the add is elementwise)."""
    m, k = a_shape
    return 2 * m * k * b_shape[-1]


def baddbmm_inplace_flops(self_shape: torch.Size, a_shape: torch.Size, b_shape: torch.Size, *args: Any,
                          out_shape: Any = None, **kwargs: Any) -> int:
    """acc.baddbmm_(a, b): 2 batch m k n, as torch counts baddbmm."""
    batch, m, k = a_shape
    return 2 * batch * m * k * b_shape[-1]


def extra_formulas() -> dict[Any, Any]:
    """{op: formula} where torch has none: the CPU flash attention kernel (forward and backward),
    and the in-place accumulating products addmm_ and baddbmm_ (the tiled fused path's backward).

    The formulas take tensor shapes: FlopCounterMode wraps `custom_mapping` entries to
    pass shapes (so torch's own, already wrapped, formulas must not be handed to it).
    """
    mapping = {}
    for name, formula in (("_scaled_dot_product_flash_attention_for_cpu", sdpa_flops),
                          ("_scaled_dot_product_flash_attention_for_cpu_backward", sdpa_backward_flops),
                          ("addmm_", addmm_inplace_flops), ("baddbmm_", baddbmm_inplace_flops)):
        op = getattr(torch.ops.aten, name, None)
        if op is not None and op not in _torch_flop_counter.flop_registry:
            mapping[op] = formula
    return mapping


def flop_counter() -> FlopCounterMode:
    """A FlopCounterMode (no printout) that also counts the CPU attention kernel and in-place products."""
    return FlopCounterMode(display=False, custom_mapping=extra_formulas())


@torch.no_grad()
def count_flops(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, Any]:
    """FLOPs of one forward pass, per image (see the module docstring for what is counted).

    input_shape: (C, H, W), or (B, C, H, W) to count at batch B and divide by B.
    Returns {"total": int, "linear_only": int, "by_op": {op name: FLOPs}, "batch": B}.
    """
    if len(input_shape) == 3:
        input_shape = (1, *input_shape)
    if len(input_shape) != 4 or min(input_shape) < 1:
        raise AttnconvError(f"input_shape must be (C, H, W) or (B, C, H, W), got {tuple(input_shape)}")
    batch = input_shape[0]
    param = next(model.parameters(), None)
    x = torch.zeros(input_shape, device=param.device if param is not None else "cpu",
                    dtype=param.dtype if param is not None else torch.float32)
    linear = 0

    def count_linear(module: nn.Linear, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal linear
        tokens = inputs[0].numel() // module.in_features
        linear += 2 * tokens * module.in_features * module.out_features

    def count_folded(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        nonlocal linear
        for layer, tokens in module.folded_linears(inputs[0]):
            linear += 2 * tokens * layer.in_features * layer.out_features

    hooks = [m.register_forward_hook(count_linear) for m in model.modules() if isinstance(m, nn.Linear)]
    # a module that applies a Linear child inside its own products (the fused attention path) names it
    hooks += [m.register_forward_hook(count_folded) for m in model.modules() if hasattr(m, "folded_linears")]
    try:
        with eval_mode(model), flop_counter() as counter:
            model(x)
    finally:
        for h in hooks:
            h.remove()
    by_op = {str(op): int(v) // batch for op, v in counter.get_flop_counts().get("Global", {}).items()}
    return {"total": counter.get_total_flops() // batch, "linear_only": linear // batch, "by_op": by_op,
            "batch": batch}
