"""One GPU check, prepared on CPUs (issue 37 item 4): on one CUDA GPU, in under 5 minutes, it prints

- training and inference throughput of vitkit's ViT-S/16 and ViT-B/16 beside timm's twin with the
  same weights (batch 256, bf16 and fp16 autocast; fp16 training with loss scaling), interleaved
  and synchronised, with the attention backend each ran (read from the profiler's ops:
  FlashAttention, memory-efficient, cuDNN or math SDPA, or vitkit's explicit kernel);
- peak GPU memory of a bf16 training step with and without gradient checkpointing;
- ``torch.compile`` (Inductor) against eager for the bf16 ViT-S/16 training step;
- a 1-GPU FSDP run of ``vitkit train`` (Lightning's FSDPStrategy) beside the same run without
  FSDP: both exported ``model.safetensors`` must hold the same weights.

    python dev/gpu_check.py              # on a GPU machine
    python dev/gpu_check.py --dry-run    # CPU, tiny models and batches (the test suite runs this)

``--dry-run`` runs every section on the CPU at tiny sizes so that the script is known to work
before a GPU is lent: memory reads "n/a", ``torch.compile`` uses the ``aot_eager`` backend (no C++
compiler run) and the FSDP section trains without FSDP (Lightning refuses FSDP on a CPU).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile

import vitkit
from vitkit.io import load_model_and_extra
from vitkit.models import to_timm
from vitkit.train import train

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


FULL = Sizes(
    models={"ViT-S/16": {"name": "vit_small_patch16_224"}, "ViT-B/16": {"name": "vit_base_patch16_224"}},
    batch=256, repeats=10, compile_backend="inductor", fsdp=True,
)
DRY = Sizes(
    models={
        "ViT-S/16 (tiny)": {"name": "vit_small_patch16_224", "img_size": 32, "depth": 2, "embed_dim": 64, "num_heads": 2},
        "ViT-B/16 (tiny)": {"name": "vit_base_patch16_224", "img_size": 32, "depth": 2, "embed_dim": 96, "num_heads": 3},
    },
    batch=4, repeats=2, compile_backend="aot_eager", fsdp=False,
)


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


def compiled(sizes: Sizes, device: torch.device) -> list[str]:
    label, spec = next(iter(sizes.models.items()))
    rows = [f"| {label} bf16 train | eager img/s | compiled img/s | compiled / eager | first compiled step s |",
            "|---|---|---|---|---|"]
    for library in ("vitkit", "timm"):
        ours, theirs = twins(spec, device)
        eager = ours if library == "vitkit" else theirs
        graph = twins(spec, device)[0 if library == "vitkit" else 1]
        graph.compile(backend=sizes.compile_backend)
        images, labels = batch(ours, sizes.batch, device)
        eager_step = make_step(eager, images, labels, True, torch.bfloat16)
        compiled_step = make_step(graph, images, labels, True, torch.bfloat16)
        started = time.perf_counter()
        compiled_step()
        first = time.perf_counter() - started
        seconds = interleaved({"eager": eager_step, "compiled": compiled_step}, sizes.repeats)
        speed = {name: sizes.batch / value for name, value in seconds.items()}
        rows.append(f"| {library} | {speed['eager']:.0f} | {speed['compiled']:.0f} "
                    f"| {speed['compiled'] / speed['eager']:.2f} | {first:.1f} |")
    return rows


def fsdp_run(sizes: Sizes, device: torch.device) -> list[str]:
    """``vitkit train`` of the quickstart (a few steps, float32, deterministic) with and without
    FSDP on one device: the exported weights must agree."""
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    common = [f"trainer.accelerator={accelerator}", "trainer.devices=1", "trainer.max_epochs=1",
              "trainer.limit_train_batches=8", "trainer.limit_val_batches=2", "trainer.limit_test_batches=2",
              "trainer.precision=32-true", "trainer.enable_progress_bar=false", "model.attn_impl=sdpa"]
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
    return [f"1-device FSDP run{note}: same tensors as without FSDP: {same_keys}; largest weight difference {error:.2e}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: check that the script works")
    args = parser.parse_args(argv)
    sizes = DRY if args.dry_run else FULL
    device = torch.device("cpu") if args.dry_run else torch.device("cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA GPU is visible; run on a GPU machine, or add --dry-run to check the script on the CPU.",
              file=sys.stderr)
        return 2
    started = time.perf_counter()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU (dry run)"
    print(f"# GPU check: {name}, torch {torch.__version__}, batch {sizes.batch}\n")
    sections = [("Throughput, vitkit beside timm", throughput), ("Peak memory, gradient checkpointing", memory),
                ("torch.compile", compiled), ("FSDP", fsdp_run)]
    for title, section in sections:
        print(f"## {title}\n")
        rows = section(sizes, device)
        print("\n".join(rows) + "\n", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s; paste the tables into docs/benchmarks.md under 'GPU check'.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
