"""Accuracy and interleaved latency measurements used by the pruning tools."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from ..bench import interleaved_times
from ..data import DataConfig, DataInfo, build_datasets
from ..models import VisionTransformer

Batch = tuple[torch.Tensor, torch.Tensor]


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


def batches(loader: Iterable[Batch], max_batches: int | None, desc: str, progress: bool) -> Iterator[Batch]:
    """``(images, labels)`` batches of ``loader``, at most ``max_batches``, with a tqdm bar if asked."""
    total = len(loader) if hasattr(loader, "__len__") else None
    if max_batches is not None:
        total = max_batches if total is None else min(total, max_batches)
    for index, batch in enumerate(tqdm(loader, desc=desc, total=total, disable=not progress, leave=False)):
        if max_batches is not None and index >= max_batches:
            return
        yield batch


@dataclass
class EvalSplits:
    """Loaders of the three splits, all through the eval transform (no augmentation), fixed order.

    The pruning protocol: heads are scored on ``train``, a pruning depth is chosen on ``val``,
    and accuracy is reported on ``test``, so no image both chooses and judges. ``test`` is
    ``None`` when the dataset has no held-out test split (an image folder without ``test/``,
    whose ``val/`` would otherwise serve twice).
    """

    train: DataLoader
    val: DataLoader
    test: DataLoader | None
    info: DataInfo


def eval_loaders(config: DataConfig, batch_size: int = 256) -> EvalSplits:
    """:class:`EvalSplits` of ``config``'s dataset (its augmentation switched off)."""
    bundle = build_datasets(dataclasses.replace(config, augment=dataclasses.replace(config.augment, enabled=False)))

    def loader(split: Dataset) -> DataLoader:
        return DataLoader(split, batch_size=batch_size, num_workers=config.num_workers)

    test = None if bundle.test is bundle.val else loader(bundle.test)
    return EvalSplits(train=loader(bundle.train), val=loader(bundle.val), test=test, info=bundle.info)


@torch.no_grad()
def evaluate_accuracy(
    model: VisionTransformer,
    loader: Iterable[Batch],
    *,
    gates: Sequence[torch.Tensor] | None = None,
    max_batches: int | None = None,
    progress: bool = False,
) -> float:
    """Top-1 accuracy in percent of ``model`` (eval mode, its own device) over ``loader``.

    Args:
        model: classifier mapping ``[B, C, H, W]`` to ``[B, num_classes]``.
        loader: yields ``(images [B, C, H, W], labels [B])``.
        gates: optional per-block ``[H_l]`` head gates.
        max_batches: stop after this many batches.
        progress: show a tqdm bar.
    """
    device = model_device(model)
    head_mask = None if gates is None else [g.to(device) for g in gates]
    correct = total = 0
    with eval_mode(model):
        for images, labels in batches(loader, max_batches, "accuracy", progress):
            images = images.to(device)
            # Models without head gates (timm's, during training) are called without the argument.
            logits = model(images) if head_mask is None else model(images, head_mask=head_mask)
            correct += int((logits.argmax(-1).cpu() == labels).sum())
            total += len(labels)
    if total == 0:
        raise ValueError("the evaluation loader yielded no examples; check the dataset split and max_batches.")
    return 100.0 * correct / total


@torch.inference_mode()
def time_forward(models: Sequence[nn.Module], batch: torch.Tensor, *, rounds: int = 20, warmup: int = 3) -> list[float]:
    """Median seconds of one forward pass of each model on ``batch``, timed side by side.

    Rounds alternate the models (:func:`vitkit.bench.interleaved_times`), so drifts in machine
    load hit all models alike; the median over rounds discards outliers.

    Args:
        models: modules on the same device as ``batch``, put in eval mode.
        batch: input ``[B, ...]``.
        rounds: timed rounds.
        warmup: untimed rounds first (allocator, kernel selection).
    """
    for model in models:
        model.eval()
    synchronize = torch.cuda.synchronize if batch.is_cuda else (lambda: None)

    def forward(model: nn.Module) -> Callable[[], None]:
        def call() -> None:
            model(batch)
            synchronize()

        return call

    times = interleaved_times({str(i): forward(m) for i, m in enumerate(models)}, repeats=rounds, warmup=warmup)
    return [statistics.median(times[str(i)]) for i in range(len(models))]
