"""The third correctness audit: vitkit against timm (the reference) on the options where the two
used to differ silently: the timm twin of every option combination, ``drop_rate`` /
``pos_drop_rate``, ``fc_norm`` with a distillation token, RoPE's absolute embedding, the options
that do nothing, old model files, and ``vit_flops`` against torch's FLOP counter."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from torch.utils.flop_counter import FlopCounterMode

from vitkit import load_model, save_model
from vitkit.errors import UnsupportedModelError
from vitkit.io import CONFIG_KEY, FORMAT_KEY, FORMAT_VERSION
from vitkit.models import VisionTransformer, ViTConfig, from_timm, to_timm, vit_flops
from vitkit.models.timm_interop import timm_twin_lacks
from vitkit.schema import FieldError

BASE = dict(img_size=(16, 16), patch_size=(4, 4), embed_dim=32, depth=2, num_heads=4, num_classes=5)


def build(**overrides: Any) -> VisionTransformer:
    """A tiny model with every weight moved off its init (so no option hides behind a zero)."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**{**BASE, **overrides})).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn_like(param))
    return model


# ------------------------------------------------------------------ 1. the twin of every option
#: Every option whose twin once differed silently, crossed (gelu_tanh and sincos are crossed with
#: RoPE in the tests below and in test_timm_eva.py).
GRID = {
    "act_layer": ["gelu", "quick_gelu"],
    "pool": [("token", True, 0), ("avg", False, 0), ("avg", True, 1), ("map", False, 0), ("map", True, 0)],
    "fc_norm": [None, True],
    "distilled": [False, True],
    "extra": [{}, {"pre_norm": True}, {"pos_embed": "learn", "pos_drop_rate": 0.1}],
}


def combinations(rope: str) -> list[dict[str, Any]]:
    found = []
    for act, (pool, cls, regs), fc_norm, distilled, extra in itertools.product(*GRID.values()):
        values = dict(rope=rope, act_layer=act, global_pool=pool, class_token=cls, reg_tokens=regs, fc_norm=fc_norm,
                      distilled=distilled, depth=1, **extra)
        try:
            ViTConfig(**{**BASE, **values})
        except ValueError:
            continue  # a combination vitkit itself refuses (e.g. distilled with avg pooling)
        found.append(values)
    return found


@pytest.mark.parametrize("rope", ["none", "axial", "mixed"])
def test_every_option_combination_converts_both_ways_with_equal_logits_or_is_refused(rope: str) -> None:
    x = torch.randn(2, 3, 16, 16)
    converted = refused = 0
    for values in combinations(rope):
        model = build(**values)
        if timm_twin_lacks(model.config):
            with pytest.raises(UnsupportedModelError, match="cannot express"):
                to_timm(model)
            refused += 1
            continue
        twin = to_timm(model).eval()
        expected = model(x)
        back = from_timm(twin).eval()
        for name, converted_model in (("to_timm", twin), ("from_timm(to_timm)", back)):
            difference = (converted_model(x) - expected).abs().max().item()
            assert difference < 1e-4, f"{name} of {values} differs by {difference:.2e}"
        converted += 1
    assert converted >= 20 and (refused > 10) == (rope != "none")


@pytest.mark.parametrize(("values", "feature"), [
    (dict(rope="axial", act_layer="quick_gelu"), "exact GELU"),
    (dict(rope="mixed", act_layer="gelu_tanh"), "exact GELU"),
    (dict(rope="axial", global_pool="map"), "pools over the prefix tokens"),
    (dict(rope="axial", distilled=True), "distillation token"),
])
def test_rope_options_timms_eva_ignores_are_refused_in_one_line(values: dict[str, Any], feature: str) -> None:
    with pytest.raises(UnsupportedModelError, match=feature) as caught:
        to_timm(build(**values))
    assert "\n" not in str(caught.value)


def test_timm_reference_run_of_a_rope_recipe_timm_cannot_express_is_refused() -> None:
    from vitkit.train import RecipeError, load_recipe

    with pytest.raises(RecipeError, match="also set model.act_layer=gelu"):
        load_recipe("recipes/quickstart.yaml", ["model.impl=timm", "model.rope=axial", "model.act_layer=quick_gelu"])
    load_recipe("recipes/quickstart.yaml", ["model.impl=timm", "model.rope=axial"])


# ---------------------------------------------------------- 2. drop_rate and pos_drop_rate as timm
def test_drop_rate_is_the_classifiers_dropout_and_pos_drop_rate_the_tokens_as_timm() -> None:
    model = build(drop_rate=0.3)
    assert isinstance(model.pos_drop, torch.nn.Identity) and model.head_drop.p == 0.3
    model = build(pos_drop_rate=0.2)
    assert model.pos_drop.p == 0.2 and isinstance(model.head_drop, torch.nn.Identity)
    for config in (model.config, model.config.replace(rope="axial")):
        twin = to_timm(VisionTransformer(config))
        assert twin.pos_drop.p == 0.2 and getattr(twin.head_drop, "p", 0.0) == 0.0


# ------------------------------------------------------------------ 3. fc_norm with distillation
def test_fc_norm_with_a_distillation_token_is_refused_as_timms_deit_ignores_it() -> None:
    with pytest.raises(FieldError, match="fc_norm"):
        ViTConfig(**BASE, distilled=True, fc_norm=True)
    ViTConfig(**BASE, distilled=True, fc_norm=False)


