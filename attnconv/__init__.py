"""attnconv: self-attention and convolution (Cordonnier, Loukas, Jaggi, ICLR 2020).

    from attnconv import SelfAttention2d, conv_to_attention, build_model
"""

from attnconv.attention import SelfAttention2d
from attnconv.construct import conv_likeness, conv_to_attention, effective_kernel
from attnconv.convert import cnn_to_attention
from attnconv.errors import AttnconvError
from attnconv.models import build_model, list_models

__version__ = "0.1.0"

__all__ = [
    "AttnconvError",
    "SelfAttention2d",
    "build_model",
    "cnn_to_attention",
    "conv_likeness",
    "conv_to_attention",
    "effective_kernel",
    "list_models",
]
