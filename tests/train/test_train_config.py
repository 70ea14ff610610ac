"""Recipe validation, optimiser groups, schedule, metrics and checkpoint safety (no training)."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
import yaml

import vitkit
from vitkit.data import DataConfig
from vitkit.train import RecipeError, UnsafeCheckpointError, load_checkpoint, load_recipe
from vitkit.train.config import ModelConfig, OptimConfig, TrainerConfig, save_recipe
from vitkit.train.optim import Horizon, param_groups, warmup_cosine
from vitkit.train.run import check_precision

RECIPES = sorted((Path(__file__).parents[2] / "recipes").glob("*.yaml"))


def write_recipe(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "my_recipe.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_shipped_recipes_validate_and_switch_amp_and_checkpointing(recipe: Path) -> None:
    config = load_recipe(recipe, ["trainer.precision=32-true", "model.grad_checkpointing=true"])
    assert config.name == recipe.stem
    assert config.trainer.precision == "32-true" and config.model.grad_checkpointing is True


def test_unknown_key_names_key_file_and_closest_valid_key(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, {"optim": {"weight_decy": 0.1}})
    with pytest.raises(RecipeError) as error:
        load_recipe(path)
    message = str(error.value)
    assert "'optim.weight_decy'" in message and str(path) in message and "'optim.weight_decay'" in message


def test_unknown_override_key_suggests_across_sections() -> None:
    with pytest.raises(RecipeError, match=r"'trainer.lr' in a command-line override.*'optim.lr'"):
        load_recipe({}, ["trainer.lr=0.1"])


def test_unknown_nested_data_key_is_caught() -> None:
    with pytest.raises(RecipeError, match=r"data.augment.paddin.*'data.augment.padding'"):
        load_recipe({"data": {"augment": {"paddin": 2}}})


def test_wrong_type_gives_one_clear_message(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, {"trainer": {"max_epochs": "many"}})
    with pytest.raises(RecipeError, match=r"trainer.max_epochs in .*my_recipe.yaml must be an integer, got 'many'"):
        load_recipe(path)


def test_out_of_range_value_states_the_bound() -> None:
    with pytest.raises(RecipeError, match=r"optim.lr .* out of range: got -1, must be > 0"):
        load_recipe({}, ["optim.lr=-1"])


def test_literal_choice_lists_the_options() -> None:
    with pytest.raises(RecipeError, match=r"trainer.precision .* one of '32-true', 'bf16-mixed', 'bf16-true', '16-mixed'"):
        load_recipe({}, ["trainer.precision=fp8"])


def test_missing_recipe_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_inconsistent_model_is_rejected_before_training() -> None:
    with pytest.raises(RecipeError, match="invalid model section.*divisible"):
        load_recipe({}, ["model.embed_dim=100", "model.num_heads=3"])


def test_odd_batch_with_mixup_is_rejected() -> None:
    with pytest.raises(RecipeError, match="batch_size must be even"):
        load_recipe({}, ["optim.mixup=0.8", "trainer.batch_size=33"])


@pytest.mark.parametrize("data", [["data.name=digits"], ["data.name=shapes", "data.augment.enabled=false"]])
def test_mirrored_test_views_need_a_model_trained_on_mirrored_images(data: list[str]) -> None:
    # digits default to no flips; shapes flip by default, but not with augmentation off
    with pytest.raises(RecipeError, match="trainer.tta .*'hflip'.*never saw: set data.augment.hflip"):
        load_recipe({}, [*data, "trainer.tta=hflip"])
    assert load_recipe({}, ["data.name=shapes", "trainer.tta=hflip"]).trainer.tta == "hflip"
    with pytest.raises(RecipeError, match="trainer.val_tta .*'hflip_shift'.*never saw"):
        load_recipe({}, [*data, "trainer.val_tta=hflip_shift"])


@pytest.mark.parametrize("key", ["tta", "val_tta"])
def test_shifted_test_views_need_a_model_trained_on_shifted_images(key: str) -> None:
    shapes = ["data.name=shapes", "data.augment.hflip=0.5"]
    for crop in (["data.augment.crop=resize"], ["data.augment.crop=pad", "data.augment.padding=0"]):
        with pytest.raises(RecipeError, match=rf"trainer.{key} .*'hflip_shift'.*without shifted images"):
            load_recipe({}, [*shapes, *crop, f"trainer.{key}=hflip_shift"])
    trainer = load_recipe({}, [*shapes, "data.augment.crop=pad", "data.augment.padding=1",
                               f"trainer.{key}=hflip_shift"]).trainer
    assert getattr(trainer, key) == "hflip_shift"


def test_overrides_are_coerced_from_strings() -> None:
    config = load_recipe({}, ["optim.lr=5e-4", "trainer.devices=2", "model.patch_size=2", "data.img_size=[16, 24]",
                              "optim.clip_grad=null", "trainer.limit_train_batches=0.5"])
    assert config.optim.lr == 5e-4 and config.trainer.devices == 2 and config.model.patch_size == (2, 2)
    assert config.data.img_size == (16, 24) and config.optim.clip_grad is None
    assert config.trainer.limit_train_batches == 0.5


def test_malformed_override_is_rejected() -> None:
    with pytest.raises(RecipeError, match="section.key=value"):
        load_recipe({}, ["trainer.max_epochs"])


def test_resolved_recipe_round_trips_through_yaml(tmp_path: Path) -> None:
    config = load_recipe(RECIPES[0], ["model.depth=3", "optim.betas=[0.8, 0.95]"])
    save_recipe(config, tmp_path / "config.yaml")
    assert load_recipe(tmp_path / "config.yaml").to_dict() == config.to_dict()


def test_half_precision_on_cpu_is_refused_with_advice() -> None:
    with pytest.raises(RecipeError, match="16-mixed.*needs a GPU.*bf16-mixed"):
        check_precision(TrainerConfig(precision="16-mixed", accelerator="cpu"))


def test_no_weight_decay_on_norms_biases_pos_embed_and_cls_token() -> None:
    model = vitkit.create_model("vit_cifar_tiny", depth=1, embed_dim=16, num_heads=2)
    no_decay, decay = param_groups(model, weight_decay=0.05)  # timm's order
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert {"pos_embed", "cls_token", "norm.weight", "head.bias", "blocks.0.norm1.weight"} <= no_decay_names
    assert all(names[id(p)].endswith("weight") and p.ndim == 2 for p in decay["params"])
    assert decay["weight_decay"] == 0.05 and no_decay["weight_decay"] == 0.0


def test_schedule_warms_up_linearly_then_decays_to_min_lr() -> None:
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_cosine(optimizer, Horizon(warmup_steps=4, total_steps=20, floor=0.01))
    lrs = []
    for _ in range(20):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.01)


def test_optim_rejects_min_lr_above_lr() -> None:
    with pytest.raises(ValueError, match="min_lr"):
        OptimConfig(lr=1e-4, min_lr=1e-3)


class _RunsCode:
    def __reduce__(self):
        return (Path.touch, (Path("/tmp/vitkit_pwned_marker"),))


def test_tampered_checkpoint_is_refused_without_running_its_code(tmp_path: Path) -> None:
    marker = Path("/tmp/vitkit_pwned_marker")
    marker.unlink(missing_ok=True)
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {"w": torch.zeros(1)}, "payload": _RunsCode()}, path)
    with pytest.raises(UnsafeCheckpointError, match="refusing to load .*last.ckpt.*could run arbitrary code"):
        load_checkpoint(path)
    assert not marker.exists()
    assert isinstance(UnsafeCheckpointError("x"), pickle.UnpicklingError)


def test_plain_checkpoint_loads(tmp_path: Path) -> None:
    state = {"state_dict": {"w": torch.ones(2)}, "hyper_parameters": {"a": [1, 2.0, "x", None, (3, 4)]}}
    path = tmp_path / "ok.ckpt"
    torch.save(state, path)
    loaded = load_checkpoint(path)
    assert loaded["hyper_parameters"] == state["hyper_parameters"]
    assert torch.equal(loaded["state_dict"]["w"], torch.ones(2))


# --- one config system (vitkit.schema) for every section --------------------------------------


def test_model_section_is_a_plain_class_whose_overrides_reach_the_vit_config() -> None:
    config = load_recipe({"model": {"depth": 3, "init": "jax", "patch_size": 8}})
    assert isinstance(config.model, ModelConfig)
    assert config.model.vit_overrides() == {"depth": 3, "init": "jax", "patch_size": (8, 8)}
    vit = config.vit_config(img_size=(32, 32), in_chans=1, num_classes=10)
    assert (vit.depth, vit.init, vit.patch_size, vit.embed_dim) == (3, "jax", (8, 8), 192)  # 192: the variant's


def test_every_section_shares_the_error_style() -> None:
    # The same wording for a wrong type in the model, data, optim, trainer and output sections.
    for key in ("model.embed_dim", "data.num_workers", "optim.warmup_epochs", "trainer.log_every", "output.dir"):
        with pytest.raises(RecipeError, match=rf"^{key} in a command-line override must be .*, got \[1\] \(list\)\.$"):
            load_recipe({}, [f"{key}=[1]"])


def test_direct_construction_validates_like_a_recipe() -> None:
    with pytest.raises(ValueError, match=r"^num_workers is out of range: got -1, must be >= 0 and <= 256\.$"):
        DataConfig(num_workers=-1)
    with pytest.raises(ValueError, match=r"^max_epochs is out of range: got 0, must be >= 1"):
        TrainerConfig(max_epochs=0)
    with pytest.raises(ValueError, match=r"unknown key 'heads' in the arguments\. Did you mean 'num_heads'\?"):
        vitkit.create_model("vit_cifar_tiny", heads=2)


def test_choices_and_numbers_are_coerced_exactly() -> None:
    config = load_recipe({"data": {"in_chans": "3", "img_size": "24"}})  # text, as an override might give
    assert config.data.in_chans == 3 and config.data.img_size == 24
    with pytest.raises(RecipeError, match=r"data.in_chans .* must be 1 or 3 or null, got True \(bool\)"):
        load_recipe({"data": {"in_chans": True}})  # True == 1 in Python, but no channel count
    for value in (".inf", ".nan"):
        with pytest.raises(RecipeError, match=r"optim.lr .* must be a finite number"):
            load_recipe({}, [f"optim.lr={value}"])


def test_config_dicts_round_trip_through_from_dict() -> None:
    data = DataConfig(name="shapes", img_size=(24, 32), mean=[0.5], std=[0.25], augment={"padding": 2})
    assert DataConfig.from_dict(data.to_dict()) == data and data.augment.padding == 2
    vit = vitkit.models.model_config("vit_cifar_small", num_heads=[4, 0, 2, 4, 4, 4, 4], head_dim=64)
    assert vitkit.ViTConfig.from_dict(vit.to_dict()) == vit
