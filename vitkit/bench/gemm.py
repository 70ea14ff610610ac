"""This machine's GEMM throughput at a model's own shapes: the bound a training step of those
shapes could approach, timed in the same interleaved rounds as the step it is compared with."""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
from torch import nn

from ..timing import interleaved_times


def gemm_shapes(model: nn.Module, batch_size: int) -> list[tuple[int, int, int]]:
    """The ``(M, K, N)`` of the model's token GEMMs at ``batch_size``: qkv, attention output
    projection, MLP in and out, each over all ``B x tokens`` rows at once."""
    config = model.config
    rows = batch_size * (math.prod(config.grid_size) + int(config.class_token))
    width, hidden = config.embed_dim, int(config.embed_dim * config.mlp_ratio)
    inner = config.heads_per_layer()[0] * config.resolved_head_dim()
    return sorted({(rows, width, 3 * inner), (rows, inner, width), (rows, width, hidden), (rows, hidden, width)})


def gemm_peak(shapes: list[tuple[int, int, int]], dtype: torch.dtype, repeats: int) -> float:
    """This machine's GEMM throughput at ``shapes``, in GFLOP/s: the best over the shapes of each
    shape's best time (of ``max(repeats, 5)``) for ``torch.mm``, the bound a training step of
    these shapes could approach."""
    return max(round_peaks(interleaved_times(gemm_calls(shapes, dtype), repeats=max(repeats, 5), warmup=2), shapes))


def gemm_calls(shapes: list[tuple[int, int, int]], dtype: torch.dtype,
               device: torch.device | None = None) -> dict[str, Callable[[], object]]:
    """One ``torch.mm`` per ``(M, K, N)`` shape, named ``"mm MxKxN"``, to time among other calls
    (:func:`round_peaks`); on a GPU each call waits for its product, so a clock around it reads
    the GEMM's time."""
    device = device if device is not None else torch.device("cpu")
    calls: dict[str, Callable[[], object]] = {}
    for rows, inner, cols in shapes:
        a, b = torch.randn(rows, inner, dtype=dtype, device=device), torch.randn(inner, cols, dtype=dtype, device=device)
        calls[f"mm {rows}x{inner}x{cols}"] = partial(_mm_waited, a, b) if device.type == "cuda" else partial(torch.mm, a, b)
    return calls


def _mm_waited(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    product = torch.mm(a, b)
    torch.cuda.synchronize(a.device)
    return product


def round_peaks(times: dict[str, list[float]], shapes: list[tuple[int, int, int]]) -> list[float]:
    """The GEMM peak of each round of an interleaved run that timed :func:`gemm_calls` of
    ``shapes``: the best GFLOP/s over the shapes in that round. Timed in the same rounds as the
    steps it is compared with, the peak drifts with them on a machine whose speed drifts."""
    labels = {f"mm {m}x{k}x{n}": 2 * m * k * n for m, k, n in shapes}
    return [max(flops / times[label][round_] / 1e9 for label, flops in labels.items())
            for round_ in range(len(times[next(iter(labels))]))]
