"""VisionTransformer contract, registry, config validation, head gating / pruning and model files."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from torch import nn

import vitkit
import vitkit.models.vision_transformer as vit_module
from vitkit import VisionTransformer, ViTConfig, create_model, list_models, load_model, save_model
from vitkit.io import FORMAT_KEY, FORMAT_VERSION, check_finite, read_model_file, read_weights_file
from vitkit.layers import DropPath, sincos_2d_pos_embed
from vitkit.models import count_parameters, vit_flops

TOL = dict(rtol=1e-5, atol=1e-5)
TINY: dict[str, Any] = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)
BATCH = 2


def tiny(**overrides: Any) -> VisionTransformer:
    return VisionTransformer(ViTConfig(**{**TINY, **overrides}))


def logits_and_attention(model: VisionTransformer, x: torch.Tensor, **kwargs: Any) -> tuple[torch.Tensor, list]:
    run = model.forward_intermediates(x, return_attention=True, **kwargs)
    return model.forward_head(run.features), run.attentions


def images(height: int = 16, width: int = 16) -> torch.Tensor:
    return torch.randn(BATCH, 3, height, width)


def perturb_(model: nn.Module, std: float = 0.05) -> nn.Module:
    """Add noise to every parameter (zero biases, zero class token, unit norms are too special)."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(std * torch.randn_like(param))
    return model


# ------------------------------------------------------------------------------------ contract
def test_forward_shapes_and_forward_is_features_then_head() -> None:
    model = tiny().eval()
    x = images()
    logits = model(x)
    features = model.forward_features(x)
    assert logits.shape == (BATCH, 5)
    assert features.shape == (BATCH, 1 + 16, 32)
    assert model.num_prefix_tokens == 1
    assert model.forward_head(features, pre_logits=True).shape == (BATCH, 32)
    torch.testing.assert_close(model.forward_head(features), logits, **TOL)


def test_forward_rejects_non_image_input() -> None:
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        tiny()(torch.randn(3, 16, 16))


def test_return_attention_gives_one_weight_tensor_per_block_in_the_graph() -> None:
    model = perturb_(tiny(depth=3)).eval()
    x = images()
    logits, attentions = logits_and_attention(model, x)
    assert len(attentions) == 3
    for weights in attentions:
        assert weights.shape == (BATCH, 4, 17, 17)
        torch.testing.assert_close(weights.sum(-1), torch.ones(BATCH, 4, 17))
        weights.retain_grad()
    torch.testing.assert_close(logits, model(x), **TOL)  # same logits as the fused path

    logits[0, 1].backward()
    for weights in attentions:
        assert weights.grad is not None
        assert weights.grad[0].abs().sum() > 0  # sample 0 depends on every block's weights
        assert torch.equal(weights.grad[1], torch.zeros_like(weights.grad[1]))  # sample 1 does not


