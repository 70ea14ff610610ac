"""Patch embedding, stochastic depth, encoder blocks, LayerScale, position embeddings and attention statistics."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import Block as TimmBlock
from torch import nn

from vitkit.layers import (
    DropPath,
    EncoderBlock,
    LayerScale,
    Mlp,
    PatchEmbed,
    causal_mask,
    padding_mask,
    resample_pos_embed,
    row_entropy,
    sincos_2d_pos_embed,
)
from vitkit.layers.init_rules import reset_submodules

TOL = dict(rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------- PatchEmbed
def test_patch_embed_handles_non_square_images() -> None:
    embed = PatchEmbed(patch_size=16, in_chans=3, embed_dim=24)
    tokens = embed(torch.randn(2, 3, 32, 48))
    assert tokens.shape == (2, 6, 24)
    assert embed.grid_size(32, 48) == (2, 3)


def test_patch_tokens_are_row_major_projections_of_each_patch() -> None:
    p1, p2, channels = 4, 2, 3
    embed = PatchEmbed(patch_size=(p1, p2), in_chans=channels, embed_dim=8)
    images = torch.randn(2, channels, 8, 6)  # grid 2 x 3
    tokens = embed(images)
    for row in range(2):
        for col in range(3):
            patch = images[:, :, row * p1 : (row + 1) * p1, col * p2 : (col + 1) * p2]
            flat = patch.permute(0, 2, 3, 1).reshape(2, -1)  # (p1 p2 c) order
            torch.testing.assert_close(tokens[:, row * 3 + col], embed.proj(flat), **TOL)


def test_patch_embed_equals_strided_conv_with_permuted_weights() -> None:
    p1, p2, channels, dim = 4, 2, 3, 8
    embed = PatchEmbed(patch_size=(p1, p2), in_chans=channels, embed_dim=dim)
    conv = nn.Conv2d(channels, dim, kernel_size=(p1, p2), stride=(p1, p2))
    with torch.no_grad():
        conv.weight.copy_(embed.proj.weight.reshape(dim, p1, p2, channels).permute(0, 3, 1, 2))
        conv.bias.copy_(embed.proj.bias)
    images = torch.randn(2, channels, 12, 10)
    torch.testing.assert_close(embed(images), conv(images).flatten(2).transpose(1, 2), **TOL)


def test_patch_embed_rejects_image_size_not_divisible_by_patch() -> None:
    with pytest.raises(ValueError, match=r"30x48 is not divisible by the patch size 16x16.*e\.g\. 16x48"):
        PatchEmbed(16, 3, 8)(torch.randn(1, 3, 30, 48))


def test_patch_embed_rejects_wrong_channel_count_naming_both() -> None:
    with pytest.raises(ValueError, match=r"expected 3 image channels, got 1.*in_chans=1"):
        PatchEmbed(16, 3, 8)(torch.randn(1, 1, 32, 32))


def test_patch_embed_rejects_non_image_input() -> None:
    with pytest.raises(ValueError, match=r"\[B, C, H, W\].*\(3, 32, 32\)"):
        PatchEmbed(16, 3, 8)(torch.randn(3, 32, 32))


# ------------------------------------------------------------------------------------ DropPath
def test_drop_path_is_identity_in_eval_mode() -> None:
    drop = DropPath(0.5).eval()
    x = torch.randn(64, 5, 3)
    assert torch.equal(drop(x), x)


def test_drop_path_keeps_about_one_minus_p_of_samples_and_preserves_the_mean() -> None:
    p, samples = 0.3, 20_000
    drop = DropPath(p).train()
    out = drop(torch.ones(samples, 4, 3))
    per_sample = out.flatten(1)
    kept = per_sample[:, 0] != 0
    # one decision per sample: a sample is either wholly dropped or wholly scaled by 1 / (1 - p)
    assert torch.equal(per_sample[kept], torch.full_like(per_sample[kept], 1 / (1 - p)))
    assert torch.equal(per_sample[~kept], torch.zeros_like(per_sample[~kept]))
    assert kept.float().mean().item() == pytest.approx(1 - p, abs=0.02)  # std ~ 0.003
    assert out.mean().item() == pytest.approx(1.0, abs=0.03)  # std ~ 0.005


def test_block_rejects_drop_path_rates_outside_zero_to_one() -> None:
    # timm's DropPath takes any rate (1.0 silently zeroes the branch); the block checks it.
    with pytest.raises(ValueError, match=r"drop_path must lie in \[0, 1\), got 1.0"):
        EncoderBlock(16, 2, drop_path=1.0)
    with pytest.raises(ValueError, match="-0.1"):
        EncoderBlock(16, 2, drop_path=-0.1)


# ----------------------------------------------------------------------------- EncoderBlock
def test_block_uses_identity_for_disabled_drop_path_and_layer_scale() -> None:
    block = EncoderBlock(16, 2)
    for name in ("drop_path1", "drop_path2", "ls1", "ls2"):
        assert type(getattr(block, name)) is nn.Identity, name
    enabled = EncoderBlock(16, 2, drop_path=0.1, init_values=1e-5)
    assert isinstance(enabled.drop_path1, DropPath) and enabled.drop_path1.drop_prob == 0.1
    assert isinstance(enabled.ls1, LayerScale)
    torch.testing.assert_close(enabled.ls2.gamma.detach(), torch.full((16,), 1e-5))


def test_layer_scale_multiplies_each_channel_by_gamma() -> None:
    scale = LayerScale(4, 0.5)
    with torch.no_grad():
        scale.gamma.copy_(torch.tensor([1.0, 2.0, 0.0, -1.0]))
    x = torch.randn(2, 3, 4)
    torch.testing.assert_close(scale(x), x * torch.tensor([1.0, 2.0, 0.0, -1.0]))


@pytest.mark.parametrize("init_values", [None, 0.1])
def test_block_matches_timm_block_with_the_same_weights(init_values: float | None) -> None:
    block = EncoderBlock(32, 4, mlp_ratio=2.0, init_values=init_values).eval()
    with torch.no_grad():
        for param in block.parameters():
            param.add_(0.05 * torch.randn_like(param))  # make biases, norms and gammas non-trivial
    timm_block = TimmBlock(
        32, 4, mlp_ratio=2.0, qkv_bias=True, init_values=init_values, norm_layer=partial(nn.LayerNorm, eps=1e-6)
    ).eval()
    timm_block.load_state_dict(block.state_dict())  # strict: the same keys and shapes
    x = torch.randn(2, 9, 32)
    torch.testing.assert_close(block(x), timm_block(x), **TOL)


def test_block_is_pre_norm_residual_attention_then_mlp() -> None:
    block = EncoderBlock(16, 2, init_values=0.3).eval()
    x = torch.randn(2, 5, 16)
    after_attn = x + 0.3 * block.attn(block.norm1(x))
    expected = after_attn + 0.3 * block.mlp(block.norm2(after_attn))
    torch.testing.assert_close(block(x), expected, **TOL)
    assert block.mlp.fc1.out_features == 64  # default mlp_ratio 4


def test_block_returns_attention_weights_with_its_output() -> None:
    block = EncoderBlock(16, 2).eval()
    x = torch.randn(2, 5, 16)
    out, weights = block(x, need_weights=True)
    torch.testing.assert_close(out, block(x), **TOL)
    assert weights.shape == (2, 2, 5, 5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 2, 5))


def test_block_drop_path_drops_whole_residual_branches_per_sample() -> None:
    block = EncoderBlock(16, 2, drop_path=0.5).train()
    x = torch.randn(4000, 3, 16)
    out = block(x)
    # a sample whose two branches were both dropped passes through unchanged: 4000 * 0.5 * 0.5 =
    # 1000 expected, binomial std 27; +-110 (4 std) rejects a drop rate of 0.45 or 0.55.
    untouched = (out - x).flatten(1).abs().amax(dim=1) == 0
    assert 890 < untouched.sum().item() < 1110


# ------------------------------------------------------------------------- position embeddings
def test_sincos_embedding_follows_the_2d_sin_cos_formula() -> None:
    dim, grid = 16, (3, 5)
    table = sincos_2d_pos_embed(dim, grid)
    assert table.shape == (15, dim)
    omega = 1.0 / 10000 ** (torch.arange(4) / 4)
    y, x = 2, 3  # row-major position 2 * 5 + 3
    expected = torch.cat([(y * omega).sin(), (y * omega).cos(), (x * omega).sin(), (x * omega).cos()])
    torch.testing.assert_close(table[13], expected)
    assert torch.unique(table, dim=0).shape[0] == 15  # every position is distinct


@pytest.mark.parametrize(("dim", "grid"), [(4, (1, 1)), (32, (4, 4)), (64, (8, 6)), (384, (3, 7)), (768, (14, 14))])
def test_sincos_embedding_is_bit_identical_to_the_hand_formula(dim: int, grid: tuple[int, int]) -> None:
    # vitkit's own table before it called timm's build_sincos2d_pos_embed(interleave_sin_cos=True).
    rows, cols = torch.meshgrid(torch.arange(grid[0]).float(), torch.arange(grid[1]).float(), indexing="ij")
    omega = 1.0 / 10000.0 ** (torch.arange(dim // 4, dtype=torch.float32) / (dim // 4))
    ys, xs = rows.flatten()[:, None] * omega, cols.flatten()[:, None] * omega
    assert torch.equal(sincos_2d_pos_embed(dim, grid), torch.cat([ys.sin(), ys.cos(), xs.sin(), xs.cos()], dim=1))


def test_sincos_embedding_needs_dim_divisible_by_four() -> None:
    with pytest.raises(ValueError, match="divisible by 4, got 18"):
        sincos_2d_pos_embed(18, (2, 2))


@pytest.mark.parametrize(("old_grid", "new_grid"), [((4, 4), (6, 6)), ((4, 4), (3, 5)), ((2, 3), (4, 6))])
def test_resample_pos_embed_matches_timm_and_keeps_the_class_token(
    old_grid: tuple[int, int], new_grid: tuple[int, int]
) -> None:
    pos = torch.randn(1, 1 + old_grid[0] * old_grid[1], 8)
    out = resample_pos_embed(pos, new_grid, old_grid, num_prefix_tokens=1)
    expected = resample_abs_pos_embed(pos, list(new_grid), list(old_grid), num_prefix_tokens=1)
    assert out.shape == (1, 1 + new_grid[0] * new_grid[1], 8)
    torch.testing.assert_close(out, expected, **TOL)
    torch.testing.assert_close(out[:, 0], pos[:, 0])


def test_resample_pos_embed_to_the_same_grid_is_a_no_op() -> None:
    pos = torch.randn(1, 17, 8)
    assert resample_pos_embed(pos, (4, 4), (4, 4), num_prefix_tokens=1) is pos


def test_resample_pos_embed_rejects_a_grid_that_does_not_match_the_table() -> None:
    with pytest.raises(ValueError, match="16 patch positions.*3x3 needs 9"):
        resample_pos_embed(torch.randn(1, 17, 8), (6, 6), (3, 3), num_prefix_tokens=1)


# --------------------------------------------------------------- shifted patch tokenization (SPT)
def test_shifted_patch_tokens_stack_the_image_and_four_half_patch_diagonal_shifts() -> None:
    from vitkit.layers.patch_embed import shift_diagonally

    image = torch.arange(1, 17, dtype=torch.float32).reshape(1, 1, 4, 4)
    shifts = shift_diagonally(image, (2, 2))  # half a patch = 1 pixel
    up_left, up_right, down_left, down_right = (s[0, 0] for s in shifts)
    grid = image[0, 0]
    # Content moved up-left by one: pixel (r, c) shows (r + 1, c + 1); the last row/column are zero.
    torch.testing.assert_close(up_left[:3, :3], grid[1:, 1:])
    assert up_left[3].abs().sum() == 0 and up_left[:, 3].abs().sum() == 0
    torch.testing.assert_close(up_right[:3, 1:], grid[1:, :3])
    torch.testing.assert_close(down_left[1:, :3], grid[:3, 1:])
    torch.testing.assert_close(down_right[1:, 1:], grid[:3, :3])
    assert down_right[0].abs().sum() == 0 and down_right[:, 0].abs().sum() == 0


def test_shifted_patch_embed_normalises_five_stacked_patches_before_projecting() -> None:
    from einops import rearrange

    from vitkit.layers.patch_embed import shift_diagonally

    embed = PatchEmbed(patch_size=2, in_chans=3, embed_dim=8, shifted=True)
    assert embed.proj.in_features == 5 * 3 * 2 * 2
    images = torch.randn(2, 3, 4, 6)
    stacked = torch.cat([images, *shift_diagonally(images, (2, 2))], dim=1)
    patches = rearrange(stacked, "b c (h p1) (w p2) -> b (h w) (p1 p2 c)", p1=2, p2=2)
    normed = (patches - patches.mean(-1, keepdim=True)) / torch.sqrt(patches.var(-1, unbiased=False, keepdim=True) + 1e-6)
    expected = embed.proj(normed * embed.patch_norm.weight + embed.patch_norm.bias)
    torch.testing.assert_close(embed(images), expected, atol=1e-5, rtol=1e-5)
    assert embed(images).shape == (2, 6, 8)


# --------------------------------------------------- EncoderBlock masks: padding, causality, gates
@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_block_padded_tokens_values_do_not_change_the_other_outputs(attn_impl: str) -> None:
    block = EncoderBlock(16, 4, attn_impl=attn_impl).eval()
    x = torch.randn(2, 7, 16)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[0, 5:], padding[1, 3:] = True, True
    changed = torch.where(padding[..., None], 100 * torch.randn_like(x), x)
    real = ~padding
    out, out_changed = block(x, attn_bias=padding_mask(padding)), block(changed, attn_bias=padding_mask(padding))
    assert torch.equal(out[real], out_changed[real])
    assert not torch.allclose(block(x)[real], block(changed)[real])  # without the mask they do change


def test_block_causal_mask_makes_each_output_independent_of_later_tokens() -> None:
    block = EncoderBlock(16, 4).eval()
    x = torch.randn(2, 6, 16)
    later_changed = x.clone()
    later_changed[:, 4:] = torch.randn(2, 2, 16)
    out, out_changed = block(x, attn_bias=causal_mask(6, 6)), block(later_changed, attn_bias=causal_mask(6, 6))
    assert torch.equal(out[:, :4], out_changed[:, :4])
    assert not torch.allclose(block(x)[:, :4], block(later_changed)[:, :4])


def test_block_head_gates_zeroing_a_head_equals_removing_its_output_projection_columns() -> None:
    block = EncoderBlock(16, 4).eval()  # head width 4
    x = torch.randn(2, 5, 16)
    without_head = EncoderBlock(16, 4).eval()
    without_head.load_state_dict(block.state_dict())
    with torch.no_grad():
        without_head.attn.proj.weight[:, 2 * 4 : 3 * 4] = 0.0  # head 2 no longer reaches W_o's output
    gates = torch.tensor([1.0, 1.0, 0.0, 1.0])
    torch.testing.assert_close(block(x, head_gates=gates), without_head(x), **TOL)
    assert not torch.allclose(block(x), without_head(x))


# ------------------------------------------------------------- device / dtype factory keywords
@pytest.mark.parametrize(
    "build",
    [
        lambda **f: PatchEmbed(4, 3, 16, norm=True, shifted=True, **f),
        lambda **f: Mlp(16, 32, **f),
        lambda **f: EncoderBlock(16, 2, qk_norm=True, init_values=0.1, locality=True, **f),
    ],
    ids=["PatchEmbed", "Mlp", "EncoderBlock"],
)
def test_layers_create_their_parameters_with_the_given_dtype_and_device(build) -> None:
    layer = build(dtype=torch.bfloat16)
    assert {p.dtype for p in layer.parameters()} == {torch.bfloat16}
    assert {p.device.type for p in build(device="meta").parameters()} == {"meta"}


def test_layer_reset_parameters_after_meta_build_gives_the_cpu_init() -> None:
    def build() -> EncoderBlock:
        return EncoderBlock(32, 4, qk_norm=True, init_values=0.1, locality=True, out_init_scale=0.3)

    with torch.device("meta"):
        block = build()
    block.to_empty(device="cpu")
    torch.manual_seed(0)
    reset_submodules(block)
    reference = build()
    torch.manual_seed(0)
    reset_submodules(reference)
    for (name, got), expected in zip(block.state_dict().items(), reference.state_dict().values()):
        assert torch.equal(got, expected), name
    # and the re-drawn init is the construction-time one: W_o Xavier-uniform times 0.3, LayerScale 0.1
    bound = 0.3 * (6 / (32 + 32)) ** 0.5
    assert 0.9 * bound < block.attn.proj.weight.abs().max() <= bound
    assert torch.equal(block.ls1.gamma, torch.full((32,), 0.1))
    assert torch.equal(block.attn.temperature, torch.full((4,), 8**-0.5))


def test_row_entropy_in_nats_and_as_a_fraction_of_log_n_by_hand() -> None:
    weights = torch.tensor([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    # -(2 * 0.5 ln 0.5) = ln 2; a one-hot row has none (0 ln 0 = 0); uniform over 4 keys has ln 4
    torch.testing.assert_close(row_entropy(weights), torch.tensor([math.log(2), 0.0, math.log(4)]))
    torch.testing.assert_close(row_entropy(weights, normalize=True), torch.tensor([0.5, 0.0, 1.0]))
