"""Initialisation ablation: train one recipe from several initialisations, a few seeds each, and
report test accuracy after the same number of steps.

    python tools/init_ablation.py recipes/fashion_mnist.yaml trainer.max_epochs=1
    python tools/init_ablation.py recipes/quickstart.yaml --no-parts

Variants: vitkit's default init, timm's and jax's schemes on vitkit's model (``model.init``),
timm's own VisionTransformer (``model.impl=timm``), and, unless --no-parts, vitkit's default with
one part at a time (patch, qkv, proj, mlp) initialised as timm does. Writes <out>/runs.csv and
<out>/table.md and prints the table (mean and range over the seeds).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from typing import Any

import lightning as L

from vitkit.errors import cli_errors
from vitkit.models.init import init_parts
from vitkit.output_dirs import claim_output_dir
from vitkit.train import RUN_EXIT_STATUSES, load_recipe, train

#: Parts whose vitkit and timm rules differ (both draw the head from N(0, 0.02)).
SWAPPABLE_PARTS = ("patch", "qkv", "proj", "mlp")


class InitOverride(L.Callback):
    """Re-initialise ``parts`` of the model by ``scheme`` just before training starts."""

    def __init__(self, scheme: str, parts: tuple[str, ...]) -> None:
        self.scheme = scheme
        self.parts = parts

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        init_parts(pl_module.model, self.scheme, self.parts)


def variants(with_parts: bool) -> list[tuple[str, list[str], list[L.Callback]]]:
    """``(label, recipe overrides, callbacks)`` of every variant."""
    rows: list[tuple[str, list[str], list[L.Callback]]] = [
        ("vitkit default", [], []),
        ("timm scheme", ["model.init=timm"], []),
        ("jax scheme", ["model.init=jax"], []),
        ("timm VisionTransformer", ["model.impl=timm"], []),
    ]
    if with_parts:
        rows += [(f"vitkit, {part} as timm", [], [InitOverride("timm", (part,))]) for part in SWAPPABLE_PARTS]
    return rows


def main(argv: list[str] | None = None) -> int:
    """Exit status 0; with one ``error: ...`` line: 2 for a bad recipe, 1 for other errors (data,
    divergence, output folder), 143 when a training run was stopped by SIGTERM."""
    return cli_errors(_main, argv, status=1, statuses=RUN_EXIT_STATUSES)


def _main(argv: list[str] | None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", help="recipe YAML file")
    parser.add_argument("overrides", nargs="*", help="dotted key=value overrides for every run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="trainer.seed values")
    parser.add_argument("--no-parts", action="store_true", help="skip the one-part-at-a-time variants")
    parser.add_argument("--out", default="runs/init_ablation", help="output folder")
    args = parser.parse_intermixed_args(argv)
    results: list[dict[str, Any]] = []
    load_recipe(args.recipe, args.overrides)  # fail before any training
    out = claim_output_dir(args.out, "init_ablation")
    for seed in args.seeds:
        for label, overrides, callbacks in variants(not args.no_parts):
            run_overrides = [*args.overrides, *overrides, f"trainer.seed={seed}", f"output.dir={out / 'runs'}"]
            summary = train(args.recipe, run_overrides, callbacks=callbacks).summary
            results.append({"variant": label, "seed": seed, "test_acc": summary["test_acc"],
                            "val_acc": summary["val_acc"], "steps": summary["global_steps"]})
            print(f"{label} seed {seed}: test {summary['test_acc']}%", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "runs.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(results[0]))
        writer.writeheader()
        writer.writerows(results)
    table = format_table(results)
    (out / "table.md").write_text(table + "\n")
    print(table)
    return 0


def format_table(results: list[dict[str, Any]]) -> str:
    """Mean, min and max test accuracy per variant, in first-seen order."""
    labels = list(dict.fromkeys(row["variant"] for row in results))
    lines = ["| init | steps | test acc. mean | min-max | seeds |", "|---|---|---|---|---|"]
    for label in labels:
        accs = [row["test_acc"] for row in results if row["variant"] == label]
        steps = next(row["steps"] for row in results if row["variant"] == label)
        lines.append(f"| {label} | {steps} | {statistics.mean(accs):.2f}% | {min(accs):.2f}-{max(accs):.2f} | "
                     f"{len(accs)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
