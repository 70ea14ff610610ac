"""Atomic file writes and model files: safetensors weights plus a JSON config, no pickle."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .models.config import ViTConfig
from .models.vision_transformer import VisionTransformer

FORMAT_KEY = "vitkit_format"
CONFIG_KEY = "vitkit_config"
EXTRA_KEY = "vitkit_extra"
FORMAT_VERSION = "1"


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> Path:
    """Call ``write(tmp_path)`` on a temporary file beside ``path``, fsync it, then rename it
    over ``path``: a crash leaves either the old file or the new one, never a truncated one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_current_umask())  # mkstemp creates 0600; give the usual mode
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_model(model: VisionTransformer, path: str | os.PathLike, extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` to ``path`` (``.safetensors``): weights, its :class:`ViTConfig` (per-layer
    head counts included, so pruned models reload) and ``extra`` JSON metadata (for example the
    input normalisation and class names), atomically."""
    state = {name: tensor.detach().contiguous().cpu() for name, tensor in model.state_dict().items()}
    config = model.config.replace(num_heads=model.heads_per_layer(), head_dim=model.config.resolved_head_dim())
    metadata = {
        FORMAT_KEY: FORMAT_VERSION,
        CONFIG_KEY: json.dumps(config.to_dict()),
        EXTRA_KEY: json.dumps(extra or {}),
    }
    return atomic_write(path, lambda tmp: save_file(state, tmp, metadata=metadata))


def read_model_file(path: str | os.PathLike) -> tuple[ViTConfig, dict[str, Any], dict[str, Any]]:
    """``(config, state_dict, extra)`` of a file written by :func:`save_model`; clear errors for a
    missing, non-safetensors or non-vitkit file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} does not exist.")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            state = {key: handle.get_tensor(key) for key in handle.keys()}
    except (SafetensorError, OSError, ValueError) as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}); vitkit model files are written by "
            "vitkit.save_model (training checkpoints are exported with tools/train.py or save_model)."
        ) from None
    if CONFIG_KEY not in metadata:
        raise ValueError(f"{path} has no vitkit config in its metadata; was it written by vitkit.save_model?")
    config = ViTConfig.from_dict(json.loads(metadata[CONFIG_KEY]))
    return config, state, json.loads(metadata.get(EXTRA_KEY, "{}"))


def load_model(path: str | os.PathLike, **overrides: Any) -> VisionTransformer:
    """Rebuild a model saved by :func:`save_model`. ``overrides`` change fields that keep the
    weights' shapes (``attn_impl``, ``drop_path_rate``, ``dynamic_img_size``) or ``img_size``, for
    which the position embedding is resampled bicubically. Never unpickles anything."""
    config, state, _ = read_model_file(path)
    model = VisionTransformer(config.replace(**overrides))
    model.load_weights(state, source_grid=config.grid_size)
    return model
