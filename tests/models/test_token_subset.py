"""The model-level seams for tokens: a subset of the patch tokens (MAE's visible patches, timm's
``patch_drop``) with their positions, and an attention mask or bias handed to every block.

The expected values come from invariants that a wrong seam breaks: attention is permutation
equivariant when positions travel with the tokens, a dropped patch cannot change anything, and a
key that no query may attend to in any block cannot change the other tokens."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from vitkit import VisionTransformer, ViTConfig

TINY: dict[str, Any] = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=32, depth=3, num_heads=4, mlp_ratio=2.0)
VARIANTS = {
    "learned": {},
    "rope": {"rope": "axial"},
    "rope_mixed_registers": {"rope": "mixed", "reg_tokens": 2},
    "sincos_no_embed_class": {"pos_embed": "sincos", "no_embed_class": True, "reg_tokens": 1},
}


def tiny(**overrides: Any) -> VisionTransformer:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():  # tokens and positions far from their near-zero init, so that they matter
        for name, parameter in model.named_parameters():
            if name in ("cls_token", "reg_token", "pos_embed") or name.endswith("rope.freqs"):
                parameter.normal_(0, 1)
    return model


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 16, 16, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_kept_tokens_carry_their_positions_so_a_permutation_permutes_the_output(variant: str) -> None:
    model = tiny(**VARIANTS[variant])
    prefix = model.num_prefix_tokens
    keep = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(s)) for s in range(2)])
    with torch.no_grad():
        full = model.forward_features(images())
        permuted = model.forward_features(images(), keep=keep)
    torch.testing.assert_close(permuted[:, :prefix], full[:, :prefix], rtol=1e-4, atol=1e-5)
    expected = torch.stack([full[b, prefix:][keep[b]] for b in range(2)])
    torch.testing.assert_close(permuted[:, prefix:], expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_dropped_patch_changes_nothing_and_a_kept_one_does(variant: str) -> None:
    model = tiny(**VARIANTS[variant])
    keep = torch.tensor([[0, 5, 10, 15], [3, 2, 0, 12]])
    x = images()
    changed = x.clone()
    changed[:, :, 0:4, 4:8] += 3.0  # patch 1 (row 0, column 1): kept by neither image
    with torch.no_grad():
        out = model.forward_features(x, keep=keep)
        assert out.shape == (2, model.num_prefix_tokens + 4, 32)
        torch.testing.assert_close(model.forward_features(changed, keep=keep), out, rtol=0, atol=0)
        changed[:, :, 0:4, 0:4] += 3.0  # patch 0: kept by both
        assert not torch.allclose(model.forward_features(changed, keep=keep), out)


def test_keep_of_every_patch_in_order_is_the_plain_forward() -> None:
    model = tiny(rope="axial", reg_tokens=1)
    keep = torch.arange(16).expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(images(), keep=keep), model.forward_features(images()))
        torch.testing.assert_close(model.forward_head(model.forward_features(images(), keep=keep)), model(images()))


def test_intermediates_of_a_subset_lie_on_the_grid_with_dropped_cells_zero() -> None:
    model = tiny()
    keep = torch.tensor([[0, 5, 10, 15], [1, 2, 3, 4]])
    with torch.no_grad():
        run = model.forward_intermediates(images(), indices=[-1], keep=keep, norm=True)
        features = model.forward_features(images(), keep=keep)
    grid = run.intermediates[0]
    assert grid.shape == (2, 32, 4, 4)
    flat = grid.flatten(2).transpose(1, 2)  # [B, 16, D], row-major cells
    for b in range(2):
        torch.testing.assert_close(flat[b, keep[b]], features[b, 1:])
        dropped = [cell for cell in range(16) if cell not in keep[b].tolist()]
        assert torch.count_nonzero(flat[b, dropped]) == 0


def test_attn_bias_reaches_every_block() -> None:
    """Patch 0 is a key no query may attend to: if one block missed the mask, the other tokens
    would see it there, and changing its pixels would change them."""
    model = tiny(depth=3)
    allowed = torch.ones(17, 17, dtype=torch.bool)
    allowed[:, 1] = False  # token 1 = patch 0 (after the class token)
    allowed[1, 1] = True  # it may still attend to itself (a row with no key gives zeros)
    x = images()
    changed = x.clone()
    changed[:, :, 0:4, 0:4] += 3.0
    with torch.no_grad():
        out, out_changed = (model.forward_features(v, attn_bias=allowed) for v in (x, changed))
        others = [0, *range(2, 17)]
        torch.testing.assert_close(out_changed[:, others], out[:, others], rtol=0, atol=0)
        plain, plain_changed = model.forward_features(x), model.forward_features(changed)
        assert not torch.allclose(plain_changed[:, others], plain[:, others])  # without the mask they do change


@pytest.mark.parametrize("bias_kind", ["bool", "float"])
def test_attn_bias_with_checkpointing_and_intermediates_equals_the_plain_path(bias_kind: str) -> None:
    model = tiny(rope="axial")
    bias = torch.randn(2, 1, 17, 17, generator=torch.Generator().manual_seed(3))
    bias = bias > -0.5 if bias_kind == "bool" else bias
    with torch.no_grad():
        expected = model.forward_features(images(), attn_bias=bias)
        by_hand, positions = model.embed(images())
        for block in model.blocks:
            by_hand = block(by_hand, attn_bias=bias, positions=positions)
        torch.testing.assert_close(expected, model.norm(by_hand))
        run = model.forward_intermediates(images(), attn_bias=bias, output_fmt="NLC")
        torch.testing.assert_close(run.features, expected)
    model.set_grad_checkpointing(True)
    checkpointed = model.forward_features(images(), attn_bias=bias)
    torch.testing.assert_close(checkpointed.detach(), expected)


@pytest.mark.parametrize(
    "keep, message",
    [
        (torch.tensor([[0.0, 1.0], [2.0, 3.0]]), "integer indices"),
        (torch.tensor([0, 1]), "integer indices"),
        (torch.zeros(3, 2, dtype=torch.long), r"\[B=2, k\]"),
        (torch.zeros(2, 17, dtype=torch.long), "17 patch tokens, but there are 16"),
    ],
)
def test_a_malformed_keep_is_refused_in_one_line(keep: torch.Tensor, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tiny().forward_features(images(), keep=keep)
