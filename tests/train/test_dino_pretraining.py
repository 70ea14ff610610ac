"""DINO through the recipe: a tiny pre-training run on digits writes the teacher's backbone as a
headless ``model.safetensors`` that a classification recipe fine-tunes, a DINO run resumes with
its teacher, centre and schedules, and a recipe DINO cannot take is refused in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from tiny_runs import dino_recipe, run_tool, short_recipe, tiny_recipe

from vitkit import load_model
from vitkit.pretrained import read_pretrained
from vitkit.schema import RecipeError
from vitkit.train import load_recipe, train


def test_dino_pretrain_exports_teacher_that_finetunes(tmp_path: Path) -> None:
    result = train(dino_recipe(tmp_path / "pre"))
    state = torch.load(result.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    exported = load_file(result.run_dir / "model.safetensors")
    teacher = {key.removeprefix("task.teacher_backbone."): value for key, value in state.items()
               if key.startswith("task.teacher_backbone.")}
    assert exported.keys() == teacher.keys() and "head.weight" not in exported
    assert all(torch.equal(exported[key], teacher[key]) for key in exported)  # the teacher, not the student
    assert not torch.equal(state["model.blocks.0.attn.qkv.weight"], teacher["blocks.0.attn.qkv.weight"])
    assert state["task.center"].abs().sum() > 0 and state["task.epoch_progress"] == pytest.approx(1.0)
    assert result.summary["global_steps"] == 4

    fine = train(short_recipe(tmp_path / "fine"), [f"model.pretrained={result.run_dir / 'model.safetensors'}"])
    assert fine.model.head.out_features == 10 and fine.summary["test_acc"] is not None


def test_dino_checkpoint_reads_as_the_teacher_its_run_releases(tmp_path: Path) -> None:
    result = train(dino_recipe(tmp_path))
    checkpoint = result.run_dir / "checkpoints" / "last.ckpt"
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    teacher = {key.removeprefix("task.teacher_backbone."): value for key, value in state.items()
               if key.startswith("task.teacher_backbone.")}
    student = {key.removeprefix("model."): value for key, value in state.items() if key.startswith("model.")}
    assert not torch.equal(student["blocks.0.attn.qkv.weight"], teacher["blocks.0.attn.qkv.weight"])
    for read in (load_model(checkpoint).state_dict(), read_pretrained(checkpoint).state):  # maps/export, model.pretrained
        assert read.keys() == teacher.keys()
        assert all(torch.equal(read[key], teacher[key]) for key in teacher)


def test_dino_run_resumes_with_its_teacher_and_centre(tmp_path: Path) -> None:
    first = train(dino_recipe(tmp_path))
    checkpoint = first.run_dir / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)["state_dict"]
    resumed = train(dino_recipe(tmp_path), ["trainer.max_epochs=2"], resume=checkpoint)
    state = torch.load(resumed.run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert resumed.summary["global_steps"] == 8 and resumed.run_dir == first.run_dir
    assert state["task.epoch_progress"] == pytest.approx(2.0)
    assert not torch.equal(state["task.center"], saved["task.center"])  # moved on from the saved centre


@pytest.mark.parametrize(("override", "message"), [
    ("optim.mixup=0.8", "is 'dino', which pre-trains without labels, but the recipe sets classification options: optim.mixup=0.8; remove"),
    ("trainer.monitor=val/acc1", "trainer.monitor=val/acc1 (use val/loss or last)"),
    ("model.impl=timm", "model.impl=timm (DINO trains vitkit's model)"),
    ("optim.ema=true", "optim.ema=true (the teacher is the average DINO keeps and releases)"),
])
def test_dino_refuses_options_it_cannot_take_in_one_line(tmp_path: Path, override: str, message: str) -> None:
    with pytest.raises(RecipeError, match="^task.name ") as error:
        load_recipe(dino_recipe(tmp_path), [override])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_dino_local_crops_need_dynamic_img_size_one_line(tmp_path: Path) -> None:
    recipe = dino_recipe(tmp_path)
    recipe["model"]["dynamic_img_size"] = False
    path = tmp_path / "dino.yaml"
    path.write_text(yaml.safe_dump(recipe))
    done = run_tool("-m", "vitkit.cli.main", "train", str(path))
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"error: task.dino.local_size in {path} is 4, not the model's img_size 8: set model.dynamic_img_size=true (the "
        "position embedding is resampled to each crop's grid)."
    ]
    assert not (tmp_path / "runs").exists()


def test_tiny_recipe_stays_classification(tmp_path: Path) -> None:
    assert load_recipe(tiny_recipe(tmp_path)).task.name == "classify"


def test_dino_recipe_has_the_fast_recipes_model_so_that_it_fine_tunes() -> None:
    dino, fast = load_recipe("dino_fashion_mnist"), load_recipe("fashion_mnist_fast")
    assert dino.task.name == "dino" and dino.data.name == fast.data.name and dino.data.img_size == fast.data.img_size
    assert {**fast.model.vit_overrides(), "dynamic_img_size": True} == dino.model.vit_overrides()
