"""timm interop: vitkit reproduces timm's ViTs (logits to 1e-4) and exports weights timm loads."""

from __future__ import annotations

from typing import Any

import pytest
import timm
import torch
from timm.models.vision_transformer import VisionTransformer as TimmViT
from timm.models.vision_transformer import checkpoint_filter_fn
from timm_families import FAMILIES

from vitkit import create_model, from_timm, to_timm_state_dict
from vitkit.models import model_config, timm_interop, to_timm
from vitkit.models.timm_interop import UnsupportedModelError, timm_features_vitkit_lacks

PARITY = dict(rtol=1e-4, atol=1e-4)
#: Small timm-compatible architecture for the tests that do not need a registered variant.
SMALL: dict[str, Any] = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10)


def timm_model(name: str, **kwargs: Any) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False, **kwargs).eval()


def randomise_(model: torch.nn.Module) -> torch.nn.Module:
    """timm zero-initialises biases and the head; noise makes every weight count in the comparison."""
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.02 * torch.randn_like(param))
    return model


@pytest.mark.parametrize(
    "name",
    [
        "vit_tiny_patch16_224",
        "vit_small_patch16_224",
        pytest.param("vit_base_patch16_224", marks=pytest.mark.slow),
    ],
)
def test_from_timm_model_matches_timm_logits(name: str) -> None:
    source = randomise_(timm_model(name))
    model = from_timm(source).eval()
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)
    assert model.config.num_heads == source.blocks[0].attn.num_heads


def test_from_timm_state_dict_with_variant_name_matches_timm() -> None:
    source = randomise_(timm_model("vit_tiny_patch16_224"))
    model = from_timm(source.state_dict(), name="vit_tiny_patch16_224").eval()
    assert model.heads_per_layer() == [3] * 12
    x = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)


@pytest.mark.parametrize("num_classes", [7, 0])
def test_from_timm_with_new_num_classes_keeps_the_backbone_and_a_fresh_head(num_classes: int) -> None:
    source = randomise_(TimmViT(**SMALL)).eval()
    model = from_timm(source.state_dict(), num_heads=4, num_classes=num_classes).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = source.forward_head(source.forward_features(x), pre_logits=True)
        torch.testing.assert_close(model.forward_head(model.forward_features(x), pre_logits=True), expected, **PARITY)
        assert model(x).shape == (2, num_classes or SMALL["embed_dim"])


def test_from_timm_state_dict_accepts_num_heads_instead_of_a_name() -> None:
    source = randomise_(TimmViT(**SMALL)).eval()
    model = from_timm(source.state_dict(), num_heads=4).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)


def test_from_timm_non_square_state_dict_converts_when_img_size_is_given() -> None:
    source = randomise_(TimmViT(**{**SMALL, "img_size": (32, 40)})).eval()
    model = from_timm(source.state_dict(), num_heads=4, img_size=(32, 40)).eval()
    assert model.config.img_size == (32, 40)
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)
    with pytest.raises(ValueError, match=r"20 patch positions, not a square grid.*img_size=\(H, W\)"):
        from_timm(source.state_dict(), num_heads=4)
    with pytest.raises(ValueError, match=r"20 patch positions.*got img_size=\(32, 32\)"):
        from_timm(source.state_dict(), num_heads=4, img_size=(32, 32))


def test_from_timm_state_dict_reads_no_embed_class_off_the_table_unless_told() -> None:
    # 4x6 patches and a class token: 25 rows, which also reads as a 5x5 table without prefix rows.
    source = randomise_(TimmViT(**{**SMALL, "img_size": (32, 48)})).eval()
    assert from_timm(source.state_dict(), num_heads=4).config.no_embed_class  # the square reading
    model = from_timm(source.state_dict(), num_heads=4, img_size=(32, 48), no_embed_class=False).eval()
    x = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)


def test_from_timm_state_dict_without_name_or_num_heads_raises() -> None:
    with pytest.raises(ValueError, match=r"does not record the head count.*name=.*num_heads="):
        from_timm(TimmViT(**SMALL).state_dict())


def test_from_timm_with_new_img_size_equals_timm_resampled_model() -> None:
    source = randomise_(timm_model("vit_tiny_patch16_224"))
    model = from_timm(source, img_size=384).eval()

    reference = timm_model("vit_tiny_patch16_224", img_size=384)
    reference.load_state_dict(checkpoint_filter_fn(source.state_dict(), reference))
    assert model.pos_embed.shape == reference.pos_embed.shape == (1, 1 + 24 * 24, 192)
    torch.testing.assert_close(model.pos_embed, reference.pos_embed, **PARITY)
    x = torch.randn(2, 3, 384, 384)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x), **PARITY)


