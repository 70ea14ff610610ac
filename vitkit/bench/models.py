"""vitkit against timm per model, mode and precision, and levers toward the GEMM peak for one
bf16 training step (``vitkit benchmark --sections models levers``)."""

from __future__ import annotations

import copy
import os
import statistics
from collections.abc import Callable

import torch
from torch import nn

from ..kernels import AUTOTUNER, IMPL_ENV
from ..kernels.autotune import AutotuneKey
from ..models import create_model
from ..timing import interleaved_times, median_ratio, op_wall_times
from .gemm import gemm_calls, gemm_shapes, round_peaks
from .specs import parse_model_spec
from .steps import DTYPES, PRECISIONS, MergeTokens, Progress, batch_for, make_step, step_flops, twins


def chosen_kernel(model: nn.Module, asked: set[AutotuneKey]) -> str:
    """The kernel ``attn_impl="auto"`` ran in a cell whose calls asked the autotuner for the keys
    ``asked``: pinned by ``VITKIT_ATTN_IMPL`` (read when ``model`` was built), else the choices."""
    policies = {block.attn.attn_impl for block in model.blocks}
    if policies != {"auto"}:
        return "/".join(sorted(policies)) + (" (pinned)" if os.environ.get(IMPL_ENV) else "")
    kernels = {AUTOTUNER.choices[key].kernel for key in asked if key in AUTOTUNER.choices}
    return "/".join(sorted(kernels)) or "sdpa (not measured)"


