"""Attention captured from any model: the paper's question asked of modules attnconv did not write.

    records = capture_attention(model, images)          # one record per attention computation, in call order
    for r in records:
        r.path, r.kind, r.probs.shape                   # "blocks.0.attn", "sdpa", (heads, T, T)

One forward pass without autograd, in eval mode (the training mode is restored), sees:

- `SelfAttention2d` and the constructed layers (`ConvAttention`, multi-head and 2-d): their own
  `attention_probs` on the input a forward pre-hook sees (exact for position-only layers);
- `nn.MultiheadAttention`: recomputed from its inputs and weights in float64 (batch_first either
  way, attn_mask and key_padding_mask, bool or float, separate q/k/v projections, bias_k,
  add_zero_attn), whatever path the module itself takes;
- any call of `torch.nn.functional.multi_head_attention_forward` made outside such a module (a module that
  calls it itself, as CLIP's attention pooling does, or a subclass's `super().forward`): recomputed the same way
  from the call's own arguments (kind "multi_head_attention_forward");
- any call of `torch.nn.functional.scaled_dot_product_attention` (timm's and Hugging Face's ViTs): intercepted by a
  torch function mode while the model runs, the module's output unchanged; softmax(q k^T * scale + mask) recomputed
  in float64 from its q, k, attn_mask, scale, is_causal (and enable_gqa), and attributed to the innermost module
  running (module pre/post hooks). Calls made inside the layers above are theirs, not counted again.

Probabilities are averaged over the batch (the images, and whatever else the model folds into the batch, such as
windows). Tokens that are not image positions are found from `grid` (H, W) or from the token count and the images'
shape (a grid plus up to `MAX_EXTRA` leading tokens: a class token, registers; `captured.grid_readings`) and left out:
`probs` holds the model's probabilities between image positions (rows sum to one minus `extra_mass`, the attention the
left-out tokens took). Keys appended after the sequence (`bias_k`, `add_zero_attn`) are left out the same way. Tokens
that fit no image grid are all kept and the record says so (`size` None).

The per-head measures of `attnconv.analysis` work on the records through `attnconv.models.sites.captured_sites`
(`AttentionSite`s whose layers, `CapturedLayer`, follow the `AttentionLayer` protocol) or
`attnconv.analysis.analyze_captured`. They see each head's attention over the image positions, renormalized over them
(`image_probs`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from attnconv.attention import SelfAttention2d
from attnconv.construct import ConvAttention
from attnconv.construct.factory import torch_compiled
from attnconv.errors import AttnconvError, caller_warning, user_frame
from attnconv.limits import flag_argument, format_bytes
from attnconv.models.capture_numbers import (
    check_grid,
    check_images,
    check_leading,
    check_native_probs,
    check_own_attention,
    check_own_multihead,
    check_scores,
    chunks,
    own_rows_bad,
    row_pieces,
    same_output,
    sdpa_values_bounded,
    shared_tokens,
    softmax_parts,
    whole_bytes,
)
from attnconv.models.captured import (
    ANY_AFTER,
    KINDS,
    MAX_EXTRA,
    CapturedAttention,
    CapturedLayer,
    declared_layout,
    given_layout,
    guess_layout,
    image_tokens,
    left_out_note,
    multihead_value_maps,
)
from attnconv.modes import eval_mode

# The records and their helpers live in `captured.py`; they are this module's names too (its users import them here).
__all__ = ["KINDS", "MAX_BYTES", "MAX_EXTRA", "CapturedAttention", "CapturedLayer", "capture_attention",
           "image_tokens", "left_out_note", "multihead_value_maps"]

MAX_BYTES = 2 * 2**30  # the most bytes the captured probabilities may take, all computations together, by default
_NATIVE_BATCH = 16  # images per attention_probs call of a content SelfAttention2d / ConvAttention

class _Accumulator:
    """The sums of one computation's probabilities (and scores) over the batch, on the image tokens."""

    def __init__(self, capture: _Capture, heads: int, lq: int, sk: int, trailing: int, dtype: torch.dtype,
                 device: torch.device, where: str, entries: int, shared: tuple[str, ...] = ()):
        # A site's own layout first, then grid= and leading=, then the guess.
        known = capture.grids.get((where, capture.calls.get(where, 0)))  # a site's: any number after its grid
        lead, grid, trail = (*known, ANY_AFTER) if known else (capture.leading, capture.grid, capture.trailing)
        # Queries of every image are not its positions (not read: no guess said of them); the keys keep their grid.
        # Learned keys make no image grid (every token kept: neither side is read, no guess said of them).
        self.shared, sides = shared, [s for s in shared if s != "alike"]  # alike: read as the images' (one repeated)
        self.q = None if sides else capture.reading(lq, grid, lead, where, entries, trail)
        self.k = None if "keys" in sides else capture.reading(sk, grid, lead, where, entries, trail)
        if not sides and not (self.q and self.k):  # queries or keys on no grid: every token kept
            self.q = self.k = None
        self.lead_q, self.tq = (self.q[0], self.q[1][0] * self.q[1][1]) if self.q else (0, lq)
        self.lead_k, self.tk = (self.k[0], self.k[1][0] * self.k[1][1]) if self.k else (0, sk)
        self.trailing = sk - self.lead_k - self.tk + trailing  # keys after the image positions: appended, bias_k
        tq, tk, self.where, self.source = self.tq, self.tk, where, dtype
        self.dtype = torch.float64 if dtype == torch.float64 else torch.float32
        capture.reserve(heads * tq * tk * self.dtype.itemsize * (3 if capture.scores else 1), where,
                        f"{heads} heads x {tq} x {tk} tokens")
        self.probs = torch.zeros(heads, tq, tk, dtype=torch.float64, device=device)
        self.extra = torch.zeros(heads, tq, dtype=torch.float64, device=device)
        self.scores = {t: torch.zeros(heads, tq, tk, dtype=torch.float64, device=device)
                       for t in ("combined", "content")} if capture.scores else None
        self.count = 0
        self.dead = torch.zeros(entries, heads, lq, dtype=torch.bool, device=device)  # fully masked query rows

    def add(self, content: Tensor, combined: Tensor, probs: Tensor, row0: int = 0) -> None:
        """Add a chunk (n, heads, rows, S [+ appended keys]) of scores and probabilities: the query rows row0, row0 + 1,
        ... of n batch entries (all rows, or one piece of them: `row_pieces`; the entries count at row 0)."""
        check_scores(content, combined, self.source, self.where)
        e0 = self.count - (probs.shape[0] if row0 else 0)  # the first batch entry of the chunk
        self.dead[e0:e0 + probs.shape[0], :, row0:row0 + probs.shape[-2]] = torch.isneginf(combined).all(-1)
        a, b = max(row0, self.lead_q), min(row0 + probs.shape[-2], self.lead_q + self.tq)  # the image query rows
        if b > a:
            rows, keys = slice(a - row0, b - row0), slice(self.lead_k, self.lead_k + self.tk)
            t0, t1 = a - self.lead_q, b - self.lead_q  # where they go
            image = probs[..., rows, keys]
            self.probs[:, t0:t1] += image.sum(0)
            self.extra[:, t0:t1] += (probs[..., rows, :].sum(-1) - image.sum(-1)).sum(0)
            if self.scores is not None:
                self.scores["combined"][:, t0:t1] += combined[..., rows, keys].sum(0)
                self.scores["content"][:, t0:t1] += content[..., rows, keys].sum(0)
        if row0 == 0:
            self.count += probs.shape[0]

    def record(self, path: str, kind: str, call: int, module: nn.Module) -> CapturedAttention:
        n = max(self.count, 1)
        left = (self.lead_q, self.lead_k, self.trailing)
        return CapturedAttention(
            path=path, kind=kind, call=call, probs=self.probs.div_(n).to(self.dtype),  # in place: no second copy
            size=self.k[1] if self.k else None, query_size=self.q[1] if self.q else None, left_out=left,
            extra_mass=(self.extra / n).to(self.dtype) if any(left) else None, images=self.count, module=module,
            scores=None if self.scores is None else {t: s.div_(n).to(self.dtype) for t, s in self.scores.items()},
            shared=self.shared)


