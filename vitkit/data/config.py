"""Data options: :class:`DataConfig` (which dataset, where, how to split) and its nested
:class:`AugmentConfig` (training augmentation), both validated on construction.

Fields left at ``None`` take the dataset's default (:data:`DATASET_DEFAULTS`); call
:meth:`DataConfig.resolved` for a copy with every default filled in.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any, Literal

CropMode = Literal["random_resized", "pad", "resize"]
CROP_MODES: tuple[str, ...] = ("random_resized", "pad", "resize")

ShapesStyle = Literal["flat", "textured"]
SHAPES_STYLES: tuple[str, ...] = ("flat", "textured")

#: timm AutoAugment policy names (``timm.data.auto_augment.auto_augment_policy``).
AUTO_AUGMENT_POLICIES: tuple[str, ...] = ("original", "originalr", "v0", "v0r", "3a")


@dataclass(frozen=True)
class DatasetDefaults:
    """What a dataset uses for the options left at ``None``."""

    img_size: int
    in_chans: int
    crop: CropMode
    hflip: float
    crop_pct: float


#: Per-dataset defaults. Digits (and MNIST) are not flipped (a mirrored 3 is no digit); the small datasets
#: use pad-and-crop, ImageNet-style folders RandomResizedCrop with the usual 0.875 eval crop.
DATASET_DEFAULTS: dict[str, DatasetDefaults] = {
    "cifar10": DatasetDefaults(img_size=32, in_chans=3, crop="pad", hflip=0.5, crop_pct=1.0),
    "cifar100": DatasetDefaults(img_size=32, in_chans=3, crop="pad", hflip=0.5, crop_pct=1.0),
    "imagefolder": DatasetDefaults(img_size=224, in_chans=3, crop="random_resized", hflip=0.5, crop_pct=0.875),
    "fashion_mnist": DatasetDefaults(img_size=28, in_chans=1, crop="pad", hflip=0.5, crop_pct=1.0),
    "mnist": DatasetDefaults(img_size=28, in_chans=1, crop="pad", hflip=0.0, crop_pct=1.0),
    "digits": DatasetDefaults(img_size=32, in_chans=1, crop="pad", hflip=0.0, crop_pct=1.0),
    "shapes": DatasetDefaults(img_size=32, in_chans=3, crop="pad", hflip=0.5, crop_pct=1.0),
}
DATASET_NAMES: tuple[str, ...] = tuple(DATASET_DEFAULTS)


@dataclass
class AugmentConfig:
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
    """

    enabled: bool = True
    crop: CropMode | None = None
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    padding: int = 4
    hflip: float | None = None
    color_jitter: float = 0.0
    rand_augment: str | None = None

    def __post_init__(self) -> None:
        self.scale = _pair(self.scale, "augment.scale", float)
        self.ratio = _pair(self.ratio, "augment.ratio", float)
        if self.crop is not None and self.crop not in CROP_MODES:
            raise ValueError(f"augment.crop must be one of {CROP_MODES} or null, got {self.crop!r}.")
        if not 0.0 < self.scale[0] <= self.scale[1] <= 1.0:
            raise ValueError(f"augment.scale must satisfy 0 < min <= max <= 1, got {list(self.scale)}.")
        if not 0.0 < self.ratio[0] <= self.ratio[1]:
            raise ValueError(f"augment.ratio must satisfy 0 < min <= max, got {list(self.ratio)}.")
        if self.padding < 0:
            raise ValueError(f"augment.padding must be >= 0 pixels, got {self.padding}.")
        if self.hflip is not None and not 0.0 <= self.hflip <= 1.0:
            raise ValueError(f"augment.hflip is a probability in [0, 1], got {self.hflip}.")
        if self.color_jitter < 0:
            raise ValueError(f"augment.color_jitter must be >= 0, got {self.color_jitter}.")
        policy = self.rand_augment
        if policy is not None and not (
            policy.startswith(("rand-", "augmix-")) or policy in ("rand", "augmix") or policy in AUTO_AUGMENT_POLICIES
        ):
            raise ValueError(
                f"augment.rand_augment {policy!r} is no timm policy: use 'rand-m9-mstd0.5' (RandAugment), "
                f"'augmix-m5-w3' (AugMix) or one of the AutoAugment policies {AUTO_AUGMENT_POLICIES}."
            )