def bench_models(specs: list[str], repeats: int, merge: MergeTokens | None = None, *,
                 progress: Progress = None) -> list[str]:
    """vitkit vs timm per model, mode and precision, with vitkit's achieved GFLOP/s and its share
    of this machine's GEMM peak at the model's own shapes (bf16 and float32 measured apart); with
    ``merge``, vitkit's models merge tokens (ToMe) and timm's do not; each row, once measured, also
    goes to ``progress``."""
    rows = [
        "| model | batch | mode | precision | vitkit kernel | vitkit img/s | timm img/s | vitkit/timm | vitkit GFLOP/s | % of GEMM peak |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    peaks = []
    for spec in specs:
        name, batch_size, overrides = parse_model_spec(spec)
        ours, theirs = twins(name, merge, **overrides)
        if overrides:
            name += " (" + ", ".join(f"{key}={value}" for key, value in overrides.items()) + ")"
        images, labels = batch_for(ours, batch_size)
        shapes = gemm_shapes(ours, batch_size)
        cell_peaks: dict[str, list[float]] = {precision: [] for precision in PRECISIONS}
        for mode in ("forward", "train"):
            flops = step_flops(ours, images, labels, mode)
            for precision in PRECISIONS:
                candidates = {"vitkit": make_step(ours, images, labels, mode, precision)}
                if theirs is not None:
                    candidates["timm"] = make_step(theirs, images, labels, mode, precision)
                with AUTOTUNER.recording() as asked:
                    times = interleaved_times({**candidates, **gemm_calls(shapes, DTYPES[precision])}, repeats=repeats)
                peak = statistics.median(round_peaks(times, shapes))
                cell_peaks[precision].append(peak)
                seconds = statistics.median(times["vitkit"])
                achieved = flops / seconds / 1e9
                timm_ips = f"{batch_size / statistics.median(times['timm']):.1f}" if theirs is not None else "n/a"
                ratio = f"{median_ratio(times, 'timm', 'vitkit'):.2f}" if theirs is not None else "n/a"
                kernel = chosen_kernel(ours, asked)
                rows.append(
                    f"| {name} | {batch_size} | {mode} | {precision} | {kernel} | {batch_size / seconds:.1f} | {timm_ips} "
                    f"| {ratio} | {achieved:,.0f} | {100 * achieved / peak:.0f}% |"
                )
                if progress is not None:
                    progress(rows[-1])
        peaks.append(f"| {name} | {batch_size} | {', '.join('x'.join(map(str, s)) for s in shapes)} "
                     + "".join(f"| {' / '.join(f'{p:,.0f}' for p in cell_peaks[precision])} " for precision in ("bf16", "fp32")) + "|")
    header = ["", "GEMM peak at each model's shapes (GFLOP/s; torch.mm at each M x K x N timed in the same rounds as "
              "each cell, the median of the rounds' best; forward cell / train cell):", "",
              "| model | batch | GEMM shapes (M x K x N) | bf16 | fp32 |", "|---|---|---|---|---|"]
    return rows + header + peaks


def bench_levers(spec: str, repeats: int, compile_lever: bool) -> list[str]:
    """Levers toward the GEMM peak for one bf16 training step, each measured against the baseline
    (bf16 autocast, explicit kernel, fused AdamW) in the same interleaved run, then the baseline's
    wall time of each operator (:func:`vitkit.bench.op_wall_times`): what bounds the step."""
    name, batch_size, overrides = parse_model_spec(spec)
    torch.manual_seed(0)
    base = create_model(name, **overrides)
    images, labels = batch_for(base, batch_size)
    flops = step_flops(base, images, labels, "train")

    def variant(kernel: str = "explicit", bf16_weights: bool = False, fused: bool = True, compiled: bool = False,
                precision: str = "bf16") -> Callable[[], None]:
        model = copy.deepcopy(base)
        for block in model.blocks:
            block.attn.attn_impl = kernel
        if bf16_weights:  # weights, gradients and optimiser state in bf16: no casts, no float32 master weights
            model = model.bfloat16()
        if compiled:
            model.compile()
        inputs = images.bfloat16() if bf16_weights else images
        return make_step(model, inputs, labels, "train", "fp32" if bf16_weights else precision, fused=fused)

    levers = {
        "baseline (autocast bf16, explicit, fused AdamW)": variant(),
        "SDPA kernel instead of explicit": variant(kernel="sdpa"),
        "foreach AdamW instead of fused": variant(fused=False),
        "trainer.precision=bf16-true (bf16 copy, float32 master weights)": variant(precision="bf16-true"),
        "bf16 weights and AdamW state, no master weights (Lightning's bf16-true)": variant(bf16_weights=True),
    }
    if compile_lever:
        levers["torch.compile (inductor), explicit kernel"] = variant(compiled=True)
    # The baseline again, last in every round: its ratio to the first shows the order effect of the
    # round (a shared machine, caches), which the levers' ratios carry too.
    levers["baseline again (last in each round)"] = variant()
    # The GEMM peak is timed in the same rounds (torch.mm at each of the step's shapes), so a
    # machine whose speed drifts moves the peak and the steps alike.
    shapes = gemm_shapes(base, batch_size)
    times = interleaved_times({**levers, **gemm_calls(shapes, torch.bfloat16)}, repeats=repeats, warmup=2)
    peaks = round_peaks(times, shapes)
    peak = statistics.median(peaks)
    baseline = next(iter(levers))
    rows = [f"Levers, {name} batch {batch_size}, bf16 training step: {flops / 1e9:.0f} GFLOP per step, "
            f"bf16 GEMM peak at its shapes {peak:,.0f} GFLOP/s (median of the rounds' best torch.mm, "
            f"range {min(peaks):,.0f}-{max(peaks):,.0f})", "",
            "| lever | ms / step | GFLOP/s | % of GEMM peak | speed-up vs baseline |", "|---|---|---|---|---|"]
    for lever in levers:
        seconds = times[lever]
        achieved = flops / statistics.median(seconds) / 1e9
        rows.append(f"| {lever} | {1e3 * statistics.median(seconds):.0f} | {achieved:,.0f} | {100 * achieved / peak:.0f}% "
                    f"| {median_ratio(times, baseline, lever):.2f} |")
    step_s, op_s = op_wall_times(levers[baseline])
    return rows + ["", f"Where one baseline step's time goes ({1e3 * step_s:.0f} ms; each operator's wall time, "
                   "read around its calls):", "", "| operator | ms | % of the step |", "|---|---|---|",
                   *(f"| {op} | {1e3 * seconds:.1f} | {100 * seconds / step_s:.1f}% |" for op, seconds in op_s.most_common(12))]
