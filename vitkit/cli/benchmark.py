"""vitkit vs timm, side by side on this machine: throughput, attention kernels, training memory,
and the input pipeline on its own.

    vitkit benchmark                      # everything, Markdown tables on stdout
    vitkit benchmark --sections models --models vit_cifar_small:128 --repeats 3

Both libraries run the same architecture with the same weights (``vitkit.models.to_timm``). Times
are medians over interleaved vitkit/timm pairs (``vitkit.timing``); a ratio > 1 means vitkit is
faster. Each models row names the attention kernel vitkit's ``attn_impl="auto"`` measured and
chose for that cell, vitkit's achieved GFLOP/s (``torch.utils.flop_counter``) and its share of
this machine's GEMM peak at the model's own shapes (``torch.mm`` at each M x K x N, timed in
the same interleaved rounds as the cell, the median of the rounds' best); the GEMM peaks and the
autotuner's full report follow the table. The levers section times changes to the bf16 training
step side by side and splits its time by operator.
Training memory is measured in fresh processes as the peak resident size during one training step
minus the resident size just before it (after a warm-up step, with glibc's mmap threshold fixed
so freed activations go back to the OS). The casts section times one ``linear`` forward + backward
in pure bfloat16 against the same layer under bfloat16 autocast with float32 weights, which casts
the weights on every call: the cost mixed precision pays for its float32 master weights.

The measurements are :mod:`vitkit.bench`'s; this module reads the options and prints the tables.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

from vitkit.bench.data import bench_data, bench_folder_loaders
from vitkit.bench.memory import bench_memory
from vitkit.bench.models import bench_levers, bench_models
from vitkit.bench.onnx_runtime import bench_onnx
from vitkit.bench.ops import bench_casts, bench_kernels
from vitkit.errors import UsageError
from vitkit.kernels import autotune_report, cpu_model, format_autotune_report

from .commands import run_command


def to_stderr(row: str) -> None:
    """Show a table's row as soon as it is measured (the tables print on stdout once complete)."""
    print(row, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    """``vitkit benchmark`` in this process (``tools/benchmark.py``, tests)."""
    return run_command("benchmark", run, argv)


def run(args: argparse.Namespace) -> None:
    if args.onnx_model and "onnx" not in args.sections:
        raise UsageError(f"--onnx-model is measured by the onnx section: add --sections onnx (asked for: "
                         f"{' '.join(args.sections)}).")
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs\n")
    if "kernels" in args.sections:
        print("\n".join(["Attention kernels (medians):", ""] + bench_kernels(args.repeats, progress=to_stderr)) + "\n")
    if "models" in args.sections:
        merged = f" (vitkit merging tokens: --merge-tokens {args.merge_tokens[0]})" if args.merge_tokens else ""
        print("\n".join([f"vitkit vs timm, same weights{merged} (images/s, medians of interleaved pairs):", ""]
                        + bench_models(args.models, args.repeats, args.merge_tokens, progress=to_stderr)) + "\n")
        print("\n".join(["Attention autotuner (best times per call; speed-up = SDPA / explicit):", "", format_autotune_report(autotune_report())]) + "\n")
    if "levers" in args.sections:
        print("\n".join(bench_levers(args.levers_model, args.repeats, args.levers_compile)) + "\n")
    if "casts" in args.sections:
        print("\n".join(["Linear forward + backward, bf16 autocast (float32 weights) vs pure bf16 (medians):", ""]
                        + bench_casts(args.repeats, progress=to_stderr)) + "\n")
    if "memory" in args.sections:
        print("\n".join(bench_memory(args.memory_model, args.repeats)) + "\n")
    if "onnx" in args.sections:
        print("\n".join(bench_onnx(args.repeats, args.onnx_model, merge=args.merge_tokens)) + "\n")
    if "data" in args.sections:
        print("\n".join(bench_data(args.repeats)) + "\n")
        print("\n".join(bench_folder_loaders(args.repeats)))
