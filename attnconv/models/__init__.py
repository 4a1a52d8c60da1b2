"""Named models, created through one factory (timm-style registry).

    build_model("sa-quadratic", hidden=64, layers=2)

Every model maps a normalized float batch (B, C, H, W) to logits (B, num_classes)
and exposes `forward_features` (pooled features) and `forward_head`. The registry
lives in `attnconv.models.registry`; importing this package registers every model.
"""

from attnconv.models import classifier, resnet, vit  # noqa: F401  (importing them fills the registry)
from attnconv.models.classifier import ClassifierConfig
from attnconv.models.registry import (
    ImageModelConfig,
    attention_placement,
    build_model,
    list_models,
    no_weight_decay,
    register_model,
)
from attnconv.models.resnet import ResNetConfig
from attnconv.models.vit import ViTConfig

# The option dataclasses of the registered models: `attnconv train`'s model flags come from their fields.
MODEL_CONFIGS = (ImageModelConfig, ClassifierConfig, ResNetConfig, ViTConfig)

__all__ = ["MODEL_CONFIGS", "ClassifierConfig", "ImageModelConfig", "ResNetConfig", "ViTConfig", "attention_placement",
           "build_model", "list_models", "no_weight_decay", "register_model"]
