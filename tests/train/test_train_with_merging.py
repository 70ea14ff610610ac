"""Training with token merging (ToMe trains and fine-tunes with merging on, so that the merged model
is the one the weights were fitted to): ``model.merge_tokens`` in a recipe merges in every training
step, the gradient reaches every weight through the merges, and the exported model records it."""

from __future__ import annotations

from pathlib import Path

import torch
from tiny_runs import SHORT, tiny_recipe

from vitkit.data import build_datasets
from vitkit.train import load_recipe, train
from vitkit.train.run import build_module


def merging_recipe(tmp_path: Path, r: int) -> dict:
    recipe = tiny_recipe(tmp_path / "runs", **SHORT)
    recipe["model"]["merge_tokens"] = r
    return recipe


def test_a_recipes_merge_tokens_merges_in_every_training_step_and_every_weight_learns(tmp_path: Path) -> None:
    config = load_recipe(merging_recipe(tmp_path, 2))
    module = build_module(config, build_datasets(config.data).info).train()
    model = module.model
    images = torch.randn(4, 1, 8, 8)
    # 16 patches and the class token; 2 blocks, each merging 2 pairs: 17 -> 15 -> 13 tokens
    assert model.forward_features(images).shape == (4, 13, 32)
    loss = torch.nn.functional.cross_entropy(model(images), torch.tensor([0, 1, 2, 3]))
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
        if name.startswith("blocks."):
            assert param.grad.abs().sum() > 0, name
    with torch.no_grad():
        merged = model(images)
        model.set_token_merging(0)
        assert not torch.allclose(merged, model(images), atol=1e-4)  # the merges change what is trained


def test_a_run_trained_with_merging_exports_a_model_that_merges(tmp_path: Path) -> None:
    result = train(merging_recipe(tmp_path, 2))
    assert result.model.config.merge_tokens == 2
    assert result.model.merge_schedule == [2, 2]
    assert result.model.forward_features(torch.randn(1, 1, 8, 8)).shape[1] == 13
