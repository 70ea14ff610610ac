"""Issue 69: does token merging pay where it is used? Speed at batch 1 and 64, and the accuracy of a
model trained without and one trained with merging, each merged at the same schedules.

    vitkit train fashion_mnist_fast model.patch_size=4 trainer.precision=32-true trainer.max_epochs=3 \\
        trainer.limit_train_batches=80 trainer.num_threads=1 output.dir=plain           # 64 tokens
    vitkit train fashion_mnist_fast model.patch_size=4 model.merge_tokens=16 trainer.precision=32-true \\
        trainer.max_epochs=3 trainer.limit_train_batches=80 trainer.num_threads=1 output.dir=merged
    python dev/merging_table.py --plain PLAIN.ckpt --merged MERGED.ckpt --schedules 0 16 20 32,16,0,0
    python dev/merging_table.py --plain PLAIN.ckpt --schedules 0 16 20 --speed-only     # the speed columns

A schedule is one r for every block (``16``), one per block (``32,16,0,0``) or ToMe's decreasing
schedule from ``2r`` down to 0 (``12d``: 24, 16, 8, 0). Speed: the plain model's weights merged at
each schedule, timed in interleaved rounds on one thread, each call's time read from the thread's
CPU clock (``time.thread_time``: the cores are shared with other jobs, whose time it leaves out),
the minimum of ``--rounds``. Accuracy: top-1 of both models on the first
``--max-test-images`` test images (one view), merged at each schedule.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch

import vitkit
from vitkit.data.model_data import data_config_for
from vitkit.io import load_model_and_extra
from vitkit.layers.token_merging import merge_schedule, token_counts
from vitkit.models import VisionTransformer, vit_flops
from vitkit.prune.measure import eval_loaders
from vitkit.timing import interleaved_times


def parse_schedule(text: str, depth: int) -> list[int]:
    """Tokens merged per block: ``"16"`` -> [16] * depth, ``"32,16,0,0"`` -> [32, 16, 0, 0],
    ``"12d"`` -> ToMe's decreasing schedule for r = 12 ([24, 16, 8, 0] at depth 4)."""
    if text.endswith("d"):
        return merge_schedule(int(text[:-1]), depth, "decreasing")
    counts = [int(value) for value in text.split(",")]
    return merge_schedule(counts[0] if len(counts) == 1 else counts, depth)


def merged_copy(model: VisionTransformer, schedule: list[int]) -> VisionTransformer:
    """A copy of ``model`` merging at ``schedule`` (the weights copied, the original untouched)."""
    copy = VisionTransformer(model.config.replace(merge_tokens=0)).eval()
    copy.load_state_dict(model.state_dict())
    return vitkit.merge_tokens(copy, schedule)


def seconds_per_call(models: dict[str, VisionTransformer], batch: int, rounds: int) -> dict[str, float]:
    """Least CPU seconds of one forward at ``batch`` on one thread, every model in each round."""
    torch.set_num_threads(1)
    config = next(iter(models.values())).config
    images = torch.randn(batch, config.in_chans, *config.img_size)

    def call(model: VisionTransformer) -> None:
        with torch.inference_mode():
            model(images)

    times = interleaved_times({name: (lambda m=model: call(m)) for name, model in models.items()},
                              repeats=rounds, warmup=2, clock=time.thread_time)
    return {name: min(seconds) for name, seconds in times.items()}


def top1(model: VisionTransformer, extra: dict[str, Any], schedules: dict[str, list[int]],
         max_images: int) -> dict[str, float]:
    """Top-1 (%) of ``model`` merged at each schedule on the first ``max_images`` test images."""
    splits = eval_loaders(data_config_for(extra, [], model), 250)
    models = {name: merged_copy(model, schedule) for name, schedule in schedules.items()}
    correct, total = dict.fromkeys(models, 0), 0
    with torch.inference_mode():
        for images, labels in splits.test:
            for name, merged in models.items():
                correct[name] += int((merged(images).argmax(dim=-1) == labels).sum())
            total += len(labels)
            if total >= max_images:
                break
    return {name: 100 * count / total for name, count in correct.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--plain", type=Path, required=True, help="model file or checkpoint trained without merging")
    parser.add_argument("--merged", type=Path, help="the same recipe trained with model.merge_tokens")
    parser.add_argument("--schedules", nargs="+", default=["0", "16", "20"],
                        help="r, r per block (comma-separated), or r followed by d (ToMe's decreasing schedule)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--max-test-images", type=int, default=10_000)
    parser.add_argument("--speed-only", action="store_true", help="time the schedules, measure no accuracy (n/a)")
    args = parser.parse_args(argv)
    plain, plain_extra = load_model_and_extra(args.plain)
    schedules = {text: parse_schedule(text, plain.config.depth) for text in args.schedules}
    models = {name: merged_copy(plain, schedule) for name, schedule in schedules.items()}
    batch64 = seconds_per_call(models, 64, args.rounds)
    batch1 = seconds_per_call(models, 1, 4 * args.rounds)
    accuracy = {}
    if not args.speed_only:
        accuracy["without"] = top1(plain, plain_extra, schedules, args.max_test_images)
    if args.merged is not None and not args.speed_only:
        trained, trained_extra = load_model_and_extra(args.merged)
        accuracy["with"] = top1(trained, trained_extra, schedules, args.max_test_images)
    base = args.schedules[0]
    print("| schedule | r per block | GFLOPs | b64 ms (speed-up) | b1 ms (speed-up) | top-1 trained without | top-1 trained with |")
    print("|---|---|---|---|---|---|---|")
    for name, model in models.items():
        without, trained_with = (f"{accuracy[key][name]:.2f}%" if key in accuracy else "n/a" for key in ("without", "with"))
        counts = token_counts(model.config.num_tokens, model.num_prefix_tokens, schedules[name])
        merged = [before - after for before, after in zip(counts, counts[1:])]  # clamped as ToMe clamps
        print(f"| {name} | {merged} | {vit_flops(model.config) / 1e9:.3g} | {batch64[name] * 1e3:.1f} ({batch64[base] / batch64[name]:.2f}x) "
              f"| {batch1[name] * 1e3:.2f} ({batch1[base] / batch1[name]:.2f}x) | {without} | {trained_with} |")


if __name__ == "__main__":
    main()
