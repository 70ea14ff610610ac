"""The one evaluation loop: loss and top-1/top-5 accuracy of a classifier over a data loader.

It serves ``vitkit.train.evaluate`` (and ``tools/evaluate.py``), the pruning tools and the
time-to-accuracy timer; the Lightning validation/test step scores its batches with the same
:func:`predict` and :func:`batch_metrics`. The loop runs where the model is (its first parameter's device) and never
moves it; a model loaded from a file is placed with :func:`default_device`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch
import torch.nn.functional as F
from timm.utils import accuracy
from torch import nn
from tqdm import tqdm

from .errors import VitkitError

Batch = tuple[torch.Tensor, torch.Tensor]

#: What :func:`evaluate_model` scores: a module, or a callable mapping ``[B, C, H, W]`` images to
#: ``[B, K]`` logits on the CPU (an exported graph, :class:`vitkit.export.OnnxClassifier`).
Classifier = nn.Module | Callable[[torch.Tensor], torch.Tensor]


class UnknownTTAError(VitkitError, ValueError):
    """A test-time augmentation vitkit does not know: recorded by a model file, or passed as ``tta``."""


#: Test-time augmentation: ``'none'`` scores each image once; ``'hflip'`` averages the class
#: probabilities of the image and its left-right mirror; ``'hflip_shift'`` adds both moved by one
#: pixel up, down, left and right (10 views), the uncovered border black, as the zero padding of
#: ``data.augment.crop='pad'`` leaves it in training.
TestTimeAugmentation = Literal["none", "hflip", "hflip_shift"]

#: ``(rows down, columns right)`` of the four moved copies ``'hflip_shift'`` scores.
SHIFTS: tuple[tuple[int, int], ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))


def default_device() -> torch.device:
    """The first CUDA GPU when there is one, else the CPU (Lightning's ``accelerator="auto"``
    without Apple's MPS)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def model_device(model: nn.Module) -> torch.device:
    """Device of ``model``'s first parameter."""
    return next(model.parameters()).device


@contextmanager
def eval_mode(model: nn.Module, *, frozen: bool = False) -> Iterator[None]:
    """Eval mode (and, with ``frozen``, no parameter gradients) inside the block; restored after."""
    flags = [p.requires_grad for p in model.parameters()]
    was_training = model.training
    model.eval()
    if frozen:
        model.requires_grad_(False)
    try:
        yield
    finally:
        for parameter, flag in zip(model.parameters(), flags):
            parameter.requires_grad_(flag)
        model.train(was_training)


#: The precision an inference forward runs in: float32, or bfloat16 autocast (float32 weights,
#: the matrix products in bfloat16; 2-3x faster on CPUs with AVX512-BF16 or AMX).
Precision = Literal["fp32", "bf16"]


@contextmanager
def inference_context(model: nn.Module, precision: Precision = "fp32") -> Iterator[None]:
    """What every inference forward of vitkit runs under (``predict``, ``evaluate``, the
    benchmarks): ``model`` in eval mode (restored after), ``torch.inference_mode`` and, for
    ``"bf16"``, bfloat16 autocast on the model's device.

    Raises:
        ValueError: an unknown ``precision``.
    """
    if precision not in get_args(Precision):
        raise ValueError(f"precision must be one of {get_args(Precision)}, got {precision!r}.")
    autocast = torch.autocast(model_device(model).type, dtype=torch.bfloat16, enabled=precision == "bf16")
    with eval_mode(model), torch.inference_mode(), autocast:
        yield


def batches(loader: Iterable[Batch], max_batches: int | None, desc: str, progress: bool) -> Iterator[Batch]:
    """``(images, labels)`` batches of ``loader``, at most ``max_batches``, with a tqdm bar if asked."""
    total = len(loader) if hasattr(loader, "__len__") else None
    if max_batches is not None:
        total = max_batches if total is None else min(total, max_batches)
    for index, batch in enumerate(tqdm(loader, desc=desc, total=total, disable=not progress, leave=False)):
        if max_batches is not None and index >= max_batches:
            return
        yield batch


def check_tta(value: Any, where: str, fix: str) -> TestTimeAugmentation:
    """``value`` if it is a :data:`TestTimeAugmentation`.

    Raises:
        UnknownTTAError: it is not; the message says ``where`` it came from and ends with ``fix``.
    """
    if value not in get_args(TestTimeAugmentation):
        raise UnknownTTAError(
            f"{where}: test-time augmentation {value!r} is not one vitkit knows "
            f"(expected one of {list(get_args(TestTimeAugmentation))}); {fix}."
        )
    return value


def recorded_tta(extra: dict[str, Any], source: str) -> TestTimeAugmentation:
    """The test-time augmentation a model file's metadata records (``'none'`` when it records none).

    Raises:
        UnknownTTAError: the metadata names another one (a hand-edited or foreign file).
    """
    return check_tta(extra.get("tta", "none"), f"{source}'s metadata", "choose one with --tta (tta=)")


def black_level(mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """``[C]`` value of a black (all-zero) pixel after ``Normalize(mean, std)``: ``-mean / std``."""
    return -torch.as_tensor(mean, dtype=torch.float32) / torch.as_tensor(std, dtype=torch.float32)


def shift_images(images: torch.Tensor, rows: int, cols: int, fill: torch.Tensor) -> torch.Tensor:
    """``[B, C, H, W]`` images moved ``rows`` down and ``cols`` right (negative: up, left), the
    uncovered border set to the ``[C]`` values ``fill``: the window that training's pad-and-crop cuts
    at that offset. The pixels kept are copied exactly."""
    height, width = images.shape[-2:]
    if abs(rows) >= height or abs(cols) >= width:
        raise ValueError(f"cannot move {height}x{width} images by ({rows}, {cols}) pixels.")
    moved = fill.to(images).view(1, -1, 1, 1).expand_as(images).clone()
    moved[..., max(rows, 0) : height + min(rows, 0), max(cols, 0) : width + min(cols, 0)] = (
        images[..., max(-rows, 0) : height + min(-rows, 0), max(-cols, 0) : width + min(-cols, 0)]
    )
    return moved


def predict_views(
    model: Classifier,
    images: torch.Tensor,
    tta: TestTimeAugmentation = "none",
    fill: torch.Tensor | None = None,
    **kwargs: Any,
) -> list[torch.Tensor]:
    """``[B, K]`` logits of ``model`` for each view of ``[B, C, H, W]`` images that ``tta`` scores:
    the images themselves first, then (``'hflip'``) their left-right mirror, then
    (``'hflip_shift'``) each of :data:`SHIFTS` and its mirror, the border filled with the ``[C]``
    values ``fill`` (:func:`black_level` of the images' normalisation). ``kwargs`` go to the model.

    Raises:
        ValueError: ``'hflip_shift'`` without ``fill``.
    """
    check_tta(tta, "predict_views(tta=)", "pass one of them")
    views = [model(images, **kwargs)]
    if tta == "none":
        return views
    views.append(model(images.flip(-1), **kwargs))
    if tta == "hflip_shift":
        if fill is None:
            raise ValueError("tta='hflip_shift' needs fill=, the normalised value of a black pixel (black_level).")
        for rows, cols in SHIFTS:
            moved = shift_images(images, rows, cols, fill)
            views += [model(moved, **kwargs), model(moved.flip(-1), **kwargs)]
    return views


def average_views(views: Sequence[torch.Tensor]) -> torch.Tensor:
    """One view's ``[B, K]`` logits as they are; several views' as ``log(mean_v softmax(views[v]))``
    in float32: log-probabilities whose softmax is the mean of the views' class probabilities, so
    that cross-entropy and top-k read them as logits."""
    if len(views) == 1:
        return views[0]
    log_probs = torch.stack([view.float().log_softmax(-1) for view in views])
    return torch.logsumexp(log_probs, dim=0) - math.log(len(views))


def predict(
    model: Classifier,
    images: torch.Tensor,
    tta: TestTimeAugmentation = "none",
    fill: torch.Tensor | None = None,
    **kwargs: Any,
) -> torch.Tensor:
    """``[B, K]`` logits of ``model`` for ``[B, C, H, W]`` images, its views under ``tta`` averaged
    (:func:`predict_views`, :func:`average_views`)."""
    return average_views(predict_views(model, images, tta, fill, **kwargs))


def batch_metrics(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mean cross-entropy and top-1 / top-5 accuracy in percent (timm's ``accuracy``; top-5 is
    top-K with K < 5 classes) of ``[B, K]`` logits against ``[B]`` labels, as 0-d tensors."""
    acc1, acc5 = accuracy(logits, labels, topk=(1, 5))
    return F.cross_entropy(logits.float(), labels), acc1, acc5


@dataclass(frozen=True)
class Evaluation:
    """What one pass over a loader measured.

    Attributes:
        loss: mean cross-entropy per image.
        top1, top5: accuracy in percent.
        labels: the true classes ``[N]``.
        predictions: the top-1 predicted classes ``[N]``.
        forward_seconds: time spent in the model's forward passes (every test-time view), the
            data loading and the scoring left out: what token merging or bf16 speeds up.
    """

    loss: float
    top1: float
    top5: float
    labels: torch.Tensor
    predictions: torch.Tensor
    forward_seconds: float = 0.0

    @property
    def num_images(self) -> int:
        return len(self.labels)

    @property
    def images_per_second(self) -> float:
        """Images through the model per second of :attr:`forward_seconds` (``inf`` when not timed)."""
        return self.num_images / self.forward_seconds if self.forward_seconds > 0 else math.inf



def evaluate_model(
    model: Classifier,
    loader: Iterable[Batch],
    *,
    head_gates: Sequence[torch.Tensor] | None = None,
    max_batches: int | None = None,
    progress: bool = False,
    tta: TestTimeAugmentation = "none",
    fill: torch.Tensor | None = None,
    precision: Precision = "fp32",
) -> Evaluation:
    """Score ``model`` (in eval mode, on its own device) over ``loader``.

    Args:
        model: classifier mapping ``[B, C, H, W]`` to ``[B, K]`` logits: a module (run on its own
            device), or a callable run on the CPU as it is (:data:`Classifier`).
        loader: yields ``(images [B, C, H, W], labels [B])``.
        head_gates: optional per-block ``[H_l]`` head gates (a vitkit model's ``head_gates``).
        max_batches: stop after this many batches.
        progress: show a tqdm bar.
        tta: test-time augmentation (:func:`predict`).
        fill: ``[C]`` normalised value of a black pixel, for ``tta='hflip_shift'`` (:func:`black_level`).
        precision: ``"bf16"``: the forward under bfloat16 autocast (:func:`inference_context`);
            the loss and accuracies are computed in float32 either way.

    Raises:
        ValueError: the loader yielded no images.
    """
    is_module = isinstance(model, nn.Module)
    device = model_device(model) if is_module else torch.device("cpu")
    gates = None if head_gates is None else [g.to(device) for g in head_gates]
    loss, hits1, hits5, seconds = 0.0, 0, 0, 0.0
    labels, predictions = [], []
    with inference_context(model, precision) if is_module else nullcontext(), torch.inference_mode():
        for images, targets in batches(loader, max_batches, "evaluate", progress):
            targets = torch.as_tensor(targets).to(device)
            images = images.to(device)
            start = time.perf_counter()
            # Models without head gates (timm's, during training) are called without the argument.
            logits = predict(model, images, tta, fill, **({} if gates is None else {"head_gates": gates})).float()
            if device.type == "cuda":  # the forward is queued: wait for it before the clock stops
                torch.cuda.synchronize(device)
            seconds += time.perf_counter() - start
            batch_loss, acc1, acc5 = batch_metrics(logits, targets)
            size = len(targets)
            loss += float(batch_loss) * size
            hits1 += round(float(acc1) * size / 100)  # percent back to a count of correct images
            hits5 += round(float(acc5) * size / 100)
            labels.append(targets.cpu())
            predictions.append(logits.argmax(dim=-1).cpu())
    total = sum(len(batch) for batch in labels)
    if total == 0:
        raise ValueError("the evaluation loader yielded no examples; check the dataset split and max_batches.")
    return Evaluation(
        loss=loss / total,
        top1=100.0 * hits1 / total,
        top5=100.0 * hits5 / total,
        labels=torch.cat(labels),
        predictions=torch.cat(predictions),
        forward_seconds=seconds,
    )
