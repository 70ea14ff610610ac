"""Initialisation ablation: train one recipe from several initialisations, a few seeds each, and
report test accuracy after the same number of steps.

    vitkit init-ablation recipes/fashion_mnist.yaml trainer.max_epochs=1
    vitkit init-ablation recipes/fashion_mnist_fast.yaml --stop-after-epochs 1 --no-parts
    vitkit init-ablation recipes/quickstart.yaml --no-parts

``--stop-after-epochs N`` stops every run after its first N epochs of the recipe's own schedule
(warm-up, then cosine over all ``trainer.max_epochs``), where ``trainer.max_epochs=N`` would
compress the whole schedule into N epochs.

Variants: vitkit's default init, timm's and jax's schemes on vitkit's model (``model.init``),
timm's own VisionTransformer (``model.impl=timm``; for a recipe with SPT, LSA or a convolutional
stem, the plain ViT of its shape, which is also trained with vitkit's and timm's schemes), and, unless --no-parts, vitkit's default with
one part at a time (patch, qkv, proj, mlp) initialised as timm does. Writes <out>/runs.csv and
<out>/table.md and prints the table (mean and range over the seeds).
"""

from __future__ import annotations

import argparse
import csv
import statistics
from collections.abc import Sequence
from typing import Any

import lightning as L

from vitkit.errors import UsageError
from vitkit.models.init import init_parts
from vitkit.output_dirs import claim_output_dir
from vitkit.train import load_recipe, train
from vitkit.train.config import timm_twin_overrides

from .commands import run_command

#: Parts whose vitkit and timm rules differ (both draw the head from N(0, 0.02)).
SWAPPABLE_PARTS = ("patch", "qkv", "proj", "mlp")


class InitOverride(L.Callback):
    """Re-initialise ``parts`` of the model by ``scheme`` just before training starts."""

    def __init__(self, scheme: str, parts: tuple[str, ...]) -> None:
        self.scheme = scheme
        self.parts = parts

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        init_parts(pl_module.model, self.scheme, self.parts)


class StopAfterEpochs(L.Callback):
    """Stop training once ``epochs`` epochs ended, leaving the learning-rate schedule as the recipe
    sets it (over all ``trainer.max_epochs``); the run then tests its best checkpoint as usual."""

    def __init__(self, epochs: int) -> None:
        self.epochs = epochs

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch + 1 >= self.epochs:
            trainer.should_stop = True


def variants(with_parts: bool, plain: Sequence[str] = ()) -> list[tuple[str, list[str], list[L.Callback]]]:
    """``(label, recipe overrides, callbacks)`` of every variant. ``plain``: the overrides that the
    recipe's model needs for a timm twin (:func:`~vitkit.train.config.timm_twin_overrides`); if any, the plain ViT
    of its shape is trained too, with vitkit's and timm's schemes, and is what timm's model trains."""
    rows: list[tuple[str, list[str], list[L.Callback]]] = [
        ("vitkit default", [], []),
        ("timm scheme", ["model.init=timm"], []),
        ("jax scheme", ["model.init=jax"], []),
    ]
    if plain:
        rows += [
            ("plain ViT, vitkit default", [*plain], []),
            ("plain ViT, timm scheme", [*plain, "model.init=timm"], []),
        ]
    rows.append(("timm VisionTransformer", ["model.impl=timm", *plain], []))
    if with_parts:
        rows += [(f"vitkit, {part} as timm", [], [InitOverride("timm", (part,))]) for part in SWAPPABLE_PARTS]
    return rows


def main(argv: list[str] | None = None) -> int:
    """``vitkit init-ablation`` in this process (``tools/init_ablation.py``, tests)."""
    return run_command("init-ablation", run, argv)


def run(args: argparse.Namespace) -> int:
    results: list[dict[str, Any]] = []
    plain = timm_twin_overrides(load_recipe(args.recipe, args.overrides))  # fail before any training
    chosen = variants(not args.no_parts, plain)
    if args.variants:
        labels = [label for label, _, _ in chosen]
        unknown = [name for name in args.variants if name not in labels]
        if unknown:
            raise UsageError(
                f"--variants {unknown[0]!r} is no variant of this recipe; choose from: {', '.join(map(repr, labels))}."
            )
        chosen = [row for row in chosen if row[0] in args.variants]
    out = claim_output_dir(args.out, "init_ablation")
    for seed in args.seeds:
        for label, overrides, callbacks in chosen:
            if args.stop_after_epochs is not None:
                callbacks = [*callbacks, StopAfterEpochs(args.stop_after_epochs)]
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

