"""Batched transforms for in-memory ``uint8`` image arrays: pad-and-crop, horizontal flip and
Normalize on a whole batch at once, in torch.

The per-image albumentations pipeline (:mod:`.transforms`) costs tens of microseconds per image in
Python, which for 28x28 or 32x32 images is comparable to a small ViT's own training step. When a
recipe asks only for what this module does, :func:`build_batch_transform` returns a transform
that :class:`~vitkit.data.ArrayDataset` applies to a batch of indices in one call, with the same
distribution of outputs as the per-image pipeline.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .config import AugmentConfig
from .info import DataInfo


class BatchTransform:
    """``uint8 [B, H, W, C]`` images to normalised ``float32 [B, C, H, W]``, optionally augmented.

    Args:
        info: the dataset's geometry and normalisation statistics.
        padding: zero padding on each side before a random crop back to ``H x W`` (0: no crop).
        hflip: probability of mirroring each image left-right.
    """

    def __init__(self, info: DataInfo, padding: int = 0, hflip: float = 0.0) -> None:
        self.padding = padding
        self.hflip = hflip
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
            flip = torch.rand(batch.shape[0]) < self.hflip
            batch = torch.where(flip.view(-1, 1, 1, 1), batch.flip(-1), batch)
        return batch.float().mul_(self.scale).add_(self.shift).contiguous()

    def __repr__(self) -> str:
        return f"BatchTransform(padding={self.padding}, hflip={self.hflip})"


def random_crop(batch: torch.Tensor, padding: int) -> torch.Tensor:
    """Zero-pad ``[B, C, H, W]`` by ``padding`` on every side and cut a random ``H x W`` window
    from each image (offsets uniform in ``0..2*padding``, as albumentations' PadIfNeeded + RandomCrop)."""
    size_b, _, height, width = batch.shape
    padded = F.pad(batch, (padding,) * 4)
    top = torch.randint(0, 2 * padding + 1, (size_b, 1, 1))
    left = torch.randint(0, 2 * padding + 1, (size_b, 1, 1))
    rows = (top + torch.arange(height).view(1, -1, 1)).expand(-1, -1, width)
    cols = (left + torch.arange(width).view(1, 1, -1)).expand(-1, height, -1)
    index = torch.arange(size_b).view(-1, 1, 1)
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
    return BatchTransform(info, padding=padding, hflip=float(augment.hflip or 0.0))
