"""Checkpoints written atomically and read without unpickling code.

:class:`AtomicCheckpointIO` is Lightning's checkpoint plugin: every save goes to a temporary file
that replaces the target only once complete (a crash mid-save keeps the previous good file), and
every load uses ``torch.load(weights_only=True)``, which refuses pickled objects other than tensors
and plain containers. :func:`load_for_inference` rebuilds the model from a ``.ckpt`` or an exported
``.safetensors`` file.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from ..errors import VitkitError
from ..io import atomic_write, read_model_file
from ..models import ViTConfig, VisionTransformer
from .module import EMA_PREFIX, MODEL_PREFIX


class UnsafeCheckpointError(VitkitError, pickle.UnpicklingError):
    """A checkpoint holds pickled objects that could run code; it is not loaded."""


def load_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """``torch.load(path, weights_only=True)`` with clear errors for a missing or unsafe file.

    Raises:
        FileNotFoundError: no file at ``path``.
        UnsafeCheckpointError: the file pickles something other than tensors and plain containers.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {path} does not exist.")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it contains pickled objects other than tensors and plain Python "
            f"containers ({reason}). vitkit checkpoints never do, so the file was not written by vitkit "
            "or has been tampered with; it is not loaded because unpickling it could run arbitrary code."
        ) from None


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning checkpoint IO: atomic saves (temp file + ``os.replace``), ``weights_only`` loads."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any = None) -> None:
        atomic_write(path, lambda tmp: torch.save(checkpoint, tmp))

    def load_checkpoint(
        self, path: str | os.PathLike, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        return load_checkpoint(path, map_location=map_location or "cpu")


def load_for_inference(path: str | os.PathLike) -> tuple[VisionTransformer, dict[str, Any]]:
    """The model in eval mode and its ``extra`` metadata, from a vitkit ``.safetensors`` file or a
    training ``.ckpt`` (EMA weights when the run kept them). Never unpickles code."""
    path = Path(path)
    if path.suffix == ".safetensors":
        config, state, extra = read_model_file(path)
    elif path.suffix == ".ckpt":
        config, state, extra = _read_training_checkpoint(path)
    else:
        raise ValueError(f"{path}: expected a .safetensors model file or a training .ckpt checkpoint.")
    model = VisionTransformer(config)
    model.load_weights(state, source_grid=config.grid_size)
    return model.eval(), extra


def _read_training_checkpoint(path: Path) -> tuple[ViTConfig, dict[str, torch.Tensor], dict[str, Any]]:
    checkpoint = load_checkpoint(path)
    hparams = checkpoint.get("hyper_parameters", {})
    if "vit_config" not in hparams or "state_dict" not in checkpoint:
        raise ValueError(f"{path} is not a vitkit training checkpoint (no model config in its hyper-parameters).")
    weights = checkpoint["state_dict"]
    prefix = EMA_PREFIX if any(key.startswith(EMA_PREFIX) for key in weights) else MODEL_PREFIX
    state = {key[len(prefix):]: value for key, value in weights.items() if key.startswith(prefix)}
    return ViTConfig.from_dict(hparams["vit_config"]), state, dict(hparams.get("extra", {}))
