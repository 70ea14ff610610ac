"""Model files and checkpoints of older formats are migrated in one place (``vitkit.io.upgrade``,
``upgrade_state``, ``upgrade_checkpoint``); user-typed old names are refused, never aliased; a file
of a newer format is one line. The old layouts are written out by hand here, as the old code wrote
them, not produced by the upgrade being tested."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.io import (
    CONFIG_KEY,
    EXTRA_KEY,
    FORMAT_KEY,
    FORMAT_VERSION,
    ModelFileError,
    load_model,
    save_model,
    upgrade_checkpoint,
)
from vitkit.models import ViTConfig
from vitkit.schema import ConfigError


def lsa_model() -> vitkit.VisionTransformer:
    model = vitkit.VisionTransformer(img_size=8, patch_size=4, num_classes=3, embed_dim=16, depth=2, num_heads=2,
                                     locality=True).eval()
    with torch.no_grad():
        for block, value in zip(model.blocks, (0.5, 0.9)):
            block.attn.temperature.fill_(value)  # what a per-layer scalar could express
    return model


def write_format_2(model: vitkit.VisionTransformer, path: Path) -> Path:
    """``model`` as format 2 wrote it: ``locality_attention`` in the config, LSA as one per-layer
    ``log_scale`` scalar per block."""
    config = model.config.to_dict()
    config["locality_attention"] = config.pop("locality")
    for key in ("block", "attn_layer", "mlp_layer"):  # fields format 2 did not have
        del config[key]
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith(".attn.temperature")}
    for index, block in enumerate(model.blocks):
        state[f"blocks.{index}.attn.log_scale"] = block.attn.temperature.detach()[0].log()
    metadata = {FORMAT_KEY: "2", CONFIG_KEY: json.dumps(config), EXTRA_KEY: "{}"}
    save_file(state, path, metadata=metadata)
    return path


def test_a_format_2_model_file_with_locality_attention_and_log_scales_loads_with_the_same_outputs(tmp_path: Path) -> None:
    model = lsa_model()
    old = load_model(write_format_2(model, tmp_path / "old.safetensors")).eval()
    assert old.config.locality
    torch.testing.assert_close(old.blocks[1].attn.temperature.detach(), torch.full((2,), 0.9))
    images = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(old(images), model(images), atol=1e-6, rtol=1e-5)


def test_today_s_format_holds_no_old_names_and_a_stray_log_scale_is_refused(tmp_path: Path) -> None:
    path = save_model(lsa_model(), tmp_path / "new.safetensors")
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    assert metadata[FORMAT_KEY] == FORMAT_VERSION and "locality_attention" not in metadata[CONFIG_KEY]
    state = load_file(path)
    state["blocks.0.attn.log_scale"] = torch.tensor(0.0)  # an old tensor in a file that claims today's format
    save_file(state, tmp_path / "mixed.safetensors", metadata=metadata)
    with pytest.raises(ModelFileError, match="blocks.0.attn.log_scale"):
        load_model(tmp_path / "mixed.safetensors")


def test_a_newer_format_is_refused_in_one_line(tmp_path: Path) -> None:
    model = lsa_model()
    metadata = {FORMAT_KEY: "99", CONFIG_KEY: json.dumps(model.config.to_dict()), EXTRA_KEY: "{}"}
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, tmp_path / "future.safetensors",
              metadata=metadata)
    with pytest.raises(ModelFileError, match="format '99', newer than this vitkit reads") as error:
        load_model(tmp_path / "future.safetensors")
    assert "\n" not in str(error.value)


def test_an_old_key_typed_by_a_user_is_refused_with_the_new_name() -> None:
    with pytest.raises(ConfigError, match="'locality_attention' in the given dict was renamed to 'locality'"):
        ViTConfig.from_dict({"locality_attention": True})
    with pytest.raises(ConfigError, match="'model.locality_attention' in a command-line override was renamed to "
                                          "'model.locality'"):
        vitkit.train.load_recipe("quickstart", ["model.locality_attention=true"])


def test_an_old_checkpoint_s_optimizer_groups_are_put_in_timm_s_order_with_their_state() -> None:
    """Format 2 kept AdamW's decayed group first; torch numbers parameters group by group."""
    decayed, undecayed = {"weight_decay": 0.05, "lr": 1e-3, "params": [0, 1]}, {"weight_decay": 0.0, "lr": 1e-3, "params": [2]}
    state = {0: {"exp_avg": torch.tensor([0.0])}, 1: {"exp_avg": torch.tensor([1.0])}, 2: {"exp_avg": torch.tensor([2.0])}}
    checkpoint = {
        "hyper_parameters": {"vit_config": {"locality_attention": False}, FORMAT_KEY: "2"},
        "state_dict": {},
        "optimizer_states": [{"state": state, "param_groups": [decayed, undecayed]}],
        "lr_schedulers": [{"base_lrs": [1e-3, 2e-3], "_last_lr": [1e-4, 2e-4], "last_epoch": 7}],
    }
    upgraded = upgrade_checkpoint(checkpoint)
    optimizer = upgraded["optimizer_states"][0]
    assert [g["weight_decay"] for g in optimizer["param_groups"]] == [0.0, 0.05]
    assert [g["params"] for g in optimizer["param_groups"]] == [[0], [1, 2]]
    assert [float(optimizer["state"][i]["exp_avg"]) for i in range(3)] == [2.0, 0.0, 1.0]
    assert upgraded["lr_schedulers"][0]["base_lrs"] == [2e-3, 1e-3] and upgraded["lr_schedulers"][0]["last_epoch"] == 7
    assert upgraded["hyper_parameters"]["vit_config"] == {"locality": False}
    assert upgraded["hyper_parameters"][FORMAT_KEY] == FORMAT_VERSION
    assert upgrade_checkpoint(upgraded) is upgraded  # today's format: untouched


