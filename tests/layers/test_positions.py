"""Token positions carried with the tokens: dropped tokens keep their positions, axial RoPE's angles
are computed once per forward, and patch tokens go back on the grid by their positions."""

from __future__ import annotations

import pytest
import torch
from einops import rearrange

import vitkit
from vitkit.layers import MultiHeadSelfAttention, Rope2d, TokenPositions

TOL = dict(rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rope", ["axial", "mixed"])
def test_attention_over_kept_tokens_equals_full_attention_with_the_dropped_keys_masked(rope: str) -> None:
    msa = MultiHeadSelfAttention(32, 4, rope=rope, attn_impl="explicit").eval()
    batch, prefix, grid = 2, 1, (4, 4)
    x = torch.randn(batch, prefix + 16, 32)
    positions = TokenPositions.of_grid(grid, prefix)
    keep = torch.stack([torch.randperm(16)[:6].sort().values for _ in range(batch)])  # each sample its own patches

    kept_tokens = torch.cat([x[:, :prefix], x[:, prefix:].gather(1, keep[..., None].expand(-1, -1, 32))], dim=1)
    subset = msa(kept_tokens, positions=positions.select(keep))

    # The same queries in the full sequence, with every dropped key forbidden: what the kept tokens see.
    allowed = torch.zeros(batch, 1, 1, prefix + 16, dtype=torch.bool)
    allowed[..., :prefix] = True
    allowed[torch.arange(batch)[:, None], 0, 0, prefix + keep] = True
    full = msa(x, positions=positions, attn_bias=allowed)
    rows = torch.cat([torch.zeros(batch, prefix, dtype=torch.long), prefix + keep], dim=1)
    torch.testing.assert_close(subset, full.gather(1, rows[..., None].expand(-1, -1, 32)), **TOL)
    # Had the positions not followed the tokens (the first 6 cells instead), the result differs.
    wrong = TokenPositions(positions.xy[:, :6], prefix)
    assert (msa(kept_tokens, positions=wrong) - subset).abs().max() > 1e-3


@pytest.mark.parametrize(("rope", "calls"), [("axial", 1), ("mixed", 3)])
def test_axial_angles_are_computed_once_per_forward_and_mixed_once_per_layer(
    rope: str, calls: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = vitkit.VisionTransformer(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=2, num_classes=3,
                                     rope=rope).eval()
    counted = []
    original = Rope2d.forward
    monkeypatch.setattr(Rope2d, "forward", lambda self, xy: counted.append(1) or original(self, xy))
    model(torch.randn(2, 3, 16, 16))
    assert len(counted) == calls


def test_to_grid_places_dense_and_selected_tokens_in_their_cells() -> None:
    positions = TokenPositions.of_grid((2, 3), num_prefix=1)
    patches = torch.randn(2, 6, 5)
    torch.testing.assert_close(positions.to_grid(patches), rearrange(patches, "b (h w) d -> b d h w", h=2, w=3))

    keep = torch.tensor([[4, 0], [2, 5]])  # cells (row 1, col 1), (0, 0) and (0, 2), (1, 2)
    kept = patches.gather(1, keep[..., None].expand(-1, -1, 5))
    grid = positions.select(keep).to_grid(kept)
    expected = torch.zeros(2, 5, 2, 3)
    expected[0, :, 1, 1], expected[0, :, 0, 0] = kept[0, 0], kept[0, 1]
    expected[1, :, 0, 2], expected[1, :, 1, 2] = kept[1, 0], kept[1, 1]
    torch.testing.assert_close(grid, expected)


def test_positions_refuse_a_sequence_they_do_not_describe() -> None:
    msa = MultiHeadSelfAttention(32, 4, rope="axial")
    with pytest.raises(ValueError, match="16 patch tokens after 1 prefix tokens.*holds 7 tokens"):
        msa(torch.randn(1, 7, 32), positions=TokenPositions.of_grid((4, 4), 1))
    with pytest.raises(ValueError, match=r"keep must be \[B, k\]"):
        TokenPositions.of_grid((4, 4)).select(torch.tensor([1, 2]))
