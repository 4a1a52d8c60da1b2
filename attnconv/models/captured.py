"""What `capture_attention` gives: one record per attention computation, and the record as an attention layer.

    r = capture_attention(model, images)[0]      # a CapturedAttention: path, kind, probs (heads, T_q, T_k), size
    r.image_probs()                                # its attention over the image positions, rows renormalized
    CapturedLayer(...)                             # the record as an `AttentionLayer`, for the per-head measures

`image_tokens` places a token count on an image grid (the leading tokens that are not image positions left out),
`left_out_note` says in words what was left out, and `multihead_value_maps` gives an nn.MultiheadAttention's
value maps (Lemma 1). The pass that makes the records is `attnconv.models.capture`.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnconv.errors import AttnconvError

# The most leading tokens the guess reads as not image positions (class token, distillation token, registers);
# a grid given places any number.
MAX_EXTRA = 32

KINDS = ("SelfAttention2d", "ConvAttention", "MultiheadAttention", "multi_head_attention_forward", "sdpa")


def left_out_note(left_out: tuple[int, int, int]) -> str:
    """(leading query tokens, leading key tokens, trailing keys) left out, in words ('' for none)."""
    lead_q, lead_k, trail = left_out
    parts = []
    if lead_k or lead_q:
        n = max(lead_q, lead_k)
        parts.append(f"{n} leading token{'s' if n > 1 else ''} (class token, registers) left out")
    if trail:
        parts.append(f"{trail} trailing token{'s' if trail > 1 else ''} (appended tokens, bias_k, zero attention) "
                     "left out")
    return "; ".join(parts)


# What a reading costs. Its leading tokens: none, a class token (1), or the counts models use (a class and a
# distillation token, 4, 8 or 16 registers with or without a class token) cost little; any other count more, the
# more the more tokens. Its grid: the images' patch grid (H / p x W / p, p dividing both) nothing; a patch size
# that leaves pixels over (H // p x W // p: a convolution without padding) or pads (the rounded-up grid) some; a
# grid the images' patches do not give (a model that resized them) more.
COMMON_LEADING, COMMON_COST = frozenset({2, 4, 5, 8, 9, 16, 17}), 2
FLOOR_COST, CEIL_COST, RESIZED_COST = 3, 4, 6
# Patch sides models use; a patch grid of another side costs UNCOMMON_PATCH_COST more.
COMMON_PATCHES, UNCOMMON_PATCH_COST = frozenset({1, 2, 4, 7, 8, 14, 16, 32}), 3
# Readings less than this much apart from the best are close enough that the guess is said (`close_reading`).
CLOSE = 4


def leading_cost(lead: int) -> float:
    """What `lead` leading tokens cost a reading (`grid_readings`)."""
    return lead if lead <= 1 else COMMON_COST if lead in COMMON_LEADING else COMMON_COST + lead / 2


def grid_readings(count: int, images: Sequence[int] | None = None) -> tuple[tuple[float, int, tuple[int, int]], ...]:
    """Every way to read `count` tokens as leading tokens then a grid, best first: (cost, leading, (H, W)).

    Without `images` (the images' (H, W); None too for tokens of windows folded into the batch, whose grid is not
    the images'): squares of side >= 2. With it, the images' patch grids for each patch size p (H / p x W / p where
    p divides both, else H // p x W // p at FLOOR_COST or the rounded-up grid at CEIL_COST; UNCOMMON_PATCH_COST more
    for a side not in COMMON_PATCHES), and squares and the images' shape at other scales (a model that resized
    them) at RESIZED_COST. Each adds `leading_cost` of its leading tokens (at most MAX_EXTRA): 37 tokens of 16x32
    images are 5 leading tokens and 4x8 (cost 2) before one and a 6x6 square (7); 64 tokens, 8x8 (6) before 14 and
    5x10 (15); 35 of 30x20, 7x5 (3). Ties go to the fewer leading tokens. Tokens are row-major, as a patch
    embedding's flatten gives them. Computed once a (count, images' shape): a pass asks for each computation's.
    """
    known = images is not None and min(int(images[0]), int(images[1])) >= 1
    return _readings(int(count), (int(images[0]), int(images[1])) if known else None)


@functools.lru_cache(maxsize=1024)
def _readings(count: int, shape: tuple[int, int] | None) -> tuple[tuple[float, int, tuple[int, int]], ...]:
    costs: dict[tuple[int, tuple[int, int]], float] = {}

    def add(h: int, w: int, cost: float) -> None:
        lead = count - h * w
        if h * w >= 2 and 0 <= lead <= MAX_EXTRA:
            key = (lead, (h, w))
            costs[key] = min(costs.get(key, math.inf), leading_cost(lead) + cost)

    known = shape is not None
    if known:
        H, W = shape
        for patch in range(1, max(H, W) + 1):
            side = 0 if patch in COMMON_PATCHES else UNCOMMON_PATCH_COST
            if H % patch == 0 and W % patch == 0:
                add(H // patch, W // patch, side)
            else:
                add(H // patch, W // patch, side + FLOOR_COST)
                add(-(-H // patch), -(-W // patch), side + CEIL_COST)
        g = math.gcd(H, W)
        a, b = H // g, W // g
        for k in range(1, math.isqrt(count // (a * b)) + 1):
            add(a * k, b * k, RESIZED_COST)
    for side in range(max(2, math.isqrt(max(count - MAX_EXTRA, 0))), math.isqrt(count) + 1):
        add(side, side, RESIZED_COST if known else 0)
    return tuple(sorted(((c, lead, grid) for (lead, grid), c in costs.items()), key=lambda r: (r[0], r[1])))


ANY_AFTER = -1  # `grid_fits`'s `trailing` for a layout known for its computation: any number after the grid


def grid_fits(count: int, grid: Sequence[int] | None, leading: int | None = None, trailing: int | None = None
              ) -> tuple[int, tuple[int, int]] | None:
    """(leading tokens, (H, W)) where the given `grid` fits `count` tokens, else None: H*W of them and at most
    MAX_EXTRA besides, all leading; or, with `leading`, that many first (any number) and at most MAX_EXTRA after the
    image positions, or with `trailing` too, exactly that many after them (any number; ANY_AFTER: any number). (A
    grid given for one computation is not laid on a longer sequence of another.)"""
    if grid is None:
        return None
    h, w = (int(v) for v in grid)
    besides = count - h * w
    if leading is None and trailing is None:
        return (besides, (h, w)) if 0 <= besides <= MAX_EXTRA else None
    first = besides - max(trailing or 0, 0) if leading is None else leading
    after = besides - first
    if first >= 0 and after >= 0 and (trailing == ANY_AFTER or (after == trailing if trailing is not None
                                                                  else after <= MAX_EXTRA)):
        return first, (h, w)
    return None


def given_layout(count: int, grid: tuple[int, int], leading: int | None, trailing: int | None,
                 images: Sequence[int] | None, entries: int, n_images: int, declared: Reading | None = None
                 ) -> tuple[Reading | None, str | None]:
    """Where a grid given (`grid=`, with `leading=` and `trailing=` or not) places `count` tokens: (the reading, or
    None where it does not fit; what to say of it, or None). Where it took leading tokens itself (or trailing ones,
    after as many leading as the other reading has) and the computation reads surely as something else, or as the
    model `declared` it (`guess_layout`: 50 tokens of 80x160 images are
    5x10, not a class token and a 7x7 grid given for another computation; a Swin's windows under a grid given for its
    last stage), that reading is kept, and said. Otherwise, laid with tokens it did not place itself (more than one
    taken as leading, or any taken as appended) it is a guess too: said."""
    placed = grid_fits(count, grid, leading, trailing)
    if placed is None:
        return None, None
    besides = count - grid[0] * grid[1]
    inferred_lead = placed[0] if leading is None else 0
    inferred_after = besides - placed[0] if trailing is None else 0
    if inferred_lead == 0 and inferred_after == 0:
        return placed, None
    given = _grid_words(*placed) + (f", trailing={inferred_after}" if inferred_after else "")
    own, said = (declared, None) if declared is not None else guess_layout(count, images, entries, n_images)
    # Not over a leading= given that the reading does not share (leading=0 for a token the model appends: T1).
    if own is not None and said is None and own != placed and (leading is None or inferred_after and own[0] == leading):
        return own, (f"{count} tokens fit grid=({grid[0]}, {grid[1]}) only with {besides} token{'s' * (besides > 1)} "
                     f"besides it, while they read {'as the model declares' if declared else 'surely'} as "
                     f"{reading_words(*own)}: read so; pass {given} to lay the grid there")
    if inferred_lead <= 1 and inferred_after == 0:
        return placed, None
    return placed, (f"{count} tokens are read on grid=({grid[0]}, {grid[1]}) with {besides} token{'s' * (besides > 1)} "
                    "besides it, a "
                    f"guess: pass {given} to confirm it, or the leading= and trailing= they have")


def image_tokens(count: int, grid: Sequence[int] | None = None, aspect: Sequence[int] | None = None,
                 leading: int | None = None) -> tuple[int, tuple[int, int]] | None:
    """(leading tokens that are not image positions, (H, W)) for a sequence of `count` tokens, or None.

    With `grid` (H, W) that fits (`grid_fits`): there. Otherwise (no grid, or one this sequence does
    not fit) the best of `grid_readings(count, aspect)`, aspect being the images' (H, W) (50 tokens
    of 28x28 images: a class token and 7x7; 37 of 16x32: 5 and 4x8).
    """
    placed = grid_fits(count, grid, leading)
    if placed is not None:
        return placed
    readings = grid_readings(count, aspect)
    return (readings[0][1], readings[0][2]) if readings else None


# The most copies of its batch a model is taken to make (test-time augmentation: flips, five or ten crops, the eight
# views of a square); more windows an image than that are not a batch repeated.
REPEATS = 16
TILED, LOOSE = 1, 2  # `windows_folded`'s kinds of windows


def windows_folded(count: int, entries: int, images: int, shape: Sequence[int] | None) -> int:
    """Whether a call whose batch holds `entries` sequences of `count` tokens, in a pass over `images` images of
    `shape` (H, W), has the images' windows folded into its batch: 0 if not, TILED or LOOSE if so. Square windows
    (`count` a square, side >= 2), more entries than images, as many windows an image as tile a patch grid of the
    images (a patch side in COMMON_PATCHES), padded to whole windows or not (7x7 windows of 224x168 images: patch 4
    gives 56x42 tokens, 8x6 = 48 windows an image): TILED where they are at least two each way and one set an image,
    as a Swin's; LOOSE for one row or column of them (wide images, a grid shorter than a window padded up to one), or
    up to REPEATS sets an image (a batch repeated around a windowed model), which is read as windows and said. A
    batch repeated (test-time augmentation, crops) or cut into chunks is not windows where no tiling gives its count.
    """
    side = math.isqrt(count)
    if shape is None or side < 2 or side * side != count or entries <= images or entries % images:
        return 0
    per, (H, W), kind = entries // images, (int(shape[0]), int(shape[1])), 0
    for p in sorted(COMMON_PATCHES):
        for h, w in ((H // p, W // p), (-(-H // p), -(-W // p))):
            rows, cols = -(-h // side), -(-w // side)
            if rows * cols >= 2 and per % (rows * cols) == 0 and per // (rows * cols) <= REPEATS:
                if h >= side and w >= side and rows >= 2 and cols >= 2 and per == rows * cols:
                    return TILED
                kind = LOOSE
    return kind


def declared_layout(model: nn.Module, shape: Sequence[int] | None) -> tuple[int, tuple[int, int]] | None:
    """(leading tokens, (H, W)) that `model` declares for images of `shape`, else None: its own `token_layout(shape)`
    (attnconv's ViT), or timm's convention, `num_prefix_tokens` before the patch grid of `patch_embed.patch_size`
    (rounded up with `dynamic_img_pad`). What a model declares needs no guess."""
    if shape is None:
        return None
    declaring = next((m for m in model.modules() if callable(_attribute(m, "token_layout"))
                      or isinstance(_attribute(m, "num_prefix_tokens"), int)), model)  # a wrapped model's too
    layout = _declared(declaring, int(shape[0]), int(shape[1]))
    return layout if layout is not None and layout[1][0] * layout[1][1] >= 2 else None  # one position is no grid


def _attribute(module: nn.Module, name: str) -> object:
    """`module`'s attribute `name`, None where it has none or it fails (a property that raises declares nothing)."""
    try:
        return getattr(module, name, None)
    except Exception:  # noqa: BLE001  (the model's own code, whatever it raises)
        return None


def _declared(model: nn.Module, H: int, W: int) -> tuple[int, tuple[int, int]] | None:
    try:
        own = getattr(model, "token_layout", None)
        if callable(own):
            lead, (h, w) = own((H, W))
        else:
            lead, embed = getattr(model, "num_prefix_tokens", None), getattr(model, "patch_embed", None)
            patch = getattr(embed, "patch_size", None)
            if not isinstance(lead, int) or patch is None:
                return None
            ph, pw = (patch, patch) if isinstance(patch, int) else (patch[0], patch[1])
            pad = bool(getattr(embed, "dynamic_img_pad", False))
            h, w = (-(-H // ph), -(-W // pw)) if pad else (H // ph, W // pw)
    except Exception:  # noqa: BLE001  (a declaration that fails declares nothing: the tokens are guessed)
        return None
    values = (lead, h, w)
    if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values) or lead < 0 or h < 1 \
            or w < 1:
        return None  # not whole numbers (a leading count >= 0, a grid of positive sides): declares nothing
    return int(lead), (int(h), int(w))


def close_reading(count: int, images: Sequence[int] | None) -> tuple[int, tuple[int, int]] | None:
    """The second reading of `count` tokens when it is about as likely as the first (costs less than CLOSE apart),
    else None: then the guess is only a guess, and `grid=` should settle it."""
    readings = grid_readings(count, images)
    if len(readings) > 1 and readings[1][0] - readings[0][0] < CLOSE:
        return readings[1][1], readings[1][2]
    return None


Reading = tuple[int, tuple[int, int]]


def reading_words(lead: int, grid: tuple[int, int]) -> str:
    """A reading in words: "3x5 after 1 leading token"."""
    return f"{grid[0]}x{grid[1]}" + (f" after {lead} leading token{'s' * (lead > 1)}" if lead else "")


def sure_reading(reading: Reading, images: Sequence[int] | None) -> bool:
    """Whether a reading needs no word: the images' patch grid for a patch side models use that divides both sides,
    after no leading token or one (a class token). Any other is a guess, said."""
    if images is None or min(int(images[0]), int(images[1])) < 1:
        return False
    lead, grid = reading
    return lead <= 1 and grid in _exact_grids(int(images[0]), int(images[1]))


def _exact_grids(H: int, W: int) -> list[tuple[int, int]]:
    """The images' patch grids for the patch sides in COMMON_PATCHES that divide both sides (two positions or more)."""
    return [(H // p, W // p) for p in sorted(COMMON_PATCHES) if H % p == 0 and W % p == 0 and H * W // p // p >= 2]


def guess_layout(count: int, images: Sequence[int] | None, entries: int, n_images: int
                 ) -> tuple[Reading | None, str | None]:
    """Where `count` tokens of a call lie when nothing places them: (the reading, or None for no grid; what to say
    of it, or None). `images`: the images' (H, W) (None if unknown); the call's batch holds `entries` sequences in a
    pass over `n_images` images. Windows folded into the batch (`windows_folded`) are read by the count alone, the
    rest with the images' shape (`image_tokens`). Silent only where sure: the images' patch grid after at most a
    class token (`sure_reading`), or windows TILED, with no rival. Said otherwise, with the `grid=` (and `leading=`)
    that confirms the reading or chooses a rival: a second reading about as likely (`close_reading`); for windows,
    the images' sure readings (up to REPEATS sets an image: 6 copies of 9x16 tokens are 6 windows of 12x12 too;
    against LOOSE windows the sure reading is the one read, the windows said where they differ); and exact patch
    grids of the images after more than MAX_EXTRA leading tokens (fewer than their own), where the guess is a grid
    the images' patches do not give (57 registers and 8x8 read as 11x11)."""
    folded, per, rivals = windows_folded(count, entries, n_images, images), entries // max(n_images, 1), None
    own = image_tokens(count, None, images)
    if folded == LOOSE and per <= REPEATS and sure_reading(own, images):
        folded, window = 0, image_tokens(count, None, None)  # loose windows, or the images' own grid repeated:
        rivals = [([window], "fits windows folded into the batch (one row of them, or several sets an image)")] \
            if window != own else []  # the repeat is the likelier
    shape = None if folded else images
    reading = image_tokens(count, None, shape)
    if reading is None:
        return None, None
    if rivals is None:
        rivals = _rivals(count, images, folded, per, reading)
    of = f"{shape[0]}x{shape[1]} images" if shape else "images (windows folded into the batch)" if images else \
        "images"
    said = f"{count} tokens of {of} are read as {reading_words(*reading)}, a guess: "
    if rivals:
        return reading, said + "; ".join(" or ".join(reading_words(*r) for r in group) + f" {why}"
                                         for group, why in rivals) + "; if the image positions lie there, pass " + \
            " or ".join(_grid_words(*r) for group, _ in rivals for r in group)
    if folded == LOOSE:
        why = "windows in one row or column, or several sets of them an image (a batch repeated around them)"
    elif not folded and not sure_reading(reading, images):
        why = "not the images' patch grid after at most a class token"
    else:
        return reading, None
    return reading, said + f"{why}; pass {_grid_words(*reading)} to confirm it, or the grid= and leading= of the image " \
        "positions"


def _grid_words(lead: int, grid: tuple[int, int]) -> str:
    return f"grid=({grid[0]}, {grid[1]})" + (f", leading={lead}" if lead else "")


def _rivals(count: int, images: Sequence[int] | None, folded: int, per: int, guess: Reading
            ) -> list[tuple[list[Reading], str]]:
    """`guess_layout`'s rival readings of `count` tokens, in groups with why they are, in words ([] for none)."""
    close = close_reading(count, None if folded else images)
    found = [([close], "fits about as well")] if close is not None else []
    if images is None or min(int(images[0]), int(images[1])) < 1:
        return found
    exact = _exact_grids(int(images[0]), int(images[1]))
    if folded:  # windows of as many tokens as the images' patch grid (after a class token): a batch repeated
        own = [(count - h * w, (h, w)) for h, w in exact if count - h * w in (0, 1) and (count - h * w, (h, w)) != guess]
        return found + ([(own, "is the images' own patch grid (a batch repeated inside the model)")]
                        if own and per <= REPEATS else [])
    best = grid_readings(count, images)
    if found or not best or best[0][0] - leading_cost(best[0][1]) < RESIZED_COST:  # the guess is a patch grid
        return found
    beyond = sorted((count - h * w, (h, w)) for h, w in exact if MAX_EXTRA < count - h * w < h * w)  # mostly image
    return [(beyond, ("is the images' patch grid (more tokens before it" if len(beyond) == 1 else
                      "are patch grids of the images (more tokens before them") + " than the guess places)")] \
        if beyond else []


@dataclass(repr=False)
class CapturedAttention:
    """One attention computation of a model, averaged over the images it ran on.

    path: the module that ran it ("" for the model itself); kind: one of KINDS; call: how many
    computations of that module came before it in the pass (0: its first).
    probs (heads, T_q, T_k): the probabilities between image positions (left-out tokens dropped, not
    renormalized), float32 (float64 for float64 inputs). size / query_size: the key and query grids
    (H, W), None when the query or key tokens fit no grid (then every token is kept), or are the same for every
    image (`shared`: learned queries, on no grid while the keys keep theirs; learned keys, every token kept). left_out: (leading
    query tokens, leading key tokens, trailing key tokens: appended after the image positions, bias_k,
    add_zero_attn) not on the grid. extra_mass (heads, T_q): the
    attention the left-out keys took, None when none were left out. images: the batch entries
    averaged. scores: with `capture_attention(..., scores=True)`, the pre-softmax scores over the
    same tokens, {"combined": with masks, "content": q k^T * scale} (SelfAttention2d: its terms).
    """

    path: str
    kind: str
    call: int
    probs: Tensor
    size: tuple[int, int] | None
    query_size: tuple[int, int] | None
    left_out: tuple[int, int, int]
    extra_mass: Tensor | None
    images: int
    module: nn.Module | None = field(compare=False)
    scores: dict[str, Tensor] | None = None
    image_size: tuple[int, int] | None = None  # the images' (H, W) the pass ran on
    # "queries", "keys": tokens the same for every image (learned ones), on no grid; "target" with them: the target
    # of torch's decoder layers; "alike" alone: both sides equal for every image by value (read as the images': the
    # images could not tell)
    shared: tuple[str, ...] = ()

    @property
    def heads(self) -> int:
        return int(self.probs.shape[0])

    @property
    def name(self) -> str:
        """The module path, with '#n' for a module's later computations ('blocks.0.attn', 'decoder#1')."""
        base = self.path or "(model)"
        return base if self.call == 0 else f"{base}#{self.call}"

    def note(self) -> str:
        """What was left out, in words ('' when nothing was)."""
        if "target" in self.shared:  # an nn.TransformerDecoderLayer's attention
            sides = "queries and keys" if "keys" in self.shared else "queries"
            left = ": all kept" if self.size is None else f"; {left_out_note(self.left_out)}" if any(self.left_out) else ""
            return f"{sides} of a decoder's target (nn.TransformerDecoderLayer), on no image grid{left}"
        if self.size is None and "keys" in self.shared:  # learned keys (a decoder's memory, its own queries)
            return f"{' and '.join(self.shared)} of every image, on no image grid: all kept"
        if self.size is None:
            return f"{self.probs.shape[-1]} tokens on no image grid: all kept"
        if self.query_size is None:  # queries shared by every image (learned ones): the keys on their grid
            left = left_out_note(self.left_out)
            return "queries of every image, on no image grid" + (f"; {left}" if left else "")
        return left_out_note(self.left_out)

    def image_probs(self) -> Tensor:
        """probs renormalized over the image positions (each query's row sums to 1): what the measures see."""
        total = self.probs.sum(-1, keepdim=True)
        return torch.where(total > 0, self.probs / total.clamp_min(torch.finfo(self.probs.dtype).tiny), self.probs)

    def __repr__(self) -> str:
        where = "no grid" if self.size is None else f"{self.size[0]}x{self.size[1]}"
        note = self.note()
        return (f"CapturedAttention({self.name!r}, {self.kind}, heads={self.heads}, {where}, images={self.images}"
                + (f"; {note}" if note else "") + ")")


class CapturedLayer:
    """A captured attention computation as an attention layer (the `AttentionLayer` protocol), for the measures.

    Its probabilities depend on the input (`position_only` is False) and on the whole model, so
    `attention_probs()` gives the captured ones (renormalized over the image positions); new ones come
    from running the model again (`capture_attention`, or `attnconv.models.sites.site_probs`).
    `value_maps()` (Lemma 1's W_val^h W_out^h, for conv-likeness) exists where the module says:
    `nn.MultiheadAttention`, or a module with its own `value_maps()` (attnconv's ViT); else
    `has_value_maps` is False and the measures leave conv-likeness out.
    """

    position_only = False
    score_terms = ("combined", "content")

    def __init__(self, path: str, kind: str, call: int, heads: int, module: nn.Module, size: tuple[int, int],
                 left_out: tuple[int, int, int], probs: Tensor | None = None,
                 image_size: tuple[int, int] | None = None):
        self.path, self.kind, self.call, self.heads = path, kind, call, heads
        self.module, self.size, self.left_out, self.probs = module, size, left_out, probs
        self.image_size = image_size  # the images' (H, W) it was found on (`attention_sites`), where known

    @property
    def encoding_name(self) -> str:
        return f"captured {self.kind}"

    @property
    def note(self) -> str:
        """How the captured probabilities were taken, in words (the tokens left out)."""
        left = left_out_note(self.left_out)
        return f"{left}, attention renormalized over the image positions" if left else "captured attention"

    @property
    def has_value_maps(self) -> bool:
        return self.kind == "MultiheadAttention" or callable(getattr(self.module, "value_maps", None))

    def attention_probs(self, x: Tensor | None = None, size: Sequence[int] | None = None,
                        term: str = "combined") -> Tensor:
        """The captured probabilities (1, heads, T, T); the model, not this layer, turns an input into new ones."""
        if x is not None or self.probs is None:
            raise AttnconvError(f"{self.path or '(model)'}: captured attention is recomputed by running the model: "
                                "call capture_attention(model, images)")
        return self.probs.unsqueeze(0)

    def value_maps(self) -> tuple[Tensor, Tensor]:
        """(maps (heads, C_out, C_in), bias (C_out,)): y_q = sum_h sum_k P_h[q, k] maps[h] @ x_k + bias."""
        if self.kind == "MultiheadAttention":
            return multihead_value_maps(self.module)
        if callable(getattr(self.module, "value_maps", None)):
            return self.module.value_maps()
        raise AttnconvError(f"{self.path or '(model)'} ({type(self.module).__name__}): its value and output "
                            "projections are unknown, so it has no value maps")

    def __repr__(self) -> str:
        return f"CapturedLayer({self.path!r}, {self.kind}, heads={self.heads}, size={self.size})"


def multihead_value_maps(mha: nn.MultiheadAttention) -> tuple[Tensor, Tensor]:
    """Lemma 1's maps of an nn.MultiheadAttention: W_out[:, head h] @ W_v[head h, :], (heads, E, vdim)."""
    h, e = mha.num_heads, mha.embed_dim
    d = e // h
    if mha._qkv_same_embed_dim:
        w_v = mha.in_proj_weight[2 * e:]
    else:
        w_v = mha.v_proj_weight
    zero = torch.zeros(e, dtype=w_v.dtype, device=w_v.device)
    b_v = mha.in_proj_bias[2 * e:] if mha.in_proj_bias is not None else zero
    w_o = mha.out_proj.weight
    b_o = mha.out_proj.bias if mha.out_proj.bias is not None else zero
    with torch.no_grad():
        maps = torch.stack([w_o[:, i * d:(i + 1) * d] @ w_v[i * d:(i + 1) * d] for i in range(h)])
        return maps.detach(), (b_o + w_o @ b_v).detach()


# ------------------------------------------------------------------------------------------ recomputation
