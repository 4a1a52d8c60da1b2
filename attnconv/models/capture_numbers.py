"""What capture checks of the numbers it is given and computes, and how it sizes its recomputation.

The images (`check_images`, `check_values`); a computation's recomputed scores (`check_scores`: NaN, inf, past
the model's precision); the model's own result against them (`check_own_attention`, `check_own_multihead`: its
output or returned weights NaN where only its attention can make them so, `own_rows_bad`, `sdpa_values_bounded`,
`values_bounded`); attnconv's own layers' probabilities (`check_native_probs`). The recomputation itself:
`softmax_parts` (scores, masks and causal masking to probabilities), `chunks` and `row_pieces` (float64
intermediates within CHUNK_BYTES). The arguments: `whole_bytes` (`max_bytes`), `check_grid`, `check_leading`,
`positive_ints`. The pass is `attnconv.models.capture`;
the records and the token grids are `attnconv.models.captured`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from attnconv.errors import AttnconvError
from attnconv.limits import COMPUTED, MAX_SIDE, as_real, dense_problem, is_whole, positive_ints, shown_value


class NonFiniteAttention(AttnconvError):
    """A model's attention probabilities or scores hold NaN or inf, or scores past their dtype: its weights do, or what
    it computes before the attention (in training: the run diverged, `training.stopping.stopped_line`)."""


def check_images(images: object, grid: Sequence[int] | None) -> None:
    """One AttnconvError unless `images` is a non-empty batch of images with values: a tensor of other than 4
    dimensions, without `grid`, is no batch of images (N, C, H, W) whose shape places the tokens (one image (C, H, W),
    token sequences (N, T, D), frames (N, T, C, H, W)); NaN or infinite values make attention undefined."""
    if isinstance(images, Tensor) and dense_problem(images):  # before len(): a nested tensor has none
        check_values(images, "capture_attention")
    if not isinstance(images, Tensor) or images.dim() < 1 or len(images) == 0:
        raise AttnconvError("capture_attention needs a non-empty batch of images (N, C, H, W)")
    if images.dim() != 4 and grid is None:
        raise AttnconvError(f"capture_attention: images of shape {tuple(images.shape)} are no batch of images (N, C, "
                            "H, W), whose shape places the tokens: give images as a batch (N, C, H, W), one image as "
                            "images[None], or with other inputs (tokens, frames) grid=(H, W) of the image positions")
    check_values(images, "capture_attention")


def check_values(images: Tensor, who: str) -> None:
    """One AttnconvError (`who` says whose images) unless the tensor `images` holds values, all finite: NaN or
    infinite values make attention undefined (and a map of them would blame the model)."""
    if not isinstance(images, Tensor) or images.dim() == 0:
        raise AttnconvError(f"{who}: the images are {type(images).__name__}{' of no dimension' * isinstance(images, Tensor)}"
                            ", not a batch of images; give them as a torch.Tensor (N, C, H, W)")
    problem = dense_problem(images)
    if problem:
        raise AttnconvError(f"{who}: the images are {problem}; give them as a dense tensor (N, C, H, W) "
                            "(images.to_dense(), or a padded batch)")
    if images.device.type == "meta":
        raise AttnconvError(f"{who}: the images are on the meta device, which holds no values; give images with values")
    if images.is_floating_point() or images.is_complex():
        narrow = images.is_floating_point() and images.dtype not in COMPUTED  # float8: no isfinite of its own
        bad = int((~torch.isfinite(images.float() if narrow else images)).sum())
        if bad:
            raise AttnconvError(f"{who}: the images hold {bad} NaN or infinite value{'s' * (bad > 1)}, which make "
                                "attention undefined; give images with finite values")


def check_native_probs(probs: Tensor, where: str, dtype: torch.dtype, what: str = "probabilities") -> None:
    """One AttnconvError where an attnconv attention layer's own probabilities (or scores, `what`) hold NaN or inf
    (its weights do, or its scores are past its dtype, `dtype`), not a map of them with measures of None."""
    if not bool(probs.isfinite().all()):
        raise NonFiniteAttention(f"{where or '(model)'}: its attention {what} hold NaN or inf (the layer's weights "
                                 f"do, or its scores are past {str(dtype).replace('torch.', '')}); check its weights "
                                 "and inputs")


def check_scores(content: Tensor, combined: Tensor | None, source: torch.dtype, where: str,
                 what: str = "attention scores") -> None:
    """One AttnconvError where a computation's attention is undefined: its scores (recomputed in float64) hold NaN or
    infinite values (from what the model computed, or a mask of NaN or +inf: a mask may hold -inf), or values the
    model's own precision cannot hold (`source`: float32 for a float32, float16 or bfloat16 model, whose score
    kernels accumulate in float32; the queries and keys of a half-precision projection in their own dtype), where
    the model's attention is NaN while the recomputation stays finite."""
    peak = float(content.abs().amax()) if content.numel() else 0.0  # NaN or inf if any value is
    bad = not math.isfinite(peak) or (combined is not None and bool((combined.isnan() | combined.isposinf()).any()))
    if not bad and source.is_floating_point and source != torch.float64:
        held = source if combined is None and source in (torch.float16, torch.bfloat16) else torch.float32
        if combined is not None:  # scores: past the limit below is -inf there, a key left out, no NaN (a row all of
            peak = float(content.amax()) if content.numel() else 0.0  # them is the output check's)
        if peak > torch.finfo(held).max:
            raise NonFiniteAttention(f"{where or '(model)'}: its {what} reach {peak:.3g}, past what "
                                     f"{str(held).replace('torch.', '')} holds, where the model computes them: its own "
                                     "attention there is not a number, or not the one these scores give; check the "
                                     "model's weights, scale and inputs")
    if bad:
        raise NonFiniteAttention(f"{where or '(model)'}: its {what} hold NaN or infinite values (from what the model "
                                 "computed, or its mask: a mask may hold -inf, not NaN or +inf), so its attention is "
                                 "undefined; check the model's weights, masks and what it computes before this "
                                 "attention")


