"""vitkit: a Vision Transformer toolkit for PyTorch built around multi-head self-attention.

Every name below is imported on first use (PEP 562), so ``import vitkit`` (and the ``vitkit``
command's ``--help``) stays instant; torch loads with the first model, Lightning with ``train``.
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import data, explain, layers, prune, tasks, train
    from .allocator import keep_freed_memory
    from .errors import VitkitError
    from .inference import Prediction, predict
    from .io import load_model, load_model_and_extra, save_model
    from .models import (
        VisionTransformer,
        ViTConfig,
        create_model,
        from_timm,
        list_models,
        merge_tokens,
        to_timm_state_dict,
    )
    from .pretrained import load_pretrained, read_pretrained

__version__ = "0.1.0"

#: Public name -> the submodule that defines it.
_ATTRIBUTES = {
    "Prediction": "inference",
    "ViTConfig": "models",
    "VitkitError": "errors",
    "VisionTransformer": "models",
    "create_model": "models",
    "from_timm": "models",
    "keep_freed_memory": "allocator",
    "list_models": "models",
    "load_model": "io",
    "load_model_and_extra": "io",
    "load_pretrained": "pretrained",
    "merge_tokens": "models",
    "predict": "inference",
    "read_pretrained": "pretrained",
    "save_model": "io",
    "to_timm_state_dict": "models",
}
_SUBPACKAGES = ("data", "explain", "layers", "prune", "tasks", "train")

__all__ = [
    "Prediction",
    "ViTConfig",
    "VitkitError",
    "VisionTransformer",
    "create_model",
    "from_timm",
    "keep_freed_memory",
    "list_models",
    "load_model",
    "load_model_and_extra",
    "load_pretrained",
    "merge_tokens",
    "predict",
    "read_pretrained",
    "save_model",
    "to_timm_state_dict",
    "data",
    "explain",
    "layers",
    "prune",
    "tasks",
    "train",
]


def __getattr__(name: str) -> Any:
    """``vitkit.create_model``, ``vitkit.train``, ... imported when first asked for."""
    if name in _ATTRIBUTES:
        value = getattr(_importlib.import_module(f".{_ATTRIBUTES[name]}", __name__), name)
    elif name in _SUBPACKAGES:
        value = _importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, "__version__"])
