"""``build_datasets(cfg)``: the train/val/test splits and :class:`DataInfo` of any dataset.

Splits: CIFAR holds ``val_fraction`` of its training set out for validation (stratified, by
``seed``) and tests on its official test set, and so do MNIST and Fashion-MNIST; digits and shapes are split train/val/test by
``val_fraction`` and ``test_fraction``; image folders use ``train/``, ``val/`` and ``test/``
(``val/`` doubling as the test split when there is no ``test/``), or without ``train/`` are split
like digits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import Dataset

from .arrays import (
    ArrayDataset,
    check_free_memory,
    convert_array_channels,
    convert_stats,
    resize_images,
    stratified_split,
)
from .batch_transforms import build_batch_transform
from .cifar import CIFAR_STATS, load_cifar
from .config import DataConfig
from .digits import DIGITS_CLASSES, DIGITS_MEAN, DIGITS_STD, load_digits
from .imagefolder import (
    UNLABELLED,
    ImageFolderDataset,
    ImageFolderError,
    SplitFiles,
    check_images,
    drop_unreadable,
    find_classes,
    scan_image_folder,
    scan_split,
)
from .images import ImageReadError, image_size, is_grayscale, load_image
from .info import IMAGENET_MEAN, IMAGENET_STD, DataFileError, DataInfo, DatasetBundle
from .mnist import MNIST_SOURCES, load_mnist
from .shapes import SHAPE_CLASSES, SHAPES_MEAN, SHAPES_STD, ShapesDataset
from .transforms import build_eval_transform, build_train_transform, to_array


def build_datasets(cfg: DataConfig) -> DatasetBundle:
    """Build the splits of ``cfg.name``; each yields ``(image [C, H, W] normalised, label)``,
    ``train`` augmented by ``cfg.augment``, ``val``/``test`` through the eval transform."""
    cfg = cfg.resolved()
    return _BUILDERS[cfg.name](cfg)


def data_info(cfg: DataConfig, class_names: Sequence[str], mean: Sequence[float], std: Sequence[float]) -> DataInfo:
    """:class:`DataInfo` of resolved ``cfg``; ``cfg.mean``/``cfg.std`` override the dataset's
    statistics, and both are adapted to ``cfg.in_chans``."""
    return DataInfo(
        num_classes=len(class_names),
        class_names=tuple(class_names),
        img_size=cfg.resolved_img_size(),
        in_chans=cfg.resolved_in_chans(),
        mean=convert_stats(cfg.mean or mean, cfg.resolved_in_chans()),
        std=convert_stats(cfg.std or std, cfg.resolved_in_chans()),
        name=cfg.name,
        crop_pct=cfg.resolved_crop_pct(),
        crop_mode="squash" if cfg.trains_on_whole_images() else "center",  # as training resizes: both sides
        interpolation=cfg.interpolation or "bilinear",
    )


#: Images read (headers only) for the channels and size of an image folder whose recipe leaves them unset.
CHANNEL_SAMPLE = 64


@dataclass(frozen=True)
class FolderSample:
    """What the headers of up to :data:`CHANNEL_SAMPLE` training images of a folder (spread over
    its classes) say: whether every one is grayscale, and their median shorter side in pixels."""

    gray: bool
    side: int
    count: int


def folder_sample(cfg: DataConfig) -> FolderSample | None:
    """The :class:`FolderSample` of ``cfg``'s image folder (``None`` for other datasets). A flat
    folder counts as one class where ``data.require_classes`` is false, as the run will read it.

    Raises:
        ImageFolderError, FileNotFoundError: a folder the run would refuse (see :func:`scan_image_folder`).
    """
    if cfg.name != "imagefolder":
        return None
    _, scanned = scan_image_folder(Path(cfg.root), verify=False, min_classes=2 if cfg.require_classes else 1)
    files = scanned["train"].files
    sample = files[:: max(1, len(files) // CHANNEL_SAMPLE)][:CHANNEL_SAMPLE]
    sizes = [size for path in sample if (size := image_size(path)) is not None]
    side = int(np.median([min(size) for size in sizes])) if sizes else cfg.defaults.img_size
    return FolderSample(gray=all(is_grayscale(path) for path in sample), side=side, count=len(sample))


def settle_unset(
    cfg: DataConfig, sample: FolderSample | None = None, given: dict[str, Any] | None = None, source: str = "",
) -> tuple[DataConfig, list[str]]:
    """``cfg`` with the options that depend on the files chosen, and a ``note:`` line per choice
    made on the user's behalf. For an image folder (``sample``, its :func:`folder_sample`): an
    unset ``img_size`` or ``in_chans`` that ``given`` holds (the starting weights', named
    ``source``) is taken from it; else an unset ``in_chans`` is 1 when every sampled image is grayscale (as torchvision users expect a
    gray folder to train a gray model), else 3; an unset ``img_size`` is the images' median
    shorter side (resized to it, never the 224 px of ImageNet models); and the eval crop is said,
    since the folder default (0.875) applies only to ``random_resized`` training."""
    if cfg.name != "imagefolder":
        return cfg, []
    sample = sample or folder_sample(cfg)
    notes = []
    taken = {key: value for key, value in (given or {}).items() if getattr(cfg, key) is None}
    if taken:
        cfg = dataclasses.replace(cfg, **taken)
        said = " and ".join(f"data.{key}={value}" for key, value in taken.items())
        notes.append(f"note: {said} as {source} was trained (set them to change).")
    if cfg.in_chans is None:
        cfg = dataclasses.replace(cfg, in_chans=1 if sample.gray else 3)
        kind = "grayscale: a 1-channel model" if sample.gray else "in colour: a 3-channel (RGB) model"
        notes.append(f"note: the training images of {cfg.root} are {kind} (data.in_chans={cfg.in_chans} to choose).")
    if cfg.img_size is None:
        cfg = dataclasses.replace(cfg, img_size=sample.side)
        notes.append(f"note: the training images of {cfg.root} are about {sample.side} px on their shorter side (median "
                     f"of {sample.count}): they are resized to {sample.side}x{sample.side} (data.img_size to choose).")
    if cfg.crop_pct is None:
        crop = cfg.resolved_crop_pct()
        if crop == 1.0:
            seen = f"whole images, resized to {'x'.join(map(str, cfg.resolved_img_size()[::-1]))} as training resizes them"
        else:
            seen = f"the central {crop:.1%} of each image (data.crop_pct {crop}, the image-folder default for crops)"
        notes.append(f"note: validation, test and the saved model see {seen} (augment.crop "
                     f"{cfg.augment.crop or cfg.defaults.crop}); set data.crop_pct to change.")
    return cfg, notes


def choose_classes(
    info: DataInfo, parts: list[tuple[np.ndarray, np.ndarray]], classes: Sequence[int] | None,
    train_per_class: int | None, seed: int,
) -> tuple[DataInfo, list[tuple[np.ndarray, np.ndarray]]]:
    """The ``(train, val, test)`` parts restricted to ``classes`` (relabelled ``0..k-1`` in that
    order; ``info``'s names follow) and the training part to ``train_per_class`` images of each
    class, drawn by ``seed``.

    Raises:
        DataFileError: a class index the dataset lacks, or fewer training images of a class than asked.
    """
    if classes is not None:
        missing = [c for c in classes if not 0 <= c < info.num_classes]
        if missing:
            raise DataFileError(
                f"data.classes {missing} do not exist: {info.name} has classes 0 to {info.num_classes - 1}."
            )
        lookup = np.full(info.num_classes, -1, dtype=np.int64)
        lookup[list(classes)] = np.arange(len(classes))
        parts = [(images[lookup[labels] >= 0], lookup[labels][lookup[labels] >= 0]) for images, labels in parts]
        names = tuple(info.class_names[c] for c in classes)
        info = dataclasses.replace(info, class_names=names, num_classes=len(names))
    if train_per_class is not None:
        images, labels = parts[0]
        rng = np.random.default_rng(seed)
        kept = []
        for label in range(info.num_classes):
            where = np.flatnonzero(labels == label)
            if len(where) < train_per_class:
                raise DataFileError(
                    f"data.train_per_class={train_per_class}, but class {info.class_names[label]!r} has only "
                    f"{len(where)} training images; ask for at most {len(where)}."
                )
            kept.append(rng.choice(where, train_per_class, replace=False))
        index = np.sort(np.concatenate(kept))
        parts = [(images[index], labels[index]), *parts[1:]]
    return info, parts


def _array_bundle(cfg: DataConfig, info: DataInfo, parts: list[tuple[np.ndarray, np.ndarray]]) -> DatasetBundle:
    """Array datasets of the three ``(images, labels)`` parts (restricted as ``data.classes`` and
    ``data.train_per_class`` say), transformed per batch where the recipe's augmentation allows
    it (see :mod:`.batch_transforms`), else per image."""
    info, parts = choose_classes(info, parts, cfg.classes, cfg.train_per_class, cfg.seed)
    train_tf, eval_tf = build_train_transform(cfg.augment, info), build_eval_transform(info)
    stored_size = parts[0][0].shape[1:3]
    train_batch_tf = build_batch_transform(cfg.augment, info, stored_size)
    eval_batch_tf = build_batch_transform(None, info, stored_size)
    train, val, test = (
        ArrayDataset(convert_array_channels(images, info.in_chans), labels, tf, batch_tf)
        for (images, labels), tf, batch_tf in zip(
            parts, (train_tf, eval_tf, eval_tf), (train_batch_tf, eval_batch_tf, eval_batch_tf)
        )
    )
    return DatasetBundle(train=train, val=val, test=test, info=info)


def _official_test_bundle(
    cfg: DataConfig, info: DataInfo, train: tuple[np.ndarray, np.ndarray], test: tuple[np.ndarray, np.ndarray]
) -> DatasetBundle:
    """A stratified ``val_fraction`` of the training set held out for validation (by ``seed``),
    the dataset's own test set as test."""
    (images, labels) = train
    train_idx, val_idx = stratified_split(labels, (cfg.val_fraction,), cfg.seed)
    return _array_bundle(cfg, info, [(images[train_idx], labels[train_idx]), (images[val_idx], labels[val_idx]), test])


def _build_cifar(cfg: DataConfig) -> DatasetBundle:
    images, labels, test_images, test_labels, names = load_cifar(cfg.name, cfg.root, cfg.download)
    info = data_info(cfg, names, *CIFAR_STATS[cfg.name])
    return _official_test_bundle(cfg, info, (images, labels), (test_images, test_labels))


def _build_mnist(cfg: DataConfig) -> DatasetBundle:
    images, labels, test_images, test_labels, names = load_mnist(cfg.name, cfg.root, cfg.download)
    source = MNIST_SOURCES[cfg.name]
    images, test_images = (resize_images(array, cfg.resolved_img_size()) for array in (images, test_images))
    info = data_info(cfg, names, source.mean, source.std)
    return _official_test_bundle(cfg, info, (images, labels), (test_images, test_labels))


def _build_digits(cfg: DataConfig) -> DatasetBundle:
    images, labels = load_digits(cfg.resolved_img_size())
    splits = stratified_split(labels, (cfg.val_fraction, cfg.test_fraction), cfg.seed)
    parts = [(images[idx], labels[idx]) for idx in splits]
    return _array_bundle(cfg, data_info(cfg, DIGITS_CLASSES, DIGITS_MEAN, DIGITS_STD), parts)


def _build_shapes(cfg: DataConfig) -> DatasetBundle:
    info = data_info(cfg, SHAPE_CLASSES, SHAPES_MEAN, SHAPES_STD)
    total = cfg.shapes_num_samples
    num_val, num_test = round(total * cfg.val_fraction), round(total * cfg.test_fraction)
    sizes = (total - num_val - num_test, num_val, num_test)
    transforms = (build_train_transform(cfg.augment, info), build_eval_transform(info), build_eval_transform(info))
    train, val, test = (
        ShapesDataset(
            size, info.img_size, (cfg.seed, split), cfg.shapes_noise_std, info.in_chans, transform, cfg.shapes_style,
            cfg.shapes_scale,
        )
        for split, (size, transform) in enumerate(zip(sizes, transforms))
    )
    return DatasetBundle(train=train, val=val, test=test, info=info)


def _build_imagefolder(cfg: DataConfig) -> DatasetBundle:
    """An image folder's splits: its files decoded on access, or with ``data.in_memory`` decoded
    once by the scan's own check (:class:`FolderDecoder`) and held as arrays."""
    decoder = FolderDecoder(data_info(cfg, [UNLABELLED], IMAGENET_MEAN, IMAGENET_STD)) if cfg.in_memory else None
    classes, scanned = scan_image_folder(
        Path(cfg.root), cfg.verify_images or decoder is not None, cfg.skip_corrupt,
        fractions=(cfg.val_fraction, cfg.test_fraction), seed=cfg.seed, min_classes=2 if cfg.require_classes else 1,
        no_split_below=cfg.no_split_below, check=decoder or check_images,
    )
    info = data_info(cfg, classes, IMAGENET_MEAN, IMAGENET_STD)
    held_out = scanned["val"].files is not scanned["train"].files
    if decoder is not None:  # augmented per batch as the in-memory datasets are
        parts = [decoder.stack(scanned.get(split, scanned["val"])) for split in ("train", "val", "test")]
        return dataclasses.replace(_array_bundle(cfg, info, parts), held_out=held_out)
    train_tf, eval_tf = build_train_transform(cfg.augment, info), build_eval_transform(info)
    transforms = {"train": train_tf, "val": eval_tf, "test": eval_tf}
    splits = {
        split: ImageFolderDataset(part.files, part.labels, transforms[split], info.in_chans, part.skipped)
        for split, part in scanned.items()
    }
    return DatasetBundle(train=splits["train"], val=splits["val"], test=splits.get("test", splits["val"]), info=info,
                         held_out=held_out)


class FolderDecoder:
    """Image files decoded once each, at ``info``'s channels, resized whole to its image size by the
    evaluation transform's own resize: the scan's :data:`~vitkit.data.imagefolder.Checker` (an
    unreadable file gives its reason), whose images ``data.in_memory`` then holds.

    Args:
        info: the run's geometry (``img_size``, ``in_chans``, ``crop_pct`` 1.0, interpolation).
    """

    def __init__(self, info: DataInfo) -> None:
        self.info = info
        self.resize = build_eval_transform(info).spatial
        self.images: dict[Path, np.ndarray] = {}

    def __call__(self, files: Sequence[Path]) -> list[str | None]:
        """Decode ``files``, keeping each readable one's ``uint8 [H, W, C]``; per file ``None`` or why not.

        Raises:
            ResizeMemoryError: more than the memory free (the images, then their split arrays),
                refused before decoding.
        """
        check_free_memory(2 * (len(self.images) + len(files)), self.info.img_size, self.info.in_chans, "holding")
        return [self._decode(path) for path in files]

    def _decode(self, path: Path) -> str | None:
        try:
            image = load_image(path, self.info.in_chans)
        except ImageReadError as error:
            return error.reason
        height, width = self.info.img_size
        self.images[path] = self.resize(image=to_array(image))["image"].reshape(height, width, -1)
        return None

    def stack(self, split: SplitFiles) -> tuple[np.ndarray, np.ndarray]:
        """The images of ``split`` (decoded by this decoder) as ``(uint8 [N, H, W, C], labels [N])``."""
        height, width = self.info.img_size
        images = np.empty((len(split.files), height, width, self.info.in_chans), dtype=np.uint8)
        for index, path in enumerate(split.files):
            images[index] = self.images[path]
        return images, np.asarray(split.labels, dtype=np.int64)

    def dataset(self, split: SplitFiles) -> ArrayDataset:
        """The images of ``split`` as evaluation sees them: already resized and cropped, so only normalised."""
        stored = dataclasses.replace(self.info, crop_pct=1.0, crop_mode="squash")
        return ArrayDataset(*self.stack(split), build_eval_transform(stored),
                            build_batch_transform(None, stored, stored.img_size))


def labelled_folder_halves(root: str | Path, info: DataInfo, seed: int = 0) -> tuple[Dataset, Dataset, int]:
    """A labelled image folder as a k-NN memory bank and its queries, through the evaluation
    transform of a run's data ``info`` (its size, channels and normalisation): ``train/`` and
    ``test/`` (else ``val/``) where the folder has them, else each class split in halves by ``seed``.
    Each file is decoded once, by the scan's check, and held (:meth:`FolderDecoder.dataset`).

    Returns:
        ``(bank, queries, number of classes)``.

    Raises:
        ImageFolderError, FileNotFoundError: fewer than two classes, or a class with fewer than two images.
    """
    root = Path(root)
    decoder = FolderDecoder(info)
    if (root / "train").is_dir():
        classes, scanned = scan_image_folder(root, skip_corrupt=True, check=decoder)
        bank, query = scanned["train"], scanned.get("test", scanned["val"])
        return decoder.dataset(bank), decoder.dataset(query), len(classes)
    classes = find_classes(root) if root.is_dir() and any(p.is_dir() for p in root.iterdir()) else []
    if len(classes) < 2:
        raise ImageFolderError(
            f"{root} holds {'one class folder' if classes else 'no class folders'}; the k-NN measurement needs a few "
            "labelled images of two or more classes, as <root>/<class>/<image>."
        )
    files, found = scan_split(root, classes)
    files, found, _ = drop_unreadable(files, found, skip=True, check=decoder)
    labels = np.asarray(found, dtype=np.int64)
    counts = np.bincount(labels, minlength=len(classes))
    if counts.min() < 2:
        raise ImageFolderError(f"{root}: class {classes[int(counts.argmin())]!r} has {counts.min()} image(s); the k-NN "
                               "measurement needs two or more of each class (one to look up, one to find).")
    halves = stratified_split(labels, (0.5,), seed)
    bank, queries = (decoder.dataset(SplitFiles([files[i] for i in half], labels[half].tolist(), [])) for half in halves)
    return bank, queries, len(classes)


def unaugmented(dataset: Dataset, like: Dataset) -> Dataset:
    """``dataset``'s images and labels through ``like``'s (evaluation) transform: the training
    split as a labelled memory bank for k-NN or a linear probe, without its augmentation.

    Raises:
        TypeError: a dataset that is neither in memory (:class:`ArrayDataset`) nor a folder's files.
    """
    if isinstance(dataset, ArrayDataset) and isinstance(like, ArrayDataset):
        return ArrayDataset(dataset.images, dataset.labels, like.transform, like.batch_transform)
    if isinstance(dataset, ImageFolderDataset) and isinstance(like, ImageFolderDataset):
        return ImageFolderDataset(dataset.files, list(dataset.labels), like.transform, dataset.in_chans)
    raise TypeError(f"cannot re-transform a {type(dataset).__name__} like a {type(like).__name__}.")


_BUILDERS: dict[str, Callable[[DataConfig], DatasetBundle]] = {
    "cifar10": _build_cifar,
    "cifar100": _build_cifar,
    "imagefolder": _build_imagefolder,
    "fashion_mnist": _build_mnist,
    "mnist": _build_mnist,
    "digits": _build_digits,
    "shapes": _build_shapes,
}