def _sdpa_record(capture: _Capture, where: str, args: tuple, kwargs: dict, out: Any) -> _Accumulator | None:
    """Recompute one scaled_dot_product_attention call's probabilities (float64), averaged over its batch; refused
    where the call's own output `out` shows its attention is not a number (`check_own_attention`)."""
    names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    q, k = bound["query"].detach(), bound["key"].detach()
    mask, causal, scale = bound.get("attn_mask"), bool(bound.get("is_causal", False)), bound.get("scale")
    if q.is_nested or k.is_nested:  # sequences of several lengths in one tensor
        capture.warn(f"{where or '(model)'}: a scaled_dot_product_attention call on nested tensors is not captured")
        return None
    if q.dim() < 2:
        raise AttnconvError(f"{where or '(model)'}: scaled_dot_product_attention with {q.dim()}-d queries; expected "
                            "(..., L, E)")
    if bound.get("enable_gqa") and min(k.dim(), q.dim()) >= 3 and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)  # each key head serves several query heads
    # Queries or keys of every image (broadcast over the images' dimension, or .expand's stride 0) are no image
    # positions: learned ones.
    copied = [o.dim() >= 3 and (t.dim() < o.dim() or t.shape[0] == 1 < o.shape[0] or 1 < t.shape[0] and t.stride(0) == 0)
              for t, o in ((q, k), (k, q))]
    shared = tuple(dict.fromkeys((shared_tokens(q, k, *copied) if max(q.dim(), k.dim()) >= 3 else ())
                                 + capture.target_sides()))
    batch = torch.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q, k = q.expand(*batch, *q.shape[-2:]), k.expand(*batch, *k.shape[-2:])
    heads = q.shape[-3] if q.dim() >= 4 else 1
    L, S, E = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(E) if scale is None else float(scale)
    qf, kf = q.reshape(-1, heads, L, E), k.reshape(-1, heads, S, E)
    if mask is not None:
        mask = mask.detach().expand(*q.shape[:-1], S).reshape(-1, heads, L, S)
    acc = _Accumulator(capture, heads, L, S, 0, q.dtype, q.device, where, qf.shape[0], shared)
    step = chunks(qf.shape[0], heads * L * S * 8 * 3)
    for i in range(0, qf.shape[0], step):
        kt = kf[i:i + step].double().transpose(-1, -2)
        for r0, r1 in row_pieces(L, step * heads * S * 8 * 3):
            content = torch.matmul(qf[i:i + step, :, r0:r1].double(), kt) * scale
            combined, probs = softmax_parts(content, None if mask is None else mask[i:i + step, :, r0:r1], causal, r0)
            acc.add(content, combined, probs, r0)
    if isinstance(out, Tensor) and sdpa_values_bounded(bound["value"], S, bound.get("dropout_p", 0.0), out.dtype):
        check_own_attention(own_rows_bad(out, qf.shape[0], L), acc.dead, where, out.dtype, "its output holds NaN or "
                            "inf there, its values finite and bounded")
    return acc


