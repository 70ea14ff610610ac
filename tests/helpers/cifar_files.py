"""Tiny files in the real CIFAR-10 pickle layout, for tests (imported by test modules)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

CIFAR10_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
PER_BATCH = 20  # 2 images per class


def dump(path: Path, content: object) -> None:
    """``content`` pickled (protocol 2, as the official files are) into ``path``."""
    path.write_bytes(pickle.dumps(content, protocol=2))


def cifar_batch(index: int) -> dict:
    """A batch in the official layout: ``data`` [n, 3072] uint8 (R, G, B planes), ``labels``."""
    data = np.zeros((PER_BATCH, 3072), dtype=np.uint8)
    data[:, :1024], data[:, 1024:2048], data[:, 2048:] = 10, 20, 30 + index
    return {"batch_label": f"batch {index}", "labels": [i % 10 for i in range(PER_BATCH)], "data": data}


def fabricate_cifar10(root: Path) -> Path:
    """``root/cifar-10-batches-py`` with six batches of :data:`PER_BATCH` images and the meta file;
    returns ``root``."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for index, name in enumerate(CIFAR10_FILES):
        dump(folder / name, cifar_batch(index))
    dump(folder / "batches.meta", {"label_names": [f"class{i}" for i in range(10)], "num_vis": 3072})
    return root
