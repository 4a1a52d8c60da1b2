"""`LearnableConvAttention`: Theorem 1's layer with trainable head centers and widths, and
optional content attention (one scaled-dot-product attention over the padded grid)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnconv.construct.conv_attention import ConvAttention
from attnconv.construct.geometry import MAX_DENSE, grid_points
from attnconv.errors import AttnconvError
from attnconv.limits import MAX_SIDE, is_whole, shown_value
from attnconv.ops.autocast import float32_scores
from attnconv.ops.scores import content_scores

__all__ = ["LearnableConvAttention", "check_key_dim", "pad_for_fused_sdpa"]


class _HeadPositions(nn.Module):
    """Per-head centers and widths of a `LearnableConvAttention` (no weight decay, as in the paper)."""

    no_weight_decay = True

    def __init__(self, centers: Tensor, alpha: float):
        super().__init__()
        self.center = nn.Parameter(centers.clone())  # (heads, ndim)
        self.log_alpha = nn.Parameter(torch.full((centers.shape[0],), math.log(alpha), dtype=centers.dtype,
                                                 device=centers.device))  # (heads,)


def check_key_dim(key_dim: Any, learnable: bool) -> int:
    """The content attention option of `conv_to_attention` / `cnn_to_attention`: an int >= 0 (numpy's and 0-d integer
    tensors taken, as Python ints), > 0 only if learnable."""
    if not is_whole(key_dim, 0, MAX_SIDE):
        raise AttnconvError(f"key_dim must be an integer >= 0 and at most {MAX_SIDE} (0: no content attention), got "
                            f"{shown_value(key_dim)}")
    if key_dim and not learnable:
        raise AttnconvError("content attention (key_dim > 0) is trained: pass learnable=True with it")
    return operator.index(key_dim)


def pad_for_fused_sdpa(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, Tensor]:
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
    Delta_h (`positions.center`, (heads, ndim), float; `centers`) and alpha_h =
    exp(`positions.log_alpha`) (`alphas`) are parameters. Built by `conv_to_attention(conv, learnable=True)` (or
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

    Non-finite inputs spread as in `ConvAttention` (finite inputs only); with content
    attention one NaN or inf anywhere in image b makes all of image b's outputs non-finite,
    whatever the groups (its key enters every query's softmax, shared by all channels).
    """

    placement_children = ("query", "key")  # with the positions: what --attention-lr-scale scales

    def __init__(self, *args: Any, key_dim: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        key_dim = check_key_dim(key_dim, learnable=True)
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
    def alphas(self) -> Tensor:
        """The heads' current alpha_h = exp(positions.log_alpha), (heads,)."""
        return self.positions.log_alpha.exp()

    def _axis_heads(self, a: int) -> tuple[Tensor, Tensor]:
        """One softmax factor per head on every axis: its center's coordinate `a` and its alpha.

        So `axis_probs` returns (heads, n_a, P_a) per axis, and head h's probabilities over
        the padded grid are the outer product over a of factors[a][h].
        """
        return self.centers[:, a], self.alphas

    def _axis_factors(self, a: int) -> int:
        """One factor per head on every axis (`_axis_heads`)."""
        return self.heads

    @staticmethod
    def _outer(dense: Tensor, folded: Tensor) -> Tensor:
        """Join the axes so far (h, Tq, Tk) with the next axis (h, n_a, S_a), head by head."""
        h, tq, tk = dense.shape
        return torch.einsum("hqk,hop->hqokp", dense, folded).reshape(h, tq * folded.shape[1], tk * folded.shape[2])

    @staticmethod
    def _outer_sum(dense: Tensor, axis: Tensor) -> Tensor:
        """`_outer` for scores: the axes so far (h, Tq, Tk) plus the next axis (h, n_a, P_a), head by head."""
        h, tq, tk = dense.shape
        return (dense[:, :, None, :, None] + axis[:, None, :, None, :]).reshape(h, tq * axis.shape[1], tk * axis.shape[2])

    def error_bound(self, x: Tensor) -> float:
        """Theorem 1's bound holds only while every head sits on its tap with one alpha; check that first."""
        self._batched(x, values=True)  # an input with values first: a layer on the meta device has none to compare
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
        """The tokens of the padded input z (B, C, *P) at the queries' positions: (B, T_out, C).

        The first query sits at dilation * anchor on every axis (`_padded_query_axes` at o = 0), a Python int
        from the layer's config: read from that tensor (`int(q[0])`) it would be a data-dependent value to
        torch.export, which refuses to slice by it (GuardOnDataDependentSymNode), and ONNX export with it."""
        out = self.output_size(size)
        pick = tuple(slice(q0, q0 + s * (n - 1) + 1, s) for q0, s, n in
                     zip((d * c for d, c in zip(self.dilation, self.anchor)), self.stride, out))
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
        keys = grid_points(padded).to(device, dtype) - middle  # (P, ndim)
        grids = torch.meshgrid(*self._padded_query_axes(size), indexing="ij")
        queries = torch.stack([g.reshape(-1) for g in grids], dim=-1).to(device, dtype) - middle  # (T_out, ndim)
        alpha = self.alphas.to(dtype)[:, None, None]  # (heads, 1, 1)
        q_feat = torch.cat([2 * alpha * (queries[None] + self.centers.to(dtype)[:, None]),
                            (-alpha).expand(-1, queries.shape[0], 1)], dim=-1)
        k_feat = torch.cat([keys, keys.square().sum(-1, keepdim=True)], dim=-1)
        return q_feat, k_feat

    def _content_forward(self, padded: Tensor, size: Sequence[int]) -> Tensor:
        """Every head's attention-weighted input per query, (B, heads, T_out, C_in), by one SDPA call, from the
        input on its padded grid (`_pad`: (B, C_in, *P)) and the input's size S."""
        work = torch.promote_types(self.out_weight.dtype, torch.float32)
        with float32_scores():  # the folded positional terms need float32: in bf16 they would swamp the scores
            z = padded.to(work)
            b = z.shape[0]
            q, k = self._content_qk(z, size)
            q_pos, k_pos = self._position_features(size, work)
            q = torch.cat([q.to(work) / math.sqrt(self.key_dim), q_pos.expand(b, -1, -1, -1)], dim=-1)
            k = torch.cat([k.to(work), k_pos.expand(b, self.heads, -1, -1)], dim=-1)
            # (B, heads, P, C_in); the fused kernels want the channels contiguous
            v = z.flatten(2).transpose(1, 2).contiguous()[:, None].expand(b, self.heads, -1, -1)
            q, k, v = pad_for_fused_sdpa(q, k, v)
            out = F.scaled_dot_product_attention(q, k, v, scale=1.0)
        return out[..., : self.in_channels].to(padded.dtype)

    def padded_scores(self, x: Tensor) -> dict[str, Tensor]:
        """Score terms over the padded grid, computed exactly (no folding): 'position' (1, heads, T_out, P),
        'content' (B, heads, T_out, P) for content layers, and their sum 'combined'. In at least float32."""
        x, _ = self._batched(x)
        self._check_dense(x[:1] if self.position_only else x)
        size = tuple(x.shape[2:])
        pos = self.padded_position_scores(size)[None]
        if self.position_only:
            return {"position": pos, "combined": pos}
        q, k = self._content_qk(self._pad(x).to(pos.dtype), size)
        content = content_scores(q, k)
        return {"position": pos, "content": content, "combined": pos + content}

    def attention_scores(self, x: Tensor | None = None, size: Sequence[int] | None = None) -> dict[str, Tensor]:
        """`padded_scores` at the input pixels' tokens: (1 or B, heads, T_out, T_in) per term.

        The padding tokens take part in the softmax but are not pixels, so they are left
        out here; `attention_probs` folds their probability onto the pixels they copy. A
        position-only layer also takes `size` instead of x; a content layer needs x.
        """
        if self.position_only and x is None:
            return super().attention_scores(x, size)
        if x is None:
            raise AttnconvError("a content-attention layer needs the input x (B, C_in, *S) to compute its attention")
        x, _ = self._batched(x)
        inner = self._inner_tokens(tuple(x.shape[2:])).to(x.device)
        return {name: s[..., inner] for name, s in self.padded_scores(x).items()}

    def _check_dense(self, x: Tensor) -> None:
        """Refuse score or probability tensors too large to hold (one per input, head and query)."""
        size = tuple(x.shape[2:])
        t_out = math.prod(self.output_size(size))
        padded = math.prod(n + lo + hi for n, (lo, hi) in zip(size, self.padding))
        if x.shape[0] * self.heads * t_out * padded > MAX_DENSE:
            raise AttnconvError(
                f"dense attention of {x.shape[0]} inputs of size {size} would have "
                f"{x.shape[0] * self.heads * t_out * padded} entries; pass fewer inputs at a time"
            )

    def attention_probs(self, x: Tensor | None = None, size: Sequence[int] | None = None,
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
        if x is None:
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
        padded = self._pad(x)  # once: the layout check on a GPU takes it too
        if self.position_only:
            factors = self.axis_probs(size)  # (heads, n_a, P_a) per axis
            # Each step consumes the leading spatial axis and appends the queries' index along it;
            # the first one also brings in the head axis.
            z = torch.einsum("bci...,hoi->bhc...o", padded, factors[0])
            for factor in factors[1:]:
                z = torch.einsum("bhci...,hoi->bhc...o", z, factor)
            # z: (B, heads, C_in, n_1, ..., n_n): each head's average of the input, per query
            z = z.reshape(b, self.heads, g, c_in, math.prod(out))
        else:
            z = self._content_forward(padded, size).reshape(b, self.heads, -1, g, c_in).permute(0, 1, 3, 4, 2)
        w = self.out_weight.reshape(self.heads, g, c_out, c_in)
        y = torch.einsum("bhgct,hgoc->bgot", z, w).reshape(b, self.out_channels, *out)
        if self.out_bias is not None:
            y = y + self.out_bias.view(-1, *([1] * self.ndim))
        y = self._conv_layout(self._conv_dtype(y, x), x, padded)
        return y.squeeze(0) if unbatched else y

    def extra_repr(self) -> str:
        text = super().extra_repr().replace(f"alpha={self.alpha:g}", f"alpha={self.alpha:g} (initial; learnable)")
        return text + (f", key_dim={self.key_dim}" if self.key_dim else "")
