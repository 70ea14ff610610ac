"""Train a ViT from a recipe.

    vitkit train quickstart
    vitkit train vit_small trainer.max_epochs=5 model.num_heads=8 trainer.precision=bf16-mixed
    vitkit train my_recipe.yaml --resume runs/my_recipe/<timestamp>/checkpoints/last.ckpt

A recipe is a YAML file or the name of one shipped with vitkit (vitkit recipes lists them; in a
clone they are recipes/*.yaml, so recipes/quickstart.yaml names the same one).

Writes runs/<recipe>/<timestamp>/ (config.yaml, metrics.csv, checkpoints/, curves.png,
summary.json, model.safetensors) and prints the test accuracy, the time taken and what to run
next; summary.json holds the rest. Multi-GPU / multi-node: set trainer.devices, trainer.num_nodes
and trainer.strategy=ddp or fsdp; Lightning launches the other processes.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from vitkit.train import train

from .commands import run_command


def main(argv: list[str] | None = None) -> int:
    """``vitkit train`` in this process (``tools/train.py``, tests)."""
    return run_command("train", run, argv)


def run(args: argparse.Namespace) -> int:
    result = train(args.recipe, args.overrides, resume=args.resume)
    if result.primary:  # one report per run, not one per DDP process
        print(closing_lines(result.summary, result.run_dir))
    return 0


def closing_lines(summary: dict[str, Any], run_dir: Path) -> str:
    """The end of a run in a few lines: accuracy, time, speed, where it went and what to run next."""
    def percent(key: str) -> str:
        return "n/a" if summary.get(key) is None else f"{summary[key]:.2f}%"

    model = run_dir / "model.safetensors"
    notes = _schedule_notes(summary)
    if "finetune_command" in summary:  # a pre-trained encoder: no classifier to score, one to fine-tune
        probe = f"; linear probe {percent('linear_probe_acc1')}" if "linear_probe_acc1" in summary else ""
        where = f"labelled folder {summary['knn_root']}" if summary.get("knn_root") else "test split"
        return "\n".join([
            f"k-NN accuracy of the encoder's features {percent('knn_acc1')} ({where}, k=20{probe}), "
            f"{summary['epochs']} epochs in {summary['wall_time_s']:.0f} s, {summary['train_images_per_s']:,.0f} images/s",
            *notes,
            f"run directory: {run_dir} (summary.json has the rest)",
            "next: fine-tune the encoder on labelled images, then the same model from fresh weights (what pre-training bought)",
            f"  {summary['finetune_command']}",
            *([f"  {summary['scratch_command']}"] if "scratch_command" in summary else []),
        ])
    views = "" if summary.get("tta", "none") == "none" else f" with {summary['tta']} views, {percent('test_acc_one_view')} without"
    if "test_acc_mirrored" in summary:
        views += f", {percent('test_acc_mirrored')} with hflip's two"
    if summary.get("precision", "32-true") != "32-true":  # prune and evaluate score in float32: say which this is
        views += f", in {summary['precision']}"
    tested, total = summary.get("test_images") or (None, None)
    if tested is not None and tested < total:
        views += f" on {tested:,} of {total:,} test images (trainer.limit_test_batches)"
    seen = "" if summary.get("held_out", True) else " on the training images (none were held out)"
    return "\n".join([
        f"test accuracy {percent('test_acc')}{views}{seen} (top-5 {percent('test_acc5')}, validation {percent('val_acc')}), "
        f"{summary['epochs']} epochs in {summary['wall_time_s']:.0f} s, {summary['train_images_per_s']:,.0f} images/s",
        *notes,
        f"run directory: {run_dir} (summary.json has the rest)",
        "next:",
        f"  vitkit evaluate {model}" + ("" if summary.get("held_out", True) else " TEST_FOLDER"),
        f"  vitkit maps {model} --test-images 4 --out maps/",
        f"  vitkit predict {model} IMAGE_OR_FOLDER",
    ])


def _schedule_notes(summary: dict[str, Any]) -> list[str]:
    """A line on where ``trainer.max_time_minutes`` cut the schedule, or on what the time budget
    planned; none for a run that trained its recipe's epochs."""
    plan = summary.get("time_budget")
    if "schedule_note" in summary:
        return [f"note: {summary['schedule_note']}"]
    if plan is not None:
        return [f"time budget {plan['budget_minutes']:g} min: {plan['epochs']:,} epochs planned, the schedule ended "
                f"with training (summary.json's time_budget)"]
    return []

