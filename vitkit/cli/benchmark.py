"""vitkit vs timm, side by side on this machine: throughput, attention kernels, training memory,
and the input pipeline on its own.

    vitkit benchmark                      # everything, Markdown tables on stdout
    vitkit benchmark --sections models --models vit_cifar_small:128 --repeats 3

Both libraries run the same architecture with the same weights (``vitkit.models.to_timm``). Times
are medians over interleaved vitkit/timm pairs (``vitkit.bench``); a ratio > 1 means vitkit is
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
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit.bench import interleaved_times, median_ratio, op_wall_times
from vitkit.errors import UsageError
from vitkit.io import load_model_and_extra
from vitkit.kernels import (
    AUTOTUNER,
    IMPL_ENV,
    autotune_report,
    cpu_model,
    explicit_attention,
    format_autotune_report,
    sdpa_attention,
)
from vitkit.kernels.autotune import AutotuneKey
from vitkit.models import to_timm

from .commands import run_command
from .parsers import parse_model_spec

PRECISIONS = ("fp32", "bf16")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
#: ``--merge-tokens``: ``(r, schedule)`` for :func:`vitkit.merge_tokens`.
MergeTokens = tuple[int | list[int], str]


def autocast(precision: str) -> torch.autocast:
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")


def make_step(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mode: str, precision: str, fused: bool = True
) -> Callable[[], None]:
    """A closure running one inference forward or one AdamW training step (fused AdamW, as vitkit's
    training uses, unless ``fused`` is False: torch's foreach implementation). ``precision``:
    ``"fp32"``, ``"bf16"`` (autocast) or, for training, ``"bf16-true"`` (``trainer.precision:
    bf16-true``: the step runs a :class:`~vitkit.train.pure_bf16.PureBf16` copy and AdamW updates
    the float32 model)."""
    if mode == "forward":
        model.eval()

        def forward() -> None:
            with torch.inference_mode(), autocast(precision):
                model(images)

        return forward
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused or None)
    pure = None
    if precision == "bf16-true":
        from vitkit.train.pure_bf16 import PureBf16  # Lightning's import only where it is used

        pure = PureBf16(model)

    def train_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        if pure is not None:
            pure.load_weights()
        with autocast(precision):
            loss = F.cross_entropy((model if pure is None else pure)(images), labels)
        loss.backward()
        if pure is not None:
            pure.move_grads()
        optimizer.step()

    return train_step


def twins(name: str, merge: MergeTokens | None = None, **overrides: int | bool) -> tuple[nn.Module, nn.Module | None]:
    """A vitkit model (variant ``name`` with ``ViTConfig`` ``overrides``) and the timm model with
    the same weights (``None`` where timm has no equivalent: shifted patches, locality attention);
    with ``merge``, the vitkit model merges tokens (:func:`vitkit.merge_tokens`) and timm's does not."""
    torch.manual_seed(0)
    model = vitkit.create_model(name, **overrides)
    try:
        twin = to_timm(model)
    except ValueError:
        twin = None
    return (model if merge is None else vitkit.merge_tokens(model, *merge)), twin


def batch_for(model: nn.Module, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    config = model.config
    images = torch.randn(batch_size, config.in_chans, *config.img_size)
    return images, torch.randint(0, config.num_classes, (batch_size,))


def chosen_kernel(model: nn.Module, asked: set[AutotuneKey]) -> str:
    """The kernel ``attn_impl="auto"`` ran in a cell whose calls asked the autotuner for the keys
    ``asked``: pinned by ``VITKIT_ATTN_IMPL`` (read when ``model`` was built), else the choices."""
    policies = {block.attn.attn_impl for block in model.blocks}
    if policies != {"auto"}:
        return "/".join(sorted(policies)) + (" (pinned)" if os.environ.get(IMPL_ENV) else "")
    kernels = {AUTOTUNER.choices[key].kernel for key in asked if key in AUTOTUNER.choices}
    return "/".join(sorted(kernels)) or "sdpa (not measured)"


def bench_models(specs: list[str], repeats: int, merge: MergeTokens | None = None) -> list[str]:
    """vitkit vs timm per model, mode and precision, with vitkit's achieved GFLOP/s and its share
    of this machine's GEMM peak at the model's own shapes (bf16 and float32 measured apart); with
    ``merge``, vitkit's models merge tokens (ToMe) and timm's do not."""
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
                print(rows[-1], file=sys.stderr, flush=True)
        peaks.append(f"| {name} | {batch_size} | {', '.join('x'.join(map(str, s)) for s in shapes)} "
                     + "".join(f"| {' / '.join(f'{p:,.0f}' for p in cell_peaks[precision])} " for precision in ("bf16", "fp32")) + "|")
    header = ["", "GEMM peak at each model's shapes (GFLOP/s; torch.mm at each M x K x N timed in the same rounds as "
              "each cell, the median of the rounds' best; forward cell / train cell):", "",
              "| model | batch | GEMM shapes (M x K x N) | bf16 | fp32 |", "|---|---|---|---|---|"]
    return rows + header + peaks


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


def step_flops(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, mode: str) -> int:
    """FLOPs of one forward (``mode="forward"``) or forward + backward, counted by
    ``torch.utils.flop_counter`` with the explicit kernel (its matmuls are counted on every
    device; a fused SDPA call on the CPU may not be), so the count does not depend on the kernel."""
    policies = [block.attn.attn_impl for block in model.blocks]
    for block in model.blocks:
        block.attn.attn_impl = "explicit"
    try:
        with FlopCounterMode(display=False) as counter:
            with torch.set_grad_enabled(mode == "train"):
                loss = F.cross_entropy(model(images), labels)
            if mode == "train":
                loss.backward()
        model.zero_grad(set_to_none=True)
    finally:
        for block, policy in zip(model.blocks, policies):
            block.attn.attn_impl = policy
    return counter.get_total_flops()


def bench_levers(spec: str, repeats: int, compile_lever: bool) -> list[str]:
    """Levers toward the GEMM peak for one bf16 training step, each measured against the baseline
    (bf16 autocast, explicit kernel, fused AdamW) in the same interleaved run, then the baseline's
    wall time of each operator (:func:`vitkit.bench.op_wall_times`): what bounds the step."""
    name, batch_size, overrides = parse_model_spec(spec)
    torch.manual_seed(0)
    base = vitkit.create_model(name, **overrides)
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


def kernel_call(kernel: Callable, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, train: bool) -> Callable[[], None]:
    """One attention call of ``kernel`` on ``[B, H, N, d]`` tensors, with the backward when ``train``."""

    def call() -> None:
        with torch.set_grad_enabled(train):
            out = kernel(q, k, v, None, 0.0, q.shape[-1] ** -0.5)
            out = out[0] if isinstance(out, tuple) else out
        if train:
            out.float().sum().backward()

    return call


def bench_kernels(repeats: int) -> list[str]:
    """SDPA vs the explicit kernel at ViT shapes, at full size and with more repeats than the
    autotuner behind ``attn_impl="auto"`` spends on each key."""
    rows = ["| B x H x N x d | precision | mode | sdpa ms | explicit ms | sdpa/explicit |", "|---|---|---|---|---|---|"]
    for batch, heads, tokens, dim in ((64, 4, 17, 64), (128, 4, 65, 64), (32, 6, 197, 64)):
        for precision in PRECISIONS:
            dtype = DTYPES[precision]
            for mode in ("forward", "train"):
                q, k, v = (torch.randn(batch, heads, tokens, dim, dtype=dtype, requires_grad=mode == "train") for _ in range(3))
                calls = {name: kernel_call(kernel, q, k, v, mode == "train") for name, kernel in
                         (("sdpa", sdpa_attention), ("explicit", explicit_attention))}
                times = interleaved_times(calls, repeats=repeats)
                rows.append(
                    f"| {batch}x{heads}x{tokens}x{dim} | {precision} | {mode} | {1e3 * statistics.median(times['sdpa']):.2f} "
                    f"| {1e3 * statistics.median(times['explicit']):.2f} | {median_ratio(times, 'sdpa', 'explicit'):.2f} |"
                )
                print(rows[-1], file=sys.stderr, flush=True)
    return rows


def bench_casts(repeats: int) -> list[str]:
    """``linear`` forward + backward: float32 weights under bf16 autocast vs pure bfloat16."""
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
        rows.append(
            f"| {tokens} x {width_in} -> {width_out} | {1e3 * statistics.median(times['autocast']):.2f} "
            f"| {1e3 * statistics.median(times['pure']):.2f} | {median_ratio(times, 'autocast', 'pure'):.2f} |"
        )
        print(rows[-1], file=sys.stderr, flush=True)
    return rows


def memory_child(name: str, batch_size: int, library: str, checkpointing: bool) -> None:
    """Fresh process: one warm-up step, then report the extra resident memory of one training step."""
    ours, theirs = twins(name)
    model = ours if library == "vitkit" else theirs
    model.set_grad_checkpointing(checkpointing)
    images, labels = batch_for(ours, batch_size)
    step = make_step(model, images, labels, "train", "fp32")
    step()  # warm-up: optimizer state, lazily imported modules, allocator pools
    with open("/proc/self/clear_refs", "w") as handle:  # reset the peak resident size (VmHWM)
        handle.write("5")
    baseline = _status_kib("VmRSS")
    step()
    print(json.dumps({"step_mib": (_status_kib("VmHWM") - baseline) / 1024}))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def bench_memory(spec: str, repeats: int) -> list[str]:
    name, batch_size = spec.split(":")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    measured: dict[tuple[str, bool], float] = {}
    for library in ("vitkit", "timm"):
        for checkpointing in (False, True):
            args = [sys.executable, "-m", "vitkit.cli.main", "benchmark", "--memory-child", name, batch_size, library,
                    str(int(checkpointing))]
            out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
            measured[library, checkpointing] = json.loads(out.strip().splitlines()[-1])["step_mib"]
    ours, _ = twins(name)
    images, labels = batch_for(ours, int(batch_size))
    plain = make_step(ours, images, labels, "train", "fp32")
    checkpointed_model = vitkit.create_model(name)
    checkpointed_model.set_grad_checkpointing(True)
    checkpointed = make_step(checkpointed_model, images, labels, "train", "fp32")
    slowdown = median_ratio(interleaved_times({"plain": plain, "ckpt": checkpointed}, repeats=repeats), "ckpt", "plain")
    rows = [
        f"Training-step memory, {name}, batch {batch_size}, fp32 (MiB added by one step):",
        "",
        "| library | no checkpointing | checkpointing | saved |",
        "|---|---|---|---|",
    ]
    for library in ("vitkit", "timm"):
        off, on = measured[library, False], measured[library, True]
        rows.append(f"| {library} | {off:.0f} | {on:.0f} | {100 * (1 - on / off):.0f}% |")
    rows += ["", f"vitkit step time with / without checkpointing: {slowdown:.2f}x"]
    return rows


def bench_data(repeats: int) -> list[str]:
    """Input pipeline alone: in-memory images per second through the batched transform and through
    the per-image albumentations pipeline (same pad-crop + flip + Normalize), and shapes generation."""
    from torch.utils.data import DataLoader

    from vitkit.data import ArrayDataset, AugmentConfig, build_train_transform, generate_shapes
    from vitkit.data.batch_transforms import build_batch_transform
    from vitkit.data.info import DataInfo

    info = DataInfo(10, tuple("abcdefghij"), (28, 28), 1, (0.5,), (0.25,), "bench")
    augment = AugmentConfig(crop="pad", padding=2, hflip=0.5)
    images = torch.randint(0, 256, (8192, 28, 28, 1), dtype=torch.uint8).numpy()
    labels = torch.randint(0, 10, (8192,)).numpy()
    datasets = {
        "batched (torch)": ArrayDataset(images, labels, build_train_transform(augment, info),
                                        build_batch_transform(augment, info, (28, 28))),
        "per image (albumentations)": ArrayDataset(images, labels, build_train_transform(augment, info)),
    }

    def epoch(dataset: ArrayDataset) -> Callable[[], None]:
        def run() -> None:
            for _ in DataLoader(dataset, batch_size=128, shuffle=True, drop_last=True):
                pass

        return run

    times = interleaved_times({name: epoch(d) for name, d in datasets.items()}, repeats=repeats, warmup=1)
    rows = ["| input pipeline (28x28x1, pad-crop + flip + Normalize, 1 process) | images/s |", "|---|---|"]
    rows += [f"| {name} | {8064 / statistics.median(times[name]):,.0f} |" for name in datasets]
    shapes = interleaved_times({"shapes": lambda: generate_shapes(6000, 32, seed=0)}, repeats=repeats, warmup=0)
    rows.append(f"| generate_shapes, 6000 images of 32x32 | {statistics.median(shapes['shapes']):.2f} s |")
    return rows


#: Images/s a modern GPU trains ViT-S/16 at (issue 37): the loader must reach it with its workers.
GPU_FEED = 3000


def write_jpeg_folder(root: Path, count: int, size: tuple[int, int] = (500, 375), classes: int = 2) -> Path:
    """``root/train/<class>/*.jpg``: ``count`` photo-like JPEGs of ``size`` (W, H) (smooth colour
    gradients with fine noise, quality 90, as an ImageNet photo is typically stored), and one per
    class in ``root/val/``; returns ``root``."""
    import numpy as np
    from PIL import Image

    generator = np.random.default_rng(0)
    width, height = size
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for index in range(count):
        folder = root / "train" / f"class_{index % classes}"
        folder.mkdir(parents=True, exist_ok=True)
        base = generator.uniform(0, 255, 3) + 80 * np.sin(xx[..., None] / generator.uniform(20, 80, 3))
        base += 60 * np.cos(yy[..., None] / generator.uniform(20, 80, 3)) + generator.normal(0, 12, (height, width, 3))
        picture = Image.fromarray(np.clip(base, 0, 255).astype(np.uint8))
        picture.save(folder / f"{index}.jpg", quality=90)
        if index < classes:
            (root / "val" / folder.name).mkdir(parents=True, exist_ok=True)
            picture.save(root / "val" / folder.name / f"{index}.jpg", quality=90)
    return root


def folder_loaders(root: Path, img_size: int, batch_size: int, workers: int) -> dict[str, Iterable[Any]]:
    """The same folder through vitkit's training loader (``imagefolder``: decode, random-resized
    crop, flip, normalise), timm's ``create_loader`` (its training transform, no prefetcher) and
    torchvision's ``ImageFolder`` with v2 transforms, each with ``workers`` worker processes."""
    import timm.data
    from torch.utils.data import DataLoader
    from torchvision import datasets
    from torchvision.transforms import v2

    from vitkit.data import DataConfig, build_datasets

    train = build_datasets(DataConfig(name="imagefolder", root=str(root), img_size=img_size, num_workers=workers)).train
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    timm_set = timm.data.create_dataset("", root=str(root / "train"))
    tv_transform = v2.Compose([v2.ToImage(), v2.RandomResizedCrop(img_size, antialias=True), v2.RandomHorizontalFlip(),
                               v2.ToDtype(torch.float32, scale=True), v2.Normalize(mean, std)])
    common = dict(batch_size=batch_size, num_workers=workers, persistent_workers=workers > 0, drop_last=True)
    return {
        "vitkit (imagefolder recipe)": DataLoader(train, shuffle=True, **common),
        "timm create_loader": timm.data.create_loader(
            timm_set, input_size=(3, img_size, img_size), batch_size=batch_size, is_training=True, num_workers=workers,
            use_prefetcher=False, mean=mean, std=std, persistent_workers=workers > 0),
        "torchvision ImageFolder + v2": DataLoader(datasets.ImageFolder(str(root / "train"), tv_transform), shuffle=True,
                                                   **common),
    }


def bench_folder_loaders(repeats: int, count: int = 192, img_size: int = 224, workers: tuple[int, ...] = (1, 2),
                         batch_size: int = 32) -> list[str]:
    """Images/s per worker of the ImageNet-style folder loaders (:func:`folder_loaders`) on
    ``count`` 500x375 JPEGs written here, for each worker count, epochs interleaved; and the
    workers each would need to feed :data:`GPU_FEED` images/s."""
    import tempfile

    rows = [f"| folder loader ({count} JPEGs of 500x375 -> {img_size} px, random-resized crop + flip + normalise) "
            "| workers | images/s | images/s per worker | vs timm |", "|---|---|---|---|---|"]
    best: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="vitkit-bench-") as folder:
        root = write_jpeg_folder(Path(folder), count)
        for count_workers in workers:
            loaders = folder_loaders(root, img_size, batch_size, count_workers)
            images = {name: sum(len(batch[0]) for batch in loader) for name, loader in loaders.items()}  # warm-up epoch

            def epoch(loader: Iterable[Any]) -> Callable[[], None]:
                return lambda: [None for _ in loader]

            times = interleaved_times({name: epoch(loader) for name, loader in loaders.items()}, repeats=repeats, warmup=0)
            timm_rate = images["timm create_loader"] / statistics.median(times["timm create_loader"])
            for name in loaders:
                rate = images[name] / statistics.median(times[name])
                per_worker = rate / max(count_workers, 1)  # 0 workers: the main process loads
                best[name] = max(best.get(name, 0.0), per_worker)
                rows.append(f"| {name} | {count_workers} | {rate:,.0f} | {per_worker:,.0f} | {rate / timm_rate:.2f} |")
    rows += ["", f"Workers to feed {GPU_FEED:,} images/s (at the best rate per worker above): "
             + ", ".join(f"{name} {math.ceil(GPU_FEED / rate)}" for name, rate in best.items())]
    return rows


#: The onnx section's models without ``--onnx-model`` (random weights): the Fashion-MNIST fast
#: recipe's architecture, and ViT-S/16 at 224 px.
ONNX_MODELS = {
    "Fashion-MNIST fast's ViT (conv stem, 4 blocks, 128 wide, 32 px)": dict(
        name="vit_cifar_tiny", img_size=32, in_chans=1, num_classes=10, patch_size=8, patch_embed="conv",
        embed_dim=128, depth=4, num_heads=4, locality=True),
    "ViT-S/16 (224 px)": dict(name="vit_small_patch16_224", num_classes=1000),
}


def bench_onnx(repeats: int, model_file: str | None = None, batches: tuple[int, ...] = (1, 64),
               models: dict[str, dict[str, Any]] | None = None, merge: MergeTokens | None = None) -> list[str]:
    """Images/s of vitkit eager (float32, bf16 autocast) and onnxruntime (float32, dynamic int8) at
    each batch size, interleaved per model: ``model_file`` alone (a trained model, named by its file
    and shape, with the top-1 of each runtime on the images ``vitkit evaluate`` scores, as it scores
    them), else ``models`` (:data:`ONNX_MODELS`: random weights, speed only); with ``merge``, every
    model merges tokens (:func:`vitkit.merge_tokens`)."""
    import tempfile

    from vitkit.export import OnnxClassifier, export_onnx, quantize_dynamic

    rows = [f"onnxruntime {_ort_version()}, {torch.get_num_threads()} threads", "",
            "| model | batch | vitkit fp32 | vitkit bf16 | onnxruntime fp32 | onnxruntime int8 | int8 / vitkit fp32 |",
            "|---|---|---|---|---|---|---|"]
    accuracy_rows: list[str] = []
    with tempfile.TemporaryDirectory(prefix="vitkit-onnx-bench-") as folder:
        for label, (model, extra) in _onnx_models(model_file, models, merge):
            float_path = export_onnx(model, Path(folder) / f"{len(rows)}.onnx", extra=extra)
            int8_path = quantize_dynamic(float_path, Path(folder) / f"{len(rows)}-int8.onnx")
            runners = {"onnxruntime fp32": OnnxClassifier(float_path), "onnxruntime int8": OnnxClassifier(int8_path)}
            for batch in batches:
                images = torch.randn(batch, model.config.in_chans, *model.config.img_size)

                calls = {"vitkit fp32": _eager(model, images, False), "vitkit bf16": _eager(model, images, True),
                         **{name: (lambda r=runner, x=images: r(x)) for name, runner in runners.items()}}
                times = interleaved_times(calls, repeats=repeats, warmup=1)
                rate = {name: batch / statistics.median(seconds) for name, seconds in times.items()}
                rows.append(f"| {label} | {batch} | " + " | ".join(f"{rate[name]:,.0f}" for name in calls)
                            + f" | {rate['onnxruntime int8'] / rate['vitkit fp32']:.2f} |")
            if model_file is not None:
                accuracy_rows = _onnx_accuracy(model, extra, model_file, runners)
    return rows + ["", "images/s, median of interleaved rounds"] + accuracy_rows


def _onnx_models(model_file: str | None, models: dict[str, dict[str, Any]] | None, merge: MergeTokens | None
                 ) -> Iterator[tuple[str, tuple[vitkit.VisionTransformer, dict[str, Any]]]]:
    """``(label, (model in eval mode, its metadata))`` of what the onnx section times: the model
    of ``model_file`` alone, named by its file and shape, else each of ``models`` (random weights)."""
    if model_file is not None:
        model, extra = load_model_and_extra(model_file)
        config = model.config
        height, width = config.img_size
        shape = f"{config.depth} blocks, {config.embed_dim} wide, {height}x{width} px, {config.num_classes} classes"
        models_built = [(f"{Path(model_file).name} ({shape})", (model, extra))]
    else:
        models_built = [(label, (vitkit.create_model(**spec), {}))
                        for label, spec in (models if models is not None else ONNX_MODELS).items()]
    for label, (model, extra) in models_built:
        model.eval()
        if merge is not None:
            vitkit.merge_tokens(model, *merge)
        yield label, (model, extra)


def _eager(model: nn.Module, images: torch.Tensor, bf16: bool) -> Callable[[], None]:
    """One inference-mode forward of ``model`` on ``images``, float32 or under bf16 autocast."""
    def step() -> None:
        with torch.inference_mode(), torch.autocast("cpu", torch.bfloat16, enabled=bf16):
            model(images)

    return step


def _onnx_accuracy(model: nn.Module, extra: dict[str, Any], model_file: str,
                   runners: dict[str, Callable[[torch.Tensor], torch.Tensor]]) -> list[str]:
    """Top-1 of vitkit float32 and each onnxruntime graph on what ``vitkit evaluate MODEL_FILE``
    scores, as it scores it: its test split and the test-time augmentation the file records
    (:func:`vitkit.train.eval_report.evaluation_data`, :func:`vitkit.evaluation.evaluate_model`)."""
    from torch.utils.data import DataLoader

    from vitkit.evaluation import black_level, evaluate_model, recorded_tta
    from vitkit.train.eval_report import evaluation_data

    dataset, info, _ = evaluation_data(model, extra)
    tta, loader = recorded_tta(extra, model_file), DataLoader(dataset, batch_size=256)
    top1 = {name: evaluate_model(run, loader, tta=tta, fill=black_level(info.mean, info.std)).top1
            for name, run in (("vitkit fp32", model), *runners.items())}
    views = "" if tta == "none" else f", {tta} views averaged as vitkit evaluate does"
    return ["", f"| test accuracy ({len(dataset):,} images{views}) | " + " | ".join(top1) + " |",
            "|---|" + "---|" * len(top1),
            "| top-1 | " + " | ".join(f"{value:.2f}%" for value in top1.values()) + " |"]


def _ort_version() -> str:
    from vitkit.errors import require

    return require("onnxruntime", "onnx", "the onnx section").__version__


def main(argv: list[str] | None = None) -> int:
    """``vitkit benchmark`` in this process (``tools/benchmark.py``, tests)."""
    return run_command("benchmark", run, argv)


def run(args: argparse.Namespace) -> None:
    if args.onnx_model and "onnx" not in args.sections:
        raise UsageError(f"--onnx-model is measured by the onnx section: add --sections onnx (asked for: "
                         f"{' '.join(args.sections)}).")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        name, batch_size, library, checkpointing = args.memory_child
        memory_child(name, int(batch_size), library, checkpointing == "1")
        return
    print(f"{cpu_model()}, torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs\n")
    if "kernels" in args.sections:
        print("\n".join(["Attention kernels (medians):", ""] + bench_kernels(args.repeats)) + "\n")
    if "models" in args.sections:
        merged = f" (vitkit merging tokens: --merge-tokens {args.merge_tokens[0]})" if args.merge_tokens else ""
        print("\n".join([f"vitkit vs timm, same weights{merged} (images/s, medians of interleaved pairs):", ""]
                        + bench_models(args.models, args.repeats, args.merge_tokens)) + "\n")
        print("\n".join(["Attention autotuner (best times per call; speed-up = SDPA / explicit):", "", format_autotune_report(autotune_report())]) + "\n")
    if "levers" in args.sections:
        print("\n".join(bench_levers(args.levers_model, args.repeats, args.levers_compile)) + "\n")
    if "casts" in args.sections:
        print("\n".join(["Linear forward + backward, bf16 autocast (float32 weights) vs pure bf16 (medians):", ""] + bench_casts(args.repeats)) + "\n")
    if "memory" in args.sections:
        print("\n".join(bench_memory(args.memory_model, args.repeats)) + "\n")
    if "onnx" in args.sections:
        print("\n".join(bench_onnx(args.repeats, args.onnx_model, merge=args.merge_tokens)) + "\n")
    if "data" in args.sections:
        print("\n".join(bench_data(args.repeats)) + "\n")
        print("\n".join(bench_folder_loaders(args.repeats)))

