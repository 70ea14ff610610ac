"""Issue 50 item 3: the ViT-S/4 32-px bf16 training step through ``vitkit train``, as a share of
this machine's bf16 GEMM peak, with ``trainer.compile`` false, auto and true.

    python dev/share_of_peak.py --root /usr/share/datasets/fashion-mnist --compile false auto --rounds 3

Each run is ``recipes/vit_small.yaml`` (ViT-S: 12 blocks, 384 wide, 6 heads, 4x4 patches; bf16
autocast, fused AdamW, Mixup/CutMix, label smoothing, gradient clipping) on Fashion-MNIST resized to
32 px (the CIFAR shape, one channel; no CIFAR offline), in-memory batches (no RandAugment, no worker
processes), batch 128, for ``--steps`` training batches: Lightning, the kernel trial, the compile
trial and all. A callback notes when each training batch ends; the step time is the median over
the last ``--steady`` steps (after every trial), its GFLOP/s the step's FLOPs
(``torch.utils.flop_counter``, forward + backward) over that time.

The bf16 GEMM peak is ``torch.mm`` at the step's own M x K x N shapes, the best shape's best time
per round, and the median over ``--peak-rounds`` rounds taken between the runs in the same process,
so that one lucky or unlucky moment does not move the share. The process keeps freed memory
(:func:`vitkit.keep_freed_memory`), as ``vitkit train`` does, unless ``--glibc-defaults``. Rounds cycle the compile settings, so
other work on the machine weighs on all alike. Prints one Markdown row per setting: the median step
time, GFLOP/s and share of the peak, with the range over the rounds, and the CPU it ran on.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import lightning as L
import torch

from vitkit import keep_freed_memory
from vitkit.bench.gemm import gemm_peak, gemm_shapes
from vitkit.bench.steps import batch_for, step_flops
from vitkit.data import build_datasets
from vitkit.train import load_recipe, train
from vitkit.train.model_builder import build_model

BATCH = 128


def overrides(root: str, steps: int, compile_setting: str, out: str) -> list[str]:
    return ["data.name=fashion_mnist", f"data.root={json.dumps(root)}", "data.img_size=32", "data.num_workers=0",
            "data.augment.rand_augment=null", f"trainer.batch_size={BATCH}", "trainer.max_epochs=1",
            f"trainer.limit_train_batches={steps}", "trainer.limit_val_batches=1", "trainer.limit_test_batches=1",
            "trainer.num_sanity_val_steps=0", "trainer.enable_progress_bar=false", "trainer.num_threads=2",
            f"trainer.compile={compile_setting}", "trainer.precision=bf16-mixed", f"output.dir={json.dumps(out)}"]


class StepEnds(L.Callback):
    """The clock at the end of each training batch."""

    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends.append(time.perf_counter())


def steady_step_s(changes: list[str], steady: int) -> tuple[float, dict[str, Any]]:
    """The median time of the run's last ``steady`` training steps, and its summary."""
    ends = StepEnds()
    result = train("vit_small", changes, callbacks=[ends])
    times = [b - a for a, b in zip(ends.ends, ends.ends[1:])][-steady:]
    return statistics.median(times), result.summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/usr/share/datasets/fashion-mnist")
    parser.add_argument("--compile", nargs="+", default=["false", "auto"], choices=("false", "auto", "true"))
    parser.add_argument("--steps", type=int, default=45, help="training batches per run (the trials take 27)")
    parser.add_argument("--steady", type=int, default=12, help="steps at the end of each run that are timed")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--peak-rounds", type=int, default=3, help="GEMM peak rounds between the runs")
    parser.add_argument("--glibc-defaults", action="store_true",
                        help="leave glibc's malloc settings (vitkit train keeps freed memory: vitkit.keep_freed_memory)")
    args = parser.parse_args(argv)
    if not args.glibc_defaults:
        keep_freed_memory()  # what the vitkit command does; the GEMM peak is measured under it too
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory(prefix="vitkit-peak-") as out:
        config = load_recipe("vit_small", overrides(args.root, args.steps, "false", out))
        model, _ = build_model(config, build_datasets(config.data).info, None)
        images, labels = batch_for(model, BATCH)
        flops = step_flops(model, images, labels, "train")
        shapes = gemm_shapes(model, BATCH)
        del model
        peaks: list[float] = []
        steps: dict[str, list[float]] = {setting: [] for setting in args.compile}
        choices: dict[str, list[Any]] = {setting: [] for setting in args.compile}
        for index in range(args.rounds):
            for setting in args.compile:
                peaks += [gemm_peak(shapes, torch.bfloat16, 5) for _ in range(args.peak_rounds)]
                seconds, summary = steady_step_s(overrides(args.root, args.steps, setting, out), args.steady)
                steps[setting].append(seconds)
                choices[setting].append(summary.get("compile", {}).get("choice", summary["compiled"]))
                print(f"round {index + 1}, compile={setting}: {1e3 * seconds:.0f} ms a step, "
                      f"{flops / seconds / 1e9:,.0f} GFLOP/s (compiled: {summary['compiled']})", flush=True)
        peaks.append(gemm_peak(shapes, torch.bfloat16, 5))
    peak = statistics.median(peaks)
    cpu = platform.processor() or platform.machine()
    print(f"\n{flops / 1e9:,.0f} GFLOP a step; bf16 GEMM peak at {', '.join('x'.join(map(str, s)) for s in shapes)}: "
          f"median {peak:,.0f} GFLOP/s over {len(peaks)} rounds (range {min(peaks):,.0f}-{max(peaks):,.0f}); {cpu}")
    print("| trainer.compile | chosen | ms / step (median) | GFLOP/s | % of bf16 GEMM peak | range over rounds |")
    print("|---|---|---|---|---|---|")
    for setting, values in steps.items():
        seconds = statistics.median(values)
        shares = [100 * flops / value / 1e9 / peak for value in values]
        print(f"| {setting} | {', '.join(map(str, choices[setting]))} | {1e3 * seconds:,.0f} | {flops / seconds / 1e9:,.0f} "
              f"| {100 * flops / seconds / 1e9 / peak:.0f}% | {min(shares):.0f}-{max(shares):.0f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
