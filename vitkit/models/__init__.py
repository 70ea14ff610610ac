"""Vision Transformer models, variants registry and timm interop."""

from .config import ViTConfig
from .flops import count_parameters, vit_flops
from .merge import merge_tokens
from .registry import MODEL_CONFIGS, create_model, list_models, model_config
from .timm_interop import from_timm, timm_twin, to_timm, to_timm_state_dict
from .vision_transformer import Intermediates, VisionTransformer

__all__ = [
    "MODEL_CONFIGS",
    "Intermediates",
    "ViTConfig",
    "VisionTransformer",
    "count_parameters",
    "create_model",
    "from_timm",
    "list_models",
    "merge_tokens",
    "model_config",
    "timm_twin",
    "to_timm",
    "to_timm_state_dict",
    "vit_flops",
]