def block_by_block(model: VisionTransformer, x: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every block's output tokens ``[B, N, D]`` and weights, run by hand (not through the model's forwards)."""
    tokens, outputs, weights = model.embed(x)[0], [], []
    for block in model.blocks:
        tokens, attention = block(tokens, need_weights=True)
        outputs.append(tokens)
        weights.append(attention)
    return outputs, weights


def test_forward_intermediates_keeps_the_chosen_blocks_tokens_and_weights() -> None:
    model = perturb_(tiny(depth=4, img_size=(16, 12))).eval()  # a 4x3 grid: NCHW reshape is row-major
    x = images(16, 12)
    outputs, weights = block_by_block(model, x)
    run = model.forward_intermediates(x, indices=[-1, 1], output_fmt="NCHW", return_prefix_tokens=True,
                                      return_attention=True)
    assert run.indices == [1, 3]
    for got, prefix, attention, index in zip(run.intermediates, run.prefix_tokens, run.attentions, [1, 3]):
        assert got.shape == (BATCH, 32, 4, 3)
        torch.testing.assert_close(got.permute(0, 2, 3, 1).reshape(BATCH, 12, 32), outputs[index][:, 1:], **TOL)
        torch.testing.assert_close(prefix, outputs[index][:, :1], **TOL)
        torch.testing.assert_close(attention, weights[index], **TOL)
    torch.testing.assert_close(run.features, model.norm(outputs[-1]), **TOL)
    torch.testing.assert_close(model.forward_head(run.features), model(x), **TOL)

    last_two = model.forward_intermediates(x, indices=2, output_fmt="NLC", norm=True)
    assert last_two.indices == [2, 3] and last_two.attentions is None and last_two.prefix_tokens is None
    for got, index in zip(last_two.intermediates, [2, 3]):
        torch.testing.assert_close(got, model.norm(outputs[index])[:, 1:], **TOL)
    assert model.forward_intermediates(x, intermediates_only=True).features is None


def test_forward_intermediates_matches_timms_on_the_converted_model() -> None:
    model = perturb_(tiny(depth=3)).eval()
    x = images()
    reference = vitkit.models.timm_interop.to_timm(model).eval()
    features, expected = reference.forward_intermediates(x, indices=[0, 2], norm=True, return_prefix_tokens=True)
    run = model.forward_intermediates(x, indices=[0, 2], norm=True, return_prefix_tokens=True)
    torch.testing.assert_close(run.features, features, **TOL)
    for (patches, prefix), got, got_prefix in zip(expected, run.intermediates, run.prefix_tokens):
        torch.testing.assert_close(got, patches, **TOL)
        torch.testing.assert_close(got_prefix, prefix, **TOL)


def test_forward_intermediates_stops_early_after_the_last_chosen_block() -> None:
    model = tiny(depth=4).eval()
    calls: list[int] = []
    for index, block in enumerate(model.blocks):
        block.mlp.register_forward_hook(lambda *_, index=index: calls.append(index))
    run = model.forward_intermediates(images(), indices=[1], stop_early=True, return_attention=True)
    assert calls == [0, 1] and run.features is None and len(run.attentions) == 1
    calls.clear()
    assert model.forward_intermediates(images(), indices=[3], stop_early=True).features is not None
    assert calls == [0, 1, 2, 3]


def test_forward_intermediates_gates_heads_as_forward_does() -> None:
    model = perturb_(tiny(depth=2)).eval()
    x = images()
    gates = torch.ones(2, 4)
    gates[1, 2] = 0
    logits, _ = logits_and_attention(model, x, head_gates=gates)
    torch.testing.assert_close(logits, model(x, head_gates=gates), **TOL)
    assert not torch.allclose(logits, model(x), **TOL)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(indices=5), r"indices=5 asks for the last 5 blocks of 2; give 1 to 2"),
        (dict(indices=[0, 2]), r"block indices must lie in \[-2, 2\), got \[0, 2\]"),
        (dict(output_fmt="NHWC"), "output_fmt must be 'NCHW' or 'NLC', got 'NHWC'"),
    ],
)
def test_forward_intermediates_refuses_bad_arguments_by_name(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny().forward_intermediates(images(), **kwargs)


def test_grad_checkpointing_gives_the_same_outputs_and_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    model = perturb_(tiny(depth=3, drop_path_rate=0.2, attn_drop_rate=0.1, proj_drop_rate=0.1)).train()
    x = images()

    def outputs_and_grads() -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        torch.manual_seed(7)  # same dropout / drop-path draws in both runs
        logits = model(x)
        logits.square().sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    plain_logits, plain_grads = outputs_and_grads()
    calls = []
    checkpoint = vit_module.checkpoint
    monkeypatch.setattr(vit_module, "checkpoint", lambda *a, **k: calls.append(1) or checkpoint(*a, **k))
    model.set_grad_checkpointing(True)
    ckpt_logits, ckpt_grads = outputs_and_grads()

    assert len(calls) == 3  # every block was checkpointed
    torch.testing.assert_close(ckpt_logits, plain_logits, **TOL)
    for plain, ckpt in zip(plain_grads, ckpt_grads):
        torch.testing.assert_close(ckpt, plain, **TOL)


def test_grad_checkpointing_is_skipped_without_grad_and_works_with_attention_maps() -> None:
    model = perturb_(tiny()).eval()
    x = images()
    expected_logits, expected_maps = logits_and_attention(model, x)
    model.set_grad_checkpointing(True)
    with torch.no_grad():
        torch.testing.assert_close(model(x), expected_logits, **TOL)
    logits, maps = logits_and_attention(model, x)
    torch.testing.assert_close(logits, expected_logits, **TOL)
    for got, expected in zip(maps, expected_maps):
        torch.testing.assert_close(got, expected, **TOL)


def test_global_average_pooling_uses_fc_norm_over_patch_tokens() -> None:
    model = perturb_(tiny(global_pool="avg")).eval()
    assert isinstance(model.norm, nn.Identity) and isinstance(model.fc_norm, nn.LayerNorm)
    x = images()
    features = model.forward_features(x)
    expected = model.head(model.fc_norm(features[:, 1:].mean(dim=1)))
    torch.testing.assert_close(model(x), expected, **TOL)


def test_model_without_class_token_has_only_patch_tokens() -> None:
    model = tiny(class_token=False, global_pool="avg").eval()
    assert model.num_prefix_tokens == 0 and model.cls_token is None
    assert model.forward_features(images()).shape == (BATCH, 16, 32)
    assert model.pos_embed.shape == (1, 16, 32)


def test_sincos_position_embedding_is_a_fixed_non_persistent_table() -> None:
    model = tiny(pos_embed="sincos")
    assert not isinstance(model.pos_embed, nn.Parameter)
    assert "pos_embed" not in model.state_dict()
    expected = torch.cat([torch.zeros(1, 32), sincos_2d_pos_embed(32, (4, 4))])[None]
    torch.testing.assert_close(model.pos_embed, expected)


@pytest.mark.parametrize("pos_embed", ["learn", "sincos"])
def test_dynamic_img_size_runs_other_resolutions_like_a_model_built_for_them(pos_embed: str) -> None:
    model = perturb_(tiny(dynamic_img_size=True, pos_embed=pos_embed)).eval()
    x = images(24, 12)
    logits = model(x)
    assert logits.shape == (BATCH, 5)
    assert model.forward_features(x).shape == (BATCH, 1 + 6 * 3, 32)

    resized = VisionTransformer(model.config.replace(img_size=(24, 12), dynamic_img_size=False)).eval()
    resized.load_weights(model.state_dict(), source_grid=model.config.grid_size)
    torch.testing.assert_close(logits, resized(x), **TOL)


def test_other_resolution_without_dynamic_img_size_raises_with_a_hint() -> None:
    with pytest.raises(ValueError, match=r"24x12 differs from the model's img_size 16x16.*dynamic_img_size=True"):
        tiny()(images(24, 12))


def test_no_weight_decay_names_real_parameters() -> None:
    model = tiny()
    names = dict(model.named_parameters())
    assert model.no_weight_decay() == {"pos_embed", "cls_token"}
    assert model.no_weight_decay() <= set(names)
    with_tokens = tiny(reg_tokens=2)
    assert with_tokens.no_weight_decay() == {"pos_embed", "cls_token", "reg_token"}


def test_reset_classifier_replaces_head_and_config() -> None:
    model = tiny()
    model.reset_classifier(7)
    assert model(images()).shape == (BATCH, 7) and model.config.num_classes == 7
    model.reset_classifier(0)
    assert model(images()).shape == (BATCH, 32)


def test_drop_path_rates_ramp_linearly_over_depth() -> None:
    model = tiny(depth=4, drop_path_rate=0.3)
    assert isinstance(model.blocks[0].drop_path1, nn.Identity)  # rate 0 at the first block
    rates = [block.drop_path1.drop_prob for block in model.blocks[1:]]
    assert rates == pytest.approx([0.1, 0.2, 0.3])
    assert all(isinstance(block.drop_path2, DropPath) for block in model.blocks[1:])


def test_output_projection_init_is_scaled_by_inverse_sqrt_twice_depth() -> None:
    dim, depth = 512, 2
    model = VisionTransformer(
        ViTConfig(img_size=16, patch_size=16, embed_dim=dim, depth=depth, num_heads=8, num_classes=0, mlp_ratio=1.0)
    )
    xavier_std = math.sqrt(2 / (dim + dim))
    for block in model.blocks:
        assert block.attn.proj.weight.std().item() == pytest.approx(xavier_std / math.sqrt(2 * depth), rel=0.02)


# ------------------------------------------------------------------------------- head masks
def test_head_gates_of_ones_changes_nothing_and_accepts_depth_by_heads_tensor() -> None:
    model = perturb_(tiny()).eval()
    x = images()
    torch.testing.assert_close(model(x, head_gates=torch.ones(2, 4)), model(x), **TOL)
    torch.testing.assert_close(model(x, head_gates=[None, torch.ones(BATCH, 4)]), model(x), **TOL)


def test_head_gates_needs_one_entry_per_block() -> None:
    with pytest.raises(ValueError, match=r"one entry per block \(2\), got 3"):
        tiny()(images(), head_gates=torch.ones(3, 4))


def test_pruning_heads_in_a_model_equals_gating_them_and_shrinks_it() -> None:
    model = perturb_(tiny(depth=3)).eval()
    x = images()
    gates = torch.ones(3, 4)
    gates[0, [1, 3]] = 0
    gates[2, 0] = 0
    gated = model(x, head_gates=gates)
    params, flops = count_parameters(model), vit_flops(model.config)

    model.blocks[0].attn.prune_heads([1, 3])
    model.blocks[2].attn.prune_heads([0])

    assert model.heads_per_layer() == [2, 4, 3]
    torch.testing.assert_close(model(x), gated, **TOL)
    d = 32 // 4
    assert count_parameters(model) == params - 3 * (4 * d * 32 + 3 * d)
    assert vit_flops(model.config, model.heads_per_layer()) < flops
    logits, attentions = logits_and_attention(model, x)
    assert [a.shape[1] for a in attentions] == [2, 4, 3]
    torch.testing.assert_close(logits, gated, **TOL)


def test_vit_flops_of_vit_base_match_the_published_17_6_gmacs() -> None:
    assert vit_flops(vitkit.models.model_config("vit_base_patch16_224")) / 2 == pytest.approx(17.6e9, rel=0.02)


# ---------------------------------------------------------------------------- model files
def test_save_and_load_round_trip_keeps_outputs_config_and_extra(tmp_path: Path) -> None:
    model = perturb_(tiny()).eval()
    extra = {"mean": [0.5, 0.5, 0.5], "std": [0.2, 0.2, 0.2], "class_names": list("abcde")}
    path = save_model(model, tmp_path / "sub" / "model.safetensors", extra=extra)
    assert path.is_file() and list(path.parent.iterdir()) == [path]  # no temporary file left

    loaded = load_model(path).eval()
    x = images()
    torch.testing.assert_close(loaded(x), model(x), **TOL)
    config, state, read_extra = read_model_file(path)
    assert read_extra == extra
    assert config.replace(num_heads=4, head_dim=None) == model.config
    assert set(state) == set(model.state_dict())


def test_pruned_model_with_per_layer_heads_round_trips(tmp_path: Path) -> None:
    model = perturb_(tiny(depth=3)).eval()
    model.blocks[0].attn.prune_heads([0])
    model.blocks[1].attn.prune_heads([0, 1, 2, 3])  # a layer without any head
    model.blocks[2].attn.prune_heads([1, 2])
    save_model(model, tmp_path / "pruned.safetensors")

    loaded = load_model(tmp_path / "pruned.safetensors").eval()
    assert loaded.heads_per_layer() == [3, 0, 2]
    x = images()
    torch.testing.assert_close(loaded(x), model(x), **TOL)
    assert count_parameters(loaded) == count_parameters(model)


def test_load_model_with_new_img_size_resamples_pos_embed_like_timm(tmp_path: Path) -> None:
    model = perturb_(tiny())
    save_model(model, tmp_path / "m.safetensors")
    loaded = load_model(tmp_path / "m.safetensors", img_size=(32, 24))
    expected = resample_abs_pos_embed(model.pos_embed.detach(), [8, 6], [4, 4], num_prefix_tokens=1)
    assert loaded.config.img_size == (32, 24)
    torch.testing.assert_close(loaded.pos_embed.detach(), expected, **TOL)
    assert loaded(images(32, 24)).shape == (BATCH, 5)


def test_load_model_on_a_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nothing.safetensors"):
        load_model(tmp_path / "nothing.safetensors")


def test_load_model_on_a_garbage_file_raises_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "garbage.safetensors"
    path.write_bytes(b"this is not a model" * 10)
    with pytest.raises(ValueError, match="garbage.safetensors is not a readable safetensors file"):
        load_model(path)


def test_load_model_on_a_foreign_safetensors_file_asks_for_save_model(tmp_path: Path) -> None:
    path = tmp_path / "foreign.safetensors"
    save_file({"weight": torch.zeros(2)}, str(path))
    with pytest.raises(ValueError, match="no vitkit config.*vitkit.save_model"):
        load_model(path)


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_weights_with_nan_or_inf_are_refused_naming_the_first_bad_tensor(tmp_path: Path, value: float) -> None:
    model = tiny()
    with torch.no_grad():
        model.blocks[1].mlp.fc2.bias[3] = value
    save_model(model, tmp_path / "m.safetensors")
    with pytest.raises(vitkit.VitkitError, match=r"m.safetensors: tensor 'blocks.1.mlp.fc2.bias' holds 1 "):
        load_model(tmp_path / "m.safetensors")
    state = model.state_dict()
    save_file(state, str(tmp_path / "timm.safetensors"))
    torch.save(state, tmp_path / "timm.pth")
    for name in ("timm.safetensors", "timm.pth"):  # timm weights, either format
        with pytest.raises(vitkit.VitkitError, match=rf"{name}: tensor 'blocks.1.mlp.fc2.bias' holds 1 "):
            read_weights_file(tmp_path / name)
    checkpoint = {  # the layout a training run's Lightning checkpoint has
        "hyper_parameters": {"vit_config": model.config.to_dict(), FORMAT_KEY: FORMAT_VERSION, "extra": {}},
        "state_dict": {f"model.{key}": value for key, value in state.items()},
    }
    torch.save(checkpoint, tmp_path / "last.ckpt")
    with pytest.raises(vitkit.VitkitError, match=r"last.ckpt: tensor 'blocks.1.mlp.fc2.bias' holds 1 "):
        load_model(tmp_path / "last.ckpt")
    check_finite({"w": torch.full((2,), 3e38)}, "finite values whose sum overflows", ValueError)


@pytest.mark.parametrize(
    ("options", "size", "words"),
    [
        ({}, 64, r"img_size .* is \[64, 64\], but the model takes \[16, 16\] images only"),
        ({"rope": "axial", "dynamic_img_size": True}, 17, "not divisible by patch_size 4"),
        ({"rope": "axial", "dynamic_img_size": True}, 1, "not divisible by patch_size 4"),
        ({"rope": "axial", "dynamic_img_size": True, "patch_size": 4}, 3000, "more than the limit"),
    ],
)
def test_a_recorded_image_size_the_model_cannot_take_is_refused_on_load(
    tmp_path: Path, options: dict[str, Any], size: int, words: str
) -> None:
    save_model(tiny(**options), tmp_path / "m.safetensors", extra={"img_size": [size, size]})
    with pytest.raises(vitkit.VitkitError, match=words):
        load_model(tmp_path / "m.safetensors")


def test_a_dynamic_size_model_may_record_another_whole_patch_size(tmp_path: Path) -> None:
    save_model(tiny(rope="axial", dynamic_img_size=True), tmp_path / "m.safetensors", extra={"img_size": [24, 20]})
    assert vitkit.io.load_model_and_extra(tmp_path / "m.safetensors")[1]["img_size"] == [24, 20]


# ------------------------------------------------------------------------- registry, config
def test_registry_lists_every_variant_and_applies_overrides() -> None:
    assert set(list_models()) >= {
        "vit_tiny_patch16_224",
        "vit_small_patch16_224",
        "vit_base_patch16_224",
        "vit_large_patch16_224",
        "vit_cifar_tiny",
        "vit_cifar_small",
    }
    model = create_model("vit_cifar_tiny", depth=1, num_classes=3)
    assert (model.config.depth, model.config.num_classes, model.config.embed_dim) == (1, 3, 192)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 3)


@pytest.mark.parametrize(
    ("name", "variant"),
    [
        ("vit_cifar_tiny", dict(img_size=(32, 32), patch_size=(4, 4), embed_dim=192, depth=6, num_heads=3)),
        ("vit_cifar_small", dict(img_size=(32, 32), patch_size=(4, 4), embed_dim=256, depth=7, num_heads=4)),
    ],
)
def test_cifar_variants_have_the_documented_hyper_parameters(name: str, variant: dict[str, Any]) -> None:
    config = vitkit.models.model_config(name)
    assert {key: getattr(config, key) for key in variant} == variant


def test_unknown_model_name_suggests_the_closest() -> None:
    with pytest.raises(ValueError, match=r"unknown model 'vit_tiny_patch16'.*Did you mean 'vit_tiny_patch16_224'"):
        create_model("vit_tiny_patch16")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(embed_dim=100, num_heads=8), r"embed_dim \(100\).*num_heads \(8\)"),
        (dict(img_size=30), "height 30 is not divisible by patch_size 4"),
        (dict(global_pool="max"), "global_pool must be one of 'token', 'avg', 'map', got 'max'"),
        (dict(class_token=False), "global_pool='token' needs class_token=True"),
        (dict(pos_embed="rope"), "pos_embed must be one of 'learn', 'sincos', 'none'"),
        (dict(attn_impl="flash"), "attn_impl must be one of"),
        (dict(drop_path_rate=1.0), r"drop_path_rate is out of range: got 1, must be >= 0 and < 1"),
        (dict(num_heads=[4, 4, 4]), "num_heads lists 3 layers but depth is 2"),
        (dict(depth=0), "depth is out of range: got 0, must be >= 1"),
        (dict(img_size="big"), "img_size must be an integer or a list of 2 of them, got 'big'"),
    ],
)
def test_config_validation_names_the_bad_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**TINY, **overrides})


def test_config_from_dict_rejects_unknown_fields_and_round_trips() -> None:
    config = ViTConfig(**TINY)
    assert ViTConfig.from_dict(config.to_dict()) == config
    with pytest.raises(ValueError, match=r"unknown key 'heads' in the given dict\. Did you mean 'num_heads'\?"):
        ViTConfig.from_dict({**config.to_dict(), "heads": 3})
    with pytest.raises(ValueError, match="divisible"):
        config.replace(num_heads=5)


def test_every_attention_option_of_the_config_reaches_every_block() -> None:
    model = tiny(
        head_dim=4, qkv_bias=False, qk_norm=True, attn_drop_rate=0.25, proj_drop_rate=0.125,
        attn_impl="explicit", out_init_scale=0.3, norm_eps=1e-5, locality=True,
    )
    for block in model.blocks:
        attn = block.attn
        assert (attn.head_dim, attn.qkv.weight.shape) == (4, (3 * 4 * 4, 32))  # head_dim not embed_dim / heads
        assert attn.qkv.bias is None and attn.attn_drop == 0.25 and attn.proj_drop.p == 0.125
        assert isinstance(attn.q_norm, nn.LayerNorm) and attn.q_norm.eps == attn.k_norm.eps == 1e-5
        assert attn.attn_impl == "explicit" and attn.out_init_scale == 0.3
        assert attn.locality and attn.temperature.shape == (4,)
        # the block's own parts share the attention's proj_drop and norm_eps, as timm's Block
        assert block.norm1.eps == block.norm2.eps == 1e-5 and block.mlp.drop1.p == 0.125


def test_out_init_scale_defaults_to_gpt2_residual_scaling() -> None:
    assert ViTConfig(**{**TINY, "depth": 8}).attention_options().out_init_scale == pytest.approx(0.25)  # 1/sqrt(16)
    assert ViTConfig(**TINY).attention_options().head_dim == 8  # 32 / 4 heads


@pytest.mark.parametrize(
    ("overrides", "tokens", "patch_dim"),
    [
        (dict(), 1 + 4 * 4, 4 * 4 * 3),
        (dict(class_token=False, global_pool="avg"), 4 * 4, 4 * 4 * 3),
        (dict(img_size=(16, 8), patch_size=(4, 2), in_chans=1), 1 + 4 * 4, 4 * 2),
        (dict(shifted_patches=True), 1 + 4 * 4, 5 * 4 * 4 * 3),  # the image and its four shifted copies
    ],
)
def test_token_count_and_patch_width_match_the_built_model(
    overrides: dict[str, Any], tokens: int, patch_dim: int
) -> None:
    config = ViTConfig(**{**TINY, **overrides})
    assert (config.num_tokens, config.patch_dim) == (tokens, patch_dim)
    model = VisionTransformer(config)
    assert model.num_prefix_tokens == config.num_prefix_tokens == 1 - int(not config.class_token)
    assert model.pos_embed.shape[1] == tokens
    assert model.forward_features(torch.randn(1, config.in_chans, *config.img_size)).shape[1] == tokens
    assert model.patch_embed.proj.in_features == patch_dim


# --------------------------------------------------------- device / dtype, meta-device building
@pytest.mark.parametrize("pos_embed", ["learn", "sincos"])
def test_meta_build_then_to_empty_and_reset_parameters_gives_the_cpu_init(pos_embed: str) -> None:
    config = ViTConfig(**{**TINY, "pos_embed": pos_embed, "qk_norm": True, "init_values": 0.1})
    with torch.device("meta"):
        model = VisionTransformer(config)
    assert {p.device.type for p in model.parameters()} == {"meta"}
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters()
    built = VisionTransformer(config)  # construction-time init on the CPU
    reset = VisionTransformer(config)
    torch.manual_seed(0)
    reset.reset_parameters()
    for name, tensor in model.state_dict(keep_vars=True).items():
        assert torch.equal(tensor, reset.state_dict()[name]), name  # same draws as a CPU reset
        constructed = built.state_dict()[name]
        if tensor.numel() >= 256:  # the same distribution as construction (std within 10 %)
            assert tensor.float().std().item() == pytest.approx(constructed.float().std().item(), rel=0.1), name
        elif constructed.unique().numel() == 1:  # constant parts: norms, biases, LayerScale
            assert torch.equal(tensor, constructed), name
    if pos_embed == "sincos":
        expected = torch.cat([torch.zeros(1, 32), sincos_2d_pos_embed(32, (4, 4))])[None]
        assert torch.equal(model.pos_embed, expected)


def test_dtype_builds_every_parameter_and_buffer_in_that_dtype() -> None:
    model = VisionTransformer(ViTConfig(**TINY, pos_embed="sincos"), dtype=torch.bfloat16)
    assert {t.dtype for t in (*model.parameters(), *model.buffers())} == {torch.bfloat16}
    assert model(images().bfloat16()).dtype == torch.bfloat16
    model.reset_classifier(3)
    assert model.head.weight.dtype == torch.bfloat16
