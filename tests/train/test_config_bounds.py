"""Bounded configs: every limit is enforced from a recipe and from a model file's metadata, before
anything is allocated; alias bombs, huge values and empty recipes get one short message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from vitkit import ViTConfig, load_model
from vitkit.data import DataConfig
from vitkit.data.config import CROP_MODES, DATASET_DEFAULTS, DATASET_NAMES, SHAPES_STYLES, CropMode, ShapesStyle
from vitkit.io import CONFIG_KEY, EXTRA_KEY, FORMAT_KEY, ModelFileError, read_model_file
from vitkit.models import model_config
from vitkit.schema import MAX_ECHO_CHARS, MAX_YAML_NODES, ConfigError
from vitkit.train import RecipeError, load_recipe

ROOT = Path(__file__).resolve().parents[2]
#: A valid tiny model config (the base every model-file case edits one field of).
TINY = model_config("vit_cifar_tiny", embed_dim=16, depth=2, num_heads=2).to_dict()


def write_model_file(
    path: Path,
    config: Any,
    extra: Any = None,
    *,
    raw: dict[str, str] | None = None,
    tensors: dict[str, torch.Tensor] | None = None,
) -> Path:
    """A safetensors file whose vitkit metadata holds ``config`` and ``extra`` (or ``raw`` strings),
    with ``tensors`` (default: one placeholder, for files refused on their metadata)."""
    metadata = {FORMAT_KEY: "1", CONFIG_KEY: json.dumps(config), EXTRA_KEY: json.dumps(extra or {}), **(raw or {})}
    save_file(tensors or {"w": torch.zeros(1)}, str(path), metadata=metadata)
    return path


# (recipe key, value, message) for every ViTConfig limit; the model file sets the same field.
MODEL_BOUNDS = [
    ("model.patch_size", 0, r"patch_size in .* is out of range: got \[0, 0\], must be >= 1 and <= 4096"),
    ("model.num_heads", 0, r"num_heads in .* is out of range: got 0, must be >= 1 and <= 1024"),
    ("model.num_heads", -3, r"num_heads in .* is out of range: got -3, must be >= 0 and <= 1024"),
    ("model.depth", 10**6, r"depth in .* is out of range: got 1000000, must be >= 1 and <= 512"),
    ("model.embed_dim", 10**7, r"embed_dim in .* is out of range: got 10000000, must be >= 1 and <= 16384"),
    ("model.mlp_ratio", 0, r"mlp_ratio in .* is out of range: got 0, must be > 0 and <= 64"),
    ("model.drop_path_rate", 1.0, r"drop_path_rate in .* is out of range: got 1, must be >= 0 and < 1"),
    ("model.head_dim", 0, r"head_dim in .* is out of range: got 0, must be >= 1 and <= 4096"),
    ("model.depth", "deep", r"depth in .* must be an integer( or null)?, got 'deep' \(str\)"),
    ("model.qkv_bias", 3, r"qkv_bias in .* must be true or false( or null)?, got 3 \(int\)"),
    (
        "data.img_size",
        100000,
        r"img_size in .* is out of range: got (100000|\[100000, 100000\]), must be >= 1 and <= 4096",
    ),
    ("data.in_chans", 2, r"in_chans in .* must be 1 or 3( or null)?, got 2 \(int\)"),
    ("model.embed_dim", 100, r"embed_dim \(100\) must be divisible by num_heads \(3\)"),
    ("model.patch_size", 5, r"img_size height 32 is not divisible by patch_size 5"),
]


@pytest.mark.parametrize(("key", "value", "message"), MODEL_BOUNDS, ids=lambda v: str(v)[:20])
def test_model_limits_are_enforced_from_recipes(key: str, value: Any, message: str) -> None:
    recipe = {"model": {"num_heads": 3}} if "divisible by num_heads" in message else {}
    section, field = key.split(".")
    recipe.setdefault(section, {})[field] = value
    with pytest.raises(RecipeError, match=message.replace("in .*", "in the recipe dict")):
        load_recipe(recipe)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [*MODEL_BOUNDS, ("model.depth", None, r"depth in .* must be an integer, got None")],  # a recipe's null: unset
    ids=lambda v: str(v)[:20],
)
def test_model_limits_are_enforced_from_model_files(tmp_path: Path, key: str, value: Any, message: str) -> None:
    field = key.split(".")[1]
    config = {**TINY, "num_heads": 3, "embed_dim": 48} if "divisible by num_heads" in message else dict(TINY)
    config[field] = value
    path = write_model_file(tmp_path / "bad.safetensors", config)
    with pytest.raises(ModelFileError, match=message) as error:
        load_model(path)
    assert f"in the metadata of model file {path}" in str(error.value)


def test_model_size_cap_catches_what_no_single_field_does() -> None:
    # Each value is within its own range; together (vit_cifar_tiny's mlp_ratio is 2) the blocks hold
    # 512 x (4 x 16384^2 attention + 2 x 16384 x 32768 MLP) = 1.0995e12 weights.
    with pytest.raises(
        RecipeError, match=r"invalid model section in .*: this model would hold about 1\.1e\+12 weights"
    ):
        load_recipe({"model": {"depth": 512, "embed_dim": 16384, "num_heads": 16}})
    with pytest.raises(ValueError, match=r"gives 16,777,216 patches, more than the limit of 65,536"):
        ViTConfig(img_size=4096, patch_size=1, embed_dim=8, depth=1, num_heads=1)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["trainer.devices=0"],
            r"trainer.devices in a command-line override must be 'auto', a device count in \[1, 1024\]",
        ),
        (["trainer.devices=-1"], r"trainer.devices .* got -1 \(int\)"),
        (["trainer.devices=[0, 0]"], r"trainer.devices .* distinct device ids in \[0, 1023\], got \[0, 0\]"),
        (
            ["trainer.devices=some"],
            r"trainer.devices .* must be an integer or a list of integers or 'auto', got 'some' \(str\)",
        ),
        (["trainer.batch_size=0"], r"trainer.batch_size .* out of range: got 0, must be >= 1 and <= 1048576"),
        (["trainer.max_epochs=null"], r"trainer.max_epochs .* must be an integer, got None"),
        (["trainer.seed=-1"], r"trainer.seed .* out of range: got -1, must be >= 0"),
        (["data.name=shapes", "data.mean=[0.5, 0.5]"], r"data.mean in .* has 2 values but images have 3 channel"),
        (["data.std=[0]"], r"data.std in .* is out of range: got \[0.0\], must be > 0"),
        (["data.std=0"], r"data.std in .* must be a list of finite numbers or null, got 0 \(int\)"),
        (["data.mean=[.nan]"], r"data.mean in .* must be a list of finite numbers or null, got \[nan\]"),
        (["data.shapes_num_samples=100000000"], r"data.shapes_num_samples .* must be >= 30 and <= 1000000"),
        (["data.num_workers=-1"], r"data.num_workers .* must be >= 0 and <= 256"),
        (["data.augment.padding=100000"], r"data.augment.padding .* must be >= 0 and <= 4096"),
        (["optim.betas=[0.9, 1.5]"], r"optim.betas .* out of range: got \[0.9, 1.5\], must be >= 0 and < 1"),
    ],
)
def test_trainer_data_and_optim_limits(overrides: list[str], message: str) -> None:
    with pytest.raises(RecipeError, match=message):
        load_recipe({}, overrides)


def test_valid_device_settings_still_load() -> None:
    for value, expected in (("2", 2), ("[0, 3]", [0, 3]), ("auto", "auto")):
        assert load_recipe({}, [f"trainer.devices={value}"]).trainer.devices == expected


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"class_names": ["a", "b"]}, r"class_names in .* has 2 names for the model's 10 classes"),
        ({"class_names": "abcdefghij"}, r"class_names in .* must be a list of strings or null"),
        ({"mean": [0.5, 0.5]}, r"mean in .* has 2 values for the model's 3 channel"),
        ({"std": [0.2, 0.0, 0.2]}, r"std in .* is out of range: got \[0.2, 0.0, 0.2\], must be > 0"),
        ({"std": None, "mean": "gray"}, r"mean in .* must be a list of finite numbers or null, got 'gray'"),
    ],
)
def test_model_file_extra_metadata_is_checked(tmp_path: Path, extra: dict, message: str) -> None:
    path = write_model_file(tmp_path / "m.safetensors", TINY, extra)
    with pytest.raises(ModelFileError, match=message) as error:
        read_model_file(path)
    assert f"model file {path}" in str(error.value)


@pytest.mark.parametrize("key", [CONFIG_KEY, EXTRA_KEY])
def test_bad_json_in_model_metadata_names_the_file(tmp_path: Path, key: str) -> None:
    path = write_model_file(tmp_path / "broken.safetensors", TINY, raw={key: '{"depth": 2,'})
    with pytest.raises(
        ModelFileError, match=rf"model file .*broken.safetensors: its metadata '{key}' is not valid JSON"
    ):
        read_model_file(path)
    path = write_model_file(tmp_path / "list.safetensors", TINY, raw={key: "[1, 2]"})
    with pytest.raises(
        ModelFileError, match=rf"list.safetensors: its metadata '{key}' must be a JSON object, got list"
    ):
        read_model_file(path)


def test_model_files_with_an_unknown_config_key_are_refused_by_name(tmp_path: Path) -> None:
    path = write_model_file(tmp_path / "old.safetensors", {**TINY, "extra": {}})
    with pytest.raises(ModelFileError, match=r"unknown key 'extra' in the metadata of model file .*old\.safetensors"):
        read_model_file(path)


@pytest.mark.parametrize(
    ("recipe", "overrides", "hint"),
    [
        ({"model": {"dept": 3}}, [], "'model.depth'"),
        ({"data": {"img_szie": 16}}, [], "'data.img_size'"),
        ({"optim": {"warmup_epoch": 1}}, [], "'optim.warmup_epochs'"),
        ({}, ["trainer.max_epoch=3"], "'trainer.max_epochs'"),
        ({"output": {"dri": "x"}}, [], "'output.dir'"),
    ],
)
def test_unknown_keys_suggest_the_closest_in_every_section(recipe: dict, overrides: list[str], hint: str) -> None:
    with pytest.raises(RecipeError, match=f"unknown key .* Did you mean {hint}"):
        load_recipe(recipe, overrides)


def test_unknown_key_in_model_file_and_config_dicts_suggests_the_closest(tmp_path: Path) -> None:
    path = write_model_file(tmp_path / "m.safetensors", {**TINY, "dept": 2})
    with pytest.raises(
        ModelFileError, match=r"unknown key 'dept' in the metadata of model file .*\. Did you mean 'depth'"
    ):
        read_model_file(path)
    with pytest.raises(
        ConfigError, match=r"unknown key 'val_fractoin' in the given dict\. Did you mean 'val_fraction'"
    ):
        DataConfig.from_dict({"val_fractoin": 0.1})


def test_choice_lists_come_from_the_literals_and_name_every_option() -> None:
    assert CROP_MODES == typing.get_args(CropMode) and SHAPES_STYLES == typing.get_args(ShapesStyle)
    assert set(DATASET_NAMES) == set(DATASET_DEFAULTS)  # every dataset a recipe may name has defaults
    with pytest.raises(RecipeError) as error:
        load_recipe({}, ["data.augment.crop=zoom"])
    assert all(repr(mode) in str(error.value) for mode in CROP_MODES)
    with pytest.raises(RecipeError, match=r"data.name .* got 'cifar1' \(str\)\. Did you mean 'cifar10'\?"):
        load_recipe({}, ["data.name=cifar1"])


def alias_bomb(levels: int = 8, width: int = 10) -> str:
    """YAML whose last anchor expands to ``width ** levels`` integers (10^8 by default) in a few
    hundred bytes, all under the valid key ``trainer.max_epochs``."""
    lines = ["trainer:", "  max_epochs:", f"    - &l0 [{', '.join(['1'] * width)}]"]
    lines += [f"    - &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_is_refused_before_expansion_with_a_short_message(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    assert len(path.read_text()) < 1000
    with pytest.raises(
        RecipeError, match=rf"expands to {MAX_YAML_NODES + 1:,} YAML nodes .* more than the limit"
    ) as error:
        load_recipe(path)
    assert str(path) in str(error.value) and len(str(error.value)) < 400


def test_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "loop.yaml"
    path.write_text("trainer:\n  max_epochs: &a [*a]\n")
    with pytest.raises(RecipeError, match="recursive YAML alias"):
        load_recipe(path)


def test_a_small_alias_use_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "ok.yaml"
    path.write_text("optim:\n  betas: &b [0.9, 0.95]\ndata:\n  name: shapes\n  shapes_scale: [0.3, 0.6]\n")
    assert load_recipe(path).optim.betas == (0.9, 0.95)


def test_echoed_values_are_capped_however_large() -> None:
    level = [1] * 10
    for _ in range(7):  # 10^8 integers through shared lists, as a YAML alias bomb builds them
        level = [level] * 10
    with pytest.raises(RecipeError, match=r"trainer.max_epochs in the recipe dict must be an integer") as error:
        load_recipe({"trainer": {"max_epochs": level}})
    assert len(str(error.value)) < 2 * MAX_ECHO_CHARS + 100
    with pytest.raises(RecipeError) as error:
        load_recipe({"output": {"dir": ["x" * 10**6]}})
    assert len(str(error.value)) < 2 * MAX_ECHO_CHARS + 100
    with pytest.raises(RecipeError) as error:
        load_recipe({"y" * 10**6: 1})
    assert len(str(error.value)) < 2 * MAX_ECHO_CHARS + 200


@pytest.mark.parametrize("text", ["", "# all commented out\n", "---\n"])
def test_empty_recipe_file_is_an_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError, match=rf"recipe file {path} is empty"):
        load_recipe(path)


def test_train_tool_refuses_an_alias_bomb_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    env = {**os.environ, "NO_ALBUMENTATIONS_UPDATE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "tools/train.py", str(path)], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: recipe file") and "YAML nodes" in lines[0], done.stderr
