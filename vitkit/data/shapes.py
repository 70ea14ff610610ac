"""Procedurally generated shapes: one coloured circle, square, triangle, cross, star or ring per
image, at a random position and scale on a noisy background. Each image knows its object's
bounding box, so attention maps can be scored on how well they localise the object.

Two styles: ``'flat'`` (the default) fills each object with one colour on a uniform noisy
background; ``'textured'`` fills it with a random stripe, checker or noise pattern and draws a
cluttered background (smooth colour blobs, stronger noise and a few distractor strokes in the
object's colour range), so neither the object nor the background is a run of identical tokens.

Generation is vectorised numpy: 6,000 images of 32x32 take a fraction of a second.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from timm.layers import to_2tuple

from .arrays import ArrayDataset, Transform, convert_array_channels, convert_stats
from .config import SHAPES_STYLES, ShapesStyle
from .info import DataInfo

#: Statistics of the generated images (default noise), per RGB channel.
SHAPES_MEAN: tuple[float, ...] = (0.465, 0.465, 0.465)
SHAPES_STD: tuple[float, ...] = (0.315, 0.315, 0.315)

#: Each shape as a mask over coordinates ``(u, v)`` centred on the object, in units of its
#: radius (``u`` right, ``v`` down); all fit in the unit square ``|u|, |v| <= 1``.
_SHAPES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "circle": lambda u, v: u**2 + v**2 <= 1.0,
    "square": lambda u, v: np.maximum(abs(u), abs(v)) <= 0.8,
    "triangle": lambda u, v: (v <= 0.75) & (abs(u) <= (v + 0.9) * 0.6),
    "cross": lambda u, v: ((abs(u) <= 0.3) & (abs(v) <= 0.95)) | ((abs(v) <= 0.3) & (abs(u) <= 0.95)),
    "star": lambda u, v: np.hypot(u, v) <= _star_radius(np.arctan2(u, -v)),
    "ring": lambda u, v: (np.hypot(u, v) <= 1.0) & (np.hypot(u, v) >= 0.55),
}
SHAPE_CLASSES: tuple[str, ...] = tuple(_SHAPES)

#: ``'textured'`` style: background blob grid (control points per side), blob amplitude,
#: object pattern amplitude (0-255 scale), distractor strokes per image and their half-width (px).
_BLOB_GRID = 4
_DARK, _LIGHT = (0.0, 0.35), (0.5, 1.0)  # colour ranges of dark and light objects/backgrounds
_BLOB_AMPLITUDE = 45.0
_TEXTURE_AMPLITUDE = 70.0
_STROKES = 4
_STROKE_HALF_WIDTH = (0.5, 1.1)

_CHUNK = 512  # images rendered at once, bounding the memory of the coordinate grids


def _star_radius(angle: np.ndarray) -> np.ndarray:
    """Outline of a five-pointed star (one tip up): radius 1 at the tips, 0.45 between them."""
    phase = (angle * 5 / (2 * np.pi)) % 1.0
    return 0.45 + 0.55 * abs(2 * phase - 1)


def generate_shapes(
    num_samples: int,
    img_size: int | tuple[int, int] = 32,
    seed: int | Sequence[int] = 0,
    noise_std: float = 0.06,
    scale: tuple[float, float] = (0.3, 0.9),
    style: ShapesStyle = "flat",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Render ``num_samples`` images, classes balanced and shuffled.

    Args:
        num_samples: number of images ``N``.
        img_size: ``H`` or ``(H, W)``.
        seed: the same seed (an int or a sequence of ints) gives the same images.
        noise_std: std of the Gaussian background noise (0-1 scale).
        scale: range of the object's diameter as a fraction of ``min(H, W)``.
        style: ``'flat'`` (one colour per object, uniform background) or ``'textured'``
            (patterned objects on a background of colour blobs and distractor strokes; the
            object geometry, labels and boxes equal the flat style's for the same seed).

    Returns:
        ``(images [N, H, W, 3] uint8, labels [N], boxes [N, 4])``; ``boxes[i] = (x0, y0, x1, y1)``
        with ``images[i, y0:y1, x0:x1]`` the tightest window holding every object pixel.
    """
    height, width = to_2tuple(img_size)
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(num_samples) % len(SHAPE_CLASSES))
    radius = rng.uniform(*scale, num_samples) * min(height, width) / 2
    centre_x = rng.uniform(radius, width - radius)
    centre_y = rng.uniform(radius, height - radius)
    # Dark objects on light backgrounds or the reverse: every channel differs by at least 0.15.
    dark = rng.uniform(*_DARK, (num_samples, 3))
    light = rng.uniform(*_LIGHT, (num_samples, 3))
    inverted = (rng.random(num_samples) < 0.5)[:, None]
    background = np.where(inverted, light, dark).astype(np.float32) * 255
    colour = _to_uint8(np.where(inverted, dark, light) * 255)
    noise = rng.standard_normal((num_samples, height, width, 3), dtype=np.float32)
    noise *= noise_std * 255
    if style == "flat":
        images = _to_uint8(noise + background[:, None, None, :])
        fill = None
    elif style == "textured":
        images, fill = _textured_layers(rng, noise, background, colour, inverted, (height, width))
    else:
        raise ValueError(f"shapes style must be one of {SHAPES_STYLES}, got {style!r}.")

    boxes = np.empty((num_samples, 4), dtype=np.int64)
    xs, ys = np.arange(width, dtype=np.float32) + 0.5, np.arange(height, dtype=np.float32) + 0.5
    for label, draw in enumerate(_SHAPES.values()):
        members = np.flatnonzero(labels == label)
        for start in range(0, len(members), _CHUNK):
            idx = members[start : start + _CHUNK]
            r = radius[idx, None, None].astype(np.float32)
            u = (xs[None, None, :] - centre_x[idx, None, None].astype(np.float32)) / r
            v = (ys[None, :, None] - centre_y[idx, None, None].astype(np.float32)) / r
            mask = draw(u, v)
            inside = colour[idx, None, None] if fill is None else fill[idx]
            images[idx] = np.where(mask[..., None], inside, images[idx])
            boxes[idx] = _mask_boxes(mask)
    return images, labels.astype(np.int64), boxes


