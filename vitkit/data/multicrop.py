"""DINO's multi-crop augmentation (Caron et al. 2021, https://arxiv.org/abs/2104.14294, section 3.1
and ``DataAugmentationDINO`` in facebookresearch/dino's ``main_dino.py``), batched in torch.

Each image gives two global crops and ``local_crops`` small ones. Every crop is a random resized
crop (torchvision's ``RandomResizedCrop`` distribution: an area fraction uniform in ``scale``, an
aspect ratio log-uniform in ``[3/4, 4/3]``, ten attempts, else the whole image), mirrored with
probability 1/2, then, as DINO: colour jitter with probability 0.8 (brightness and contrast 0.4,
saturation 0.2, hue 0.1; a grayscale image has neither saturation nor hue, and gets neither),
grayscale with probability 0.2 (colour images only), Gaussian blur (probability 1 for the first
global crop, 0.1 for the second, 0.5 for the local ones) and solarisation (the second global crop,
probability 0.2). DINO blurs 224-px crops with a radius up to 2 pixels; :data:`BLUR_SIGMA` keeps
a blur that still removes texture, not shape, on 16-32 px crops.

The crops of a whole batch are cut and resized in one ``grid_sample`` call per crop, so a batch of
small in-memory images costs a few milliseconds, not a Python loop per image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import Dataset

from .arrays import ArrayDataset
from .imagefolder import ImageFolderDataset

#: Range of the Gaussian blur's standard deviation, in pixels of the crop.
BLUR_SIGMA = (0.1, 1.0)
#: Probability of the blur for the first global crop, the second, and each local one (DINO's).
BLUR_PROBABILITY = (1.0, 0.1, 0.5)
#: Probability of solarising the second global crop (DINO's).
SOLARIZE_PROBABILITY = 0.2
#: DINO's colour jitter: probability, brightness, contrast and saturation strengths, and the hue's
#: (a turn of the colour wheel of up to 0.1 either way, torchvision's ``hue``).
JITTER_PROBABILITY, BRIGHTNESS, CONTRAST, SATURATION, HUE = 0.8, 0.4, 0.4, 0.2, 0.1
#: DINO's probability of a grayscale crop (colour images only).
GRAYSCALE_PROBABILITY = 0.2
#: Attempts of the random resized crop before it falls back to the whole image (torchvision's).
CROP_ATTEMPTS = 10
#: Luma weights of the grayscale conversion (torchvision's ``rgb_to_grayscale``).
LUMA = (0.299, 0.587, 0.114)


class MultiCrop:
    """uint8 images to DINO's list of normalised crops: two global ones, then ``local_crops`` local ones.

    Args:
        mean, std: per-channel normalisation of the crops (the dataset's).
        global_size: side of the global crops (the model's ``img_size``; the teacher sees these).
        local_size: side of the local crops (the student alone sees these).
        local_crops: number of local crops per image (0: two global crops only).
        global_scale, local_scale: range of the crops' area as a fraction of the image's.
        hflip: probability of mirroring each crop.
    """

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        *,
        global_size: int,
        local_size: int,
        local_crops: int,
        global_scale: tuple[float, float] = (0.4, 1.0),
        local_scale: tuple[float, float] = (0.05, 0.4),
        hflip: float = 0.5,
    ) -> None:
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.global_size, self.local_size, self.local_crops = global_size, local_size, local_crops
        self.global_scale, self.local_scale = tuple(global_scale), tuple(local_scale)
        self.hflip = hflip

    @property
    def num_crops(self) -> int:
        """Crops per image: 2 global and the local ones."""
        return 2 + self.local_crops

    def __call__(self, images: torch.Tensor) -> list[torch.Tensor]:
        """``uint8 [B, H, W, C]`` to ``[global [B, C, g, g]] * 2 + [local [B, C, l, l]] * local_crops``,
        normalised float32."""
        pixels = images.permute(0, 3, 1, 2).float().div_(255.0)
        settings = [
            (self.global_size, self.global_scale, BLUR_PROBABILITY[0], 0.0),
            (self.global_size, self.global_scale, BLUR_PROBABILITY[1], SOLARIZE_PROBABILITY),
            *[(self.local_size, self.local_scale, BLUR_PROBABILITY[2], 0.0)] * self.local_crops,
        ]
        return [self._crop(pixels, *setting) for setting in settings]

    def one(self, image: np.ndarray | Image.Image) -> list[torch.Tensor]:
        """One ``[H, W, C]`` (or ``[H, W]``) uint8 image or PIL image to its crops ``[C, s, s]``."""
        array = np.asarray(image, dtype=np.uint8)
        array = array[..., None] if array.ndim == 2 else array
        return [crop[0] for crop in self(torch.from_numpy(np.ascontiguousarray(array))[None])]

    def _crop(
        self, pixels: torch.Tensor, size: int, scale: tuple[float, float], blur: float, solarize: float
    ) -> torch.Tensor:
        crops = resized_crops(pixels, size, scale, self.hflip)
        crops = color_jitter(crops)
        crops = gaussian_blur(crops, torch.rand(len(crops)) < blur)
        if solarize > 0:
            solarized = (torch.rand(len(crops)) < solarize).view(-1, 1, 1, 1)
            crops = torch.where(solarized & (crops >= 0.5), 1.0 - crops, crops)  # PIL's solarize at 128
        return crops.sub_(self.mean).div_(self.std).contiguous()

    def __repr__(self) -> str:
        return (f"MultiCrop(global_size={self.global_size}, global_scale={self.global_scale}, local_size="
                f"{self.local_size}, local_scale={self.local_scale}, local_crops={self.local_crops}, hflip={self.hflip})")


def crop_boxes(batch: int, height: int, width: int, scale: tuple[float, float]) -> torch.Tensor:
    """``[B, 4]`` boxes ``(left, top, width, height)`` in pixels with torchvision's
    ``RandomResizedCrop.get_params`` distribution (ratio in ``[3/4, 4/3]``), its ten attempts drawn
    for every image at once; an image none of whose attempts fit takes the whole image."""
    area = torch.empty(batch, CROP_ATTEMPTS).uniform_(*scale) * (height * width)
    ratio = torch.empty(batch, CROP_ATTEMPTS).uniform_(math.log(3 / 4), math.log(4 / 3)).exp()
    widths, heights = (area * ratio).sqrt().round(), (area / ratio).sqrt().round()
    fits = (widths > 0) & (heights > 0) & (widths <= width) & (heights <= height)
    first = fits.int().argmax(dim=1, keepdim=True)
    w, h = widths.gather(1, first), heights.gather(1, first)
    found = fits.any(dim=1, keepdim=True)
    w, h = torch.where(found, w, float(width)), torch.where(found, h, float(height))
    left = (torch.rand(batch, 1) * (width - w + 1)).floor()
    top = (torch.rand(batch, 1) * (height - h + 1)).floor()
    return torch.cat([left, top, w, h], dim=1)


def resized_crops(pixels: torch.Tensor, size: int, scale: tuple[float, float], hflip: float) -> torch.Tensor:
    """A random resized crop (:func:`crop_boxes`) of each ``[B, C, H, W]`` image, bilinearly resized
    to ``size x size`` and mirrored with probability ``hflip``, in one ``grid_sample``."""
    batch, _, height, width = pixels.shape
    left, top, w, h = crop_boxes(batch, height, width, scale).unbind(1)
    mirror = torch.where(torch.rand(batch) < hflip, -1.0, 1.0)
    # The output's [-1, 1] square maps onto the box, in the input's normalised coordinates.
    theta = torch.zeros(batch, 2, 3)
    theta[:, 0, 0], theta[:, 0, 2] = mirror * w / width, (2 * left + w) / width - 1
    theta[:, 1, 1], theta[:, 1, 2] = h / height, (2 * top + h) / height - 1
    grid = F.affine_grid(theta, [batch, pixels.shape[1], size, size], align_corners=False)
    return F.grid_sample(pixels, grid, mode="bilinear", padding_mode="border", align_corners=False)


def color_jitter(crops: torch.Tensor) -> torch.Tensor:
    """DINO's colour jitter on ``[B, C, H, W]`` values in ``[0, 1]``, per image with probability
    :data:`JITTER_PROBABILITY` (brightness, then contrast, then saturation and hue for colour images;
    torchvision draws their order), then grayscale with probability :data:`GRAYSCALE_PROBABILITY`
    (colour only)."""
    batch = len(crops)
    jitter = (torch.rand(batch) < JITTER_PROBABILITY).view(-1, 1, 1, 1)

    def factor(strength: float) -> torch.Tensor:
        drawn = torch.empty(batch, 1, 1, 1).uniform_(1 - strength, 1 + strength)
        return torch.where(jitter, drawn, torch.ones(()))

    crops = (crops * factor(BRIGHTNESS)).clamp_(0, 1)
    mean = _gray(crops).mean(dim=(1, 2, 3), keepdim=True)
    crops = ((crops - mean) * factor(CONTRAST) + mean).clamp_(0, 1)
    if crops.shape[1] == 3:
        gray = _gray(crops)
        crops = ((crops - gray) * factor(SATURATION) + gray).clamp_(0, 1)
        crops = adjust_hue(crops, factor(HUE) - 1)
        to_gray = (torch.rand(batch) < GRAYSCALE_PROBABILITY).view(-1, 1, 1, 1)
        crops = torch.where(to_gray, _gray(crops).expand_as(crops), crops)
    return crops


def adjust_hue(crops: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Turn the hue of each ``[B, 3, H, W]`` RGB image in ``[0, 1]`` by its ``shift`` (``[B, 1, 1, 1]``,
    a fraction of the colour wheel in ``[-0.5, 0.5]``), saturation and value kept: torchvision's
    ``adjust_hue`` (RGB to HSV, hue shifted modulo 1, back), with a shift per image and the way back
    written as ``v - c * clamp(min(k, 4 - k), 0, 1)``, ``k = (n + 6h) mod 6`` for ``n = 5, 3, 1``."""
    value, low = crops.amax(dim=1, keepdim=True), crops.amin(dim=1, keepdim=True)
    chroma = value - low
    red, green, blue = crops.split(1, dim=1)
    step = torch.where(chroma > 0, chroma, torch.ones_like(chroma))  # a gray pixel: hue 0, chroma 0
    sextant = torch.where(
        value == red, (green - blue) / step, torch.where(value == green, 2 + (blue - red) / step, 4 + (red - green) / step)
    )
    hue = torch.remainder(sextant / 6 + shift, 1.0) * 6
    k = torch.remainder(torch.tensor([5.0, 3.0, 1.0], dtype=crops.dtype, device=crops.device).view(1, 3, 1, 1) + hue, 6)
    return value - chroma * torch.minimum(k, 4 - k).clamp(0, 1)


def _gray(crops: torch.Tensor) -> torch.Tensor:
    if crops.shape[1] != 3:
        return crops.mean(dim=1, keepdim=True)
    weights = torch.tensor(LUMA, dtype=crops.dtype).view(1, 3, 1, 1)
    return (crops * weights).sum(dim=1, keepdim=True)


def gaussian_blur(crops: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """A Gaussian blur of each chosen ``[B, C, H, W]`` image with its own sigma uniform in
    :data:`BLUR_SIGMA` (separable, reflected borders); the others are returned as they are."""
    if not bool(chosen.any()):
        return crops
    batch, chans, height, width = crops.shape
    radius = min(math.ceil(3 * BLUR_SIGMA[1]), min(height, width) - 1)  # reflection needs a smaller pad
    offsets = torch.arange(-radius, radius + 1, dtype=crops.dtype)
    sigma = torch.empty(batch, 1).uniform_(*BLUR_SIGMA)
    kernel = torch.exp(-0.5 * (offsets / sigma) ** 2)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)
    kernel = torch.where(chosen.view(-1, 1), kernel, (offsets == 0).to(crops.dtype))  # identity for the others
    weight = kernel.repeat_interleave(chans, dim=0)  # [B*C, k]: one kernel per image and channel
    flat = F.pad(crops.reshape(1, batch * chans, height, width), (radius,) * 4, mode="reflect")
    flat = F.conv2d(flat, weight.view(-1, 1, 1, 2 * radius + 1), groups=batch * chans)
    flat = F.conv2d(flat, weight.view(-1, 1, 2 * radius + 1, 1), groups=batch * chans)
    return flat.view(batch, chans, height, width)


def multi_crop_dataset(dataset: Dataset, crops: MultiCrop) -> Dataset:
    """``dataset``'s images (in memory, or a folder's files), each as its list of ``crops`` with its
    label: a DataLoader's batch is then ``([crop [B, C, s, s], ...], labels [B])``.

    Raises:
        TypeError: a dataset without stored images to crop (generated shapes).
    """
    if isinstance(dataset, ArrayDataset):
        return ArrayDataset(dataset.images, dataset.labels, crops.one, crops)
    if isinstance(dataset, ImageFolderDataset):
        return ImageFolderDataset(dataset.files, list(dataset.labels), crops.one, dataset.in_chans)
    raise TypeError(f"multi-crop needs images in memory or in a folder, not a {type(dataset).__name__}.")