# ------------------------------------------------------------------------ 4. RoPE and positions
def test_rope_models_have_no_absolute_embedding_unless_asked_and_then_on_the_patches_only() -> None:
    assert build(rope="axial").pos_embed is None and build(rope="mixed").pos_embed is None
    assert build().pos_embed.shape == (1, 17, 32)  # without RoPE: learned, class row included (timm's ViT)
    ape = build(rope="mixed", pos_embed="learn")
    assert ape.pos_embed.shape == (1, 16, 32)  # Heo et al.'s +APE: patches only
    twin = to_timm(ape)
    assert twin.no_embed_class and twin.pos_embed.shape == (1, 16, 32)


@pytest.mark.parametrize(("values", "key"), [
    (dict(rope="mixed", rope_axes="ij"), "rope_axes"),
    (dict(rope_axes="ij"), "rope_axes"),
    (dict(rope_theta=10.0), "rope_theta"),
    (dict(rope="axial", no_embed_class=True, pos_embed="learn"), "no_embed_class"),
    (dict(pos_embed="none", no_embed_class=True), "no_embed_class"),
])
def test_options_that_do_nothing_in_a_combination_are_refused_in_one_line(values: dict[str, Any], key: str) -> None:
    with pytest.raises(FieldError, match=key) as caught:
        ViTConfig(**BASE, **values)
    assert caught.value.key == key and "\n" not in str(caught.value)


# ---------------------------------------------------------------------------- old model files
def write_format_1(model: VisionTransformer, path: Path, config: dict[str, Any], state: dict[str, torch.Tensor]) -> Path:
    """A model file as vitkit wrote it before format 2 (every field explicit, no pos_drop_rate)."""
    metadata = {FORMAT_KEY: "1", CONFIG_KEY: json.dumps(config), "vitkit_extra": "{}"}
    save_file({k: v.contiguous() for k, v in state.items()}, str(path), metadata=metadata)
    return path


def test_an_old_files_drop_rate_still_drops_the_tokens_and_new_files_record_the_format(tmp_path: Path) -> None:
    model = build(drop_rate=0.25)
    old = model.config.to_dict()
    del old["pos_drop_rate"]
    old["pos_embed"] = "learn"
    loaded = load_model(write_format_1(model, tmp_path / "old.safetensors", old, model.state_dict()))
    assert loaded.pos_drop.p == 0.25 and loaded.head_drop.p == 0.25
    from safetensors import safe_open

    path = save_model(model, tmp_path / "new.safetensors")
    with safe_open(str(path), framework="pt") as handle:
        assert handle.metadata()[FORMAT_KEY] == FORMAT_VERSION == "3"
    assert isinstance(load_model(path).pos_drop, torch.nn.Identity)


def test_an_old_rope_file_with_a_class_row_keeps_its_logits(tmp_path: Path) -> None:
    """Before format 2, a RoPE model's learned table had a class-token row: it folds into the token."""
    new = build(rope="axial", pos_embed="learn")
    state = new.state_dict()
    row = 0.5 * torch.randn(1, 1, 32)
    old_state = {**state, "pos_embed": torch.cat([row, state["pos_embed"]], 1), "cls_token": state["cls_token"] - row}
    config = {**new.config.to_dict(), "pos_embed": "learn", "rope_axes": "xy"}
    del config["pos_drop_rate"]
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        tokens = new.patch_embed(x) + state["pos_embed"]
        by_hand = torch.cat([(old_state["cls_token"] + row).expand(2, -1, -1), tokens], 1)  # old layout, by hand
        for block in new.blocks:
            by_hand = block(by_hand, positions=new.token_positions(x))
        expected = new.forward_head(new.norm(by_hand))
    loaded = load_model(write_format_1(new, tmp_path / "old.safetensors", config, old_state))
    assert loaded.pos_embed.shape == (1, 16, 32)
    torch.testing.assert_close(loaded(x), expected)


# ------------------------------------------------------------------------------- 5. vit_flops
@pytest.mark.parametrize("values", [
    {}, dict(patch_embed="conv"), dict(reg_tokens=2), dict(distilled=True), dict(global_pool="map", class_token=False),
    dict(rope="axial"), dict(rope="mixed"), dict(shifted_patches=True, locality=True),
    dict(global_pool="avg", class_token=False, num_classes=0), dict(img_size=(32, 32), patch_embed="conv", patch_size=(8, 8)),
])
def test_vit_flops_counts_every_layer_within_one_percent_of_torchs_counter(values: dict[str, Any]) -> None:
    model = VisionTransformer(ViTConfig(**{**BASE, **values, "attn_impl": "explicit"})).eval()
    images = torch.randn(1, 3, *model.config.img_size)
    with FlopCounterMode(display=False) as counter:
        model(images)
    assert vit_flops(model.config) == pytest.approx(counter.get_total_flops(), rel=0.01)


def test_vit_flops_of_pruned_head_counts_match_torchs_counter() -> None:
    model = VisionTransformer(ViTConfig(**BASE, attn_impl="explicit")).eval()
    model.blocks[0].attn.prune_heads([0, 1])
    with FlopCounterMode(display=False) as counter:
        model(torch.randn(1, 3, 16, 16))
    assert vit_flops(model.config, model.heads_per_layer()) == pytest.approx(counter.get_total_flops(), rel=0.01)
