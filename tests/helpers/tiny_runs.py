"""A tiny training recipe (a 2-block ViT on 8x8 digits) and helpers to run the tools on it, for
tests (imported by test modules): a short-run recipe, processes forked for a multi-process test,
the one error line of a refused recipe, a snapshot of a folder's bytes, a callback that records
what each training step saw, and a tiny image folder."""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import pytest
import torch
import yaml
from PIL import Image
from torch.multiprocessing import start_processes

from vitkit.cli.train import main as train_main

ROOT = Path(__file__).parents[2]
#: Trainer limits that keep a run to a few steps.
SHORT = {"limit_train_batches": 4, "limit_val_batches": 2, "limit_test_batches": 2}


def free_port() -> int:
    """A TCP port free on this machine now, for a test's ``torchrun`` rendezvous."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_forked(main: Callable[[int, int, int, Path], None], folder: Path, world: int = 2, deadline_s: float = 120) -> None:
    """``main(rank, world, port, folder)`` in ``world`` processes forked from the test (no imports of
    their own: seconds, not the minute of ``torchrun``), joined; a process that has not finished by
    ``deadline_s`` is killed and the test fails instead of stalling the suite."""
    context = start_processes(main, args=(world, free_port(), folder), nprocs=world, start_method="fork", join=False)
    deadline = time.monotonic() + deadline_s
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):  # False while one still runs
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the {world} forked processes did not finish in {deadline_s:g} s")


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


def refused(tmp_path: Path, capsys: pytest.CaptureFixture, *overrides: str) -> str:
    """The one error line of ``vitkit train`` on :func:`write_tiny_recipe`'s recipe in ``tmp_path`` with
    ``overrides``; no run directory."""
    path = write_tiny_recipe(tmp_path)
    assert train_main([str(path), *overrides]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not (tmp_path / "runs").exists()
    return err


#: What an in-process distributed run (Lightning's, torch's) leaves in ``os.environ``: a process that
#: inherits it joins that finished run (or its port) instead of starting its own.
RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
              "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def tool_env() -> dict[str, str]:
    """The environment of a tool run as a subprocess on this checkout's code, without the rendezvous
    an in-process distributed run of an earlier test left in ``os.environ`` (:data:`RENDEZVOUS`): a
    tool's own DDP run picks its own port and ranks."""
    inherited = {key: value for key, value in os.environ.items() if key not in RENDEZVOUS}
    return {**inherited, "NO_ALBUMENTATIONS_UPDATE": "1", "PYTHONPATH": str(ROOT)}


def run_tool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python <args>`` from the repository root, output captured."""
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=tool_env(),
                          cwd=ROOT)


def short_recipe(out_dir: Path, **trainer: object) -> dict:
    """:func:`tiny_recipe` limited to a few steps."""
    return tiny_recipe(out_dir, **{**SHORT, **trainer})


def dino_recipe(out_dir: Path, **trainer: object) -> dict:
    """:func:`short_recipe` pre-training with DINO: 8-px global and 4-px local crops of the digits."""
    recipe = short_recipe(out_dir, monitor="val/loss", **trainer)
    recipe["model"]["dynamic_img_size"] = True
    recipe["task"] = {"name": "dino", "dino": {"out_dim": 32, "hidden_dim": 32, "bottleneck_dim": 16,
                                               "local_crops": 2, "local_size": 4, "warmup_teacher_temp_epochs": 1}}
    return recipe


def snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` with the hash of its bytes (links by their target)."""
    state = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        if path.is_symlink():
            state[key] = f"-> {os.readlink(path)}"
        elif path.is_file():
            state[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            state[key] = "dir"
    return state


class Recorder(L.Callback):
    """Records, for every training batch, what the options should have changed."""

    def __init__(self) -> None:
        self.activation_dtypes: list[torch.dtype] = []
        self.weights: list[torch.Tensor] = []
        self.ema_weights: list[torch.Tensor] = []
        self.lrs: list[float] = []
        self._handle: Any = None

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        def hook(module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
            if module.training:
                self.activation_dtypes.append(output.dtype)

        self._handle = pl_module.model.blocks[0].attn.qkv.register_forward_hook(hook)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, *args: Any) -> None:
        # Callbacks run before the module's own hook, which updates the EMA: record the weights
        # the EMA is about to average in.
        self.weights.append(pl_module.model.head.weight.detach().clone())

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._handle.remove()
        if pl_module.ema is not None:
            self.ema_weights.append(pl_module.ema.module.head.weight.detach().clone())


def gray_folder(root: Path, mode: str = "L") -> Path:
    """root/{train,val}/{a,b}/ with 8 and 2 random non-square (12 wide, 10 high) images per class,
    grayscale PNGs (``mode='RGB'``: colour)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("val", 2)):
        for name in ("a", "b"):
            (root / split / name).mkdir(parents=True)
            for index in range(count):
                pixels = rng.integers(0, 255, (10, 12) if mode == "L" else (10, 12, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / name / f"{index}.png")
    return root


def shipped_tasks() -> dict[str, type]:
    """The registry's tasks that vitkit ships (not those other test files registered when imported):
    the registry a test starts from when it registers tasks of its own or lists the registered names."""
    from vitkit.tasks import registry

    return {name: task for name, task in registry._TASKS.items() if task.__module__.startswith("vitkit.")}
