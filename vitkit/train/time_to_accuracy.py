"""Time-to-accuracy: test accuracy against training wall-clock time, vitkit against timm.

:class:`TestAccuracyTimer` is a Lightning callback that evaluates the model being trained on the
test split every ``every_n_steps`` optimiser steps and records ``(seconds, step, accuracy)``. The
clock runs from the start of fit and stops during its own evaluations, so the curve shows what the
training run itself costs (its validation passes included, as in any real run).
:func:`time_to_reach` and :func:`summarise` turn two such curves into the benchmark's table.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from ..evaluation import evaluate_model


@dataclass
class AccuracyPoint:
    """One evaluation: training seconds so far, optimiser step, top-1 test accuracy (percent)."""

    seconds: float
    step: int
    accuracy: float


class TestAccuracyTimer(Callback):
    """Evaluate ``inference_model`` on the datamodule's test split every ``every_n_steps`` steps
    (and at the end of training), excluding the evaluation time from the recorded clock.

    Attributes:
        points: the evaluations so far, in order.
    """

    __test__ = False  # not a pytest test class, despite its name

    def __init__(self, every_n_steps: int) -> None:
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}.")
        self.every_n_steps = every_n_steps
        self.points: list[AccuracyPoint] = []
        self._start = 0.0
        self._paused = 0.0

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start, self._paused = time.perf_counter(), 0.0

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._record(trainer, pl_module)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.points or self.points[-1].step != trainer.global_step:
            self._record(trainer, pl_module)

    def _record(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        paused_at = time.perf_counter()
        seconds = paused_at - self._start - self._paused
        with torch.no_grad(), trainer.precision_plugin.forward_context():  # the run's own autocast
            accuracy = evaluate_model(
                pl_module.inference_model, trainer.datamodule.loader(trainer.datamodule.bundle.test, 2 * trainer.datamodule.batch_size, train=False),
                tta=pl_module.task.tta, fill=pl_module.task.fill
            ).top1
        self.points.append(AccuracyPoint(round(seconds, 2), trainer.global_step, round(accuracy, 3)))
        self._paused += time.perf_counter() - paused_at


def time_to_reach(points: list[AccuracyPoint], target: float) -> float | None:
    """Seconds of the first evaluation at or above ``target`` percent; ``None`` if never."""
    return next((point.seconds for point in points if point.accuracy >= target), None)


def accuracy_at(points: list[AccuracyPoint], seconds: float) -> float | None:
    """Accuracy of the last evaluation made within ``seconds``; ``None`` if none was."""
    within = [point.accuracy for point in points if point.seconds <= seconds]
    return within[-1] if within else None


def summarise(
    curves: dict[str, list[AccuracyPoint]], targets: tuple[float, ...], budget_s: float
) -> list[dict[str, Any]]:
    """One row per curve: seconds to each target accuracy and the accuracy at ``budget_s``."""
    rows = []
    for name, points in curves.items():
        row: dict[str, Any] = {"model": name}
        for target in targets:
            row[f"time_to_{target:g}_s"] = time_to_reach(points, target)
        row["acc_at_budget"] = accuracy_at(points, budget_s)
        row["final_acc"] = points[-1].accuracy if points else None
        row["train_s"] = points[-1].seconds if points else None
        rows.append(row)
    return rows


def plot_time_to_accuracy(
    curves: dict[str, list[AccuracyPoint]], targets: tuple[float, ...], path: str | Path, title: str
) -> Path:
    """Test accuracy against training minutes, one line per curve, target accuracies dashed."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4.5))
    axis = fig.add_subplot()
    for name, points in curves.items():
        axis.plot([p.seconds / 60 for p in points], [p.accuracy for p in points], marker="o", markersize=3, label=name)
    for target in targets:
        axis.axhline(target, color="grey", linestyle="--", linewidth=0.8)
    low = min((p.accuracy for points in curves.values() for p in points), default=0.0)
    axis.set_ylim(max(low - 2, min(targets) - 10), 100)
    axis.set_xlabel("training wall time (minutes)")
    axis.set_ylabel("test accuracy (%)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
