"""Artefacts of the pruning tools: CSV rows, Markdown tables and the accuracy-vs-pruning plot, with
a second panel of accuracy before and after recovery against the measured speed-up (drawn on
:class:`matplotlib.figure.Figure`, never through pyplot: the user's backend stays)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..files import atomic_write
from .head_sweep import SweepRun, mean_std
from .iterative import PruningStep
from .recovery import RecoveredStep

#: PruningStep fields written to the curves CSV (the per-layer details go to JSON instead).
CURVE_FIELDS = ("step", "heads_left", "fraction_pruned", "accuracy", "parameters", "flops", "images_per_s")
#: Columns added to the curves CSV when steps were recovered (empty in rows of steps that were not).
RECOVERED_FIELDS = ("recovered_val_acc", "recovered_test_acc")


def curve_rows(
    order: str, seed: int | None, records: Sequence[PruningStep], recovered: Sequence[RecoveredStep] | None = None
) -> list[dict[str, Any]]:
    """CSV rows of one pruning curve: ``order``, ``seed`` and the :data:`CURVE_FIELDS`, then, when
    ``recovered`` is given (steps of these ``records``, possibly none), the :data:`RECOVERED_FIELDS`."""
    rows = [{"order": order, "seed": seed, **{k: dataclasses.asdict(r)[k] for k in CURVE_FIELDS}} for r in records]
    if recovered is not None:
        after = {r.step.step: r for r in recovered}
        for row in rows:
            found = after.get(row["step"])
            row["recovered_val_acc"] = found.val_acc[1] if found else None
            row["recovered_test_acc"] = found.test_acc[1] if found and found.test_acc else None
    return rows


def pruning_curves_figure(
    curves: Mapping[str, Sequence[Sequence[PruningStep]]],
    *,
    max_drop: float | None = None,
    chosen: PruningStep | None = None,
    title: str = "",
    recovery: Sequence[RecoveredStep] = (),
    speed_curve: Sequence[PruningStep] = (),
    recovery_label: str = "after recovery",
) -> Figure:
    """Validation accuracy (percent) vs fraction of heads pruned, one line per order (mean, with a
    ±1 std band clipped to [0, 100] when an order has several runs, e.g. random seeds). Runs of
    one order must have the same steps. With ``recovery``, a second panel shows validation accuracy
    against the measured speed-up, an arrow from before to after recovery at each recovered step.

    Args:
        curves: ``{order label: [records of each run]}``, accuracies measured on the validation split.
        max_drop: draw the accuracy budget ``baseline - max_drop`` as a dashed line.
        chosen: the step kept (``within_budget``), marked with a star.
        title: figure title.
        recovery: recovered steps of ``speed_curve``.
        speed_curve: the timed pruning run (``images_per_s`` set, step 0 unpruned) the recovered
            steps come from; its accuracy line is the "before" curve of the second panel.
        recovery_label: legend entry of the recovered accuracies (e.g. how many epochs).
    """
    fig = Figure(figsize=(12.0, 4.4) if recovery else (6.4, 4.2), dpi=100)
    ax, *panels = fig.subplots(1, 2) if recovery else [fig.subplots()]
    baseline = None
    for label, runs in curves.items():
        accuracy = np.array([[r.accuracy for r in run] for run in runs])
        fraction = np.array([r.fraction_pruned for r in runs[0]])
        mean = accuracy.mean(0)
        (line,) = ax.plot(fraction, mean, marker=".", label=label if len(runs) == 1 else f"{label} (n={len(runs)})")
        if len(runs) > 1:
            std = accuracy.std(0)
            low, high = np.clip(mean - std, 0, 100), np.clip(mean + std, 0, 100)  # accuracy stays in [0, 100]
            ax.fill_between(fraction, low, high, color=line.get_color(), alpha=0.2)
        baseline = runs[0][0].accuracy
    floor = baseline - max_drop if max_drop is not None and baseline is not None else None
    if floor is not None:
        ax.axhline(floor, color="grey", linestyle="--", linewidth=1, label=f"-{max_drop:g} pt budget")
    if chosen is not None:
        pruned = sum(len(heads) for heads in chosen.pruned.values())
        ax.plot(
            [chosen.fraction_pruned], [chosen.accuracy], marker="*", markersize=14, linestyle="none",
            color="black", label=f"chosen: {pruned} head(s) pruned",
        )
    ax.set_xlabel("fraction of heads pruned")
    ax.set_ylabel("validation accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend()
    if panels:
        ax.set_title("accuracy as heads are pruned")
        _recovery_panel(panels[0], speed_curve, recovery, recovery_label, floor)
        fig.suptitle(title)
    else:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def _recovery_panel(
    ax: Any, speed_curve: Sequence[PruningStep], recovery: Sequence[RecoveredStep], label: str, floor: float | None
) -> None:
    """Validation accuracy vs speed-up over the unpruned model (``speed_curve[0]``): the pruning run
    as a line, each recovered step an arrow from its accuracy before recovery to after."""
    if not speed_curve or any(r.images_per_s is None for r in speed_curve):
        raise ValueError("the recovery panel needs the timed pruning run (speed_curve with images_per_s set).")
    base = speed_curve[0].images_per_s

    def speedup(step: PruningStep) -> float:
        return step.images_per_s / base

    ax.plot([speedup(r) for r in speed_curve], [r.accuracy for r in speed_curve], marker=".", color="tab:blue",
            label="pruned, before recovery")
    xs = [speedup(r.step) for r in recovery]
    before, after = [r.val_acc[0] for r in recovery], [r.val_acc[1] for r in recovery]
    for x, y0, y1 in zip(xs, before, after):
        ax.annotate("", xy=(x, y1), xytext=(x, y0), arrowprops=dict(arrowstyle="->", color="tab:green", lw=1.5))
    ax.plot(xs, before, marker="o", markersize=6, linestyle="none", markerfacecolor="none", color="tab:blue",
            label="recovered steps, before")
    ax.plot(xs, after, marker="^", markersize=8, linestyle="none", color="tab:green", label=label)
    if floor is not None:
        ax.axhline(floor, color="grey", linestyle="--", linewidth=1, label="budget")
    ax.set_xlabel("measured speed-up over the unpruned model (x)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("recovery: accuracy before -> after vs speed-up")
    ax.grid(alpha=0.3)
    ax.legend()


def plot_pruning_curves(
    curves: Mapping[str, Sequence[Sequence[PruningStep]]], path: str | os.PathLike, **options: Any
) -> Path:
    """:func:`pruning_curves_figure` (``options``: its keyword arguments) written as PNG."""
    fig = pruning_curves_figure(curves, **options)
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))


def plot_sweep(runs: Sequence[SweepRun], path: str | os.PathLike, title: str = "") -> Path:
    """Test accuracy and training-loss oscillation against the head count (mean ± std over seeds)."""
    heads = sorted({run.heads for run in runs})
    dims = {run.heads: run.head_dim for run in runs}
    fig = Figure(figsize=(8.4, 3.4), dpi=100)
    axes = fig.subplots(1, 2)
    panels = (("accuracy", "test accuracy (%)"), ("oscillation", "training-loss oscillation"))
    for ax, (attribute, label) in zip(axes, panels):
        stats = [mean_std([getattr(r, attribute) for r in runs if r.heads == h]) for h in heads]
        ax.errorbar(heads, [m for m, _ in stats], yerr=[s for _, s in stats], marker="o", capsize=3)
        ax.set_xscale("log", base=2)
        ax.set_xticks(heads, [f"{h}\n(d={dims[h]})" for h in heads])
        ax.minorticks_off()
        ax.set_xlabel("heads (head width)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    return atomic_write(path, lambda tmp: fig.savefig(tmp, format="png"))
