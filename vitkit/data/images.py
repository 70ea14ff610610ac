"""Reading image files with errors that name the file."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from PIL import Image

from ..errors import VitkitError

#: Exceptions PIL raises for unreadable, truncated or malicious (decompression-bomb) files.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)


class ImageReadError(VitkitError, OSError):
    """An image file that cannot be read; ``path`` names it."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"cannot read image {self.path}: {reason}")


def load_image(path: str | os.PathLike, in_chans: int | None = None) -> Image.Image:
    """Decode ``path`` completely.

    Args:
        path: image file.
        in_chans: 1 converts to grayscale (``'L'``), 3 to ``'RGB'``; transparent pixels become
            white. ``None`` keeps the file's own mode.

    Raises:
        ImageReadError: the file is missing, not an image, truncated or corrupt.
    """
    try:
        with Image.open(path) as image:
            image.load()
            return image if in_chans is None else convert_channels(image, in_chans)
    except _DECODE_ERRORS as err:
        raise ImageReadError(path, str(err) or type(err).__name__) from err


def convert_channels(image: Image.Image, in_chans: int) -> Image.Image:
    """``image`` as ``'L'`` (``in_chans=1``) or ``'RGB'`` (3), compositing any alpha onto white."""
    if in_chans not in (1, 3):
        raise ValueError(f"in_chans must be 1 or 3, got {in_chans}.")
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return image.convert("L" if in_chans == 1 else "RGB")


def check_image(path: str | os.PathLike) -> str | None:
    """``None`` if ``path`` decodes, else the reason it does not. JPEGs are decoded at 1/8
    scale, which still reads every byte (truncation is caught) at a fraction of the cost."""
    try:
        with Image.open(path) as image:
            image.draft(image.mode, (1, 1))
            image.load()
    except _DECODE_ERRORS as err:
        return str(err) or type(err).__name__
    return None


def to_array(image: Image.Image | np.ndarray) -> np.ndarray:
    """A PIL image or array as a ``uint8`` array ``[H, W, C]`` (grayscale gets ``C = 1``)."""
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array
