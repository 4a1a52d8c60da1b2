"""FLOP counting: the scaled dot-product attention formulas added for the CPU kernel, against explicit counts."""

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils import flop_counter as torch_flops

from attnconv.flops import flop_counter, sdpa_backward_flops, sdpa_flops

B, H, L, S, D = 2, 3, 5, 7, 4  # batch, heads, queries, keys, head width
CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
CPU_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


def _attention_counts(backend: SDPBackend) -> tuple[dict, dict]:
    """FLOPs by op of one SDPA call (B, H, L, S, D) and of its backward, on the given CPU kernel."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, n, D, generator=gen, requires_grad=True) for n in (L, S, S))
    with sdpa_kernel(backend):
        with flop_counter() as forward:
            out = F.scaled_dot_product_attention(q, k, v)
        with flop_counter() as backward:
            out.sum().backward()
    return forward.get_flop_counts()["Global"], backward.get_flop_counts()["Global"]


def test_cpu_attention_kernel_is_counted_as_its_products():
    forward, backward = _attention_counts(SDPBackend.FLASH_ATTENTION)
    # q k^T and probs v: 2 FLOPs per multiply-add, B H L S D each.
    assert forward == {CPU_FLASH: 4 * B * H * L * S * D}
    # the scores recomputed, then dV, dP, dQ, dK: five products of the same size.
    assert backward == {CPU_FLASH_BACKWARD: 10 * B * H * L * S * D}


def test_forward_count_equals_the_math_kernels_and_backward_adds_the_recomputed_scores():
    flash_fwd, flash_bwd = _attention_counts(SDPBackend.FLASH_ATTENTION)
    math_fwd, math_bwd = _attention_counts(SDPBackend.MATH)
    assert CPU_FLASH not in math_fwd and math_fwd  # the math kernel is plain matrix products
    assert sum(flash_fwd.values()) == sum(math_fwd.values())
    assert sum(flash_bwd.values()) == sum(math_bwd.values()) + 2 * B * H * L * S * D


@pytest.mark.parametrize("q_heads, kv_heads, d, d_v", [(3, 3, 4, 4), (3, 3, 4, 6), (6, 2, 8, 5)])
def test_formulas_agree_with_torchs_for_its_cuda_kernels(q_heads, kv_heads, d, d_v):
    q, k, v, o = (B, q_heads, L, d), (B, kv_heads, S, d), (B, kv_heads, S, d_v), (B, q_heads, L, d_v)
    assert sdpa_flops(q, k, v) == torch_flops.sdpa_flop_count(q, k, v) == 2 * B * q_heads * L * S * (d + d_v)
    assert sdpa_backward_flops(o, q, k, v) == torch_flops.sdpa_backward_flop_count(o, q, k, v)
