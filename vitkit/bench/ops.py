"""Single operators: SDPA against the explicit attention kernel at ViT shapes, and a linear layer
under bf16 autocast (float32 weights, cast every call) against pure bfloat16."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch
from torch import nn

from ..kernels import explicit_attention, sdpa_attention
from ..timing import interleaved_times, median_ratio
from .steps import DTYPES, PRECISIONS, Progress, autocast


def kernel_call(kernel: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, train: bool) -> Callable[[], None]:
    """One attention call of ``kernel`` on ``[B, H, N, d]`` tensors, with the backward when ``train``."""

    def call() -> None:
        with torch.set_grad_enabled(train):
            out = kernel(q, k, v, None, 0.0, q.shape[-1] ** -0.5)
            out = out[0] if isinstance(out, tuple) else out
        if train:
            out.float().sum().backward()

    return call


def bench_kernels(repeats: int, *, progress: Progress = None) -> list[str]:
    """SDPA vs the explicit kernel at ViT shapes, at full size and with more repeats than the
    autotuner behind ``attn_impl="auto"`` spends on each key; each row, once measured, also goes to ``progress``."""
    rows = ["| B x H x N x d | precision | mode | sdpa ms | explicit ms | sdpa/explicit |", "|---|---|---|---|---|---|"]
    for batch, heads, tokens, dim in ((64, 4, 17, 64), (128, 4, 65, 64), (32, 6, 197, 64)):
        for precision in PRECISIONS:
            dtype = DTYPES[precision]
            for mode in ("forward", "train"):
                q, k, v = (torch.randn(batch, heads, tokens, dim, dtype=dtype, requires_grad=mode == "train") for _ in range(3))
                calls = {name: kernel_call(kernel, q, k, v, mode == "train") for name, kernel in
                         (("sdpa", sdpa_attention), ("explicit", explicit_attention))}
                times = interleaved_times(calls, repeats=repeats)
                rows.append(f"| {batch}x{heads}x{tokens}x{dim} | {precision} | {mode} " + pair_cells(times, "sdpa", "explicit"))
                if progress is not None:
                    progress(rows[-1])
    return rows


def bench_casts(repeats: int, *, progress: Progress = None) -> list[str]:
    """``linear`` forward + backward: float32 weights under bf16 autocast vs pure bfloat16; each
    row, once measured, also goes to ``progress``."""
    rows = ["| tokens x in -> out | autocast ms | pure bf16 ms | autocast / pure |", "|---|---|---|---|"]
    for tokens, width_in, width_out in ((128 * 65, 384, 1152), (128 * 65, 384, 1536), (32 * 197, 384, 1152)):
        x = torch.randn(tokens, width_in, dtype=torch.bfloat16, requires_grad=True)  # activations: bf16 either way

        def step(layer: nn.Linear, inputs: torch.Tensor, precision: str) -> Callable[[], None]:
            def call() -> None:
                with autocast(precision):
                    out = layer(inputs)
                out.float().sum().backward()

            return call

        times = interleaved_times(
            {
                "autocast": step(nn.Linear(width_in, width_out), x, "bf16"),
                "pure": step(nn.Linear(width_in, width_out).bfloat16(), x, "fp32"),  # fp32: autocast off
            },
            repeats=repeats,
        )
        rows.append(f"| {tokens} x {width_in} -> {width_out} " + pair_cells(times, "autocast", "pure"))
        if progress is not None:
            progress(rows[-1])
    return rows


def pair_cells(times: dict[str, list[float]], first: str, second: str) -> str:
    """The cells ``| first ms | second ms | first/second |`` of two interleaved calls' medians."""
    return (f"| {1e3 * statistics.median(times[first]):.2f} | {1e3 * statistics.median(times[second]):.2f} "
            f"| {median_ratio(times, first, second):.2f} |")
