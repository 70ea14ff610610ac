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

    python dev/merging_table.py --plain PLAIN.ckpt --schedules 0 16 20 --speed-only --compile --batch-sizes 1

``--compile`` times every model compiled whole by ``torch.compile`` (Inductor, ``fullgraph=True``:
a merged model is one graph; a C++ compiler is needed on a CPU), each compiled for each batch size
before the rounds and its logits checked against the eager model's.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

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


def seconds_per_call(models: dict[str, nn.Module], batch: int, rounds: int) -> dict[str, float]:
    """Least CPU seconds of one forward at ``batch``, every model in each round (on the threads
    :func:`main` set: one)."""
    config = next(iter(models.values())).config
    images = torch.randn(batch, config.in_chans, *config.img_size)

    def call(model: nn.Module) -> None:
        with torch.inference_mode():
            model(images)

    times = interleaved_times({name: (lambda m=model: call(m)) for name, model in models.items()},
                              repeats=rounds, warmup=2, clock=time.thread_time)
    return {name: min(seconds) for name, seconds in times.items()}


def compiled(models: dict[str, VisionTransformer], batch_sizes: list[int]) -> dict[str, nn.Module]:
    """Each model compiled whole for each batch size (the compilation out of the timed rounds), its
    logits checked against the eager model's; prints the seconds each compilation took."""
    config = next(iter(models.values())).config
    # Every model's forward is one code object to Dynamo, whose limit (8) counts the graphs of all
    # models together: one per model and batch size here, and the default's room besides
    needed = len(models) * len(batch_sizes) + 8
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, needed)
    torch._dynamo.config.accumulated_recompile_limit = max(torch._dynamo.config.accumulated_recompile_limit, needed)
    result = {}
    for name, model in models.items():
        result[name] = torch.compile(model, fullgraph=True, dynamic=False)
        for batch in batch_sizes:
            images = torch.randn(batch, config.in_chans, *config.img_size)
            start = time.perf_counter()
            with torch.inference_mode():
                eager, fused = model(images), result[name](images)
            difference = float((eager - fused).abs().max())
            print(f"compiled {name} for batch {batch} in {time.perf_counter() - start:.0f} s; "
                  f"largest logit difference from eager {difference:.1e}", flush=True)
            if not difference < 1e-3:
                raise SystemExit(f"error: the compiled {name} differs from eager by {difference:.1e} at batch {batch}.")
    return result


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
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[64, 1],
                        help="batch sizes timed (default 64 1); batch 1 runs 4x --rounds")
    parser.add_argument("--compile", action="store_true",
                        help="time each model compiled by torch.compile (Inductor, one graph) instead of eager")
    args = parser.parse_args(argv)
    plain, plain_extra = load_model_and_extra(args.plain)
    schedules = {text: parse_schedule(text, plain.config.depth) for text in args.schedules}
    models = {name: merged_copy(plain, schedule) for name, schedule in schedules.items()}
    torch.set_num_threads(1)  # before compiling: Inductor's CPU kernels are generated for the threads there are
    timed = compiled(models, args.batch_sizes) if args.compile else models
    seconds = {batch: seconds_per_call(timed, batch, args.rounds * (4 if batch == 1 else 1)) for batch in args.batch_sizes}
    accuracy = {}
    if not args.speed_only:
        accuracy["without"] = top1(plain, plain_extra, schedules, args.max_test_images)
    if args.merged is not None and not args.speed_only:
        trained, trained_extra = load_model_and_extra(args.merged)
        accuracy["with"] = top1(trained, trained_extra, schedules, args.max_test_images)
    base = args.schedules[0]
    kind = "compiled " if args.compile else ""
    speed = "".join(f" {kind}b{batch} ms (speed-up) |" for batch in args.batch_sizes)
    print(f"| schedule | r per block | GFLOPs |{speed} top-1 trained without | top-1 trained with |")
    print("|---|---|---|" + "---|" * len(args.batch_sizes) + "---|---|")
    for name, model in models.items():
        without, trained_with = (f"{accuracy[key][name]:.2f}%" if key in accuracy else "n/a" for key in ("without", "with"))
        counts = token_counts(model.config.num_tokens, model.num_prefix_tokens, schedules[name])
        merged = [before - after for before, after in zip(counts, counts[1:])]  # clamped as ToMe clamps
        times = "".join(f" {seconds[batch][name] * 1e3:.2f} ({seconds[batch][base] / seconds[batch][name]:.2f}x) |"
                        for batch in args.batch_sizes)
        print(f"| {name} | {merged} | {vit_flops(model.config) / 1e9:.3g} |{times} {without} | {trained_with} |")


if __name__ == "__main__":
    main()
