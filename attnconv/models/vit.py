"""A plain vision transformer (as timm's `VisionTransformer`), beside the paper's models.

    image (B, C, 28, 28)
      -> patch embedding: Conv2d(C, hidden, patch, stride patch)   (B, 7*7, hidden)   patch 4
      -> [class token; tokens] + learned absolute position embeddings (B, 1 + 49, hidden)
      -> layers x Block (pre-LN)
      -> LayerNorm, the class token, Linear(hidden -> classes)

Block (timm's): x = x + Attention(LN(x)); x = x + MLP(LN(x)), MLP = Linear, GELU, Linear.
Attention: one Linear(hidden -> 3 hidden) for q, k, v of every head, then
`torch.nn.functional.scaled_dot_product_attention` (as timm's and Hugging Face's ViTs), then
Linear(hidden -> hidden). No relative positions: where a head looks is learned from the absolute
position embeddings and the content alone, so its attention is captured from the SDPA calls
(`attnconv.models.capture`) for the analysis, the figures, the report and the explorer.

Defaults are the Fashion-MNIST size (the `fmnist-vit` preset): hidden 108, 9 heads (as the
attention preset, one per 3x3 offset) of width 12, 4 layers, MLP 432; about as many parameters
as `fmnist-sa-quadratic`'s model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from attnconv.errors import AttnconvError
from attnconv.limits import one_image_hint, tensor_argument
from attnconv.models.registry import ImageModelConfig, register_model, run_blocks
from attnconv.options import FieldError, check_fields, option

LAYER_NORM_EPS = 1e-6  # timm's ViT


@dataclass
class ViTConfig(ImageModelConfig):
    """The ViT's options (each with its help and range: `attnconv.options`)."""

    patch: int = option(4, "vit: patch side in pixels (28x28 images, patch 4: 7x7 tokens)", low=1, high=1024)
    hidden: int = option(108, "attention models: hidden width (paper: 400)", low=1, high=65536)
    heads: int = option(9, "attention models: heads (paper: 9)", low=1, high=1024)
    layers: int = option(4, "attention models: layers (paper: 6)", low=1, high=1024)
    intermediate: int = option(432, "attention models: MLP width (paper: 512)", low=1, high=10**6)
    dropout: float = option(0.0, "attention models: dropout after attention and MLP (paper: 0.1)", low=0, high=1,
                            high_open=True)
    attn_dropout: float = option(0.0, "attention models: dropout on attention probabilities (paper: 0.1)", low=0,
                                 high=1, high_open=True)
    checkpoint: bool = option(False, "attention models: recompute each block in backward (less memory, ~1.3x more "
                              "compute)", flag="grad-checkpoint")

    def validate(self) -> None:
        """FieldError naming the first bad option (ranges from the fields), then the combinations."""
        check_fields(self)
        if self.image_size % self.patch:
            raise FieldError("patch", self.patch,
                             f"image_size {self.image_size} is not divisible by it; choose a side that divides it")
        if self.hidden % self.heads:
            raise FieldError("heads", self.heads, f"hidden {self.hidden} is not divisible by it; choose heads that "
                             "divide {hidden}", mentions=("hidden",))

    @property
    def grid(self) -> int:
        """Side of the token grid (image positions; the class token comes on top)."""
        return self.image_size // self.patch

    @property
    def downsample(self) -> int:
        """Pixels per token a side (the patch), as the attention classifiers' `downsample`."""
        return self.patch


