"""timm's RoPE ViTs (its ``Eva`` class) to vitkit and back: logits to 1e-4 in float32, and every
other Eva family refused with one error naming what vitkit lacks, before anything is built."""

from __future__ import annotations

from typing import Any

import pytest
import timm
import torch
from timm_families import ROPE_FAMILIES

import vitkit.models.timm_interop as interop
from vitkit import create_model, from_timm, to_timm_state_dict
from vitkit.errors import UnsupportedModelError, VitkitError
from vitkit.models import to_timm

PARITY = dict(rtol=1e-4, atol=1e-4)
#: Short and small: two blocks at 64 px (a 4x4 grid) keep each family's every other setting.
FAST: dict[str, Any] = dict(depth=2, img_size=64)


def eva(name: str, **kwargs: Any) -> torch.nn.Module:
    """A timm model with weights that all count: noise on every parameter, LayerScale near 1 and an
    O(1) head (timm starts LayerScale at 1e-5 and the head at 1e-3 of its init, which would let a
    wrong attention or RoPE pass a 1e-4 check)."""
    model = timm.create_model(name, pretrained=False, **{**FAST, **kwargs})
    with torch.no_grad():
        for key, param in model.named_parameters():
            if "gamma" in key:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            else:
                param.add_(0.05 * torch.randn_like(param))
        model.head.weight.normal_(std=0.5)
    return model.eval()


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x)




@pytest.mark.parametrize("name", ROPE_FAMILIES)
def test_from_timm_rope_family_matches_timm_logits(name: str) -> None:
    source = eva(name)
    model = from_timm(source).eval()
    x = torch.randn(2, 3, 64, 64)
    expected = logits(source, x)
    assert expected.std() > 0.1  # a comparison of real numbers, not of timm's near-zero init
    torch.testing.assert_close(logits(model, x), expected, **PARITY)
    assert model.config.rope == ("mixed" if "mixed" in name else "axial")
    assert model.config.pos_embed == ("learn" if "ape" in name else "none")


@pytest.mark.parametrize("name", ["vit_betwixt_patch16_rope_reg4_gap_256", "vit_medium_patch16_rope_reg1_gap_256"])
def test_rope_families_with_registers_match_timm_logits(name: str) -> None:
    # At their own 256 px: their RoPE is defined on a 16x16 reference grid (ref_feat_shape).
    source = eva(name, img_size=256)
    model = from_timm(source).eval()
    x = torch.randn(2, 3, 256, 256)
    expected = logits(source, x)
    assert expected.std() > 0.1
    torch.testing.assert_close(logits(model, x), expected, **PARITY)
    assert model.config.reg_tokens == source.reg_token.shape[1] and model.num_prefix_tokens == source.num_prefix_tokens
    torch.testing.assert_close(logits(to_timm(model).eval(), x), expected, **PARITY)


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_224"])
def test_the_same_weights_without_rope_miss_timms_logits(name: str) -> None:
    source = eva(name)
    model = from_timm(source).eval()
    bare = create_model("vit_small_patch16_224", **{**model.config.to_dict(), "rope": "none", "rope_theta": None}).eval()
    bare.load_state_dict({k: v for k, v in model.state_dict().items() if ".rope." not in k})
    x = torch.randn(2, 3, 64, 64)
    assert (logits(bare, x) - logits(source, x)).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["vit_small_patch16_rope_224", "vit_small_patch16_rope_mixed_ape_224"])
def test_dynamic_img_size_matches_timm_at_other_sizes(name: str) -> None:
    source = eva(name, dynamic_img_size=True)
    model = from_timm(source).eval()
    for size in (64, 96, 48):
        x = torch.randn(1, 3, size, size)
        torch.testing.assert_close(logits(model, x), logits(source, x), **PARITY)


def test_mixed_frequencies_of_each_block_come_from_timms_one_tensor() -> None:
    source = eva("vit_small_patch16_rope_mixed_224")
    model = from_timm(source)
    for i, block in enumerate(model.blocks):
        torch.testing.assert_close(block.attn.rope.freqs.detach(), source.rope.freqs.detach()[:, i])