def _textured_layers(
    rng: np.random.Generator,
    noise: np.ndarray,
    background: np.ndarray,
    colour: np.ndarray,
    inverted: np.ndarray,
    size: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray]:
    """The ``'textured'`` style's ``(background image, object fill)``, both ``[N, H, W, 3]`` uint8.

    Background: the base colour plus smooth colour blobs (a random ``_BLOB_GRID`` grid per
    channel, bilinearly upsampled, kept in the background's colour range), the noise, and
    ``_STROKES`` line segments in colours of the object's range. Object fill: its colour modulated
    by stripes (random angle, period and phase), a checkerboard (random cell size and offset) or
    per-pixel noise, within the object's colour range, plus the noise.
    """
    n, (height, width) = len(background), size
    ys = np.arange(height, dtype=np.float32) + 0.5
    xs = np.arange(width, dtype=np.float32) + 0.5
    # Smooth blobs: bilinear interpolation matrices from the coarse grid to pixel rows / columns.
    grid = rng.uniform(-1.0, 1.0, (n, _BLOB_GRID, _BLOB_GRID, 3)).astype(np.float32)
    rows, cols = _interpolation_matrix(height, _BLOB_GRID), _interpolation_matrix(width, _BLOB_GRID)
    blobs = np.einsum("hg,ngkc,wk->nhwc", rows, grid, cols, optimize=True) * _BLOB_AMPLITUDE
    # Blobs stay inside the background's colour range (dark 0-0.35 or light 0.5-1), so the
    # object keeps its contrast in every channel, as in the flat style.
    low = np.where(inverted, _LIGHT[0], _DARK[0]).astype(np.float32)[:, None, None, :] * 255
    high = np.where(inverted, _LIGHT[1], _DARK[1]).astype(np.float32)[:, None, None, :] * 255
    base = np.clip(background[:, None, None, :] + blobs, low, high) + noise

    # Distractor strokes: segments (p, q) drawn where a pixel is within the half-width of them.
    ends = rng.uniform(0.0, 1.0, (n, _STROKES, 4)).astype(np.float32) * np.array([width, height] * 2, np.float32)
    half_width = rng.uniform(*_STROKE_HALF_WIDTH, (n, _STROKES)).astype(np.float32)
    stroke_colour = np.where(
        inverted[:, None], rng.uniform(*_DARK, (n, _STROKES, 3)), rng.uniform(*_LIGHT, (n, _STROKES, 3))
    ).astype(np.float32) * 255
    for start in range(0, n, _CHUNK):
        part = slice(start, start + _CHUNK)
        px, py, qx, qy = (ends[part, :, i, None, None] for i in range(4))
        dx, dy = qx - px, qy - py
        t = ((xs[None, None, None, :] - px) * dx + (ys[None, None, :, None] - py) * dy) / np.maximum(
            dx**2 + dy**2, 1e-6
        )
        t = np.clip(t, 0.0, 1.0)
        dist = np.hypot(xs[None, None, None, :] - (px + t * dx), ys[None, None, :, None] - (py + t * dy))
        for k in range(_STROKES):  # later strokes over earlier ones
            on = (dist[:, k] <= half_width[part, k, None, None])[..., None]
            base[part] = np.where(on, stroke_colour[part, k, None, None, :], base[part])

    # Object patterns in [-1, 1]: 0 stripes, 1 checkerboard, 2 per-pixel noise.
    kind = rng.integers(0, 3, n)
    angle = rng.uniform(0.0, np.pi, n).astype(np.float32)[:, None, None]
    period = rng.uniform(3.0, 6.0, n).astype(np.float32)[:, None, None]
    phase = rng.uniform(0.0, 2 * np.pi, n).astype(np.float32)[:, None, None]
    cell = rng.integers(2, 4, n).astype(np.float32)[:, None, None]
    offset = rng.integers(0, 4, (n, 2)).astype(np.float32)
    speckle = rng.uniform(-1.0, 1.0, (n, height, width)).astype(np.float32)
    along = xs[None, None, :] * np.cos(angle) + ys[None, :, None] * np.sin(angle)
    stripes = np.sin(2 * np.pi * along / period + phase)
    checker = 2.0 * (
        (np.floor((xs[None, None, :] + offset[:, 0, None, None]) / cell)
         + np.floor((ys[None, :, None] + offset[:, 1, None, None]) / cell)) % 2
    ) - 1.0
    pattern = np.where((kind == 0)[:, None, None], stripes, np.where((kind == 1)[:, None, None], checker, speckle))
    # Each channel moves with the pattern towards the wider side of the object's colour range
    # (dark 0-0.35 or light 0.5-1), by up to _TEXTURE_AMPLITUDE, never leaving the range.
    base_colour = colour.astype(np.float32)
    obj_low = np.where(inverted, _DARK[0], _LIGHT[0]).astype(np.float32) * 255
    obj_high = np.where(inverted, _DARK[1], _LIGHT[1]).astype(np.float32) * 255
    up, down = obj_high - base_colour, base_colour - obj_low
    step = np.where(up >= down, np.minimum(up, _TEXTURE_AMPLITUDE), -np.minimum(down, _TEXTURE_AMPLITUDE))
    fill = base_colour[:, None, None, :] + (pattern[..., None] + 1.0) / 2 * step[:, None, None, :]
    return _to_uint8(base), _to_uint8(fill + noise)