@pytest.mark.parametrize(
    "variant",
    [
        dict(),
        dict(global_pool="avg"),
        dict(class_token=False, global_pool="avg"),
        dict(init_values=0.1),
        dict(qk_norm=True),
        dict(img_size=(32, 48), patch_size=(8, 4)),
    ],
    ids=["token", "avg", "no_class_token", "layer_scale", "qk_norm", "non_square_patches"],
)
def test_timm_architecture_options_convert_both_ways(variant: dict[str, Any]) -> None:
    arch = {**SMALL, **variant}
    source = randomise_(TimmViT(**arch)).eval()
    model = from_timm(source).eval()
    x = torch.randn(2, 3, *model.config.img_size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)

    back = TimmViT(**arch).eval()
    back.load_state_dict(to_timm_state_dict(model))  # strict
    with torch.no_grad():
        torch.testing.assert_close(back(x), source(x), **PARITY)


def test_dynamic_img_size_matches_timm_at_another_resolution() -> None:
    source = randomise_(TimmViT(**SMALL, dynamic_img_size=True)).eval()
    model = from_timm(source).eval()
    assert model.config.dynamic_img_size
    x = torch.randn(2, 3, 48, 24)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)


@pytest.mark.parametrize("pos_embed", ["learn", "sincos"])
def test_to_timm_state_dict_loads_into_timm_and_matches(pos_embed: str) -> None:
    model = randomise_(
        create_model("vit_cifar_tiny", depth=2, embed_dim=64, num_heads=4, mlp_ratio=4.0, pos_embed=pos_embed)
    ).eval()
    reference = TimmViT(img_size=32, patch_size=4, embed_dim=64, depth=2, num_heads=4, num_classes=10).eval()
    reference.load_state_dict(to_timm_state_dict(model))  # strict: every key and shape matches
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(reference(x), model(x), **PARITY)
    round_trip = from_timm(reference).eval()
    with torch.no_grad():
        torch.testing.assert_close(round_trip(x), model(x), **PARITY)


def test_to_timm_state_dict_does_not_alias_the_model_weights() -> None:
    model = create_model("vit_cifar_tiny", depth=1)
    state = to_timm_state_dict(model)
    state["head.weight"].add_(1.0)
    assert not torch.equal(state["head.weight"], model.head.weight)


def test_pruned_model_has_no_timm_equivalent() -> None:
    model = create_model("vit_cifar_tiny", depth=2)
    model.blocks[0].attn.prune_heads([0])
    with pytest.raises(ValueError, match=r"same full head count.*\[2, 3\]"):
        to_timm_state_dict(model)


#: timm ViT families vitkit converts exactly, each built at two layers on a 2x2 patch grid (the
#: family's own width, heads, tokens, norms, pooling and activation) so the whole list runs fast.


def small_family(name: str, **kwargs: Any) -> torch.nn.Module:
    with torch.device("meta"):
        patch = timm.create_model(name, pretrained=False, depth=1).patch_embed.patch_size[0]
    return randomise_(timm_model(name, depth=2, img_size=2 * patch, num_classes=10, **kwargs))


@pytest.mark.parametrize("name", FAMILIES)
def test_timm_family_converts_both_ways_with_equal_logits(name: str) -> None:
    source = small_family(name)
    model = from_timm(source).eval()
    assert model.num_prefix_tokens == source.num_prefix_tokens
    x = torch.randn(2, 3, *model.config.img_size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)
    twin = to_timm(model).eval()  # to_timm_state_dict loaded strictly into a timm model of the config
    assert type(twin) is type(source) and twin.state_dict().keys() == source.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(twin(x), source(x), **PARITY)


@pytest.mark.parametrize(
    "name",
    [
        "vit_small_patch14_reg4_dinov2",
        "vit_medium_patch16_reg4_gap_256",
        "vit_base_patch16_siglip_224",
        "deit_small_distilled_patch16_224",
        "deit3_small_patch16_224",
    ],
)
def test_timm_state_dict_with_tokens_and_pooling_options_converts(name: str) -> None:
    source = small_family(name)
    model = from_timm(source.state_dict(), num_heads=source.blocks[0].attn.num_heads).eval()
    assert (model.config.reg_tokens, model.config.no_embed_class) == (source.num_reg_tokens, source.no_embed_class)
    x = torch.randn(2, 3, *model.config.img_size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)


