"""The metadata a model file carries beside its weights (its ``extra``: class names, normalisation,
image size, preprocessing, the data it was trained on), checked against the model's config
wherever a file is read (:mod:`vitkit.io`, :mod:`vitkit.export`)."""

from __future__ import annotations

from typing import Any, Literal

from .models.config import ViTConfig
from .preprocessing import EvalCropMode, Interpolation
from .schema import MAX_IMG_SIDE, ConfigError, FieldError, bounds, check_value, describe

#: The metadata key of a model file that holds its ``extra`` (JSON).
EXTRA_KEY = "vitkit_extra"

#: The ``extra`` metadata vitkit writes and reads back, with the type each must have (other keys
#: a user passes to :func:`~vitkit.io.save_model` are kept as they are).
EXTRA_FIELDS: dict[str, Any] = {
    "class_names": tuple[str, ...] | None,
    "mean": tuple[float, ...] | None,
    "std": tuple[float, ...] | None,
    "img_size": tuple[int, int] | None,
    "in_chans": Literal[1, 3] | None,
    "crop_pct": float | None,
    "crop_mode": EvalCropMode | None,
    "interpolation": Interpolation | None,
    "dataset": str | None,
    "recipe": str | None,
    "data_config": dict | None,
}
_EXTRA_BOUNDS: dict[str, dict[str, float]] = {
    "std": bounds(gt=0),
    "img_size": bounds(ge=1, le=MAX_IMG_SIDE),
    "crop_pct": bounds(gt=0, le=1),
}


def check_extra(extra: Any, config: ViTConfig, source: str, error: type[ConfigError]) -> dict[str, Any]:
    """``extra`` metadata checked against :data:`EXTRA_FIELDS` and the model's ``config`` (one class
    name per class, one mean/std per channel, the model's channels, an image size it takes). Returns a new dict with the
    same keys, values coerced (lists for tuples).

    Raises:
        ``error``: naming the key, ``source`` and what is allowed.
    """
    if not isinstance(extra, dict):
        raise error(f"{EXTRA_KEY} in {source} must be a mapping, got {describe(extra)}.")
    checked = dict(extra)
    try:
        for key, hint in EXTRA_FIELDS.items():
            checked[key] = check_value(key, extra.get(key), hint, _EXTRA_BOUNDS.get(key))
        names = checked["class_names"]
        if names is not None and len(names) != config.num_classes:
            raise FieldError("class_names", f"has {len(names)} names for the model's {config.num_classes} classes.")
        if checked["in_chans"] is not None and checked["in_chans"] != config.in_chans:
            raise FieldError("in_chans", f"is {checked['in_chans']}, but the model takes {config.in_chans} channel(s).")
        for key in ("mean", "std"):
            values = checked[key]
            if values is not None and len(values) != config.in_chans:
                raise FieldError(key, f"has {len(values)} values for the model's {config.in_chans} channel(s).")
        _check_img_size(checked["img_size"], config)
        _check_resize(checked["crop_pct"], checked["img_size"] or config.img_size)
    except FieldError as problem:
        raise error(f"{problem.key} in {source} {problem.problem}") from None
    return {key: list(value) if isinstance(value, tuple) else value for key, value in checked.items() if key in extra}


def _check_img_size(size: tuple[int, int] | None, config: ViTConfig) -> None:
    """The image size a file records (what its images are resized to) must be one the model takes:
    its own without ``dynamic_img_size``, else whole patches within the token limit.

    Raises:
        FieldError: it is not.
    """
    if size is None:
        return
    if not config.dynamic_img_size and tuple(size) != config.img_size:
        raise FieldError("img_size", f"is {list(size)}, but the model takes {list(config.img_size)} images only.")
    try:
        config.replace(img_size=tuple(size))
    except ValueError as problem:
        raise FieldError("img_size", f"is {list(size)}, which the model cannot take: {problem}") from None


def _check_resize(crop_pct: float | None, size: tuple[int, int]) -> None:
    """The eval resize (``size / crop_pct`` before the crop) must stay within twice the largest
    image side: a tiny ``crop_pct`` would otherwise allocate gigabytes for one image.

    Raises:
        FieldError: it does not.
    """
    if crop_pct is not None and max(size) / crop_pct > 2 * MAX_IMG_SIDE:
        smallest = max(size) / (2 * MAX_IMG_SIDE)
        raise FieldError("crop_pct", f"is {crop_pct}, which resizes images to {max(size) / crop_pct:,.0f} pixels before "
                         f"the {max(size)}-pixel crop; it must be at least {smallest:.4g}.")
