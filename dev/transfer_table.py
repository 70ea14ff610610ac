"""Issue 34's transfer table (docs/results.md, "Fine-tuning"): a model pre-trained on Fashion-MNIST
classes 0-4 fine-tuned on classes 5-9 with 10, 100 or all training labels per class, by full
fine-tuning, layer-wise LR decay, a linear probe and LoRA, against the same model trained from
scratch on the same labels.

    python dev/transfer_table.py --pretrained runs/fmnist_0to4/latest/model.safetensors --out runs/transfer

Each run is ``vitkit train recipes/fashion_mnist_fast.yaml`` with the overrides below; a run whose
``summary.json`` exists is read, not repeated, so the script resumes. It prints one markdown row per
(method, labels per class): mean test accuracy (mirrored views) over the seeds, min-max, and the mean
time per run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

RECIPE = "recipes/fashion_mnist_fast.yaml"
#: The fine-tuning task: the five classes the pre-trained model never saw.
TARGET = "data.classes=[5,6,7,8,9]"
#: What each method changes in the recipe (the pre-trained file is added to all but scratch).
METHODS: dict[str, list[str]] = {
    "scratch": [],
    "full fine-tuning": ["optim.lr=5e-4"],
    "layer decay 0.65": ["optim.lr=1e-3", "optim.layer_decay=0.65"],
    "linear probe": ["model.freeze=backbone", "optim.lr=1e-2", "optim.weight_decay=0"],
    "LoRA r=8": ["model.lora={rank: 8, alpha: 16}", "optim.lr=2e-3"],
}
#: Epochs by labels per class, so that each budget gets enough optimiser steps, and the batch size
#: (ten labels of five classes are one batch of 50).
EPOCHS = {"10": 40, "100": 20, "all": 3}
BATCH = {"10": 50, "100": 128, "all": 128}


def run_dir(out: Path, method: str, budget: str, seed: int) -> Path:
    return out / f"{method.replace(' ', '_').replace('=', '')}_{budget}_s{seed}"


def train(out: Path, pretrained: str, method: str, budget: str, seed: int, report_only: bool = False) -> dict | None:
    """The run's summary.json, training it first when it is not there yet (``None`` with
    ``report_only``: only finished runs are read)."""
    folder = run_dir(out, method, budget, seed)
    done = sorted(folder.glob("*/*/summary.json"))
    if done:
        return json.loads(done[-1].read_text())
    if report_only:
        return None
    overrides = [
        TARGET,
        f"trainer.max_epochs={EPOCHS[budget]}",
        f"trainer.batch_size={BATCH[budget]}",
        f"trainer.seed={seed}",
        "trainer.val_tta=none",
        "trainer.limit_val_batches=4",  # about 500 of the 1,500 validation images pick the best epoch
        "trainer.enable_progress_bar=false",
        f"output.dir={folder}",
        *METHODS[method],
    ]
    if budget != "all":
        overrides.append(f"data.train_per_class={budget}")
    if method != "scratch":
        overrides.append(f"model.pretrained={pretrained}")
    command = [sys.executable, "tools/train.py", RECIPE, *overrides]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads(sorted(folder.glob("*/*/summary.json"))[-1].read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pretrained", required=True, help="model file pre-trained on classes 0-4")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--budgets", nargs="+", default=["10", "100", "all"], choices=list(EPOCHS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--all-seeds", type=int, nargs="+", default=[0], help="seeds of the 'all' budget")
    parser.add_argument("--report-only", action="store_true", help="tabulate the finished runs, train nothing")
    args = parser.parse_args(argv)
    rows = []
    for budget in args.budgets:
        for method in args.methods:
            seeds = args.all_seeds if budget == "all" else args.seeds
            found = [train(args.out, args.pretrained, method, budget, seed, args.report_only) for seed in seeds]
            runs = [run for run in found if run is not None]
            if not runs:
                continue
            tests = [run["test_acc"] for run in runs]
            spread = f" ({min(tests):.2f}-{max(tests):.2f})" if len(tests) > 1 else ""
            rows.append(
                f"| {budget} | {method} | {statistics.mean(tests):.2f}%{spread} | {len(tests)} | "
                f"{statistics.mean(run['wall_time_s'] for run in runs):.0f} s |"
            )
    print("| labels per class | method | test accuracy (mean, min-max) | seeds | time per run |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
