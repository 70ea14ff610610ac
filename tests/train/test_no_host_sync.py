"""A steady training step never waits for the host: after the first steps (kernel choice), no call
that would synchronise a GPU runs, with the recipes' options on (LSA masks, registers, RoPE, EMA,
gradient clipping, the in-memory split kept on the device); nor does a token-merging model's forward
and backward (its proportional attention hands every block a float bias). Counted on the CPU by a
``TorchFunctionMode`` that sees every ``item``, ``bool``, ``tolist``, ``nonzero``, ``.cpu()``,
``torch.equal``, data-dependent selection and boolean indexing."""

from __future__ import annotations

import collections
import traceback
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from tiny_runs import tiny_recipe
from torch.overrides import TorchFunctionMode

import vitkit
from vitkit.train import load_recipe
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.run import build_module

SYNCS = {
    torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__int__, torch.Tensor.__float__, torch.Tensor.__index__,
    torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.nonzero, torch.nonzero, torch.equal,
    torch.Tensor.equal, torch.masked_select, torch.Tensor.masked_select, torch.unique, torch.Tensor.unique,
}


class SyncCounter(TorchFunctionMode):
    """Counts the calls that would synchronise a GPU, by where they were made."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        index = args[1] if func is torch.Tensor.__getitem__ and len(args) > 1 else None
        indices = index if isinstance(index, tuple) else (index,)
        boolean_index = any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices)
        if func in SYNCS or boolean_index:
            caller = traceback.extract_stack()[-2]
            self.calls[f"{getattr(func, '__name__', func)} at {caller.filename}:{caller.lineno}"] += 1
        return func(*args, **(kwargs or {}))


class CountSteadySteps(L.Callback):
    """Counts the syncs of the training steps ``after`` to ``until - 1`` (the steps of neither the
    kernel choice nor the epoch's end, where the losses are checked and logged)."""

    def __init__(self, after: int, until: int) -> None:
        self.after, self.until, self.counter, self.steps = after, until, None, 0
        self.calls: collections.Counter[str] = collections.Counter()

    def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.global_step == self.after:
            self.counter = SyncCounter()
            self.counter.__enter__()
        if trainer.global_step == self.until and self.counter is not None:
            self.counter.__exit__(None, None, None)
            self.calls, self.counter = self.counter.calls, None

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.steps += self.counter is not None


@pytest.mark.parametrize("precision", ["32-true", "bf16-true"])  # bf16-true: its copy takes weights, gives gradients
def test_a_steady_training_step_makes_no_host_sync(tmp_path: Path, precision: str) -> None:
    recipe = tiny_recipe(tmp_path, limit_train_batches=10, log_every=1000, precision=precision)
    recipe["model"].update(locality=True, reg_tokens=2, rope="axial")
    recipe["optim"].update(ema=True, clip_grad=1.0)
    config = load_recipe(recipe)
    data = ViTDataModule(config.data, config.trainer.batch_size, on_device=True)
    module = build_module(config, data.info)
    window = CountSteadySteps(after=4, until=9)
    trainer = L.Trainer(max_epochs=1, accelerator="cpu", precision=config.trainer.lightning_precision, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, limit_train_batches=10,
                        limit_val_batches=0, log_every_n_steps=1000, callbacks=[window])
    trainer.fit(module, datamodule=data)
    assert window.steps == 5
    assert dict(window.calls) == {}


def test_a_merged_models_forward_and_backward_make_no_host_sync() -> None:
    model = vitkit.merge_tokens(vitkit.VisionTransformer(
        img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, num_classes=3, locality=True, reg_tokens=2,
        rope="axial"), 3)
    images = torch.randn(2, 3, 16, 16)
    with SyncCounter() as counter:
        model(images).sum().backward()
        with torch.inference_mode():
            logits = model.eval()(images[:1])
    assert dict(counter.calls) == {}
    assert logits.shape == (1, 3) and model.forward_features(images).shape[1] == 19 - 3 * 3


def test_the_counter_sees_a_sync() -> None:
    with SyncCounter() as counter:
        mask = torch.ones(3, dtype=torch.bool)
        bool(mask.all())
        torch.arange(3)[mask].tolist()
    assert sum(counter.calls.values()) == 3
