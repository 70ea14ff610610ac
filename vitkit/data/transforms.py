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
import cv2
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


#: OpenCV's resampling filter for each of :data:`INTERPOLATIONS` (albumentations resizes with OpenCV).
_CV2_INTERPOLATION = {
    "nearest": cv2.INTER_NEAREST,
    "bilinear": cv2.INTER_LINEAR,
    "bicubic": cv2.INTER_CUBIC,
    "area": cv2.INTER_AREA,
    "lanczos": cv2.INTER_LANCZOS4,
}


def build_eval_transform(info: DataInfo) -> ImageTransform:
    """Resize to ``floor(img_size / crop_pct)`` as ``info.crop_mode`` says (shorter side, both sides
    or longer side plus mean-colour padding), centre-crop ``img_size``, Normalize: timm's
    ``transforms_imagenet_eval`` sizes, with OpenCV's filter of ``info.interpolation``."""
    height, width = info.img_size
    scaled = (math.floor(height / info.crop_pct), math.floor(width / info.crop_pct))
    interpolation = _CV2_INTERPOLATION[info.interpolation]
    if info.crop_mode == "squash":
        resize = [A.Resize(*scaled, interpolation=interpolation)]
    elif info.crop_mode == "border":
        fill = tuple(round(255 * m) for m in info.mean)
        resize = [
            A.LongestMaxSize(max_size=max(scaled), interpolation=interpolation),
            A.PadIfNeeded(height, width, border_mode=cv2.BORDER_CONSTANT, fill=fill),
        ]
    else:
        resize = [A.SmallestMaxSize(max_size=max(scaled), interpolation=interpolation)]
    spatial = A.Compose([*resize, A.CenterCrop(height, width)])
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


def display_image(image: torch.Tensor, info: DataInfo) -> np.ndarray:
    """A normalised ``[C, H, W]`` model input as an ``[H, W, 3]`` float RGB array in ``[0, 1]``."""
    pixels = denormalize(image.float(), info).permute(1, 2, 0).numpy()
    return np.repeat(pixels, 3, axis=2) if pixels.shape[2] == 1 else pixels


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
