"""Reading image files with errors that name the file.

Only regular files are opened (a FIFO would block the reader forever), and only images of at most
``PIL.Image.MAX_IMAGE_PIXELS`` pixels (89.5 million unless changed): a larger one is refused from
its header, before decoding, so one decoded image takes at most 4 bytes per pixel of that limit
(about 360 MB), plus its converted copy. 16-bit grayscale is scaled to 8 bits (65535 -> 255),
where PIL's own conversion would clip every value above 255 to white.
"""

from __future__ import annotations

import os
import stat
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

from ..errors import VitkitError

#: Exceptions PIL raises for unreadable, truncated or malicious (decompression-bomb) files.
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, Image.DecompressionBombError)

#: PIL's modes for 16-bit grayscale (PNG, TIFF, PGM); ``'I'`` (32-bit) is how PIL may open them too.
WIDE_GRAY_MODES = frozenset({"I;16", "I;16L", "I;16B", "I;16N", "I"})
_GRAY_MODES = WIDE_GRAY_MODES | {"1", "L", "LA"}
_MAX_16BIT = 65535

_SPECIAL_FILES = {
    stat.S_IFDIR: "a directory",
    stat.S_IFIFO: "a named pipe (FIFO)",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}

_PIXEL_LIMIT_HINT = (
    "images this large are refused to bound memory (it could be a decompression bomb); "
    "downscale the file, or raise PIL.Image.MAX_IMAGE_PIXELS if you trust it"
)


class ImageReadError(VitkitError, OSError):
    """An image file that cannot be read; ``path`` names it."""

    def __init__(self, path: str | os.PathLike, reason: str) -> None:
        self.path = Path(path)
        self.reason = reason
        super().__init__(f"cannot read image {self.path}: {reason}")


def files_under(folder: str | os.PathLike) -> Iterator[Path]:
    """Every file under ``folder``, recursively, symlinked folders followed as torchvision's
    ``ImageFolder`` follows them (each real folder once, so a link to a parent ends, not loops)."""
    seen: set[str] = set()
    for root, folders, files in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in seen:
            folders[:] = []
            continue
        seen.add(real)
        yield from (Path(root, name) for name in files)


def is_grayscale(path: str | os.PathLike) -> bool:
    """``path`` is stored as one channel (8- or 16-bit gray, or 1-bit), read from its header."""
    try:
        with Image.open(path) as image:
            return image.mode in _GRAY_MODES
    except _DECODE_ERRORS:
        return False  # unreadable: reported where it is loaded, and no reason to drop colour


def image_size(path: str | os.PathLike) -> tuple[int, int] | None:
    """``(width, height)`` of ``path`` read from its header, ``None`` when unreadable."""
    try:
        with Image.open(path) as image:
            return image.size
    except _DECODE_ERRORS:
        return None


def load_image(path: str | os.PathLike, in_chans: int | None = None) -> Image.Image:
    """Decode ``path`` completely, turned upright by its EXIF orientation (as photo viewers show it).

    Args:
        path: image file.
        in_chans: 1 converts to grayscale (``'L'``), 3 to ``'RGB'`` (see :func:`convert_channels`).
            ``None`` keeps the file's own mode.

    Raises:
        ImageReadError: the file is missing, not a regular file, not an image, truncated, corrupt,
            larger than ``PIL.Image.MAX_IMAGE_PIXELS``, or 32-bit with values beyond 16 bits.
    """
    try:
        with _open(path) as image:
            image.load()
            if image.mode == "I":
                _check_16bit_range(image)
            # A camera's EXIF orientation applied, as a viewer shows the photo (a no-op copy without the tag).
            upright = ImageOps.exif_transpose(image)
            return upright if in_chans is None else convert_channels(upright, in_chans)
    except _DECODE_ERRORS as err:
        raise ImageReadError(path, str(err) or type(err).__name__) from err


def check_image(path: str | os.PathLike) -> str | None:
    """``None`` if ``path`` decodes, else the reason it does not (see :func:`load_image`). JPEGs
    are decoded at 1/8 scale, which still reads every byte (truncation is caught) at a fraction of
    the cost."""
    try:
        with _open(path) as image:
            image.draft(image.mode, (1, 1))
            image.load()
    except _DECODE_ERRORS as err:
        return str(err) or type(err).__name__
    return None


