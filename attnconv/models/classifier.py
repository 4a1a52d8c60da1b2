"""The paper's attention-only image classifiers (post-LN BERT encoder over pixels).

    image (B, C, 32, 32)
      -> 2x2 invertible downsampling (space-to-depth)   (B, 4C, 16, 16)
      -> Linear(4C -> hidden)                            (B, 16, 16, hidden)   no absolute positions
      -> layers x Block                                  (B, 16, 16, hidden)
      -> mean over positions, Linear(hidden -> classes)  (B, classes)

Block (as the paper's code, BERT with post-LayerNorm, eps 1e-12):
    a = SelfAttention2d(hidden, hidden, heads, value="shared")(x)   W_val = I, Linear(heads*hidden -> hidden)
    x = LayerNorm(x + Dropout(attention_out(a)))                     attention_out: Linear(hidden -> hidden)
    x = LayerNorm(x + Dropout(Linear(intermediate -> hidden)(GELU(Linear(hidden -> intermediate)(x)))))

With the defaults this gives the paper's Table 1 sizes: sa-quadratic 12.1M,
sa-learned 12.3M, sa-learned-content 29.5M parameters. Initialization follows the
paper's code (`pos_init="authors"`; docs/design-notes.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from attnconv.attention import SelfAttention2d
from attnconv.errors import AttnconvError
from attnconv.models.registry import register_model
from attnconv.positional import POS_INITS

LAYER_NORM_EPS = 1e-12


@dataclass
class ClassifierConfig:
    encoding: str = "quadratic"
    in_channels: int = 3
    image_size: int = 32
    num_classes: int = 10
    hidden: int = 400
    heads: int = 9
    layers: int = 6
    intermediate: int = 512
    downsample: int = 2
    dropout: float = 0.1  # hidden dropout after the attention output and the MLP
    attn_dropout: float = 0.1  # dropout on the attention probabilities
    pos_dim: int | None = None  # learned tables' width D_p (default: hidden, 400 in the paper)
    impl: str = "auto"
    init: str = "paper"  # "paper": centers ~ N(0, 2^2); "grid": centers on the K x K grid (quadratic only)
    locality: float = 1.0  # alpha of every head with init="grid"
    checkpoint: bool = False  # recompute each block in backward instead of storing its activations
    # "authors": learned tables N(0, 1), per-head keys nn.Linear's default (the paper's code);
    # "bert": N(0, 0.02^2) (uniform learned heads at init). Learned encodings only.
    pos_init: str = "authors"
    # "per-sample" or "shared" (one attention-dropout mask per batch, the paper's code; position-only)
    attn_dropout_mask: str = "per-sample"

    def validate(self) -> None:
        for name in ("in_channels", "image_size", "num_classes", "hidden", "heads", "layers", "intermediate", "downsample"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise AttnconvError(f"model option {name} must be a positive integer, got {v!r}")
        if self.image_size % self.downsample:
            raise AttnconvError(
                f"image_size {self.image_size} is not divisible by downsample {self.downsample}; "
                f"choose a downsample factor that divides it"
            )
        if self.init not in ("paper", "grid"):
            raise AttnconvError(f"model option init must be 'paper' or 'grid', got {self.init!r}")
        if self.init == "grid" and not self.encoding.startswith("quadratic"):
            raise AttnconvError(f"init='grid' places quadratic centers; the {self.encoding!r} encoding has none")
        if self.pos_init not in POS_INITS:
            raise AttnconvError(f"model option pos_init must be one of {', '.join(POS_INITS)}, got {self.pos_init!r}")
        if self.pos_init != "authors" and not self.encoding.startswith("learned"):
            raise AttnconvError(
                f"pos_init={self.pos_init!r} sets the learned tables' init; the {self.encoding!r} encoding has none "
                f"(leave pos_init at 'authors')"
            )
        if self.attn_dropout_mask not in ("per-sample", "shared"):
            raise AttnconvError(
                f"model option attn_dropout_mask must be 'per-sample' or 'shared', got {self.attn_dropout_mask!r}"
            )
        if self.attn_dropout_mask == "shared" and self.encoding == "learned-content":
            raise AttnconvError(
                "attn_dropout_mask='shared' is for position-only encodings (content probabilities differ per "
                "sample); leave it at 'per-sample'"
            )
        if not self.locality > 0:
            raise AttnconvError(f"model option locality must be positive, got {self.locality}")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise AttnconvError(f"model option {name} must be in [0, 1), got {getattr(self, name)}")

    @property
    def grid(self) -> int:
        """Side of the token grid after downsampling."""
        return self.image_size // self.downsample


class Block(nn.Module):
    """One post-LN encoder layer: attention sublayer, then MLP sublayer (channels-last)."""

    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        self.attention = SelfAttention2d(
            cfg.hidden,
            cfg.hidden,
            heads=cfg.heads,
            encoding=cfg.encoding,
            impl=cfg.impl,
            value="shared",
            pos_dim=cfg.pos_dim,
            max_size=cfg.grid,
            attn_dropout=cfg.attn_dropout,
            pos_init=cfg.pos_init,
            attn_dropout_mask=cfg.attn_dropout_mask,
        )
        self.attention_out = nn.Linear(cfg.hidden, cfg.hidden)
        self.attention_norm = nn.LayerNorm(cfg.hidden, eps=LAYER_NORM_EPS)
        self.intermediate = nn.Linear(cfg.hidden, cfg.intermediate)
        self.output = nn.Linear(cfg.intermediate, cfg.hidden)
        self.output_norm = nn.LayerNorm(cfg.hidden, eps=LAYER_NORM_EPS)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, H, W, hidden)
        x = self.attention_norm(x + self.dropout(self.attention.forward_tokens(x, then=self.attention_out)))
        return self.output_norm(x + self.dropout(self.output(nn.functional.gelu(self.intermediate(x)))))


class AttentionClassifier(nn.Module):
    """Attention-only classifier of the paper (Section 4 / Appendix B)."""

    def __init__(self, cfg: ClassifierConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        d = cfg.downsample
        self.downsample = nn.PixelUnshuffle(d) if d > 1 else nn.Identity()
        self.embed = nn.Linear(cfg.in_channels * d * d, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.head = nn.Linear(cfg.hidden, cfg.num_classes)
        if cfg.init == "grid":
            for layer in self.attention_layers:
                layer.encoding.init_grid(cfg.locality)

    @property
    def attention_layers(self) -> list[SelfAttention2d]:
        return [block.attention for block in self.layers]

    def tokens(self, x: Tensor) -> Tensor:
        """(B, C, H, W) image -> (B, H/d, W/d, hidden) embedded tokens."""
        cfg = self.config
        if x.ndim != 4 or x.shape[1] != cfg.in_channels or x.shape[2] % cfg.downsample or x.shape[3] % cfg.downsample:
            raise AttnconvError(
                f"model expects images (B, {cfg.in_channels}, H, W) with H, W divisible by {cfg.downsample}, "
                f"got {tuple(x.shape)}"
            )
        return self.embed(self.downsample(x).permute(0, 2, 3, 1))

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, hidden) pooled features."""
        h = self.tokens(x)
        for block in self.layers:
            if self.config.checkpoint and self.training and torch.is_grad_enabled():
                # Keeps one (B, H, W, hidden) tensor per block instead of its (B, T, heads*hidden)
                # head outputs and intermediates; backward runs each block's forward again.
                h = checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        return h.mean(dim=(1, 2))

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.config).items())


def _factory(encoding: str):
    def build(**overrides) -> AttentionClassifier:
        return AttentionClassifier(ClassifierConfig(encoding=encoding, **overrides))

    build.__doc__ = f"The paper's attention classifier with the {encoding!r} encoding."
    return build


for _name, _encoding in (
    ("sa-quadratic", "quadratic"),
    ("sa-quadratic-aniso", "quadratic-aniso"),
    ("sa-learned", "learned"),
    ("sa-learned-content", "learned-content"),
):
    register_model(_name)(_factory(_encoding))
