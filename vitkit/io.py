"""Model files: safetensors weights plus a JSON config, no pickle."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from .files import atomic_write
from .models.config import ViTConfig
from .models.vision_transformer import VisionTransformer
from .schema import ConfigError, FieldError, bounds, check_value

FORMAT_KEY = "vitkit_format"
CONFIG_KEY = "vitkit_config"
EXTRA_KEY = "vitkit_extra"
FORMAT_VERSION = "1"


class ModelFileError(ConfigError):
    """A model file that is not a readable vitkit model (the message names the file)."""


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
    """``(config, state_dict, extra)`` of a file written by :func:`save_model`. The metadata is
    validated (config fields, types and ranges like a recipe's; ``extra``'s class names and
    normalisation) before any tensor is read.

    Raises:
        FileNotFoundError: no such file.
        ModelFileError: not a safetensors file, not written by vitkit, or invalid metadata.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"model file {path} does not exist.")
    try:
        with safe_open(str(path), framework="pt") as handle:
            metadata = handle.metadata() or {}
            config, extra = _read_metadata(metadata, path)
            state = {key: handle.get_tensor(key) for key in handle.keys()}
    except ModelFileError:
        raise
    except (SafetensorError, OSError, ValueError) as error:
        raise ModelFileError(
            f"{path} is not a readable safetensors file ({error}); vitkit model files are written by "
            "vitkit.save_model (training checkpoints are exported with tools/train.py or save_model)."
        ) from None
    return config, state, extra


def _read_metadata(metadata: dict[str, str], path: Path) -> tuple[ViTConfig, dict[str, Any]]:
    """The validated :class:`ViTConfig` and ``extra`` dict of a model file's metadata."""
    if CONFIG_KEY not in metadata:
        raise ModelFileError(f"{path} has no vitkit config in its metadata; was it written by vitkit.save_model?")
    source = f"the metadata of model file {path}"
    config = ViTConfig.from_dict(
        _json_object(metadata[CONFIG_KEY], CONFIG_KEY, path), source=source, error=ModelFileError
    )
    extra = _json_object(metadata.get(EXTRA_KEY, "{}"), EXTRA_KEY, path)
    try:
        names = check_value("class_names", extra.get("class_names"), tuple[str, ...] | None)
        if names is not None and len(names) != config.num_classes:
            raise FieldError("class_names", f"has {len(names)} names for the model's {config.num_classes} classes.")
        for key in ("mean", "std"):
            values = check_value(key, extra.get(key), tuple[float, ...] | None, bounds(gt=0) if key == "std" else {})
            if values is not None and len(values) != config.in_chans:
                raise FieldError(key, f"has {len(values)} values for the model's {config.in_chans} channel(s).")
    except FieldError as error:
        raise ModelFileError(f"{error.key} in {source} {error.problem}") from None
    return config, extra


def _json_object(text: str, key: str, path: Path) -> dict[str, Any]:
    """The JSON object stored under metadata ``key`` of model file ``path``."""
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as error:
        reason = error.msg if isinstance(error, json.JSONDecodeError) else "nested too deeply"
        raise ModelFileError(
            f"model file {path}: its metadata {key!r} is not valid JSON ({reason}); the file is damaged or was "
            "not written by vitkit.save_model."
        ) from None
    if not isinstance(value, dict):
        raise ModelFileError(
            f"model file {path}: its metadata {key!r} must be a JSON object, got {type(value).__name__}."
        )
    return value


def load_model(path: str | os.PathLike, **overrides: Any) -> VisionTransformer:
    """Rebuild a model saved by :func:`save_model`. ``overrides`` change fields that keep the
    weights' shapes (``attn_impl``, ``drop_path_rate``, ``dynamic_img_size``) or ``img_size``, for
    which the position embedding is resampled bicubically. Never unpickles anything."""
    config, state, _ = read_model_file(path)
    model = VisionTransformer(config.replace(**overrides))
    model.load_weights(state, source_grid=config.grid_size)
    return model
