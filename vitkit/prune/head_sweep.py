"""Head-count sweep at fixed width (Vaswani et al. 2017, arXiv 1706.03762, Table 3 (A)), summarised.

At fixed ``d_model`` more heads mean narrower heads (``head_dim = d_model / h``). Each run is
summarised by its test accuracy, its training-loss oscillation (:func:`loss_oscillation`), its
wall time and the accuracy change of the quick redundancy test (half of every layer's heads
pruned); :func:`summarise` gives mean ± std over seeds per head count.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Per-step training loss column of a run's metrics.csv (Lightning CSVLogger, ``self.log("train/loss")``).
TRAIN_LOSS_COLUMN = "train/loss"


@dataclass
class SweepRun:
    """One trained model of the sweep.

    Attributes:
        heads: heads per layer.
        head_dim: width of each head.
        seed: training seed.
        accuracy: test accuracy (percent).
        oscillation: detrended std of the per-step training loss over the last epochs.
        wall_time_s: training wall time.
        redundancy_change: accuracy change (points) when half of every layer's heads are pruned.
        run_dir: the run directory.
    """

    heads: int
    head_dim: int
    seed: int
    accuracy: float
    oscillation: float
    wall_time_s: float
    redundancy_change: float
    run_dir: str


def loss_oscillation(metrics_csv: str | os.PathLike, last_epochs: int = 3) -> float:
    """Std of the per-step training loss over the last ``last_epochs`` epochs, after removing a
    least-squares line through those steps.

    Detrending keeps the loss's slow decrease (the tail of the cosine schedule) from counting as
    oscillation, so what remains is the step-to-step wobble. Log every step
    (``trainer.log_every=1``) for a full series; sparser logging samples it.

    Raises:
        ValueError: fewer than 3 logged training losses in that window.
    """
    with open(metrics_csv, newline="") as handle:
        rows = [row for row in csv.DictReader(handle) if row.get(TRAIN_LOSS_COLUMN)]
    if not rows:
        raise ValueError(f"{metrics_csv} has no {TRAIN_LOSS_COLUMN!r} values; was the run logged with the CSV logger?")
    first_epoch = max(int(row["epoch"]) for row in rows) - last_epochs + 1
    window = [row for row in rows if int(row["epoch"]) >= first_epoch]
    if len(window) < 3:
        raise ValueError(
            f"only {len(window)} training-loss values in the last {last_epochs} epoch(s) of {metrics_csv}; "
            "log every step (trainer.log_every=1) or widen the window."
        )
    steps = np.array([float(row["step"]) for row in window])
    loss = np.array([float(row[TRAIN_LOSS_COLUMN]) for row in window])
    residual = loss - np.polyval(np.polyfit(steps, loss, 1), steps)
    return float(residual.std(ddof=1))


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std (0 for a single value)."""
    return float(np.mean(values)), float(np.std(values, ddof=1)) if len(values) > 1 else 0.0


def _mean_std(values: Sequence[float], digits: int) -> str:
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def summarise(runs: Sequence[SweepRun]) -> list[dict[str, Any]]:
    """One row per head count: mean ± std (over seeds, sample std) of every measurement."""
    rows = []
    for heads in sorted({run.heads for run in runs}):
        group = [run for run in runs if run.heads == heads]
        # One head per layer cannot be halved: the redundancy test prunes nothing there.
        halved = _mean_std([r.redundancy_change for r in group], 2) if heads > 1 else "n/a"
        rows.append(
            {
                "heads": heads,
                "head_dim": group[0].head_dim,
                "seeds": len(group),
                "test acc (%)": _mean_std([r.accuracy for r in group], 2),
                "loss oscillation": _mean_std([r.oscillation for r in group], 4),
                "wall time (s)": _mean_std([r.wall_time_s for r in group], 1),
                "half heads pruned (Δ pt)": halved,
            }
        )
    return rows
