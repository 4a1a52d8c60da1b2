"""Reverse direction: the effective kernel of a position-only attention layer, and its conv-likeness.

Any position-only attention layer is linear in its input,
y_q = sum_h sum_k P_h[q, k] maps[h] @ x_k + bias, so `effective_kernel` extracts that
map in factored form and `conv_likeness` measures how close it is to a small convolution.
Works for any module with `attention_probs(size=...)` and `value_maps()` (`ConvAttention`,
`SelfAttention2d` with a position-only encoding), duck-typed: nothing here imports them.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnconv.construct.geometry import MAX_DENSE, grid_points
from attnconv.errors import AttnconvError
from attnconv.limits import (
    is_whole,
    positive_ints,
    probabilities_argument,
    tensor_argument,
    weights_with_values,
    whole_number,
)

__all__ = ["ConvLikeness", "EffectiveKernel", "conv_likeness", "effective_kernel"]


def _as_size(size: Sequence[Any]) -> tuple[int, ...]:
    """effective_kernel(layer, 8, 8) and effective_kernel(layer, (8, 8)) both mean (8, 8)."""
    if len(size) == 1 and not is_whole(size[0]) and not isinstance(size[0], (str, bytes)) and hasattr(size[0], "__len__"):
        size = size[0]  # effective_kernel(layer, (8, 8)); a tensor or array too, its items checked
    return positive_ints(size, None, "size", "the layer's input grid")


@dataclass(repr=False)
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

    def __repr__(self) -> str:
        heads, c_out, c_in = self.maps.shape
        return (f"EffectiveKernel(heads={heads}, C_out={c_out}, C_in={c_in}, in_size={tuple(self.in_size)}, "
                f"out_size={tuple(self.out_size)})")

    def _query(self, query: int | Sequence[int]) -> int:
        if is_whole(query):
            t_out, query = math.prod(self.out_size), operator.index(query)
            if not -t_out <= query < t_out:
                raise AttnconvError(f"query index {query} out of range for {t_out} output pixels")
            return query % t_out
        query = positive_ints(query, len(self.out_size), "query", "an output pixel's flat index or coordinates",
                              least=0)
        if any(not 0 <= i < n for i, n in zip(query, self.out_size)):
            raise AttnconvError(f"query {query} is not a pixel of the output grid {self.out_size}")
        flat = 0
        for i, n in zip(query, self.out_size):
            flat = flat * n + i
        return flat

    def at(self, query: int | Sequence[int]) -> Tensor:
        """The kernel output pixel `query` (flat index or coordinates) applies: (C_out, C_in, *in_size)."""
        q = self._query(query)
        probs, maps = self._factors()
        kernel = torch.einsum("hk,hoc->ock", probs[:, q], maps)  # (C_out, C_in, T_in)
        return kernel.reshape(*kernel.shape[:2], *self.in_size)

    def dense(self) -> Tensor:
        """The full map (T_out, T_in, C_out, C_in); refused when it has more than 2^28 entries."""
        numel = self.probs.shape[1] * self.probs.shape[2] * self.maps.shape[1] * self.maps.shape[2]
        if numel > MAX_DENSE:
            raise AttnconvError(f"the dense kernel would have {numel} entries; use .at(query) instead")
        return torch.einsum("hqk,hoc->qkoc", *self._factors())

    def _factors(self) -> tuple[Tensor, Tensor]:
        """probs and maps in one dtype, the wider of theirs (probabilities given in float64, a half layer's maps)."""
        dtype = torch.promote_types(self.probs.dtype, self.maps.dtype)
        return self.probs.to(dtype), self.maps.to(dtype)

    def apply(self, x: Tensor) -> Tensor:
        """Evaluate the factored map on x (B, C_in, *in_size) -> (B, C_out, *out_size), in x's dtype."""
        c_in = self.maps.shape[2]
        shape = f"(B, {c_in}, {', '.join(map(str, self.in_size))})"
        tensor_argument(x, "x", f"the input {shape}", like=self.maps, owner="the kernel",
                        same_dtype=False)
        if x.dim() != 2 + len(self.in_size) or x.shape[1] != c_in or tuple(x.shape[2:]) != tuple(self.in_size):
            raise AttnconvError(f"x of shape {tuple(x.shape)} does not fit this kernel: give the input {shape}, the "
                                "size the kernel was extracted at (effective_kernel(layer, size) for another size)")
        b = x.shape[0]
        probs = self.probs.to(x.dtype)  # the softmax's dtype (at least float32) where the maps are narrower
        z = torch.einsum("hqk,bck->bhcq", probs, x.reshape(b, x.shape[1], -1))  # (B, heads, C_in, T_out)
        y = torch.einsum("hoc,bhcq->boq", self.maps.to(x.dtype), z) + self.bias.to(x.dtype)[:, None]  # (B, C_out, T_out)
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
        maps, bias = layer.value_maps()  # (heads, C_out, C_in), (C_out,)
        weights_with_values(maps)  # a layer on the meta device: its probabilities fail inside torch
        if probs is not None:  # a meta tensor was taken as values (with a layer on the CPU)
            probabilities_argument(probs, "probs", "the probabilities to use (heads, T_out, T_in)", like=maps)
        probs = layer.attention_probs(size=size) if probs is None else probs.unsqueeze(0)  # (1, heads, T_out, T_in)
    out_size = tuple(layer.output_size(size)) if hasattr(layer, "output_size") else size
    if hasattr(layer, "query_positions"):
        query_pos = layer.query_positions(size)
    else:
        query_pos = grid_points(out_size)
    if probs.dim() != 4 or probs.shape[0] != 1 or probs.shape[2:] != (math.prod(out_size), math.prod(size)):
        raise AttnconvError(
            f"probs of shape {tuple(probs.shape[1:])} do not fit: expected (heads, {math.prod(out_size)}, "
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


@dataclass(repr=False)
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

    def __repr__(self) -> str:
        k = "x".join([str(self.kernel_size)] * len(self.size))
        return (f"ConvLikeness(distance to the nearest {k} conv {self.distance:.3g}, mean window mass "
                f"{self.mean_window_mass:.3g}, heads={self.window_mass.numel()}, size={tuple(self.size)})")

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
            want = _as_size((size,) * len(ek.in_size) if is_whole(size) else (size,))
            if want != ek.in_size:
                raise AttnconvError(f"size {want} does not match the effective kernel's input size {ek.in_size}")
    else:
        if size is None:
            raise AttnconvError("conv_likeness needs the input size for a layer")
        if is_whole(size):
            size = (size,) * getattr(layer_or_kernel, "ndim", 2)
        ek = effective_kernel(layer_or_kernel, size)
    kernel_size = whole_number(kernel_size, "kernel_size", "the compared convolution's kernel size")
    if "meta" in (ek.probs.device.type, ek.maps.device.type):
        raise AttnconvError("conv_likeness: the kernel is on the meta device, which holds no values; measure a layer "
                            "with weights (load them first: layer.to_empty(device=...), then load_state_dict)")
    # a kernel made by hand: NaN probabilities were measured as distance 0
    probabilities_argument(ek.probs, "the kernel's probs", "the probabilities of a kernel from effective_kernel")
    tensor_argument(ek.maps, "the kernel's maps", "the value maps of a kernel from effective_kernel", values=True,
                    finite=True)

    p = ek.probs.double()  # (heads, T_out, T_in)
    maps = ek.maps.double()  # (heads, C_out, C_in)
    heads = p.shape[0]
    ndim = len(ek.in_size)
    device = p.device
    in_size = torch.tensor(ek.in_size, device=device)
    keys = grid_points(ek.in_size).to(device)  # (T_in, ndim)
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
