"""A training step calls only the hooks that do something: the run's callbacks and module leave
Lightning's no-op step hooks out of its dispatch (:mod:`vitkit.train.hook_dispatch`); a caller's
callbacks keep theirs; the module's ``_current_fx_name`` store is a plain attribute."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.profilers import PassThroughProfiler
from tiny_runs import tiny_recipe
from torch import nn

from vitkit.train import train
from vitkit.train.hook_dispatch import STEP_HOOKS, skip_idle_step_hooks

#: Step hooks that no vitkit callback implements: a run dispatches them to no callback of its own
#: (``on_before_zero_grad`` is the automatic loop's: a module that steps itself calls it on none).
IDLE_IN_EVERY_VITKIT_CALLBACK = ("on_before_backward", "on_after_backward", "on_before_optimizer_step")


class EndsOnly(L.Callback):
    def __init__(self) -> None:
        self.ends = 0

    def on_train_batch_end(self, *args: Any) -> None:
        self.ends += 1


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(4, 1)
        self.after_backward = 0

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).pow(2).mean()

    def on_after_backward(self) -> None:
        self.after_backward += 1

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_only_the_no_op_step_hooks_are_skipped() -> None:
    callback, module = EndsOnly(), Tiny()
    skip_idle_step_hooks([callback], module)
    assert callable(callback.on_train_batch_end) and callable(module.on_after_backward)
    assert [hook for hook in STEP_HOOKS if getattr(callback, hook) is None] == [h for h in STEP_HOOKS if h != "on_train_batch_end"]
    assert [hook for hook in STEP_HOOKS if getattr(module, hook) is None] == [
        "on_train_batch_start", "on_before_backward", "on_before_zero_grad", "on_before_optimizer_step", "on_train_batch_end"]
    assert callable(callback.on_fit_start) and callable(module.on_fit_start)  # not a step hook: untouched


def test_the_installed_lightning_passes_over_a_skipped_hook_and_calls_the_others() -> None:
    callback, module = EndsOnly(), Tiny()
    skip_idle_step_hooks([callback], module)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[callback])
    trainer.fit(module, torch.utils.data.DataLoader(torch.randn(12, 4), batch_size=4))
    assert trainer.global_step == 3 and callback.ends == 3 and module.after_backward == 3


def test_a_lightning_that_would_call_a_none_hook_keeps_every_hook(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.trainer import call

    from vitkit.train import hook_dispatch

    def calls_every_hook(trainer: Any, hook_name: str, *args: Any, **kwargs: Any) -> None:
        for callback in trainer.callbacks:
            getattr(callback, hook_name)(trainer, trainer.lightning_module, *args)

    assert hook_dispatch.lightning_skips_none_hooks()  # the installed Lightning (2.6) has the rule
    monkeypatch.setattr(call, "_call_callback_hooks", calls_every_hook)
    hook_dispatch.lightning_skips_none_hooks.cache_clear()
    try:
        assert not hook_dispatch.lightning_skips_none_hooks()
        callback, module = EndsOnly(), Tiny()
        skip_idle_step_hooks([callback], module)
        assert all(callable(getattr(callback, hook)) and callable(getattr(module, hook)) for hook in STEP_HOOKS)
    finally:
        hook_dispatch.lightning_skips_none_hooks.cache_clear()


@pytest.fixture
def dispatched(monkeypatch: pytest.MonkeyPatch) -> collections.Counter[str]:
    """The labels Lightning's (pass-through) profiler is given: one per hook it calls."""
    labels: collections.Counter[str] = collections.Counter()
    monkeypatch.setattr(PassThroughProfiler, "start", lambda self, action_name: labels.update([action_name]))
    return labels


def test_a_run_dispatches_no_idle_step_hook_of_its_own_and_every_hook_of_the_callers(
    tmp_path: Path, dispatched: collections.Counter[str]
) -> None:
    given = EndsOnly()
    steps = 4
    train(tiny_recipe(tmp_path, limit_train_batches=steps, limit_val_batches=1, limit_test_batches=1), callbacks=[given])
    assert given.ends == steps
    for hook in IDLE_IN_EVERY_VITKIT_CALLBACK:
        callers = {label for label in dispatched if label.startswith("[Callback]") and label.endswith(f".{hook}")}
        assert callers == {f"[Callback]EndsOnly.{hook}"}, hook  # the caller's no-op is still called
        assert dispatched[f"[Callback]EndsOnly.{hook}"] == steps
    ends = {label.split("]")[1].split(".")[0].split("{")[0] for label in dispatched if label.endswith(".on_train_batch_end")}
    assert {"Throughput", "LastCheckpoint", "ModelCheckpoint", "EndsOnly"} <= ends
    assert "LearningRateMonitor" not in ends and "CtrlCStops" not in ends
    module_hooks = {label.split(".")[-1] for label in dispatched if label.startswith("[LightningModule]ViTModule.")}
    assert {"on_train_batch_end", "on_after_backward", "on_before_optimizer_step"} <= module_hooks
    assert not module_hooks & {"on_train_batch_start", "on_before_backward"}
    # the module steps itself: no closure, so none of the automatic loop's hooks
    assert not module_hooks & {"optimizer_step", "optimizer_zero_grad", "configure_gradient_clipping", "lr_scheduler_step"}


def test_the_hook_name_store_is_a_plain_attribute_and_modules_still_register() -> None:
    from vitkit.train.module import ViTModule

    module = ViTModule.__new__(ViTModule)
    L.LightningModule.__init__(module)
    module._current_fx_name = "training_step"
    assert module.__dict__["_current_fx_name"] == "training_step" and module._current_fx_name == "training_step"
    module.head = nn.Linear(2, 2)
    assert "head" in module._modules and "head" not in module.__dict__
