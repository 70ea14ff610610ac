"""scikit-learn's bundled handwritten digits (1,797 real 8x8 images, 10 classes): a dataset
that needs no download, upsampled to the model's image size."""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits as _sklearn_digits

from .arrays import resize_images

#: Statistics of the digits scaled to 0-1 and bilinearly upsampled to 32x32.
DIGITS_MEAN: tuple[float, ...] = (0.305,)
DIGITS_STD: tuple[float, ...] = (0.324,)
DIGITS_CLASSES: tuple[str, ...] = tuple(str(d) for d in range(10))


def load_digits(img_size: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """All 1,797 digits as ``(images [N, H, W, 1] uint8, labels [N])``, ``(H, W) = img_size``.

    The 0-16 ink levels are scaled to 0-255 and bilinearly upsampled.
    """
    bunch = _sklearn_digits()
    return resize_images(bunch.images[..., None], img_size, scale=255.0 / 16.0), bunch.target.astype(np.int64)
