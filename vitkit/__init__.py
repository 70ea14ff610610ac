"""vitkit: a Vision Transformer toolkit for PyTorch built around multi-head self-attention."""

from .io import load_model, save_model
from .models import ViTConfig, VisionTransformer, create_model, from_timm, list_models, to_timm_state_dict

__version__ = "0.1.0"

__all__ = [
    "ViTConfig",
    "VisionTransformer",
    "create_model",
    "from_timm",
    "list_models",
    "load_model",
    "save_model",
    "to_timm_state_dict",
]
