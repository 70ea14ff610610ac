"""In-memory image datasets (CIFAR, digits, shapes) and their deterministic stratified split."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from ..errors import VitkitError
from .batch_transforms import BatchTransform

#: One image (``uint8 [H, W, C]`` array or PIL image) -> float tensor ``[C, H, W]``.
Transform = Callable[[np.ndarray | Image.Image], torch.Tensor]
#: A batch of ``uint8 [B, H, W, C]`` images -> ``[B, C, H', W']`` (a :class:`BatchTransform`), or a
#: list of such views (:class:`~vitkit.data.multicrop.MultiCrop`).
BatchFunction = Callable[[torch.Tensor], torch.Tensor | list[torch.Tensor]]


class ArrayDataset(Dataset):
    """Images held as one ``uint8`` array, transformed on access.

    Args:
        images: ``[N, H, W, C]`` uint8.
        labels: ``[N]`` integer labels.
        transform: maps one ``[H, W, C]`` uint8 image to a float tensor ``[C, H', W']``.
        batch_transform: the same transform for a whole batch (``[B, H, W, C]`` uint8 tensor to
            ``[B, C, H', W']``, or to a list of such views, as DINO's crops), used by DataLoaders
            through ``__getitems__``; ``None``: per image.
    """

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        transform: Transform,
        batch_transform: BatchTransform | BatchFunction | None = None,
    ) -> None:
        if images.ndim != 4 or images.dtype != np.uint8:
            raise ValueError(f"images must be uint8 [N, H, W, C], got {images.dtype} {list(images.shape)}.")
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels.")
        self.images = images
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.batch_transform = batch_transform
        self._tensor = torch.from_numpy(images) if batch_transform is not None else None

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.transform(self.images[index]), int(self.labels[index])

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[torch.Tensor, int]]:
        """The samples at ``indices``, transformed as one batch when a batch transform is set
        (the DataLoader's collate then stacks them back: a cheap copy next to per-image work)."""
        if self._tensor is None:
            return [self[index] for index in indices]
        batch = self.batch_transform(self._tensor[torch.as_tensor(indices, dtype=torch.long)])
        labels = self.labels[np.asarray(indices)].tolist()
        if isinstance(batch, list):  # several views of each image: each sample holds its list of views
            return list(zip(map(list, zip(*(view.unbind(0) for view in batch))), labels))
        return list(zip(batch.unbind(0), labels))


def stratified_split(labels: np.ndarray, fractions: Sequence[float], seed: int) -> list[np.ndarray]:
    """Split indices ``0..N-1`` class by class, deterministically for a ``seed``.

    Args:
        labels: ``[N]`` integer labels.
        fractions: share of each class in every split but the first, which takes the rest
            (e.g. ``(0.1, 0.2)`` gives train/val/test of about 70/10/20 percent).
        seed: seed of the shuffle.

    Returns:
        ``len(fractions) + 1`` sorted index arrays that partition ``0..N-1``.
    """
    rng = np.random.default_rng(seed)
    parts: list[list[np.ndarray]] = [[] for _ in range(len(fractions) + 1)]
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        counts = [int(round(f * len(members))) for f in fractions]
        bounds = np.cumsum([0, *counts])
        for part, start, stop in zip(parts[1:], bounds[:-1], bounds[1:]):
            part.append(members[start:stop])
        parts[0].append(members[bounds[-1] :])
    return [np.sort(np.concatenate(part)) for part in parts]


def spread_over_classes(labels: np.ndarray, count: int, seed: int) -> np.ndarray:
    """``count`` indices of ``labels`` (all when fewer), as evenly over the classes as they allow:
    one image of each class in turn, each class's images in an order drawn by ``seed``. A split
    stored class by class (an image folder's) thus gives every class rather than the first one's
    first files.

    Returns:
        the chosen indices, in the order taken (class 0's first, class 1's first, ..., class 0's second).
    """
    rng = np.random.default_rng(seed)
    members = [rng.permutation(np.flatnonzero(labels == label)) for label in np.unique(labels)]
    order = [group[turn] for turn in range(max(map(len, members), default=0)) for group in members if turn < len(group)]
    return np.asarray(order[:count], dtype=np.int64)


#: Float32 working memory of :func:`resize_images` per chunk of images.
RESIZE_CHUNK_BYTES = 64 * 2**20


class ResizeMemoryError(VitkitError, MemoryError):
    """Resizing a split would need more memory than this machine has."""


def resize_images(images: np.ndarray, size: tuple[int, int], scale: float = 1.0) -> np.ndarray:
    """``[N, H, W, C]`` images times ``scale``, bilinearly resized to ``size``, as ``uint8``
    ``[N, size[0], size[1], C]``; unscaled images already at ``size`` are returned as they are.

    Images are resized a chunk at a time (about :data:`RESIZE_CHUNK_BYTES` of float32 each), so the
    memory needed is the ``uint8`` result plus one chunk, and the result is refused
    (:class:`ResizeMemoryError`) before allocation when it exceeds the memory this machine has free.
    """
    if tuple(images.shape[1:3]) == tuple(size) and scale == 1.0 and images.dtype == np.uint8:
        return images
    count, height, width, channels = images.shape
    check_free_memory(count, size, channels, "resizing")
    result = np.empty((count, size[0], size[1], channels), dtype=np.uint8)
    per_image = 4 * channels * max(height * width, size[0] * size[1])
    step = max(1, RESIZE_CHUNK_BYTES // per_image)
    for start in range(0, count, step):
        pixels = torch.from_numpy(images[start : start + step].astype(np.float32) * scale).permute(0, 3, 1, 2)
        if tuple(pixels.shape[2:]) != tuple(size):
            pixels = F.interpolate(pixels, size=size, mode="bilinear", align_corners=False)
        result[start : start + step] = pixels.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return result


def check_free_memory(count: int, size: tuple[int, int], channels: int, doing: str) -> None:
    """Refuse (:class:`ResizeMemoryError`) ``count`` ``uint8`` images of ``size`` and ``channels``
    that would take more than the memory free now, before anything is allocated."""
    needed = count * size[0] * size[1] * channels
    free = _free_memory()
    if free is not None and needed > free:
        raise ResizeMemoryError(
            f"{doing} {count:,} images to {size[0]}x{size[1]} needs {needed / 2**30:.1f} GiB, more than the "
            f"{free / 2**30:.1f} GiB of memory free; choose a smaller data.img_size."
        )


def _free_memory() -> int | None:
    """Bytes of memory available now: Linux's ``MemAvailable`` (free plus reclaimable cache), else
    the free physical pages; ``None`` where the OS says neither."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


#: ITU-R 601 luma weights, as PIL's ``convert('L')`` uses.
LUMA_WEIGHTS: tuple[float, float, float] = (0.299, 0.587, 0.114)


def convert_array_channels(images: np.ndarray, in_chans: int) -> np.ndarray:
    """``[N, H, W, C]`` uint8 with ``C`` in (1, 3) -> ``[N, H, W, in_chans]``: RGB to luma, or
    grayscale replicated to 3 channels."""
    channels = images.shape[-1]
    if channels == in_chans:
        return images
    if channels == 1:
        return np.repeat(images, in_chans, axis=-1)
    gray = images.astype(np.float32) @ np.asarray(LUMA_WEIGHTS, dtype=np.float32)
    return np.clip(np.rint(gray), 0, 255).astype(np.uint8)[..., None]


def convert_stats(values: Sequence[float], in_chans: int) -> tuple[float, ...]:
    """Per-channel statistics adapted like :func:`convert_array_channels` adapts the images."""
    if len(values) == in_chans:
        return tuple(values)
    if len(values) == 1:
        return tuple(values) * in_chans
    return (float(np.dot(values, LUMA_WEIGHTS)),)