@dataclass
class DataConfig:
    """Which dataset to load, from where, and how to split, size and augment it.

    Attributes:
        name: ``'cifar10'``, ``'cifar100'``, ``'fashion_mnist'``, ``'mnist'``, ``'imagefolder'``,
            ``'digits'`` or ``'shapes'``.
        root: folder holding the dataset (CIFAR: ``cifar-10-batches-py`` / ``cifar-100-python``
            inside it; (Fashion-)MNIST: the four IDX ``.gz`` files, directly or in
            ``FashionMNIST/raw`` / ``MNIST/raw`` as torchvision downloads them; imagefolder: ``train/<class>/*``, ``val/<class>/*`` and optionally
            ``test/<class>/*``). Digits and shapes need none.
        download: download CIFAR or (Fashion-)MNIST into ``root`` when its files are absent.
        img_size: output image size, int or (H, W); ``None``: dataset default.
        in_chans: 1 (grayscale) or 3 (RGB) output channels; ``None``: dataset default (digits 1).
        num_workers: DataLoader worker processes.
        val_fraction: share of the training set held out for validation (CIFAR, MNIST, digits, shapes).
        test_fraction: share held out for testing (digits, shapes; CIFAR and MNIST have official test sets).
        seed: seed of the splits and of the generated shapes.
        skip_corrupt: imagefolder: skip unreadable images (logged, counted) instead of raising.
        verify_images: imagefolder: decode every file once when building (at 1/8 scale for JPEG),
            so unreadable files are found up front; otherwise they raise when loaded.
        mean: per-channel normalisation mean; ``None``: the dataset's statistics.
        std: per-channel normalisation std; ``None``: the dataset's statistics.
        crop_pct: eval transform resizes the shorter side to ``img_size / crop_pct`` then
            centre-crops; ``None``: dataset default (1.0, imagefolder 0.875).
        shapes_num_samples: total number of generated shapes images (split like digits).
        shapes_noise_std: std of the Gaussian background noise of shapes images (0-1 scale).
        shapes_style: ``'flat'`` (one-colour objects on a uniform noisy background) or
            ``'textured'`` (striped/checkered/speckled objects on smooth colour blobs with
            distractor strokes: harder for attention that merely pools identical tokens).
        shapes_scale: range of a shape's diameter as a fraction of the image's shorter side.
            Large shapes nearly always cover the image centre, so a map that merely peaks in the
            middle wins the pointing game; smaller ones (e.g. ``[0.3, 0.65]``) make it informative.
        augment: training augmentation.
    """

    name: str = "digits"
    root: str = "data"
    download: bool = False
    img_size: int | tuple[int, int] | None = None
    in_chans: int | None = None
    num_workers: int = 2
    val_fraction: float = 0.1
    test_fraction: float = 0.2
    seed: int = 0
    skip_corrupt: bool = False
    verify_images: bool = True
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    crop_pct: float | None = None
    shapes_num_samples: int = 6000
    shapes_noise_std: float = 0.06
    shapes_style: ShapesStyle = "flat"
    shapes_scale: tuple[float, float] = (0.3, 0.9)
    augment: AugmentConfig = field(default_factory=AugmentConfig)

    def __post_init__(self) -> None:
        if isinstance(self.augment, dict):
            self.augment = _from_dict(AugmentConfig, self.augment, "data.augment")
        if self.img_size is not None and not isinstance(self.img_size, int):
            self.img_size = _pair(self.img_size, "img_size (an int or H, W)", int)
        if self.mean is not None:
            self.mean = tuple(float(m) for m in self.mean)
        if self.std is not None:
            self.std = tuple(float(s) for s in self.std)
        self.shapes_scale = _pair(self.shapes_scale, "shapes_scale", float)
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the first bad option and how to fix it."""
        if self.name not in DATASET_NAMES:
            close = difflib.get_close_matches(str(self.name), DATASET_NAMES, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown dataset {self.name!r}.{hint} Available: {', '.join(DATASET_NAMES)}.")
        if not self.root:
            raise ValueError(f"data.root is empty; give the folder holding the {self.name!r} files.")
        sizes = (self.img_size,) * 2 if isinstance(self.img_size, int) else self.img_size or (1, 1)
        if min(sizes) < 1:
            raise ValueError(f"img_size must be positive, got {self.img_size!r}.")
        if self.in_chans not in (None, 1, 3):
            raise ValueError(f"in_chans must be 1 (grayscale) or 3 (RGB), got {self.in_chans!r}.")
        if self.num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {self.num_workers}.")
        for option in ("val_fraction", "test_fraction"):
            value = getattr(self, option)
            if not 0.0 < value < 1.0:
                raise ValueError(f"{option} must lie strictly between 0 and 1, got {value}.")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise ValueError(
                f"val_fraction + test_fraction = {self.val_fraction + self.test_fraction:g} leaves no training data; "
                "keep their sum below 1."
            )
        for option in ("mean", "std"):
            value = getattr(self, option)
            if value is not None and len(value) not in (1, self.resolved_in_chans()):
                raise ValueError(
                    f"{option} has {len(value)} values but images have {self.resolved_in_chans()} channel(s)."
                )
        if self.std is not None and min(self.std) <= 0:
            raise ValueError(f"std values must be positive, got {list(self.std)}.")
        if self.crop_pct is not None and not 0.0 < self.crop_pct <= 1.0:
            raise ValueError(f"crop_pct must lie in (0, 1], got {self.crop_pct}.")
        if self.shapes_num_samples < 30:
            raise ValueError(f"shapes_num_samples must be at least 30 to split, got {self.shapes_num_samples}.")
        if self.shapes_noise_std < 0:
            raise ValueError(f"shapes_noise_std must be >= 0, got {self.shapes_noise_std}.")
        if not 0.0 < self.shapes_scale[0] <= self.shapes_scale[1] <= 1.0:
            raise ValueError(f"shapes_scale must satisfy 0 < min <= max <= 1, got {list(self.shapes_scale)}.")
        if self.shapes_style not in SHAPES_STYLES:
            raise ValueError(f"shapes_style must be one of {SHAPES_STYLES}, got {self.shapes_style!r}.")

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
            crop_pct=defaults.crop_pct if self.crop_pct is None else self.crop_pct,
            augment=augment,
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain dict (nested ``augment`` dict, tuples as lists) for YAML/JSON."""
        return _plain(dataclasses.asdict(self))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> DataConfig:
        """Inverse of :meth:`to_dict`; unknown keys (also inside ``augment``) raise ``ValueError``
        naming them and the closest valid field."""
        return _from_dict(cls, values, "data")


def _from_dict(cls: type, values: dict[str, Any], where: str) -> Any:
    known = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"unknown option {where}.{key}.{hint} Valid options: {', '.join(known)}.")
    return cls(**values)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def _pair(value: Any, name: str, cast: type) -> tuple[Any, Any]:
    try:
        first, second = value
        return cast(first), cast(second)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair of {cast.__name__}s, got {value!r}.") from None
