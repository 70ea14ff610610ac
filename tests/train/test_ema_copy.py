"""The weight EMA's copy (``optim.ema``) lives outside the LightningModule's children, as the
distillation teacher does, so DDP and FSDP never see it; it still follows the module's device,
dtype and mode, and it is saved and restored under the ``ema.module.*`` keys of the layout in which
the copy was a child (older checkpoints load unchanged)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_runs import tiny_recipe

from vitkit.io import EMA_PREFIX, MODEL_PREFIX
from vitkit.train import load_recipe
from vitkit.train.datamodule import ViTDataModule
from vitkit.train.run import build_module


@pytest.fixture
def recipe(tmp_path: Path) -> dict:
    recipe = tiny_recipe(tmp_path)
    recipe["optim"].update(ema=True, ema_decay=0.5)
    return recipe


def build(recipe: dict, *overrides: str):
    config = load_recipe(recipe, list(overrides))
    return build_module(config, ViTDataModule(config.data, config.trainer.batch_size).info)


def test_ema_copy_is_no_child_and_owns_no_trainable_parameter(recipe: dict) -> None:
    module = build(recipe)
    assert module.ema is not None and "ema" not in dict(module.named_children())
    ema_ids = {id(p) for p in module.ema.parameters()}
    assert ema_ids and not ema_ids & {id(p) for p in module.parameters()}  # what DDP wraps and the optimiser steps
    assert all(not p.requires_grad for p in module.ema.parameters())
    assert not any(m is module.ema.module for m in module.modules())


def test_state_dict_keeps_the_ema_under_the_keys_of_a_child_copy(recipe: dict) -> None:
    module = build(recipe)
    state = module.state_dict()
    model_keys = {key for key in state if key.startswith("model.")}
    # when ModelEmaV3 was the child "ema", its copy's tensors were "ema.module.<the model's names>"
    assert {key for key in state if key.startswith("ema.")} == {"ema.module." + key[len("model."):] for key in model_keys}
    # the prefixes vitkit.io reads a checkpoint by are those the module saves under
    assert model_keys == {MODEL_PREFIX + key for key in module.model.state_dict()}
    assert {key for key in state if key.startswith("ema.")} == {EMA_PREFIX + key for key in module.model.state_dict()}
    torch.testing.assert_close(state["ema.module.head.weight"], module.ema.module.head.weight)


def test_load_state_dict_restores_the_ema_and_refuses_a_checkpoint_without_it(recipe: dict) -> None:
    source, target = build(recipe), build(recipe)
    with torch.no_grad():
        source.ema.module.head.weight.fill_(0.25)
    target.load_state_dict(source.state_dict())  # strict: no key left over or missing
    assert torch.equal(target.ema.module.head.weight, torch.full_like(target.ema.module.head.weight, 0.25))
    without_ema = {key: value for key, value in source.state_dict().items() if not key.startswith("ema.")}
    with pytest.raises(RuntimeError, match=r"Missing key\(s\).*ema\.module\.head\.weight"):
        target.load_state_dict(without_ema)
    plain = build(recipe, "optim.ema=false")
    with pytest.raises(RuntimeError, match=r"Unexpected key\(s\).*ema\.module\.head\.weight"):
        plain.load_state_dict(source.state_dict())


def test_ema_copy_follows_the_module_dtype_and_mode(recipe: dict) -> None:
    module = build(recipe)
    module.to(torch.float64)
    assert module.ema.module.head.weight.dtype == torch.float64
    module.eval()
    assert not module.ema.training and not module.ema.module.blocks[0].training
    module.train()
    assert module.ema.module.blocks[0].training


def test_exported_model_holds_the_ema_weights(recipe: dict) -> None:
    module = build(recipe)
    with torch.no_grad():
        module.ema.module.head.bias.fill_(3.0)
    exported = module.export_model()
    assert torch.equal(exported.head.bias, torch.full_like(exported.head.bias, 3.0))
    assert not torch.equal(exported.head.bias, module.model.head.bias)
