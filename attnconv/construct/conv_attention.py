"""`ConvAttention`: the multi-head self-attention layer of Theorem 1 that computes an N-d convolution.

One head per kernel tap, Lemma 2's isotropic quadratic score centered on the tap, and
Lemma 1's value map W_val^h W_out^h = W[:, :, tap_h]^T. As alpha grows each head's
softmax becomes a one-hot on the pixel at offset Delta_h, so the layer computes the
cross-correlation that `nn.ConvNd` computes. Built by `construct.factory.conv_to_attention`.

Conventions: tokens are pixels in row-major order over the spatial axes (for 2-D,
q = i * W + j); `size` is always the *input* spatial size (unpadded).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.construct.bound import MAX_ALPHA, leakage_bound
from attnconv.construct.geometry import (
    MAX_DENSE,
    PADDING_MODES,
    backend_channels_last,
    channels_last_like,
    source_index,
)
from attnconv.construct.reads import conv_parameter_read
from attnconv.errors import AttnconvError
from attnconv.limits import (
    check_memory,
    flag_argument,
    positive_ints,
    real_number,
    shown_value,
    tensor_argument,
    weights_with_values,
    whole_number,
)
from attnconv.ops.autocast import matmul_dtype
from attnconv.ops.fused import functorch_wrapped
from attnconv.ops.scores import factor_softmax, quadratic_axis_scores

__all__ = ["ConvAttention"]


def _pairs(padding: Any, count: int) -> bool:
    """Whether `padding` is `count` pairs (sequences of length 2), whatever their entries."""
    try:
        return len(padding) == count and all(not isinstance(p, (str, bytes)) and len(p) == 2 for p in padding)
    except TypeError:  # no length
        return False


def _conv_state_dict(layer: ConvAttention, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """`load_state_dict` of the convolution's own keys (`weight` (C_out, C_in / groups, *kernel), `bias`): taken as
    the converted layer's (`out_weight` (heads, C_out, C_in / groups), `out_bias`), so a CNN's checkpoint loads into
    its converted network; a `weight` of another shape is one line naming it."""
    weight, bias = prefix + "weight", prefix + "bias"
    if weight not in state_dict or prefix + "out_weight" in state_dict:
        return
    shape = (layer.out_channels, layer.in_channels // layer.groups, *layer.kernel_size)
    given = state_dict[weight]
    if not isinstance(given, Tensor):
        raise AttnconvError(f"{weight} is a {type(given).__name__}, not a tensor: a state_dict holds tensors (the "
                            f"convolution's weight {shape}); load the state_dict of the convolution it was converted "
                            "from")
    if tuple(given.shape) != shape:
        raise AttnconvError(f"{weight} of shape {tuple(given.shape)} is not this layer's convolution's weight {shape}: "
                            "load the state_dict of the convolution it was converted from")
    state_dict[prefix + "out_weight"] = state_dict.pop(weight).flatten(2).permute(2, 0, 1)
    if bias in state_dict:
        state_dict[prefix + "out_bias"] = state_dict.pop(bias)


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

    Finite inputs only: the equivalence (and `error_bound`) holds for finite x. A
    convolution keeps a NaN or inf local, to the outputs whose receptive field holds it;
    this layer does not. Every head's softmax gives every key of the padded grid a weight,
    tiny or underflowed to exactly 0 away from the target, and 0 * inf = NaN * w = NaN, so
    one non-finite value in image b, channel c makes every output of image b in c's
    channel group non-finite (with groups=1, all of image b's outputs); the other images
    of the batch are unaffected. Keeping it local would need a data-dependent branch in
    every forward (a device sync) or extra passes over the input; check
    `torch.isfinite(x).all()` before the layer where inputs may hold NaN or inf.

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
        in_channels = whole_number(in_channels, "in_channels", "the input channels")
        out_channels = whole_number(out_channels, "out_channels", "the output channels")
        groups, bias = whole_number(groups, "groups", "the channel groups"), flag_argument(bias, "bias")
        self.kernel_size = positive_ints(kernel_size, None, "kernel_size", "the kernel's size per axis (1 to 3 axes)")
        ndim = len(self.kernel_size)
        if ndim > 3:
            raise AttnconvError(f"kernel_size {self.kernel_size} is invalid: give the kernel's size per axis, 1 to 3 "
                                "axes (as nn.Conv1d, nn.Conv2d and nn.Conv3d)")
        self.stride = positive_ints(stride, ndim, "stride", "the step per axis")
        self.dilation = positive_ints(dilation, ndim, "dilation", "the spacing of the kernel's taps per axis")
        if isinstance(padding, (str, bytes)) or not _pairs(padding, ndim):
            raise AttnconvError(f"padding {shown_value(padding)} is invalid: give the zeros before and after per "
                                f"axis, {ndim} pairs (low, high) of whole numbers >= 0")
        self.padding = tuple(positive_ints(pair, 2, "padding", "the zeros before and after on one axis", least=0)
                             for pair in padding)
        if padding_mode not in PADDING_MODES:
            raise AttnconvError(f"padding_mode must be one of {PADDING_MODES}, got {padding_mode!r}")
        if in_channels % groups or out_channels % groups:
            raise AttnconvError(
                f"groups={groups} must divide in_channels={in_channels} and out_channels={out_channels}"
            )
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.padding_mode = padding_mode
        self.ndim = ndim
        self.heads = math.prod(self.kernel_size)
        check_memory(self.heads * out_channels * (in_channels // groups + 1) * 4,
                     f"kernel_size {self.kernel_size} with {in_channels} to {out_channels} channels",
                     "give a smaller kernel or fewer channels")
        self.alpha = real_number(alpha, "alpha", "the heads' softmax sharpness (larger changes nothing: every "
                                 "off-target weight is 0 past 750)", low=0, low_open=True, high=MAX_ALPHA)
        self.anchor = tuple((k - 1) // 2 for k in self.kernel_size)

        factory = {"device": device, "dtype": dtype}
        # out_weight[h] = (W_val^h W_out^h)^T per group: (heads, C_out, C_in // groups)
        self.out_weight = nn.Parameter(torch.empty(self.heads, out_channels, in_channels // groups, **factory))
        self.register_parameter("out_bias", nn.Parameter(torch.empty(out_channels, **factory)) if bias else None)
        bound = 1.0 / math.sqrt(self.heads * in_channels // groups)  # nn.ConvNd's default init
        nn.init.uniform_(self.out_weight, -bound, bound)
        if self.out_bias is not None:
            nn.init.uniform_(self.out_bias, -bound, bound)
        self._register_load_state_dict_pre_hook(_conv_state_dict, with_module=True)

    # -- geometry ------------------------------------------------------------------------

    def axis_offsets(self, axis: int) -> Tensor:
        """Center coordinates along `axis` of the K_a head families: dilation * (tap - anchor)."""
        axis = whole_number(axis, "axis", f"a spatial axis of this {self.ndim}-d layer", least=0, most=self.ndim - 1)
        k, d, c = self.kernel_size[axis], self.dilation[axis], self.anchor[axis]
        return d * (torch.arange(k) - c)  # (K_a,)

    @property
    def centers(self) -> Tensor:
        """The heads' centers Delta_h (Lemma 2), (heads, ndim) int64, row-major tap order."""
        grids = torch.meshgrid(*[self.axis_offsets(a) for a in range(self.ndim)], indexing="ij")
        return torch.stack([g.reshape(-1) for g in grids], dim=-1)

    @property
    def alphas(self) -> Tensor:
        """Each head's alpha_h of Lemma 2's score, (heads,): all `alpha` here (trainable in
        LearnableConvAttention). Not `QuadraticEncoding.widths`, which holds a_h with alpha = a_h^2 / 2."""
        return torch.full((self.heads,), self.alpha, dtype=torch.float64)

    def output_size(self, size: Sequence[int]) -> tuple[int, ...]:
        """Output spatial size for an input of spatial `size`; AttnconvError where the conv fails."""
        # an input's own sizes are symbolic where torch.compile makes them dynamic: positive_ints keeps them so
        size = positive_ints(size, self.ndim, "size", f"the {self.ndim}-d spatial size of the input")
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
        self._check_memory(size, out)
        logits = []
        for a, q in enumerate(self._padded_query_axes(size, out)):
            lo, hi = self.padding[a]
            k = torch.arange(size[a] + lo + hi, device=device)  # (P_a,) padded positions
            centers, alpha = self._axis_heads(a)  # (G,), and a float or (G,)
            delta = (k[None, :] - q.to(device)[:, None]).to(work)  # (n_a, P_a): key minus query
            if isinstance(alpha, Tensor):
                alpha = alpha.to(device, work)
            logits.append(quadratic_axis_scores(delta, centers.to(device, work), alpha))  # (G, n_a, P_a)
        return logits

    def axis_probs(self, size: Sequence[int]) -> list[Tensor]:
        """Per-axis softmax factors over the padded grid (Lemma 2 scores, split by axis).

        Returns one tensor per axis a of shape (K_a, n_a, P_a): the probability that the
        query of output index o attends to padded position i, for the heads whose tap
        along axis a is t. Head h = (t_1, ..., t_n) has P_h = (x)_a factors[a][t_a].
        """
        return [p.to(self.out_weight.dtype) for p in factor_softmax(self.axis_logits(size))]

    def _padded_query_axes(self, size: Sequence[int], out: Sequence[int] | None = None) -> list[Tensor]:
        """Per axis, the padded-grid position of each output index's query: o * stride + dilation * anchor."""
        out = self.output_size(size) if out is None else out
        return [torch.arange(n) * self.stride[a] + self.dilation[a] * self.anchor[a] for a, n in enumerate(out)]

    def _padded_sources(self, size: Sequence[int]) -> Tensor:
        """For every token of the padded grid (row-major), the input pixel it holds (flat index), or -1
        for a zero padding token: (P,) int64. Reflect/replicate/circular tokens name the pixel they copy."""
        src = None
        for a, n in enumerate(size):
            s = source_index(n, *self.padding[a], self.padding_mode)  # (P_a,)
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

    def _axis_factors(self, a: int) -> int:
        """How many softmax factors `_axis_heads(a)` gives (one per tap along the axis), without building them."""
        return self.kernel_size[a]

    def padded_position_scores(self, size: Sequence[int]) -> Tensor:
        """Lemma 2's scores -alpha_h ||k - q - Delta_h||^2 over the padded grid: (heads, T_out, P), the sum over
        the axes of `axis_logits`, in at least float32."""
        logits = self.axis_logits(size)
        scores = logits[0]
        for axis in logits[1:]:
            scores = self._outer_sum(scores, axis)
        return scores

    @staticmethod
    def _outer_sum(dense: Tensor, axis: Tensor) -> Tensor:
        """`_outer` for scores: the axes so far (h, Tq, Tk) plus the next axis (K_a, n_a, P_a), heads as their
        Kronecker product."""
        h, tq, tk = dense.shape
        k, o, p = axis.shape
        return (dense[:, None, :, None, :, None] + axis[None, :, None, :, None, :]).reshape(h * k, tq * o, tk * p)

    def _analysis_size(self, x: Tensor | None, size: Sequence[int] | None) -> tuple[int, ...]:
        """The input spatial size: `size`, or the size of the input `x` (the `AttentionLayer` signature)."""
        weights_with_values(self.out_weight)  # an analysis computes with them
        if size is None:
            if x is None:
                raise AttnconvError("give the input x (B, C_in, *S) or size=(its spatial size)")
            size = self._batched(x)[0].shape[2:]  # an input forward takes
        return positive_ints(size, self.ndim, "size", f"the {self.ndim}-d spatial size of the input")

    def _check_position_scores(self, size: Sequence[int]) -> None:
        """Refuse dense scores too large to hold (one entry per head, query and padded key)."""
        entries = self.heads * math.prod(self.output_size(size)) * math.prod(
            n + lo + hi for n, (lo, hi) in zip(size, self.padding))
        if entries > MAX_DENSE:
            raise AttnconvError(f"dense scores for input size {tuple(size)} would have {entries} entries; "
                                "use axis_logits(size)")

    def attention_scores(self, x: Tensor | None = None, size: Sequence[int] | None = None) -> dict[str, Tensor]:
        """Pre-softmax scores from input pixels to output pixels, {"combined", "position"} (the same here), each
        (1, heads, T_out, T_in) in at least float32: Lemma 2's score at the input pixels' tokens.

        The padding tokens take part in the softmax but are not pixels, so they are left out here
        (`attention_probs` folds their probability onto the pixels they copy)."""
        size = self._analysis_size(x, size)
        self._check_position_scores(size)
        inner = self._inner_tokens(size).to(self.out_weight.device)
        scores = self.padded_position_scores(size)[None][..., inner]
        return {"combined": scores, "position": scores}

    def attention_probs(self, x: Tensor | None = None, size: Sequence[int] | None = None,
                        term: str = "combined") -> Tensor:
        """Dense attention probabilities from input pixels to output pixels: (1, heads, T_out, T_in).

        `size` is the input spatial size (or pass an input tensor `x`, whose size is taken; the
        `AttentionLayer` signature). `term`: "combined" or "position", the same here (no content term).
        The padded grid is folded back onto the input pixels: a zero
        padding key drops out, a reflect/replicate/circular padding key adds its probability
        to the input pixel it copies. Hence the layer is exactly
        y[q] = sum_h sum_k P[0, h, q, k] value_maps()[0][h] @ x[k] + bias.
        Memory is heads * T_out * T_in: for analysis; forward never builds it.
        """
        if term not in ("combined", "position"):
            raise AttnconvError(f"term {term!r}: a position-only layer has the terms 'combined' and 'position'")
        size = self._analysis_size(x, size)
        out = self.output_size(size)
        if self.heads * math.prod(out) * math.prod(size) > MAX_DENSE:
            raise AttnconvError(
                f"dense probabilities for input size {size} would have "
                f"{self.heads * math.prod(out) * math.prod(size)} entries; use axis_probs(size)"
            )
        dense = None
        for a, factor in enumerate(self.axis_probs(size)):  # factor: (K_a, n_a, P_a)
            src = source_index(size[a], *self.padding[a], self.padding_mode).to(factor.device)  # (P_a,)
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
        The bias cancels. Rounding error of the arithmetic comes on top. The bound is for
        finite x: with a NaN or inf in x it is inf (outputs far from it are non-finite too;
        see the class docstring).
        """
        x, _ = self._batched(x, values=True)  # a tensor of this layer's input (what else would bound nothing)
        row_sums = self.out_weight.detach().abs().sum(dim=(0, 2))  # (C_out,)
        w_norm = float(row_sums.max()) if row_sums.numel() else 0.0
        scale = float(x.detach().abs().max()) if x.numel() else 0.0
        if not math.isfinite(scale):
            return math.inf
        return 2.0 * leakage_bound(self.alpha, self.ndim) * w_norm * scale

    # -- forward ---------------------------------------------------------------------------

    def _batched(self, x: Tensor, values: bool = False) -> tuple[Tensor, bool]:
        """(B, C_in, *S) as is, or an unbatched (C_in, *S) with a batch axis added; checks the kind, dtype, device
        (`limits.tensor_argument`; `values`: a number is computed from it, so not on the meta device) and shape."""
        tensor_argument(x, "x", f"the input (B, {self.in_channels}, <{self.ndim} spatial sizes>) or one image without "
                        "the batch axis", like=self.out_weight, values=values)
        unbatched = x.dim() == self.ndim + 1
        if x.dim() not in (self.ndim + 1, self.ndim + 2) or x.shape[int(not unbatched)] != self.in_channels:
            raise AttnconvError(  # the input's shape as given, not as the batch of one it is run as
                f"expected input (B, {self.in_channels}, <{self.ndim} spatial sizes>) or unbatched "
                f"({self.in_channels}, <{self.ndim} spatial sizes>), got {tuple(x.shape)}")
        return (x.unsqueeze(0) if unbatched else x), unbatched

    def _check_memory(self, size: Sequence[int], out: Sequence[int], images: int = 0) -> None:
        """Refuse, before any of it is allocated, what input size `size` needs past this machine's memory: the per-axis
        factors (their scores, softmax and cast at once) and, for `images` channel planes, the padded input. Not while
        torch.compile traces (reading the machine's memory is no graph op; the eager layer checks, a compiled one
        fails as torch does)."""
        if torch.compiler.is_compiling():
            return
        work = torch.promote_types(self.out_weight.dtype, torch.float32).itemsize
        padded = [n + lo + hi for n, (lo, hi) in zip(size, self.padding)]
        factors = sum(self._axis_factors(a) * out[a] * padded[a] for a in range(self.ndim))
        check_memory(3 * factors * work + images * math.prod(padded) * self.out_weight.element_size(),
                     f"input size {tuple(size)} with padding {self.padding}", "give smaller inputs or less padding")

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
        if torch.jit.is_tracing():  # the attention is built for the traced size, as constants: said, not silent
            warnings.warn(f"{type(self).__name__} traced at input size {tuple(int(n) for n in size)}: the trace computes "
                          "for that size only (a converted layer's attention is built for its input's size); trace "
                          "at the size it will see, or use torch.export, which refuses other sizes",
                          torch.jit.TracerWarning, stacklevel=2)
        out = self.output_size(size)
        self._check_memory(size, out, x.shape[0] * x.shape[1])  # the padded input too, before it is made
        z = padded = self._pad(x)  # (B, C_in, P_1, ..., P_n)
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
        z_idx = "".join([nl + tl for nl, tl in zip(n_letters, t_letters)])  # a list: torch.compile traces it in every state
        y = torch.einsum(f"bgc{z_idx},goc{t_letters}->bgo{n_letters}", z, w)
        y = y.reshape(b, self.out_channels, *out)
        if self.out_bias is not None:
            y = y + self.out_bias.view(-1, *([1] * self.ndim))
        y = self._conv_layout(self._conv_dtype(y, x), x, padded)
        return y.squeeze(0) if unbatched else y

    def _conv_dtype(self, y: Tensor, x: Tensor) -> Tensor:
        """y in the dtype the convolution returns: under autocast, autocast's (its scores and softmax ran in float32,
        and the float32 bias promoted the sum), where the convolution would run in it (no float64 input or weights)."""
        if x.dtype != torch.float64 and self.out_weight.dtype != torch.float64:
            dtype = matmul_dtype(x)
            if dtype != y.dtype:
                return y.to(dtype)
        return y

    def _conv_layout(self, y: Tensor, x: Tensor, padded: Tensor | None = None) -> Tensor:
        """y (B, C_out, *S_out) laid out in memory as nn.ConvNd lays out its output for input x (`padded`:
        `self._pad(x)` where the caller has it).

        The einsums leave y strided as they please; a convolution returns a contiguous tensor
        (channels-last for a channels-last input, except after circular padding, whose padded copy is
        contiguous), and code after a convolution may rely on that (`.view()`), so the converted layer
        does too. The backend torch selects for the convolution decides, on the CPU as on a GPU (cuDNN returns a float64
        output contiguous; the CPU's backend for a 3-d convolution of one image, contiguous too).
        """
        fmt = {4: torch.channels_last, 5: torch.channels_last_3d}.get(x.dim())
        last = None
        if fmt is None or self.padding_mode == "circular" or (not torch.compiler.is_compiling() and functorch_wrapped(x)):
            last = False  # under torch.func.vmap the convolution's layout depends on where the mapped axis lies in
            # memory, which the samples' strides do not show: contiguous, so `.view()` after the layer works
        elif torch.jit.is_tracing():  # sizes are tensors while traced (a trace holds one layout): as it was compared
            last = x.stride() == x.contiguous(memory_format=fmt).stride() != x.contiguous().stride()
        elif x.device.type != "meta" and not torch.compiler.is_compiling():
            zeros = self.padding_mode == "zeros"  # other modes pad first, as the convolution does: its input is the
            # padded copy, whose layout the device's padding kernel decides (reflect on a GPU: contiguous); on the
            # CPU a 3-d convolution of one channels-last image returns a contiguous output, its backend's choice
            last = backend_channels_last(
                x if zeros else (self._pad(x) if padded is None else padded),
                (self.out_channels, self.in_channels // self.groups, *self.kernel_size), self.stride,
                [lo if zeros else 0 for lo, _ in self.padding], self.dilation, self.groups)
        if last is None:  # the input's own layout, size-1 axes and one channel too (a torch that cannot tell, or meta)
            last = channels_last_like(x.shape, x.stride())
        return y.contiguous(memory_format=fmt) if last else y.contiguous()

    def __getattr__(self, name: str) -> Any:
        """nn.Module's lookup of parameters, buffers and submodules; a convolution's own `weight` or `bias`, asked of
        the layer that replaced it (a module computing with its convolution's weight itself), is one error saying so,
        an AttributeError still (hasattr is False), not torch's "object has no attribute"."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name in ("weight", "bias"):  # not one a user registered: the convolution's, which the layer replaced
                conv_parameter_read(self, name, ConvAttention)
            raise

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, dilation={self.dilation}, groups={self.groups}, "
            f"bias={self.out_bias is not None}, padding_mode={self.padding_mode!r}, alpha={self.alpha:g}"
        )