class Attention(nn.Module):
    """Multi-head self-attention over (B, N, hidden) tokens through scaled_dot_product_attention (timm's)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.heads, self.head_dim = cfg.heads, cfg.hidden // cfg.heads
        self.qkv = nn.Linear(cfg.hidden, 3 * cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.hidden)
        self.attn_dropout = cfg.attn_dropout

    def forward(self, x: Tensor) -> Tensor:
        B, N, D = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        p = self.attn_dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=p)  # (B, heads, N, head_dim)
        return self.proj(out.transpose(1, 2).reshape(B, N, D))

    def value_maps(self) -> tuple[Tensor, Tensor]:
        """Lemma 1's W_val^h W_out^h of each head, (heads, hidden, hidden), and the bias: the layer's output is
        sum_h sum_k P_h[q, k] maps[h] @ x_k + bias (x: its normalized input)."""
        d, hidden = self.head_dim, self.proj.in_features
        with torch.no_grad():
            w_v, b_v = self.qkv.weight[2 * hidden:], self.qkv.bias[2 * hidden:]
            w_o = self.proj.weight
            maps = torch.stack([w_o[:, h * d:(h + 1) * d] @ w_v[h * d:(h + 1) * d] for h in range(self.heads)])
            return maps, self.proj.bias + w_o @ b_v


class Block(nn.Module):
    """One pre-LN encoder layer (timm's Block)."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden, eps=LAYER_NORM_EPS)
        self.attn = Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.hidden, eps=LAYER_NORM_EPS)
        self.fc1 = nn.Linear(cfg.hidden, cfg.intermediate)
        self.fc2 = nn.Linear(cfg.intermediate, cfg.hidden)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:  # (B, N, hidden)
        x = x + self.dropout(self.attn(self.norm1(x)))
        return x + self.dropout(self.fc2(self.dropout(F.gelu(self.fc1(self.norm2(x))))))


class Positions(nn.Module):
    """The class token and the learned absolute position embeddings (no weight decay, as timm's)."""

    no_weight_decay = True

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.hidden))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + cfg.grid * cfg.grid, cfg.hidden))
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)

    def forward(self, tokens: Tensor) -> Tensor:  # (B, T, hidden) -> (B, 1 + T, hidden)
        cls = self.cls_token.expand(tokens.shape[0], -1, -1)
        return torch.cat([cls, tokens], dim=1) + self.pos_embed


class ViT(nn.Module):
    """A plain ViT: patches, a class token, absolute positions, pre-LN blocks calling SDPA."""

    def __init__(self, cfg: ViTConfig):
        super().__init__()
        cfg.validate()
        self.config = cfg
        self.patch_embed = nn.Conv2d(cfg.in_channels, cfg.hidden, cfg.patch, stride=cfg.patch)
        self.positions = Positions(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.LayerNorm(cfg.hidden, eps=LAYER_NORM_EPS)
        self.head = nn.Linear(cfg.hidden, cfg.num_classes)
        for m in self.modules():  # timm's init: truncated normal Linear weights, zero biases
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def tokens(self, x: Tensor) -> Tensor:
        """(B, C, H, W) image -> (B, 1 + (H/p)(W/p), hidden): the class token, then the patches row by row."""
        cfg = self.config
        tensor_argument(x, "x", f"images (B, {cfg.in_channels}, {cfg.image_size}, {cfg.image_size})",
                        like=self.head.weight, owner="the model")  # not the patch embedding: converted, it has none
        if x.ndim != 4 or x.shape[1] != cfg.in_channels or tuple(x.shape[2:]) != (cfg.image_size, cfg.image_size):
            raise AttnconvError(f"model expects images (B, {cfg.in_channels}, {cfg.image_size}, {cfg.image_size}) "
                                f"(its position embeddings are for that size), got {tuple(x.shape)}"
                                + one_image_hint(x, cfg.in_channels))
        return self.positions(self.patch_embed(x).flatten(2).transpose(1, 2))

    def token_layout(self, size: tuple[int, int]) -> tuple[int, tuple[int, int]]:
        """Where its tokens lie for images of `size` (H, W): the class token, then the patches' grid row by row (what
        `capture_attention` reads its attention on, without a guess)."""
        p = self.config.patch
        return 1, (int(size[0]) // p, int(size[1]) // p)

    def forward_features(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, hidden): the class token's features after the last block."""
        checkpointed = self.config.checkpoint and self.training and torch.is_grad_enabled()
        return self.norm(run_blocks(self.blocks, self.tokens(x), checkpointed))[:, 0]

    def forward_head(self, features: Tensor) -> Tensor:
        return self.head(features)

    def forward(self, x: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(x))

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in asdict(self.config).items())


@register_model("vit")
def vit(**overrides) -> ViT:
    """A plain ViT (timm-style: patch embedding, class token, absolute positions, pre-LN, SDPA)."""
    return ViT(ViTConfig(**overrides))


vit.config_class = ViTConfig  # its options' defaults (`registry.model_defaults`)
