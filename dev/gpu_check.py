"""One GPU check, prepared on CPUs (issue 37 item 4, issue 50 item 6): on one CUDA GPU, in about 8
minutes (planned, not yet timed there: each section prints its own seconds, and ``--sections``
runs some of them), it prints

- training and inference throughput of vitkit's ViT-S/16 and ViT-B/16 beside timm's twin with the
  same weights (batch 256, bf16 and fp16 autocast; fp16 training with loss scaling), interleaved
  and synchronised, with the attention backend each ran (read from the profiler's ops:
  FlashAttention, memory-efficient, cuDNN or math SDPA, or vitkit's explicit kernel);
- peak GPU memory of a bf16 training step with and without gradient checkpointing;
- ``torch.compile`` (Inductor) against eager for the bf16 training step of both models and both
  libraries, each as a share of the bf16 GEMM peak at the model's own shapes (``torch.mm`` at
  each of its GEMMs' M x K x N, the best);
- the host syncs of a steady ``vitkit train`` step with the recipes' options on (locality masks,
  registers, RoPE, EMA, gradient clipping), counted by ``torch.cuda.set_sync_debug_mode``;
- the fast Fashion-MNIST recipe through ``vitkit train``, eager and ``trainer.compile: true``:
  training images/s, how busy the GPU was over 40 steady steps (its kernels' time over the wall
  time, from the profiler), the compilation's time and the whole run's, with validation and test
  (where a compiled run once stalled);
- a 1-GPU FSDP run of ``vitkit train`` (torch's FSDP2 under Lightning) beside the same run
  without FSDP, both under ``trainer.deterministic``: the exported weights must agree to 1e-5.

    python dev/gpu_check.py --fmnist-root data/fashion-mnist   # on a GPU machine (the IDX files carried there)
    python dev/gpu_check.py --dry-run                          # CPU, tiny models and batches (the test suite runs this)
    python dev/gpu_check.py --sections compile recipe          # some sections only

``--dry-run`` runs every section on the CPU at tiny sizes so that the script is known to work
before a GPU is lent: memory and GPU busy read "n/a", ``torch.compile`` uses the ``aot_eager``
backend (no C++ compiler run), the recipe section trains the quickstart recipe eager only, the
sync count trains its steps without counting (``set_sync_debug_mode`` is CUDA's; on the CPU
``tests/train/test_no_host_sync.py`` counts them) and the FSDP section trains without FSDP
(Lightning refuses FSDP on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import vitkit
from vitkit.bench.gemm import gemm_calls, gemm_shapes, round_peaks
from vitkit.bench.steps import step_flops
from vitkit.io import load_model_and_extra
from vitkit.models import to_timm
from vitkit.train import train
from vitkit.train.kernel_trial import STEPS_TO_CHOOSE

#: SDPA's aten ops (the dispatcher's choice) and what they are.
SDPA_BACKENDS = {
    "aten::_scaled_dot_product_flash_attention_for_cpu": "SDPA flash (CPU)",
    "aten::_scaled_dot_product_flash_attention": "SDPA FlashAttention-2",
    "aten::_scaled_dot_product_efficient_attention": "SDPA memory-efficient",
    "aten::_scaled_dot_product_cudnn_attention": "SDPA cuDNN",
    "aten::_scaled_dot_product_attention_math": "SDPA math",
}


@dataclass(frozen=True)
class Sizes:
    """What one check measures: models (name and ``create_model`` overrides), batch, repeats."""

    models: dict[str, dict[str, int]]
    batch: int
    repeats: int
    compile_backend: str
    fsdp: bool
    #: The recipe of the recipe section, and the overrides that make it this check's run.
    recipe: str
    recipe_overrides: tuple[str, ...]


FULL = Sizes(
    models={"ViT-S/16": {"name": "vit_small_patch16_224"}, "ViT-B/16": {"name": "vit_base_patch16_224"}},
    batch=256, repeats=10, compile_backend="inductor", fsdp=True,
    recipe="fashion_mnist_fast", recipe_overrides=("trainer.max_epochs=2",),
)
DRY = Sizes(
    # one model: the sections loop over FULL's two with the same code, and the suite runs this check
    models={"ViT-S/16 (tiny)": {"name": "vit_small_patch16_224", "img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2}},
    batch=4, repeats=2, compile_backend="aot_eager", fsdp=False,
    recipe="quickstart", recipe_overrides=("trainer.max_epochs=1", "trainer.limit_train_batches=44",
                                           "trainer.limit_val_batches=2", "trainer.limit_test_batches=2"),
)
#: Steady steps of the recipe section: the GPU's busy share is read over these.
BUSY_STEPS = (STEPS_TO_CHOOSE + 2, STEPS_TO_CHOOSE + 42)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def twins(spec: dict[str, int], device: torch.device) -> tuple[nn.Module, nn.Module]:
    """vitkit's model and timm's with the same weights, on ``device``."""
    torch.manual_seed(0)
    overrides = {key: value for key, value in spec.items() if key != "name"}
    ours = vitkit.create_model(spec["name"], **overrides)
    return ours.to(device), to_timm(ours).to(device)


def make_step(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, train_mode: bool,
              dtype: torch.dtype) -> Callable[[], None]:
    """One synchronised inference forward or AdamW training step under ``dtype`` autocast (float16
    training with a loss scaler, as mixed precision trains)."""
    device = images.device
    if not train_mode:
        model.eval()

        def forward() -> None:
            with torch.inference_mode(), torch.autocast(device.type, dtype=dtype):
                model(images)
            synchronize(device)

        return forward
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=dtype):
            loss = F.cross_entropy(model(images), labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        synchronize(device)

    return step


def attention_backend(call: Callable[[], None]) -> str:
    """The attention kernel ``call`` ran, from the aten ops the profiler records."""
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        call()
    names = {event.name for event in recorded.events()}
    found = sorted({label for op, label in SDPA_BACKENDS.items() if op in names})
    if found:
        return " + ".join(found)
    return "explicit (matmul, softmax, matmul)" if "aten::_softmax" in names else "unknown"


def interleaved(calls: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median seconds per call: two warm-ups each, then ``repeats`` rounds alternating the order."""
    for call in calls.values():
        call()
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    for round_index in range(repeats):
        for name in names if round_index % 2 == 0 else names[::-1]:
            started = time.perf_counter()
            calls[name]()
            times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in times.items()}


