"""Issue 50 item 3: how fast each GEMM of a bf16 training step runs inside the step, against the
same call timed on its own right after.

    python dev/step_gemms.py                      # ViT-S/4 at 32 px, batch 128, explicit kernel

One training step (bf16 autocast, fused AdamW, as ``vitkit benchmark --sections levers`` times
it) runs under a dispatch mode that reads the clock around every ``mm``, ``addmm`` and ``bmm``
and keeps each call's shapes, strides and dtypes. Each distinct call is then rerun on fresh random
tensors of the same layout (best of 3). Prints one Markdown row per distinct call, slowest first:
its count per step, milliseconds in the step, GFLOP/s in the step and alone, and the layout. A
transposed operand shows as a stride of 1 on the first axis: ``(1, 384)`` for ``[384, 8320]`` is
the token axis read across rows (the weight gradient ``grad_out^T @ input``).
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from typing import Any

import torch

import vitkit
from vitkit.bench.specs import parse_model_spec
from vitkit.bench.steps import batch_for, make_step
from vitkit.timing import OpClock, interleaved_times

GEMMS = ("mm", "addmm", "bmm")
Layout = tuple[tuple[int, ...], tuple[int, ...], torch.dtype]


def gemm_layouts(func: Any, args: tuple) -> tuple[str, tuple[Layout, ...]] | None:
    """An :class:`~vitkit.timing.OpClock` key: a GEMM call's operator and operand layouts; other calls: ``None``."""
    name = func.overloadpacket.__name__
    if name not in GEMMS:
        return None
    return name, tuple((tuple(a.shape), tuple(a.stride()), a.dtype) for a in args if isinstance(a, torch.Tensor))


def gemm_flops(name: str, layouts: tuple[Layout, ...]) -> int:
    """Multiply-adds x 2 of one call (``addmm``'s bias is its first operand)."""
    a, b = (shape for shape, _, _ in (layouts[1:] if name == "addmm" else layouts))
    return 2 * a[0] * a[1] * a[2] * b[2] if name == "bmm" else 2 * a[0] * a[1] * b[1]


def alone(name: str, layouts: tuple[Layout, ...]) -> float:
    """Best of 3 seconds for the call on fresh random tensors with the same shapes and strides."""
    def tensor(shape: tuple[int, ...], stride: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        size = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        return torch.randn(size, dtype=dtype).as_strided(shape, stride)

    operands = [tensor(*layout) for layout in layouts]
    return min(interleaved_times({name: partial(getattr(torch, name), *operands)}, repeats=3)[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="vit_small_patch16_224:128:img_size=32,patch_size=4,num_classes=10",
                        help="NAME:BATCH[:overrides]")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    vitkit.keep_freed_memory()
    name, batch_size, overrides = parse_model_spec(args.model)
    torch.manual_seed(0)
    model = vitkit.create_model(name, attn_impl="explicit", **overrides)
    images, labels = batch_for(model, batch_size)
    step = make_step(model, images, labels, "train", "bf16", fused=True)
    step()
    step()
    clock = OpClock(key=gemm_layouts)
    started = time.perf_counter()
    with clock:
        step()
    step_s = time.perf_counter() - started
    rows = []
    for (op, layouts), seconds in clock.seconds.items():
        count, flops = clock.calls[op, layouts], gemm_flops(op, layouts)
        rows.append((seconds, op, count, flops * count / seconds / 1e9,
                     flops / alone(op, layouts) / 1e9, ", ".join(f"{list(s)} strides {list(st)}" for s, st, _ in layouts)))
    rows.sort(reverse=True)
    print(f"# {args.model}: one bf16 training step {1e3 * step_s:.0f} ms, its GEMMs {1e3 * sum(r[0] for r in rows):.0f} ms")
    print("| op | calls | ms in the step | GFLOP/s in the step | GFLOP/s alone | operands |")
    print("|---|---|---|---|---|---|")
    for seconds, op, count, in_step, by_itself, operands in rows:
        print(f"| {op} | {count} | {1e3 * seconds:.0f} | {in_step:,.0f} | {by_itself:,.0f} | {operands} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
