"""Position-embedding options of a VisionTransformer: ``pos_embed`` none, ``rope`` axial / mixed
(with ``rope_theta``), their combination, any image size, recipes, pruning, files and explaining."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import vitkit
from vitkit import VisionTransformer, ViTConfig, create_model, load_model, save_model
from vitkit.explain import explain
from vitkit.layers import patch_coords
from vitkit.train.config import load_recipe
from vitkit.train.optim import param_groups

TOL = dict(rtol=1e-5, atol=1e-5)
TINY: dict[str, Any] = dict(img_size=16, patch_size=4, num_classes=5, embed_dim=32, depth=2, num_heads=4, mlp_ratio=2.0)


def tiny(**overrides: Any) -> VisionTransformer:
    return VisionTransformer(ViTConfig(**{**TINY, **overrides})).eval()


def shuffle_patches(images: torch.Tensor, patch: int, order: torch.Tensor) -> torch.Tensor:
    """``images`` with their ``patch x patch`` tiles rearranged in ``order`` (row-major)."""
    b, c, h, w = images.shape
    tiles = images.unfold(2, patch, patch).unfold(3, patch, patch).reshape(b, c, -1, patch, patch)
    tiles = tiles[:, :, order].reshape(b, c, h // patch, w // patch, patch, patch)
    return tiles.permute(0, 1, 2, 4, 3, 5).reshape(b, c, h, w)


def test_the_issue_model_trains_runs_at_two_sizes_and_explains_over_the_patch_grid() -> None:
    """The issue's ``create_model("vit_small_patch16_224", rope="mixed", pos_embed="none",
    dynamic_img_size=True)``, narrowed and shortened to run in a test."""
    torch.manual_seed(0)
    model = create_model(
        "vit_small_patch16_224", rope="mixed", pos_embed="none", dynamic_img_size=True,
        embed_dim=32, depth=2, num_heads=2, num_classes=3, img_size=32,
    )
    assert model.pos_embed is None and "pos_embed" not in model.state_dict()
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 0])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = [block.attn.rope.freqs.detach().clone() for block in model.blocks]
    losses = []
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]
    assert all(not torch.equal(b, block.attn.rope.freqs) for b, block in zip(before, model.blocks))

    model.eval()
    assert model(torch.randn(2, 3, 32, 32)).shape == model(torch.randn(2, 3, 48, 48)).shape == (2, 3)
    for size, grid in ((32, 2), (48, 3)):
        maps = explain(model, torch.randn(1, 3, size, size), "rollout")
        assert maps.shape[-2:] == (size, size)
        assert explain(model, torch.randn(1, 3, size, size), "heads").shape[-2:] == (size, size)
        tokens = model.forward_intermediates(torch.randn(1, 3, size, size), output_fmt="NCHW")
        assert tokens.intermediates[0].shape[-2:] == (grid, grid)


def test_without_any_position_embedding_the_class_token_ignores_where_patches_are() -> None:
    images, order = torch.randn(2, 3, 16, 16), torch.randperm(16, generator=torch.Generator().manual_seed(0))
    shuffled = shuffle_patches(images, 4, order)
    bare = tiny(pos_embed="none")
    torch.testing.assert_close(bare(shuffled), bare(images), **TOL)  # permutation-invariant: no positions
    for rope in ("axial", "mixed"):
        positional = tiny(pos_embed="none", rope=rope)
        assert (positional(shuffled) - positional(images)).abs().max() > 1e-4, rope


def test_shuffle_helper_moves_tiles_as_it_says() -> None:
    images = torch.arange(16.0).view(4, 4).repeat_interleave(4, 0).repeat_interleave(4, 1)[None, None]
    order = torch.tensor([15] + list(range(15)))
    assert shuffle_patches(images, 4, order)[0, 0, 0, 0] == 15 and shuffle_patches(images, 4, order)[0, 0, 0, 4] == 0


@pytest.mark.parametrize("rope", ["axial", "mixed"])
def test_every_block_rotates_with_the_configured_form_and_base(rope: str) -> None:
    axes = "ij" if rope == "axial" else "xy"  # mixed RoPE refuses rope_axes (test_options_that_do_nothing_...)
    model = tiny(rope=rope, rope_theta=33.0, rope_axes=axes)
    for block in model.blocks:
        assert (block.attn.rope.kind, block.attn.rope.theta, block.attn.rope.axes) == (rope, 33.0, axes)
    default = tiny(rope=rope)
    assert {block.attn.rope.theta for block in default.blocks} == {100.0 if rope == "axial" else 10.0}
    assert all(block.attn.rope is None for block in tiny().blocks)


def test_mixed_frequencies_are_drawn_per_layer_and_not_weight_decayed() -> None:
    model = tiny(rope="mixed")
    first, second = (block.attn.rope.freqs for block in model.blocks)
    assert not torch.equal(first, second)
    names = {f"blocks.{i}.attn.rope.freqs" for i in range(2)}
    assert names <= model.no_weight_decay()
    undecayed = next(group for group in param_groups(model, 0.05) if group["weight_decay"] == 0)
    assert all(any(p is q for q in undecayed["params"]) for p in (first, second))


def test_blocks_rotate_the_patch_positions_of_the_input_grid() -> None:
    model = tiny(rope="axial", pos_embed="none", dynamic_img_size=True, img_size=(16, 24))
    seen = []
    model.blocks[0].attn.register_forward_hook(lambda m, args, kwargs, out: seen.append(kwargs["positions"].xy[0]),
                                               with_kwargs=True)
    model(torch.randn(1, 3, 16, 24))
    model(torch.randn(1, 3, 8, 12))
    torch.testing.assert_close(seen[0], patch_coords((4, 6)))
    torch.testing.assert_close(seen[1], patch_coords((2, 3)))


def test_rope_combines_with_a_learned_absolute_embedding() -> None:
    both = tiny(rope="mixed", pos_embed="learn")
    # Heo et al.'s +APE: the absolute embedding is on the 16 patches only, no class-token row
    assert both.pos_embed.shape == (1, 16, 32) and both.blocks[0].attn.rope.freqs.shape == (2, 4, 4)
    with torch.no_grad():
        both.pos_embed.normal_()
    without = tiny(rope="mixed", pos_embed="none")
    without.load_state_dict({k: v for k, v in both.state_dict().items() if k != "pos_embed"})
    x = torch.randn(1, 3, 16, 16)
    assert (both(x) - without(x)).abs().max() > 1e-4  # the absolute embedding is added, not dropped


def test_other_sizes_still_need_dynamic_img_size_without_an_absolute_embedding() -> None:
    with pytest.raises(ValueError, match="dynamic_img_size=True"):
        tiny(rope="axial", pos_embed="none")(torch.randn(1, 3, 24, 24))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(rope="axial", embed_dim=24, num_heads=4), "rope needs head_dim divisible by 4"),
        (dict(rope="spiral"), "rope must be"),
        (dict(rope="axial", rope_theta=0), "rope_theta is out of range"),
        (dict(pos_embed="rope"), "pos_embed must be"),
        (dict(rope_axes="yx"), "rope_axes must be"),
    ],
)
def test_bad_rope_settings_name_the_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ViTConfig(**{**TINY, **overrides})


def test_recipes_and_create_model_take_the_options(tmp_path: Path) -> None:
    recipe = load_recipe("recipes/quickstart.yaml", ["model.rope=mixed", "model.pos_embed=none", "model.rope_theta=20"])
    config = recipe.vit_config()
    assert (config.rope, config.pos_embed, config.rope_theta) == ("mixed", "none", 20.0)
    assert create_model("vit_tiny_patch16_224", rope="axial", depth=1).blocks[0].attn.rope.kind == "axial"


def test_model_file_round_trip_keeps_rope_and_its_frequencies(tmp_path: Path) -> None:
    model = tiny(rope="mixed", pos_embed="none")
    path = save_model(model, tmp_path / "rope.safetensors")
    loaded = load_model(path).eval()
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded(x), model(x), **TOL)
    assert loaded.config.rope == "mixed"


def test_pruning_a_mixed_rope_model_equals_gating_its_heads() -> None:
    model = tiny(rope="mixed", attn_impl="explicit")
    x = torch.randn(2, 3, 16, 16)
    gates = torch.ones(2, 4)
    gates[0, 1] = gates[1, 3] = 0.0
    gated = model(x, head_gates=gates)
    vitkit.prune.prune_heads(model, {0: [1], 1: [3]})
    torch.testing.assert_close(model(x), gated, **TOL)


def test_grad_checkpointing_with_rope_gives_the_same_gradients() -> None:
    model = tiny(rope="mixed").train()
    x = torch.randn(2, 3, 16, 16)
    model(x).sum().backward()
    expected = model.blocks[0].attn.rope.freqs.grad.clone()
    model.zero_grad()
    model.set_grad_checkpointing()
    model(x).sum().backward()
    torch.testing.assert_close(model.blocks[0].attn.rope.freqs.grad, expected, **TOL)


def test_meta_build_then_reset_parameters_draws_the_mixed_frequencies() -> None:
    config = ViTConfig(**TINY, rope="mixed", pos_embed="none")
    with torch.device("meta"):
        model = VisionTransformer(config)
    model.to_empty(device="cpu")
    torch.manual_seed(0)
    model.reset_parameters()
    reference = VisionTransformer(config)
    torch.manual_seed(0)
    reference.reset_parameters()
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, reference.state_dict()[name]), name
