"""Accuracy and interleaved latency measurements used by the pruning tools."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ..data import DataConfig, DataInfo, build_datasets
from ..evaluation import Batch, evaluate_model
from ..models import VisionTransformer
from ..timing import interleaved_times


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


def evaluate_accuracy(
    model: VisionTransformer,
    loader: Iterable[Batch],
    *,
    gates: Sequence[torch.Tensor] | None = None,
    max_batches: int | None = None,
    progress: bool = False,
) -> float:
    """Top-1 accuracy in percent of ``model`` over ``loader``: :func:`vitkit.evaluation.evaluate_model`
    with the head ``gates`` (per block ``[H_l]``) as its ``head_gates``."""
    return evaluate_model(model, loader, head_gates=gates, max_batches=max_batches, progress=progress).top1


@torch.inference_mode()
def time_forward(models: Sequence[nn.Module], batch: torch.Tensor, *, rounds: int = 20, warmup: int = 3) -> list[float]:
    """Median seconds of one forward pass of each model on ``batch``, timed side by side.

    Rounds alternate the models (:func:`vitkit.timing.interleaved_times`), so drifts in machine
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
