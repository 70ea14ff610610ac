"""Transfer tables of docs/results.md: a classification recipe trained with 10, 100 or all training
labels per class, from scratch and from one or more pre-trained encoders, by full fine-tuning,
layer-wise LR decay, a linear probe and LoRA.

Issue 34's table (a supervised model of Fashion-MNIST classes 0-4, fine-tuned on classes 5-9):

    python dev/transfer_table.py --source supervised=runs/fmnist_0to4/latest/model.safetensors \
        --out runs/transfer --classes 5 6 7 8 9

Issue 48's table (self-supervised encoders of all 60,000 unlabeled images, all ten classes):

    python dev/transfer_table.py --source MAE=runs/mae/latest/model.safetensors \
        --source DINO=runs/dino/latest/model.safetensors --out runs/ssl --classes all \
        --methods "full fine-tuning" "linear probe"

Each run is ``vitkit train recipes/fashion_mnist_fast.yaml`` with the overrides below; a run whose
``summary.json`` exists is read, not repeated, so the script resumes. It prints one markdown row per
(labels per class, source, method): mean test accuracy (mirrored views) over the seeds, min-max, and
the mean wall time per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RECIPE = "recipes/fashion_mnist_fast.yaml"
#: What each method changes in the recipe (every method but scratch starts from a source's weights).
METHODS: dict[str, list[str]] = {
    "scratch": [],
    "full fine-tuning": ["optim.lr=5e-4"],
    "layer decay 0.65": ["optim.lr=1e-3", "optim.layer_decay=0.65"],
    "linear probe": ["model.freeze=backbone", "optim.lr=1e-2", "optim.weight_decay=0"],
    "LoRA r=8": ["model.lora={rank: 8, alpha: 16}", "optim.lr=2e-3"],
}
#: Epochs by labels per class, so that each budget gets enough optimiser steps.
EPOCHS = {"10": 40, "100": 20, "all": 3}


def batch_size(budget: str, num_classes: int) -> int:
    """Ten labels of each class are one batch (50 images for five classes, 100 for ten)."""
    return 10 * num_classes if budget == "10" else 128


def run_dir(out: Path, source: str, method: str, budget: str, seed: int) -> Path:
    name = method if method == "scratch" else f"{source} {method}"
    return out / f"{name.replace(' ', '_').replace('=', '')}_{budget}_s{seed}"


def train(
    out: Path, classes: list[int] | None, source: str, weights: str, method: str, budget: str, seed: int,
    report_only: bool = False,
) -> dict | None:
    """The run's summary.json, training it first when it is not there yet (``None`` with
    ``report_only``: only finished runs are read)."""
    folder = run_dir(out, source, method, budget, seed)
    done = sorted(folder.glob("*/*/summary.json"))
    if done:
        return json.loads(done[-1].read_text())
    if report_only:
        return None
    overrides = [
        f"trainer.max_epochs={EPOCHS[budget]}",
        f"trainer.batch_size={batch_size(budget, len(classes) if classes else 10)}",
        f"trainer.seed={seed}",
        "trainer.val_tta=none",
        "trainer.limit_val_batches=4",  # about 500 held-out labelled images pick the best epoch
        "trainer.enable_progress_bar=false",
        f"output.dir={folder}",
        *METHODS[method],
    ]
    if classes:
        overrides.append(f"data.classes=[{','.join(map(str, classes))}]")
    if budget != "all":
        overrides.append(f"data.train_per_class={budget}")
    if method != "scratch":
        overrides.append(f"model.pretrained={weights}")
    command = [sys.executable, "tools/train.py", RECIPE, *overrides]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(sorted(folder.glob("*/*/summary.json"))[-1].read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                        help="a pre-trained model file and its name in the table (repeatable)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--classes", nargs="+", default=["5", "6", "7", "8", "9"],
                        help="the target classes, or 'all'")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budgets", nargs="+", default=["10", "100", "all"], choices=list(EPOCHS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--all-seeds", type=int, nargs="+", default=[0], help="seeds of the 'all' budget")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, train nothing")
    parser.add_argument("--figure", type=Path, default=None,
                        help="also draw mean test accuracy against labels per class, one line per method")
    args = parser.parse_args(argv)
    sources = dict(item.split("=", 1) for item in args.source)
    if not sources and set(args.methods) != {"scratch"}:
        parser.error("--source NAME=PATH is needed for every method but scratch")
    classes = None if args.classes == ["all"] else [int(c) for c in args.classes]
    rows = []
    curves: dict[str, dict[str, float]] = {}
    for budget in args.budgets:
        seeds = args.all_seeds if budget == "all" else args.seeds
        for method in args.methods:
            for source, weights in (sources.items() if method != "scratch" else [("", "")]):
                found = [train(args.out, classes, source, weights, method, budget, seed, args.report_only)
                         for seed in seeds]
                runs = [run for run in found if run is not None]
                if not runs:
                    continue
                tests = [run["test_acc"] for run in runs]
                spread = f" ({min(tests):.2f}-{max(tests):.2f})" if len(tests) > 1 else ""
                label = method if method == "scratch" else f"{source} → {method}"
                curves.setdefault(label, {})[budget] = statistics.mean(tests)
                rows.append(
                    f"| {budget} | {label} | {statistics.mean(tests):.2f}%{spread} | {len(tests)} | "
                    f"{statistics.mean(run['wall_time_s'] for run in runs):.0f} s |"
                )
    print("| labels per class | method | test accuracy (mean, min-max) | seeds | time per run |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    if args.figure is not None:
        draw(curves, args.budgets, args.figure)
    return 0


def draw(curves: dict[str, dict[str, float]], budgets: list[str], path: Path) -> None:
    """Mean test accuracy against labels per class (one line per method) as a PNG."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(6, 4))
    axes = figure.subplots()
    for label, points in curves.items():
        shown = [budget for budget in budgets if budget in points]
        axes.plot([budgets.index(b) for b in shown], [points[b] for b in shown], marker="o",
                  linestyle="--" if label == "scratch" else "-", label=label)
    axes.set_xticks(range(len(budgets)), [f"{b} labels/class" if b != "all" else "all labels" for b in budgets])
    axes.set_ylabel("test accuracy (%)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=130)


if __name__ == "__main__":
    sys.exit(main())