def test_timm_registers_with_dynamic_img_size_match_timm_at_another_resolution() -> None:
    source = small_family("vit_small_patch14_reg4_dinov2", dynamic_img_size=True)
    model = from_timm(source).eval()
    x = torch.randn(2, 3, 42, 56)
    with torch.no_grad():
        torch.testing.assert_close(model(x), source(x), **PARITY)


def test_timm_distilled_model_returns_both_heads_in_distilled_training() -> None:
    source = small_family("deit_small_distilled_patch16_224")
    model = from_timm(source)
    source.set_distilled_training(True)
    model.set_distilled_training(True)
    source.train(), model.train()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        for ours, theirs in zip(model(x), source(x)):
            torch.testing.assert_close(ours, theirs, **PARITY)


#: timm models vitkit refuses, with what each message must name. Built on the meta device at
#: their default size: refusal reads the module tree only.
REFUSED = {
    "vit_small_patch16_dinov3": r"RotaryEmbeddingDinoV3 \(RoPE other than axial or mixed\)",
    "vit_small_patch16_dinov3_qkvb": r"RotaryEmbeddingDinoV3 \(RoPE other than axial or mixed\)",
    "eva02_tiny_patch14_224": "SwiGLU or a normed MLP",
    "vit_pe_core_tiny_patch16_384": "attention-pool head",
    "beit_base_patch16_224": "relative position bias",
    "beitv2_base_patch16_224": "relative position bias",
    "beit3_base_patch16_224": "a norm inside the attention",
    "vit_relpos_small_patch16_224": "relative position bias",
    "vit_relpos_small_patch16_rpn_224": "relative position bias",
    "vit_base_patch16_rpn_224": "residual post-norm",
    "vit_small_patch16_18x2_224": "parallel blocks",
    "vit_base_patch16_xp_224": "parallel blocks",
    "vit_small_r26_s32_224": "a CNN stem",
    "aimv2_large_patch14_224": "RmsNorm norms.*gated MLP",
    "vit_giant_patch14_dinov2": "gated MLP",
    "vit_intern300m_patch14_448": r"no final norm \(final_norm=False\)",
    "naflexvit_base_patch16_gap": "the NaFlexVit architecture",
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_timm_model_vitkit_lacks_a_feature_of_is_refused_before_anything_is_built(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with torch.device("meta"):
        source = timm.create_model(name, pretrained=False)
    monkeypatch.setattr(timm_interop, "VisionTransformer", None)  # building anything would fail
    with pytest.raises(UnsupportedModelError, match=rf"^this timm model \(\w+\) uses .*{REFUSED[name]}.*which vitkit lacks") as error:
        from_timm(source)
    assert "\n" not in str(error.value)
    assert timm_features_vitkit_lacks(source)


def test_timm_state_dict_of_an_unsupported_model_is_refused_before_loading() -> None:
    source = timm_model("vit_relpos_small_patch16_224", depth=1, img_size=32)
    with pytest.raises(UnsupportedModelError, match=r"state dict has no pos_embed: it is not a timm VisionTransformer"):
        from_timm(source.state_dict(), num_heads=6)


@pytest.mark.parametrize(
    "name", ["vit_tiny_patch16_224", "vit_small_patch16_224", "vit_base_patch16_224", "vit_large_patch16_224"]
)
def test_registry_variants_have_timm_hyper_parameters(name: str) -> None:
    with torch.device("meta"):  # architecture only: no memory, no init cost
        reference = timm.create_model(name, pretrained=False)
    config = model_config(name)
    block = reference.blocks[0]
    assert config.embed_dim == reference.embed_dim
    assert config.depth == len(reference.blocks)
    assert config.num_heads == block.attn.num_heads
    assert config.mlp_ratio == block.mlp.fc1.out_features / reference.embed_dim
    assert config.patch_size == tuple(reference.patch_embed.patch_size)
    assert config.img_size == tuple(reference.patch_embed.img_size)
    assert config.num_classes == reference.num_classes
    assert config.qkv_bias == (block.attn.qkv.bias is not None)
    assert (config.class_token, config.global_pool) == (reference.has_class_token, reference.global_pool)
    assert config.norm_eps == block.norm1.eps