def _multihead_record(capture: _Capture, where: str, mha: nn.MultiheadAttention, args: tuple,
                      kwargs: dict, output: Any) -> _Accumulator:
    """Recompute an nn.MultiheadAttention call's probabilities from its inputs and weights, in float64 (checked
    against its own `output`: `capture_numbers.check_own_multihead`)."""
    names = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    e = mha.embed_dim
    same = mha._qkv_same_embed_dim
    w = (mha.in_proj_weight[:e], mha.in_proj_weight[e:2 * e], mha.in_proj_weight[2 * e:]) if same \
        else (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
    b = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.split(e)
    acc = _attention_record(capture, where, bound["query"], bound["key"], mha.batch_first, mha.num_heads, w[0], w[1],
                            b[0], b[1], mha.bias_k, mha.add_zero_attn, bound.get("key_padding_mask"),
                            bound.get("attn_mask"))
    check_own_multihead(acc.dead, acc.where, output, bound["value"], mha.batch_first, (w[2], b[2], mha.bias_v),
                         (mha.out_proj.weight, mha.out_proj.bias))
    return acc


def _functional_record(capture: _Capture, where: str, args: tuple, kwargs: dict, out: Any) -> _Accumulator | None:
    """Recompute a `F.multi_head_attention_forward` call (a module calling it itself, or a subclass's
    `super().forward`), sequence first as the function takes it, checked against its own output `out`; None for one
    whose keys are given already projected (`static_k`), which is said."""
    names = ("query", "key", "value", "embed_dim_to_check", "num_heads", "in_proj_weight", "in_proj_bias", "bias_k",
             "bias_v", "add_zero_attn", "dropout_p", "out_proj_weight", "out_proj_bias", "training")
    bound = dict(zip(names, args))
    bound.update(kwargs)
    if bound.get("static_k") is not None:
        capture.warn(f"{where or '(model)'}: a multi_head_attention_forward call with static_k (keys given already "
                     "projected) is not captured")
        return None
    e, w, b = int(bound["embed_dim_to_check"]), bound.get("in_proj_weight"), bound.get("in_proj_bias")
    w_q, w_k, w_v = (bound["q_proj_weight"], bound["k_proj_weight"], bound.get("v_proj_weight")) \
        if bound.get("use_separate_proj_weight") else (w[:e], w[e:2 * e], w[2 * e:])
    b_q, b_k, b_v = (None,) * 3 if b is None else b.split(e)
    acc = _attention_record(capture, where, bound["query"], bound["key"], False, int(bound["num_heads"]), w_q, w_k,
                            b_q, b_k, bound.get("bias_k"), bool(bound.get("add_zero_attn")),
                            bound.get("key_padding_mask"), bound.get("attn_mask"))
    value = bound["value"] if bound.get("static_v") is None and isinstance(w_v, Tensor) else None  # else unbounded
    check_own_multihead(acc.dead, acc.where, out, value, False, (w_v, b_v, bound.get("bias_v")),
                         (bound["out_proj_weight"], bound.get("out_proj_bias")))
    return acc


def _attention_record(capture: _Capture, where: str, query: Tensor, key: Tensor, batch_first: bool, h: int,
                      w_q: Tensor, w_k: Tensor, b_q: Tensor | None, b_k: Tensor | None, bias_k: Tensor | None,
                      add_zero_attn: bool, kpm: Tensor | None, attn_mask: Tensor | None) -> _Accumulator:
    """Multi-head attention's probabilities in float64 from its inputs, projections and masks (nn.MultiheadAttention's
    and `F.multi_head_attention_forward`'s conventions: bool masks are True where NOT allowed)."""
    query, key = query.detach(), key.detach()
    images = 0 if batch_first else 1  # learned queries or keys copied to every image with .expand: a stride of 0 there
    shared = shared_tokens(query, key, *(t.dim() == 3 and t.shape[images] > 1 and t.stride(images) == 0
                                         for t in (query, key)), images) if query.dim() == 3 else ()
    shared = tuple(dict.fromkeys(shared + capture.target_sides()))  # a decoder's target: none of the image's
    if query.dim() == 2:  # unbatched (L, E)
        query, key = query.unsqueeze(0), key.unsqueeze(0)
        kpm = None if kpm is None else kpm.unsqueeze(0)
    elif not batch_first:
        query, key = query.transpose(0, 1), key.transpose(0, 1)  # (B, L, E)
    B, L, e = query.shape
    S = key.shape[1]
    d = e // h
    q = F.linear(query.double(), w_q.detach().double(), None if b_q is None else b_q.detach().double())  # (B, L, E)
    k = F.linear(key.double(), w_k.detach().double(), None if b_k is None else b_k.detach().double())  # (B, S, E)
    for projected in (q, k):  # a half-precision projection past its dtype: the model's own q, k are inf
        check_scores(projected, None, query.dtype, where, "queries and keys")
    trailing = 0
    if bias_k is not None:
        k = torch.cat([k, bias_k.detach().double().reshape(1, 1, e).expand(B, 1, e)], dim=1)
        trailing += 1
    q = q.reshape(B, L, h, d).transpose(1, 2)  # (B, h, L, d)
    k = k.reshape(B, S + trailing, h, d).transpose(1, 2)
    if add_zero_attn:
        k = torch.cat([k, k.new_zeros(B, h, 1, d)], dim=2)
        trailing += 1
    # One additive float mask (B, h, L, S + trailing): bool masks are True where NOT allowed.
    mask = torch.zeros(B, h, L, S + trailing, dtype=torch.float64, device=q.device)

    def add(m: Tensor, shape: tuple[int, ...]) -> None:
        m = m.detach()
        m = torch.zeros(m.shape, dtype=torch.float64, device=m.device).masked_fill(m, -math.inf) \
            if m.dtype == torch.bool else m.double()
        m = F.pad(m, (0, S + trailing - m.shape[-1]))
        mask.add_(m.reshape(shape))

    if attn_mask is not None:
        add(attn_mask, (1, 1, L, S + trailing) if attn_mask.dim() == 2 else (B, h, L, S + trailing))
    if kpm is not None:
        add(kpm, (B, 1, 1, S + trailing))
    acc = _Accumulator(capture, h, L, S, trailing, query.dtype, query.device, where, B, shared)
    step = chunks(B, h * L * (S + trailing) * 8 * 3)
    for i in range(0, B, step):
        kt = k[i:i + step].transpose(-1, -2)
        for r0, r1 in row_pieces(L, step * h * (S + trailing) * 8 * 3):
            content = torch.matmul(q[i:i + step, :, r0:r1], kt) / math.sqrt(d)
            combined, probs = softmax_parts(content, mask[i:i + step, :, r0:r1], False, r0)
            acc.add(content, combined, probs, r0)
    return acc


def _native_record(capture: _Capture, where: str, layer: nn.Module, x: Tensor) -> CapturedAttention:
    """A SelfAttention2d / ConvAttention's own probabilities on its input x (B, C, H, W)."""
    size = (int(x.shape[-2]), int(x.shape[-1]))
    out = tuple(layer.output_size(size)) if hasattr(layer, "output_size") else size
    t_in, t_out = size[0] * size[1], out[0] * out[1]
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    capture.reserve(layer.heads * t_out * t_in * dtype.itemsize * (3 if capture.scores else 1), where,
                    f"{layer.heads} heads x {t_out} x {t_in} tokens")
    scores = None
    if layer.position_only:
        probs = layer.attention_probs(size=size)[0]
    else:
        probs = sum(layer.attention_probs(part).sum(0).double() for part in x.split(_NATIVE_BATCH)) / len(x)
    check_native_probs(probs, where, x.dtype)
    if capture.scores and hasattr(layer, "attention_scores"):
        terms = [layer.attention_scores(part) for part in x.split(_NATIVE_BATCH)]
        scores = {t: sum(s[t].double().expand(len(part), *s[t].shape[1:]).sum(0)
                         for s, part in zip(terms, x.split(_NATIVE_BATCH))).to(dtype) / len(x)
                  for t in terms[0]}
    kind = "ConvAttention" if isinstance(layer, ConvAttention) else "SelfAttention2d"
    return CapturedAttention(path=where, kind=kind, call=0, probs=probs.to(dtype), size=size, query_size=out,
                             left_out=(0, 0, 0), extra_mass=None, images=len(x), module=layer, scores=scores)


def _native_grid(capture: _Capture, where: str, layer: nn.Module, x: Tensor) -> CapturedAttention:
    """A SelfAttention2d / ConvAttention's call without its probabilities (`probs` empty): where it is, on which grid."""
    size = (int(x.shape[-2]), int(x.shape[-1]))
    out = tuple(layer.output_size(size)) if hasattr(layer, "output_size") else size
    kind = "ConvAttention" if isinstance(layer, ConvAttention) else "SelfAttention2d"
    return CapturedAttention(path=where, kind=kind, call=0, probs=x.new_empty(0), size=size, query_size=out,
                             left_out=(0, 0, 0), extra_mass=None, images=len(x), module=layer)


def plain_multihead(module: nn.Module) -> bool:
    """An nn.MultiheadAttention that runs nn.MultiheadAttention's own forward, the one whose probabilities
    `_multihead_record` recomputes from its weights. A subclass with a forward of its own is recomputed so only
    when its output is that forward's (`_Capture.post`); else (torch's quantizable one, a user's with a locality
    bias) its SDPA calls are captured instead."""
    return isinstance(module, nn.MultiheadAttention) and type(module).forward is nn.MultiheadAttention.forward


def first_input(args: tuple, kwargs: dict) -> Tensor | None:
    """A layer's input as its forward pre-hook sees it: the first positional argument, or `x=` (`layer(x=...)`)."""
    if args:
        return args[0]
    x = kwargs.get("x", next(iter(kwargs.values()), None))
    return x if isinstance(x, Tensor) else None


def native_layer(module: nn.Module) -> bool:
    """The layers whose own attention_probs are used (as `attention_sites` lists them)."""
    return isinstance(module, SelfAttention2d) or (isinstance(module, ConvAttention) and module.ndim == 2
                                                   and module.heads > 1)


class _Capture(TorchFunctionMode):
    """The pass: a stack of the modules running (pre/post hooks), records in call order, the byte budget."""

    def __init__(self, model: nn.Module, grid: Sequence[int] | None, max_bytes: int, scores: bool,
                 native_probs: bool = True, aspect: Sequence[int] | None = None,
                 grids: dict[tuple[str, int], tuple[int, tuple[int, int]]] | None = None, leading: int | None = None,
                 images: int = 1, trailing: int | None = None, deferred: list | None = None):
        super().__init__()
        self.deferred = deferred  # its warnings, held while the model runs (under the caller's filters, not the model's)
        self.grid, self.max_bytes, self.scores, self.native_probs = grid, max_bytes, scores, native_probs
        self.aspect, self.leading, self.trailing = aspect, leading, trailing
        self.grids = dict(grids or {})  # (path, call) -> (leading tokens, grid) of that computation, known beforehand
        self.guessed: set[str] = set()  # the guesses said (once a pass)
        self.images = images  # how many images the pass runs on (the batch of a call on the images' tokens)
        self.caller = user_frame()  # where the pass was asked for: its warnings point there
        self.declared = declared_layout(model, aspect)  # the model's own word on where its tokens lie
        self.grid_used = False  # whether grid= fitted some computation (else it is said)
        self.names = {m: name for name, m in model.named_modules()}
        self.stack: list[nn.Module] = []
        self.records: list[CapturedAttention] = []
        self.calls: dict[str, int] = {}
        self.warned: set[nn.Module] = set()
        self.current: nn.Module | None = None  # the module whose attention computation is being recomputed
        self.after: list[tuple | None] = []  # per running module: what post() records once its forward has run
        self.quiet = 0  # > 0 while a subclass's output is computed as nn.MultiheadAttention's, to compare
        self.total = 0

    def target_sides(self) -> tuple[str, ...]:
        """The sides of the computation of `current` that are a torch decoder layer's target, which every layer after
        the first has mixed with the image: where a decoder layer is the innermost transformer layer running (an
        encoder layer inside one is over its own tokens), its queries, whatever the module or its name, and the keys
        too but in its cross-attention (`multihead_attn`, or a module inside it), whose keys are the memory."""
        layer = next((m for m in reversed(self.stack) if isinstance(m, (nn.TransformerDecoderLayer,
                                                                          nn.TransformerEncoderLayer))), None)
        if not isinstance(layer, nn.TransformerDecoderLayer):
            return ()
        inside = self.stack[self.stack.index(layer) + 1:] + [self.current]
        cross = any(m is layer.multihead_attn for m in inside) and layer.multihead_attn is not layer.self_attn
        return ("queries", "target") if cross else ("queries", "keys", "target")

    def reserve(self, nbytes: int, where: str, what: str) -> None:
        """Count a computation's result before it is allocated; refuse past max_bytes."""
        self.total += nbytes
        if self.total > self.max_bytes:
            raise AttnconvError(
                f"capture_attention: {where or '(model)'} ({what}) brings the captured attention to "
                f"{format_bytes(self.total)}, more than max_bytes {format_bytes(self.max_bytes)}; give smaller "
                "images (fewer tokens) or a larger max_bytes")

    def warn(self, message: str, guess: bool = False) -> None:
        """An AttnconvWarning at the line that asked for the pass (its caller's frame outside attnconv), not a line of
        the model's forward or of attnconv, so that each call site of a notebook or script shows its own."""
        say = caller_warning(self.caller, message)
        say.guess, say.text = guess, message  # a layout guessed (`reading`), not why a computation was not captured
        self.deferred.append(say)

    def reading(self, count: int, grid: tuple[int, int] | None, leading: int | None, where: str,
                entries: int, trailing: int | None = None) -> tuple[int, tuple[int, int]] | None:
        """Where `count` tokens lie: on `grid` where it fits (`grid_fits`), else where the model declares, else the
        guess (`guess_layout`), said once a count where it is not sure (the fix being grid=)."""
        declared = self.declared if self.declared is not None \
            and count == self.declared[0] + self.declared[1][0] * self.declared[1][1] else None
        reading, said = given_layout(count, grid, leading, trailing, self.aspect, entries, self.images, declared) \
            if grid is not None else (None, None)
        if reading is not None:
            self.grid_used |= grid == self.grid
        elif declared is not None:
            return declared  # what the model declares (attnconv's ViT, timm's num_prefix_tokens and patch size)
        else:
            reading, said = guess_layout(count, self.aspect, entries, self.images)
        if said is not None and said not in self.guessed:
            self.guessed.add(said)
            self.warn(f"{where or '(model)'}: {said}", guess=True)
        return reading

    def _inside_owner(self) -> bool:
        """True inside a layer whose attention is taken from the layer itself (its own SDPA calls are its)."""
        return any(native_layer(m) or plain_multihead(m) for m in self.stack)

    def _add(self, path: str, module: nn.Module, kind: str, made: _Accumulator | CapturedAttention) -> None:
        call = self.calls.get(path, 0)
        self.calls[path] = call + 1
        if isinstance(made, CapturedAttention):
            made.call = call
            self.records.append(made)
        else:
            self.records.append(made.record(path, kind, call, module))

    def pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        owned = self._inside_owner()
        self.stack.append(module)  # first: what the layer computes below is its own
        self.after.append(None)
        if owned:
            return
        where = self.names.get(module, "")
        x = first_input(args, kwargs) if native_layer(module) else None
        if x is not None:
            record = _native_record if self.native_probs else _native_grid
            self._add(where, module, "", record(self, where, module, x.detach()))
        elif plain_multihead(module):  # recomputed once its own forward has run (a call torch refuses: torch's words)
            self.after[-1] = (len(self.records), args, kwargs, None, where)
        elif isinstance(module, nn.MultiheadAttention):  # a subclass: is its output nn.MultiheadAttention's?
            self.quiet += 1
            try:
                expected = nn.MultiheadAttention.forward(module, *args, **kwargs)
            except Exception:  # noqa: BLE001  (a forward of other arguments: not nn.MultiheadAttention's)
                expected = None
            finally:
                self.quiet -= 1
            self.after[-1] = (len(self.records), args, kwargs, expected, where)

    def post(self, module: nn.Module, args: tuple, output: Any) -> None:
        if not (self.stack and self.stack[-1] is module):
            return
        self.stack.pop()
        after = self.after.pop()
        if after is None or output is None:  # nothing to add, or the forward raised
            return
        start, args, kwargs, expected, where = after
        if not plain_multihead(module) and not same_output(output, expected):
            # Not nn.MultiheadAttention's output on this call (or a forward that takes other arguments): its attention
            # is what it computes inside (SDPA, multi_head_attention_forward: a super().forward), said when nothing.
            if len(self.records) == start and module not in self.warned:
                self.warned.add(module)
                how = "computes something else than" if expected is not None else "takes other arguments than"
                self.warn(
                    f"{where or '(model)'}: {type(module).__name__} subclasses nn.MultiheadAttention and {how} "
                    "nn.MultiheadAttention's forward, and no attention computation inside it was seen "
                    "(scaled_dot_product_attention, multi_head_attention_forward): its attention is not captured")
            return
        for r in self.records[start:]:  # its own calls inside (a subclass's): the whole computation replaces them
            self.calls[r.path] -= 1
        del self.records[start:]
        self.current = module
        self._add(where, module, "MultiheadAttention", _multihead_record(self, where, module, args, kwargs, output))

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # Called with this mode off: the torch calls below are not intercepted again.
        kwargs = kwargs or {}
        out = func(*args, **kwargs)  # first: a call torch refuses fails with torch's own words, not the recomputation's
        if func in (F.scaled_dot_product_attention, F.multi_head_attention_forward) and not self.quiet \
                and not self._inside_owner():
            module = self.current = self.stack[-1] if self.stack else None
            where = self.names.get(module, "") if module is not None else ""
            if func is F.scaled_dot_product_attention:
                made = _sdpa_record(self, where, args, kwargs, out)
                if made is not None:
                    self._add(where, module, "sdpa", made)
            else:  # with the mode off inside it, its own SDPA call is not seen: the whole call is one record
                made = _functional_record(self, where, args, kwargs, out)
                if made is not None:
                    self._add(where, module, "multi_head_attention_forward", made)
        return out


@torch.no_grad()
def capture_attention(model: nn.Module, images: Tensor, grid: Sequence[int] | None = None, *,
                      leading: int | None = None, trailing: int | None = None, max_bytes: int = MAX_BYTES,
                      scores: bool = False) -> list[CapturedAttention]:
    """Every attention computation of one forward pass of `model` on `images`, in call order (see the module doc).

    images: the batch the model takes (normalized as it was trained). grid: (H, W) of the image
    positions among the tokens, when the token count cannot tell (non-square grids); the tokens
    beyond them are taken to come first (a class token, registers), unless `leading` (with `grid`)
    says how many come first: the rest come after the image positions (tokens the model appends, at
    most MAX_EXTRA, or exactly `trailing`) and are left out too. A sequence that the grid does not fit
    is read as without it; a guess that is not sure is said (`captured.guess_layout`). max_bytes:
    the captured probabilities of all computations together may take at most this; the computation
    that would pass it is refused (AttnconvError) before its probabilities are allocated. It bounds what
    is kept, not the peak: while one computation is recomputed, its float64 sums (twice its float32
    probabilities, three times that with `scores`) and one chunk of float64 intermediates of about 64 MiB
    (a batch entry larger than that is recomputed a piece of query rows at a time) are allocated besides.
    scores: also keep the pre-softmax scores (the explorer's `mode=scores`). The model runs in eval
    mode without autograd; its training mode is restored, hooks removed and the function mode left
    however the pass ends. Two passes of one model at once would see each other's hooks: callers
    sharing a model across threads lock.
    """
    grid = check_grid(grid)
    leading, trailing = check_leading(leading, grid), check_leading(trailing, grid, "trailing")
    check_images(images, grid)
    max_bytes, scores = whole_bytes(max_bytes), flag_argument(scores, "scores")
    check_capturable(model, "capture_attention")
    return capture_pass(model, images, grid, max_bytes, scores, native_probs=True, leading=leading, trailing=trailing)


def check_capturable(model: nn.Module, what: str) -> None:
    """One AttnconvError unless `model` runs its Python forward, where attention is seen: not TorchScript (traced
    or scripted: its calls run outside Python, and a traced one would give no records, silently) and without a
    torch.compile wrapper (a captured graph; its hooks and function modes are not the module's)."""
    if not isinstance(model, nn.Module):
        raise AttnconvError(f"{what} takes an nn.Module, got {type(model).__name__}")
    scripted = next((name for name, m in model.named_modules() if isinstance(m, torch.jit.ScriptModule)), None)
    if scripted is not None:
        where = "the model" if not scripted else f"its module {scripted}"
        raise AttnconvError(f"{what}: {where} is compiled by torch.jit.script or traced by torch.jit.trace, whose "
                            "forward runs outside Python, where its attention cannot be seen; give the nn.Module it "
                            "was made from")
    compiled = next((name for name, m in model.named_modules() if torch_compiled(m)), None)
    if compiled is not None:
        where = "the model" if not compiled else f"its module {compiled}"
        raise AttnconvError(f"{what}: {where} is compiled by torch.compile, which runs a captured graph, where its "
                            "attention cannot be seen; give the module it wraps (its _orig_mod)")
    meta = next((name for name, t in (*model.named_parameters(), *model.named_buffers()) if t.is_meta), None)
    if meta is not None:
        raise AttnconvError(f"{what}: the model's {meta} is on the meta device, which holds no values; load its "
                            "weights first (model.to_empty(device=...), then load_state_dict)")


def capture_pass(model: nn.Module, images: Tensor, grid: Sequence[int] | None, max_bytes: int, scores: bool, *,
                 native_probs: bool, leading: int | None = None, trailing: int | None = None,
                 grids: dict[tuple[str, int], tuple[int, tuple[int, int]]] | None = None,
                 deferred: list | None = None) -> list[CapturedAttention]:
    """`capture_attention`'s pass. native_probs False: the records of `SelfAttention2d` / `ConvAttention` layers
    hold their input grid only (`probs` empty), for `attention_sites`, which takes their probabilities from the
    layers themselves. grids: {(path, call): (leading tokens, (H, W))}, each computation's layout where it is known
    (the attention sites'), before `grid` and `leading` and the guess. The pass's own warnings are held while the
    model runs (its own warning filters are not the caller's) and said after it, at the caller's line with its module
    and registry; deferred: a list to hold them in instead (callables that say them), for the caller to say or not."""
    aspect = tuple(images.shape[-2:]) if images.dim() == 4 else None  # non-square images: their grids' shape
    capture = _Capture(model, grid, max_bytes, scores, native_probs, aspect, grids, leading,
                       len(images) if images.dim() >= 1 else 1, trailing, [] if deferred is None else deferred)
    with contextlib.ExitStack() as stack:
        stack.enter_context(eval_mode(model))
        for m in model.modules():
            stack.callback(m.register_forward_pre_hook(capture.pre, with_kwargs=True).remove)
            stack.callback(m.register_forward_hook(capture.post, always_call=True).remove)
        with capture:
            model(images)
    for r in capture.records:
        r.image_size = aspect
    if grid is not None and not capture.grid_used and capture.records:
        counts = sorted({int(r.probs.shape[-1]) + sum(r.left_out[1:]) for r in capture.records
                         if r.kind not in ("SelfAttention2d", "ConvAttention")})
        if counts:
            capture.warn(
                f"grid=({grid[0]}, {grid[1]}) fits none of the model's attention computations (of "
                f"{', '.join(map(str, counts[:5]))} tokens): " + (
                    f"a grid alone places at most {MAX_EXTRA} tokens besides it; give leading= (and trailing=) with "
                    "it for more, or the grid the image positions have" if leading is None and trailing is None else
                    "give the grid, leading= and trailing= the image positions have"))
    for say in capture.deferred if deferred is None else ():
        say()
    return capture.records
