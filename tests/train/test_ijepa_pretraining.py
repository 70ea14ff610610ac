"""I-JEPA through the recipe (``task.name: ijepa``): a tiny pre-training run on digits releases the
target encoder, which a classification recipe fine-tunes; the run resumes with its predictor,
target encoder and step count; options I-JEPA cannot take are refused in one line; the shipped
recipe pre-trains the fast recipe's encoder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tiny_runs import short_recipe

from vitkit.schema import RecipeError
from vitkit.train import load_recipe, train
from vitkit.train.pretraining import finetune_command

RECIPES = Path(__file__).parents[2] / "recipes"


def ijepa_recipe(out_dir: Path, **trainer: object) -> dict:
    """The tiny digits recipe (8x8 images in 2-px patches: a 4x4 grid) pre-training with I-JEPA."""
    recipe = short_recipe(out_dir, monitor="last", **trainer)
    return {**recipe, "name": "tiny_ijepa",
            "task": {"name": "ijepa", "ijepa": {"predictor_depth": 1, "predictor_dim": 16, "predictor_heads": 2}}}


def prefixed(state: dict, prefix: str) -> dict:
    return {key.removeprefix(prefix): value for key, value in state.items() if key.startswith(prefix)}


def test_pretraining_releases_the_target_encoder_which_fine_tunes(tmp_path: Path) -> None:
    result = train(ijepa_recipe(tmp_path / "pre"))
    state = torch.load(result.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    exported = load_file(result.run_dir / "model.safetensors")
    target, model = prefixed(state, "task.target_encoder."), prefixed(state, "model.")
    assert exported.keys() == target.keys() and all(torch.equal(exported[key], target[key]) for key in exported)
    assert not torch.equal(model["blocks.0.attn.qkv.weight"], target["blocks.0.attn.qkv.weight"])  # not the model
    assert "task.predictor.mask_token" in state and not any("predictor" in key for key in exported)
    assert int(state["task.steps"]) == result.summary["global_steps"] == 4
    assert 0.0 <= result.summary["knn_acc1"] <= 100.0

    fine = train(short_recipe(tmp_path / "fine"), [f"model.pretrained={result.run_dir / 'model.safetensors'}"])
    assert fine.model.head.out_features == 10 and fine.summary["test_acc"] is not None


def test_a_run_resumes_with_its_predictor_target_encoder_and_steps(tmp_path: Path) -> None:
    first = train(ijepa_recipe(tmp_path))
    checkpoint = first.run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    resumed = train(ijepa_recipe(tmp_path), ["trainer.max_epochs=2"], resume=checkpoint)
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert resumed.run_dir == first.run_dir and int(state["task.steps"]) == resumed.summary["global_steps"] == 8
    for key in ("task.predictor.mask_token", "task.target_encoder.blocks.0.attn.qkv.weight"):
        assert not torch.equal(state[key], saved[key])  # trained on from the saved values


@pytest.mark.parametrize(("override", "message"), [
    ("optim.mixup=0.8", "optim.mixup=0.8"),
    ("trainer.monitor=val/acc1", "trainer.monitor=val/acc1 (use val/loss or last)"),
    ("model.impl=timm", "model.impl=timm (I-JEPA encodes the context through vitkit's forward_features(keep=))"),
    ("optim.ema=true", "optim.ema=true (the target encoder is the average I-JEPA keeps and releases)"),
    ("task.ijepa.min_keep=1", "task.ijepa.min_keep in a command-line override is 1, but target blocks of 1 patches"),
    ("model.shifted_patches=true", "model.shifted_patches "),
])
def test_options_ijepa_cannot_take_are_refused_in_one_line(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(RecipeError) as error:
        load_recipe(ijepa_recipe(tmp_path), [override])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_the_recipe_pretrains_the_fast_recipes_encoder_and_its_command_fine_tunes_it() -> None:
    ijepa, mae = load_recipe(RECIPES / "ijepa_fashion_mnist.yaml"), load_recipe(RECIPES / "mae_fashion_mnist.yaml")
    shape = ("name", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "patch_embed", "shifted_patches")
    assert ijepa.task.name == "ijepa" and ijepa.data.img_size == 32
    assert all(getattr(ijepa.model, key) == getattr(mae.model, key) for key in shape)
    # the reference encoder's fixed sin-cos positions, and its patch tokens (normed, then averaged) as the features
    assert (ijepa.model.pos_embed, ijepa.model.global_pool, ijepa.model.fc_norm) == ("sincos", "avg", False)
    assert ijepa.trainer.time_budget_minutes == 15 and ijepa.trainer.max_time_minutes is None
    words = finetune_command(ijepa, Path("enc.safetensors"), depth=4).split()
    assert words[:3] == ["vitkit", "train", "fashion_mnist_fast"] and "model.patch_embed=linear" in words
