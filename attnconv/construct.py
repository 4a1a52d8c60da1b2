"""Convolution <-> attention: the exact construction of Theorem 1 and its reverse.

Forward direction (Theorem 1, via Lemma 1 and Lemma 2): `conv_to_attention` turns an
`nn.Conv1d/2d/3d` into a `ConvAttention`, a multi-head self-attention layer with one
head per kernel tap. Head h has the isotropic quadratic positional score of Lemma 2,

    A^h_{q,k} = -alpha * ||(k - q) - Delta_h||^2,      Delta_h = dilation * (tap_h - anchor),

softmax over keys, and value map W_val^h W_out^h = W[:, :, tap_h]^T (Lemma 1, with
W_val^h = I). As alpha grows each head's softmax becomes a one-hot on the pixel at
offset Delta_h, so the layer computes the cross-correlation that `nn.ConvNd` computes.

Reverse direction: any position-only attention layer is linear in its input,
y_q = sum_h sum_k P_h[q, k] maps[h] @ x_k + bias, so `effective_kernel` extracts that
map in factored form and `conv_likeness` measures how close it is to a small convolution.

Conventions: tokens are pixels in row-major order over the spatial axes (for 2-D,
q = i * W + j); `size` is always the *input* spatial size (unpadded).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.errors import AttnconvError

__all__ = [
    "ConvAttention",
    "ConvLikeness",
    "EffectiveKernel",
    "LearnableConvAttention",
    "conv_likeness",
    "conv_to_attention",
    "default_alpha",
    "effective_kernel",
    "leakage_bound",
]

_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
# Dense probability tensors above this many elements are refused (they would not fit anyway).
_MAX_DENSE = 2**28


# ----------------------------------------------------------------------------------------
# Softmax leakage: the error of the construction, and the default width alpha
# ----------------------------------------------------------------------------------------


def leakage_bound(alpha: float, ndim: int) -> float:
    """Upper bound on the attention mass a head of `ConvAttention` puts off its target pixel.

    Derivation. The isotropic score of Lemma 2 is a sum of per-axis terms,
    -alpha * sum_a (k_a - q_a - Delta_a)^2, so on a box-shaped grid the softmax factorizes
    into one softmax per axis. Along one axis the target key has score 0 (the maximum)
    and a key at integer distance d != 0 from it has score -alpha d^2, so the target's
    per-axis probability is 1 / (1 + S) with

        S <= sum_{d in Z, d != 0} e^{-alpha d^2}
          <= 2 e^{-alpha} sum_{j >= 0} e^{-3 alpha j}        (d^2 >= 1 + 3 (d - 1) for d >= 1)
           = 2 e^{-alpha} / (1 - e^{-3 alpha}) =: s(alpha).

    The target's probability in `ndim` dimensions is the product of the per-axis ones,
    at least (1 + s)^{-ndim}, so the mass on all wrong keys together is at most

        lambda(alpha, ndim) = 1 - (1 + s(alpha))^{-ndim}   (<= ndim * s(alpha) ~ 2 ndim e^{-alpha}).

    `ConvAttention.error_bound` turns this into a bound on the output error.
    """
    if not alpha > 0:
        raise AttnconvError(f"alpha must be positive, got {alpha}")
    s = 2.0 * math.exp(-alpha) / -math.expm1(-3.0 * alpha)
    return -math.expm1(-ndim * math.log1p(s))


def default_alpha(dtype: torch.dtype, ndim: int) -> float:
    """The width alpha that `conv_to_attention` uses for `dtype` when none is given.

    Rule: the smallest alpha with 2 * lambda(alpha, ndim) <= eps / 16, where eps is
    `torch.finfo(dtype).eps` and lambda is `leakage_bound`. By `ConvAttention.error_bound`
    the attention error is then at most eps / 16 times ||W||_{inf,1} * max|x|, the
    scale of the output: a sixteenth of one rounding unit, so the construction is as
    exact as the arithmetic. Since lambda ~ 2 ndim e^{-alpha}, this is about
    alpha = ln(64 ndim / eps): float64 -> 40.9, float32 -> 20.8, float16 -> 11.8,
    bfloat16 -> 9.7 (for ndim = 2). A larger alpha is never worse numerically: scores are
    <= 0 with the maximum at 0, so exp only underflows to 0.
    """
    eps = torch.finfo(dtype).eps
    target = eps / 32.0  # lambda <= eps / 32  <=>  2 lambda <= eps / 16
    lo, hi = 0.0, 200.0
    for _ in range(100):  # lambda decreases in alpha: bisect
        mid = 0.5 * (lo + hi)
        if mid > 0 and leakage_bound(mid, ndim) <= target:
            hi = mid
        else:
            lo = mid
    return math.ceil(hi * 100.0) / 100.0


# ----------------------------------------------------------------------------------------
# Padding as indexing
# ----------------------------------------------------------------------------------------


def _source_index(n: int, lo: int, hi: int, mode: str) -> Tensor:
    """For each position of a padded axis (lo + n + hi,), the input pixel it copies (-1: zero)."""
    p = torch.arange(-lo, n + hi)  # positions in input coordinates
    if mode == "zeros":
        return torch.where((p >= 0) & (p < n), p, torch.full_like(p, -1))
    if mode == "replicate":
        return p.clamp(0, n - 1)
    if mode == "circular":
        return p.remainder(n)
    if mode == "reflect":  # mirror about the edge pixels, without repeating them
        p = p.abs()
        return torch.where(p > n - 1, 2 * (n - 1) - p, p)
    raise AssertionError(mode)


# ----------------------------------------------------------------------------------------
# ConvAttention: Theorem 1
# ----------------------------------------------------------------------------------------


class ConvAttention(nn.Module):
    """Multi-head self-attention that computes exactly an N-d convolution (Theorem 1).

    One head per kernel tap, in row-major tap order (the order of
    `weight.flatten(2)` of the convolution). Head h:

    - scores (Lemma 2, isotropic quadratic encoding): A^h_{q,k} = -alpha ||k - q - Delta_h||^2
      with the center Delta_h = dilation * (tap_h - anchor), softmax over the keys;
    - values (Lemma 1): W_val^h = I and W_out^h = W[:, :, tap_h]^T; `out_weight[h]` holds
      (W_val^h W_out^h)^T, restricted to each group's channels (block-diagonal for groups).

    The query of output pixel o sits on the padded grid at o * stride + dilation * anchor,
    where anchor = (kernel_size - 1) // 2 is the tap whose pixel is the query itself, so
    every head's target key o * stride + dilation * tap exists on the padded grid. For
    odd kernels the centers are symmetric about 0; even kernels are handled exactly too,
    with centers -dilation * (K/2 - 1) ... dilation * K/2.

    Borders: attention has no "outside", so the input is placed in a padded grid (zero
    tokens for padding_mode="zeros", copied pixels for reflect/replicate/circular), the
    heads attend over that grid, and only the strided queries are computed.

    Fast path: the per-head probability over the box-shaped padded grid factorizes into
    per-axis softmaxes, P_h = P^(1)_{h_1} (x) ... (x) P^(n)_{h_n} (h_a the head's tap along
    axis a), and it is applied as one small matmul per axis. No T x T matrix is formed and
    no convolution op is called. The probabilities depend only on positions, so they are
    computed once per forward and shared by the whole batch.

    `alpha` is a plain float (not a parameter or buffer, so not in the state dict either):
    `.to(dtype)` converts the value maps and leaves alpha as chosen. A float64 alpha (~41)
    stays more than sharp enough in lower precisions; going *up* in precision keeps a
    float32 alpha (~21) and its leakage (~1e-9 relative), so set
    `module.alpha = default_alpha(torch.float64, module.ndim)` after such a cast.

    Build it with `conv_to_attention(conv)`; the constructor takes normalized arguments
    (tuples; `padding` as per-axis (low, high) pairs) and initializes like `nn.ConvNd`.
    """

    position_only = True

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: Sequence[int],
        *,
        stride: Sequence[int],
        padding: Sequence[tuple[int, int]],
        dilation: Sequence[int],
        groups: int = 1,
        bias: bool = True,
        padding_mode: str = "zeros",
        alpha: float,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ):
        super().__init__()
        ndim = len(kernel_size)
        if not (len(stride) == len(padding) == len(dilation) == ndim):
            raise AttnconvError("kernel_size, stride, padding and dilation need one entry per axis")
        if padding_mode not in _PADDING_MODES:
            raise AttnconvError(f"padding_mode must be one of {_PADDING_MODES}, got {padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise AttnconvError(
                f"groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = tuple(int(k) for k in kernel_size)
        self.stride = tuple(int(s) for s in stride)
        self.dilation = tuple(int(d) for d in dilation)
        self.padding = tuple((int(lo), int(hi)) for lo, hi in padding)
        self.padding_mode = padding_mode
        self.ndim = ndim
        self.heads = math.prod(self.kernel_size)
        if not (math.isfinite(alpha) and alpha > 0):
            raise AttnconvError(f"alpha must be positive and finite, got {alpha}")
        self.alpha = float(alpha)
        self.anchor = tuple((k - 1) // 2 for k in self.kernel_size)

        factory = {"device": device, "dtype": dtype}
        # out_weight[h] = (W_val^h W_out^h)^T per group: (heads, C_out, C_in // groups)
        self.out_weight = nn.Parameter(torch.empty(self.heads, out_channels, in_channels // groups, **factory))
        self.register_parameter("out_bias", nn.Parameter(torch.empty(out_channels, **factory)) if bias else None)
        bound = 1.0 / math.sqrt(self.heads * in_channels // groups)  # nn.ConvNd's default init
        nn.init.uniform_(self.out_weight, -bound, bound)
        if self.out_bias is not None:
            nn.init.uniform_(self.out_bias, -bound, bound)

    # -- geometry ------------------------------------------------------------------------

    def axis_offsets(self, axis: int) -> Tensor:
        """Center coordinates along `axis` of the K_a head families: dilation * (tap - anchor)."""
        k, d, c = self.kernel_size[axis], self.dilation[axis], self.anchor[axis]
        return d * (torch.arange(k) - c)  # (K_a,)

    @property
    def centers(self) -> Tensor:
        """The heads' centers Delta_h (Lemma 2), (heads, ndim) int64, row-major tap order."""
        grids = torch.meshgrid(*[self.axis_offsets(a) for a in range(self.ndim)], indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=-1)

    @property
    def widths(self) -> Tensor:
        """Each head's alpha, (heads,): all `alpha` here (trainable in LearnableConvAttention)."""
        return torch.full((self.heads,), self.alpha, dtype=torch.float64)

    def query_scores(self, size: Sequence[int], q: int) -> Tensor:
        """Lemma 2's scores -alpha_h ||k - p_q - Delta_h||^2 of output query q over the input pixels k.

        (heads, T_in) float64, p_q = `query_positions(size)[q]`; the layer's attention is the
        softmax of these over the padded grid (padding keys included).
        """
        keys = _grid(size).double()  # (T_in, ndim)
        pos = self.query_positions(size)[q].double()
        d = keys[None] - pos - self.centers.detach().double().cpu()[:, None]  # (heads, T_in, ndim)
        return -self.widths.detach().double().cpu()[:, None] * d.square().sum(-1)

    def output_size(self, size: Sequence[int]) -> tuple[int, ...]:
        """Output spatial size for an input of spatial `size`; AttnconvError where the conv fails."""
        size = tuple(int(s) for s in size)
        if len(size) != self.ndim:
            raise AttnconvError(f"expected a {self.ndim}-d spatial size, got {size}")
        out = []
        for a, n in enumerate(size):
            lo, hi = self.padding[a]
            reach = self.dilation[a] * (self.kernel_size[a] - 1) + 1
            if n < 1:
                raise AttnconvError(f"input size must be positive on every axis, got {size}")
            if self.padding_mode == "reflect" and max(lo, hi) >= n:
                raise AttnconvError(
                    f"reflect padding {max(lo, hi)} needs an input side larger than the padding "
                    f"on axis {a}, got {n}; use a larger input or another padding_mode"
                )
            if self.padding_mode == "circular" and max(lo, hi) > n:
                raise AttnconvError(
                    f"circular padding {max(lo, hi)} wraps more than once on axis {a} of size {n}; "
                    "use a larger input or another padding_mode"
                )
            if n + lo + hi < reach:
                raise AttnconvError(
                    f"input side {n} on axis {a} is too small: padded to {n + lo + hi} pixels, "
                    f"but the kernel reaches {reach}; use a larger input or more padding"
                )
            out.append((n + lo + hi - reach) // self.stride[a] + 1)
        return tuple(out)

    def query_positions(self, size: Sequence[int]) -> Tensor:
        """Input-frame position of every output pixel's query: (T_out, ndim) int64.

        Output pixel o along axis a attends around input position
        o * stride + dilation * anchor - padding_low; head h's target is that plus Delta_h.
        """
        axes = [q - self.padding[a][0] for a, q in enumerate(self._padded_query_axes(size))]
        grids = torch.meshgrid(*axes, indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=-1)

    # -- attention probabilities -----------------------------------------------------------

    def axis_logits(self, size: Sequence[int]) -> list[Tensor]:
        """Lemma 2's scores split by axis, over the padded grid: (G, n_a, P_a) per axis a.

        Entry [t, o, i] is -alpha * (i - q_o - c_t)^2 for the query of output index o (at
        padded position q_o) and padded position i, for the t-th factor along the axis
        (center c_t; see `_axis_heads`). A head's score is the sum of its factors' scores
        over the axes. Computed in at least float32 (half types would round the squares).
        """
        out = self.output_size(size)
        work = torch.promote_types(self.out_weight.dtype, torch.float32)
        device = self.out_weight.device
        logits = []
        for a, q in enumerate(self._padded_query_axes(size, out)):
            lo, hi = self.padding[a]
            k = torch.arange(size[a] + lo + hi, device=device)  # (P_a,) padded positions
            centers, alpha = self._axis_heads(a)  # (G,), and a float or (G,)
            diff = (k[None, :] - q.to(device)[:, None]).to(work) - centers.to(device, work)[:, None, None]
            if isinstance(alpha, Tensor):
                alpha = alpha.to(device, work)[:, None, None]
            logits.append(-alpha * diff.square())  # (G, n_a, P_a)
        return logits

    def axis_probs(self, size: Sequence[int]) -> list[Tensor]:
        """Per-axis softmax factors over the padded grid (Lemma 2 scores, split by axis).

        Returns one tensor per axis a of shape (K_a, n_a, P_a): the probability that the
        query of output index o attends to padded position i, for the heads whose tap
        along axis a is t. Head h = (t_1, ..., t_n) has P_h = (x)_a factors[a][t_a].
        """
        return [torch.softmax(l, dim=-1).to(self.out_weight.dtype) for l in self.axis_logits(size)]

    def _padded_query_axes(self, size: Sequence[int], out: Sequence[int] | None = None) -> list[Tensor]:
        """Per axis, the padded-grid position of each output index's query: o * stride + dilation * anchor."""
        out = self.output_size(size) if out is None else out
        return [torch.arange(n) * self.stride[a] + self.dilation[a] * self.anchor[a] for a, n in enumerate(out)]

    def _padded_sources(self, size: Sequence[int]) -> Tensor:
        """For every token of the padded grid (row-major), the input pixel it holds (flat index), or -1
        for a zero padding token: (P,) int64. Reflect/replicate/circular tokens name the pixel they copy."""
        src = None
        for a, n in enumerate(size):
            s = _source_index(n, *self.padding[a], self.padding_mode)  # (P_a,)
            if src is None:
                src = s
            else:
                both = (src[:, None] >= 0) & (s[None, :] >= 0)
                src = torch.where(both, src[:, None] * n + s[None, :], -1).reshape(-1)
        return src

    def _inner_tokens(self, size: Sequence[int]) -> Tensor:
        """The padded-grid token (flat index) of every input pixel, row-major: (T_in,) int64."""
        idx = None
        for a, n in enumerate(size):
            lo, hi = self.padding[a]
            r = torch.arange(n) + lo
            idx = r if idx is None else (idx[:, None] * (n + lo + hi) + r[None, :]).reshape(-1)
        return idx

    def _axis_heads(self, a: int) -> tuple[Tensor, float | Tensor]:
        """The centers along axis `a` of the softmax factors on that axis, and their alpha.

        Here one factor per tap along the axis (K_a of them, shared by every head with that
        tap), all with the layer's alpha.
        """
        return self.axis_offsets(a), self.alpha

    def attention_probs(self, x: Tensor | Sequence[int] | None = None, size: Sequence[int] | None = None) -> Tensor:
        """Dense attention probabilities from input pixels to output pixels: (1, heads, T_out, T_in).

        `size` is the input spatial size (or pass an input tensor `x`, or the size as the
        first argument). The padded grid is folded back onto the input pixels: a zero
        padding key drops out, a reflect/replicate/circular padding key adds its probability
        to the input pixel it copies. Hence the layer is exactly
        y[q] = sum_h sum_k P[0, h, q, k] value_maps()[0][h] @ x[k] + bias.
        Memory is heads * T_out * T_in: for analysis; forward never builds it.
        """
        if size is None:
            if isinstance(x, Tensor):
                size = x.shape[-self.ndim :]
            elif x is not None:
                size = x
            else:
                raise AttnconvError("attention_probs needs the input size (or an input tensor)")
        size = tuple(int(s) for s in size)
        out = self.output_size(size)
        if self.heads * math.prod(out) * math.prod(size) > _MAX_DENSE:
            raise AttnconvError(
                f"dense probabilities for input size {size} would have "
                f"{self.heads * math.prod(out) * math.prod(size)} entries; use axis_probs(size)"
            )
        dense = None
        for a, factor in enumerate(self.axis_probs(size)):  # factor: (K_a, n_a, P_a)
            src = _source_index(size[a], *self.padding[a], self.padding_mode).to(factor.device)  # (P_a,)
            keep = src >= 0
            folded = factor.new_zeros(factor.shape[0], factor.shape[1], size[a])  # (K_a, n_a, S_a)
            folded.index_add_(2, src[keep], factor[:, :, keep])
            if dense is None:
                dense = folded
            else:
                dense = self._outer(dense, folded)
        return dense.unsqueeze(0)

    @staticmethod
    def _outer(dense: Tensor, folded: Tensor) -> Tensor:
        """Join the axes so far (h, Tq, Tk) with the next axis (K_a, n_a, S_a).

        Here head h = (t_1, ..., t_n) has one factor per tap along each axis, so the heads
        are the Kronecker product of the axes' families; tokens stay row-major.
        """
        h, tq, tk = dense.shape
        dense = torch.einsum("hqk,top->htqokp", dense, folded)
        return dense.reshape(h * folded.shape[0], tq * folded.shape[1], tk * folded.shape[2])

    # -- values ----------------------------------------------------------------------------

    def value_maps(self) -> tuple[Tensor, Tensor]:
        """Lemma 1's W_val^h W_out^h per head, as maps on column vectors.

        Returns (maps (heads, C_out, C_in), bias (C_out,)); maps[h] = W[:, :, tap_h] of the
        convolution, zero outside each group's diagonal block; bias is zeros when absent.
        """
        g, o, i = self.groups, self.out_channels // self.groups, self.in_channels // self.groups
        maps = self.out_weight.new_zeros(self.heads, self.out_channels, self.in_channels)
        for j in range(g):
            maps[:, j * o : (j + 1) * o, j * i : (j + 1) * i] = self.out_weight[:, j * o : (j + 1) * o]
        bias = self.out_bias if self.out_bias is not None else self.out_weight.new_zeros(self.out_channels)
        return maps, bias

    def error_bound(self, x: Tensor) -> float:
        """Bound on max |self(x) - conv(x)| over all outputs (absolute, elementwise).

        With lambda = leakage_bound(alpha, ndim), each head's probability row differs from
        the one-hot on its target by at most 2 lambda in l1 norm (the target loses at most
        lambda, the other keys gain it), and every padded token is a zero or a copy of
        some x entry, so

            |y_attn - y_conv|[o, q] <= sum_{c, h} |W[o, c, tap_h]| * 2 lambda * max|x|
                                   <= 2 lambda * ||W||_{inf,1} * max|x|,

        with ||W||_{inf,1} the largest absolute row sum of the weight over (C_in, taps).
        The bias cancels. Rounding error of the arithmetic comes on top.
        """
        row_sums = self.out_weight.detach().abs().sum(dim=(0, 2))  # (C_out,)
        w_norm = float(row_sums.max()) if row_sums.numel() else 0.0
        return 2.0 * leakage_bound(self.alpha, self.ndim) * w_norm * float(x.detach().abs().max())

    # -- forward ---------------------------------------------------------------------------

    def _batched(self, x: Tensor) -> tuple[Tensor, bool]:
        """(B, C_in, *S) as is, or an unbatched (C_in, *S) with a batch axis added; checks the shape."""
        unbatched = x.dim() == self.ndim + 1
        if unbatched:
            x = x.unsqueeze(0)
        if x.dim() != self.ndim + 2 or x.shape[1] != self.in_channels:
            raise AttnconvError(
                f"expected input (B, {self.in_channels}, <{self.ndim} spatial sizes>), got {tuple(x.shape)}"
            )
        return x, unbatched

    def _pad(self, x: Tensor) -> Tensor:
        """Place x (B, C, *S) on the padded grid (B, C, *P); padding tokens per padding_mode."""
        pad = [p for lo_hi in reversed(self.padding) for p in lo_hi]  # F.pad order: last axis first
        if not any(pad):
            return x
        if self.padding_mode == "zeros":
            return F.pad(x, pad)
        return F.pad(x, pad, mode=self.padding_mode)

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, *S) -> (B, C_out, *S_out), equal to the source convolution (Theorem 1)."""
        x, unbatched = self._batched(x)
        size = tuple(x.shape[2:])
        out = self.output_size(size)
        z = self._pad(x)  # (B, C_in, P_1, ..., P_n)
        # Attend along one axis at a time; each step consumes the leading spatial axis and
        # appends (n_a, K_a): the queries' outputs and the head family along that axis.
        for factor in self.axis_probs(size):  # (K_a, n_a, P_a)
            z = torch.einsum("bci...,toi->bc...ot", z, factor)
        # z: (B, C_in, n_1, K_1, ..., n_n, K_n): head h = (t_1..t_n) averaged tokens, per query
        b, g = x.shape[0], self.groups
        c_in, c_out = self.in_channels // g, self.out_channels // g
        z = z.reshape(b, g, c_in, *z.shape[2:])
        # W_out per group: (g, C_out/g, C_in/g, K_1, ..., K_n)
        w = self.out_weight.permute(1, 2, 0).reshape(g, c_out, c_in, *self.kernel_size)
        n_letters, t_letters = "ijklmn"[: self.ndim], "uvwxyz"[: self.ndim]
        z_idx = "".join(nl + tl for nl, tl in zip(n_letters, t_letters))
        y = torch.einsum(f"bgc{z_idx},goc{t_letters}->bgo{n_letters}", z, w)
        y = y.reshape(b, self.out_channels, *out)
        if self.out_bias is not None:
            y = y + self.out_bias.view(-1, *([1] * self.ndim))
        return y.squeeze(0) if unbatched else y

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={self.out_bias is not None}, padding_mode={self.padding_mode!r}, alpha={self.alpha:g}"
        )


class _HeadPositions(nn.Module):
    """Per-head centers and widths of a `LearnableConvAttention` (no weight decay, as in the paper)."""

    no_weight_decay = True

    def __init__(self, centers: Tensor, alpha: float):
        super().__init__()
        self.center = nn.Parameter(centers.clone())  # (heads, ndim)
        self.log_alpha = nn.Parameter(torch.full((centers.shape[0],), math.log(alpha), dtype=centers.dtype,
                                                 device=centers.device))  # (heads,)


def check_key_dim(key_dim: Any, learnable: bool) -> None:
    """The content attention option of `conv_to_attention` / `cnn_to_attention`: an int >= 0, > 0 only if learnable."""
    if not isinstance(key_dim, int) or isinstance(key_dim, bool) or key_dim < 0:
        raise AttnconvError(f"key_dim must be an integer >= 0 (0: no content attention), got {key_dim!r}")
    if key_dim and not learnable:
        raise AttnconvError("content attention (key_dim > 0) is trained: pass learnable=True with it")


def _fused_widths(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """q, k and v zero-padded in their last dimension to widths SDPA's fused kernels accept, which
    changes no score and no output column: on CPU one width for all three (the flash kernel's
    rule), elsewhere multiples of 8 (the memory-efficient kernel's alignment; odd widths would
    send it to the math backend, which holds the whole score matrix)."""
    if q.device.type == "cpu":
        widths = (max(q.shape[-1], v.shape[-1]),) * 3
    else:
        widths = tuple(-(-t.shape[-1] // 8) * 8 for t in (q, k, v))
    return tuple(F.pad(t, (0, w - t.shape[-1])) if w > t.shape[-1] else t for t, w in zip((q, k, v), widths))


class LearnableConvAttention(ConvAttention):
    """`ConvAttention` whose head centers and widths are trainable, optionally with content attention.

    Head h scores key k from query q with A^h_{q,k} = -alpha_h ||k - q - Delta_h||^2, where
    Delta_h (`positions.center`, (heads, ndim), float) and alpha_h = exp(`positions.log_alpha`)
    are parameters. Built by `conv_to_attention(conv, learnable=True)` (or
    `cnn_to_attention(..., learnable=True)`), they start at the convolution's taps and
    at `alpha`, so the layer starts as the convolution (exactly for the default alpha)
    and training may then move, widen or sharpen every head, as in the quadratic
    attention models. Everything else (value maps, padding, stride, groups) is
    `ConvAttention`'s.

    The isotropic Gaussian still factorizes over the axes, exp(-alpha_h sum_a d_a^2) =
    prod_a exp(-alpha_h d_a^2), so each head's softmax over the box-shaped padded grid is
    a product of per-axis softmaxes; the forward applies them as one small matmul per
    axis and head. No T x T matrix is formed.

    At the float32 default alpha (~21) a head's softmax is one-hot to ~1e-9, so the
    gradients of the centers and widths are ~1e-9 as well: to let them move, start
    from a smaller alpha (alpha = 1 puts ~1/3 of a 3x3 head's mass on its center pixel,
    alpha = 4 about 93%).

    Content attention (`key_dim` > 0): every head also gets the content-content term of
    the paper's relative scores (Eq. 6), A^h_{q,k} += (W_qry^h x_q)^T (W_key^h x_k) / sqrt(key_dim), with
    `query` and `key` Linear(C_in -> heads * key_dim) over the padded grid's tokens (a
    zero padding token has key W_key 0 + b_key). The query projection starts at zero,
    so the content score is 0 and the layer starts as the position-only one (the same
    function); its gradient is not zero, so training can bring content in. The scores no
    longer factorize: the forward is one attention over the padded grid per head,
    O(B heads T_out P (key_dim + C_in)). It folds Lemma 2's score into the dot product,
    -alpha ||k - q - Delta||^2 = [2 alpha (q + Delta), -alpha] . [k, ||k||^2] + (a term
    of the query alone, which the softmax drops), with coordinates centered on the grid,
    so `scaled_dot_product_attention` runs without a score matrix in memory (flash
    attention on the CPU) and its gradients reach the centers and widths. The price is
    precision: in float32 the folded terms (~1e3 at a 28x28 grid's corners) round at
    ~1e-4 logits, so outputs differ from float64 by ~1e-5 to 3e-5 relative, against ~5e-7 for the
    plain formulation (`padded_scores`, used by the analysis). The terms, and so the
    error, grow with the square of the grid's side: ~7e-5 at 64x64, ~3e-4 at 128x128,
    ~8e-4 at 224x224 (benchmarks/content_conv_attention.py --precision); compute in
    float64 where that matters. Float64 layers are exact. Half-precision layers compute
    their scores and the attention in float32.
    """

    placement_children = ("query", "key")  # with the positions: what --attention-lr-scale scales

    def __init__(self, *args: Any, key_dim: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        check_key_dim(key_dim, learnable=True)
        factory = {"device": self.out_weight.device, "dtype": self.out_weight.dtype}
        self.positions = _HeadPositions(ConvAttention.centers.fget(self).to(**factory), self.alpha)
        self.key_dim = key_dim
        self.position_only = key_dim == 0
        if key_dim:
            self.query = nn.Linear(self.in_channels, self.heads * key_dim, **factory)
            self.key = nn.Linear(self.in_channels, self.heads * key_dim, **factory)
            nn.init.zeros_(self.query.weight)  # content score 0: the layer starts position-only
            nn.init.zeros_(self.query.bias)

    @property
    def centers(self) -> Tensor:
        """The heads' current centers Delta_h, (heads, ndim) float (a parameter)."""
        return self.positions.center

    @property
    def widths(self) -> Tensor:
        """The heads' current alpha_h, (heads,)."""
        return self.positions.log_alpha.exp()

    def _axis_heads(self, a: int) -> tuple[Tensor, Tensor]:
        """One softmax factor per head on every axis: its center's coordinate `a` and its alpha.

        So `axis_probs` returns (heads, n_a, P_a) per axis, and head h's probabilities over
        the padded grid are the outer product over a of factors[a][h].
        """
        return self.centers[:, a], self.widths

    @staticmethod
    def _outer(dense: Tensor, folded: Tensor) -> Tensor:
        """Join the axes so far (h, Tq, Tk) with the next axis (h, n_a, S_a), head by head."""
        h, tq, tk = dense.shape
        return torch.einsum("hqk,hop->hqokp", dense, folded).reshape(h, tq * folded.shape[1], tk * folded.shape[2])

    def error_bound(self, x: Tensor) -> float:
        """Theorem 1's bound holds only while every head sits on its tap with one alpha; check that first."""
        taps = ConvAttention.centers.fget(self).to(self.centers)
        start = torch.full_like(self.positions.log_alpha, math.log(self.alpha))  # rounded as the parameter was
        if not (torch.equal(self.centers.detach(), taps) and torch.equal(self.positions.log_alpha.detach(), start)):
            raise AttnconvError(
                "the heads have moved from the convolution's taps or widths (trained?): the layer is no longer a "
                "convolution, so there is no bound; measure it with conv_likeness instead"
            )
        if not self.position_only and (self.query.weight.detach().any() or self.query.bias.detach().any()):
            raise AttnconvError(
                "the content attention is no longer zero (trained?): the layer depends on its input and is not a "
                "convolution, so there is no bound"
            )
        return super().error_bound(x)

    # -- content attention ---------------------------------------------------------------

    def _query_tokens(self, z: Tensor, size: Sequence[int]) -> Tensor:
        """The tokens of the padded input z (B, C, *P) at the queries' positions: (B, T_out, C)."""
        out = self.output_size(size)
        pick = tuple(slice(q0, q0 + s * (n - 1) + 1, s) for q0, s, n in
                     zip((int(q[0]) for q in self._padded_query_axes(size, out)), self.stride, out))
        return z[(slice(None), slice(None), *pick)].flatten(2).transpose(1, 2)

    def _content_qk(self, z: Tensor, size: Sequence[int]) -> tuple[Tensor, Tensor]:
        """Content queries (B, heads, T_out, key_dim) and keys (B, heads, P, key_dim) of the padded input z."""
        b = z.shape[0]

        def project(linear: nn.Linear, tokens: Tensor) -> Tensor:  # in z's dtype, whatever the layer's
            bias = None if linear.bias is None else linear.bias.to(z.dtype)
            return F.linear(tokens, linear.weight.to(z.dtype), bias).view(b, -1, self.heads, self.key_dim)

        q = project(self.query, self._query_tokens(z, size)).transpose(1, 2)
        k = project(self.key, z.flatten(2).transpose(1, 2)).transpose(1, 2)
        return q, k

    def _position_features(self, size: Sequence[int], dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """Query features (heads, T_out, ndim + 1) and key features (P, ndim + 1) whose dot product is
        Lemma 2's score -alpha_h ||k - q - Delta_h||^2 up to a term of the query alone."""
        padded = [n + lo + hi for n, (lo, hi) in zip(size, self.padding)]
        device = self.out_weight.device
        middle = torch.tensor([(p - 1) / 2 for p in padded], dtype=dtype, device=device)  # keeps the terms small
        keys = _grid(padded).to(device, dtype) - middle  # (P, ndim)
        grids = torch.meshgrid(*self._padded_query_axes(size), indexing="ij")
        queries = torch.stack([g.reshape(-1) for g in grids], dim=-1).to(device, dtype) - middle  # (T_out, ndim)
        alpha = self.widths.to(dtype)[:, None, None]  # (heads, 1, 1)
        q_feat = torch.cat([2 * alpha * (queries[None] + self.centers.to(dtype)[:, None]),
                            (-alpha).expand(-1, queries.shape[0], 1)], dim=-1)
        k_feat = torch.cat([keys, keys.square().sum(-1, keepdim=True)], dim=-1)
        return q_feat, k_feat

    def _content_forward(self, x: Tensor, size: Sequence[int]) -> Tensor:
        """Every head's attention-weighted input per query, (B, heads, T_out, C_in), by one SDPA call."""
        from attnconv.attention import float32_scores

        work = torch.promote_types(self.out_weight.dtype, torch.float32)
        with float32_scores():  # the folded positional terms need float32: in bf16 they would swamp the scores
            z = self._pad(x).to(work)  # (B, C_in, *P)
            b = z.shape[0]
            q, k = self._content_qk(z, size)
            q_pos, k_pos = self._position_features(size, work)
            q = torch.cat([q.to(work) / math.sqrt(self.key_dim), q_pos.expand(b, -1, -1, -1)], dim=-1)
            k = torch.cat([k.to(work), k_pos.expand(b, self.heads, -1, -1)], dim=-1)
            # (B, heads, P, C_in); the fused kernels want the channels contiguous
            v = z.flatten(2).transpose(1, 2).contiguous()[:, None].expand(b, self.heads, -1, -1)
            q, k, v = _fused_widths(q, k, v)
            out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        return out[..., : self.in_channels].to(x.dtype)

    def padded_scores(self, x: Tensor) -> dict[str, Tensor]:
        """Score terms over the padded grid, computed exactly (no folding): 'position' (1, heads, T_out, P),
        'content' (B, heads, T_out, P) for content layers, and their sum 'combined'. In at least float32."""
        x, _ = self._batched(x)
        self._check_dense(x[:1] if self.position_only else x)
        size = tuple(x.shape[2:])
        logits = self.axis_logits(size)  # (heads, n_a, P_a) per axis
        pos = logits[0]
        for l in logits[1:]:
            h, tq, tk = pos.shape
            pos = (pos[:, :, None, :, None] + l[:, None, :, None, :]).reshape(h, tq * l.shape[1], tk * l.shape[2])
        pos = pos[None]
        if self.position_only:
            return {"position": pos, "combined": pos}
        q, k = self._content_qk(self._pad(x).to(pos.dtype), size)
        content = q @ k.transpose(-1, -2) / math.sqrt(self.key_dim)
        return {"position": pos, "content": content, "combined": pos + content}

    def attention_scores(self, x: Tensor) -> dict[str, Tensor]:
        """`padded_scores` at the input pixels' tokens: (1 or B, heads, T_out, T_in) per term.

        The padding tokens take part in the softmax but are not pixels, so they are left
        out here; `attention_probs` folds their probability onto the pixels they copy.
        """
        x, _ = self._batched(x)
        inner = self._inner_tokens(tuple(x.shape[2:])).to(x.device)
        return {name: s[..., inner] for name, s in self.padded_scores(x).items()}

    def _check_dense(self, x: Tensor) -> None:
        """Refuse score or probability tensors too large to hold (one per input, head and query)."""
        size = tuple(x.shape[2:])
        t_out = math.prod(self.output_size(size))
        padded = math.prod(n + lo + hi for n, (lo, hi) in zip(size, self.padding))
        if x.shape[0] * self.heads * t_out * padded > _MAX_DENSE:
            raise AttnconvError(
                f"dense attention of {x.shape[0]} inputs of size {size} would have "
                f"{x.shape[0] * self.heads * t_out * padded} entries; pass fewer inputs at a time"
            )

    def attention_probs(self, x: Tensor | Sequence[int] | None = None, size: Sequence[int] | None = None,
                        term: str = "combined") -> Tensor:
        """Probabilities from input pixels to output pixels, (1 or B, heads, T_out, T_in) (see ConvAttention).

        A content layer needs the input x (B, C_in, *S) and gives one map per input; `term`
        "position" or "content" gives the softmax of that score term alone (the layer uses
        "combined").
        """
        if term not in ("combined", "position", "content"):
            raise AttnconvError(f"unknown score term {term!r}; choose combined, position or content")
        if self.position_only:
            if term == "content":
                raise AttnconvError("this layer has no content attention (key_dim=0): ask for combined or position")
            return super().attention_probs(x, size)
        if not isinstance(x, Tensor):
            raise AttnconvError("a content-attention layer needs the input x (B, C_in, *S) to compute its attention")
        x, _ = self._batched(x)
        if size is not None and tuple(size) != tuple(x.shape[2:]):
            raise AttnconvError(f"size {tuple(size)} does not match the input's {tuple(x.shape[2:])}: a content "
                                "layer takes its size from x, leave size out")
        size = tuple(x.shape[2:])
        t_in = math.prod(size)
        probs = self.padded_scores(x)[term].softmax(-1)  # (B or 1, heads, T_out, P)
        src = self._padded_sources(size).to(probs.device)
        keep = src >= 0
        folded = probs.new_zeros(*probs.shape[:-1], t_in)
        folded.index_add_(-1, src[keep], probs[..., keep])
        return folded.to(self.out_weight.dtype)

    # -- forward -------------------------------------------------------------------------

    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, *S) -> (B, C_out, *S_out)."""
        x, unbatched = self._batched(x)
        size = tuple(x.shape[2:])
        out = self.output_size(size)
        b, g = x.shape[0], self.groups
        c_in, c_out = self.in_channels // g, self.out_channels // g
        if self.position_only:
            factors = self.axis_probs(size)  # (heads, n_a, P_a) per axis
            # Each step consumes the leading spatial axis and appends the queries' index along it;
            # the first one also brings in the head axis.
            z = torch.einsum("bci...,hoi->bhc...o", self._pad(x), factors[0])
            for factor in factors[1:]:
                z = torch.einsum("bhci...,hoi->bhc...o", z, factor)
            # z: (B, heads, C_in, n_1, ..., n_n): each head's average of the input, per query
            z = z.reshape(b, self.heads, g, c_in, math.prod(out))
        else:
            z = self._content_forward(x, size).reshape(b, self.heads, -1, g, c_in).permute(0, 1, 3, 4, 2)
        w = self.out_weight.reshape(self.heads, g, c_out, c_in)
        y = torch.einsum("bhgct,hgoc->bgot", z, w).reshape(b, self.out_channels, *out)
        if self.out_bias is not None:
            y = y + self.out_bias.view(-1, *([1] * self.ndim))
        return y.squeeze(0) if unbatched else y

    def extra_repr(self) -> str:
        text = super().extra_repr().replace(f"alpha={self.alpha:g}", f"alpha={self.alpha:g} (initial; learnable)")
        return text + (f", key_dim={self.key_dim}" if self.key_dim else "")


def _conv_padding(conv: nn.Module) -> tuple[tuple[int, int], ...]:
    """Per-axis (low, high) padding of a conv, as nn.ConvNd applies it (incl. 'same'/'valid')."""
    if conv.padding == "valid":
        return tuple((0, 0) for _ in conv.kernel_size)
    if conv.padding == "same":  # total dilation*(K-1); the odd pixel goes to the high side
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((int(p), int(p)) for p in conv.padding)


def conv_to_attention(
    conv: nn.Module, *, alpha: float | None = None, learnable: bool = False, key_dim: int = 0
) -> ConvAttention:
    """Build the attention layer of Theorem 1 that computes `conv` exactly.

    `conv` is an `nn.Conv1d`, `nn.Conv2d` or `nn.Conv3d` with any kernel size, stride,
    padding (int, tuple, 'same', 'valid'), dilation, groups, bias and padding_mode. The
    result has one head per kernel tap (Lemma 2 centers, Lemma 1 value maps), lives on
    the conv's device and dtype, and its output equals conv(x) up to the bound of
    `ConvAttention.error_bound`. `alpha` defaults to `default_alpha(dtype, ndim)`.

    `learnable=True` returns a `LearnableConvAttention` instead: the same heads, with
    each head's center and width as parameters to train further. It equals the conv up
    to the same bound at the same alpha; a small alpha (e.g. 1 to 4) trades exactness
    for gradients that can move the centers (see `LearnableConvAttention`). `key_dim` > 0
    (learnable layers only) adds content attention with that query/key width per head,
    starting at zero, so the layer still starts as the convolution.
    """
    if not isinstance(conv, (nn.Conv1d, nn.Conv2d, nn.Conv3d)):
        raise AttnconvError(f"conv_to_attention takes nn.Conv1d/2d/3d, got {type(conv).__name__}")
    if isinstance(conv.weight, nn.parameter.UninitializedParameter):
        raise AttnconvError("the convolution is lazy and uninitialized; run it once on an input first")
    weight = conv.weight.detach()  # (C_out, C_in / groups, *K)
    if not weight.is_floating_point():
        raise AttnconvError(f"conv weights must be floating point, got {weight.dtype}")
    ndim = weight.dim() - 2
    check_key_dim(key_dim, learnable)
    extra = {"key_dim": key_dim} if learnable else {}
    layer = (LearnableConvAttention if learnable else ConvAttention)(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        stride=conv.stride,
        padding=_conv_padding(conv),
        dilation=conv.dilation,
        groups=conv.groups,
        bias=conv.bias is not None,
        padding_mode=conv.padding_mode,
        alpha=default_alpha(weight.dtype, ndim) if alpha is None else alpha,
        device=weight.device,
        dtype=weight.dtype,
        **extra,
    )
    with torch.no_grad():
        layer.out_weight.copy_(weight.flatten(2).permute(2, 0, 1))  # (heads, C_out, C_in / groups)
        if conv.bias is not None:
            layer.out_bias.copy_(conv.bias.detach())
    return layer


# ----------------------------------------------------------------------------------------
# Reverse direction: the effective kernel of a position-only attention layer
# ----------------------------------------------------------------------------------------


def _as_size(size: Sequence[Any]) -> tuple[int, ...]:
    """effective_kernel(layer, 8, 8) and effective_kernel(layer, (8, 8)) both mean (8, 8)."""
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    size = tuple(int(s) for s in size)
    if not size or min(size) < 1:
        raise AttnconvError(f"size must be one or more positive integers, got {size}")
    return size


def _grid(size: Sequence[int]) -> Tensor:
    """Row-major coordinates of every pixel of a grid: (prod(size), ndim) int64."""
    grids = torch.meshgrid(*[torch.arange(n) for n in size], indexing="ij")
    return torch.stack([g.reshape(-1) for g in grids], dim=-1)


@dataclass
class EffectiveKernel:
    """A position-only attention layer as a linear map, kept factored.

    y[q] = sum_h sum_k probs[h, q, k] maps[h] @ x[k] + bias, i.e. the kernel output
    pixel q applies to input pixel k is K_q(k) = sum_h probs[h, q, k] maps[h]. Away from
    the borders, where probs[h, q, q + delta] does not depend on q, this is the convolution
    kernel K_eff(delta) = sum_h P_h(delta) W_val^h W_out^h. The (T_out, T_in, C_out, C_in)
    tensor is only built by `dense()`.
    """

    probs: Tensor  # (heads, T_out, T_in)
    maps: Tensor  # (heads, C_out, C_in)
    bias: Tensor  # (C_out,)
    in_size: tuple[int, ...]
    out_size: tuple[int, ...]
    query_pos: Tensor  # (T_out, ndim) int64: input-frame position each output pixel attends from
    centers: Tensor | None = None  # (heads, ndim): the layer's own head centers (layer.centers or
    # layer.encoding.centers), when it has them

    def _query(self, query: int | Sequence[int]) -> int:
        if isinstance(query, int):
            t_out = math.prod(self.out_size)
            if not -t_out <= query < t_out:
                raise AttnconvError(f"query index {query} out of range for {t_out} output pixels")
            return query % t_out
        query = tuple(int(i) for i in query)
        if len(query) != len(self.out_size) or any(not 0 <= i < n for i, n in zip(query, self.out_size)):
            raise AttnconvError(f"query {query} is not a pixel of the output grid {self.out_size}")
        flat = 0
        for i, n in zip(query, self.out_size):
            flat = flat * n + i
        return flat

    def at(self, query: int | Sequence[int]) -> Tensor:
        """The kernel output pixel `query` (flat index or coordinates) applies: (C_out, C_in, *in_size)."""
        q = self._query(query)
        kernel = torch.einsum("hk,hoc->ock", self.probs[:, q], self.maps)  # (C_out, C_in, T_in)
        return kernel.reshape(*kernel.shape[:2], *self.in_size)

    def dense(self) -> Tensor:
        """The full map (T_out, T_in, C_out, C_in); refused when it has more than 2^28 entries."""
        numel = self.probs.shape[1] * self.probs.shape[2] * self.maps.shape[1] * self.maps.shape[2]
        if numel > _MAX_DENSE:
            raise AttnconvError(f"the dense kernel would have {numel} entries; use .at(query) instead")
        return torch.einsum("hqk,hoc->qkoc", self.probs, self.maps)

    def apply(self, x: Tensor) -> Tensor:
        """Evaluate the factored map on x (B, C_in, *in_size) -> (B, C_out, *out_size)."""
        b = x.shape[0]
        z = torch.einsum("hqk,bck->bhcq", self.probs, x.reshape(b, x.shape[1], -1))  # (B, heads, C_in, T_out)
        y = torch.einsum("hoc,bhcq->boq", self.maps, z) + self.bias[:, None]  # (B, C_out, T_out)
        return y.reshape(b, -1, *self.out_size)


def effective_kernel(layer: nn.Module, *size: int | Sequence[int], probs: Tensor | None = None) -> EffectiveKernel:
    """Extract the linear map of a position-only attention layer at input size `size`.

    `layer` needs `attention_probs(size=...) -> (1, heads, T_out, T_in)` and
    `value_maps() -> (maps (heads, C_out, C_in), bias (C_out,))` (`ConvAttention`,
    `SelfAttention2d` with a position-only encoding). Content-dependent layers
    (`position_only = False`) have no input-independent kernel and are refused, unless
    `probs` (heads, T_out, T_in) gives the probabilities to use (e.g. a content layer's
    mean over inputs: the position-only layer with the same value maps).
    Call as `effective_kernel(layer, H, W)` or `effective_kernel(layer, (H, W))`.
    """
    size = _as_size(size)
    if probs is None and not getattr(layer, "position_only", True):
        raise AttnconvError(
            f"{type(layer).__name__} uses content attention, so its kernel depends on the input; "
            "effective_kernel needs a position-only layer, or the probabilities to use (probs=)"
        )
    if not (hasattr(layer, "attention_probs") and hasattr(layer, "value_maps")):
        raise AttnconvError(f"{type(layer).__name__} has no attention_probs/value_maps; it is not an attention layer")
    with torch.no_grad():
        probs = layer.attention_probs(size=size) if probs is None else probs.unsqueeze(0)  # (1, heads, T_out, T_in)
        maps, bias = layer.value_maps()  # (heads, C_out, C_in), (C_out,)
    out_size = tuple(layer.output_size(size)) if hasattr(layer, "output_size") else size
    if hasattr(layer, "query_positions"):
        query_pos = layer.query_positions(size)
    else:
        query_pos = _grid(out_size)
    if probs.dim() != 4 or probs.shape[0] != 1 or probs.shape[2:] != (math.prod(out_size), math.prod(size)):
        raise AttnconvError(
            f"probabilities of shape {tuple(probs.shape[1:])} do not fit: expected (heads, {math.prod(out_size)}, "
            f"{math.prod(size)}) for input size {size}"
        )
    heads = probs.shape[1]
    if maps.shape[0] != heads:
        raise AttnconvError(f"value_maps has {maps.shape[0]} heads but the probabilities have {heads}")
    centers = getattr(layer, "centers", None)
    if centers is None:  # SelfAttention2d keeps them in its quadratic encoding (Lemma 2's Delta_h)
        centers = getattr(getattr(layer, "encoding", None), "centers", None)
    if not (isinstance(centers, Tensor) and centers.shape == (heads, len(size))):
        centers = None
    return EffectiveKernel(
        probs=probs[0].detach(),
        maps=maps.detach(),
        bias=bias.detach(),
        in_size=size,
        out_size=out_size,
        query_pos=query_pos,
        centers=None if centers is None else centers.detach(),
    )


@dataclass
class ConvLikeness:
    """How convolutional a position-only attention layer is (see `conv_likeness`)."""

    kernel_size: int
    size: tuple[int, ...]
    centers: Tensor  # (heads, ndim): head centers (offsets from the query)
    window_mass: Tensor  # (heads,): attention mass inside the K^ndim window around the center
    distance: float  # relative Frobenius distance to the nearest K^ndim zero-padded convolution
    kernel: Tensor  # (C_out, C_in, K, ..., K): that nearest convolution's weights

    @property
    def mean_window_mass(self) -> float:
        return float(self.window_mass.mean())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the kernel itself is left out: it can be large)."""
        return {
            "kernel_size": self.kernel_size,
            "size": list(self.size),
            "heads": int(self.window_mass.numel()),
            "centers": self.centers.tolist(),
            "window_mass": self.window_mass.tolist(),
            "mean_window_mass": self.mean_window_mass,
            "distance": self.distance,
            "kernel_shape": list(self.kernel.shape),
        }


def conv_likeness(
    layer_or_kernel: nn.Module | EffectiveKernel,
    size: int | Sequence[int] | None = None,
    kernel_size: int = 3,
) -> ConvLikeness:
    """Measure how close a position-only attention layer is to a K x K convolution.

    Two numbers, computed from the factored `EffectiveKernel` (probs P (heads, T_out, T_in),
    maps M (heads, C_out, C_in)); all in float64.

    Window mass, per head: the center c_h is the layer's own head center when it has one
    (`layer.centers`), else the probability-weighted mean offset k - q seen from the
    query in the middle of the grid. The mass is sum_k P_h[q, k] over keys with
    k - q - round(c_h) in the K^ndim window, averaged over the interior queries (those
    whose window lies inside the grid; all queries if none does).

    Distance: the layer is the linear map L[q, k] = sum_h P[h, q, k] M_h (the bias is
    ignored: it is the same for the conv). A zero-padded K^ndim convolution is
    C[q, k] = W_c[k - q] for k - q in the window and 0 elsewhere. min ||L - C||_F
    splits over the pairs (q, k):
      - pairs outside the window contribute ||L[q, k]||^2 whatever W_c is;
      - for each offset delta in the window, the pairs N_delta with k - q = delta
        contribute sum ||L[q, k] - W_c[delta]||^2, minimized by the mean:
        W_c[delta] = sum_h pbar_h(delta) M_h with pbar_h(delta) the mean of P[h, q, q + delta].
    With the Gram matrix G[h, h'] = <M_h, M_h'>_F, ||sum_h a_h M_h||^2 = a^T G a, so
        ||L||^2    = sum_{h,h'} G[h, h'] O[h, h'],        O = sum_{q,k} P[h,q,k] P[h',q,k],
        residual   = sum G * O_out + sum G * (R R^T),
    where O_out is the overlap restricted to pairs outside the window and R (heads, pairs
    in window) holds P[:, q, k] - pbar(k - q). Both terms are computed directly (no
    ||L||^2 - ||C||^2 cancellation), so a converted conv gives a distance of ~1e-16, not
    sqrt(eps). distance = sqrt(residual / ||L||^2). For strided layers q is the query's
    input-frame position (`query_positions`), so the comparison is a strided conv.
    """
    if isinstance(layer_or_kernel, EffectiveKernel):
        ek = layer_or_kernel
        if size is not None:
            want = (size,) * len(ek.in_size) if isinstance(size, int) else _as_size(size)
            if want != ek.in_size:
                raise AttnconvError(f"size {size} does not match the effective kernel's input size {ek.in_size}")
    else:
        if size is None:
            raise AttnconvError("conv_likeness needs the input size for a layer")
        if isinstance(size, int):
            size = (size,) * getattr(layer_or_kernel, "ndim", 2)
        ek = effective_kernel(layer_or_kernel, tuple(size))
    if kernel_size < 1:
        raise AttnconvError(f"kernel_size must be positive, got {kernel_size}")

    p = ek.probs.double()  # (heads, T_out, T_in)
    maps = ek.maps.double()  # (heads, C_out, C_in)
    heads, t_out, t_in = p.shape
    ndim = len(ek.in_size)
    device = p.device
    in_size = torch.tensor(ek.in_size, device=device)
    keys = _grid(ek.in_size).to(device)  # (T_in, ndim)
    pos = ek.query_pos.to(device)  # (T_out, ndim)
    rel = keys[None, :, :] - pos[:, None, :]  # (T_out, T_in, ndim): delta = k - q
    w_lo, w_hi = -((kernel_size - 1) // 2), kernel_size // 2  # window offsets, the conv's anchor convention

    # Centers: the layer's own, else the mean offset from the middle query.
    if ek.centers is not None:
        centers = ek.centers.to(device, torch.float64)
    else:
        mid = ek._query(tuple(n // 2 for n in ek.out_size))
        centers = torch.einsum("hk,kd->hd", p[:, mid], rel[mid].double())  # (heads, ndim)
    shift = centers.round().long()  # (heads, ndim)

    # Window mass per head, over interior queries.
    rel_h = rel[None] - shift[:, None, None, :]  # (heads, T_out, T_in, ndim)
    in_win_h = ((rel_h >= w_lo) & (rel_h <= w_hi)).all(-1)  # (heads, T_out, T_in)
    mass_q = (p * in_win_h).sum(-1)  # (heads, T_out)
    first = pos[None] + shift[:, None, :] + w_lo  # (heads, T_out, ndim)
    interior = ((first >= 0) & (first + kernel_size - 1 < in_size)).all(-1)  # (heads, T_out)
    window_mass = torch.stack(
        [(mass_q[h][interior[h]] if interior[h].any() else mass_q[h]).mean() for h in range(heads)]
    )

    # Nearest zero-padded convolution (least squares, see docstring).
    gram = torch.einsum("hoc,goc->hg", maps, maps)  # (heads, heads)
    flat = p.reshape(heads, -1)  # (heads, T_out * T_in)
    total = float((gram * (flat @ flat.T)).sum())
    in_win = ((rel >= w_lo) & (rel <= w_hi)).all(-1).reshape(-1)  # (T_out * T_in,)
    outside = flat[:, ~in_win]
    residual = (gram * (outside @ outside.T)).sum()
    n_win = kernel_size**ndim
    win_idx = torch.zeros(rel.shape[:2], dtype=torch.long, device=device)  # (T_out, T_in): flat window index of delta
    for d in range(ndim):
        win_idx = win_idx * kernel_size + (rel[..., d] - w_lo).clamp(0, kernel_size - 1)
    win_idx = win_idx.reshape(-1)[in_win]  # (pairs,)
    inside = flat[:, in_win]  # (heads, pairs)
    counts = torch.bincount(win_idx, minlength=n_win).double()  # (n_win,)
    sums = torch.zeros(heads, n_win, dtype=torch.float64, device=device).index_add_(1, win_idx, inside)
    pbar = sums / counts.clamp(min=1)  # (heads, n_win)
    dev = inside - pbar[:, win_idx]  # (heads, pairs)
    residual = float(residual + (gram * (dev @ dev.T)).sum())
    distance = math.sqrt(max(residual, 0.0) / total) if total > 0 else 0.0
    kernel = torch.einsum("hw,hoc->ocw", pbar, maps).reshape(*maps.shape[1:], *([kernel_size] * ndim))

    return ConvLikeness(
        kernel_size=kernel_size,
        size=ek.in_size,
        centers=centers,
        window_mass=window_mass,
        distance=distance,
        kernel=kernel,
    )
