"""Named model variants: ``create_model(name, **overrides)`` and ``list_models()``."""

from __future__ import annotations

import difflib
from typing import Any

from ..schema import reject_unknown_keys
from .config import ViTConfig
from .vision_transformer import VisionTransformer

#: Hyper-parameters of each variant. The ImageNet ones equal timm's models of the same name;
#: the CIFAR ones (32x32 images, 4x4 patches) follow ViT-Lite (Hassani et al. 2021,
#: https://arxiv.org/abs/2104.05704), whose 7-layer, 256-wide, 4-head model reaches about 91%
#: on CIFAR-10 from scratch.
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "vit_tiny_patch16_224": dict(embed_dim=192, depth=12, num_heads=3),
    "vit_small_patch16_224": dict(embed_dim=384, depth=12, num_heads=6),
    "vit_base_patch16_224": dict(embed_dim=768, depth=12, num_heads=12),
    "vit_large_patch16_224": dict(embed_dim=1024, depth=24, num_heads=16),
    "vit_cifar_tiny": dict(
        img_size=32, patch_size=4, num_classes=10, embed_dim=192, depth=6, num_heads=3, mlp_ratio=2.0
    ),
    "vit_cifar_small": dict(
        img_size=32, patch_size=4, num_classes=10, embed_dim=256, depth=7, num_heads=4, mlp_ratio=2.0
    ),
}


def list_models() -> list[str]:
    """Names accepted by :func:`create_model`."""
    return sorted(MODEL_CONFIGS)


def model_config(name: str, **overrides: Any) -> ViTConfig:
    """The :class:`ViTConfig` of variant ``name`` with ``overrides`` applied."""
    if name not in MODEL_CONFIGS:
        close = difflib.get_close_matches(name, MODEL_CONFIGS, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown model {name!r}.{hint} Available: {', '.join(list_models())}.")
    reject_unknown_keys(ViTConfig, overrides, source="the arguments")
    return ViTConfig(**{**MODEL_CONFIGS[name], **overrides})


def create_model(name: str, **overrides: Any) -> VisionTransformer:
    """Build variant ``name``; any :class:`ViTConfig` field can be overridden
    (``depth=6, num_heads=4, img_size=384, drop_path_rate=0.1, num_classes=100, ...``)."""
    return VisionTransformer(model_config(name, **overrides))
