"""SelfAttention2d: multi-head self-attention over pixels, a drop-in for nn.Conv2d.

Eq. (1)-(3), (7) of the paper, with tokens = pixels (T = H*W):

    SA_h(X)_q = sum_k softmax(A^h_{q,:})_k  X_k W_val^h
    MHSA(X)   = concat_h SA_h(X) W_out + b_out

Value modes:
  - "shared" (the paper's models): W_val^h = I, every head averages the whole
    input, and one Linear(heads * C_in -> C_out) mixes the heads.
  - "project": a per-head value projection Linear(C_in -> heads * head_dim), then
    Linear(heads * head_dim -> C_out).

Implementations (`impl`), all computing the same function:
  - "dense": the plain formulation, softmax over a (T x T) score matrix per head
    (the baseline every fast path is measured against).
  - "separable": for encodings whose score is a row term plus a column term, the
    probabilities factor as P_h = P_h^row (x) P_h^col and are applied as two
    small matmuls, O(B h H W (H + W) D) instead of O(B h (HW)^2 D); the T x T
    matrix is never formed.
  - "stacked" (shared values): the heads' (T x T) probabilities laid out as one
    (T * heads, T) matrix, rows (query, head), applied by one batched matmul per image.
    Its output (B, T, heads, C) is already the layout the output projection reads, so
    neither values nor outputs are copied per head; position-only probabilities are one
    matrix for the whole batch. It costs the dense FLOPs, O(B h T^2 C), in large matmuls.
  - "sdpa": torch.nn.functional.scaled_dot_product_attention with the positional
    term as a float bias (content attention's natural fast path).
  - "auto": with shared values, stacked for position-only layers on small grids
    (T <= STACKED_RATIO * (H + W), up to 8x8) or with a non-separable encoding, and for
    content layers on the CPU; otherwise separable when the encoding allows it, sdpa for
    content attention, dense otherwise. The crossovers were measured on a CPU
    (benchmarks/RESULTS.md, "Speed on the CPU").

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
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from attnconv.errors import AttnconvError
from attnconv.positional import ENCODINGS, at_least_float32, build_encoding, check_pos_init

IMPLS = ("auto", "dense", "separable", "stacked", "sdpa")
# auto: the stacked path up to T = H * W <= STACKED_RATIO * (H + W) tokens (its FLOPs over the
# separable path's are T / (H + W)); above, the separable path's fewer FLOPs win.
STACKED_RATIO = 4
VALUE_MODES = ("shared", "project")
DROPOUT_MASKS = ("per-sample", "shared")


class SelfAttention2d(nn.Module):
    """Multi-head self-attention on images with relative positional encodings.

    Args:
        in_channels: C_in.
        out_channels: C_out (default: C_in).
        heads: number of heads N_h.
        encoding: "quadratic" (isotropic Gaussian, learnable centers and widths),
            "quadratic-diag" (axis-aligned), "quadratic-aniso" (full 2x2 inverse
            covariance), "learned" (row/column tables, no content), or
            "learned-content" (q.k plus q.r).
        impl: "auto", "dense", "separable", "stacked" or "sdpa" (see the module docstring).
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
    ):
        super().__init__()
        out_channels = in_channels if out_channels is None else out_channels
        optional = {"head_dim": head_dim, "key_dim": key_dim, "pos_dim": pos_dim}  # None: the default below
        sizes = {"in_channels": in_channels, "out_channels": out_channels, "heads": heads, "max_size": max_size,
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
        self._impl = impl

    @property
    def stackable(self) -> bool:
        """Whether the stacked path applies: shared values."""
        return self.value_mode == "shared"

    def resolved_impl(self, size: tuple[int, int] | None = None) -> str:
        """The path `impl='auto'` takes for this layer on an H x W grid (default: max_size x max_size).

        With shared values: stacked where it is the cheaper path (measured on the CPU,
        benchmarks/RESULTS.md "Speed on the CPU"): position-only layers whose encoding is not
        separable, or on grids of at most STACKED_RATIO * (H + W) tokens; content layers on the
        CPU (where SDPA with a positional bias runs its math kernel, which copies the shared
        values once per head). Otherwise separable, sdpa for content, dense.
        """
        if self._impl != "auto":
            return self._impl
        H, W = size if size is not None else (self.max_size, self.max_size)
        if self.stackable:
            if self.position_only and (not self.separable or H * W <= STACKED_RATIO * (H + W)):
                return "stacked"
            if not self.position_only and self.out.weight.device.type == "cpu":
                return "stacked"
        if not self.position_only:
            return "sdpa"
        return "separable" if self.separable else "dense"

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, heads={self.heads}, encoding={self.encoding_name!r}, "
            f"value={self.value_mode!r}, impl={self._impl!r}, attn_dropout={self.attn_dropout}"
            + (f", attn_dropout_mask={self.attn_dropout_mask!r}" if self.attn_dropout_mask != "per-sample" else "")
        )

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor) -> Tensor:
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise AttnconvError(
                f"SelfAttention2d expects input (B, {self.in_channels}, H, W), got {tuple(x.shape)}"
            )
        y = self.forward_tokens(x.permute(0, 2, 3, 1))  # (B, H, W, C_out)
        return y.permute(0, 3, 1, 2)

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
        impl = self.resolved_impl((H, W))
        if impl == "stacked":
            heads_out = self._stacked(x, H, W).view(B, H, W, self.heads * self.in_channels)  # rows (q, h)
        else:
            v = self._values(x)  # (B, H, W, C_in) shared, or (B, H, W, heads, D)
            if impl == "separable":
                out = self._separable(v, H, W)
            elif impl == "dense":
                out = self._dense(x, v, H, W)
            else:
                out = self._sdpa(x, v, H, W)
            heads_out = out.reshape(B, H, W, self.heads * self.head_dim)
        if then is None:
            return self.out(heads_out)  # (B, H, W, C_out)
        if torch.is_grad_enabled() and B * H * W > self.out.in_features:
            weight = then.weight @ self.out.weight  # (C_then, heads * D)
            bias = None if self.out.bias is None else then.weight @ self.out.bias
            if then.bias is not None:
                bias = then.bias if bias is None else bias + then.bias
            return F.linear(heads_out, weight, bias)
        return then(self.out(heads_out))

    def _values(self, x: Tensor) -> Tensor:
        if self.value_mode == "shared":
            return x
        B, H, W, _ = x.shape
        return self.value(x).view(B, H, W, self.heads, self.head_dim)

    def _drop(self, p: Tensor, rate: float) -> Tensor:
        return F.dropout(p, rate, training=True) if self.training and rate > 0 else p

    def _separable(self, v: Tensor, H: int, W: int) -> Tensor:
        """P_h = P_h^row (x) P_h^col applied as two matmuls: (B, H, W, heads, D) out."""
        with float32_scores():
            row, col = self.encoding.factors(H, W)  # (heads, H, H), (heads, W, W)
            row, col = row.softmax(-1), col.softmax(-1)
        dtype = _matmul_dtype(v)
        row, col = row.to(dtype), col.to(dtype)
        B = v.shape[0]
        if self.training and self.attn_dropout > 0:
            # Factorized dropout: each factor drops entries with rate r, 1 - (1 - r)^2 = p, so an
            # entry of P = P^row (x) P^col survives with probability 1 - p and keeps its expectation
            # as in the dense path (the masks of one row/column are correlated, unlike dense dropout).
            r = 1.0 - math.sqrt(1.0 - self.attn_dropout)
            if self.attn_dropout_mask == "per-sample":
                row, col = row.expand(B, -1, -1, -1), col.expand(B, -1, -1, -1)  # (B, heads, H, H), (B, heads, W, W)
            row, col = self._drop(row, r), self._drop(col, r)  # "shared": one mask per factor for the batch
        if self.value_mode == "shared":
            return self._apply_factors_shared(row, col, v.to(dtype))
        if row.ndim == 4:
            tmp = torch.einsum("bhjl,bilhd->bhijd", col, v)
            return torch.einsum("bhik,bhkjd->bijhd", row, tmp)
        tmp = torch.einsum("hjl,bilhd->hbijd", col, v)  # (heads, B, H, W, D): mix columns
        return torch.einsum("hik,hbkjd->bijhd", row, tmp)  # (B, H, W, heads, D): mix rows

    def _apply_factors_shared(self, row: Tensor, col: Tensor, x: Tensor) -> Tensor:
        """Shared values: factors row ([B,] heads, H, H), col ([B,] heads, W, W) on x (B, H, W, C) -> (B, H, W, heads, C).

        Rows first with the heads stacked into the matrix, (heads * H, H) @ (H, W * C) per image, which
        reads x in place and writes (B, heads, H, W, C); then every (image, head, row) is a (W, W) @ (W, C)
        product. One permute of the result remains (to the output projection's layout), where two
        einsums need three.
        """
        B, H, W, C = x.shape
        heads = self.heads
        rows = row.reshape(-1, heads * H, H).expand(B, -1, -1)  # batch-independent: a stride-0 broadcast
        tmp = torch.bmm(rows, x.reshape(B, H, W * C))  # (B, heads * H, W * C): (b, h, i, l, c)
        cols = col.reshape(-1, heads, 1, W, W).expand(B, heads, H, W, W).reshape(B * heads * H, W, W)
        out = torch.bmm(cols, tmp.view(B * heads * H, W, C))  # (b, h, i, j, c)
        return out.view(B, heads, H, W, C).permute(0, 2, 3, 1, 4)

    def _stacked(self, x: Tensor, H: int, W: int) -> Tensor:
        """Shared values: (B, H, W, C) -> (B, T * heads, C), row q * heads + h = SA_h(X)_q.

        The probabilities are laid out as a (T * heads, T) matrix per image, rows (q, h), so one
        batched matmul writes every head's output where the output projection reads it: no
        per-head copies of the values, no permutes of the outputs. Position-only probabilities
        are batch-independent: one matrix, broadcast over the batch (a stride-0 operand of bmm,
        not a copy); its backward sums the (T * heads, T) gradients over the batch. Content
        probabilities (B, heads, T, T) are transposed to (B, T, heads, T) once (T * heads * T
        numbers per image, against T * heads * C for expanded values).
        """
        B, T = x.shape[0], H * W
        dtype = _matmul_dtype(x)
        if self.position_only:
            with float32_scores():
                probs = self._position_probs(H, W)  # (heads, T, T)
            # cast before the batch expand: autocast would cast the expanded operand, i.e. copy it per sample
            stacked = probs.transpose(0, 1).reshape(T * self.heads, T).to(dtype)  # [(q, h), k] = P_h[q, k]
            if self.training and self.attn_dropout > 0 and self.attn_dropout_mask == "per-sample":
                stacked = stacked.expand(B, -1, -1)  # a mask per sample: the batch's copies are materialized
        else:
            probs = self._probs(x, H, W)  # (B, heads, T, T) float32
            stacked = probs.to(dtype).transpose(1, 2).reshape(B, T * self.heads, T)
        if self.training and self.attn_dropout > 0:
            stacked = self._drop(stacked, self.attn_dropout)
        if stacked.ndim == 2:
            stacked = stacked.expand(B, -1, -1)
        return torch.bmm(stacked, x.reshape(B, T, self.in_channels).to(dtype))

    def _position_probs(self, H: int, W: int) -> Tensor:
        """Position-only probabilities (heads, T, T) in at least float32; separable encodings as the
        outer product of their row and column softmaxes (exact: Kronecker product)."""
        if not self.separable:
            return self._position_logits(H, W).softmax(-1)
        row, col = self.encoding.factors(H, W)
        row, col = row.softmax(-1), col.softmax(-1)  # (heads, H, H), (heads, W, W)
        return (row[:, :, None, :, None] * col[:, None, :, None, :]).reshape(self.heads, H * W, H * W)

    def _dense(self, x: Tensor, v: Tensor, H: int, W: int) -> Tensor:
        """The plain formulation: (heads, T, T) probabilities times the values."""
        B, T = x.shape[0], H * W
        probs = self._probs(x, H, W).to(v.dtype)  # (1 or B, heads, T, T)
        if self.training and self.attn_dropout > 0:
            if self.attn_dropout_mask == "per-sample":
                probs = probs.expand(B, -1, -1, -1)
            probs = self._drop(probs, self.attn_dropout)  # (B, heads, T, T), or (1, ...) for a shared mask
        if self.value_mode == "shared":
            v = v.reshape(B, 1, T, self.in_channels)  # every head sees the same values
        else:
            v = v.reshape(B, T, self.heads, self.head_dim).transpose(1, 2)  # (B, heads, T, D)
        out = probs @ v  # (B, heads, T, D)
        return out.transpose(1, 2)

    def _sdpa(self, x: Tensor, v: Tensor, H: int, W: int) -> Tensor:
        B, T = x.shape[0], H * W
        if self.training and self.attn_dropout > 0 and self.attn_dropout_mask == "shared":
            return self._dense(x, v, H, W)  # SDPA draws a mask per sample; a shared one needs the probabilities
        if self.value_mode == "shared":
            v = v.reshape(B, 1, T, self.in_channels).expand(B, self.heads, T, self.in_channels)
        else:
            v = v.reshape(B, T, self.heads, self.head_dim).transpose(1, 2)
        dropout = self.attn_dropout if self.training else 0.0
        if self.position_only:
            # No content term: zero-width queries and keys would be rejected, so give SDPA a single
            # zero channel; q.k = 0 and the positional logits are the whole score.
            bias = self._position_logits(H, W).to(v.dtype)[None]  # (1, heads, T, T)
            zeros = v.new_zeros(B, self.heads, T, 1)
            out = F.scaled_dot_product_attention(zeros, zeros, v, attn_mask=bias, dropout_p=dropout)
        else:
            q, k = self._queries_keys(x)
            with float32_scores():
                bias = self.encoding.position_logits(at_least_float32(q), H, W)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.to(q.dtype), dropout_p=dropout)
        return out.transpose(1, 2)  # (B, T, heads, D)

    # --------------------------------------------------------------- analysis
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
        scores = self._scores(x if not self.position_only else None, H, W)["combined"]
        with float32_scores():
            return scores.softmax(-1)

    def attention_scores(self, x: Tensor | None = None, size: tuple[int, int] | None = None) -> dict[str, Tensor]:
        """Pre-softmax score terms (Eq. 6) as (B or 1, heads, T, T) float32 tensors.

        Keys: "combined" always; "position" always; "content" for content layers.
        x is (B, C_in, H, W); position-only layers accept `size=(H, W)` instead.
        """
        x_tokens, H, W = self._analysis_input(x, size)
        return self._scores(x_tokens, H, W)

    def attention_probs(self, x: Tensor | None = None, size: tuple[int, int] | None = None) -> Tensor:
        """Softmax probabilities (B or 1, heads, T, T), T = H*W, rows = queries (row-major pixels)."""
        return self.attention_scores(x, size)["combined"].softmax(-1)

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


@contextmanager
def float32_scores() -> Iterator[None]:
    """Disable autocast so scores and softmax stay in float32 (fp16 softmax overflows to NaN).

    Plain nested `with torch.autocast(...)` blocks (no ExitStack), which torch.compile traces
    without a graph break.
    """
    with torch.autocast("cpu", enabled=False):
        if torch.cuda.is_available():
            with torch.autocast("cuda", enabled=False):
                yield
        else:
            yield


def _matmul_dtype(x: Tensor) -> torch.dtype:
    """The dtype a matmul on x runs in: autocast's where it is on for x's device, else x's own."""
    device = x.device.type
    if torch.is_autocast_enabled(device) and x.dtype in (torch.float32, torch.float16, torch.bfloat16):
        return torch.get_autocast_dtype(device)
    return x.dtype


def _check_positive_int(name: str, v: object) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise AttnconvError(f"SelfAttention2d: {name} must be a positive integer, got {v!r}")
