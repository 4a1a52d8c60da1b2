"""Softmax leakage: the error of Theorem 1's construction, and the default width alpha.

The bounds hold for finite inputs. A NaN or inf input value is not an error of size
lambda: see `ConvAttention` for what it does to the output.
"""

from __future__ import annotations

import math

import torch

from attnconv.errors import ParameterError
from attnconv.limits import real_number, shown_value, whole_number

__all__ = ["MAX_ALPHA", "default_alpha", "leakage_bound"]

# The largest width alpha a converted layer takes. Past about 750 every off-target weight is exactly 0 in float64
# (e^-alpha underflows), so a larger alpha changes nothing; and alpha is used in the layer's dtype, where one past
# its largest number (65504 in float16, 3.4e38 in float32) becomes inf and 0 * inf makes every output NaN.
MAX_ALPHA = 1e4


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

    `ConvAttention.error_bound` turns this into a bound on the output error for finite
    inputs. It bounds how much of each head's mass lands off target, not where: the wrong
    keys keep tiny (or underflowed, exactly 0) weights, and 0 * inf is NaN, so a single
    NaN or inf input value reaches every output of its image (see `ConvAttention`).
    """
    ndim = whole_number(ndim, "ndim", "the number of spatial axes", most=3)
    alpha = real_number(alpha, "alpha", "the heads' softmax sharpness", low=0, low_open=True)
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
    bfloat16 -> 9.7 (for ndim = 2). A larger alpha, up to `MAX_ALPHA`, is never worse
    numerically: scores are <= 0 with the maximum at 0, so exp only underflows to 0.
    """
    ndim = whole_number(ndim, "ndim", "the number of spatial axes", most=3)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ParameterError("dtype", dtype, "is invalid: give a floating torch dtype, e.g. torch.float32",
                             shown=shown_value(dtype))
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