def softmax_parts(content: Tensor, mask: Tensor | None, causal: bool, row0: int = 0) -> tuple[Tensor, Tensor]:
    """(combined scores, probabilities) from q k^T * scale (..., L, S) and an additive float mask or a
    keep-mask (bool, True: take part), and top-left causal masking. Fully masked rows attend nowhere (0).
    row0: the first query row `content` holds, when the rows come in pieces (`row_pieces`)."""
    combined = content
    if mask is not None:
        combined = combined.masked_fill(~mask, -math.inf) if mask.dtype == torch.bool else combined + mask.double()
    if causal:
        L, S = content.shape[-2:]
        keep = torch.ones(L, S, dtype=torch.bool, device=content.device).tril(row0)
        combined = combined.masked_fill(~keep, -math.inf)
    return combined, combined.softmax(-1).nan_to_num(0.0)




def same_for_every_image(t: Tensor, dim: int = 0) -> bool:
    """Whether `t` holds the same values for each of its images (along `dim`, more than one of them)."""
    if t.is_nested or t.dim() <= dim or t.shape[dim] < 2:
        return False
    return t.stride(dim) == 0 or bool((t == t.narrow(dim, 0, 1)).all())


def shared_tokens(q: Tensor, k: Tensor, q_copied: bool, k_copied: bool, dim: int = 0) -> tuple[str, ...]:
    """Which of a call's queries and keys are the same for every image, not its positions ("queries", "keys"):
    those copied to every image (`q_copied`, `k_copied`: broadcast over the images, or .expand's stride of 0), and
    those equal for every image while the other side's are not (learned queries copied with .repeat, or computed
    from copies, as a decoder's cross-attention has them; learned memory keys). Where both are equal only by value,
    the images may be one image repeated: the tokens are read as theirs, and the answer is ("alike",) (the images
    could not tell: `attention_sites` probes again with others)."""
    same_q, same_k = q_copied or same_for_every_image(q, dim), k_copied or same_for_every_image(k, dim)
    sides = tuple(name for name, copied, same, other in (("queries", q_copied, same_q, same_k),
                                                           ("keys", k_copied, same_k, same_q)) if copied or same and not other)
    return sides or (("alike",) if same_q and same_k else ())


