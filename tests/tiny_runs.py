"""A tiny training recipe (a 2-block ViT on 8x8 digits) and helpers to run the tools on it, for
tests (imported by test modules)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).parent.parent
#: Trainer limits that keep a run to a few steps.
SHORT = {"limit_train_batches": 4, "limit_val_batches": 2, "limit_test_batches": 2}


def tiny_recipe(out_dir: Path, **trainer: object) -> dict:
    """A 2-block, 32-wide ViT on 8x8 digits (16 patches of 2x2), writing runs under ``out_dir``."""
    return {
        "name": "tiny",
        "model": {"name": "vit_cifar_tiny", "patch_size": 2, "embed_dim": 32, "depth": 2, "num_heads": 2,
                  "mlp_ratio": 2.0},
        "data": {"name": "digits", "img_size": 8, "num_workers": 0, "augment": {"enabled": False}},
        "optim": {"lr": 5e-3, "warmup_epochs": 0.3, "label_smoothing": 0.0},
        "trainer": {"max_epochs": 1, "batch_size": 32, "accelerator": "cpu", "enable_progress_bar": False,
                    "num_sanity_val_steps": 0, "log_every": 2, "num_threads": 1, **trainer},
        "output": {"dir": str(out_dir)},
    }


def write_tiny_recipe(folder: Path, **trainer: object) -> Path:
    """:func:`tiny_recipe` as ``folder/tiny.yaml``, its runs under ``folder/runs``."""
    path = folder / "tiny.yaml"
    path.write_text(yaml.safe_dump(tiny_recipe(folder / "runs", **trainer)))
    return path


def tool_env() -> dict[str, str]:
    """The environment of a tool run as a subprocess on this checkout's code."""
    return {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "PYTHONPATH": str(ROOT)}


def run_tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python <args>`` from the repository root, output captured."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=tool_env(),
                          cwd=ROOT)
