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

from attnconv.attention import SelfAttention2d
from attnconv.attention.select import IMPLS
from attnconv.errors import AttnconvError
from attnconv.limits import one_image_hint, tensor_argument
from attnconv.models.registry import ImageModelConfig, register_model, run_blocks
from attnconv.options import FieldError, check_fields, option
from attnconv.positional import ENCODINGS, POS_INITS

LAYER_NORM_EPS = 1e-12


@dataclass
class ClassifierConfig(ImageModelConfig):
    """The attention classifier's options (each with its help and range: `attnconv.options`)."""

    encoding: str = option("quadratic", choices=ENCODINGS, cli=False)  # set by the model's name
    hidden: int = option(400, "attention models: hidden width (paper: 400)", low=1, high=65536)
    heads: int = option(9, "attention models: heads (paper: 9)", low=1, high=1024)
    layers: int = option(6, "attention models: layers (paper: 6)", low=1, high=1024)
    intermediate: int = option(512, "attention models: MLP width (paper: 512)", low=1, high=10**6)
    downsample: int = option(2, "attention models: space-to-depth factor (paper: 2)", low=1, high=1024)
    dropout: float = option(0.1, "attention models: dropout after attention and MLP (paper: 0.1)", low=0, high=1,
                            high_open=True)
    attn_dropout: float = option(0.1, "attention models: dropout on attention probabilities (paper: 0.1)", low=0,
                                 high=1, high_open=True)
    # learned tables' width D_p (default: hidden, 400 in the paper)
    pos_dim: int | None = option(None, low=1, high=65536, cli=False)
    impl: str = option("auto", "attention models: how attention is computed (auto: the fastest exact path)",
                       choices=IMPLS)
    init: str = option("paper", "quadratic attention models: 'paper' (centers ~ N(0, 2^2)) or 'grid' (centers on "
                       "the KxK grid)", choices=("paper", "grid"))
    locality: float = option(1.0, "quadratic attention models with --init grid: initial alpha of every head "
                             "(default 1)", low=1e-9, high=1e9, fix="give a positive number")
    checkpoint: bool = option(False, "attention models: recompute each block in backward (less memory, ~1.3x more "
                              "compute)", flag="grad-checkpoint")
    # "authors": learned tables N(0, 1), per-head keys nn.Linear's default (the paper's code);
    # "bert": N(0, 0.02^2) (uniform learned heads at init). Learned encodings only.
    pos_init: str = option("authors", "learned-encoding models: 'authors' (N(0, 1) tables, as the authors' code; "
                           "default) or 'bert'", choices=POS_INITS)
    # one attention-dropout mask per sample, or per batch (the paper's code; position-only encodings)
    attn_dropout_mask: str = option("per-sample", "attention models: 'per-sample' (default) or 'shared' (one mask "
                                    "per batch for position-only probabilities, as the authors' code)",
                                    choices=("per-sample", "shared"))

    def validate(self) -> None:
        """FieldError naming the first bad option (ranges and choices from the fields), then the combinations."""
        check_fields(self)
        if self.image_size % self.downsample:
            raise FieldError("downsample", self.downsample,
                             f"image_size {self.image_size} is not divisible by it; choose a factor that divides it")
        if self.init == "grid" and not self.encoding.startswith("quadratic"):
            raise FieldError("init", self.init, f"'grid' places quadratic centers; the {self.encoding!r} encoding "
                             "has none")
        if self.pos_init != "authors" and not self.encoding.startswith("learned"):
            raise FieldError("pos_init", self.pos_init, f"it sets the learned tables' init; the {self.encoding!r} "
                             "encoding has none (leave it at 'authors')")
        if self.attn_dropout_mask == "shared" and self.encoding == "learned-content":
            raise FieldError("attn_dropout_mask", self.attn_dropout_mask, "'shared' is for position-only encodings "
                             "(content probabilities differ per sample); leave it at 'per-sample'")

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
        x = self.attention_norm(x + self.dropout(self._attend(x)))
        return self.output_norm(x + self.dropout(self.output(nn.functional.gelu(self.intermediate(x)))))

    def _attend(self, x: Tensor) -> Tensor:
        """attention_out(attention(x)) on the channels-last tokens (B, H, W, hidden).

        The attention layer runs as a module on a (B, C, H, W) view of the tokens (no copy), so its
        hooks fire. While gradients are recorded, and unless hooks watch the layer (they must see
        its output), `attention_out` is folded into the layer's output projection where that saves
        work: y = a (W_o W_out)^T + (W_o b_out + b_o) costs one (heads * D -> hidden) matmul per
        token instead of two, plus the weight product per forward; the same function, rounded
        differently. Without gradients the two Linears run as modules (FLOP counters see them).
        """
        layer, then = self.attention, self.attention_out
        tokens = x.shape[0] * x.shape[1] * x.shape[2]
        if torch.is_grad_enabled() and tokens > layer.out.in_features and not _watched(layer):
            weight = then.weight @ layer.out.weight  # (hidden, heads * D)
            bias = None if layer.out.bias is None else then.weight @ layer.out.bias
            if then.bias is not None:
                bias = then.bias if bias is None else bias + then.bias
            return layer.forward_projected(x, weight, bias)
        return then(layer(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1))


