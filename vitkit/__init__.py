"""vitkit: a Vision Transformer toolkit for PyTorch built around multi-head self-attention."""

import importlib
from types import ModuleType

from .errors import VitkitError
from .io import load_model, save_model
from .models import VisionTransformer, ViTConfig, create_model, from_timm, list_models, to_timm_state_dict

__version__ = "0.1.0"

__all__ = [
    "ViTConfig",
    "VitkitError",
    "VisionTransformer",
    "create_model",
    "from_timm",
    "list_models",
    "load_model",
    "save_model",
    "to_timm_state_dict",
    "data",
    "explain",
    "layers",
    "prune",
    "train",
]

#: Subpackages imported on first use, so ``import vitkit`` stays light (Lightning loads with ``train``).
_LAZY_SUBPACKAGES = frozenset({"data", "explain", "layers", "prune", "train"})


def __getattr__(name: str) -> ModuleType:
    """``vitkit.train``, ``vitkit.explain``, ... without importing them explicitly."""
    if name in _LAZY_SUBPACKAGES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