def same_output(output: Any, expected: Any) -> bool:
    """Whether a module's output is nn.MultiheadAttention's on the same call (its attention output, to float error)."""
    out = output[0] if isinstance(output, tuple) else output
    exp = expected[0] if isinstance(expected, tuple) else expected
    return isinstance(out, Tensor) and isinstance(exp, Tensor) and out.shape == exp.shape \
        and bool(torch.allclose(out.double(), exp.double(), rtol=1e-4, atol=1e-5))


def own_rows_bad(result: Tensor, entries: int, rows: int) -> Tensor | None:
    """(entries, heads or 1, rows): the query rows where a model's own result holds NaN or inf, from an attention
    output (..., rows, E) or its attention weights (..., rows, S), heads apart or averaged; None where the result
    is laid out otherwise (a nested tensor, another shape: nothing to tell)."""
    if result.is_nested or result.dim() < 2 or result.shape[-2] != rows or result[..., 0].numel() % (entries * rows):
        return None
    return ~result.detach().isfinite().all(-1).reshape(entries, -1, rows)


def check_own_attention(bad: Tensor | None, dead: Tensor, where: str, dtype: torch.dtype, what: str) -> None:
    """One AttnconvError where a model's own attention is not a number while its recomputation in float64 is: `bad`
    (`own_rows_bad`: entries, heads or 1, rows) marks query rows where its own result (`what`) holds NaN or inf, taken
    only where nothing but its attention can put them there; `dead` (entries, heads, rows) the rows the recomputation
    finds fully masked, NaN in many kernels and left out (zero) in the records. The model's kernel overflowed where
    float64 did not (scores, a scale or a mask past its dtype, q k^T past float32 before the scale, a kernel's own
    masking, `is_causal` with scale 0): its attention there is none, and a map recomputed in float64 would not be
    its attention."""
    if bad is None or bad.shape[1] not in (1, dead.shape[1]):
        return
    exempt = dead if bad.shape[1] == dead.shape[1] else dead.any(1, keepdim=True)
    n = int((bad & ~exempt).sum())
    if n:
        raise NonFiniteAttention(
            f"{where or '(model)'}: its own attention is not a number in {n} of {bad.numel()} query rows, whose keys "
            f"are not all masked ({what}), although it is one in float64: its scores, scale or mask "
            f"are past what {str(dtype).replace('torch.', '')}, or the kernel torch took, computes; check the model's "
            "weights, scale, masks and inputs")


def _peak(*tensors: Tensor | None) -> float:
    """The largest magnitude in `tensors` (None skipped), in float64: NaN or inf if any value is."""
    peaks = [float(t.detach().double().abs().amax()) for t in tensors if isinstance(t, Tensor) and t.numel()]
    return math.nan if any(math.isnan(p) for p in peaks) else max(peaks, default=0.0)


def sdpa_values_bounded(value: Any, keys: int, dropout_p: Any, dtype: torch.dtype) -> bool:
    """Whether an attention call's output in `dtype` can be NaN or inf only through its attention: its `value`s are
    finite, and so small that a kernel's sums over `keys` of them (unnormalized, as flash-style kernels keep them;
    scaled by dropout's 1 / (1 - p)) stay within what `dtype` holds (values near its limit, or past it once cast,
    as autocast does, would overflow with a finite attention)."""
    if not isinstance(value, Tensor) or not dtype.is_floating_point or value.is_nested:
        return False
    p = float(dropout_p or 0.0)
    scale = 1.0 if p == 0 else 1 / (1 - p) if 0 < p < 1 else math.inf
    return _peak(value) * max(keys, 1) * scale < torch.finfo(dtype).max / 2