def test_save_model_without_a_suffix_writes_safetensors_that_load_model_finds_by_either_name(tmp_path: Path) -> None:
    model = lsa_model()
    written = save_model(model, tmp_path / "pruned")
    assert written == tmp_path / "pruned.safetensors" and written.is_file() and not (tmp_path / "pruned").exists()
    images = torch.randn(1, 3, 8, 8)
    for name in ("pruned", "pruned.safetensors"):
        torch.testing.assert_close(load_model(tmp_path / name).eval()(images), model(images))


# --- damaged files of an older format: one line naming the bad tensor, as today's files get ------


def write_format_1_rope(path: Path, damage: str = "") -> Path:
    """An axial-RoPE model as format 1 wrote it: a learned ``pos_embed`` with a row for the class
    token; ``damage`` drops (``'no-cls'``) or misshapes (``'bad-cls'``) the class token."""
    model = vitkit.VisionTransformer(img_size=8, patch_size=4, num_classes=3, embed_dim=16, depth=1, num_heads=2,
                                     rope="axial", pos_embed="learn")
    config = model.config.to_dict()
    for key in ("block", "attn_layer", "mlp_layer", "pos_drop_rate"):  # fields format 1 did not have
        config.pop(key, None)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    state["pos_embed"] = torch.cat([torch.zeros(1, 1, 16), state["pos_embed"]], dim=1)
    if damage == "no-cls":
        del state["cls_token"]
    elif damage == "bad-cls":
        state["cls_token"] = torch.zeros(1, 1, 8)
    save_file(state, path, metadata={FORMAT_KEY: "1", CONFIG_KEY: json.dumps(config), EXTRA_KEY: "{}"})
    return path


def test_a_format_1_drop_rate_also_drops_the_position_embedded_tokens_as_it_did(tmp_path: Path) -> None:
    model = vitkit.VisionTransformer(img_size=8, patch_size=4, num_classes=3, embed_dim=16, depth=1, num_heads=2,
                                     drop_rate=0.1)
    config = model.config.to_dict()
    for key in ("block", "attn_layer", "mlp_layer", "pos_drop_rate"):  # fields format 1 did not have
        config.pop(key, None)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / "old.safetensors"
    save_file(state, path, metadata={FORMAT_KEY: "1", CONFIG_KEY: json.dumps(config), EXTRA_KEY: "{}"})
    loaded = load_model(path).config
    assert (loaded.drop_rate, loaded.pos_drop_rate) == (0.1, 0.1)


@pytest.mark.parametrize(("damage", "named"), [("no-cls", "cls_token missing"),
                                               ("bad-cls", "cls_token is [1, 1, 8], the model needs [1, 1, 16]")])
def test_a_damaged_format_1_rope_file_is_one_line_naming_the_class_token(tmp_path: Path, damage: str, named: str) -> None:
    load_model(write_format_1_rope(tmp_path / "whole.safetensors"))  # the undamaged file loads
    with pytest.raises(ModelFileError, match="do not match its model config") as error:
        load_model(write_format_1_rope(tmp_path / "damaged.safetensors", damage))
    assert named in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("name", ["blocks.99.attn.log_scale", "blocks.x.attn.log_scale"])
def test_a_format_2_log_scale_of_no_block_is_named_as_an_unexpected_tensor(tmp_path: Path, name: str) -> None:
    path = write_format_2(lsa_model(), tmp_path / "old.safetensors")
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as handle:
        metadata = handle.metadata()
    state = {**load_file(path), name: torch.tensor(0.0)}
    save_file(state, tmp_path / "damaged.safetensors", metadata=metadata)
    with pytest.raises(ModelFileError, match=f"unexpected {name}") as error:
        load_model(tmp_path / "damaged.safetensors")
    assert "not a readable safetensors file" not in str(error.value)


@pytest.mark.parametrize("optimizer_states", [
    5,
    [{"state": {}, "param_groups": [{"weight_decay": 0.05}, {"weight_decay": 0.0, "params": [2]}]}],
    [{"state": {7: {}}, "param_groups": [{"weight_decay": 0.05, "params": [0]}, {"weight_decay": 0.0, "params": [1]}]}],
    [{"state": [], "param_groups": [{"weight_decay": "x", "params": [0]}, {"weight_decay": 0.0, "params": [1]}]}],
], ids=["an-int", "a-group-without-params", "state-of-no-parameter", "a-string-decay"])
def test_a_damaged_old_checkpoint_s_optimiser_state_is_left_for_the_resume_check_to_name(optimizer_states) -> None:
    checkpoint = {"hyper_parameters": {"vit_config": {"locality_attention": False}, FORMAT_KEY: "2"}, "state_dict": {},
                  "optimizer_states": optimizer_states, "lr_schedulers": 3}
    upgraded = upgrade_checkpoint(checkpoint)  # no KeyError or TypeError
    assert upgraded["optimizer_states"] == optimizer_states and upgraded["lr_schedulers"] == 3
