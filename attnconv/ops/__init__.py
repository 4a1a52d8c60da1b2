"""The attention core: functional ops over tensors, shared by every attention layer.

Nothing here holds parameters or knows a module; the layers (`attnconv.attention.SelfAttention2d`,
`attnconv.construct.ConvAttention` and `LearnableConvAttention`) and the positional encodings
(`attnconv.positional`) turn their parameters into tensors and call these.

  - `scores`: the score terms (Lemma 2's quadratic scores per axis or with a full covariance,
    learned relative factors, the content term and its positional part), their per-axis softmax
    and the Kronecker product of the factors.
  - one module per backend, all computing the same function (T = H * W tokens, row-major):
    `dense` (probabilities times values), `separable` (per-axis factors, never T x T),
    `stacked` (shared values, the heads stacked into one matrix per image), `fused` (shared
    values and separable probabilities, the output projection between the factors; in tiles of
    images with `fused_tiles.FusedTiles`' written-out backward), `sdpa` (torch's
    scaled_dot_product_attention with the positional logits as a bias).
  - `autocast`: scores and softmax in at least float32 (`float32_scores`, `at_least_float32`),
    matmuls in autocast's dtype (`matmul_dtype`).

Which backend a layer runs is decided in one place, `attnconv.attention.select.resolve_impl`.
"""

from attnconv.ops.autocast import at_least_float32, float32_scores, matmul_dtype
from attnconv.ops.dense import dense
from attnconv.ops.fused import fused, fused_in_one_tile, fused_tile
from attnconv.ops.scores import (
    content_position_scores,
    content_scores,
    factor_softmax,
    kronecker_probs,
    learned_relative_factors,
    outer_sum,
    quadratic_axis_scores,
    quadratic_full_scores,
    relative_offsets,
)
from attnconv.ops.sdpa import heads_first, sdpa
from attnconv.ops.separable import separable
from attnconv.ops.stacked import stacked

__all__ = [
    "at_least_float32",
    "content_position_scores",
    "content_scores",
    "dense",
    "factor_softmax",
    "float32_scores",
    "fused",
    "fused_in_one_tile",
    "fused_tile",
    "heads_first",
    "kronecker_probs",
    "learned_relative_factors",
    "matmul_dtype",
    "outer_sum",
    "quadratic_axis_scores",
    "quadratic_full_scores",
    "relative_offsets",
    "sdpa",
    "separable",
    "stacked",
]
