"""Classifying images with a trained model: :func:`predict` applies the model's own preprocessing
(size, channels, crop, mean/std) and returns the top classes with their probabilities.

    >>> vitkit.predict("runs/quickstart/latest/model.safetensors", ["digit.png"], top_k=3)
    [Prediction(indices=(7, 1, 9), classes=('7', '1', '9'), probabilities=(0.97, 0.01, 0.01))]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image

from .data import DataInfo, build_eval_transform, load_image
from .data.images import convert_channels
from .errors import VitkitError
from .evaluation import Precision, TestTimeAugmentation, black_level, inference_context, recorded_tta
from .evaluation import predict as predict_logits
from .export import OnnxClassifier
from .io import load_model_and_extra
from .models import VisionTransformer

#: What :func:`predict` reads as one image.
ImageInput = Image.Image | str | os.PathLike | torch.Tensor


class PredictionError(VitkitError, ValueError):
    """A model without a classifier or without preprocessing metadata, or an input that is not an image."""


class Prediction(NamedTuple):
    """The ``top_k`` most probable classes of one image, most probable first."""

    indices: tuple[int, ...]
    classes: tuple[str, ...]
    probabilities: tuple[float, ...]


def load_predictor(
    path: str | os.PathLike, tta: TestTimeAugmentation | None = None
) -> tuple[VisionTransformer, DataInfo, TestTimeAugmentation]:
    """The model of a vitkit ``.safetensors`` model file or training ``.ckpt``, in eval mode, and
    its :func:`prediction_settings`."""
    model, extra = load_model_and_extra(path)
    return (model.eval(), *prediction_settings(model, extra, str(path), tta))


def prediction_settings(
    model: VisionTransformer | OnnxClassifier, extra: dict[str, Any], source: str, tta: TestTimeAugmentation | None = None
) -> tuple[DataInfo, TestTimeAugmentation]:
    """The preprocessing that a model's metadata ``extra`` records, and ``tta``, or (``None``)
    the test-time augmentation it records (:func:`~vitkit.evaluation.recorded_tta`); ``source``
    names the model in messages.

    Raises:
        PredictionError: the model has no classifier.
        vitkit.data.MetadataError: ``extra`` records no preprocessing (a file written by
            ``save_model`` without it, of a model that carries none).
        vitkit.evaluation.UnknownTTAError: with ``tta=None``, ``extra`` records an unknown one.
    """
    refuse_headless(model, source)
    return DataInfo.from_extra(extra), recorded_tta(extra, source) if tta is None else tta


def refuse_headless(model: VisionTransformer | OnnxClassifier, source: str) -> None:
    """Raise :class:`PredictionError` for a model without a classifier (``num_classes=0``; an
    exported one's graph outputs ``features``)."""
    num_classes = model.num_classes if isinstance(model, OnnxClassifier) else model.config.num_classes
    if num_classes == 0:
        raise PredictionError(
            f"{source} has no classifier (num_classes=0): it gives features, not classes; for its pooled "
            "[B, D] features call the model itself, or fine-tune a classifier on it (docs/finetune.md)."
        )


def preprocessing_of(model: VisionTransformer) -> DataInfo:
    """The preprocessing a model carries: the ``pretrained_cfg`` that :func:`vitkit.from_timm`
    records from a timm model."""
    cfg = getattr(model, "pretrained_cfg", None)
    if not cfg:
        raise PredictionError(
            "this model carries no preprocessing metadata: pass predict() the model file's path, or "
            "info=DataInfo(...) with the size, channels, crop and mean/std it was trained with."
        )
    return DataInfo.from_pretrained_cfg(cfg, model.config.num_classes)


def tensor_to_image(image: torch.Tensor) -> Image.Image:
    """A pixel tensor ``[C, H, W]`` (C = 1, 3 or 4), ``uint8`` in 0..255 or float in ``[0, 1]``
    (as ``torchvision.io.read_image`` and ``ToTensor`` give them), as a PIL image."""
    if image.ndim != 3 or image.shape[0] not in (1, 3, 4):
        raise PredictionError(f"an image tensor must be [C, H, W] with 1, 3 or 4 channels, got {list(image.shape)}.")
    pixels = image.detach().cpu()
    if pixels.is_floating_point():
        if pixels.min() < 0 or pixels.max() > 1:
            raise PredictionError(
                f"a float image tensor must hold pixels in [0, 1], got {float(pixels.min()):.3g}.."
                f"{float(pixels.max()):.3g}: an already normalised batch goes to the model directly, model(x)."
            )
        pixels = (pixels * 255).round()
    array = pixels.to(torch.uint8).permute(1, 2, 0).numpy()
    return Image.fromarray(array[..., 0] if array.shape[2] == 1 else np.ascontiguousarray(array))


def as_image(item: ImageInput) -> Image.Image:
    """One input of :func:`predict` as a PIL image (a path is read with :func:`vitkit.data.load_image`)."""
    if isinstance(item, Image.Image):
        return item
    if isinstance(item, torch.Tensor):
        return tensor_to_image(item)
    if isinstance(item, (str, os.PathLike)):
        return load_image(item)
    raise PredictionError(f"expected a PIL image, an image path or a pixel tensor, got {type(item).__name__}.")


def preprocess(images: Sequence[Image.Image], info: DataInfo) -> torch.Tensor:
    """``images`` converted to the model's channels and run through its eval transform:
    ``[B, C, H, W]`` float32."""
    transform = build_eval_transform(info)
    return torch.stack([transform(convert_channels(image, info.in_chans)) for image in images])


@torch.inference_mode()
def predict(
    model_or_path: VisionTransformer | str | os.PathLike,
    images: ImageInput | Sequence[ImageInput],
    top_k: int = 5,
    info: DataInfo | None = None,
    batch_size: int = 64,
    tta: TestTimeAugmentation | None = None,
    precision: Precision = "fp32",
) -> list[Prediction]:
    """The ``top_k`` classes and probabilities (softmax of the logits) of each image.

    Args:
        model_or_path: a model file (``.safetensors`` or training ``.ckpt``, preprocessing from its
            metadata), an exported ``.onnx`` file (run by onnxruntime, preprocessing from its
            metadata; :class:`~vitkit.export.OnnxClassifier`) or a model (preprocessing from ``info``, else from the ``pretrained_cfg``
            that :func:`vitkit.from_timm` records); a model runs in eval mode and is left in the mode it was in.
        images: one image or a sequence of them: PIL images, file paths, or pixel tensors
            ``[C, H, W]`` (``uint8``, or float in ``[0, 1]``); a ``[B, C, H, W]`` tensor is ``B``
            images. Each is converted to the model's channels, resized and cropped as in
            evaluation, and normalised with the model's mean/std.
        top_k: classes returned per image (all of them when the model has fewer).
        info: the preprocessing, overriding the model's own.
        batch_size: images per forward pass.
        tta: test-time augmentation (:func:`vitkit.evaluation.predict`: ``'hflip'`` averages the
            probabilities of each image and its mirror); ``None``: the one a model file records,
            ``'none'`` for a model.
        precision: ``"bf16"``: a vitkit model's forward under bfloat16 autocast
            (:func:`vitkit.evaluation.inference_context`); an ``.onnx`` file runs as exported.

    Returns:
        One :class:`Prediction` per image, in order.

    Raises:
        PredictionError: the model has no classifier, no preprocessing is known, or an input is not an image.
        vitkit.data.ImageReadError: a path cannot be read as an image.
    """
    if top_k < 1 or batch_size < 1:
        raise PredictionError(f"top_k and batch_size must be at least 1, got {top_k} and {batch_size}.")
    if isinstance(model_or_path, (str, os.PathLike)) and Path(model_or_path).suffix == ".onnx":
        model_or_path = OnnxClassifier(model_or_path)
    if isinstance(model_or_path, OnnxClassifier):  # onnxruntime, with the preprocessing its metadata records
        runner = model_or_path
        saved, tta = prediction_settings(runner, runner.extra, str(runner.path), tta)
        return _predict_batches(runner, _as_list(images), info or saved, tta, top_k, batch_size)
    if isinstance(model_or_path, VisionTransformer):
        refuse_headless(model_or_path, "the model")
        model, info = model_or_path, info or preprocessing_of(model_or_path)
        tta = tta or "none"
    else:
        model, saved, tta = load_predictor(model_or_path, tta)
        info = info or saved
    device = next(model.parameters()).device
    with inference_context(model, precision):
        return _predict_batches(lambda batch: model(batch.to(device)), _as_list(images), info, tta, top_k, batch_size)


def _as_list(images: ImageInput | Sequence[ImageInput]) -> Sequence[ImageInput]:
    if isinstance(images, torch.Tensor) and images.ndim == 4:
        return list(images)
    if isinstance(images, (Image.Image, str, os.PathLike, torch.Tensor)):
        return [images]
    return images


def _predict_batches(
    run: Callable[[torch.Tensor], torch.Tensor], images: Sequence[ImageInput], info: DataInfo,
    tta: TestTimeAugmentation, top_k: int, batch_size: int,
) -> list[Prediction]:
    """:func:`predict`'s loop: preprocess each batch, ``run`` it (``[B, C, H, W]`` to logits, every
    view of ``tta``) and take the ``top_k`` softmax probabilities."""
    predictions: list[Prediction] = []
    fill = black_level(info.mean, info.std)  # the border of 'hflip_shift''s moved views
    for first in range(0, len(images), batch_size):
        batch = preprocess([as_image(item) for item in images[first : first + batch_size]], info)
        probabilities = predict_logits(run, batch, tta, fill).float().softmax(dim=-1).cpu()
        values, indices = probabilities.topk(min(top_k, probabilities.shape[-1]), dim=-1)
        predictions += [
            Prediction(tuple(row.tolist()), tuple(info.class_names[i] for i in row.tolist()), tuple(p.tolist()))
            for row, p in zip(indices, values)
        ]
    return predictions
