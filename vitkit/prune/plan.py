"""What a ``vitkit prune`` run will do and how long it will take, said before it starts.

Every iterative order re-scores the remaining heads and evaluates the pruned model at each step;
on a real ViT that is hours (the importance order alone took 8 min on 42 images of a ViT-S,
and four orders were planned). :func:`estimate` counts the passes over the data that the
plan makes and prices them with one training and one evaluation batch timed on this machine, so
the user can choose fewer orders or the one-shot path before waiting.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..evaluation import Batch, model_device
from ..models import VisionTransformer

#: The orders ``vitkit prune`` can trace, by their ``--orders`` names.
ORDERS = ("importance", "importance-l2", "random", "entropy")
#: Forward passes each measured step spends on timing the pruned model (``time_forward``: 10 rounds, 2 warm-up).
TIMING_FORWARDS = 12


def iterative_steps(total_heads: int, step_fraction: float, min_heads: int = 0) -> int:
    """Steps :func:`~vitkit.prune.iterative_pruning` takes from ``total_heads`` down to ``min_heads``."""
    steps, heads = 0, total_heads
    while heads > min_heads:
        heads -= min(max(1, round(step_fraction * heads)), heads - min_heads)
        steps += 1
    return steps


@dataclass(frozen=True)
class BatchCost:
    """Seconds of one forward and backward pass over a training batch (importance scoring) and of
    one forward pass over an evaluation batch, with each loader's batch count (capped by ``--max-batches``)."""

    train_s: float
    eval_s: float
    train_batches: int
    eval_batches: int


def measure_batch_cost(
    model: VisionTransformer, train: Iterable[Batch], evaluation: Iterable[Batch], max_batches: int | None
) -> BatchCost:
    """Time one training-batch backward pass and one evaluation-batch forward pass of ``model``
    (each after a warm-up pass), and count the batches each pass of the run will read."""
    device = model_device(model)
    images, labels = next(iter(train))
    images, labels = images.to(device), labels.to(device)
    train_s = min(_timed(lambda: F.cross_entropy(model(images), labels).backward()) for _ in range(2))
    model.zero_grad(set_to_none=True)
    val_images = next(iter(evaluation))[0].to(device)
    with torch.no_grad():
        eval_s = min(_timed(lambda: model(val_images)) for _ in range(2))

    def batches(loader: Iterable[Batch]) -> int:
        count = len(loader) if hasattr(loader, "__len__") else 1
        return min(count, max_batches) if max_batches else count

    return BatchCost(train_s, eval_s, batches(train), batches(evaluation))


def _timed(work: object) -> float:
    started = time.perf_counter()
    work()  # type: ignore[operator]
    return time.perf_counter() - started


def estimate(steps: dict[str, int], cost: BatchCost) -> float:
    """Seconds the planned ``steps`` (per order: ``"importance"``, ``"importance-l2"``,
    ``"random"``, ``"entropy"`` or ``"one-shot"``, each with its scoring steps) will take: each
    step scores (a backward pass over the training batches for importance, a forward pass for
    entropy, nothing for random) and evaluates the pruned model; the importance order and the
    one-shot step also time it; every order first measures the unpruned model."""
    seconds = 0.0
    for order, count in steps.items():
        scoring = {"random": 0.0, "entropy": cost.train_batches * cost.eval_s}.get(order, cost.train_batches * cost.train_s)
        evaluation = cost.eval_batches * cost.eval_s
        timing = TIMING_FORWARDS * cost.eval_s if order in ("importance", "one-shot") else 0.0
        seconds += evaluation + timing + count * (scoring + evaluation + timing)
    return seconds


def format_duration(seconds: float) -> str:
    """``2 h 32 min``, ``2 min 10 s`` or ``40 s``."""
    seconds = round(seconds)
    hours, minutes, secs = seconds // 3600, seconds // 60 % 60, seconds % 60
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min {secs} s" if minutes else f"{secs} s"
