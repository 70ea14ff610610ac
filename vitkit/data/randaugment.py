"""FixMatch's strong augmentation, batched in torch: RandAugment with a random magnitude per
operation, then Cutout (Sohn et al. 2020, "FixMatch", arXiv 2001.07685, section 2.3 and appendix;
the operations and ranges of USB's ``semilearn/datasets/augmentation/randaugment.py``, which
TorchSSL shares, after Cubuk et al. 2019, "RandAugment", arXiv 1909.13719).

Each image takes ``num_ops`` operations, each drawn uniformly from :data:`OPERATIONS` (with
replacement, as ``random.choices``) with a magnitude uniform in the operation's range, then one
Cutout square of side uniform in ``[0, cutout)`` times the image's width, centred uniformly and
clipped at the border, filled with the dataset's mean colour (USB fills CIFAR's mean, ``(125, 123, 114)``).

The operations act on pixel values in ``[0, 255]`` as PIL acts on ``uint8`` images: every result
is brought back to whole values as PIL does (blends truncate, the smoothing filter rounds), the
geometric ones take the nearest pixel and fill black, as PIL's ``transform`` and ``rotate`` do.
Instead of a Python loop per image, every operation runs on the whole batch and each image keeps
the result of the one it drew (``torch.where``), and the five geometric ones share one gather
through a per-image affine map: no host sync, so a GPU batch never waits. ``Color`` is the identity on one channel, as PIL's is on a grayscale image.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

#: ``(name, low, high)``: the operations and their magnitude ranges (USB's ``augment_list``).
OPERATIONS: tuple[tuple[str, float, float], ...] = (
    ("AutoContrast", 0.0, 1.0),
    ("Brightness", 0.05, 0.95),
    ("Color", 0.05, 0.95),
    ("Contrast", 0.05, 0.95),
    ("Equalize", 0.0, 1.0),
    ("Identity", 0.0, 1.0),
    ("Posterize", 4.0, 8.0),
    ("Rotate", -30.0, 30.0),
    ("Sharpness", 0.05, 0.95),
    ("ShearX", -0.3, 0.3),
    ("ShearY", -0.3, 0.3),
    ("Solarize", 0.0, 256.0),
    ("TranslateX", -0.3, 0.3),
    ("TranslateY", -0.3, 0.3),
)
OPERATION_NAMES: tuple[str, ...] = tuple(name for name, _, _ in OPERATIONS)
#: The operations that move pixels (one affine map each).
GEOMETRIC = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY")
#: ITU-R 601 luma, PIL's ``convert('L')``, by which ``Color`` and ``Contrast`` blend.
LUMA = (0.299, 0.587, 0.114)
#: PIL's ``ImageFilter.SMOOTH`` kernel, toward which ``Sharpness`` blends.
SMOOTH = ((1.0, 1.0, 1.0), (1.0, 5.0, 1.0), (1.0, 1.0, 1.0))


class BatchRandAugment:
    """FixMatch's strong augmentation of a batch ``[B, C, H, W]`` of pixel values in ``[0, 255]``
    (float), on the batch's device (see the module docstring).

    Args:
        num_ops: operations per image (USB's strong view: 3).
        cutout: the Cutout square's largest side as a fraction of the image width (USB's 0.5;
            0: no Cutout).
        fill: the Cutout colour per channel in ``[0, 255]`` (the dataset's mean).
    """

    def __init__(self, num_ops: int = 3, cutout: float = 0.5, fill: Sequence[float] = (127.5,)) -> None:
        self.num_ops = num_ops
        self.cutout = cutout
        self.fill = torch.tensor(fill, dtype=torch.float32).view(1, -1, 1, 1)

    def __call__(self, batch: torch.Tensor) -> torch.Tensor:
        """``[B, C, H, W]`` pixel values to the same, augmented and rounded."""
        size_b, device = batch.shape[0], batch.device
        for _ in range(self.num_ops):
            ops = torch.randint(len(OPERATIONS), (size_b,), device=device)
            unit = torch.rand(size_b, device=device)
            batch = self.apply(batch, ops, unit)
        if self.cutout > 0:
            batch = self.cut(batch, torch.rand(size_b, 3, device=device))
        return batch

    def apply(self, batch: torch.Tensor, ops: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
        """One round: image ``i`` undergoes operation ``OPERATIONS[ops[i]]`` at the magnitude
        ``low + (high - low) * unit[i]`` of its range. ``ops`` and ``unit`` ``[B]``."""
        low = torch.tensor([op[1] for op in OPERATIONS], device=batch.device)
        high = torch.tensor([op[2] for op in OPERATIONS], device=batch.device)
        value = low[ops] + (high - low)[ops] * unit
        result = warp(batch, affine_maps(ops, value, batch.shape[-2:]))  # the identity where no geometric op was drawn
        colour = {
            "AutoContrast": lambda: autocontrast(batch),
            "Brightness": lambda: blend(torch.zeros_like(batch), batch, value),
            "Color": lambda: blend(grayscale(batch).expand_as(batch), batch, value),
            "Contrast": lambda: blend((grayscale(batch).mean(dim=(1, 2, 3), keepdim=True) + 0.5).floor(), batch, value),
            "Equalize": lambda: equalize(batch),
            "Posterize": lambda: posterize(batch, value.long()),
            "Sharpness": lambda: blend(smooth(batch), batch, value),
            "Solarize": lambda: torch.where(batch >= value.view(-1, 1, 1, 1), 255.0 - batch, batch),
        }
        for name, operation in colour.items():
            chosen = (ops == OPERATION_NAMES.index(name)).view(-1, 1, 1, 1)
            result = torch.where(chosen, operation(), result)
        return result

    def cut(self, batch: torch.Tensor, unit: torch.Tensor) -> torch.Tensor:
        """USB's ``Cutout``: a square of side ``v = unit[:, 0] * cutout * W`` whose centre is
        ``(unit[:, 1] * W, unit[:, 2] * H)``, its corner ``(int(max(0, x - v/2)), int(max(0, y - v/2)))``,
        clipped at the border, filled with :attr:`fill`. ``unit`` ``[B, 3]`` uniform draws."""
        _, _, height, width = batch.shape
        side = unit[:, 0] * self.cutout * width
        left = (unit[:, 1] * width - side / 2).clamp_min(0).floor()
        top = (unit[:, 2] * height - side / 2).clamp_min(0).floor()
        cols = torch.arange(width, device=batch.device).view(1, -1)
        rows = torch.arange(height, device=batch.device).view(1, -1)
        in_cols = (cols >= left[:, None]) & (cols < left[:, None] + side[:, None])
        in_rows = (rows >= top[:, None]) & (rows < top[:, None] + side[:, None])
        inside = (in_rows[:, :, None] & in_cols[:, None, :]).unsqueeze(1)
        return torch.where(inside, self.fill.to(batch.device, batch.dtype), batch)

    def __repr__(self) -> str:
        return f"BatchRandAugment(num_ops={self.num_ops}, cutout={self.cutout})"


def blend(degenerate: torch.Tensor, batch: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageEnhance`` (``Image.blend``): ``degenerate + factor * (batch - degenerate)``,
    ``factor`` ``[B]``, clipped to ``[0, 255]`` and truncated to whole values."""
    return (degenerate + factor.view(-1, 1, 1, 1) * (batch - degenerate)).clamp(0, 255).floor()


def grayscale(batch: torch.Tensor) -> torch.Tensor:
    """``[B, 1, H, W]`` luma of RGB images (the image itself with one channel), rounded as PIL's ``L``."""
    if batch.shape[1] == 1:
        return batch
    weights = torch.tensor(LUMA, device=batch.device, dtype=batch.dtype).view(1, 3, 1, 1)
    return (batch * weights).sum(dim=1, keepdim=True).round()


def autocontrast(batch: torch.Tensor) -> torch.Tensor:
    """PIL's ``autocontrast``: each channel stretched linearly from its ``[min, max]`` to
    ``[0, 255]`` (truncated to whole values); a channel of one value is left as it is."""
    low = batch.amin(dim=(2, 3), keepdim=True)
    high = batch.amax(dim=(2, 3), keepdim=True)
    span = high - low
    # PIL's lookup table, in double: int(x * scale - low * scale) (a true division: ``255.0 / tensor`` is
    # torch's reciprocal times 255, a last bit away, which truncation can turn into a whole value)
    scale = torch.full_like(span, 255.0, dtype=torch.float64) / span.double().clamp_min(1.0)
    stretched = (batch.double() * scale - low.double() * scale).floor().clamp(0, 255).to(batch.dtype)
    return torch.where(span > 0, stretched, batch)


def equalize(batch: torch.Tensor) -> torch.Tensor:
    """PIL's ``equalize``, per channel: with ``h`` the histogram and ``step = (N - h[last value])
    // 255``, value ``i`` becomes ``(sum of h below i + step // 2) // step``; ``step`` 0 leaves the
    channel as it is."""
    size_b, chans, height, width = batch.shape
    values = batch.reshape(size_b * chans, -1).long().clamp(0, 255)
    hist = torch.zeros(size_b * chans, 256, dtype=torch.long, device=batch.device).scatter_add_(
        1, values, torch.ones_like(values)
    )
    last = hist.gather(1, values.amax(dim=1, keepdim=True))
    step = (height * width - last) // 255
    below = hist.cumsum(dim=1) - hist
    lut = torch.div(below + step // 2, step.clamp_min(1), rounding_mode="floor").clamp(max=255)
    mapped = torch.where(step > 0, lut.gather(1, values), values)
    return mapped.to(batch.dtype).view_as(batch)


def posterize(batch: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """PIL's ``posterize``: keep the top ``bits`` bits (``[B]``, 1 to 8) of each value."""
    quantum = (2.0 ** (8 - bits.clamp(1, 8))).to(batch.dtype).view(-1, 1, 1, 1)
    return torch.div(batch, quantum, rounding_mode="floor") * quantum


def smooth(batch: torch.Tensor) -> torch.Tensor:
    """PIL's ``ImageFilter.SMOOTH`` (3x3 kernel, weight 13) inside the image; the one-pixel border
    keeps its values, as PIL's filter leaves it (an image under 3 pixels in a side is all border)."""
    chans, height, width = batch.shape[1:]
    if height < 3 or width < 3:
        return batch.clone()
    kernel = torch.tensor(SMOOTH, device=batch.device, dtype=batch.dtype) / 13.0
    inner = F.conv2d(batch, kernel.expand(chans, 1, 3, 3), groups=chans).round()
    result = batch.clone()
    result[:, :, 1:-1, 1:-1] = inner
    return result


def affine_maps(ops: torch.Tensor, value: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """``[B, 2, 3]`` PIL affine coefficients ``(a, b, c), (d, e, f)`` of each image: an output
    pixel at ``(x, y)`` reads the input at ``(a x + b y + c, d x + e y + f)``. The identity for an
    image whose operation is not geometric. ``Rotate`` turns the image counter-clockwise by
    ``value`` degrees about its centre, as PIL's ``rotate``; the translations move by ``value``
    times the width (``TranslateX``) or the height (``TranslateY``), as USB's."""
    height, width = size
    size_b = ops.shape[0]
    maps = torch.zeros(size_b, 2, 3, device=ops.device)
    maps[:, 0, 0] = maps[:, 1, 1] = 1.0
    index = {name: ops == OPERATION_NAMES.index(name) for name in GEOMETRIC}
    maps[:, 0, 1] = torch.where(index["ShearX"], value, maps[:, 0, 1])
    maps[:, 1, 0] = torch.where(index["ShearY"], value, maps[:, 1, 0])
    maps[:, 0, 2] = torch.where(index["TranslateX"], value * width, maps[:, 0, 2])
    maps[:, 1, 2] = torch.where(index["TranslateY"], value * height, maps[:, 1, 2])
    angle = -value * (math.pi / 180.0)  # PIL: matrix (cos, sin, -sin, cos) of minus the angle, about the centre
    cos, sin = angle.cos(), angle.sin()
    centre_x, centre_y = width / 2.0, height / 2.0
    rotation = torch.stack([
        torch.stack([cos, sin, centre_x - cos * centre_x - sin * centre_y], dim=1),
        torch.stack([-sin, cos, centre_y + sin * centre_x - cos * centre_y], dim=1),
    ], dim=1)
    return torch.where(index["Rotate"].view(-1, 1, 1), rotation, maps)


def warp(batch: torch.Tensor, maps: torch.Tensor) -> torch.Tensor:
    """Each image resampled through its ``[2, 3]`` affine map (:func:`affine_maps`) as PIL's
    ``transform(AFFINE)`` with ``NEAREST``: the output pixel centred at ``(x + 0.5, y + 0.5)``
    takes the input pixel its mapped point falls in (the coordinates' floor), black outside."""
    size_b, chans, height, width = batch.shape
    ys, xs = torch.meshgrid(
        torch.arange(height, device=batch.device, dtype=torch.float32) + 0.5,
        torch.arange(width, device=batch.device, dtype=torch.float32) + 0.5,
        indexing="ij",
    )
    points = torch.stack([xs, ys, torch.ones_like(xs)], dim=-1).view(1, -1, 3)  # [1, H*W, 3]
    source = (points @ maps.float().transpose(1, 2)).floor().long()  # [B, H*W, 2] input pixels
    col, row = source[..., 0], source[..., 1]
    inside = (col >= 0) & (col < width) & (row >= 0) & (row < height)
    index = (row.clamp(0, height - 1) * width + col.clamp(0, width - 1)).unsqueeze(1).expand(-1, chans, -1)
    moved = batch.reshape(size_b, chans, -1).gather(2, index)
    return torch.where(inside.unsqueeze(1), moved, torch.zeros((), dtype=batch.dtype, device=batch.device)).view_as(batch)
