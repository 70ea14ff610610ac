"""Batched transforms for in-memory ``uint8`` image arrays: pad-and-crop, horizontal flip,
FixMatch's RandAugment (:mod:`.randaugment`), Normalize and random erasing on a whole batch at once, in torch.

The per-image albumentations pipeline (:mod:`.transforms`) costs tens of microseconds per image in
Python, which for 28x28 or 32x32 images is comparable to a small ViT's own training step. When a
recipe asks only for what this module does, :func:`build_batch_transform` returns a transform
that :class:`~vitkit.data.ArrayDataset` applies to a batch of indices in one call, with the same
distribution of outputs as the per-image pipeline.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .config import AugmentConfig, ErasingMode
from .info import DataInfo
from .randaugment import BatchRandAugment


class BatchTransform:
    """``uint8 [B, H, W, C]`` images to normalised ``float32 [B, C, H, W]``, optionally augmented,
    on the images' device (random numbers are drawn there: on a GPU, nothing waits on the host).

    Args:
        info: the dataset's geometry and normalisation statistics.
        padding: zero padding on each side before a random crop back to ``H x W`` (0: no crop).
        hflip: probability of mirroring each image left-right.
        erase: random erasing applied to the normalised batch, or ``None``.
        rand_augment: FixMatch's strong augmentation of the cropped, mirrored pixels before
            Normalize (:class:`~vitkit.data.randaugment.BatchRandAugment`), or ``None``.
    """

    def __init__(
        self, info: DataInfo, padding: int = 0, hflip: float = 0.0, erase: BatchRandomErasing | None = None,
        rand_augment: BatchRandAugment | None = None,
    ) -> None:
        self.padding = padding
        self.hflip = hflip
        self.erase = erase
        self.rand_augment = rand_augment
        # Normalize((x / 255 - mean) / std) as one multiply-add.
        std = torch.tensor(info.std, dtype=torch.float32).view(1, -1, 1, 1)
        mean = torch.tensor(info.mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.scale = 1.0 / (255.0 * std)
        self.shift = -mean / std

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """``[B, H, W, C]`` uint8 -> ``[B, C, H, W]`` float32."""
        batch = images.permute(0, 3, 1, 2)
        if self.padding > 0:
            batch = random_crop(batch, self.padding)
        if self.hflip > 0:
            flip = torch.rand(batch.shape[0], device=batch.device) < self.hflip
            batch = torch.where(flip.view(-1, 1, 1, 1), batch.flip(-1), batch)
        scale, shift = self.scale.to(batch.device), self.shift.to(batch.device)
        batch = batch.float() if self.rand_augment is None else self.rand_augment(batch.float())
        batch = batch.mul_(scale).add_(shift).contiguous()
        return batch if self.erase is None else self.erase(batch)

    def __repr__(self) -> str:
        return (f"BatchTransform(padding={self.padding}, hflip={self.hflip}, erase={self.erase}, "
                f"rand_augment={self.rand_augment})")


class BatchRandomErasing:
    """timm's ``RandomErasing`` (one rectangle, Zhong et al. 2017, arXiv 1708.04896) on a whole
    normalised batch ``[B, C, H, W]`` at once, with timm's distribution.

    Per image, with probability ``probability``: up to ten attempts draw an area fraction uniform
    in ``area`` and an aspect ratio log-uniform in ``aspect``, giving ``h = round(sqrt(A r))``,
    ``w = round(sqrt(A / r))``; the first attempt with ``h < H`` and ``w < W`` is placed at a
    uniform position and filled (``mode``); an image whose ten attempts all fail is kept, as in
    timm. Here the ten attempts are drawn for every image together instead of in a Python loop.
    """

    ATTEMPTS = 10

    def __init__(
        self,
        probability: float,
        area: tuple[float, float] = (0.02, 1 / 3),
        aspect: tuple[float, float] = (0.3, 1 / 0.3),
        mode: ErasingMode = "const",
    ) -> None:
        self.probability = probability
        self.area = area
        self.log_aspect = (math.log(aspect[0]), math.log(aspect[1]))
        self.mode = mode

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` float to the same, one rectangle erased in the chosen images."""
        size_b, chans, height, width = batch.shape
        device = batch.device
        target = torch.empty(size_b, self.ATTEMPTS, device=device).uniform_(*self.area) * (height * width)
        ratio = torch.empty(size_b, self.ATTEMPTS, device=device).uniform_(*self.log_aspect).exp()
        heights, widths = (target * ratio).sqrt().round().long(), (target / ratio).sqrt().round().long()
        fits = (heights < height) & (widths < width)
        first = fits.int().argmax(dim=1, keepdim=True)  # the first attempt that fits (0 if none does)
        h, w = heights.gather(1, first), widths.gather(1, first)  # [B, 1]
        erase = (torch.rand(size_b, 1, device=device) <= self.probability) & fits.any(dim=1, keepdim=True)
        top = (torch.rand(size_b, 1, device=device) * (height - h + 1)).long()  # uniform in 0..H-h, as random.randint
        left = (torch.rand(size_b, 1, device=device) * (width - w + 1)).long()
        rows = torch.arange(height, device=device).view(1, -1)
        cols = torch.arange(width, device=device).view(1, -1)
        in_rows = (rows >= top) & (rows < top + h) & erase  # [B, H]
        in_cols = (cols >= left) & (cols < left + w)  # [B, W]
        inside = (in_rows[:, :, None] & in_cols[:, None, :]).unsqueeze(1)  # [B, 1, H, W]
        return torch.where(inside, self._fill(size_b, chans, height, width, batch.dtype, device), batch)

    def _fill(
        self, size_b: int, chans: int, height: int, width: int, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        if self.mode == "pixel":
            return torch.randn(size_b, chans, height, width, dtype=dtype, device=device)
        if self.mode == "rand":
            return torch.randn(size_b, chans, 1, 1, dtype=dtype, device=device)
        return torch.zeros((), dtype=dtype, device=device)

    def __repr__(self) -> str:
        return f"BatchRandomErasing(probability={self.probability}, area={self.area}, mode={self.mode!r})"


def batch_random_erasing(augment: AugmentConfig) -> BatchRandomErasing | None:
    """``augment``'s random erasing for batches, or ``None`` when it is off."""
    if augment.random_erasing <= 0:
        return None
    return BatchRandomErasing(augment.random_erasing, augment.erasing_area, augment.erasing_aspect, augment.erasing_mode)


def random_crop(batch: torch.Tensor, padding: int) -> torch.Tensor:
    """Zero-pad ``[B, C, H, W]`` by ``padding`` on every side and cut a random ``H x W`` window
    from each image (offsets uniform in ``0..2*padding``, as albumentations' PadIfNeeded + RandomCrop)."""
    size_b, _, height, width = batch.shape
    device = batch.device
    padded = F.pad(batch, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (size_b, 1, 1), device=device)
    left = torch.randint(0, 2 * padding + 1, (size_b, 1, 1), device=device)
    rows = (top + torch.arange(height, device=device).view(1, -1, 1)).expand(-1, -1, width)
    cols = (left + torch.arange(width, device=device).view(1, 1, -1)).expand(-1, height, -1)
    index = torch.arange(size_b, device=device).view(-1, 1, 1)
    # Advanced indexing on dims 0, 2, 3 puts the index shape first: [B, H, W, C].
    return padded.permute(0, 2, 3, 1)[index, rows, cols].permute(0, 3, 1, 2)


def build_batch_transform(augment: AugmentConfig | None, info: DataInfo, image_size: tuple[int, int]) -> (
    BatchTransform | None
):
    """The batched equivalent of the per-image transform, or ``None`` when it has none.

    Args:
        augment: a resolved training augmentation, or ``None`` for the evaluation transform.
        info: dataset geometry and statistics (``crop_pct`` 1 is needed for evaluation).
        image_size: ``(H, W)`` of the stored images; they must already have the output size.
    """
    if tuple(image_size) != tuple(info.img_size):
        return None
    if augment is None or not augment.enabled:
        return BatchTransform(info) if info.crop_pct == 1.0 else None
    if augment.rand_augment or augment.color_jitter > 0 or augment.crop not in ("pad", "resize"):
        return None
    padding = augment.padding if augment.crop == "pad" else 0
    return BatchTransform(info, padding=padding, hflip=float(augment.hflip or 0.0), erase=batch_random_erasing(augment))