def _interpolation_matrix(pixels: int, points: int) -> np.ndarray:
    """``[pixels, points]`` weights interpolating ``points`` evenly spaced control values
    (first and last at the image's edges) linearly at each pixel centre."""
    position = (np.arange(pixels, dtype=np.float32) + 0.5) / pixels * (points - 1)
    weights = np.maximum(0.0, 1.0 - np.abs(position[:, None] - np.arange(points, dtype=np.float32)[None, :]))
    return weights.astype(np.float32)


def _to_uint8(values: np.ndarray) -> np.ndarray:
    """0-255 floats rounded and clipped to uint8."""
    return np.clip(np.rint(values), 0, 255).astype(np.uint8)


def _mask_boxes(mask: np.ndarray) -> np.ndarray:
    """``[n, H, W]`` non-empty masks -> ``[n, 4]`` boxes ``(x0, y0, x1, y1)``, end-exclusive."""
    cols, rows = mask.any(axis=1), mask.any(axis=2)
    if not rows.any(axis=1).all():
        raise RuntimeError("a shape rendered no pixel; raise the minimum scale.")
    x0, y0 = cols.argmax(axis=1), rows.argmax(axis=1)
    x1 = mask.shape[2] - cols[:, ::-1].argmax(axis=1)
    y1 = mask.shape[1] - rows[:, ::-1].argmax(axis=1)
    return np.stack([x0, y0, x1, y1], axis=1)


def shapes_info(img_size: int | tuple[int, int] = 32, in_chans: int = 3, crop_pct: float = 1.0) -> DataInfo:
    """:class:`DataInfo` of shapes images of ``img_size`` with ``in_chans`` channels."""
    return DataInfo(
        num_classes=len(SHAPE_CLASSES),
        class_names=SHAPE_CLASSES,
        img_size=tuple(int(side) for side in to_2tuple(img_size)),
        in_chans=in_chans,
        mean=convert_stats(SHAPES_MEAN, in_chans),
        std=convert_stats(SHAPES_STD, in_chans),
        name="shapes",
        crop_pct=crop_pct,
    )


class ShapesDataset(ArrayDataset):
    """Generated shapes as a dataset of ``(image [C, H, W] normalised, label)``.

    ``boxes[i] = (x0, y0, x1, y1)`` bounds sample ``i``'s object in pixels of the returned
    image as long as the transform keeps the geometry (the default eval transform does; training
    augmentation does not). ``images`` holds the raw ``[N, H, W, C]`` uint8 pixels.

    Args:
        num_samples: number of images.
        img_size: ``H`` or ``(H, W)``.
        seed: the same seed (an int or a sequence of ints) gives the same images.
        noise_std: std of the background noise (0-1 scale).
        in_chans: 3 (RGB) or 1 (grayscale).
        style: ``'flat'`` or ``'textured'`` (see :func:`generate_shapes`).
        scale: range of the object's diameter as a fraction of ``min(H, W)``.
        transform: image transform; ``None``: the eval transform of :func:`shapes_info`
            (the statistics to normalise with when it is passed in).
    """

    def __init__(
        self,
        num_samples: int = 1000,
        img_size: int | tuple[int, int] = 32,
        seed: int | Sequence[int] = 0,
        noise_std: float = 0.06,
        in_chans: int = 3,
        transform: Transform | None = None,
        style: ShapesStyle = "flat",
        scale: tuple[float, float] = (0.3, 0.9),
    ) -> None:
        from .transforms import build_eval_transform  # transforms imports albumentations: load lazily

        images, labels, self.boxes = generate_shapes(num_samples, img_size, seed, noise_std, scale, style)
        transform = transform or build_eval_transform(shapes_info(img_size, in_chans))
        super().__init__(convert_array_channels(images, in_chans), labels, transform)
