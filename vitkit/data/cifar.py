"""CIFAR-10 and CIFAR-100 from torchvision's ``cifar-10-batches-py`` / ``cifar-100-python`` folders.

torchvision downloads and checks the archive; the batch files are then read here with a
restricted unpickler (only numpy array reconstruction is allowed), so a tampered file cannot
run code, and so small fabricated files in the same format (tests) load without md5 checks.
"""

from __future__ import annotations

import codecs
import io
import math
import pickle
from pathlib import Path
from typing import Any

import numpy as np
from torchvision.datasets import CIFAR10, CIFAR100
from torchvision.datasets.utils import download_and_extract_archive

from .info import DataFileError

try:  # numpy >= 2
    from numpy._core import multiarray
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core import multiarray

#: Standard per-channel statistics of the training sets.
CIFAR_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}

_SOURCES: dict[str, tuple[type, str]] = {"cifar10": (CIFAR10, "labels"), "cifar100": (CIFAR100, "fine_labels")}

class CifarFileError(DataFileError):
    """A CIFAR batch file that is not a plain pickle of numpy arrays and lists."""


class _NdarrayClass:
    """Stands for ``numpy.ndarray`` in a CIFAR pickle: :func:`_reconstruct` needs the class as an
    argument, but calling ``ndarray(shape)`` itself would allocate whatever the file asks for."""


def _bounded_reconstruct(limit: int) -> Any:
    """numpy's ``_reconstruct(ndarray, shape, dtype)``, refused when the array it creates would be
    larger than ``limit`` bytes (the file's size: numpy writes ``(0,)``, the data comes after)."""

    def reconstruct(subtype: Any, shape: Any, dtype: Any) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = math.prod(int(n) for n in shape) if isinstance(shape, tuple) else int(shape)
        if subtype is not _NdarrayClass or count * dtype.itemsize > limit:
            raise pickle.UnpicklingError(f"an array of {count:,} x {dtype.itemsize} bytes, more than the file holds")
        return multiarray._reconstruct(np.ndarray, shape, dtype)

    return reconstruct


class _ArrayUnpickler(pickle.Unpickler):
    """Rebuilds numpy arrays and plain containers only, each array at most the file's size (so a
    135-byte pickle cannot request 28 GiB); any other global is refused. ``_codecs.encode`` is how
    Python 3 protocol-2 pickles store bytes."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data), encoding="latin1")
        reconstruct = _bounded_reconstruct(len(data))
        self._allowed: dict[tuple[str, str], Any] = {
            ("numpy", "ndarray"): _NdarrayClass,
            ("numpy", "dtype"): np.dtype,
            ("numpy.core.multiarray", "_reconstruct"): reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): reconstruct,
            ("_codecs", "encode"): codecs.encode,
        }

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None


def read_pickle(path: Path) -> dict[str, Any]:
    """Load a CIFAR batch file (Python 2 pickle, latin1 strings), refusing any global but numpy
    array reconstruction; :class:`CifarFileError` names the file otherwise."""
    try:
        content = _ArrayUnpickler(path.read_bytes()).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            OverflowError, KeyError) as err:
        raise CifarFileError(f"{path} is not a valid CIFAR batch file: {err}") from err
    if not isinstance(content, dict):
        raise CifarFileError(f"{path} holds a {type(content).__name__}, expected a dict of arrays.")
    return content


CifarArrays = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[str]]


def load_cifar(name: str, root: str | Path, download: bool) -> CifarArrays:
    """Read ``name`` (``'cifar10'`` or ``'cifar100'``) from ``root``.

    Returns:
        ``(train_images [N, 32, 32, 3] uint8, train_labels [N], test_images, test_labels, class_names)``.

    Raises:
        FileNotFoundError: the files are absent and ``download`` is off or failed; says where to put them.
        CifarFileError: a file is not a CIFAR batch, or holds labels outside ``0 .. len(class_names) - 1``.
    """
    source, label_key = _SOURCES[name]
    folder = Path(root) / source.base_folder
    files = [entry[0] for entry in (*source.train_list, *source.test_list)] + [source.meta["filename"]]
    if download and not all((folder / file).is_file() for file in files):
        _download(source, Path(root))
    missing = [file for file in files if not (folder / file).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{name} not found: {folder} lacks {', '.join(missing)}. Put the extracted '{source.base_folder}' "
            f"folder (from {source.url}) inside {Path(root)}, or set data.download=true on a machine with internet."
        )
    names = [str(n) for n in read_pickle(folder / source.meta["filename"])[source.meta["key"]]]
    train = [_read_batch(folder / entry[0], label_key, len(names)) for entry in source.train_list]
    test_images, test_labels = _read_batch(folder / source.test_list[0][0], label_key, len(names))
    return (
        np.concatenate([images for images, _ in train]),
        np.concatenate([labels for _, labels in train]),
        test_images,
        test_labels,
        names,
    )


def _read_batch(path: Path, label_key: str, num_classes: int) -> tuple[np.ndarray, np.ndarray]:
    """``(images [n, 32, 32, 3] uint8, labels [n])`` of one batch file, labels checked against ``num_classes``."""
    batch = read_pickle(path)
    if "data" not in batch or label_key not in batch:
        raise CifarFileError(f"{path} lacks 'data' or {label_key!r}; keys found: {sorted(batch)}.")
    data = np.asarray(batch["data"], dtype=np.uint8)
    labels = np.asarray(batch[label_key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3 * 32 * 32 or len(data) != len(labels):
        raise CifarFileError(f"{path}: expected data [n, 3072] and n labels, got {list(data.shape)} and {len(labels)}.")
    outside = np.flatnonzero((labels < 0) | (labels >= num_classes))
    if outside.size:
        raise CifarFileError(
            f"{path}: {outside.size} label(s) lie outside 0..{num_classes - 1}, the {num_classes} classes of the "
            f"meta file (e.g. {labels[outside[0]]} at index {outside[0]}); the file is damaged or from another dataset."
        )
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels


def _download(source: type, root: Path) -> None:
    try:
        download_and_extract_archive(source.url, str(root), filename=source.filename, md5=source.tgz_md5)
    except (OSError, RuntimeError) as err:  # URLError is an OSError
        raise FileNotFoundError(
            f"downloading {source.url} into {root} failed ({err}). Without internet, copy the extracted "
            f"'{source.base_folder}' folder into {root} and set data.download=false."
        ) from err