def _open(path: str | os.PathLike) -> Image.Image:
    """``path`` opened (header only) if it is a regular file of at most ``PIL.Image.MAX_IMAGE_PIXELS``
    pixels; ``ValueError`` says why not."""
    kind = stat.S_IFMT(os.stat(path).st_mode)
    if kind != stat.S_IFREG:
        raise ValueError(f"it is {_SPECIAL_FILES.get(kind, 'a special file')}, not a regular file; give an image file")
    try:
        with warnings.catch_warnings():  # the warning zone is refused below, with a clearer message
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
    except Image.DecompressionBombError as err:
        raise ValueError(f"{err} {_PIXEL_LIMIT_HINT}") from err
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and image.width * image.height > limit:
        image.close()
        raise ValueError(
            f"{image.width}x{image.height} = {image.width * image.height:,} pixels exceed "
            f"PIL.Image.MAX_IMAGE_PIXELS ({limit:,}); {_PIXEL_LIMIT_HINT}"
        )
    return image


def _check_16bit_range(image: Image.Image) -> None:
    low, high = image.getextrema()
    if low < 0 or high > _MAX_16BIT:
        raise ValueError(
            f"32-bit pixel values span {low}..{high}, beyond 16 bits, and have no standard scale; "
            "save the image with 8 or 16 bits per channel"
        )


def to_8bit_gray(image: Image.Image) -> Image.Image:
    """A 16-bit grayscale image (a :data:`WIDE_GRAY_MODES` mode, values 0..65535) as ``'L'``,
    scaled so that 65535 becomes 255 (divided by 257, rounded)."""
    values = np.asarray(image, dtype=np.float64)
    return Image.fromarray(np.rint(values / (_MAX_16BIT / 255)).astype(np.uint8), "L")


def convert_channels(image: Image.Image, in_chans: int) -> Image.Image:
    """``image`` as ``'L'`` (``in_chans=1``) or ``'RGB'`` (3): 16-bit grayscale scaled to 8 bits,
    any alpha composited onto white, colour to luma (ITU-R 601) or gray copied to R, G and B."""
    if in_chans not in (1, 3):
        raise ValueError(f"in_chans must be 1 or 3, got {in_chans}.")
    if image.mode in WIDE_GRAY_MODES:
        image = to_8bit_gray(image)
    if _has_alpha(image):
        rgba = image.convert("RGBA")
        image = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
    return image.convert("L" if in_chans == 1 else "RGB")


def describe_conversion(image: Image.Image, in_chans: int) -> str | None:
    """What :func:`convert_channels` does to ``image`` for ``in_chans``, in words (``None``: nothing),
    e.g. ``"RGBA -> grayscale: transparent pixels composited onto white, colour to luma ..."``."""
    target = "L" if in_chans == 1 else "RGB"
    if image.mode == target:
        return None
    steps = []
    if image.mode in WIDE_GRAY_MODES:
        steps.append("16-bit values scaled to 8 bits (65535 -> 255)")
    if _has_alpha(image):
        steps.append("transparent pixels composited onto white")
    gray = image.mode in _GRAY_MODES
    if in_chans == 1 and not gray:
        steps.append("colour to luma (0.299 R + 0.587 G + 0.114 B, ITU-R 601)")
    if in_chans == 3 and gray:
        steps.append("gray copied to R, G and B")
    how = f": {', '.join(steps)}" if steps else ""
    return f"{image.mode} -> {'grayscale' if in_chans == 1 else 'RGB'}{how}"


def _has_alpha(image: Image.Image) -> bool:
    return image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info)


def to_array(image: Image.Image | np.ndarray) -> np.ndarray:
    """A PIL image or array as a ``uint8`` array ``[H, W, C]`` (grayscale gets ``C = 1``; 16-bit
    grayscale is scaled to 8 bits)."""
    if isinstance(image, Image.Image) and image.mode in WIDE_GRAY_MODES:
        image = to_8bit_gray(image)
    array = np.asarray(image, dtype=np.uint8)
    return array[..., None] if array.ndim == 2 else array
