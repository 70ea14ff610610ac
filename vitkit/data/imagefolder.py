"""Folders of images: ImageNet-style ``root/train/<class>/*``, ``root/val/<class>/*`` and optionally
``root/test/<class>/*`` (Imagenette and other ImageNet subsets); or, without ``root/train``, class
folders ``root/<class>/*`` or a flat folder of images (``root/*``, subfolders included: one class,
:data:`UNLABELLED`), split into train, val and test by ``data.val_fraction`` and ``data.test_fraction``
(stratified, by ``data.seed``). A flat folder or a single class serves pre-training, whose labels
are unused (``data.require_classes: false``).

Unreadable files are found when the dataset is built (one fast decode pass, see
:func:`~vitkit.data.images.check_image`) and raise :class:`ImageReadError` naming them, or
with ``skip_corrupt`` are dropped, logged and counted (``dataset.skipped``). A file that breaks
after that pass (or with verification off) raises :class:`ImageReadError` naming it when loaded.

A layout that would train a misleading model is refused before training (:class:`ImageFolderError`):
fewer than two classes, a training class folder without (readable) images, or a val/test class
that training lacks. A val/test split missing some training classes is logged as a warning, as
its accuracy does not cover them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.datasets.folder import IMG_EXTENSIONS

from ..errors import VitkitError
from ..files import path_kind
from .arrays import Transform, stratified_split
from .images import ImageReadError, check_image, files_under, load_image

log = logging.getLogger(__name__)

LAYOUT = (
    "root/train/<class>/<image>, root/val/<class>/<image> and optionally root/test/<class>/<image>; or root/<class>/<image> "
    "(split by data.val_fraction and data.test_fraction)"
)
#: The class of every image of a flat folder (no class folders): labels a pre-training run does not use.
UNLABELLED = "images"

#: Class names quoted in a message before the rest are only counted.
_NAMES_SHOWN = 8

#: Reads files once each, giving per file ``None`` (readable) or the reason it is not: the check of
#: a folder scan (:func:`check_images`, or a decoder that keeps the images it read).
Checker = Callable[[Sequence[Path]], list[str | None]]


def check_images(files: Sequence[Path]) -> list[str | None]:
    """:func:`~vitkit.data.images.check_image` of each file."""
    return [check_image(path) for path in files]


class ImageFolderError(VitkitError, ValueError):
    """An image folder whose class folders would train or evaluate a misleading model."""


@dataclass(frozen=True)
class SplitFiles:
    """The image files of one split, their labels, and the unreadable files left out."""

    files: list[Path]
    labels: list[int]
    skipped: list[Path]


class ImageFolderDataset(Dataset):
    """Image files with labels, decoded on access.

    Args:
        files: image paths.
        labels: one label per path.
        transform: PIL image -> float tensor ``[C, H, W]``.
        in_chans: files are converted to 1 (grayscale) or 3 (RGB) channels.
        skipped: unreadable files left out when building (for reporting).
    """

    def __init__(
        self,
        files: list[Path],
        labels: list[int],
        transform: Transform,
        in_chans: int = 3,
        skipped: list[Path] | None = None,
    ) -> None:
        self.files = files
        self.labels = np.asarray(labels, dtype=np.int64)
        self.transform = transform
        self.in_chans = in_chans
        self.skipped = skipped or []

    @property
    def num_skipped(self) -> int:
        """How many unreadable files were skipped."""
        return len(self.skipped)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = load_image(self.files[index], self.in_chans)
        return self.transform(image), int(self.labels[index])


def find_classes(split_dir: Path) -> list[str]:
    """Sorted class folder names of ``split_dir``; ``FileNotFoundError`` explains the layout."""
    if not split_dir.is_dir():
        raise FileNotFoundError(f"{split_dir} {path_kind(split_dir)}; an image folder dataset is laid out as {LAYOUT}.")
    classes = sorted(entry.name for entry in split_dir.iterdir() if entry.is_dir() and not entry.name.startswith("."))
    if not classes:
        raise FileNotFoundError(f"{split_dir} has no class folders; expected {LAYOUT}.")
    return classes


def image_files(folder: Path) -> list[Path]:
    """Sorted files under ``folder`` (recursively, through symlinked folders; none if it is missing)
    with an image extension."""
    return sorted(p for p in files_under(folder) if p.suffix.lower() in IMG_EXTENSIONS and p.is_file())


def scan_image_folder(
    root: Path, verify: bool = True, skip_corrupt: bool = False, *, fractions: tuple[float, float] = (0.1, 0.2),
    seed: int = 0, min_classes: int = 2, no_split_below: int = 0, check: Checker = check_images,
) -> tuple[list[str], dict[str, SplitFiles]]:
    """The classes (``root/train``'s folders, else ``root``'s, else :data:`UNLABELLED`) and the
    files of ``train``, ``val`` and ``test`` (when present), checked before training.

    Args:
        root: the dataset folder (see :data:`LAYOUT`).
        verify: decode every file once (see :func:`drop_unreadable`).
        check: how ``verify`` reads the files (a :data:`Checker`).
        skip_corrupt: drop unreadable files instead of raising.
        fractions: the shares of val and test of a folder without ``train/`` (:func:`split_folder`).
        seed: the seed of that split.
        min_classes: classes required (2 for a classifier; 1 for pre-training, which ignores labels).
        no_split_below: a folder without ``train/`` whose split would train a class on fewer
            images is not split: every split holds every image (:func:`few_labels`).

    Raises:
        ImageFolderError: fewer than ``min_classes`` classes, a training class without readable
            images, or a val/test class folder that training lacks.
        FileNotFoundError: a split is missing or holds no images.
        ImageReadError: an unreadable file (unless ``skip_corrupt``).
    """
    if not (root / "train").is_dir():
        return split_folder(root, verify, skip_corrupt, fractions=fractions, seed=seed, min_classes=min_classes,
                            no_split_below=no_split_below, check=check)
    classes = find_classes(root / "train")
    check_class_count(root / "train", classes, min_classes)
    splits: dict[str, SplitFiles] = {}
    for split in ("train", "val", "test"):
        if split == "test" and not (root / split).is_dir():
            continue
        files, labels = scan_split(root / split, classes)
        skipped: list[Path] = []
        if verify:
            files, labels, skipped = drop_unreadable(files, labels, skip_corrupt, check)
        check_classes_covered(root / split, classes, labels, required=split == "train")
        splits[split] = SplitFiles(files, labels, skipped)
    return classes, splits


def check_class_count(folder: Path, classes: Sequence[str], min_classes: int) -> None:
    """Refuse fewer than ``min_classes`` classes (:class:`ImageFolderError`)."""
    if len(classes) >= min_classes:
        return
    what = "images but no class folders" if classes == [UNLABELLED] else f"a single class folder, {classes[0]!r}"
    raise ImageFolderError(
        f"{folder} has {what}; a classifier needs at least two (with one it is right every time and learns nothing). "
        f"Add class folders as {LAYOUT}; to pre-train on the images without labels, set data.require_classes=false."
    )


def split_folder(
    root: Path, verify: bool, skip_corrupt: bool, *, fractions: tuple[float, float], seed: int, min_classes: int,
    no_split_below: int = 0, check: Checker = check_images,
) -> tuple[list[str], dict[str, SplitFiles]]:
    """A folder without ``train/``: class folders ``root/<class>/*`` when ``root`` holds no image
    itself, else every image under it as the one class :data:`UNLABELLED`; split into train, val
    and test by ``fractions`` (val, test), class by class, by ``seed``, unless class folders too
    small for it (``no_split_below``, :func:`few_labels`) put every image in every split, with a note."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root} {path_kind(root)}; an image folder dataset is laid out as {LAYOUT}.")
    loose = [p for p in root.iterdir() if p.is_file() and p.suffix.lower() in IMG_EXTENSIONS]
    if loose:
        classes, files = [UNLABELLED], image_files(root)
        labels = [0] * len(files)
        folders = [p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")]
        if folders and len(loose) < len(files):
            log.warning(
                "note: %s has %d image(s) at its top (e.g. %s) beside the folder(s) %s: it is read as one flat folder "
                "of %d unlabelled images, not as class folders; move the top-level image(s) into a class folder "
                "for labels.", root, len(loose), loose[0].name, quote_names(sorted(folders)), len(files),
            )
    elif not any(p.is_dir() and not p.name.startswith(".") for p in root.iterdir()):
        raise FileNotFoundError(f"{root} holds no images with extensions {', '.join(IMG_EXTENSIONS)}; expected {LAYOUT}.")
    else:
        classes = find_classes(root)
        files, labels = scan_split(root, classes)
    if not files:
        raise FileNotFoundError(f"{root} holds no images with extensions {', '.join(IMG_EXTENSIONS)}; expected {LAYOUT}.")
    check_class_count(root, classes, min_classes)
    skipped: list[Path] = []
    if verify:
        files, labels, skipped = drop_unreadable(files, labels, skip_corrupt, check)
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classes))
    if classes != [UNLABELLED] and few_labels(counts, fractions, no_split_below):
        log.warning(
            "note: %s holds %d to %d images per class, too few to hold some out (a split at data.val_fraction=%g and "
            "data.test_fraction=%g would train on fewer than %d per class (data.no_split_below) and pick the checkpoint "
            "on about %d each): every image trains, the last epoch is kept, and validation and test show the training images; "
            "measure the model on a separate folder with vitkit evaluate MODEL TEST_FOLDER.",
            root, counts.min(), counts.max(), fractions[0], fractions[1], no_split_below, max(1, round(counts.min() * fractions[0])),
        )
        whole = SplitFiles(files, labels, [])
        return classes, {"train": SplitFiles(files, labels, skipped), "val": whole, "test": whole}
    parts = stratified_split(np.asarray(labels, dtype=np.int64), fractions, seed)
    splits = {
        split: SplitFiles([files[i] for i in index], [labels[i] for i in index], skipped if split == "train" else [])
        for split, index in zip(("train", "val", "test"), parts)
    }
    for split, part in splits.items():
        if not part.files:
            raise ImageFolderError(
                f"{root} holds {len(files)} images, too few to give the {split} split one at data.val_fraction="
                f"{fractions[0]:g} and data.test_fraction={fractions[1]:g}; add images or raise the fraction."
            )
    check_classes_covered(root, classes, splits["train"].labels, required=True)
    if classes != [UNLABELLED]:
        log.warning("note: %s has no train/ folder: split per class into %s training, %s validation and %s test images "
                 "(data.val_fraction=%g, data.test_fraction=%g, data.seed=%d).", root,
                 *(f"{len(splits[name].files):,}" for name in ("train", "val", "test")), *fractions, seed)
    return classes, splits


def few_labels(counts: np.ndarray, fractions: tuple[float, float], no_split_below: int) -> bool:
    """Whether a split by ``fractions`` (val, test) would leave the smallest class of ``counts``
    (images per class) fewer than ``no_split_below`` training images: a validation image or two
    per class would pick the checkpoint by chance, and every held-out image is one fewer to learn from."""
    return bool(counts.min() * (1 - sum(fractions)) < no_split_below)


def scan_split(split_dir: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    """Image files of ``split_dir/<class>/`` (see :func:`image_files`) and their labels,
    ``classes`` giving the label order; a class folder not in ``classes`` raises."""
    unknown = sorted(set(find_classes(split_dir)) - set(classes))
    if unknown:
        raise ImageFolderError(
            f"{split_dir} has class folder(s) {quote_names(unknown)} that {split_dir.parent / 'train'} lacks, "
            "so they have no label; rename them after a training class or remove them."
        )
    files: list[Path] = []
    labels: list[int] = []
    for label, name in enumerate(classes):
        found = image_files(split_dir / name)  # none when a class is absent from this split
        files += found
        labels += [label] * len(found)
    if not files:
        raise FileNotFoundError(f"{split_dir} holds no images with extensions {', '.join(IMG_EXTENSIONS)}.")
    return files, labels


def check_classes_covered(split_dir: Path, classes: Sequence[str], labels: Sequence[int], required: bool) -> None:
    """Every class has an image in ``labels``, or :class:`ImageFolderError` (``required``, the
    training split: a class never seen) or a logged warning (val/test: accuracy leaves it out)."""
    counts = np.bincount(np.asarray(labels, dtype=np.int64), minlength=len(classes))
    missing = [name for name, count in zip(classes, counts) if count == 0]
    if not missing:
        return
    if required:
        raise ImageFolderError(
            f"{split_dir}: class folder(s) {quote_names(missing)} hold no readable images, so the model would "
            "have classes it never sees in training; add images or remove the folder(s)."
        )
    log.warning(
        "%s has no images of %d of the %d training classes (%s): its accuracy leaves them out.",
        split_dir, len(missing), len(classes), quote_names(missing),
    )


def quote_names(names: Sequence[str]) -> str:
    """Up to eight names quoted, then a count of the rest."""
    shown = ", ".join(repr(name) for name in names[:_NAMES_SHOWN])
    rest = len(names) - _NAMES_SHOWN
    return f"{shown} and {rest} more" if rest > 0 else shown


def drop_unreadable(
    files: list[Path], labels: list[int], skip: bool, check: Checker = check_images,
) -> tuple[list[Path], list[int], list[Path]]:
    """Decode every file once (by ``check``); unreadable ones raise :class:`ImageReadError` naming the first
    (and counting the rest) unless ``skip``, which drops them with a logged warning.

    Returns:
        ``(kept files, their labels, skipped files)``.
    """
    problems = [(path, reason) for path, reason in zip(files, check(files)) if reason is not None]
    if not problems:
        return files, labels, []
    if not skip:
        path, reason = problems[0]
        others = f" ({len(problems) - 1} more unreadable file(s) found)" if len(problems) > 1 else ""
        raise ImageReadError(path, f"{reason}{others}. Remove or replace it, or set data.skip_corrupt=true")
    bad = {path for path, _ in problems}
    log.warning(
        "skipped %d unreadable image(s) of %d, e.g. %s (%s)", len(bad), len(files), problems[0][0], problems[0][1]
    )
    kept = [(path, label) for path, label in zip(files, labels) if path not in bad]
    return [path for path, _ in kept], [label for _, label in kept], [path for path, _ in problems]
