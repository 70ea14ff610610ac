"""Data options: :class:`DataConfig` (which dataset, where, how to split) and its nested
:class:`AugmentConfig` (training augmentation), both validated on construction by
:mod:`vitkit.schema` (types, the ranges in each field's metadata, then :meth:`validate`).

Fields left at ``None`` take the dataset's default (:data:`DATASET_DEFAULTS`); call
:meth:`DataConfig.resolved` for a copy with every default filled in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from timm.data import auto_augment

from ..schema import MAX_IMG_SIDE, Channels, Config, FieldError, bounds
from .info import Interpolation

CropMode = Literal["random_resized", "pad", "resize"]
CROP_MODES: tuple[str, ...] = get_args(CropMode)
#: What random erasing fills its rectangle with (timm's ``RandomErasing`` modes, in normalised
#: units): zeros (the mean colour), one normal colour per rectangle, or normal noise per pixel.
ErasingMode = Literal["const", "rand", "pixel"]

ShapesStyle = Literal["flat", "textured"]
#: The datasets whose classes and training images per class a recipe can choose (stored arrays).
SUBSETTABLE = ("cifar10", "cifar100", "fashion_mnist", "mnist", "digits")
SHAPES_STYLES: tuple[str, ...] = get_args(ShapesStyle)

DatasetName = Literal["cifar10", "cifar100", "imagefolder", "fashion_mnist", "mnist", "digits", "shapes"]
DATASET_NAMES: tuple[str, ...] = get_args(DatasetName)

#: Limits of the generated shapes dataset and of the loader (generous but finite).
MAX_SHAPES_SAMPLES = 1_000_000
MAX_NUM_WORKERS = 256

#: timm AutoAugment policy names (``timm.data.auto_augment.auto_augment_policy``).
AUTO_AUGMENT_POLICIES: tuple[str, ...] = ("original", "originalr", "v0", "v0r", "3a")


def timm_policy(policy: str, hparams: dict[str, Any]) -> Callable[[Any], Any]:
    """timm's PIL transform for the augmentation ``policy`` (RandAugment ``rand-*``, AugMix
    ``augmix-*``, or an AutoAugment policy name); ``ValueError`` when timm cannot parse it."""
    try:
        if policy.startswith("rand"):
            return auto_augment.rand_augment_transform(policy, hparams)
        if policy.startswith("augmix"):
            return auto_augment.augment_and_mix_transform(policy, hparams)
        return auto_augment.auto_augment_transform(policy, hparams)
    except (AssertionError, ValueError, KeyError, IndexError) as err:
        raise ValueError(f"timm cannot parse {policy!r}: {err or type(err).__name__}") from None


@dataclass(frozen=True)
class DatasetDefaults:
    """What a dataset uses for the options left at ``None``."""

    img_size: int
    in_chans: Channels
    crop: CropMode
    hflip: float
    crop_pct: float


#: Per-dataset defaults. Digits (and MNIST) are not flipped (a mirrored 3 is no digit); the small datasets
#: use pad-and-crop, ImageNet-style folders RandomResizedCrop with the usual 0.875 eval crop.
DATASET_DEFAULTS: dict[DatasetName, DatasetDefaults] = {
    "cifar10": DatasetDefaults(img_size=32, in_chans=3, crop="pad", hflip=0.5, crop_pct=1.0),
    "cifar100": DatasetDefaults(img_size=32, in_chans=3, crop="pad", hflip=0.5, crop_pct=1.0),
    "imagefolder": DatasetDefaults(img_size=224, in_chans=3, crop="random_resized", hflip=0.5, crop_pct=0.875),
    "fashion_mnist": DatasetDefaults(img_size=28, in_chans=1, crop="pad", hflip=0.5, crop_pct=1.0),
    "mnist": DatasetDefaults(img_size=28, in_chans=1, crop="pad", hflip=0.0, crop_pct=1.0),
    "digits": DatasetDefaults(img_size=32, in_chans=1, crop="pad", hflip=0.0, crop_pct=1.0),
    "shapes": DatasetDefaults(img_size=32, in_chans=3, crop="pad", hflip=0.5, crop_pct=1.0),
}


@dataclass
class AugmentConfig(Config):
    """Training augmentation: crop, flip, an optional timm policy, colour jitter, then Normalize.

    Attributes:
        enabled: ``False`` trains on the eval transform (no augmentation).
        crop: ``'random_resized'`` (RandomResizedCrop with ``scale``/``ratio``), ``'pad'``
            (resize, pad by ``padding`` pixels, random crop back) or ``'resize'``; ``None``: dataset default.
        scale: RandomResizedCrop area range.
        ratio: RandomResizedCrop aspect-ratio range.
        padding: pixels of zero padding on each side for ``crop='pad'``.
        hflip: horizontal flip probability; ``None``: dataset default (0 for digits).
        color_jitter: brightness/contrast/saturation jitter strength; 0 disables it.
        rand_augment: a timm policy string applied to PIL images after crop and flip:
            ``'rand-m9-mstd0.5'`` (RandAugment), ``'augmix-m5-w3'`` (AugMix) or an AutoAugment
            policy (``'original'``, ``'v0'``, ``'3a'``, ...); ``None`` disables it.
        random_erasing: probability of erasing one rectangle of each image after Normalize
            (Zhong et al. 2017, arXiv 1708.04896, as timm's ``RandomErasing``); 0 disables it.
        erasing_area: the rectangle's area as a fraction of the image, uniform in this range.
        erasing_aspect: its aspect ratio (height / width), log-uniform in this range.
        erasing_mode: its fill (:data:`ErasingMode`).
    """

    enabled: bool = True
    crop: CropMode | None = None
    scale: tuple[float, float] = field(default=(0.08, 1.0), metadata=bounds(gt=0, le=1))
    ratio: tuple[float, float] = field(default=(3 / 4, 4 / 3), metadata=bounds(gt=0, le=100))
    padding: int = field(default=4, metadata=bounds(ge=0, le=MAX_IMG_SIDE))
    hflip: float | None = field(default=None, metadata=bounds(ge=0, le=1))
    color_jitter: float = field(default=0.0, metadata=bounds(ge=0, le=10))
    rand_augment: str | None = None
    random_erasing: float = field(default=0.0, metadata=bounds(ge=0, le=1))
    erasing_area: tuple[float, float] = field(default=(0.02, 1 / 3), metadata=bounds(gt=0, le=1))
    erasing_aspect: tuple[float, float] = field(default=(0.3, 1 / 0.3), metadata=bounds(gt=0, le=100))
    erasing_mode: ErasingMode = "const"

    def validate(self) -> None:
        """Ordered ranges and a known timm policy (types and bounds are checked already)."""
        if self.scale[0] > self.scale[1]:
            raise FieldError("scale", f"must satisfy 0 < min <= max <= 1, got {list(self.scale)}.")
        if self.ratio[0] > self.ratio[1]:
            raise FieldError("ratio", f"must satisfy 0 < min <= max, got {list(self.ratio)}.")
        for key in ("erasing_area", "erasing_aspect"):
            low, high = getattr(self, key)
            if low > high:
                raise FieldError(key, f"must satisfy min <= max, got {[low, high]}.")
        policy = self.rand_augment
        if policy is not None:
            try:  # timm parses the whole string, as the transform will (``rand-q7`` has no section q)
                timm_policy(policy, {})
            except ValueError as err:
                raise FieldError(
                    "rand_augment",
                    f"{policy!r} is no timm policy ({err}): use 'rand-m9-mstd0.5' (RandAugment), "
                    f"'augmix-m5-w3' (AugMix) or one of the AutoAugment policies {AUTO_AUGMENT_POLICIES}.",
                ) from None


@dataclass
class DataConfig(Config):
    """Which dataset to load, from where, and how to split, size and augment it.

    Attributes:
        name: ``'cifar10'``, ``'cifar100'``, ``'fashion_mnist'``, ``'mnist'``, ``'imagefolder'``,
            ``'digits'`` or ``'shapes'``.
        root: folder holding the dataset (CIFAR: ``cifar-10-batches-py`` / ``cifar-100-python``
            inside it; (Fashion-)MNIST: the four IDX ``.gz`` files, directly or in
            ``FashionMNIST/raw`` / ``MNIST/raw`` as torchvision downloads them; imagefolder: ``train/<class>/*``, ``val/<class>/*`` and optionally
            ``test/<class>/*``, or class folders ``<class>/*``, or images alone, split by the
            fractions). Digits and shapes need none.
        download: download CIFAR or (Fashion-)MNIST into ``root`` when its files are absent.
        img_size: output image size, int or (H, W); ``None``: dataset default.
        in_chans: 1 (grayscale) or 3 (RGB) output channels; ``None``: dataset default (digits 1;
            an image folder's training run reads it from the images, see :func:`~vitkit.data.settle_unset`).
        num_workers: DataLoader worker processes.
        val_fraction: share of the training set held out for validation (CIFAR, MNIST, digits, shapes,
            an image folder without ``train/``).
        test_fraction: share held out for testing (digits, shapes, an image folder without
            ``train/``; CIFAR and MNIST have official test sets).
        seed: seed of the splits and of the generated shapes.
        skip_corrupt: imagefolder: skip unreadable images (logged, counted) instead of raising.
        verify_images: imagefolder: decode every file once when building (at 1/8 scale for JPEG),
            so unreadable files are found up front; otherwise they raise when loaded.
        require_classes: imagefolder: refuse fewer than two classes (a classifier learns nothing
            from one); ``false`` for pre-training, which ignores labels, so that a flat folder of
            images (one class) trains.
        no_split_below: imagefolder without ``train/``: when a split by ``val_fraction`` and
            ``test_fraction`` would leave a class fewer training images than this, every image
            trains, validation and test show the training images and the last epoch is kept (a
            note says so); ``0``: always split.
        in_memory: imagefolder: decode every image once, resized whole to ``img_size``, and train
            from memory with the per-batch augmentation of the in-memory datasets (for many small
            images, where decoding each file every epoch costs more than the step); needs
            whole-image training (``augment.crop`` ``pad`` or ``resize``, or no augmentation, as DINO's
            crops of the stored images), an eval ``crop_pct`` of 1.0 and the memory to hold them.
        mean: per-channel normalisation mean; ``None``: the dataset's statistics.
        std: per-channel normalisation std; ``None``: the dataset's statistics.
        crop_pct: eval transform resizes the shorter side to ``img_size / crop_pct`` then
            centre-crops; ``None``: what training sees, 1.0 (the whole image) when ``augment.crop``
            is ``'pad'`` or ``'resize'``, else the dataset default (imagefolder 0.875).
        interpolation: the eval resize's resampling filter (timm's names); ``None``: bilinear, or
            with ``model.pretrained`` the filter the weights were trained with.
        shapes_num_samples: total number of generated shapes images (split like digits).
        shapes_noise_std: std of the Gaussian background noise of shapes images (0-1 scale).
        shapes_style: ``'flat'`` (one-colour objects on a uniform noisy background) or
            ``'textured'`` (striped/checkered/speckled objects on smooth colour blobs with
            distractor strokes: harder for attention that merely pools identical tokens).
        shapes_scale: range of a shape's diameter as a fraction of the image's shorter side.
            Large shapes nearly always cover the image centre, so a map that merely peaks in the
            middle wins the pointing game; smaller ones (e.g. ``[0.3, 0.65]``) make it informative.
        classes: keep only these class indices of the dataset, relabelled ``0..k-1`` in the
            order given (every split); ``None``: every class.
        train_per_class: keep this many training images of each class (drawn by ``seed``), e.g.
            10 for few-shot fine-tuning; validation and test keep theirs. ``None``: all.
        augment: training augmentation.
    """

    name: DatasetName = "digits"
    root: str = "data"
    download: bool = False
    img_size: int | tuple[int, int] | None = field(default=None, metadata=bounds(ge=1, le=MAX_IMG_SIDE))
    in_chans: Channels | None = None
    num_workers: int = field(default=2, metadata=bounds(ge=0, le=MAX_NUM_WORKERS))
    val_fraction: float = field(default=0.1, metadata=bounds(gt=0, lt=1))
    test_fraction: float = field(default=0.2, metadata=bounds(gt=0, lt=1))
    seed: int = field(default=0, metadata=bounds(ge=0, le=2**32 - 1))
    skip_corrupt: bool = False
    verify_images: bool = True
    require_classes: bool = True
    no_split_below: int = field(default=20, metadata=bounds(ge=0, le=1 << 20))
    in_memory: bool = False
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = field(default=None, metadata=bounds(gt=0))
    crop_pct: float | None = field(default=None, metadata=bounds(gt=0, le=1))
    interpolation: Interpolation | None = None
    shapes_num_samples: int = field(default=6000, metadata=bounds(ge=30, le=MAX_SHAPES_SAMPLES))
    shapes_noise_std: float = field(default=0.06, metadata=bounds(ge=0, le=1))
    shapes_style: ShapesStyle = "flat"
    shapes_scale: tuple[float, float] = field(default=(0.3, 0.9), metadata=bounds(gt=0, le=1))
    classes: list[int] | None = field(default=None, metadata=bounds(ge=0))
    train_per_class: int | None = field(default=None, metadata=bounds(ge=1))
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def validate(self) -> None:
        """Cross-field checks (types and bounds are checked already): raise naming the option."""
        if self.in_memory and (self.name != "imagefolder" or not self.holds_whole_images()):
            raise FieldError("in_memory", "holds an image folder's whole images decoded once: it needs data.name "
                             "imagefolder, data.augment.crop pad or resize (or data.augment.enabled false, as for "
                             "DINO's crops) and data.crop_pct 1.0 (crops of the stored images would differ from what "
                             "evaluation sees); remove it.")
        if (self.classes is not None or self.train_per_class is not None) and self.name not in SUBSETTABLE:
            key = "classes" if self.classes is not None else "train_per_class"
            raise FieldError(
                key, f"applies to {', '.join(SUBSETTABLE)}; for an image folder make a subset folder "
                "(vitkit make-subset), shapes are generated per class already.",
            )
        if self.classes is not None and (not self.classes or len(set(self.classes)) != len(self.classes)):
            raise FieldError("classes", f"must list distinct class indices, got {self.classes}.")
        if not self.root:
            raise FieldError("root", f"is empty; give the folder holding the {self.name!r} files.")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction = {self.val_fraction + self.test_fraction:g} leaves no training data; "
                "keep their sum below 1."
            )
        for option in ("mean", "std"):
            value = getattr(self, option)
            if value is not None and len(value) not in (1, self.resolved_in_chans()):
                raise FieldError(
                    option,
                    f"has {len(value)} values but images have {self.resolved_in_chans()} channel(s); "
                    "give one value per channel (or one for all).",
                )
        if self.shapes_scale[0] > self.shapes_scale[1]:
            raise FieldError("shapes_scale", f"must satisfy 0 < min <= max <= 1, got {list(self.shapes_scale)}.")

    @property
    def defaults(self) -> DatasetDefaults:
        """The defaults of this dataset."""
        return DATASET_DEFAULTS[self.name]

    def resolved_img_size(self) -> tuple[int, int]:
        """``(H, W)`` of the output images."""
        size = self.defaults.img_size if self.img_size is None else self.img_size
        return (size, size) if isinstance(size, int) else size

    def resolved_in_chans(self) -> int:
        """Channels of the output images."""
        return self.defaults.in_chans if self.in_chans is None else self.in_chans

    def trains_on_whole_images(self) -> bool:
        """Training sees each whole image (resized, then padded and shifted or not): ``augment.crop``
        ``'pad'`` or ``'resize'``, against ``'random_resized'``'s crops of it."""
        return self.augment.enabled and (self.augment.crop or self.defaults.crop) in ("pad", "resize")

    def holds_whole_images(self) -> bool:
        """Every use of an image sees it whole, so that it can be stored decoded at ``img_size``: the
        eval crop is 1.0 and training augments whole images (:meth:`trains_on_whole_images`) or not at
        all (a task's own augmentation, such as DINO's multi-crop, then cuts the stored images)."""
        return self.resolved_crop_pct() == 1.0 and (self.trains_on_whole_images() or not self.augment.enabled)

    def resolved_crop_pct(self) -> float:
        """The eval crop: ``crop_pct``, or unset 1.0 for a recipe that trains on whole images (evaluation
        sees what training saw), else the dataset's default."""
        if self.crop_pct is not None:
            return self.crop_pct
        return 1.0 if self.trains_on_whole_images() else self.defaults.crop_pct

    def resolved(self) -> DataConfig:
        """A copy with every ``None`` option replaced by the dataset's default."""
        defaults = self.defaults
        augment = dataclasses.replace(
            self.augment,
            crop=self.augment.crop or defaults.crop,
            hflip=defaults.hflip if self.augment.hflip is None else self.augment.hflip,
        )
        return dataclasses.replace(
            self,
            img_size=self.resolved_img_size(),
            in_chans=self.resolved_in_chans(),
            crop_pct=self.resolved_crop_pct(),
            augment=augment,
        )
