"""The data a trained model was trained on, rebuilt from the options saved with it, and checked
to fit the model: what every command that scores, explains or prunes a model file reads.

The model is taken by what it declares (:class:`ModelData`: its ``config``'s class count,
channels and image size), so this module needs no model code.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from ..errors import VitkitError
from ..schema import build, dotted_keys, merge, parse_overrides
from .build import build_datasets
from .config import DataConfig
from .info import DataInfo, DatasetBundle, MetadataError


class DataGeometry(Protocol):
    """What a model's config says about the images it takes and the classes it predicts
    (a :class:`vitkit.models.ViTConfig` has these)."""

    num_classes: int
    in_chans: int
    img_size: tuple[int, int]
    dynamic_img_size: bool


class ModelData(Protocol):
    """A model whose ``config`` is a :class:`DataGeometry` (a :class:`vitkit.models.VisionTransformer`)."""

    @property
    def config(self) -> DataGeometry: ...


class DataMismatchError(VitkitError, ValueError):
    """The data (after ``--data`` overrides) does not fit the model."""


def data_config_for(extra: dict[str, Any], overrides: Iterable[str] = (), model: ModelData | None = None) -> DataConfig:
    """The data options saved with a model (``extra['data_config']``, else its dataset name and
    geometry, else ``model``'s geometry) with ``key=value`` overrides, validated like a recipe's
    data section.

    Raises:
        MetadataError: the model records no dataset and the overrides name none.
        ConfigError: the options are invalid.
    """
    updates, keys = parse_overrides(f"data.{item}" for item in overrides)
    saved = extra.get("data_config") or {
        "name": extra.get("dataset"),
        "img_size": extra.get("img_size", list(model.config.img_size) if model else None),
        "in_chans": extra.get("in_chans", model.config.in_chans if model else None),
    }
    values = merge(saved, updates.get("data", {}))
    if values.get("name") is None:
        raise MetadataError(
            "the model's metadata names no dataset (it was saved without extra=); give the data to use, "
            "e.g. --data name=cifar10 root=/data/cifar."
        )
    return build(DataConfig, values, source="the model's saved data options", path="data.",
                 all_keys=dotted_keys(DataConfig, prefix="data."), override_keys=keys)


def datasets_for(
    model: ModelData, extra: dict[str, Any], overrides: Iterable[str] = (), *, features_only: bool = False
) -> DatasetBundle:
    """The splits of the data ``model`` was trained on (:func:`data_config_for`), checked to fit it
    (:func:`check_model_fits`; ``features_only``: a model without a classifier is welcome)."""
    bundle = build_datasets(data_config_for(extra, overrides, model))
    check_model_fits(model, bundle.info, features_only=features_only)
    return bundle


def check_model_fits(model: ModelData, info: DataInfo, *, features_only: bool = False) -> None:
    """Refuse data the model cannot take: another class count, channel count or (unless the model
    has ``dynamic_img_size``) image size, as ``--data`` overrides can give. A model without a
    classifier (``num_classes=0``: a pre-trained encoder) is refused unless ``features_only`` (a
    use that reads features or attention, not classes), which takes data of any class count.

    Raises:
        DataMismatchError: naming each difference.
    """
    config = model.config
    if config.num_classes == 0 and not features_only:
        raise DataMismatchError(
            "the model has no classifier (num_classes=0): it gives features, not classes; fine-tune a "
            "classifier on it first (vitkit train RECIPE model.pretrained=MODEL, docs/finetune.md)."
        )
    problems = []
    if config.num_classes and info.num_classes != config.num_classes:
        problems.append(f"{info.num_classes} classes (the model predicts {config.num_classes})")
    if info.in_chans != config.in_chans:
        problems.append(f"{info.in_chans} channel(s) (the model takes {config.in_chans})")
    if tuple(info.img_size) != tuple(config.img_size) and not config.dynamic_img_size:
        problems.append(f"{info.img_size[0]}x{info.img_size[1]} images (the model takes "
                        f"{config.img_size[0]}x{config.img_size[1]})")
    if problems:
        raise DataMismatchError(
            f"dataset {info.name!r} as configured has {', '.join(problems)}; use the data the model was trained on, "
            "or leave out the --data overrides that change it."
        )
