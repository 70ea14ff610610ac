"""Token, pooling and norm options: registers, distillation token, no_embed_class, pre_norm,
fc_norm, attention pooling and the MLP activation, each checked against a hand computation."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from vitkit import VisionTransformer, ViTConfig, load_model, save_model

TINY: dict[str, Any] = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
TOL = dict(rtol=1e-5, atol=1e-5)


def tiny(**overrides: Any) -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(ViTConfig(**{**TINY, **overrides})).eval()


def images(batch: int = 2, side: int = 16) -> torch.Tensor:
    return torch.randn(batch, 3, side, side, generator=torch.Generator().manual_seed(1))


def test_prefix_tokens_count_class_distillation_and_registers() -> None:
    assert tiny().num_prefix_tokens == 1
    assert tiny(reg_tokens=4).num_prefix_tokens == 5
    assert tiny(class_token=False, global_pool="avg", reg_tokens=3).num_prefix_tokens == 3
    assert tiny(distilled=True).num_prefix_tokens == 2
    run = tiny(reg_tokens=4).forward_intermediates(images(), return_prefix_tokens=True)
    assert run.intermediates[-1].shape == (2, 32, 4, 4)  # the 4x4 patch grid, registers left out
    assert run.prefix_tokens[-1].shape == (2, 5, 32)


@pytest.mark.parametrize("pool", ["avg", "map"])
def test_registers_are_excluded_from_pooling(pool: str) -> None:
    model = tiny(class_token=False, global_pool=pool, reg_tokens=3)
    features = torch.randn(2, 3 + 16, 32)
    loud = features.clone()
    loud[:, :3] = 1e3  # registers far from every patch token: they would dominate either pool
    with torch.no_grad():
        torch.testing.assert_close(model.pool(loud), model.pool(features), **TOL)
        if pool == "avg":
            torch.testing.assert_close(model.pool(features), features[:, 3:].mean(dim=1), **TOL)


def test_map_pool_is_timms_attention_pool_over_the_patches() -> None:
    model = tiny(class_token=False, global_pool="map")
    assert type(model.attn_pool).__name__ == "AttentionPoolLatent"
    assert model.attn_pool.num_heads == 4 and model.attn_pool.mlp.fc1.out_features == 64
    features = torch.randn(2, 16, 32)
    with torch.no_grad():
        # One latent query, softmax(q k^T / sqrt(d)) v over the patches, then proj, + mlp(norm(.)).
        pool = model.attn_pool
        q = pool.q(pool.latent).reshape(1, 1, 4, 8).transpose(1, 2)
        k, v = pool.kv(features).reshape(2, 16, 2, 4, 8).permute(2, 0, 3, 1, 4)
        attended = ((q @ k.transpose(-2, -1)) / math.sqrt(8)).softmax(-1) @ v
        x = pool.proj(attended.transpose(1, 2).reshape(2, 1, 32))
        expected = (x + pool.mlp(pool.norm(x)))[:, 0]
        torch.testing.assert_close(model.pool(features), expected, **TOL)


def test_distilled_head_averages_both_heads_in_eval_and_returns_both_in_training() -> None:
    model = tiny(distilled=True)
    assert not torch.equal(model.head.weight, model.head_dist.weight)
    x = images()
    with torch.no_grad():
        features = model.forward_features(x)
        cls_logits, dist_logits = model.head(features[:, 0]), model.head_dist(features[:, 1])
        torch.testing.assert_close(model(x), (cls_logits + dist_logits) / 2, **TOL)
        torch.testing.assert_close(model.forward_head(features, pre_logits=True), features[:, :2].mean(dim=1), **TOL)
        model.set_distilled_training()
        assert torch.is_tensor(model.eval()(x))  # eval mode still averages
        both = model.train()(x)
    assert isinstance(both, tuple) and len(both) == 2
    torch.testing.assert_close(both[0], cls_logits, **TOL)
    torch.testing.assert_close(both[1], dist_logits, **TOL)


def test_reset_classifier_replaces_the_distillation_head_too() -> None:
    model = tiny(distilled=True)
    model.reset_classifier(7)
    assert model.head_dist.out_features == 7 and model(images()).shape == (2, 7)


def test_no_embed_class_adds_positions_to_the_patches_only() -> None:
    model = tiny(reg_tokens=2, no_embed_class=True)
    assert model.pos_embed.shape == (1, 16, 32)
    x = images()
    with torch.no_grad():
        tokens = model.embed(x)[0]
        torch.testing.assert_close(tokens[:, 0], model.cls_token[0].expand(2, -1), **TOL)
        torch.testing.assert_close(tokens[:, 1:3], model.reg_token.expand(2, -1, -1), **TOL)
        torch.testing.assert_close(tokens[:, 3:], model.patch_embed(x) + model.pos_embed, **TOL)
    with_class = tiny(reg_tokens=2)
    assert with_class.pos_embed.shape == (1, 3 + 16, 32)


def test_no_embed_class_resamples_the_patch_table_for_dynamic_img_size() -> None:
    model = tiny(reg_tokens=2, no_embed_class=True, dynamic_img_size=True)
    with torch.no_grad():
        assert model(images(side=24)).shape == (2, 5)
    sincos = tiny(reg_tokens=2, no_embed_class=True, pos_embed="sincos", dynamic_img_size=True)
    assert sincos.pos_embed.shape == (1, 16, 32)
    with torch.no_grad():
        assert sincos(images(side=24)).shape == (2, 5)


def test_pre_norm_layer_norms_the_embedded_tokens_and_drops_the_patch_bias() -> None:
    model = tiny(pre_norm=True)
    assert model.patch_embed.proj.bias is None and isinstance(model.norm_pre, nn.LayerNorm)
    with torch.no_grad():
        nn.init.normal_(model.norm_pre.weight, 1.0, 0.0)
        tokens = model.embed(images())[0]
    patches = tokens[:, 1:]  # the class token is near zero, where LayerNorm's epsilon counts
    torch.testing.assert_close(patches.mean(dim=-1), torch.zeros(2, 16), atol=1e-5, rtol=0)
    torch.testing.assert_close(patches.var(dim=-1, unbiased=False), torch.ones(2, 16), atol=1e-3, rtol=0)
    assert isinstance(tiny().norm_pre, nn.Identity)


@pytest.mark.parametrize(
    ("global_pool", "fc_norm", "after_pool"),
    [("token", None, False), ("avg", None, True), ("avg", False, False), ("token", True, True)],
)
def test_fc_norm_follows_timms_rule_unless_given(global_pool: str, fc_norm: bool | None, after_pool: bool) -> None:
    model = tiny(global_pool=global_pool, fc_norm=fc_norm)
    assert isinstance(model.fc_norm, nn.LayerNorm) == after_pool
    assert isinstance(model.norm, nn.Identity) == after_pool


@pytest.mark.parametrize(
    ("act_layer", "formula"),
    [
        ("gelu", lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))),
        ("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x)),
        ("gelu_tanh", lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))),
    ],
)
def test_act_layer_is_the_mlps_activation(act_layer: str, formula: Any) -> None:
    model = tiny(act_layer=act_layer)
    x = torch.linspace(-4, 4, 101)
    for block in model.blocks:
        torch.testing.assert_close(block.mlp.act(x), formula(x), **TOL)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(distilled=True, class_token=False, global_pool="avg"), "distilled=True .* needs class_token=True"),
        (dict(distilled=True, reg_tokens=2), "distilled=True has no register tokens"),
        (dict(reg_tokens=-1), "reg_tokens is out of range"),
        (dict(act_layer="relu"), "act_layer must be one of 'gelu', 'quick_gelu', 'gelu_tanh'"),
    ],
)
def test_token_options_are_validated(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**TINY, **overrides})


ALL_OPTIONS = dict(
    reg_tokens=2, no_embed_class=True, pre_norm=True, class_token=False, global_pool="map", act_layer="gelu_tanh"
)


def test_meta_device_build_and_reset_parameters_draw_every_new_parameter() -> None:
    with torch.device("meta"):
        model = VisionTransformer(ViTConfig(**TINY, **ALL_OPTIONS))
    model.to_empty(device="cpu")
    model.reset_parameters()
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert model.attn_pool.latent.std() > 0.05  # timm's trunc. normal, std dim ** -0.5


@pytest.mark.parametrize("options", [ALL_OPTIONS, dict(distilled=True)], ids=["registers_map", "distilled"])
def test_model_file_round_trip_keeps_the_token_options(tmp_path: Path, options: dict[str, Any]) -> None:
    model = tiny(**options)
    path = save_model(model, tmp_path / "model.safetensors")
    loaded = load_model(path).eval()
    for name in (*options, "num_prefix_tokens"):
        assert getattr(loaded.config, name) == getattr(model.config, name)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images()), model(images()), **TOL)
