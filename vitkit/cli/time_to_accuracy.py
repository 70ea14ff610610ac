"""Time-to-accuracy benchmark: train one recipe with vitkit's model and with timm's
VisionTransformer of the same shape (same data, schedule, seed, precision, threads), evaluating
test accuracy as training goes; write the curves (CSV, PNG) and a table.

    vitkit time-to-accuracy recipes/fashion_mnist.yaml data.root=/usr/share/datasets/fashion-mnist
    vitkit time-to-accuracy recipes/quickstart.yaml --eval-every 20 --targets 90 95

Each run may be capped at --budget-minutes of training (Lightning's max_time); the table gives the
time each model needs to reach every target accuracy and the accuracy each has at the budget.
timm has no shifted patch tokenization, locality self-attention or convolutional stem: when the
recipe uses them, timm trains the plain ViT of the same shape (linear patches of the same size), and so does a third run, "vitkit (plain ViT)", so that
the architecture and the implementation can be told apart.
Writes <out>/curves.csv, <out>/time_to_accuracy.png and <out>/summary.json.
"""

from __future__ import annotations

import argparse
import csv
import json

from vitkit.output_dirs import claim_output_dir
from vitkit.train import RecipeConfig, load_recipe, train
from vitkit.train.config import timm_twin_overrides
from vitkit.train.time_to_accuracy import TestAccuracyTimer, plot_time_to_accuracy, summarise

from .commands import run_command

IMPLS = ("vitkit", "timm")


def runs_to_make(config: RecipeConfig, impls: list[str]) -> dict[str, list[str]]:
    """Label -> extra overrides of every training run the benchmark makes."""
    plain = timm_twin_overrides(config)
    runs: dict[str, list[str]] = {}
    for impl in impls:
        if impl == "vitkit":
            runs["vitkit"] = ["model.impl=vitkit"]
            if plain and "timm" in impls:
                runs["vitkit (plain ViT)"] = ["model.impl=vitkit", *plain]
        else:
            runs["timm"] = ["model.impl=timm", *plain]
    return runs


def main(argv: list[str] | None = None) -> int:
    """``vitkit time-to-accuracy`` in this process (``tools/time_to_accuracy.py``, tests)."""
    return run_command("time-to-accuracy", run, argv)


def run(args: argparse.Namespace) -> int:
    config = load_recipe(args.recipe, args.overrides)  # fail before any training
    out = claim_output_dir(args.out, "time_to_accuracy")
    curves = {}
    for label, extra in runs_to_make(config, args.impls).items():
        timer = TestAccuracyTimer(args.eval_every)
        folder = label.replace(" ", "_").replace("(", "").replace(")", "")
        overrides = [*args.overrides, *extra, f"output.dir={out / folder}"]
        if args.budget_minutes:
            overrides.append(f"trainer.max_time_minutes={args.budget_minutes}")
        train(args.recipe, overrides, callbacks=[timer])
        curves[label] = timer.points
    targets = tuple(args.targets)
    budget_s = 60 * args.budget_minutes if args.budget_minutes else max(p.seconds for c in curves.values() for p in c)
    rows = summarise(curves, targets, budget_s)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "curves.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["model", "seconds", "step", "test_acc"])
        for impl, points in curves.items():
            writer.writerows([impl, p.seconds, p.step, p.accuracy] for p in points)
    title = f"recipe {config.name} ({config.data.name} test split), {config.trainer.precision}"
    plot_time_to_accuracy(curves, targets, out / "time_to_accuracy.png", title)
    (out / "summary.json").write_text(json.dumps({"budget_s": budget_s, "rows": rows}, indent=2))
    print(format_table(rows, targets, budget_s))
    print(f"written: {out / 'curves.csv'}, {out / 'time_to_accuracy.png'}, {out / 'summary.json'}")
    return 0


def format_table(rows: list[dict], targets: tuple[float, ...], budget_s: float) -> str:
    """A Markdown table of :func:`summarise` rows, times in minutes."""

    def minutes(value: float | None) -> str:
        return "not reached" if value is None else f"{value / 60:.1f} min"

    head = ["model", *(f"to {t:g}%" for t in targets), f"acc. at {budget_s / 60:.1f} min", "final acc."]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [row["model"], *(minutes(row[f"time_to_{t:g}_s"]) for t in targets)]
        cells += [f"{row['acc_at_budget']}%" if row["acc_at_budget"] is not None else "-", f"{row['final_acc']}%"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)

