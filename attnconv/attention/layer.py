"""SelfAttention2d: multi-head self-attention over pixels, a drop-in for nn.Conv2d.

The layer holds the parameters and the argument checks; the computation is the functional ops of
`attnconv.ops` (one module per backend), and `select.resolve_impl` picks the backend a forward runs.

Value modes:
  - "shared" (the paper's models): W_val^h = I, every head averages the whole
    input, and one Linear(heads * C_in -> C_out) mixes the heads.
  - "project": a per-head value projection Linear(C_in -> heads * head_dim), then
    Linear(heads * head_dim -> C_out).

Position-only probabilities do not depend on the input: they are computed once
per forward and shared by the whole batch. Scores and softmax are computed in
at least float32 even under autocast or in a float16/bfloat16 layer (float64 layers
stay float64); the output has the layer's dtype (autocast's under autocast).

Attention dropout (`attn_dropout_mask`): "per-sample" draws a mask per sample, as BERT
does for content attention; "shared" draws one mask for the whole batch, the paper's
code's convention for position-only probabilities (which have no batch dimension there).
Both keep every probability's expectation.
"""

from __future__ import annotations

import math
import operator

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from attnconv import ops
from attnconv.attention.select import IMPLS, choose_impl
from attnconv.errors import AttnconvError
from attnconv.limits import (
    MAX_SIDE,
    AllocationLimit,
    check_memory,
    flag_argument,
    is_whole,
    parameter_limit,
    positive_ints,
    real_number,
    shown_value,
    tensor_argument,
    weights_with_values,
)
from attnconv.ops.autocast import at_least_float32, float32_scores
from attnconv.positional import ENCODINGS, build_encoding, check_pos_init

VALUE_MODES = ("shared", "project")
DROPOUT_MASKS = ("per-sample", "shared")


