"""A training step's memory: the peak resident size during one step minus the resident size just
before it, after a warm-up step, each measured in a fresh process (``python -m vitkit.bench.memory``)
with glibc's mmap threshold fixed so freed activations go back to the OS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ..models import create_model
from ..timing import interleaved_times, median_ratio
from .steps import batch_for, make_step, twins


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
            args = [sys.executable, "-m", "vitkit.bench.memory", name, batch_size, library,
                    str(int(checkpointing))]
            out = subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout
            measured[library, checkpointing] = json.loads(out.strip().splitlines()[-1])["step_mib"]
    ours, _ = twins(name)
    images, labels = batch_for(ours, int(batch_size))
    plain = make_step(ours, images, labels, "train", "fp32")
    checkpointed_model = create_model(name)
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


if __name__ == "__main__":  # the fresh process of bench_memory: NAME BATCH LIBRARY CHECKPOINTING
    memory_child(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1")
