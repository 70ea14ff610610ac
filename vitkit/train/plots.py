"""Figures of a run: loss/accuracy curves from ``metrics.csv``, a confusion matrix and MAE's reconstructions.

Drawn on :class:`matplotlib.figure.Figure` objects, never through pyplot, so the user's backend
and open figures are left alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure


def plot_curves(rows: Sequence[dict[str, str]], path: str | Path) -> Path:
    """Loss (train per logged step, val per epoch) and accuracy (val top-1/top-5, train top-1
    when logged) against the optimiser step, from ``metrics.csv`` rows."""
    fig = Figure(figsize=(11, 4))
    loss_ax, acc_ax = fig.subplots(1, 2)
    for axis, keys, title in (
        (loss_ax, ("train/loss", "val/loss"), "loss"),
        (acc_ax, ("train/acc1", "val/acc1", "val/acc5"), "accuracy (%)"),
    ):
        for key in keys:
            points = [(float(row["step"]), float(row[key])) for row in rows if row.get(key) not in (None, "")]
            if points:
                steps, values = zip(*points)
                axis.plot(steps, values, marker="o" if key.startswith("val") else None, markersize=3, label=key)
        axis.set_xlabel("step")
        axis.set_title(title)
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_confusion_matrix(matrix: np.ndarray, class_names: Sequence[str], path: str | Path) -> Path:
    """``[K, K]`` counts (rows: true class, columns: predicted) as a labelled heat map."""
    size = max(4.0, 0.45 * len(class_names) + 2)
    fig = Figure(figsize=(size, size))
    axis = fig.subplots()
    image = axis.imshow(matrix, cmap="Blues")
    fig.colorbar(image, ax=axis, fraction=0.046)
    ticks = np.arange(len(class_names))
    axis.set_xticks(ticks, class_names, rotation=90 if len(class_names) > 10 else 0)
    axis.set_yticks(ticks, class_names)
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    if len(class_names) <= 20:
        threshold = matrix.max() / 2 if matrix.size else 0
        for (row, col), count in np.ndenumerate(matrix):
            axis.text(col, row, int(count), ha="center", va="center", fontsize=7,
                      color="white" if count > threshold else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)


def plot_reconstructions(rows: dict[str, Sequence[np.ndarray]], path: str | Path) -> Path:
    """A grid of images, one row per entry of ``rows`` (its name on the left), one column per
    image: ``[H, W, 3]`` float RGB arrays in ``[0, 1]``. MAE's figure (the paper's Figure 2) has
    the masked input, the reconstruction and the original of a few test images."""
    names = list(rows)
    columns = max(len(images) for images in rows.values())
    fig = Figure(figsize=(1.3 * columns + 1.2, 1.3 * len(names)))
    axes = np.asarray(fig.subplots(len(names), columns, squeeze=False))
    for row, name in enumerate(names):
        for col in range(columns):
            axis = axes[row, col]
            axis.set_xticks([])
            axis.set_yticks([])
            if col < len(rows[name]):
                axis.imshow(np.clip(rows[name][col], 0.0, 1.0), interpolation="nearest")
            else:
                axis.set_axis_off()
        axes[row, 0].set_ylabel(name, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return Path(path)
