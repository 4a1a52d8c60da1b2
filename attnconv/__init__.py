"""attnconv: self-attention and convolution (Cordonnier, Loukas, Jaggi, ICLR 2020).

    from attnconv import SelfAttention2d, conv_to_attention, build_model, load_run

    layer = SelfAttention2d(64, 64, heads=9, encoding="quadratic")   # a drop-in for nn.Conv2d(64, 64, 3)
    attn = conv_to_attention(conv)                                    # Theorem 1: the same function
    model, config = load_run("runs/sa")                               # a trained run, eval mode
"""

from attnconv.attention import SelfAttention2d
from attnconv.construct import ConvAttention, LearnableConvAttention, conv_likeness, conv_to_attention, effective_kernel
from attnconv.convert import cnn_to_attention
from attnconv.errors import AttnconvError
from attnconv.models import build_model, list_models
from attnconv.runs import load_run

__version__ = "0.1.0"

__all__ = [
    "AttnconvError",
    "ConvAttention",
    "LearnableConvAttention",
    "SelfAttention2d",
    "build_model",
    "cnn_to_attention",
    "conv_likeness",
    "conv_to_attention",
    "effective_kernel",
    "list_models",
    "load_run",
]
