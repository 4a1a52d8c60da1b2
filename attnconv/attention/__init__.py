"""Multi-head self-attention over pixels (Eq. 1-3, 7 of the paper, tokens = pixels, T = H * W).

A thin layer over the functional ops of `attnconv.ops`:
  - `layer`: SelfAttention2d, its parameters and argument checks; it turns them into tensors
    and calls one backend of `attnconv.ops` ("dense", "separable", "stacked", "fused", "sdpa").
  - `select`: `resolve_impl`, the backend a layer runs (what impl="auto" means), and why.
"""

from attnconv.attention.layer import SelfAttention2d
from attnconv.attention.select import STACKED_RATIO
from attnconv.ops.autocast import float32_scores

__all__ = ["STACKED_RATIO", "SelfAttention2d", "float32_scores"]
