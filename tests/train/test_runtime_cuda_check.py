"""A training step does not ask NVML whether CUDA is available (torch's AdamW asks every step and
Lightning routes the question through NVML, which reopens ``libnvidia-ml`` each time), where the
CUDA runtime's answer cannot spoil a fork: no GPU is visible, or the run trains on one."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import lightning as L
import pytest
import torch
from tiny_runs import tiny_recipe

from vitkit.train import train
from vitkit.train.callbacks import RuntimeCudaCheck


class AskedDuringSteps(L.Callback):
    """Counts, over training steps 2 to 5, the NVML and the runtime answers to "is CUDA available?"
    and the check setting each step saw."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.nvml = self.runtime = 0
        self.settings: set[str | None] = set()
        self._counting = False
        nvml, runtime = torch.cuda._device_count_nvml, torch._C._cuda_getDeviceCount

        def counted_nvml() -> int:
            self.nvml += self._counting
            return nvml()

        def counted_runtime() -> int:
            self.runtime += self._counting
            return runtime()

        monkeypatch.setattr(torch.cuda, "_device_count_nvml", counted_nvml)
        monkeypatch.setattr(torch._C, "_cuda_getDeviceCount", counted_runtime)

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        self._counting = 2 <= trainer.global_step < 6
        if self._counting:
            self.settings.add(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))


@pytest.mark.skipif(torch.cuda.device_count() > 0, reason="trains on the CPU of a machine without a GPU")
def test_steps_ask_the_runtime_not_nvml_and_the_setting_comes_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # what importing Lightning sets
    asked = AskedDuringSteps(monkeypatch)
    train(tiny_recipe(tmp_path, limit_train_batches=8, limit_val_batches=1, limit_test_batches=1), callbacks=[asked])
    assert asked.settings == {"0"}
    assert asked.runtime >= 4  # AdamW's health check asked once a step: the question was there to answer
    assert asked.nvml == 0
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"


@pytest.mark.parametrize(("device", "gpus", "setting", "during"), [
    ("cpu", 0, "1", "0"),  # no GPU: nothing a fork could spoil
    ("cpu", 1, "1", "1"),  # a GPU is visible and this run does not initialise CUDA: ranks or workers may fork
    ("cuda", 1, "1", "0"),  # the run initialises CUDA anyway
    ("cpu", 0, None, None),  # the user's own setting (or none) is left alone
    ("cpu", 0, "0", "0"),
])
def test_the_check_changes_only_where_a_fork_is_safe_and_comes_back(
    monkeypatch: pytest.MonkeyPatch, device: str, gpus: int, setting: str | None, during: str | None
) -> None:
    if setting is None:
        monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    else:
        monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", setting)
    trainer = SimpleNamespace(strategy=SimpleNamespace(root_device=torch.device(device)))
    check = RuntimeCudaCheck()
    with monkeypatch.context() as patched:
        patched.setattr(torch.cuda, "device_count", lambda: gpus)
        check.on_train_start(trainer, None)  # type: ignore[arg-type]
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == during
    check.teardown(trainer, None, "fit")  # type: ignore[arg-type]
    assert os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK") == setting
