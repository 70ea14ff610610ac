"""Evaluate a trained model on its dataset: loss, top-1, top-5, per-class accuracy, confusion matrix
(through the one evaluation loop, :func:`vitkit.evaluation.evaluate_model`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.metrics import confusion_matrix
from torch.utils.data import DataLoader

from ..data import DataConfig, DataInfo, DatasetBundle, build_datasets
from ..data.info import MetadataError
from ..errors import VitkitError
from ..evaluation import Precision, TestTimeAugmentation, black_level, default_device, evaluate_model, recorded_tta
from ..io import load_model_and_extra
from ..layers.token_merging import Schedule
from ..models import VisionTransformer
from ..models import merge_tokens as merge_tokens_into
from .artifacts import write_json
from .plots import plot_confusion_matrix
from .schema import build, dotted_keys, merge, parse_overrides


def evaluate(
    model_path: str | os.PathLike,
    data_overrides: Iterable[str] = (),
    split: str = "test",
    batch_size: int = 256,
    tta: TestTimeAugmentation | None = None,
    merge_tokens: tuple[int | Sequence[int], Schedule] | None = None,
    precision: Precision = "fp32",
) -> dict[str, Any]:
    """Accuracy of a ``.safetensors`` or ``.ckpt`` model on a split of the data it was trained on,
    computed on :func:`~vitkit.evaluation.default_device` (a GPU when there is one).

    Args:
        model_path: an exported ``model.safetensors`` or a training checkpoint.
        data_overrides: ``key=value`` changes to the training data options saved with the model
            (``root=/data/cifar``, ``num_workers=0``).
        split: ``'test'`` or ``'val'``.
        batch_size: evaluation batch size.
        tta: test-time augmentation (:func:`~vitkit.evaluation.predict`); ``None``: the one the
            model was trained with (saved with it; ``'none'`` for older files).
        merge_tokens: ``(r, schedule)`` of :func:`vitkit.merge_tokens` (ToMe) for this evaluation;
            ``None``: as the model file records.
        precision: ``"bf16"``: the forward under bfloat16 autocast (:func:`~vitkit.evaluation.inference_context`).

    Returns:
        ``"merge_tokens"`` (ToMe's r per block, 0: none), ``{"top1", "top5"}`` in percent,
        ``"loss"`` (mean cross-entropy), ``"per_class"`` accuracy by class name, ``"confusion_matrix"``
        (rows: true class), ``"num_images"``, ``"model"``, ``"dataset"``, ``"split"``, ``"tta"``.
    """
    if split not in ("test", "val"):
        raise ValueError(f"split must be 'test' or 'val', got {split!r}.")
    model, extra = load_model_and_extra(model_path)
    if merge_tokens is not None:
        merge_tokens_into(model, *merge_tokens)
    tta = recorded_tta(extra, str(model_path)) if tta is None else tta  # checked before the data is loaded
    model.eval()
    bundle = datasets_for(model, extra, data_overrides)
    info = bundle.info
    loader = DataLoader(getattr(bundle, split), batch_size=batch_size)
    scores = evaluate_model(model.to(default_device()), loader, tta=tta, fill=black_level(info.mean, info.std),
                            precision=precision)
    k = info.num_classes
    matrix = confusion_matrix(scores.labels.numpy(), scores.predictions.numpy(), labels=list(range(k)))
    per_class = np.divide(np.diag(matrix), matrix.sum(axis=1), out=np.zeros(k), where=matrix.sum(axis=1) > 0)
    report = {
        "model": str(model_path),
        "dataset": info.name,
        "split": split,
        "tta": tta,
        "precision": precision,
        "merge_tokens": model.config.merge_tokens,
        "num_images": scores.num_images,
        "top1": round(scores.top1, 3),
        "top5": round(scores.top5, 3),
        "loss": round(scores.loss, 4),
        "per_class": {name: round(float(acc * 100), 3) for name, acc in zip(info.class_names, per_class)},
        "confusion_matrix": matrix.tolist(),
    }
    return report


def write_evaluation(report: dict[str, Any], out_dir: str | os.PathLike) -> None:
    """Write :func:`evaluate`'s ``report`` to ``out_dir``: ``eval.json`` and ``confusion_matrix.png``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "eval.json", report)
    plot_confusion_matrix(np.asarray(report["confusion_matrix"]), list(report["per_class"]),
                          out_dir / "confusion_matrix.png")


def data_config_for(
    extra: dict[str, Any], overrides: Iterable[str] = (), model: VisionTransformer | None = None
) -> DataConfig:
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
    model: VisionTransformer, extra: dict[str, Any], overrides: Iterable[str] = (), *, features_only: bool = False
) -> DatasetBundle:
    """The splits of the data ``model`` was trained on (:func:`data_config_for`), checked to fit it
    (:func:`check_model_fits`; ``features_only``: a model without a classifier is welcome)."""
    bundle = build_datasets(data_config_for(extra, overrides, model))
    check_model_fits(model, bundle.info, features_only=features_only)
    return bundle


def check_model_fits(model: VisionTransformer, info: DataInfo, *, features_only: bool = False) -> None:
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


class DataMismatchError(VitkitError, ValueError):
    """The data (after ``--data`` overrides) does not fit the model."""
