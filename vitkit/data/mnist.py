"""MNIST and Fashion-MNIST (Xiao et al. 2017, https://arxiv.org/abs/1708.07747) from their IDX files.

Both ship as four IDX files (``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``), gzipped or not. They are found either
directly in ``root`` (the layout of Debian's ``dataset-fashion-mnist`` package,
``/usr/share/datasets/fashion-mnist``) or in ``root/<FashionMNIST|MNIST>/raw`` (where torchvision's
``download=True`` puts them). The reader here checks the IDX header (magic number, dimensions,
length) and returns numpy arrays, so a truncated or foreign file is named instead of misread.
"""

from __future__ import annotations

import gzip
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from torchvision.datasets import MNIST, FashionMNIST

from .info import DataFileError

#: IDX magic numbers: two zero bytes, the element type (0x08 = unsigned byte), the rank.
IMAGES_MAGIC = 0x00000803
LABELS_MAGIC = 0x00000801

#: The four files, by split and kind, without the optional ``.gz``.
IDX_FILES: dict[tuple[str, str], str] = {
    ("train", "images"): "train-images-idx3-ubyte",
    ("train", "labels"): "train-labels-idx1-ubyte",
    ("test", "images"): "t10k-images-idx3-ubyte",
    ("test", "labels"): "t10k-labels-idx1-ubyte",
}


@dataclass(frozen=True)
class MnistSource:
    """One IDX-format dataset: its torchvision class (for downloading), classes and statistics."""

    torchvision_class: type
    classes: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    package_hint: str


#: Training-set pixel statistics on the 0-1 scale.
MNIST_SOURCES: dict[str, MnistSource] = {
    "fashion_mnist": MnistSource(
        FashionMNIST,
        tuple(FashionMNIST.classes),
        (0.2860,),
        (0.3530,),
        " (on Debian/Ubuntu: apt-get install dataset-fashion-mnist, then data.root=/usr/share/datasets/fashion-mnist)",
    ),
    "mnist": MnistSource(MNIST, tuple(str(d) for d in range(10)), (0.1307,), (0.3081,), ""),
}


class IdxFileError(DataFileError):
    """An IDX file whose header or length is not what MNIST-format data needs."""


#: The most a deflate stream can inflate: 1032 bytes out per byte in (RFC 1951's longest match,
#: 258 bytes, per 2 bits), with room for the gzip header. A ``.gz`` declaring more data than its
#: size allows cannot be genuine and is refused before anything is decompressed.
MAX_GZIP_RATIO = 1032

#: MNIST-format images are 28 x 28; any IDX image size is read, but each side must fit this.
MAX_IDX_SIDE = 4096


def read_idx(path: str | Path, magic: int) -> np.ndarray:
    """Read an unsigned-byte IDX file (gzipped when its name ends in ``.gz``), streaming: the header
    is read and checked first, then exactly the bytes it declares (one more to detect over-long
    data), so memory is bounded by the declared size however far a gzip bomb would inflate.

    Args:
        path: the file.
        magic: :data:`IMAGES_MAGIC` (rank 3, ``[N, H, W]``) or :data:`LABELS_MAGIC` (rank 1, ``[N]``).

    Returns:
        ``uint8`` array of the shape the header declares.

    Raises:
        IdxFileError: wrong magic number, dimensions out of range, more data declared than the file
            can hold, truncated or over-long data, or not gzip when named ``.gz``.
    """
    path = Path(path)
    rank = magic & 0xFF
    header_size = 4 * (1 + rank)
    compressed = path.suffix == ".gz"
    try:
        file_size = path.stat().st_size
        with gzip.open(path, "rb") if compressed else open(path, "rb") as handle:
            header = handle.read(header_size)
            shape, expected = _check_idx_header(path, header, magic, header_size)
            capacity = file_size * MAX_GZIP_RATIO if compressed else file_size - header_size
            if expected > capacity:
                raise IdxFileError(
                    f"{path} declares shape {list(shape)} ({expected:,} bytes of data), more than a "
                    f"{file_size:,}-byte {'gzip ' if compressed else ''}file can hold; it is corrupt (or a decompression bomb)."
                )
            raw = handle.read(expected + 1)
    except (OSError, EOFError, gzip.BadGzipFile) as err:
        if isinstance(err, FileNotFoundError):
            raise
        raise IdxFileError(f"{path} is not a readable {'gzip' if compressed else 'IDX'} file: {err}") from err
    if len(raw) != expected:
        held = f"{len(raw)}" if len(raw) <= expected else "more"
        raise IdxFileError(
            f"{path} declares shape {list(shape)} ({expected} bytes of data) but holds {held}; "
            "the file is truncated or corrupt."
        )
    return np.frombuffer(raw, dtype=np.uint8).reshape(shape).copy()


