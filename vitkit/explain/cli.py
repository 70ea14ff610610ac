"""Shared by the explanation tools: model source arguments and loading (with the metadata the model
was trained with), image discovery in folders, and display images."""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

from ..data import DataInfo, denormalize
from ..errors import UsageError
from ..models import VisionTransformer, from_timm
from ..train import load_for_inference

IMAGE_SUFFIXES = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp"})

#: Eval crop of ImageNet models (resize the shorter side to img_size / 0.875, centre-crop).
IMAGENET_CROP_PCT = 0.875


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """``--checkpoint CKPT | --model NAME --timm-weights FILE``, for :func:`load_explained_model`."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", help="vitkit model file (.safetensors from training / save_model, or a .ckpt)")
    source.add_argument("--model", help="vitkit variant name (vitkit.list_models()), with --timm-weights")
    parser.add_argument("--timm-weights", help="timm ViT state dict (.safetensors or torch file) for --model")


def load_explained_model(
    checkpoint: str | os.PathLike | None = None,
    model_name: str | None = None,
    timm_weights: str | os.PathLike | None = None,
) -> tuple[VisionTransformer, dict[str, Any]]:
    """A model in eval mode and its saved metadata ``extra`` (``DataInfo.from_extra(extra)`` gives
    the preprocessing; ``extra["data_config"]``, when present, the training data).

    Either ``checkpoint`` (a vitkit ``.safetensors`` model file or training ``.ckpt``, whose saved
    metadata gives size, normalisation and class names) or ``model_name`` with ``timm_weights`` (a
    timm ViT state dict as ``.safetensors`` or a torch file read with ``weights_only=True``;
    ImageNet mean/std, the model's img_size, classes named by index).
    """
    if checkpoint is not None:
        return load_for_inference(checkpoint)
    if model_name is None or timm_weights is None:
        raise UsageError("give either a vitkit checkpoint, or a model name together with a timm weights file.")
    path = Path(timm_weights)
    if not path.is_file():
        raise FileNotFoundError(f"timm weights file {path} does not exist.")
    if path.suffix == ".safetensors":
        state = load_file(str(path))
    else:
        state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or "patch_embed.proj.weight" not in state:
        raise UsageError(f"{path} is not a timm ViT state dict (no 'patch_embed.proj.weight' tensor).")
    model = from_timm(state, name=model_name).eval()
    config = model.config
    info = DataInfo(
        num_classes=config.num_classes,
        class_names=tuple(f"class {i}" for i in range(config.num_classes)),
        img_size=config.img_size,
        in_chans=config.in_chans,
        mean=tuple(IMAGENET_DEFAULT_MEAN),
        std=tuple(IMAGENET_DEFAULT_STD),
        name="imagenet",
        crop_pct=IMAGENET_CROP_PCT,
    )
    return model, info.to_extra()


def find_images(paths: Iterable[str | os.PathLike]) -> list[Path]:
    """Files given directly, plus the image files (by suffix, recursively, sorted) of folders."""
    found: list[Path] = []
    for entry in map(Path, paths):
        if entry.is_dir():
            found.extend(sorted(p for p in entry.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES))
        else:
            found.append(entry)
    return found


def display_image(image: torch.Tensor, info: DataInfo) -> np.ndarray:
    """A normalised ``[C, H, W]`` model input as an ``[H, W, 3]`` float RGB array in ``[0, 1]``."""
    pixels = denormalize(image.float(), info).permute(1, 2, 0).numpy()
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels

