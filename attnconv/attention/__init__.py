"""Multi-head self-attention over pixels (Eq. 1-3, 7 of the paper, tokens = pixels, T = H * W).

A thin layer over functional ops:
  - `layer`: SelfAttention2d, its parameters and argument checks.
  - `paths`: the computation paths, one function per `impl` ("dense", "separable", "stacked",
    "fused", "sdpa"), all computing the same function from tensors.
  - `select`: `resolve_impl`, the path a layer runs (what impl="auto" means).
  - `autocast`: `float32_scores` (scores and softmax in float32 under autocast) and `matmul_dtype`.
"""

from attnconv.attention.autocast import float32_scores
from attnconv.attention.layer import SelfAttention2d
from attnconv.attention.select import STACKED_RATIO

__all__ = ["STACKED_RATIO", "SelfAttention2d", "float32_scores"]
