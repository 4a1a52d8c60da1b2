"""attnconv: self-attention and convolution (Cordonnier, Loukas, Jaggi, ICLR 2020).

    from attnconv import SelfAttention2d, conv_to_attention, make_config, train, Run

    layer = SelfAttention2d(64, 64, heads=9, encoding="quadratic")   # a drop-in for nn.Conv2d(64, 64, 3)
    attn = conv_to_attention(conv)                                    # Theorem 1: the same function
    train(make_config(preset="fmnist-sa-quadratic"), "runs/sa")       # a run directory
    run = Run("runs/sa")                                              # config, metrics, heads, model, sites
    records = capture_attention(vit, images)                          # the attention of any model, per call
"""

from importlib.metadata import PackageNotFoundError, version

from attnconv.analysis import analyze_captured, analyze_layer, analyze_run, head_snapshot
from attnconv.attention import SelfAttention2d
from attnconv.config import PRESETS, TrainConfig, make_config
from attnconv.construct import ConvAttention, LearnableConvAttention, conv_likeness, conv_to_attention, effective_kernel
from attnconv.convert import cnn_to_attention
from attnconv.errors import AttnconvError
from attnconv.models import build_model, list_models, register_model
from attnconv.models.capture import CapturedAttention, capture_attention
from attnconv.models.sites import AttentionLayer, AttentionSite, attention_sites, captured_sites
from attnconv.runs import Run, load_run
from attnconv.training import train

try:
    __version__ = version("attnconv")  # one home: pyproject.toml
except PackageNotFoundError:  # run from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "PRESETS",
    "AttentionLayer",
    "AttentionSite",
    "AttnconvError",
    "CapturedAttention",
    "ConvAttention",
    "LearnableConvAttention",
    "Run",
    "SelfAttention2d",
    "TrainConfig",
    "analyze_captured",
    "analyze_layer",
    "analyze_run",
    "attention_sites",
    "build_model",
    "capture_attention",
    "captured_sites",
    "cnn_to_attention",
    "conv_likeness",
    "conv_to_attention",
    "effective_kernel",
    "head_snapshot",
    "list_models",
    "load_run",
    "make_config",
    "register_model",
    "train",
]
