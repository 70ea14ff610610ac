"""Carve a smaller ImageNet-style folder (N classes x M training images per class) out of a
large one, by symlinks or copies; what ``tools/make_subset.py`` runs."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import VitkitError
from ..files import path_kind
from .imagefolder import LAYOUT, find_classes, image_files

SPLITS: tuple[str, ...] = ("train", "val", "test")


class SubsetError(VitkitError, ValueError):
    """A subset that cannot be made as asked (too few classes or images, a bad destination)."""


@dataclass(frozen=True)
class SubsetSummary:
    """What :func:`make_subset` wrote: the chosen classes and the image count of each split."""

    classes: tuple[str, ...]
    counts: dict[str, int]


def make_subset(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    num_classes: int,
    images_per_class: int,
    seed: int = 0,
    copy: bool = False,
    eval_images_per_class: int | None = None,
) -> SubsetSummary:
    """Write ``dst/{train,val,test}/<class>/*`` for ``num_classes`` classes of ``src``.

    Classes and images are drawn at random, the same for the same ``seed``. ``train`` gets
    ``images_per_class`` images per class; ``val`` and ``test`` (where ``src`` has them)
    ``eval_images_per_class`` (``None``: all of the class's images).

    Args:
        src: ImageNet-style folder (``src/train/<class>/*``, ``src/val/<class>/*``).
        dst: new or empty folder.
        num_classes: classes to keep.
        images_per_class: training images per class.
        seed: seed of the draw.
        copy: copy the files instead of symlinking them (absolute links to ``src``).
        eval_images_per_class: cap on val/test images per class.

    Raises:
        FileNotFoundError: ``src`` or ``src/train`` is missing.
        SubsetError: too few classes or images, ``dst`` is not empty, or one of ``src`` and ``dst``
            lies inside the other (links in ``src/train`` would pick up val images); nothing is written.
    """
    src, dst = Path(src), Path(dst)
    if not src.is_dir():
        raise FileNotFoundError(f"source folder {src} {path_kind(src)}; expected {LAYOUT.replace('root', str(src))}.")
    if num_classes < 1 or images_per_class < 1:
        raise SubsetError(f"--classes and --images must be >= 1, got {num_classes} and {images_per_class}.")
    _check_apart(src, dst)
    if dst.exists() and any(dst.iterdir()):
        raise SubsetError(f"destination {dst} is not empty; choose a new or empty folder.")
    classes = find_classes(src / "train")
    if num_classes > len(classes):
        raise SubsetError(f"asked for {num_classes} classes but {src / 'train'} has only {len(classes)}.")
    rng = np.random.default_rng(seed)
    chosen = sorted(classes[i] for i in rng.choice(len(classes), num_classes, replace=False))
    plan: dict[str, list[Path]] = {}
    for split in SPLITS:
        if (src / split).is_dir():
            limit = images_per_class if split == "train" else eval_images_per_class
            plan[split] = [f for name in chosen for f in _draw(src / split / name, limit, rng, split == "train")]
    place = shutil.copy2 if copy else _symlink
    for files in plan.values():
        for file in files:
            target = dst / file.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            place(file, target)
    return SubsetSummary(classes=tuple(chosen), counts={split: len(files) for split, files in plan.items()})


def _draw(folder: Path, limit: int | None, rng: np.random.Generator, strict: bool) -> list[Path]:
    """``limit`` random images of ``folder`` (all when ``None`` or, unless ``strict``, too few)."""
    files = image_files(folder)
    if limit is None or (len(files) <= limit and not strict):
        return files
    if len(files) < limit:
        raise SubsetError(f"{folder} has only {len(files)} images, fewer than the {limit} asked for; lower --images.")
    return sorted(files[i] for i in rng.choice(len(files), limit, replace=False))


def _check_apart(src: Path, dst: Path) -> None:
    """Refuse a destination inside the source, or the reverse (symlinks and ``..`` resolved)."""
    real_src, real_dst = src.resolve(), dst.resolve()
    if real_dst.is_relative_to(real_src):
        raise SubsetError(
            f"destination {dst} lies inside the source {src}: the subset would be written into its own source "
            "(and be read back as part of it); choose a folder outside it."
        )
    if real_src.is_relative_to(real_dst):
        raise SubsetError(f"the source {src} lies inside the destination {dst}; choose a folder outside the source.")


def _symlink(source: Path, target: Path) -> None:
    target.symlink_to(source.resolve())
