"""What a model needs to know about its data (:class:`DataInfo`) and the built splits
(:class:`DatasetBundle`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, get_args

from torch.utils.data import Dataset

from ..errors import VitkitError
from ..preprocessing import EvalCropMode, Interpolation, preprocessing_extra

#: ImageNet statistics, the default for image folders.
IMAGENET_MEAN: tuple[float, ...] = (0.485, 0.456, 0.406)
IMAGENET_STD: tuple[float, ...] = (0.229, 0.224, 0.225)

#: How the eval transform fits an image to ``img_size`` (timm's ``crop_mode`` values).
CROP_MODES: tuple[str, ...] = get_args(EvalCropMode)
INTERPOLATIONS: tuple[str, ...] = get_args(Interpolation)


class DataFileError(VitkitError, ValueError):
    """A dataset file that cannot be read as its format says (the message names the file)."""


class MetadataError(VitkitError, ValueError):
    """A model's saved metadata lacks what a tool needs (normalisation, class names, dataset)."""


@dataclass(frozen=True)
class DataInfo:
    """Classes, image geometry and normalisation of a dataset.

    Attributes:
        num_classes: number of classes.
        class_names: one name per label index.
        img_size: ``(H, W)`` of the images the datasets return.
        in_chans: channels of those images (1 or 3).
        mean: per-channel normalisation mean, ``in_chans`` values on the 0-1 scale.
        std: per-channel normalisation std.
        name: dataset name (``'cifar10'``, ``'digits'``, ...).
        crop_pct: the eval transform resizes to ``img_size / crop_pct``, then crops ``img_size``.
        crop_mode: ``'center'`` resizes the shorter side and centre-crops, ``'squash'`` resizes
            both sides (aspect ratio not kept), ``'border'`` resizes the longer side and pads
            with the mean colour (timm's eval crop modes).
        interpolation: the resize's resampling filter.
    """

    num_classes: int
    class_names: tuple[str, ...]
    img_size: tuple[int, int]
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str
    crop_pct: float = 1.0
    crop_mode: str = "center"
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.num_classes} classes.")
        if len(self.mean) != self.in_chans or len(self.std) != self.in_chans:
            raise ValueError(
                f"mean ({len(self.mean)} values) and std ({len(self.std)}) must have one value per channel "
                f"(in_chans={self.in_chans})."
            )
        if not all(math.isfinite(value) for value in self.mean):
            raise ValueError(f"mean must be finite numbers, got {list(self.mean)}.")
        if not all(math.isfinite(value) and value > 0 for value in self.std):
            raise ValueError(f"std must be positive finite numbers (images are divided by it), got {list(self.std)}.")
        if not 0 < self.crop_pct <= 1:  # NaN fails too
            raise ValueError(f"crop_pct must lie in (0, 1], got {self.crop_pct}.")
        if self.crop_mode not in CROP_MODES:
            raise ValueError(f"crop_mode must be one of {CROP_MODES}, got {self.crop_mode!r}.")
        if self.interpolation not in INTERPOLATIONS:
            raise ValueError(f"interpolation must be one of {INTERPOLATIONS}, got {self.interpolation!r}.")

    def to_extra(self) -> dict[str, Any]:
        """The ``extra`` metadata saved with an exported model (JSON types only)."""
        return {
            "mean": list(self.mean),
            "std": list(self.std),
            "img_size": list(self.img_size),
            "in_chans": self.in_chans,
            "class_names": list(self.class_names),
            "dataset": self.name,
            "crop_pct": self.crop_pct,
            "crop_mode": self.crop_mode,
            "interpolation": self.interpolation,
        }

    @classmethod
    def from_extra(cls, extra: dict[str, Any]) -> DataInfo:
        """Inverse of :meth:`to_extra`; :class:`MetadataError` names the missing keys."""
        missing = [key for key in ("mean", "std", "img_size", "in_chans", "class_names") if extra.get(key) is None]
        if missing:
            raise MetadataError(
                f"the model's metadata lacks {', '.join(missing)}, which say how to prepare its input images; it "
                "was saved without them (vitkit.save_model(model, path) without extra=). Save it again with "
                "extra={**info.to_extra(), ...} from the DataInfo of its training data (a model from "
                "vitkit.from_timm keeps timm's own)."
            )
        height, width = extra["img_size"]
        return cls(
            num_classes=len(extra["class_names"]),
            class_names=tuple(extra["class_names"]),
            img_size=(int(height), int(width)),
            in_chans=int(extra["in_chans"]),
            mean=tuple(float(m) for m in extra["mean"]),
            std=tuple(float(s) for s in extra["std"]),
            name=str(extra.get("dataset", "unknown")),
            crop_pct=float(extra.get("crop_pct", 1.0)),
            crop_mode=str(extra.get("crop_mode", "center")),
            interpolation=str(extra.get("interpolation", "bilinear")),
        )

    @classmethod
    def from_pretrained_cfg(
        cls, cfg: dict[str, Any], num_classes: int, class_names: tuple[str, ...] | None = None
    ) -> DataInfo:
        """The eval preprocessing that a timm ``pretrained_cfg`` (``model.pretrained_cfg`` or
        ``timm.get_pretrained_cfg(name).to_dict()``) describes
        (:func:`~vitkit.preprocessing.preprocessing_extra`); classes named by index unless
        ``class_names`` are given."""
        return cls.from_extra(preprocessing_extra(cfg, num_classes, class_names))


@dataclass
class DatasetBundle:
    """The three splits, each yielding ``(image FloatTensor [C, H, W] normalised, label int)``.

    ``train`` uses the training transform, ``val`` and ``test`` the eval transform. ``held_out``
    is false where validation and test show the training images (a folder with too few images per
    class to hold any out: the run keeps its last epoch).
    """

    train: Dataset
    val: Dataset
    test: Dataset
    info: DataInfo
    held_out: bool = True