def _watched(module: nn.Module) -> bool:
    """Whether hooks of the module's own watch its calls (a folded forward would not call it)."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


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
        tensor_argument(x, "x", f"images (B, {cfg.in_channels}, H, W)", like=self.embed.weight, owner="the model")
        if x.ndim != 4 or x.shape[1] != cfg.in_channels or x.shape[2] % cfg.downsample or x.shape[3] % cfg.downsample \
                or not x.shape[2] or not x.shape[3]:
            raise AttnconvError(
                f"model expects images (B, {cfg.in_channels}, H, W) with H, W positive multiples of {cfg.downsample}, "
                f"got {tuple(x.shape)}" + one_image_hint(x, cfg.in_channels)
            )
        # torch's PixelUnshuffle gives an empty batch another shape: the empty batch of its own (not where torch.export,
        # torch.compile or a trace captures the graph: a branch on the batch size would fix the batch there)
        if not (torch.compiler.is_compiling() or torch.jit.is_tracing()) and not len(x):
            d = cfg.downsample
            return self.embed(x.new_zeros(0, x.shape[2] // d, x.shape[3] // d, cfg.in_channels * d * d))
        return self.embed(self.downsample(x).permute(0, 2, 3, 1))

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, hidden) pooled features."""
        # Checkpointed: one (B, H, W, hidden) tensor per block instead of its (B, T, heads*hidden) head outputs.
        checkpointed = self.config.checkpoint and self.training and torch.is_grad_enabled()
        return run_blocks(self.layers, self.tokens(x), checkpointed).mean(dim=(1, 2))

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.config).items())


def _factory(encoding: str):
    def build(**overrides) -> AttentionClassifier:
        if "encoding" in overrides:  # the model's name says its encoding: the same one taken, another named
            asked = overrides.pop("encoding")
            if asked != encoding:
                named = next((n for n, e in _ENCODINGS.items() if e == asked), None)
                others = ", ".join(n for n, e in _ENCODINGS.items() if e != encoding)
                pick = f"build {named!r} for {asked!r}" if named else f"build one named for another ({others})"
                raise AttnconvError(f"model {_NAMES[encoding]!r} has the {encoding!r} encoding, which its name says: "
                                    f"leave encoding out, or {pick}")
        return AttentionClassifier(ClassifierConfig(encoding=encoding, **overrides))

    build.__doc__ = f"The paper's attention classifier with the {encoding!r} encoding."
    build.config_class = ClassifierConfig  # its options' defaults (`registry.model_defaults`)
    build.fixed = {"encoding": encoding}  # set by its name, whatever the config class's default
    return build


# The attention classifiers by name, each with its encoding.
_ENCODINGS = {"sa-quadratic": "quadratic", "sa-quadratic-aniso": "quadratic-aniso", "sa-learned": "learned",
              "sa-learned-content": "learned-content"}
_NAMES = {e: n for n, e in _ENCODINGS.items()}
for _name, _encoding in _ENCODINGS.items():
    register_model(_name)(_factory(_encoding))