def test_eva_attention_with_q_and_v_biases_maps_to_vitkits_qkv_bias() -> None:
    """Plain EVA (no RoPE): EvaAttention holds q_bias and v_bias, its key bias fixed at zero."""
    source = eva("eva_giant_patch14_224", embed_dim=64, num_heads=4, img_size=56, num_classes=10)
    model = from_timm(source).eval()
    assert source.blocks[0].attn.q_bias is not None and model.config.rope == "none"
    torch.testing.assert_close(model.blocks[0].attn.qkv.bias.detach()[64:128], torch.zeros(64))
    x = torch.randn(2, 3, 56, 56)
    torch.testing.assert_close(logits(model, x), logits(source, x), **PARITY)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(rope="axial", pos_embed="none"),
        dict(rope="mixed", pos_embed="none"),
        dict(rope="mixed", pos_embed="learn", init_values=0.5),
        dict(rope="axial", pos_embed="sincos", rope_theta=50.0, qk_norm=True),
        dict(rope="axial", pos_embed="none", rope_axes="ij", class_token=False, global_pool="avg"),
    ],
)
def test_to_timm_round_trip_gives_an_eva_with_the_same_logits(overrides: dict[str, Any]) -> None:
    model = create_model(
        "vit_small_patch16_224", img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4, num_classes=10,
        **overrides,
    ).eval()
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.05 * torch.randn_like(param))
    twin = to_timm(model).eval()
    assert type(twin).__name__ == "Eva"
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(logits(twin, x), logits(model, x), **PARITY)
    back = from_timm(twin).eval()
    assert back.config.rope == model.config.rope
    torch.testing.assert_close(logits(back, x), logits(model, x), **PARITY)
    if model.config.rope == "mixed":
        assert to_timm_state_dict(model)["rope.freqs"].shape == (2, 2, 4, 8)


def test_ape_position_embedding_is_on_the_patches_only_as_timms() -> None:
    source = eva("vit_small_patch16_rope_mixed_ape_224")
    model = from_timm(source)
    torch.testing.assert_close(model.pos_embed.detach(), source.pos_embed.detach())
    torch.testing.assert_close(model.cls_token.detach(), source.cls_token.detach())


# ----------------------------------------------------------------------------------- refusals
#: Every other Eva family at two blocks, and the feature vitkit lacks that each is refused for.
REFUSED = {
    "eva02_tiny_patch14_224": "SwiGLU",
    "eva02_base_patch14_448": "separate q/k/v projections",
    "eva02_base_patch16_clip_224": "a norm inside the attention",
    "eva02_enormous_patch14_clip_224": "residual post-norm blocks",
    "vit_small_patch16_dinov3": "RotaryEmbeddingDinoV3",
    "vit_small_patch16_dinov3_qkvb": "half-rotation RoPE layout",
    "vit_small_patch16_lingbot": "half-rotation RoPE layout",
    "vit_pe_core_tiny_patch16_384": "attention-pool head",
    "vit_pe_spatial_tiny_patch16_512": "both or neither of a final norm and fc_norm",  # its pre-norm converts
}


@pytest.mark.parametrize(("name", "lacking"), sorted(REFUSED.items()))
def test_other_eva_families_are_refused_naming_the_feature_before_building(
    name: str, lacking: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = timm.create_model(name, pretrained=False, depth=2)
    built = []
    monkeypatch.setattr(interop, "VisionTransformer", lambda *a, **k: built.append(1))
    with pytest.raises(UnsupportedModelError, match=lacking) as caught:
        from_timm(source)
    assert isinstance(caught.value, VitkitError) and "\n" not in str(caught.value)
    assert not built


def test_an_eva_state_dict_is_refused_with_a_hint_to_pass_the_model() -> None:
    with pytest.raises(UnsupportedModelError, match="pass the model to from_timm"):
        from_timm(eva("vit_small_patch16_rope_mixed_224").state_dict())


def test_rope_reference_grid_other_than_the_models_is_refused() -> None:
    source = timm.create_model("vit_small_patch16_rope_224", pretrained=False, depth=1, img_size=64,
                               ref_feat_shape=(8, 8))
    with pytest.raises(UnsupportedModelError, match="ref_feat_shape"):
        from_timm(source)
