"""dev/gpu_check.py, the one script a GPU machine runs, works before a GPU is lent: its dry run
prints every section on the CPU at tiny sizes (throughput, memory, compile with its share of the
GEMM peak, the host-sync window, the recipe, FSDP), and it names the attention kernel a step ran."""

from __future__ import annotations

import importlib.util
import re
import sys
from types import ModuleType

import pytest
import torch
from tiny_runs import ROOT, run_tool

import vitkit

SCRIPT = ROOT / "dev" / "gpu_check.py"


def gpu_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("kernel", "expected"), [("sdpa", "SDPA flash (CPU)"), ("explicit", "explicit")])
def test_attention_backend_names_the_kernel_a_training_step_ran(kernel: str, expected: str) -> None:
    check = gpu_check()
    model = vitkit.create_model("vit_cifar_tiny", img_size=8, patch_size=4, embed_dim=16, depth=1, num_heads=2,
                                attn_impl=kernel)
    images, labels = torch.randn(2, 3, 8, 8), torch.tensor([0, 1])
    step = check.make_step(model, images, labels, train_mode=True, dtype=torch.bfloat16)
    assert check.attention_backend(step).startswith(expected)


@pytest.mark.slow
def test_dry_run_prints_every_section_on_the_cpu() -> None:
    done = run_tool(str(SCRIPT), "--dry-run", timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for section in ("Throughput, vitkit beside timm", "Peak memory, gradient checkpointing", "torch.compile",
                    "Host syncs in a steady step", "The recipe on the device", "FSDP"):
        assert f"## {section}" in out
    rows = re.findall(r"^\| ViT-S/16 \(tiny\) \| (bf16|fp16) \| (train|infer) \| (\d+) \| (\d+) \| [\d.]+ \| ([^|]+) \| ([^|]+) \|$",
                      out, flags=re.M)
    assert len(rows) == 4  # 2 dtypes x 2 modes
    assert all(int(ours) > 0 and int(theirs) > 0 and "unknown" not in a + b for *_, ours, theirs, a, b in rows)
    compiled = re.findall(r"^\| ViT-S/16 \(tiny\) \| (vitkit|timm) \| \d+ \| \d+ \| [\d.]+ \| (\d+)% \| (\d+)% \| [\d.]+ \|$",
                          out, flags=re.M)
    assert len(compiled) == 2  # both libraries, each with its share of the GEMM peak
    assert "host syncs in 10 steady steps" in out  # the window after the kernel choice, before the epoch's end
    assert re.search(r"^\| quickstart \| false \| [\d,]+ \| n/a \(CPU\) \| - \| \d+ \| [\d.]+ \|$", out, flags=re.M)
    assert "largest weight difference 0.00e+00 (within 1e-5)" in out