def _check_idx_header(path: Path, header: bytes, magic: int, header_size: int) -> tuple[tuple[int, ...], int]:
    """The shape an IDX ``header`` declares and its size in bytes (exact Python integers, so no
    dimensions overflow), after checking the magic number and, for images, the sides."""
    rank = magic & 0xFF
    found = struct.unpack(">I", header[:4])[0] if len(header) >= 4 else None
    if found is not None and found != magic:
        raise IdxFileError(
            f"{path} has magic number 0x{found:08x}, expected 0x{magic:08x} "
            f"({'images' if magic == IMAGES_MAGIC else 'labels'}, unsigned bytes, rank {rank})."
        )
    if len(header) < header_size:
        raise IdxFileError(f"{path} is {len(header)} bytes long, shorter than an IDX header ({header_size} bytes).")
    shape = struct.unpack(f">{rank}I", header[4:header_size])
    if any(not 1 <= side <= MAX_IDX_SIDE for side in shape[1:]):
        raise IdxFileError(f"{path} declares images of {' x '.join(map(str, shape[1:]))} pixels; each side must be 1..{MAX_IDX_SIDE}.")
    return shape, math.prod(shape)


def find_idx_file(root: Path, name: str, folder: str) -> Path | None:
    """``name`` (with or without ``.gz``) in ``root`` or ``root/<folder>/raw``, if present."""
    for directory in (root, root / folder / "raw"):
        for candidate in (directory / f"{name}.gz", directory / name):
            if candidate.is_file():
                return candidate
    return None


MnistArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, tuple[str, ...]]


def load_mnist(name: str, root: str | Path, download: bool) -> MnistArrays:
    """Read ``name`` (``'fashion_mnist'`` or ``'mnist'``) from ``root``.

    Returns:
        ``(train_images [60000, 28, 28, 1] uint8, train_labels [60000], test_images [10000, 28, 28, 1],
        test_labels [10000], class_names)``.

    Raises:
        FileNotFoundError: files absent and ``download`` off (or failed); says both ways to get them.
        IdxFileError: a file is corrupt, or images and labels disagree in number or label range.
    """
    source, root = MNIST_SOURCES[name], Path(root)
    folder = source.torchvision_class.__name__
    paths = {key: find_idx_file(root, file, folder) for key, file in IDX_FILES.items()}
    if download and None in paths.values():
        _download(source, root)
        paths = {key: find_idx_file(root, file, folder) for key, file in IDX_FILES.items()}
    missing = [IDX_FILES[key] for key, path in paths.items() if path is None]
    if missing:
        raise FileNotFoundError(
            f"{name} not found: {root} (nor {root / folder / 'raw'}) lacks {', '.join(f'{m}.gz' for m in missing)}. "
            f"Point data.root at the folder holding the four IDX .gz files{source.package_hint}, "
            "or set data.download=true on a machine with internet."
        )
    arrays = []
    for split in ("train", "test"):
        images = read_idx(paths[(split, "images")], IMAGES_MAGIC)
        labels = read_idx(paths[(split, "labels")], LABELS_MAGIC).astype(np.int64)
        if len(images) != len(labels):
            raise IdxFileError(
                f"{paths[(split, 'images')]} holds {len(images)} images but {paths[(split, 'labels')]} "
                f"{len(labels)} labels."
            )
        if labels.size and labels.max() >= len(source.classes):
            raise IdxFileError(
                f"{paths[(split, 'labels')]} has label {labels.max()}, outside 0..{len(source.classes) - 1}."
            )
        if not len(images):
            raise IdxFileError(f"{paths[(split, 'images')]} holds no images; a {split} set needs at least one.")
        arrays += [images[..., None], labels]
    if arrays[0].shape[1:] != arrays[2].shape[1:]:
        raise IdxFileError(
            f"{paths[('test', 'images')]} holds {arrays[2].shape[1]}x{arrays[2].shape[2]} images but "
            f"{paths[('train', 'images')]} {arrays[0].shape[1]}x{arrays[0].shape[2]}; the test set must be "
            "the training set's geometry (the files are from different datasets or damaged)."
        )
    return (*arrays, source.classes)


def _download(source: MnistSource, root: Path) -> None:
    try:
        source.torchvision_class(str(root), train=True, download=True)
    except (OSError, RuntimeError) as err:  # URLError is an OSError
        raise FileNotFoundError(
            f"downloading {source.torchvision_class.__name__} into {root} failed ({err}). Without internet, "
            f"point data.root at a folder holding the four IDX .gz files{source.package_hint} "
            "and set data.download=false."
        ) from err
