"""Evaluate a trained model on its dataset, or on a test folder of class folders: loss, top-1, top-5,
per-class accuracy, confusion matrix (through the one evaluation loop, :func:`vitkit.evaluation.evaluate_model`)."""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from ..class_folders import class_scores, read_class_folder
from ..data import DataInfo, datasets_for
from ..errors import UsageError
from ..evaluation import Precision, TestTimeAugmentation, black_level, default_device, evaluate_model, recorded_tta
from ..export import OnnxClassifier
from ..files import atomic_write, write_json
from ..io import load_model_and_extra
from ..layers.token_merging import Schedule
from ..models import VisionTransformer
from ..models import merge_tokens as merge_tokens_into
from .plots import plot_confusion_matrix


def evaluate(
    model_path: str | os.PathLike,
    data_overrides: Iterable[str] = (),
    split: str = "test",
    batch_size: int = 256,
    tta: TestTimeAugmentation | None = None,
    merge_tokens: tuple[int | Sequence[int], Schedule] | None = None,
    precision: Precision = "fp32",
    folder: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Accuracy of a model file on a split of the data it was trained on, or on every image of a
    test ``folder`` of class folders, computed on :func:`~vitkit.evaluation.default_device` (a GPU
    when there is one; an ``.onnx`` file runs on onnxruntime, on the CPU).

    Args:
        model_path: an exported ``model.safetensors``, a training checkpoint, or (with ``folder``)
            an ``.onnx`` file from ``vitkit export``.
        data_overrides: ``key=value`` changes to the training data options saved with the model
            (``root=/data/cifar``, ``num_workers=0``).
        split: ``'test'`` or ``'val'``.
        batch_size: evaluation batch size.
        tta: test-time augmentation (:func:`~vitkit.evaluation.predict`); ``None``: the one the
            model was trained with (saved with it; ``'none'`` for older files).
        merge_tokens: ``(r, schedule)`` of :func:`vitkit.merge_tokens` (ToMe) for this evaluation;
            ``None``: as the model file records.
        precision: ``"bf16"``: the forward under bfloat16 autocast (:func:`~vitkit.evaluation.inference_context`).
        folder: a test folder ``FOLDER/<class>/*`` (:func:`~vitkit.class_folders.read_class_folder`),
            its images read with the model's own preprocessing, instead of the training data's split.

    Returns:
        ``"merge_tokens"`` (ToMe's r per block, 0: none; ``None`` for an ``.onnx`` file),
        ``{"top1", "top5"}`` in percent (``top5`` ``None`` with fewer than 5 classes), ``"loss"``
        (mean cross-entropy), ``"per_class"`` accuracy and ``"per_class_counts"`` by class name (the
        classes with images), ``"class_names"``, ``"confusion_matrix"`` (rows: true class),
        ``"num_images"``, ``"images_per_second"`` (of the model's forward passes), ``"model"``,
        ``"dataset"``, ``"split"`` (``'all'`` for a folder), ``"tta"``, ``"precision"``, ``"missing_classes"``.
    """
    if split not in ("test", "val"):
        raise ValueError(f"split must be 'test' or 'val', got {split!r}.")
    if folder is not None and list(data_overrides):
        raise UsageError("give a test FOLDER or --data, not both: --data changes the training data whose split is "
                         "evaluated, a FOLDER is evaluated whole.")
    model, extra = load_classifier(model_path, merge_tokens, precision, folder is not None)
    tta = recorded_tta(extra, str(model_path)) if tta is None else tta  # checked before the data is loaded
    dataset, info, missing = evaluation_data(model, extra, data_overrides, split, folder)
    scores = evaluate_model(model, DataLoader(dataset, batch_size=batch_size), tta=tta,
                            fill=black_level(info.mean, info.std), precision=precision)
    return {
        "model": str(model_path),
        "dataset": info.name if folder is None else str(folder),
        "split": split if folder is None else "all",
        "tta": tta,
        "precision": precision,
        "merge_tokens": model.config.merge_tokens if isinstance(model, VisionTransformer) else None,
        "num_images": scores.num_images,
        "images_per_second": round(scores.images_per_second, 1),
        "top1": round(scores.top1, 3),
        "top5": round(scores.top5, 3) if info.num_classes >= 5 else None,
        "loss": round(scores.loss, 4),
        "class_names": list(info.class_names),
        "missing_classes": list(missing),
        **{key: value for key, value in class_scores(scores.labels, scores.predictions, info.class_names).items()
           if key != "top1"},
    }


def evaluation_data(
    model: VisionTransformer | OnnxClassifier, extra: dict[str, Any], data_overrides: Iterable[str] = (),
    split: str = "test", folder: str | os.PathLike | None = None,
) -> tuple[Dataset, DataInfo, tuple[str, ...]]:
    """What :func:`evaluate` scores ``model`` (with its metadata ``extra``) on: the images, each
    ``([C, H, W] float32, label)``, their :class:`~vitkit.data.DataInfo`, and the model's classes
    without images (a test ``folder`` may hold only some). Without ``folder``, ``split`` of the
    data saved with the model (:func:`~vitkit.data.datasets_for`, ``data_overrides`` applied)."""
    if folder is None:
        bundle = datasets_for(model, extra, data_overrides)
        return getattr(bundle, split), bundle.info, ()
    info = DataInfo.from_extra(extra)
    images = read_class_folder(folder, info.class_names)
    return images.dataset(info), info, images.missing


def load_classifier(
    model_path: str | os.PathLike, merge_tokens: tuple[int | Sequence[int], Schedule] | None, precision: Precision,
    onnx_allowed: bool,
) -> tuple[VisionTransformer | OnnxClassifier, dict[str, Any]]:
    """The model of a model file on :func:`~vitkit.evaluation.default_device`, in eval mode and
    merging tokens as asked, or an ``.onnx`` file's :class:`~vitkit.export.OnnxClassifier` (where
    ``onnx_allowed``), and the metadata it records.

    Raises:
        UsageError: an ``.onnx`` file where it is not allowed, or with ``merge_tokens`` or bf16
            (its graph runs as exported).
    """
    if Path(model_path).suffix != ".onnx":
        model, extra = load_model_and_extra(model_path)
        if merge_tokens is not None:
            merge_tokens_into(model, *merge_tokens)
        return model.eval().to(default_device()), extra
    if not onnx_allowed:
        raise UsageError(f"{model_path} records no training data to split; evaluate it on a test folder: "
                         f"vitkit evaluate {model_path} FOLDER.")
    if merge_tokens is not None or precision != "fp32":
        raise UsageError(f"{model_path} runs as it was exported: leave out --merge-tokens and --precision (export "
                         "the model file with --merge-tokens to merge tokens in the graph).")
    runner = OnnxClassifier(model_path)
    return runner, runner.extra


def write_evaluation(report: dict[str, Any], out_dir: str | os.PathLike) -> None:
    """Write :func:`evaluate`'s ``report`` to ``out_dir``: ``eval.json``, ``confusion_matrix.png`` and
    ``confusion_matrix.csv`` (a header of the predicted classes; each row a true class, its counts)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_json(out_dir / "eval.json", report)
    matrix, names = np.asarray(report["confusion_matrix"]), report["class_names"]
    plot_confusion_matrix(matrix, names, out_dir / "confusion_matrix.png")
    rows = [["true/predicted", *names], *([name, *row] for name, row in zip(names, matrix.tolist()))]

    def write_csv(tmp: str) -> None:
        with open(tmp, "w", newline="") as handle:
            csv.writer(handle).writerows(rows)

    atomic_write(out_dir / "confusion_matrix.csv", write_csv)
