"""Image transforms: albumentations for crop, flip, colour jitter and Normalize; timm's
RandAugment / AutoAugment / AugMix policies (which work on PIL images) in between, and timm's
``RandomErasing`` on the normalised tensor.

Every transform maps one image (``uint8`` array ``[H, W, C]`` or PIL image) to a normalised
``float32`` tensor ``[C, H, W]``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import albumentations as A
import numpy as np
import torch
from albumentations.pytorch import ToTensorV2
from PIL import Image
from timm.data.random_erasing import RandomErasing

from .config import AugmentConfig, timm_policy
from .images import to_array
from .info import DataInfo

PilPolicy = Callable[[Image.Image], Image.Image]


class ImageTransform:
    """``spatial`` (albumentations) -> optional PIL ``policy`` -> ``finish`` (albumentations,
    ending in Normalize and ToTensorV2) -> optional ``erase`` (timm's ``RandomErasing``)."""

    def __init__(
        self, spatial: A.Compose, finish: A.Compose, policy: PilPolicy | None = None,
        erase: RandomErasing | None = None,
    ) -> None:
        self.spatial = spatial
        self.policy = policy
        self.finish = finish
        self.erase = erase

    def __call__(self, image: Image.Image | np.ndarray) -> torch.Tensor:
        array = self.spatial(image=to_array(image))["image"]
        if self.policy is not None:
            array = _apply_policy(self.policy, array)
        tensor = self.finish(image=array)["image"]
        return tensor if self.erase is None else self.erase(tensor)

    def __repr__(self) -> str:
        return (
            f"ImageTransform(spatial={self.spatial}, policy={self.policy}, finish={self.finish}, erase={self.erase})"
        )


def build_eval_transform(info: DataInfo) -> ImageTransform:
    """Resize the shorter side to ``img_size / crop_pct``, centre-crop ``img_size``, Normalize."""
    height, width = info.img_size
    resize = math.ceil(max(height, width) / info.crop_pct)
    spatial = A.Compose([A.SmallestMaxSize(max_size=resize), A.CenterCrop(height, width)])
    return ImageTransform(spatial, _finish(info, color_jitter=0.0))


def build_train_transform(augment: AugmentConfig, info: DataInfo) -> ImageTransform:
    """Training transform for ``augment`` (resolved: ``crop`` and ``hflip`` set, see
    :meth:`DataConfig.resolved`): crop, flip, timm policy, colour jitter, Normalize."""
    if not augment.enabled:
        return build_eval_transform(info)
    if augment.crop is None or augment.hflip is None:
        raise ValueError("augment.crop and augment.hflip are unset; pass DataConfig.resolved().augment.")
    height, width = info.img_size
    if augment.crop == "random_resized":
        crops = [A.RandomResizedCrop(size=(height, width), scale=augment.scale, ratio=augment.ratio)]
    elif augment.crop == "pad":
        pad = augment.padding
        crops = [
            A.Resize(height, width),
            A.PadIfNeeded(height + 2 * pad, width + 2 * pad, border_mode=0, fill=0),
            A.RandomCrop(height, width),
        ]
    else:
        crops = [A.Resize(height, width)]
    spatial = A.Compose([*crops, A.HorizontalFlip(p=augment.hflip)])
    policy = _timm_policy(augment.rand_augment, info) if augment.rand_augment else None
    erase = None
    if augment.random_erasing > 0:
        (min_area, max_area), (min_aspect, max_aspect) = augment.erasing_area, augment.erasing_aspect
        erase = RandomErasing(augment.random_erasing, min_area, max_area, min_aspect, max_aspect,
                              mode=augment.erasing_mode, device="cpu")
    return ImageTransform(spatial, _finish(info, augment.color_jitter), policy, erase)


def denormalize(images: torch.Tensor, info: DataInfo) -> torch.Tensor:
    """Undo Normalize for display: ``[C, H, W]`` or ``[B, C, H, W]`` -> same shape in ``[0, 1]``."""
    shape = (-1, 1, 1)
    mean = torch.tensor(info.mean, dtype=images.dtype, device=images.device).view(shape)
    std = torch.tensor(info.std, dtype=images.dtype, device=images.device).view(shape)
    return (images * std + mean).clamp(0.0, 1.0)


def _finish(info: DataInfo, color_jitter: float) -> A.Compose:
    jitter = [A.ColorJitter(color_jitter, color_jitter, color_jitter, hue=0.0, p=1.0)] if color_jitter > 0 else []
    return A.Compose([*jitter, A.Normalize(mean=info.mean, std=info.std, max_pixel_value=255.0), ToTensorV2()])


def _timm_policy(policy: str, info: DataInfo) -> PilPolicy:
    # timm fills uncovered pixels with the mean colour; policies always see RGB (see _apply_policy).
    rgb_mean = info.mean if len(info.mean) == 3 else info.mean * 3
    hparams = {"translate_const": int(min(info.img_size) * 0.45), "img_mean": tuple(round(255 * m) for m in rgb_mean)}
    return timm_policy(policy, hparams)


def _apply_policy(policy: PilPolicy, array: np.ndarray) -> np.ndarray:
    """Run a timm policy on an ``[H, W, C]`` array; grayscale goes through RGB and back."""
    gray = array.shape[-1] == 1
    array = np.ascontiguousarray(array)
    image = Image.fromarray(array[..., 0]).convert("RGB") if gray else Image.fromarray(array)
    result = policy(image)
    return to_array(result.convert("L") if gray else result)
