"""Tiny files in the real MNIST / Fashion-MNIST IDX format, for tests (imported by test modules)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

from vitkit.data.mnist import IDX_FILES


def write_idx(path: Path, array: np.ndarray, compress: bool = True) -> Path:
    """An IDX file as the format defines it: big-endian magic (0x0000, type 0x08, rank), then
    one big-endian uint32 per dimension, then the bytes."""
    header = struct.pack(">I", 0x0800 | array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


def fabricate_mnist(root: Path, per_class: int = 6, test_per_class: int = 2, compress: bool = True) -> dict:
    """Tiny Fashion-MNIST-format set: class ``c`` images are filled with the value ``20 * c + 1``
    plus a bright pixel at a class-dependent spot, so labels can be checked from pixels; the
    bottom-right pixel holds the image's index."""
    root.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for split, count in (("train", per_class), ("test", test_per_class)):
        labels = np.repeat(np.arange(10), count).astype(np.uint8)
        images = np.zeros((len(labels), 28, 28), dtype=np.uint8)
        for i, label in enumerate(labels):
            images[i] = 20 * label + 1
            images[i, 2 * label + 3, 5] = 255
            images[i, 27, 27] = i  # tells the images apart
        suffix = ".gz" if compress else ""
        write_idx(root / (IDX_FILES[(split, "images")] + suffix), images, compress)
        write_idx(root / (IDX_FILES[(split, "labels")] + suffix), labels, compress)
        arrays[split] = (images, labels)
    return arrays
