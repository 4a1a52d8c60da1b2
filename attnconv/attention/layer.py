"""SelfAttention2d: multi-head self-attention over pixels, a drop-in for nn.Conv2d.

The layer holds the parameters and the argument checks; the computation paths are functions in
`paths`, and `select.resolve_impl` picks the one a forward runs.

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

from attnconv.attention import paths
from attnconv.attention.autocast import float32_scores
from attnconv.attention.select import IMPLS, resolve_impl
from attnconv.errors import AttnconvError
from attnconv.positional import ENCODINGS, at_least_float32, build_encoding, check_pos_init

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
        impl: "auto", "dense", "separable", "stacked", "fused" or "sdpa" (see `attnconv.attention.paths`;
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
    same on channels-last (B, H, W, C_in) -> (B, H, W, C_out) without transposes.
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
        for name, v in sizes.items():
            _check_positive_int(name, v)
        if encoding not in ENCODINGS:
            raise AttnconvError(f"unknown encoding {encoding!r}; choose one of: {', '.join(ENCODINGS)}")
        if value not in VALUE_MODES:
            raise AttnconvError(f"unknown value mode {value!r}; choose one of: {', '.join(VALUE_MODES)}")
        if isinstance(attn_dropout, bool) or not isinstance(attn_dropout, (int, float)) or not 0.0 <= attn_dropout < 1.0:
            raise AttnconvError(f"SelfAttention2d: attn_dropout must be a number in [0, 1), got {attn_dropout!r}")
        check_pos_init(pos_init)
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
        self.encoding = build_encoding(
            encoding, heads, pos_dim=pos_dim, key_dim=self.key_dim, max_size=max_size, init=pos_init
        )
        if not self.position_only:
            self.query = nn.Linear(in_channels, heads * self.key_dim)
            self.key = nn.Linear(in_channels, heads * self.key_dim)
        if value == "project":
            self.head_dim = math.ceil(out_channels / heads) if head_dim is None else head_dim
            self.value = nn.Linear(in_channels, heads * self.head_dim)
        else:
            if head_dim is not None:
                raise AttnconvError("head_dim applies to value='project' only (shared values have width in_channels)")
            self.head_dim = in_channels
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
        if impl == "separable" and not self.separable:
            raise AttnconvError(
                f"impl='separable' needs a separable encoding (quadratic, quadratic-diag, learned); "
                f"{self.encoding_name!r} is not: use impl='dense' or 'sdpa'"
            )
        if impl == "stacked" and not self.stackable:
            raise AttnconvError(
                "impl='stacked' needs value='shared' (per-head values would have to be copied per head); "
                "use impl='dense'"
            )
        if impl == "fused" and not (self.separable and self.stackable):
            raise AttnconvError(
                f"impl='fused' needs a separable encoding (quadratic, quadratic-diag, learned) and value='shared'; "
                f"this layer has encoding={self.encoding_name!r}, value={self.value_mode!r}: use impl='separable' "
                f"or 'dense'"
            )
        self._impl = impl

    @property
    def stackable(self) -> bool:
        """Whether the stacked path applies: shared values."""
        return self.value_mode == "shared"

    def resolved_impl(self, size: tuple[int, int] | None = None) -> str:
        """The path `impl='auto'` takes for this layer on an H x W grid (default: max_size x max_size).

        The rule is `attnconv.attention.select.resolve_impl`.
        """
        return self._resolve(size if size is not None else (self.max_size, self.max_size))

    def _resolve(self, size: tuple[int, int], shared_dropout: bool = False, per_sample_dropout: bool = False) -> str:
        return resolve_impl(
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
    def forward(self, x: Tensor, then: nn.Linear | None = None) -> Tensor:
        """(B, C_in, H, W) -> (B, C_out, H, W), or then(...) of it (see `forward_tokens`).

        A channels-last tensor seen through `.permute(0, 3, 1, 2)` goes in and comes out without a
        copy: blocks that keep (B, H, W, C) call the layer this way, so its hooks fire.
        """
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise AttnconvError(
                f"SelfAttention2d expects input (B, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        y = self.forward_tokens(x.permute(0, 2, 3, 1), then)  # (B, H, W, C_out)
        if self.stride != 1:
            y = y[:, :: self.stride, :: self.stride]  # the strided queries, as a strided conv keeps them
        return y.permute(0, 3, 1, 2)

    def output_size(self, size: tuple[int, int]) -> tuple[int, int]:
        """The output's (H, W) for an input of (H, W): ceil(side / stride)."""
        return tuple(-(-int(n) // self.stride) for n in size)

    def query_positions(self, size: tuple[int, int]) -> Tensor:
        """(T_out, 2) int64: the input-grid position of each output pixel's query, row-major."""
        rows = torch.arange(0, size[0], self.stride)
        cols = torch.arange(0, size[1], self.stride)
        return torch.cartesian_prod(rows, cols)

    def forward_tokens(self, x: Tensor, then: nn.Linear | None = None) -> Tensor:
        """Channels-last forward: (B, H, W, C_in) -> (B, H, W, C_out), or then(...) of it.

        `then`, a Linear on the output (the classifier's `attention_out`), is folded into the
        output projection where that saves work: y = a W_out^T W_then^T + (b_out W_then^T + b_then)
        costs one (heads * D -> C_then) matmul per token instead of two, plus a weight product
        per forward. Folded when gradients are being recorded and there are more tokens than
        heads * D (the product's cost); otherwise `out` and `then` run as modules, so their
        forward hooks (FLOP counters) see them.
        """
        B, H, W, _ = x.shape
        dropout = self.training and self.attn_dropout > 0
        impl = self._resolve((H, W), dropout and self.attn_dropout_mask == "shared", dropout and self._per_sample())
        fold = then is not None and torch.is_grad_enabled() and B * H * W > self.out.in_features
        if impl == "fused" and _observed(self.out) and not fold:
            impl = "separable"  # hooks on `out` (FLOP counters) see it run as a module
        if impl == "fused":
            weight, bias = self._projection(then if fold else None)
            y = self._fused(x, H, W, weight, bias)
            return y if then is None or fold else then(y)
        run = getattr(self, f"_{impl}")  # the path's adapter below: the layer's tensors into `paths.<impl>`
        heads_out = run(x, H, W).reshape(B, H, W, self.heads * self.head_dim)
        if then is None:
            return self.out(heads_out)  # (B, H, W, C_out)
        if fold:
            return F.linear(heads_out, *self._projection(then))
        return then(self.out(heads_out))

    def _projection(self, then: nn.Linear | None) -> tuple[Tensor, Tensor | None]:
        """The output projection's (weight, bias), with `then` folded in when given."""
        if then is None:
            return self.out.weight, self.out.bias
        weight = then.weight @ self.out.weight  # (C_then, heads * D)
        bias = None if self.out.bias is None else then.weight @ self.out.bias
        if then.bias is not None:
            bias = then.bias if bias is None else bias + then.bias
        return weight, bias

    # Path adapters: x (B, H, W, C_in) -> the path's output, (B, T, heads, D) or a layout that
    # reshapes to (B, H, W, heads * D) without a copy.
    def _dense(self, x: Tensor, H: int, W: int) -> Tensor:
        v = self._values(x)
        return paths.dense(self._probs(x, H, W), v, self._dropout_p(), self._per_sample())

    def _separable(self, x: Tensor, H: int, W: int) -> Tensor:
        v = self._values(x)
        row, col = self._factor_probs(H, W)
        return paths.separable(row, col, v, self._dropout_p(), self._per_sample())

    def _fused(self, x: Tensor, H: int, W: int, weight: Tensor, bias: Tensor | None) -> Tensor:
        row, col = self._factor_probs(H, W)
        return paths.fused(row, col, x, weight, bias, self._dropout_p())

    def _stacked(self, x: Tensor, H: int, W: int) -> Tensor:
        if self.position_only:
            probs = self._position_probs(H, W)  # (heads, T, T), one matrix for the batch
        else:
            probs = self._probs(x, H, W)  # (B, heads, T, T)
        return paths.stacked(probs, x, self._dropout_p(), self._per_sample())

    def _sdpa(self, x: Tensor, H: int, W: int) -> Tensor:
        v = paths.heads_first(self._values(x), self.heads)  # before q, k: x's gradient terms sum in a fixed order
        if self.position_only:
            return paths.sdpa(v, self._position_logits(H, W)[None], dropout_p=self._dropout_p())
        q, k = self._queries_keys(x)
        with float32_scores():
            bias = self.encoding.position_logits(at_least_float32(q), H, W)
        return paths.sdpa(v, bias, q, k, dropout_p=self._dropout_p())

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
            row, col = self.encoding.factors(H, W)
            return row.softmax(-1), col.softmax(-1)

    def _position_probs(self, H: int, W: int) -> Tensor:
        """Position-only probabilities (heads, T, T) in at least float32; separable encodings as the
        Kronecker product of their row and column softmaxes (exact)."""
        if not self.separable:
            with float32_scores():
                return self._position_logits(H, W).softmax(-1)
        return paths.kronecker_probs(*self._factor_probs(H, W))

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
            content = q @ k.transpose(-1, -2) / math.sqrt(self.key_dim)  # (B, heads, T, T)
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
        x is (B, C_in, H, W); position-only layers accept `size=(H, W)` instead.
        """
        x_tokens, H, W = self._analysis_input(x, size)
        scores = self._scores(x_tokens, H, W)
        if self.stride != 1:  # the strided queries' rows only: (B or 1, heads, T_out, T)
            rows = self.query_positions((H, W))
            keep = rows[:, 0] * W + rows[:, 1]
            scores = {k: v[:, :, keep] for k, v in scores.items()}
        return scores

    def attention_probs(self, x: Tensor | None = None, size: tuple[int, int] | None = None,
                        term: str = "combined") -> Tensor:
        """Softmax probabilities (B or 1, heads, T, T), T = H*W, rows = queries (row-major pixels).

        term: "combined" (the layer's attention), or "position" / "content" (the softmax of that
        score term alone, Eq. 6; content layers have both).
        """
        scores = self.attention_scores(x, size)
        if term not in scores:
            raise AttnconvError(f"unknown score term {term!r}; this layer has: {', '.join(scores)}")
        return scores[term].softmax(-1)

    def _analysis_input(self, x: Tensor | None, size) -> tuple[Tensor | None, int, int]:
        if x is not None:
            if x.ndim != 4 or x.shape[1] != self.in_channels:
                raise AttnconvError(f"expected x of shape (B, {self.in_channels}, H, W), got {tuple(x.shape)}")
            return x.permute(0, 2, 3, 1), x.shape[2], x.shape[3]
        if size is None:
            raise AttnconvError("give the input x, or size=(H, W) for a position-only layer")
        if not self.position_only:
            raise AttnconvError("a content-attention layer needs the input x to compute its attention")
        try:
            H, W = (operator.index(n) for n in size) if not any(isinstance(n, bool) for n in size) else (0, 0)
        except (TypeError, ValueError):  # not a pair of integers
            H = W = 0
        if H < 1 or W < 1:
            raise AttnconvError(f"size must be (H, W), two positive integers, got {size!r}")
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


def _observed(module: nn.Module) -> bool:
    """Whether forward hooks watch `module` (its own or global ones): then it must run as a module."""
    return bool(module._forward_hooks or module._forward_pre_hooks or nn.modules.module._global_forward_hooks
                or nn.modules.module._global_forward_pre_hooks)


def _check_positive_int(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise AttnconvError(f"SelfAttention2d: {name} must be a positive integer, got {v!r}")
