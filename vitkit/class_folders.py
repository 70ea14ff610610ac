"""Labelled images as class folders, ``ROOT/<class>/*.png``, read against a model's own classes, and
what a classifier's top-1 predictions score on them: accuracy, per class, and the confusion matrix.

A test folder is read whole (no split), its folders named after the model's classes: a folder the
model has no class for is refused (it has no label), a folder with only some of the model's
classes is fine. ``vitkit evaluate MODEL FOLDER`` and ``vitkit predict MODEL FOLDER`` score with it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from sklearn.metrics import confusion_matrix
from torchvision.datasets.folder import IMG_EXTENSIONS

from .data import DataInfo, ImageFolderDataset, build_eval_transform
from .data.imagefolder import find_classes, quote_names, scan_split
from .errors import VitkitError

#: What :func:`read_class_folder` reads.
LAYOUT = "FOLDER/<class>/<image>, one folder per class named as the model's classes"


class ClassFolderError(VitkitError, ValueError):
    """A test folder that is no class-folder tree of the model's classes."""


@dataclass(frozen=True)
class ClassFolder:
    """The images of a class-folder tree, labelled by the model's class indices.

    Attributes:
        root: the folder.
        files: the image files, class by class in the model's order, sorted within a class.
        labels: each file's class, an index into ``class_names``.
        class_names: the model's classes, all of them.
    """

    root: Path
    files: list[Path]
    labels: list[int]
    class_names: tuple[str, ...]

    @property
    def missing(self) -> tuple[str, ...]:
        """The model's classes without an image in the folder."""
        present = set(self.labels)
        return tuple(name for index, name in enumerate(self.class_names) if index not in present)

    def dataset(self, info: DataInfo) -> ImageFolderDataset:
        """The images through the eval transform of ``info`` (the model's size, channels, crop and
        mean/std), each ``([C, H, W] float32, label)``."""
        return ImageFolderDataset(self.files, self.labels, build_eval_transform(info), info.in_chans)


def read_class_folder(root: str | os.PathLike, class_names: Sequence[str]) -> ClassFolder:
    """The images of ``root/<class>/`` (recursively, image suffixes only), labelled by the index of
    ``<class>`` in ``class_names``.

    Raises:
        ClassFolderError: ``root`` is missing or no folder, holds images itself rather than in class
            folders, or has a class folder that ``class_names`` lacks.
        FileNotFoundError: the class folders hold no images.
    """
    root = Path(root)
    if not root.is_dir():
        what = "is a file" if root.exists() else "does not exist"
        raise ClassFolderError(f"test folder {root} {what}; give a folder laid out as {LAYOUT}.")
    loose = sorted(path for path in root.iterdir() if path.is_file() and path.suffix.lower() in IMG_EXTENSIONS)
    if loose:
        raise ClassFolderError(f"{root} holds images itself ({loose[0].name}, ...), which have no class; move them "
                               f"into class folders: {LAYOUT}.")
    try:
        folders = find_classes(root)
    except FileNotFoundError:
        raise ClassFolderError(f"{root} has no class folders; expected {LAYOUT}.") from None
    unknown = sorted(set(folders) - set(class_names))
    if unknown:
        raise ClassFolderError(
            f"{root} has class folder(s) {quote_names(unknown)} that the model does not predict (its classes: "
            f"{quote_names(list(class_names))}); rename them after the model's classes or move them out."
        )
    files, labels = scan_split(root, list(class_names))
    return ClassFolder(root, files, labels, tuple(class_names))


def folder_labels(paths: Sequence[Path], roots: Sequence[Path], class_names: Sequence[str]) -> list[int] | None:
    """Each path's class from the class folder it lies in: the first folder below the one of
    ``roots`` that holds it, when that folder is named after one of ``class_names``. ``None``
    unless every path has such a class (a loose file, a flat folder, or folders named otherwise)."""
    index = {name: label for label, name in enumerate(class_names)}
    labels = []
    for path in paths:
        parts = [path.parent.relative_to(root).parts for root in roots if path.is_relative_to(root)]
        if not parts or not parts[0] or parts[0][0] not in index:
            return None
        labels.append(index[parts[0][0]])
    return labels


def class_scores(labels: torch.Tensor, predictions: torch.Tensor, class_names: Sequence[str]) -> dict[str, Any]:
    """What ``[N]`` top-1 ``predictions`` score against ``[N]`` ``labels`` (indices into ``class_names``).

    Returns:
        ``"top1"`` accuracy in percent, ``"per_class"`` accuracy in percent and ``"per_class_counts"``
        ``[correct, images]`` of each class with images (by name, in the model's order), and
        ``"confusion_matrix"`` ``[K][K]`` counts over all ``K`` classes (rows: true class, columns:
        predicted).
    """
    k = len(class_names)
    matrix = confusion_matrix(labels.numpy(), predictions.numpy(), labels=list(range(k)))
    totals = matrix.sum(axis=1)
    present = [index for index in range(k) if totals[index] > 0]
    return {
        "top1": round(100.0 * float(np.trace(matrix)) / max(int(totals.sum()), 1), 3),
        "per_class": {class_names[i]: round(100.0 * float(matrix[i, i]) / float(totals[i]), 3) for i in present},
        "per_class_counts": {class_names[i]: [int(matrix[i, i]), int(totals[i])] for i in present},
        "confusion_matrix": matrix.tolist(),
    }
