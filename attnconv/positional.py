"""Relative positional encodings for attention over an H x W pixel grid.

Tokens are pixels in row-major order: query q = (i, j) has index i * W + j.
The shift from query q to key k is delta = k - q = (delta_1, delta_2) (row, column).

Position-only encodings (`QuadraticEncoding`, `LearnedRelativeEncoding`) produce,
per head h, the scores A^h_{q,k} of Eq. (6)'s position-only term:

    logits(H, W) -> (heads, H*W, H*W)

and, when the score is a sum of a row term and a column term (`separable`),

    factors(H, W) -> (row (heads, H, H), col (heads, W, W))
    logits[h, (i, j), (k, l)] == row[h, i, k] + col[h, j, l]

A softmax over a rectangular grid of exp(f(delta_1) + g(delta_2)) is the outer
product of a softmax over rows and one over columns, which is what makes the
separable attention path exact.

`LearnedContentEncoding` is the content-dependent positional term q . r_delta of
Ramachandran et al. (2019), used with content attention q . k.

Scores are computed in at least float32 whatever the parameters' dtype (a half or
bfloat16 layer widens its few positional parameters, float64 stays float64): in
float16 a quadratic score of a few hundred keeps only a tenth of a unit.

Initialization (`init`, SelfAttention2d's `pos_init`): "authors" follows the paper's
code (docs/design-notes.md): quadratic centers N(0, 2^2) and widths 1 + N(0, 0.01^2);
learned tables N(0, 1) as `nn.Embedding`, per-head keys as `nn.Linear`'s default, so
position-only heads start peaked rather than uniform. "bert" draws the learned tables
and keys from N(0, 0.02^2) as BERT's `init_bert_weights` would; the quadratic
encodings have only the authors' init.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from attnconv.errors import AttnconvError
from attnconv.ops.autocast import at_least_float32
from attnconv.ops.scores import (
    content_position_scores,
    learned_relative_factors,
    outer_sum,
    quadratic_axis_scores,
    quadratic_full_scores,
    relative_offsets,
)

POS_INITS = ("authors", "bert")


def check_pos_init(init: str) -> None:
    if init not in POS_INITS:
        raise AttnconvError(f"unknown pos_init {init!r}; choose one of: {', '.join(POS_INITS)}")


class QuadraticEncoding(nn.Module):
    """Quadratic (Gaussian) relative encoding, Lemma 2 and the paper's code.

    Per head h, with learnable center Delta_h (mu) and inverse covariance Sigma_h^-1:

        A^h_{q,k} = -1/2 (delta - Delta_h)^T Sigma_h^-1 (delta - Delta_h)

    which equals v^h . r_delta for the encoding r_delta = (||delta||^2, d1, d2)
    (isotropic) or (d1, d2, d1^2, d2^2, d1*d2) (full covariance), up to a
    per-query constant that the softmax ignores.

    kind:
      - "isotropic": Sigma^-1 = a_h^2 I, i.e. A = -alpha_h ||delta - Delta_h||^2 with alpha_h = a_h^2 / 2.
        Init (paper): Delta ~ N(0, 2^2), a = 1 + N(0, 0.01^2).  Separable.
      - "diagonal": Sigma^-1 = diag(a_h1^2, a_h2^2) (axis-aligned ellipses).  Separable.
      - "full": Sigma^-1 = A_h A_h^T with A_h a free 2x2 matrix, init I + N(0, 0.01^2).  Not separable.

    Centers and widths take no weight decay (`no_weight_decay = True`).
    """

    no_weight_decay = True
    KINDS = ("isotropic", "diagonal", "full")

    def __init__(self, heads: int, kind: str = "isotropic", center_std: float = 2.0, width_std: float = 0.01):
        super().__init__()
        if kind not in self.KINDS:
            raise AttnconvError(f"quadratic encoding kind {kind!r}: choose one of {self.KINDS}")
        self.heads, self.kind = heads, kind
        self.centers = nn.Parameter(torch.randn(heads, 2) * center_std)  # (heads, 2): (row, col)
        if kind == "isotropic":
            self.widths = nn.Parameter(1.0 + torch.randn(heads) * width_std)  # (heads,): a_h
        elif kind == "diagonal":
            self.widths = nn.Parameter(1.0 + torch.randn(heads, 2) * width_std)  # (heads, 2)
        else:
            self.widths = nn.Parameter(torch.eye(2).repeat(heads, 1, 1) + torch.randn(heads, 2, 2) * width_std)

    @property
    def separable(self) -> bool:
        return self.kind != "full"

    @torch.no_grad()
    def init_grid(self, locality: float = 1.0) -> None:
        """Start from a convolution-like layout instead of the paper's random centers.

        Centers go on the K x K grid of shifts {-(K-1)/2, ..., (K-1)/2}^2 with
        K = ceil(sqrt(heads)) (row-major, the first `heads` points; as in ConViT's
        locality initialization), and every head gets the isotropic width
        alpha = `locality` (A = -alpha ||delta - Delta_h||^2). Full-covariance heads get
        Sigma^-1 = 2 alpha I. Larger `locality` means each head starts closer to one pixel
        (Lemma 2's limit).
        """
        if not locality > 0:
            raise AttnconvError(f"locality must be positive, got {locality}")
        k = math.ceil(math.sqrt(self.heads))
        shifts = torch.arange(k, dtype=self.centers.dtype) - (k - 1) // 2
        grid = torch.cartesian_prod(shifts, shifts)[: self.heads]  # (heads, 2)
        self.centers.copy_(grid)
        a = math.sqrt(2.0 * locality)  # alpha = a^2 / 2
        if self.kind == "full":
            self.widths.copy_(torch.eye(2).repeat(self.heads, 1, 1) * a)
        else:
            self.widths.fill_(a)

    def inverse_covariance(self) -> Tensor:
        """Sigma_h^-1 as (heads, 2, 2), at least float32."""
        widths = at_least_float32(self.widths)
        if self.kind == "isotropic":
            return torch.eye(2, device=widths.device, dtype=widths.dtype) * widths[:, None, None] ** 2
        if self.kind == "diagonal":
            return torch.diag_embed(widths**2)
        return widths @ widths.transpose(-1, -2)

    def _axis_precisions(self) -> tuple[Tensor, Tensor]:
        widths = at_least_float32(self.widths)
        if self.kind == "isotropic":
            return widths**2, widths**2
        return widths[:, 0] ** 2, widths[:, 1] ** 2

    def factors(self, H: int, W: int) -> tuple[Tensor, Tensor]:
        """Row (heads, H, H) and column (heads, W, W) terms: -1/2 s_axis (delta_axis - mu_axis)^2."""
        if not self.separable:
            raise AttnconvError("a full-covariance quadratic encoding is not separable; use impl='dense' or 'sdpa'")
        s1, s2 = self._axis_precisions()
        centers = at_least_float32(self.centers)
        d1 = relative_offsets(H, centers.device, centers.dtype)
        d2 = relative_offsets(W, centers.device, centers.dtype)
        return quadratic_axis_scores(d1, centers[:, 0], 0.5 * s1), quadratic_axis_scores(d2, centers[:, 1], 0.5 * s2)

    def logits(self, H: int, W: int) -> Tensor:
        if self.separable:
            return outer_sum(*self.factors(H, W))
        centers = at_least_float32(self.centers)
        d1 = relative_offsets(H, centers.device, centers.dtype)  # (H, H)
        d2 = relative_offsets(W, centers.device, centers.dtype)  # (W, W)
        return quadratic_full_scores(d1, d2, centers, self.inverse_covariance())

    def extra_repr(self) -> str:
        return f"heads={self.heads}, kind={self.kind!r}"


class LearnedRelativeEncoding(nn.Module):
    """Learned relative encoding without content (the paper's "SA learned" model).

    Separate row and column embedding tables with 2S - 1 rows (S = `max_size`,
    the largest image side) and width D_p; per head a row key u_row^h and column
    key u_col^h:

        A^h_{q,k} = u_row^h . r_row(delta_1) + u_col^h . r_col(delta_2)

    Separable by construction. `init` (see the module docstring): "authors" draws the
    tables from N(0, 1) (`nn.Embedding`'s default) and the keys from U(-1/sqrt(D_p),
    1/sqrt(D_p)) (the default of the authors' `nn.Linear(D_p, heads, bias=False)`, whose
    weight is our (heads, D_p) keys), so a score has variance 2/3 whatever D_p; "bert"
    draws all four from N(0, 0.02^2), a score variance of 2 D_p 1.6e-7 (uniform heads).
    """

    separable = True

    def __init__(self, heads: int, dim: int, max_size: int, init: str = "authors"):
        super().__init__()
        check_pos_init(init)
        self.heads, self.dim, self.max_size = heads, dim, max_size
        self.row_embeddings = nn.Parameter(torch.empty(2 * max_size - 1, dim))
        self.col_embeddings = nn.Parameter(torch.empty(2 * max_size - 1, dim))
        self.row_keys = nn.Parameter(torch.empty(heads, dim))
        self.col_keys = nn.Parameter(torch.empty(heads, dim))
        self.reset_parameters(init)

    @torch.no_grad()
    def reset_parameters(self, init: str = "authors") -> None:
        """Draw the tables and keys again with the `init` scheme ("authors" or "bert")."""
        check_pos_init(init)
        for table in (self.row_embeddings, self.col_embeddings):
            nn.init.normal_(table, std=1.0 if init == "authors" else 0.02)
        for keys in (self.row_keys, self.col_keys):
            if init == "authors":
                nn.init.kaiming_uniform_(keys, a=math.sqrt(5))  # exactly nn.Linear's weight init
            else:
                nn.init.normal_(keys, std=0.02)

    def factors(self, H: int, W: int) -> tuple[Tensor, Tensor]:
        _check_size(H, W, self.max_size)
        wide = at_least_float32
        return learned_relative_factors(wide(self.row_keys), wide(self.row_embeddings), wide(self.col_keys),
                                        wide(self.col_embeddings), H, W, self.max_size)

    def logits(self, H: int, W: int) -> Tensor:
        return outer_sum(*self.factors(H, W))

    def extra_repr(self) -> str:
        return f"heads={self.heads}, dim={self.dim}, max_size={self.max_size}"


class LearnedContentEncoding(nn.Module):
    """Relative term of content attention (Ramachandran et al. 2019; the paper's "learned + content").

    The query of each head (width D_k) is split in two: its first half is dotted
    with the row embedding of delta_1, its second half with the column embedding
    of delta_2. The tables (2S - 1 rows) are shared by the heads.

        A^h_{q,k} = q^h . k^h / sqrt(D_k) + q^h_{:D_k/2} . r_row(delta_1) + q^h_{D_k/2:} . r_col(delta_2)

    This module computes the second and third terms from the queries. The authors' code
    divides them by sqrt(D_k) too, with N(0, 1) tables; ours are not divided, so `init`
    "authors" draws the tables from N(0, 1/D_k): at initialization the scores have the
    distribution of theirs (their weights map onto ours with the tables / sqrt(D_k)).
    "bert" draws them from N(0, 0.02^2).
    """

    position_only = False
    separable = False

    def __init__(self, key_dim: int, max_size: int, init: str = "authors"):
        super().__init__()
        check_pos_init(init)
        self.key_dim, self.max_size = key_dim, max_size
        self.row_dim = key_dim // 2
        self.row_embeddings = nn.Parameter(torch.empty(2 * max_size - 1, self.row_dim))
        self.col_embeddings = nn.Parameter(torch.empty(2 * max_size - 1, key_dim - self.row_dim))
        self.reset_parameters(init)

    @torch.no_grad()
    def reset_parameters(self, init: str = "authors") -> None:
        """Draw the tables again with the `init` scheme ("authors" or "bert")."""
        check_pos_init(init)
        std = 1.0 / math.sqrt(self.key_dim) if init == "authors" else 0.02
        for table in (self.row_embeddings, self.col_embeddings):
            nn.init.normal_(table, std=std)

    def position_logits(self, q: Tensor, H: int, W: int) -> Tensor:
        """q: (B, heads, H*W, D_k) queries -> (B, heads, H*W, H*W) positional scores, in q's dtype."""
        _check_size(H, W, self.max_size)
        # the tables follow the queries' dtype: a half layer's scores are computed from widened queries
        return content_position_scores(q, self.row_embeddings.to(q.dtype), self.col_embeddings.to(q.dtype), H, W,
                                       self.max_size)

    def extra_repr(self) -> str:
        return f"key_dim={self.key_dim}, max_size={self.max_size}"


def _check_size(H: int, W: int, max_size: int) -> None:
    if H > max_size or W > max_size:
        raise AttnconvError(
            f"image of {H}x{W} tokens is larger than the learned encoding's max_size={max_size}; "
            f"build the layer with max_size >= {max(H, W)}"
        )


ENCODINGS = ("quadratic", "quadratic-diag", "quadratic-aniso", "learned", "learned-content")


def build_encoding(
    name: str, heads: int, *, pos_dim: int, key_dim: int, max_size: int, init: str = "authors"
) -> nn.Module:
    """Encoding by its SelfAttention2d name; `init` is "authors" or "bert" (learned encodings only)."""
    check_pos_init(init)
    if init != "authors" and name.startswith("quadratic"):
        raise AttnconvError(
            f"pos_init={init!r} sets the learned tables' init; the {name!r} encoding has only the authors' "
            f"(use pos_init='authors', or init_grid for a convolution-like start)"
        )
    if name == "quadratic":
        return QuadraticEncoding(heads, "isotropic")
    if name == "quadratic-diag":
        return QuadraticEncoding(heads, "diagonal")
    if name == "quadratic-aniso":
        return QuadraticEncoding(heads, "full")
    if name == "learned":
        return LearnedRelativeEncoding(heads, pos_dim, max_size, init)
    if name == "learned-content":
        return LearnedContentEncoding(key_dim, max_size, init)
    raise AttnconvError(f"unknown encoding {name!r}; choose one of: {', '.join(ENCODINGS)}")


__all__ = [
    "ENCODINGS",
    "POS_INITS",
    "LearnedContentEncoding",
    "LearnedRelativeEncoding",
    "QuadraticEncoding",
    "build_encoding",
    "check_pos_init",
]