def values_bounded(value: Tensor, w_v: Tensor | None, b_v: Tensor | None, bias_v: Tensor | None, w_o: Tensor | None,
                   b_o: Tensor | None, dtype: torch.dtype, keys: int) -> bool:
    """Whether a multi-head attention's output in `dtype` is NaN or inf only through its attention: its value input,
    its values (projected by `w_v`, `b_v`; `bias_v` appended) summed over its `keys` (`sdpa_values_bounded`), and any
    average of them projected out (`w_o`, `b_o`), all finite and within what `dtype` holds."""
    if not dtype.is_floating_point or not isinstance(w_v, Tensor) or not isinstance(w_o, Tensor) or value.is_nested:
        return False
    v = F.linear(value.detach().double(), w_v.detach().double(), None if b_v is None else b_v.detach().double())
    peak, limit = _peak(v, bias_v), torch.finfo(dtype).max / 2
    out = peak * float(w_o.detach().double().abs().sum(1).amax()) + _peak(b_o)
    return _peak(value) < limit and peak * (keys + 2) < limit and out < limit  # NaN compares false


def check_own_multihead(dead: Tensor, where: str, output: Any, value: Any, batch_first: bool, v_side: tuple,
                        out_side: tuple) -> None:
    """Refuse a multi-head attention call whose own attention is not a number (`check_own_attention`): its
    attention weights when it returned them (computed in its own dtype), else its output where only its
    attention can make that NaN or inf (`values_bounded`). `dead`: the recomputation's fully masked rows, `where` its
    path; `v_side` the value projection (weight, bias, bias_v), `out_side` the output projection's (weight, bias)."""
    attn_out, weights = output if isinstance(output, tuple) and len(output) == 2 else (output, None)
    entries, rows = dead.shape[0], dead.shape[-1]
    if isinstance(weights, Tensor):
        check_own_attention(own_rows_bad(weights, entries, rows), dead, where, weights.dtype,
                            "the attention weights it returns hold NaN or inf there")
    elif isinstance(attn_out, Tensor) and isinstance(value, Tensor) and values_bounded(
            value, *v_side, *out_side, attn_out.dtype, value.shape[1 if value.dim() == 3 and batch_first else 0]):
        rows_first = attn_out.dim() == 3 and not batch_first  # (L, B, E)
        check_own_attention(own_rows_bad(attn_out.transpose(0, 1) if rows_first else attn_out, entries, rows),
                            dead, where, attn_out.dtype, "its output holds NaN or inf there, its values being finite")


# Bytes of float64 intermediates per chunk of the batch while recomputing one call's probabilities.
CHUNK_BYTES = 64 * 2**20


def chunks(total: int, per_item: int) -> int:
    return max(1, min(total, CHUNK_BYTES // max(per_item, 1)))


def row_pieces(rows: int, per_row: int) -> list[tuple[int, int]]:
    """The query rows in pieces whose float64 intermediates (`per_row` bytes a row) stay within CHUNK_BYTES (one
    piece when all fit): a batch entry larger than a chunk is recomputed a piece of rows at a time."""
    step = max(1, min(rows, CHUNK_BYTES // max(per_row, 1)))
    return [(r, min(rows, r + step)) for r in range(0, rows, step)]


def whole_bytes(max_bytes: object) -> int:
    """`max_bytes` as an int, or one AttnconvError: a positive whole number of bytes (numpy's and 0-d tensors too;
    1e12 taken: a number of bytes is often written so)."""
    number = as_real(max_bytes) if not is_whole(max_bytes) else operator.index(max_bytes)
    if number is None or not 1 <= number < math.inf or number != int(number):
        raise AttnconvError(f"max_bytes {shown_value(max_bytes)} is invalid: give a positive whole number of bytes")
    return int(number)


def check_grid(grid: Sequence[int] | None) -> tuple[int, int] | None:
    """`grid` as (H, W) of Python ints, or None (`positive_ints`)."""
    return None if grid is None else positive_ints(grid, 2, "grid", "the image positions' (H, W)")


def check_leading(leading: Any, grid: tuple[int, int] | None, name: str = "leading") -> int | None:
    """`leading` (or `trailing`, as `name` says) as a Python int, or None: a whole number >= 0, given with a grid."""
    if leading is None:
        return None
    if not is_whole(leading, 0, MAX_SIDE):
        where = "before" if name == "leading" else "after"
        raise AttnconvError(f"{name} {shown_value(leading)} is invalid: give how many tokens come {where} the image "
                            f"positions, a whole number from 0 to {MAX_SIDE}")
    if grid is None:
        raise AttnconvError(f"{name}= places the image positions of a grid: give grid=(H, W) with it")
    return operator.index(leading)