class SelfAttention2d(nn.Module):
    """Multi-head self-attention on images with relative positional encodings (Eq. 1-3, 7, tokens = pixels).

        SA_h(X)_q = sum_k softmax(A^h_{q,:})_k  X_k W_val^h
        MHSA(X)   = concat_h SA_h(X) W_out + b_out

    Args:
        in_channels: C_in.
        out_channels: C_out (default: C_in).
        heads: number of heads N_h.
        encoding: "quadratic" (isotropic Gaussian, learnable centers and widths),
            "quadratic-diag" (axis-aligned), "quadratic-aniso" (full 2x2 inverse
            covariance), "learned" (row/column tables, no content), or
            "learned-content" (q.k plus q.r).
        impl: "auto", "dense", "separable", "stacked", "fused" or "sdpa" (see `attnconv.ops`;
            "auto": `attnconv.attention.select.resolve_impl`).
        value: "shared" (W_val = I, the paper's) or "project" (per-head values of size head_dim).
        head_dim: per-head value width for value="project" (default ceil(C_out / heads)).
        key_dim: per-head query/key width for content attention (default C_in, the paper's).
        pos_dim: width D_p of the "learned" tables (default C_in; the paper uses 400).
        max_size: largest image side the learned tables cover.
        attn_dropout: dropout on the attention probabilities (training only).
        bias: bias of the output projection.
        pos_init: "authors" (the paper's code: learned tables N(0, 1), per-head keys as
            nn.Linear's default; quadratic centers N(0, 2^2)) or "bert" (learned tables and
            keys N(0, 0.02^2), uniform heads at init; learned encodings only).
        attn_dropout_mask: "per-sample" (a dropout mask per sample) or "shared" (one mask for
            the batch, the paper's code's convention; position-only encodings only).
        stride: keep every stride-th query in each direction, starting at 0, as a strided conv
            with padding k // 2 does (output ceil(H / stride) x ceil(W / stride)); the attention
            itself is computed over every query, then subsampled.

    Shapes: forward (B, C_in, H, W) -> (B, C_out, H, W); `forward_tokens` does the
    same on channels-last (B, H, W, C_in) -> (B, H, W, C_out) without transposes (no stride).
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int | None = None,
        heads: int = 9,
        encoding: str = "quadratic",
        impl: str = "auto",
        value: str = "shared",
        head_dim: int | None = None,
        key_dim: int | None = None,
        pos_dim: int | None = None,
        max_size: int = 32,
        attn_dropout: float = 0.0,
        bias: bool = True,
        pos_init: str = "authors",
        attn_dropout_mask: str = "per-sample",
        stride: int = 1,
    ):
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        optional = {"head_dim": head_dim, "key_dim": key_dim, "pos_dim": pos_dim}  # None: the default below
        sizes = {"in_channels": in_channels, "out_channels": out_channels, "heads": heads, "max_size": max_size,
                 "stride": stride,
                 **{name: v for name, v in optional.items() if v is not None}}
        for name, v in sizes.items():  # numpy's integers taken, as Python ints
            _check_positive_int(name, v)
        in_channels, out_channels, heads, max_size, stride = (operator.index(sizes[k]) for k in (
            "in_channels", "out_channels", "heads", "max_size", "stride"))
        head_dim, key_dim, pos_dim = (None if v is None else operator.index(v) for v in (head_dim, key_dim, pos_dim))
        if encoding not in ENCODINGS:
            raise AttnconvError(f"unknown encoding {encoding!r}; choose one of: {', '.join(ENCODINGS)}")
        if value not in VALUE_MODES:
            raise AttnconvError(f"unknown value mode {value!r}; choose one of: {', '.join(VALUE_MODES)}")
        attn_dropout = real_number(attn_dropout, "attn_dropout", "SelfAttention2d's attention dropout rate", low=0,
                                   high=1, high_open=True)
        check_pos_init(pos_init)
        bias = flag_argument(bias, "bias")  # Python takes the string "no" for true
        if attn_dropout_mask not in DROPOUT_MASKS:
            raise AttnconvError(
                f"unknown attn_dropout_mask {attn_dropout_mask!r}; choose one of: {', '.join(DROPOUT_MASKS)}"
            )
        if attn_dropout_mask == "shared" and encoding == "learned-content":
            raise AttnconvError(
                "attn_dropout_mask='shared' is for position-only encodings (content probabilities differ "
                "per sample); use attn_dropout_mask='per-sample'"
            )
        self.in_channels, self.out_channels, self.heads, self.max_size = in_channels, out_channels, heads, max_size
        self.encoding_name, self.value_mode, self.attn_dropout = encoding, value, float(attn_dropout)
        self.attn_dropout_mask = attn_dropout_mask
        self.stride = stride
        self.key_dim = in_channels if key_dim is None else key_dim
        pos_dim = in_channels if pos_dim is None else pos_dim
        if value != "project" and head_dim is not None:
            raise AttnconvError("head_dim applies to value='project' only (shared values have width in_channels)")
        if value != "project":
            self.head_dim = in_channels  # shared values: the input's width
        else:
            self.head_dim = math.ceil(out_channels / heads) if head_dim is None else head_dim
        asked = ", ".join(f"{k}={v}" for k, v in sizes.items())
        with AllocationLimit(parameter_limit(), f"SelfAttention2d({asked}, encoding={encoding!r})",
                             "give fewer channels or heads, or a smaller max_size or pos_dim"):  # before it is allocated
            self.encoding = build_encoding(
                encoding, heads, pos_dim=pos_dim, key_dim=self.key_dim, max_size=max_size, init=pos_init
            )
            if not self.position_only:
                self.query = nn.Linear(in_channels, heads * self.key_dim)
                self.key = nn.Linear(in_channels, heads * self.key_dim)
            if value == "project":
                self.value = nn.Linear(in_channels, heads * self.head_dim)
            self.out = nn.Linear(heads * self.head_dim, out_channels, bias=bias)
        self.impl = impl  # validated by the setter below

    # ----------------------------------------------------------------- config
    @property
    def position_only(self) -> bool:
        return self.encoding_name != "learned-content"

    @property
    def separable(self) -> bool:
        return bool(getattr(self.encoding, "separable", False))

    @property
    def impl(self) -> str:
        return self._impl

    @impl.setter
    def impl(self, impl: str) -> None:
        if impl not in IMPLS:
            raise AttnconvError(f"unknown impl {impl!r}; choose one of: {', '.join(IMPLS)}")
        taken = ["auto", "dense", *(["separable"] if self.separable else []), *(["stacked"] if self.stackable else []),
                 *(["fused"] if self.separable and self.stackable else []), "sdpa"]
        use = f"use one of impl={', '.join(repr(i) for i in taken)}"  # only what this layer takes
        if impl == "separable" and not self.separable:
            raise AttnconvError(
                f"impl='separable' needs a separable encoding (quadratic, quadratic-diag, learned); "
                f"{self.encoding_name!r} is not: {use}"
            )
        if impl == "stacked" and not self.stackable:
            raise AttnconvError(
                f"impl='stacked' needs value='shared' (per-head values would have to be copied per head); {use}"
            )
        if impl == "fused" and not (self.separable and self.stackable):
            raise AttnconvError(
                f"impl='fused' needs a separable encoding (quadratic, quadratic-diag, learned) and value='shared'; "
                f"this layer has encoding={self.encoding_name!r}, value={self.value_mode!r}: {use}"
            )
        self._impl = str(impl)  # numpy.str_ taken as its str

    @property
    def stackable(self) -> bool:
        """Whether the stacked path applies: shared values."""
        return self.value_mode == "shared"

    def resolved_impl(self, size: tuple[int, int] | None = None) -> str:
        """The path `impl='auto'` takes for this layer on an H x W grid (default: max_size x max_size).

        The rule is `attnconv.attention.select.resolve_impl`.
        """
        size = positive_ints(size, 2, "size", "the input grid (H, W)") if size is not None else \
            (self.max_size, self.max_size)
        return self._resolve(size)

    def _resolve(self, size: tuple[int, int], shared_dropout: bool = False, per_sample_dropout: bool = False) -> str:
        return choose_impl(
            self._impl, size, shared_values=self.stackable, position_only=self.position_only,
            separable=self.separable, on_cpu=self.out.weight.device.type == "cpu", shared_dropout=shared_dropout,
            per_sample_dropout=per_sample_dropout,
        )

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, encoding={self.encoding_name!r}, "
            f"value={self.value_mode!r}, impl={self._impl!r}, attn_dropout={self.attn_dropout}"
            + (f", attn_dropout_mask={self.attn_dropout_mask!r}" if self.attn_dropout_mask != "per-sample" else "")
            + (f", stride={self.stride}" if self.stride != 1 else "")
        )

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H', W') (H' = ceil(H / stride)); an unbatched (C_in, H, W) gives
        (C_out, H', W'), as nn.Conv2d does.

        A channels-last tensor seen through `.permute(0, 3, 1, 2)` goes in and comes out without a
        copy: blocks that keep (B, H, W, C) call the layer this way, as a module.
        """
        self._check_input(x, unbatched=True)  # once, in the words of the input as given
        unbatched = x.ndim == 3  # as a convolution takes it: run as a batch of one
        y = self._tokens((x[None] if unbatched else x).permute(0, 2, 3, 1))  # (B, H, W, C_out)
        if self.stride != 1:
            y = y[:, :: self.stride, :: self.stride]  # the strided queries, as a strided conv keeps them
        y = y.permute(0, 3, 1, 2)
        return y[0].contiguous() if unbatched else y  # contiguous, as the convolution's unbatched output

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """The output's (H, W) for an input of (H, W): ceil(side / stride)."""
        return tuple(-(-n // self.stride) for n in positive_ints(size, 2, "size", "the input grid (H, W)"))

    def query_positions(self, size: tuple[int, int]) -> Tensor:
        """(T_out, 2) int64: the input-grid position of each output pixel's query, row-major."""
        size = positive_ints(size, 2, "size", "the input grid (H, W)")
        rows = torch.arange(0, size[0], self.stride)
        cols = torch.arange(0, size[1], self.stride)
        return torch.cartesian_prod(rows, cols)

    def _check_input(self, x: Tensor, values: bool = False, tokens: bool = False, unbatched: bool = False) -> None:
        """One AttnconvError unless x is an input this layer computes with: a floating-point tensor on its weights'
        device (`limits.tensor_argument`; `values`: not on the meta device either) of shape (B, C_in, H, W), or
        channels-last (B, H, W, C_in) for the `tokens` methods (`unbatched`: `forward`, which takes (C_in, H, W) too,
        given as a batch of one)."""
        shape = f"(B, H, W, {self.in_channels})" if tokens else f"(B, {self.in_channels}, H, W)" + (
            f" or unbatched ({self.in_channels}, H, W)" if unbatched else "")
        tensor_argument(x, "x", f"the input {shape}", like=self.out.weight, values=values)
        one = unbatched and x.ndim == 3  # an unbatched image's channels come first
        if (x.ndim != 4 and not one) or x.shape[-1 if tokens else 0 if one else 1] != self.in_channels:
            raise AttnconvError(f"SelfAttention2d expects input {shape}, got {tuple(x.shape)}")

    def forward_tokens(self, x: Tensor) -> Tensor:
        """Channels-last, every query: (B, H, W, C_in) -> (B, H, W, C_out). `forward` without the stride
        and the transposes; the output projection `out` runs as a module but on the fused path."""
        self._check_input(x, tokens=True)
        return self._tokens(x)

    def _tokens(self, x: Tensor) -> Tensor:
        """`forward_tokens` of an input already checked (`forward` checks it as (B, C_in, H, W), once)."""
        impl = self._path(x)
        if impl == "fused":
            return self._fused(x, self.out.weight, self.out.bias)
        return self.out(self._heads_output(impl, x))

    def forward_projected(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """`forward_tokens` with the output projection's weight (C, heads * D) and bias in place of `out`'s.

        For a block that folds the Linear after the layer into the projection (W_next W_out, one
        matmul per token instead of two); the fused path takes them between its factors.
        """
        self._check_input(x, tokens=True)
        width = self.out.in_features
        tensor_argument(weight, "weight", f"the output projection's weight (C, {width})", like=self.out.weight)
        if weight.dim() != 2 or weight.shape[1] != width:
            raise AttnconvError(f"weight of shape {tuple(weight.shape)} does not fit: give the output projection's "
                                f"weight (C, {width}), {width} the heads' concatenated values")
        if bias is not None:
            tensor_argument(bias, "bias", f"the output projection's bias ({weight.shape[0]},) or None",
                            like=self.out.weight)
            if tuple(bias.shape) != (weight.shape[0],):
                raise AttnconvError(f"bias of shape {tuple(bias.shape)} does not fit: give the output projection's "
                                    f"bias ({weight.shape[0]},), one per row of weight, or None")
        impl = self._path(x)
        if impl == "fused":
            return self._fused(x, weight, bias)
        return F.linear(self._heads_output(impl, x), weight, bias)

    def folded_linears(self, x: Tensor) -> list[tuple[nn.Linear, int]]:
        """The Linear children a forward on x (B, C_in, H, W) applies without calling them, with the tokens
        each maps: `out` on the fused path, whose products apply it between the factors (its forward hooks
        do not fire there). `attnconv.flops.count_flops` counts them."""
        self._check_input(x)
        if self._path(x.permute(0, 2, 3, 1)) != "fused":
            return []
        return [(self.out, x.shape[0] * x.shape[2] * x.shape[3])]

    def _path(self, x: Tensor) -> str:
        """The impl a forward on channels-last x (B, H, W, C_in) runs (`select.resolve_impl`)."""
        dropout = self.training and self.attn_dropout > 0
        return self._resolve(tuple(x.shape[1:3]), dropout and self.attn_dropout_mask == "shared",
                             dropout and self._per_sample())

    def _heads_output(self, impl: str, x: Tensor) -> Tensor:
        """Every head's attention-weighted values (B, H, W, heads * D), by the backend `impl` (not fused)."""
        B, H, W, _ = x.shape
        if impl != "separable" and not torch.compiler.is_compiling():  # token-by-token scores and probabilities:
            # refused before they are allocated where no machine holds them: scores, probabilities and one more of
            # their size at once (sdpa, and the stacked path's dropout beside its transposed copy: two), in at least
            # float32; one matrix for the batch where the stacked path shares its position-only probabilities,
            # unless a dropout mask per image copies them per image
            dropout = bool(self._dropout_p())
            shared = impl == "stacked" and self.position_only and not (dropout and self._per_sample())
            images = 1 if shared else B
            work = torch.promote_types(self.out.weight.dtype, torch.float32).itemsize
            matrices = 4 if impl == "sdpa" or (impl == "stacked" and dropout) else 3
            check_memory(matrices * work * images * self.heads * float(H * W) ** 2,
                         f"the attention of {H}x{W} tokens (impl {impl!r}: {images} x {self.heads} matrices of image x "
                         "head)",
                         "give a smaller input (or fewer images)" + (", or impl='separable'" if self.separable else ""))
        p, per_sample = self._dropout_p(), self._per_sample()
        if impl == "dense":
            v = self._values(x)  # before the probabilities: x's gradient terms sum in a fixed order
            out = ops.dense(self._probs(x, H, W), v, p, per_sample)
        elif impl == "separable":
            v = self._values(x)
            row, col = self._factor_probs(H, W)
            out = ops.separable(row, col, v, p, per_sample)
        elif impl == "stacked":
            # position-only: one (heads, T, T) matrix for the batch; content: (B, heads, T, T)
            probs = self._position_probs(H, W) if self.position_only else self._probs(x, H, W)
            out = ops.stacked(probs, x, p, per_sample)
        elif impl == "sdpa":
            out = self._sdpa(x, H, W)
        else:
            raise AssertionError(impl)
        return out.reshape(B, H, W, self.heads * self.head_dim)

    def _fused(self, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        row, col = self._factor_probs(*x.shape[1:3])
        return ops.fused(row, col, x, weight, bias, self._dropout_p())

    def _sdpa(self, x: Tensor, H: int, W: int) -> Tensor:
        v = ops.heads_first(self._values(x), self.heads)  # before q, k: x's gradient terms sum in a fixed order
        if self.position_only:
            return ops.sdpa(v, self._position_logits(H, W)[None], dropout_p=self._dropout_p())
        q, k = self._queries_keys(x)
        with float32_scores():
            bias = self.encoding.position_logits(at_least_float32(q), H, W)
        return ops.sdpa(v, bias, q, k, dropout_p=self._dropout_p())

    def _values(self, x: Tensor) -> Tensor:
        """(B, H, W, C_in) for shared values, else (B, H, W, heads, D)."""
        if self.value_mode == "shared":
            return x
        B, H, W, _ = x.shape
        return self.value(x).view(B, H, W, self.heads, self.head_dim)

    def _dropout_p(self) -> float:
        return self.attn_dropout if self.training else 0.0

    def _per_sample(self) -> bool:
        return self.attn_dropout_mask == "per-sample"

    # ------------------------------------------------------- scores and probabilities
    def _factor_probs(self, H: int, W: int) -> tuple[Tensor, Tensor]:
        """A separable encoding's row and column softmaxes (heads, H, H), (heads, W, W), in at least float32."""
        with float32_scores():
            row, col = ops.factor_softmax(self.encoding.factors(H, W))
            return row, col

    def _position_probs(self, H: int, W: int) -> Tensor:
        """Position-only probabilities (heads, T, T) in at least float32; separable encodings as the
        Kronecker product of their row and column softmaxes (exact)."""
        if not self.separable:
            with float32_scores():
                return self._position_logits(H, W).softmax(-1)
        return ops.kronecker_probs(*self._factor_probs(H, W))

    def _queries_keys(self, x: Tensor) -> tuple[Tensor, Tensor]:
        B, H, W, _ = x.shape
        q = self.query(x).view(B, H * W, self.heads, self.key_dim).transpose(1, 2)  # (B, heads, T, D_k)
        k = self.key(x).view(B, H * W, self.heads, self.key_dim).transpose(1, 2)
        return q, k

    def _position_logits(self, H: int, W: int) -> Tensor:
        with float32_scores():
            return self.encoding.logits(H, W)  # (heads, T, T), the parameters' dtype

    def _scores(self, x: Tensor | None, H: int, W: int) -> dict[str, Tensor]:
        """Score terms, float32: 'position' and, for content layers, 'content' and their sum 'combined'."""
        if self.position_only:
            pos = self._position_logits(H, W)[None]  # (1, heads, T, T)
            return {"position": pos, "combined": pos}
        if x is None:
            raise AttnconvError("a content-attention layer needs the input x to compute its attention")
        q, k = self._queries_keys(x)  # projections run under autocast (bf16 on GPU), the scores do not
        with float32_scores():
            q, k = at_least_float32(q), at_least_float32(k)
            content = ops.content_scores(q, k)  # (B, heads, T, T)
            pos = self.encoding.position_logits(q, H, W)
        return {"content": content, "position": pos, "combined": content + pos}

    def _probs(self, x: Tensor, H: int, W: int) -> Tensor:
        """Softmax of the combined scores, (1 or B, heads, T, T) in at least float32."""
        scores = self._scores(x if not self.position_only else None, H, W)["combined"]
        with float32_scores():
            return scores.softmax(-1)

    # --------------------------------------------------------------- analysis
    def attention_scores(self, x: Tensor | None = None, size: tuple[int, int] | None = None) -> dict[str, Tensor]:
        """Pre-softmax score terms (Eq. 6) as (B or 1, heads, T_out, T) float32 tensors (T_out = T unless strided).

        Keys: "combined" always; "position" always; "content" for content layers.
        x is (B, C_in, H, W), or one unbatched (C_in, H, W) as `forward` takes it (its scores as a batch of one);
        position-only layers accept `size=(H, W)` instead.
        """
        if x is not None:
            self._check_input(x, unbatched=True)  # once, in the words of the input as given
            x = x[None] if x.ndim == 3 else x
        x_tokens, H, W = self._analysis_input(x, size)
        # (B, heads, T, T) float32 per term, and as much again for the softmax: refused before any is allocated
        check_memory(16 * (1 if x is None else len(x)) * self.heads * float(H * W) ** 2,
                     f"the attention of {H}x{W} tokens", "give a smaller size (or fewer images)")
        scores = self._scores(x_tokens, H, W)
        if self.stride != 1:  # the strided queries' rows only: (B or 1, heads, T_out, T)
            rows = self.query_positions((H, W))
            keep = rows[:, 0] * W + rows[:, 1]
            scores = {k: v[:, :, keep] for k, v in scores.items()}
        return scores

    def attention_probs(self, x: Tensor | None = None, size: tuple[int, int] | None = None,
                        term: str = "combined") -> Tensor:
        """Softmax probabilities (B or 1, heads, T, T), T = H*W, rows = queries (row-major pixels); x as
        `attention_scores` takes it.

        term: "combined" (the layer's attention), or "position" / "content" (the softmax of that
        score term alone, Eq. 6; content layers have both).
        """
        scores = self.attention_scores(x, size)
        if term not in scores:
            raise AttnconvError(f"unknown score term {term!r}; this layer has: {', '.join(scores)}")
        return scores[term].softmax(-1)

    def _analysis_input(self, x: Tensor | None, size) -> tuple[Tensor | None, int, int]:
        """x (B, C_in, H, W) already checked, or None and `size`: the tokens (or None) and the grid."""
        weights_with_values(self.out.weight)  # an analysis computes with them
        if x is not None:
            return x.permute(0, 2, 3, 1), x.shape[2], x.shape[3]
        if size is None:
            raise AttnconvError("give the input x, or size=(H, W) for a position-only layer")
        if not self.position_only:
            raise AttnconvError("a content-attention layer needs the input x to compute its attention")
        H, W = positive_ints(size, 2, "size", "the input grid (H, W)")
        return None, H, W

    def value_maps(self) -> tuple[Tensor, Tensor]:
        """Per-head linear maps (heads, C_out, C_in) and bias (C_out,) (Lemma 1: W_val^h W_out^h).

        For a position-only layer: y_q = sum_h sum_k P_h[q, k] maps[h] @ x_k + bias.
        """
        w_out = self.out.weight.view(self.out_channels, self.heads, self.head_dim)  # (C_out, heads, D)
        bias = self.out.bias if self.out.bias is not None else w_out.new_zeros(self.out_channels)
        if self.value_mode == "shared":
            return w_out.permute(1, 0, 2), bias
        w_val = self.value.weight.view(self.heads, self.head_dim, self.in_channels)  # (heads, D, C_in)
        maps = torch.einsum("ohd,hdc->hoc", w_out, w_val)
        b_val = self.value.bias.view(self.heads, self.head_dim)
        # attention rows sum to one, so the value bias passes through unchanged
        return maps, bias + torch.einsum("ohd,hd->o", w_out, b_val)


def _check_positive_int(name: str, v: object) -> None:
    if not is_whole(v, 1, MAX_SIDE):
        raise AttnconvError(f"SelfAttention2d: {name} must be a positive integer of at most {MAX_SIDE}, got "
                            f"{shown_value(v)}")