def batch(model: nn.Module, size: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    config = model.config
    images = torch.randn(size, config.in_chans, *config.img_size, device=device)
    return images, torch.randint(0, config.num_classes, (size,), device=device)


def throughput(sizes: Sizes, device: torch.device) -> list[str]:
    rows = ["| model | dtype | mode | vitkit img/s | timm img/s | vitkit / timm | vitkit attention | timm attention |",
            "|---|---|---|---|---|---|---|---|"]
    for label, spec in sizes.models.items():
        ours, theirs = twins(spec, device)
        images, labels = batch(ours, sizes.batch, device)
        for dtype_name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
            for train_mode in (True, False):
                calls = {name: make_step(model, images, labels, train_mode, dtype)
                         for name, model in (("vitkit", ours), ("timm", theirs))}
                seconds = interleaved(calls, sizes.repeats)  # warm-up first: vitkit's kernel choice is made
                kernels = {name: attention_backend(call) for name, call in calls.items()}
                speed = {name: sizes.batch / value for name, value in seconds.items()}
                rows.append(f"| {label} | {dtype_name} | {'train' if train_mode else 'infer'} | {speed['vitkit']:.0f} "
                            f"| {speed['timm']:.0f} | {speed['vitkit'] / speed['timm']:.2f} | {kernels['vitkit']} "
                            f"| {kernels['timm']} |")
                print(rows[-1], file=sys.stderr, flush=True)
        del ours, theirs
    return rows


def peak_memory(call: Callable[[], None], device: torch.device) -> float | None:
    """Peak GPU memory (GiB) of one call after a warm-up one; ``None`` on the CPU."""
    call()
    if device.type != "cuda":
        call()
        return None
    torch.cuda.reset_peak_memory_stats(device)
    call()
    return torch.cuda.max_memory_allocated(device) / 2**30


def memory(sizes: Sizes, device: torch.device) -> list[str]:
    rows = ["| model | library | peak GiB | peak GiB, checkpointing |", "|---|---|---|---|"]
    label, spec = list(sizes.models.items())[-1]
    for library in ("vitkit", "timm"):
        found = []
        for checkpointing in (False, True):
            ours, theirs = twins(spec, device)
            model = ours if library == "vitkit" else theirs
            model.set_grad_checkpointing(checkpointing)
            images, labels = batch(ours, sizes.batch, device)
            found.append(peak_memory(make_step(model, images, labels, True, torch.bfloat16), device))
            del ours, theirs, model
            if device.type == "cuda":
                torch.cuda.empty_cache()
        shown = ["n/a (CPU)" if value is None else f"{value:.2f}" for value in found]
        rows.append(f"| {label} bf16 train | {library} | {shown[0]} | {shown[1]} |")
    return rows


def gemm_peak(model: nn.Module, size: int, device: torch.device, repeats: int) -> float:
    """The bf16 GEMM peak at ``model``'s own GEMM shapes for a batch of ``size``, in GFLOP/s: the
    best over the shapes of ``torch.mm``'s median time."""
    shapes = gemm_shapes(model, size)
    seconds = interleaved(gemm_calls(shapes, torch.bfloat16, device), repeats)
    return round_peaks({label: [value] for label, value in seconds.items()}, shapes)[0]


def compiled(sizes: Sizes, device: torch.device) -> list[str]:
    rows = ["| model | library | eager img/s | compiled img/s | compiled / eager | eager % of GEMM peak "
            "| compiled % of GEMM peak | first compiled step s |", "|---|---|---|---|---|---|---|---|"]
    peaks = []
    for label, spec in sizes.models.items():
        ours, _ = twins(spec, device)
        images, labels = batch(ours, sizes.batch, device)
        peak = gemm_peak(ours, sizes.batch, device, sizes.repeats)
        gflop = step_flops(ours, images, labels, "train") / 1e9
        peaks.append(f"{label}: {peak:,.0f} GFLOP/s at {', '.join('x'.join(map(str, s)) for s in gemm_shapes(ours, sizes.batch))}")
        for library in ("vitkit", "timm"):
            eager = twins(spec, device)[0 if library == "vitkit" else 1]
            graph = twins(spec, device)[0 if library == "vitkit" else 1]
            graph.compile(backend=sizes.compile_backend)
            eager_step = make_step(eager, images, labels, True, torch.bfloat16)
            compiled_step = make_step(graph, images, labels, True, torch.bfloat16)
            started = time.perf_counter()
            compiled_step()
            first = time.perf_counter() - started
            seconds = interleaved({"eager": eager_step, "compiled": compiled_step}, sizes.repeats)
            share = {name: 100 * gflop / value / peak for name, value in seconds.items()}
            rows.append(f"| {label} | {library} | {sizes.batch / seconds['eager']:.0f} | {sizes.batch / seconds['compiled']:.0f} "
                        f"| {seconds['eager'] / seconds['compiled']:.2f} | {share['eager']:.0f}% | {share['compiled']:.0f}% "
                        f"| {first:.1f} |")
            print(rows[-1], file=sys.stderr, flush=True)
            del eager, graph
    return [*rows, "", "bf16 GEMM peak (torch.mm at the model's shapes, the best): " + "; ".join(peaks)]


class SyncWindow(L.Callback):
    """Counts the warnings ``torch.cuda.set_sync_debug_mode("warn")`` raises for the host syncs
    of training steps ``after`` to ``until - 1`` (after the kernel choice, before the epoch's end,
    where losses are checked and logged). On the CPU it only marks the window (``counted`` stays
    ``None``)."""

    def __init__(self, after: int, until: int) -> None:
        self.after, self.until, self.steps = after, until, 0
        self.counted: int | None = None
        self._open = False
        self._recording: Any = None
        self._caught: list[warnings.WarningMessage] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if trainer.global_step == self.after:
            self._open = True
            if pl_module.device.type == "cuda":
                self._recording = warnings.catch_warnings(record=True)
                self._caught = self._recording.__enter__()
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
        if trainer.global_step == self.until:
            self._close()

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.steps += self._open

    def _close(self) -> None:
        self._open = False
        if self._recording is not None:
            torch.cuda.set_sync_debug_mode(0)
            self._recording.__exit__(None, None, None)
            self.counted = sum("synchroniz" in str(caught.message) for caught in self._caught)
            self._recording = None

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._close()


def accelerator(device: torch.device) -> str:
    return "gpu" if device.type == "cuda" else "cpu"


def host_syncs(sizes: Sizes, device: torch.device) -> list[str]:
    """Host syncs per steady ``vitkit train`` step, the recipes' options on."""
    window = SyncWindow(after=STEPS_TO_CHOOSE + 4, until=STEPS_TO_CHOOSE + 14)
    overrides = [f"trainer.accelerator={accelerator(device)}", "trainer.max_epochs=1", "trainer.enable_progress_bar=false",
                 "trainer.batch_size=16",
                 f"trainer.limit_train_batches={STEPS_TO_CHOOSE + 16}", "trainer.limit_val_batches=1",
                 "trainer.limit_test_batches=1", "trainer.log_every=1000", "model.locality=true", "model.reg_tokens=2",
                 "model.rope=axial", "optim.ema=true", "optim.clip_grad=1.0"]
    with tempfile.TemporaryDirectory() as out:
        train("quickstart", [*overrides, f"output.dir={out}"], callbacks=[window])
    if window.counted is None:
        return [f"host syncs in {window.steps} steady steps: n/a on the CPU (tests/train/test_no_host_sync.py counts them there)"]
    return [f"host syncs in {window.steps} steady steps (locality masks, registers, RoPE, EMA, clipping; "
            f"torch.cuda.set_sync_debug_mode): {window.counted} ({window.counted / max(window.steps, 1):.2f} per step)"]


class GpuBusy(L.Callback):
    """The GPU's busy share over training steps ``first`` to ``last - 1``: the summed time of its
    kernels (the profiler's CUDA activity) over the window's wall time; ``None`` on the CPU."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.share: float | None = None
        self._profiler: Any = None
        self._started = 0.0

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        if pl_module.device.type != "cuda":
            return
        if trainer.global_step == self.first:
            torch.cuda.synchronize()
            self._profiler = profile(activities=[ProfilerActivity.CUDA])
            self._profiler.__enter__()
            self._started = time.perf_counter()
        if trainer.global_step == self.last and self._profiler is not None:
            torch.cuda.synchronize()
            wall = time.perf_counter() - self._started
            self._profiler.__exit__(None, None, None)
            kernels = sum(event.self_device_time_total for event in self._profiler.key_averages())  # microseconds
            self.share, self._profiler = kernels / 1e6 / wall, None


def recipe(sizes: Sizes, device: torch.device, data_root: Path | None) -> list[str]:
    """The recipe through ``vitkit train``, eager and compiled: images/s, GPU busy, wall times."""
    rows = ["| recipe | trainer.compile | train img/s | GPU busy (steps "
            f"{BUSY_STEPS[0]}-{BUSY_STEPS[1] - 1}) | compile s | run s (fit, validation, test) | test acc |",
            "|---|---|---|---|---|---|---|"]
    common = [*sizes.recipe_overrides, f"trainer.accelerator={accelerator(device)}", "trainer.enable_progress_bar=false"]
    if data_root is not None:
        common.append(f"data.root={data_root}")
    for option in ("false", "true") if sizes.compile_backend == "inductor" else ("false",):
        busy = GpuBusy(*BUSY_STEPS)
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            summary = train(sizes.recipe, [*common, f"trainer.compile={option}", f"output.dir={out}"], callbacks=[busy]).summary
            wall = time.perf_counter() - started
        compile_s = (summary.get("compile") or {}).get("compile_s")
        rows.append(f"| {sizes.recipe} | {option} | {summary['train_images_per_s']:,.0f} "
                    f"| {'n/a (CPU)' if busy.share is None else f'{100 * busy.share:.0f}%'} "
                    f"| {'-' if compile_s is None else f'{compile_s:.1f}'} | {wall:.0f} | {summary['test_acc']:.2f} |")
        print(rows[-1], file=sys.stderr, flush=True)
    if sizes.compile_backend != "inductor":
        rows.append("(dry run: trainer.compile=true is left out; it needs Inductor's C++ compiler)")
    return rows


def fsdp_run(sizes: Sizes, device: torch.device) -> list[str]:
    """``vitkit train`` of the quickstart (a few steps, float32, deterministic algorithms) with and
    without FSDP on one device: the exported weights must agree to 1e-5."""
    common = [f"trainer.accelerator={accelerator(device)}", "trainer.devices=1", "trainer.max_epochs=1",
              "trainer.limit_train_batches=8", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2",
              "trainer.precision=32-true", "trainer.enable_progress_bar=false", "model.attn_impl=sdpa",
              "trainer.deterministic=true"]
    strategies = {"single": "auto", "fsdp": "fsdp" if sizes.fsdp else "auto"}
    exported = {}
    with tempfile.TemporaryDirectory() as out:
        for name, strategy in strategies.items():
            result = train("quickstart", [*common, f"trainer.strategy={strategy}", f"output.dir={out}/{name}"])
            exported[name], _ = load_model_and_extra(result.run_dir / "model.safetensors")
    reference = exported["single"].state_dict()
    error = max((value - reference[key]).abs().max().item() for key, value in exported["fsdp"].state_dict().items())
    same_keys = exported["fsdp"].state_dict().keys() == reference.keys()
    note = "" if sizes.fsdp else " (dry run: trained without FSDP)"
    verdict = "within 1e-5" if same_keys and error <= 1e-5 else "NOT within 1e-5"
    return [f"1-device FSDP run{note}, deterministic: same tensors as without FSDP: {same_keys}; "
            f"largest weight difference {error:.2e} ({verdict})"]


SECTIONS = {"throughput": "Throughput, vitkit beside timm", "memory": "Peak memory, gradient checkpointing",
            "compile": "torch.compile", "syncs": "Host syncs in a steady step", "recipe": "The recipe on the device",
            "fsdp": "FSDP"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: check that the script works")
    parser.add_argument("--sections", nargs="+", choices=list(SECTIONS), default=list(SECTIONS), help="which sections to run")
    parser.add_argument("--fmnist-root", type=Path, default=Path("/usr/share/datasets/fashion-mnist"),
                        help="the Fashion-MNIST IDX files for the recipe section (not read in a dry run)")
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    device = torch.device("cpu") if args.dry_run else torch.device("cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU is visible; run on a GPU machine, or add --dry-run to check the script on the CPU.",
              file=sys.stderr)
        return 2
    data_root = None if args.dry_run else args.fmnist_root
    if "recipe" in args.sections and data_root is not None and not data_root.is_dir():
        print(f"error: --fmnist-root {data_root} is not a folder; give the folder of the Fashion-MNIST IDX files "
              "(Debian: apt-get install dataset-fashion-mnist), or leave out the recipe section.", file=sys.stderr)
        return 2
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"# GPU check: {name}, torch {torch.__version__}, batch {sizes.batch}\n")
    sections: dict[str, Callable[[], list[str]]] = {
        "throughput": lambda: throughput(sizes, device), "memory": lambda: memory(sizes, device),
        "compile": lambda: compiled(sizes, device), "syncs": lambda: host_syncs(sizes, device),
        "recipe": lambda: recipe(sizes, device, data_root), "fsdp": lambda: fsdp_run(sizes, device),
    }
    for key in args.sections:
        section_started = time.perf_counter()
        print(f"## {SECTIONS[key]}\n")
        rows = sections[key]()
        print("\n".join(rows) + f"\n\n({time.perf_counter() - section_started:.0f} s)\n", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s; paste the tables into docs/benchmarks.md under 'GPU check'.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
