"""2-D rotary position embeddings: the rotation by hand, the relative property, prefix tokens,
both kernels, masks, cross-attention, the KV cache and head pruning.

The references here rotate channel pairs with the textbook formula
``(a, b) -> (a cos t - b sin t, a sin t + b cos t)`` at the angles Heo et al. (arXiv 2403.13298)
define, written out independently of vitkit's and timm's code.
"""

from __future__ import annotations

import math

import pytest
import torch

from vitkit.layers import (
    CausalSelfAttention,
    CrossAttention,
    EncoderBlock,
    KVCache,
    MultiHeadSelfAttention,
    Rope2d,
    TokenPositions,
    causal_mask,
    padding_mask,
    patch_coords,
    rotate_tokens,
)

DIM, HEADS, HEAD_DIM = 32, 4, 8
TOL = dict(rtol=1e-5, atol=1e-5)


def rotate_pairs(v: torch.Tensor, angles: torch.Tensor) -> torch.Tensor:
    """Turn each channel pair ``(v[2i], v[2i+1])`` of ``v`` ``[..., d]`` by ``angles[..., i]``."""
    a, b = v[..., 0::2], v[..., 1::2]
    cos, sin = angles.cos(), angles.sin()
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


def axial_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """``[n, d/2]``: the first d/4 pairs turn by ``x * theta^(-k/(d/4))``, the rest by ``y`` alike."""
    bands = torch.tensor([theta ** (-k / (head_dim // 4)) for k in range(head_dim // 4)])
    return torch.cat([positions[:, :1] * bands, positions[:, 1:] * bands], dim=-1)


def hand_attention(
    msa: MultiHeadSelfAttention, x: torch.Tensor, angles: torch.Tensor, num_prefix: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Output and weights of RoPE self-attention by hand: q, k from the fused weight's slices, the
    patch tokens' q and k turned by ``angles`` ``[H or 1, n, d/2]``, the prefix left alone."""
    batch, tokens, _ = x.shape
    qkv = (x @ msa.qkv.weight.T + msa.qkv.bias).view(batch, tokens, 3, msa.num_heads, msa.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    q = torch.cat([q[:, :, :num_prefix], rotate_pairs(q[:, :, num_prefix:], angles)], dim=2)
    k = torch.cat([k[:, :, :num_prefix], rotate_pairs(k[:, :, num_prefix:], angles)], dim=2)
    weights = (q @ k.transpose(-2, -1) / math.sqrt(msa.head_dim)).softmax(-1)
    out = (weights @ v).transpose(1, 2).reshape(batch, tokens, -1)
    return msa.proj(out), weights


def at(positions: torch.Tensor, tokens: int) -> TokenPositions:
    """``positions`` ``[n, 2]`` of the last ``n`` of ``tokens`` tokens (the others are prefix tokens)."""
    return TokenPositions(positions, tokens - positions.shape[-2])


def make_msa(rope: str, **kwargs) -> MultiHeadSelfAttention:
    msa = MultiHeadSelfAttention(DIM, HEADS, rope=rope, **kwargs)
    with torch.no_grad():
        msa.qkv.bias.normal_(std=0.1)
    return msa


# ------------------------------------------------------------------------- the rotation itself
def test_patch_coords_are_column_row_pairs_in_row_major_order() -> None:
    expected = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    torch.testing.assert_close(patch_coords((2, 2)), expected)
    assert patch_coords((2, 3))[4].tolist() == [1.0, 1.0]  # row 1, column 1


def test_axial_rope_equals_a_hand_written_2d_rotation_on_a_2x2_grid() -> None:
    theta = 100.0
    rope = Rope2d(HEAD_DIM, 1, "axial", theta)
    x = torch.randn(1, 1, 5, HEAD_DIM)  # a class token, then the 2x2 grid
    rotated = rotate_tokens(x, rope(patch_coords((2, 2))), 1)

    torch.testing.assert_close(rotated[0, 0, 0], x[0, 0, 0])  # the prefix token is not rotated
    cells = [(0, 0), (1, 0), (0, 1), (1, 1)]  # (x, y) of tokens 1..4
    for token, (px, py) in enumerate(cells, start=1):
        angles = [px * 1.0, px * 0.1, py * 1.0, py * 0.1]  # 100^(-0/2), 100^(-1/2)
        v = x[0, 0, token].tolist()
        expected = []
        for i, t in enumerate(angles):
            a, b = v[2 * i], v[2 * i + 1]
            expected += [a * math.cos(t) - b * math.sin(t), a * math.sin(t) + b * math.cos(t)]
        torch.testing.assert_close(rotated[0, 0, token], torch.tensor(expected), **TOL)


def test_ij_axes_turn_the_first_half_with_the_row() -> None:
    positions = torch.tensor([[3.0, 5.0]])
    x = torch.randn(1, 1, 1, HEAD_DIM)
    swapped = rotate_tokens(x, Rope2d(HEAD_DIM, 1, "axial", 100.0, axes="ij")(positions), 0)
    expected = rotate_pairs(x, axial_angles(positions.flip(-1), HEAD_DIM, 100.0))
    torch.testing.assert_close(swapped, expected, **TOL)


def test_mixed_rope_turns_each_pair_by_its_heads_learned_2d_frequency() -> None:
    rope = Rope2d(HEAD_DIM, 2, "mixed")
    freqs = torch.randn(2, 2, HEAD_DIM // 2)
    with torch.no_grad():
        rope.freqs.copy_(freqs)
    positions = torch.tensor([[2.0, -1.0], [0.5, 3.0]])
    x = torch.randn(1, 2, 3, HEAD_DIM)
    rotated = rotate_tokens(x, rope(positions), 1)
    for head in range(2):
        angles = positions[:, :1] * freqs[0, head] + positions[:, 1:] * freqs[1, head]  # x fx + y fy
        torch.testing.assert_close(rotated[0, head, 1:], rotate_pairs(x[0, head, 1:], angles), **TOL)
    torch.testing.assert_close(rotated[:, :, 0], x[:, :, 0])


def test_mixed_init_has_axial_magnitudes_and_one_random_direction_per_head() -> None:
    torch.manual_seed(0)
    theta, quarter = 10.0, HEAD_DIM // 4
    fx, fy = Rope2d(HEAD_DIM, HEADS, "mixed", theta).freqs.detach()
    magnitude = torch.hypot(fx, fy)
    expected = torch.tensor([theta ** (-k / quarter) for k in range(quarter)] * 2)
    torch.testing.assert_close(magnitude, expected.expand(HEADS, -1), **TOL)
    direction = torch.atan2(fy, fx)
    turned = torch.remainder(direction[:, quarter:] - direction[:, :quarter], 2 * math.pi)
    torch.testing.assert_close(turned, torch.full_like(turned, math.pi / 2), **TOL)  # second half at +90 degrees
    assert direction[:, 0].unique().numel() == HEADS  # each head its own angle


@pytest.mark.parametrize("rope", ["axial", "mixed"])
def test_logits_between_patches_are_unchanged_when_both_positions_shift_alike(rope: str) -> None:
    msa = make_msa(rope, attn_impl="explicit")
    x = torch.randn(2, 6, DIM)
    positions = patch_coords((2, 3))
    _, weights = msa(x, positions=at(positions, 6), need_weights=True)
    _, shifted = msa(x, positions=at(positions + torch.tensor([3.5, -2.0]), 6), need_weights=True)
    torch.testing.assert_close(shifted, weights, **TOL)
    _, moved = msa(x, positions=at(positions.flip(0), 6), need_weights=True)  # not a uniform shift
    assert (moved - weights).abs().max() > 1e-3


# -------------------------------------------------------------------------- in the attention
@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_attention_with_axial_rope_equals_the_hand_computation_and_leaves_the_prefix_unrotated(
    attn_impl: str,
) -> None:
    msa = make_msa("axial", rope_theta=100.0, attn_impl=attn_impl)
    x = torch.randn(2, 1 + 4, DIM)
    positions = patch_coords((2, 2))
    expected, expected_weights = hand_attention(msa, x, axial_angles(positions, HEAD_DIM, 100.0), num_prefix=1)
    torch.testing.assert_close(msa(x, positions=at(positions, 5)), expected, **TOL)
    torch.testing.assert_close(msa(x, positions=at(positions, 5), need_weights=True)[1], expected_weights, **TOL)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_attention_with_mixed_rope_equals_the_hand_computation_with_registers(attn_impl: str) -> None:
    msa = make_msa("mixed", attn_impl=attn_impl)
    x = torch.randn(2, 5 + 6, DIM)  # class token, four registers, a 2x3 grid
    positions = patch_coords((2, 3))
    fx, fy = msa.rope.freqs.detach()
    angles = positions[:, None, :1] * fx[None] + positions[:, None, 1:] * fy[None]  # [n, H, d/2]
    expected, _ = hand_attention(msa, x, angles.transpose(0, 1), num_prefix=5)
    torch.testing.assert_close(msa(x, positions=at(positions, 11)), expected, **TOL)


@pytest.mark.parametrize("rope", ["axial", "mixed"])
@pytest.mark.parametrize("masks", ["none", "padding", "causal", "attn_mask"])
def test_sdpa_and_explicit_kernels_agree_with_rope_and_masks(rope: str, masks: str) -> None:
    sdpa = make_msa(rope, attn_impl="sdpa")
    explicit = MultiHeadSelfAttention(DIM, HEADS, rope=rope, attn_impl="explicit")
    explicit.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 1 + 6, DIM)
    padding = torch.zeros(2, 7, dtype=torch.bool)
    padding[1, -2:] = True
    kwargs = {
        "none": {},
        "padding": {"attn_bias": padding_mask(padding)},
        "causal": {"attn_bias": causal_mask(7, 7)},
        "attn_mask": {"attn_bias": torch.rand(7, 7, generator=torch.Generator().manual_seed(0)) > 0.3},
    }[masks]
    positions = at(patch_coords((3, 2)), 7)
    torch.testing.assert_close(sdpa(x, positions=positions, **kwargs), explicit(x, positions=positions, **kwargs), **TOL)


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
def test_cross_attention_rotates_keys_by_the_context_positions(attn_impl: str) -> None:
    msa = CrossAttention(DIM, HEADS, rope="mixed", attn_impl=attn_impl)
    x, context = torch.randn(2, 3, DIM), torch.randn(2, 5, DIM)
    q_pos, k_pos = torch.randn(3, 2), torch.randn(5, 2)
    out = msa(x, context, positions=at(q_pos, 3), context_positions=at(k_pos, 5))
    offset = torch.tensor([1.5, 4.0])
    shifted = msa(x, context, positions=at(q_pos + offset, 3), context_positions=at(k_pos + offset, 5))
    torch.testing.assert_close(shifted, out, **TOL)  # relative: only q_pos - k_pos matters
    assert (msa(x, context, positions=at(q_pos, 3), context_positions=at(k_pos + offset, 5)) - out).abs().max() > 1e-3
    with pytest.raises(ValueError, match="context_positions"):
        msa(x, context, positions=at(q_pos, 3))


@pytest.mark.parametrize("attn_impl", ["sdpa", "explicit"])
@pytest.mark.parametrize("rope", ["axial", "mixed"])
def test_kv_cache_with_rope_stores_rotated_keys_and_equals_the_full_causal_pass(attn_impl: str, rope: str) -> None:
    msa = make_msa(rope, attn_impl=attn_impl).eval()
    decoder = CausalSelfAttention(DIM, HEADS, rope=rope, attn_impl=attn_impl).eval()
    decoder.load_state_dict(msa.state_dict())
    x = torch.randn(2, 6, DIM)
    positions = patch_coords((2, 3))
    full = msa(x, attn_bias=causal_mask(6, 6), positions=at(positions, 6))

    cache = KVCache()
    steps = [decoder(x[:, t : t + 1], kv_cache=cache, positions=at(positions[t : t + 1], 1)) for t in range(6)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **TOL)

    keys = (x @ msa.qkv.weight[DIM : 2 * DIM].T + msa.qkv.bias[DIM : 2 * DIM]).view(2, 6, HEADS, HEAD_DIM)
    rotated = rotate_tokens(keys.transpose(1, 2), msa.rope(positions), 0)
    torch.testing.assert_close(cache.k, rotated, **TOL)


def test_pruning_heads_keeps_each_remaining_heads_mixed_frequencies() -> None:
    msa = make_msa("mixed", attn_impl="explicit")
    x, positions = torch.randn(2, 7, DIM), patch_coords((2, 3))
    gated = msa(x, positions=at(positions, 7), head_gates=torch.tensor([0.0, 1.0, 0.0, 1.0]))
    freqs = msa.rope.freqs.detach().clone()
    msa.prune_heads([0, 2])
    torch.testing.assert_close(msa.rope.freqs.detach(), freqs[:, [1, 3]])
    torch.testing.assert_close(msa(x, positions=at(positions, 7)), gated, **TOL)


def test_mixed_frequencies_learn_and_axial_rope_holds_no_state() -> None:
    msa = make_msa("mixed")
    msa(torch.randn(1, 5, DIM), positions=at(patch_coords((2, 2)), 5)).sum().backward()
    assert msa.rope.freqs.grad is not None and msa.rope.freqs.grad.abs().sum() > 0
    assert "rope.freqs" in msa.state_dict()
    assert not any("rope" in key for key in make_msa("axial").state_dict())


def test_block_hands_positions_to_its_attention() -> None:
    block = EncoderBlock(DIM, HEADS, rope="axial")
    x = torch.randn(1, 5, DIM)
    out = block(x, positions=at(patch_coords((2, 2)), 5))
    assert (out - block(x, positions=at(patch_coords((2, 2)) * 2, 5))).abs().max() > 1e-4


# ------------------------------------------------------------------------------------ errors
def test_positions_are_ignored_without_rope_and_rope_without_positions_or_with_wrong_ones_raises() -> None:
    plain = MultiHeadSelfAttention(DIM, HEADS)
    x = torch.randn(1, 4, DIM)
    torch.testing.assert_close(plain(x, positions=at(patch_coords((2, 2)), 4)), plain(x))  # a model always passes them
    with pytest.raises(ValueError, match="pass positions=TokenPositions"):
        make_msa("axial")(x)
    with pytest.raises(ValueError, match="6 patch tokens after 0 prefix tokens.*holds 4"):
        make_msa("axial")(x, positions=TokenPositions(patch_coords((2, 3))))
    with pytest.raises(ValueError, match=r"\[n, 2\] or \[B, n, 2\]"):
        TokenPositions(torch.zeros(4, 3))


def test_rope_needs_head_dim_divisible_by_4_and_a_known_kind() -> None:
    with pytest.raises(ValueError, match="divisible by 4"):
        MultiHeadSelfAttention(12, 2, rope="axial")  # head_dim 6
    with pytest.raises(ValueError, match="rope must be one of"):
        MultiHeadSelfAttention(DIM, HEADS, rope="spiral")
