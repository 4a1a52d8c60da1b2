"""Convolution <-> attention: Theorem 1 for one layer and for whole networks, and its reverse.

Forward direction (Theorem 1, via Lemma 1 and Lemma 2): `conv_to_attention` turns an
`nn.Conv1d/2d/3d` into a `ConvAttention`, a multi-head self-attention layer with one
head per kernel tap. Head h has the isotropic quadratic positional score of Lemma 2,

    A^h_{q,k} = -alpha * ||(k - q) - Delta_h||^2,      Delta_h = dilation * (tap_h - anchor),

softmax over keys, and value map W_val^h W_out^h = W[:, :, tap_h]^T (Lemma 1, with
W_val^h = I). As alpha grows each head's softmax becomes a one-hot on the pixel at
offset Delta_h, so the layer computes the cross-correlation that `nn.ConvNd` computes,
for finite inputs (a NaN or inf does not stay local; see `ConvAttention`). `cnn_to_attention`
does it for every convolution of a network (optionally folding BatchNorms).

Reverse direction: any position-only attention layer is linear in its input,
y_q = sum_h sum_k P_h[q, k] maps[h] @ x_k + bias, so `effective_kernel` extracts that
map in factored form and `conv_likeness` measures how close it is to a small convolution.

Submodules (each imports its siblings directly, never this package):

    geometry        token grid coordinates, padding as indexing, the dense-size limit
    bound           leakage_bound, default_alpha
    conv_attention  ConvAttention
    learnable       LearnableConvAttention (trainable centers/widths, content attention), check_key_dim
    factory         conv_to_attention, unconvertible_reason (what has no exact attention layer)
    network         cnn_to_attention: every convolution of a whole network, BatchNorm folding
    kernels         EffectiveKernel, effective_kernel, ConvLikeness, conv_likeness

Conventions: tokens are pixels in row-major order over the spatial axes (for 2-D,
q = i * W + j); `size` is always the *input* spatial size (unpadded).
"""

from attnconv.construct.bound import default_alpha, leakage_bound
from attnconv.construct.conv_attention import ConvAttention
from attnconv.construct.factory import conv_to_attention, unconvertible_reason
from attnconv.construct.kernels import (
    ConvLikeness,
    EffectiveKernel,
    conv_likeness,
    effective_kernel,
)
from attnconv.construct.learnable import LearnableConvAttention, check_key_dim
from attnconv.construct.network import cnn_to_attention

__all__ = [
    "ConvAttention",
    "ConvLikeness",
    "EffectiveKernel",
    "LearnableConvAttention",
    "check_key_dim",
    "cnn_to_attention",
    "conv_likeness",
    "conv_to_attention",
    "default_alpha",
    "effective_kernel",
    "leakage_bound",
    "unconvertible_reason",
]
