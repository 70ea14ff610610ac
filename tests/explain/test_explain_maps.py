"""Model-level maps: capture, gradients, image-resolution output, timm parity, precision."""

from __future__ import annotations

import pytest
import timm
import torch

import vitkit
from vitkit.explain import (
    attention_rollout,
    capture_attention,
    explain,
    grad_rollout,
    maps_from_capture,
    patch_maps,
    per_head_maps,
    to_image_grid,
)
from vitkit.explain.rollout import discard_smallest, fuse_heads


@pytest.fixture
def tiny_model(seed: int) -> vitkit.VisionTransformer:
    """A 3-block model on non-square 32x48 images (an 8x12 patch grid)."""
    return vitkit.create_model("vit_cifar_tiny", img_size=(32, 48), depth=3).eval()


@pytest.fixture
def images(seed: int) -> torch.Tensor:
    return torch.randn(3, 3, 32, 48)


def test_maps_have_image_resolution_on_non_square_grids(tiny_model, images) -> None:
    assert explain(tiny_model, images, "rollout").shape == (3, 32, 48)
    assert explain(tiny_model, images, "grad_rollout").shape == (3, 32, 48)
    assert explain(tiny_model, images, "heads", layer=1).shape == (3, 3, 32, 48)


def test_patch_maps_are_laid_out_row_major_on_the_grid() -> None:
    maps = torch.zeros(1, 6)
    maps[0, 4] = 1.0  # row 1, column 1 of a 2x3 grid
    image = to_image_grid(maps, (2, 3), (4, 6))
    assert image[0, 2:, 2:4].min() > 0.5 and image[0, :2].max() < 0.5


def test_captured_gradients_equal_retained_attention_grads(tiny_model, images) -> None:
    capture = capture_attention(tiny_model, images, target=4, with_gradients=True)
    tokens, attentions = tiny_model.embed(images)[0], []  # block by block, not through the model's forwards
    for block in tiny_model.blocks:
        tokens, attention = block(tokens, need_weights=True)
        attention.retain_grad()
        attentions.append(attention)
    logits = tiny_model.forward_head(tiny_model.norm(tokens))
    logits[:, 4].sum().backward()
    for captured, attention in zip(capture.gradients, attentions):
        torch.testing.assert_close(captured, attention.grad)


def test_capture_leaves_parameter_gradients_untouched(tiny_model, images) -> None:
    explain(tiny_model, images, "grad_rollout")
    assert all(p.grad is None for p in tiny_model.parameters())


def test_default_target_is_the_predicted_class(tiny_model, images) -> None:
    capture = capture_attention(tiny_model, images, with_gradients=True)
    predicted = capture.logits.argmax(dim=-1)
    torch.testing.assert_close(capture.targets, predicted)
    given = explain(tiny_model, images, "grad_rollout", target=predicted)
    torch.testing.assert_close(maps_from_capture(capture, "grad_rollout"), given)
    other = explain(tiny_model, images, "grad_rollout", target=(predicted + 1) % 10)
    assert not torch.allclose(given, other)


def test_target_out_of_range_raises(tiny_model, images) -> None:
    with pytest.raises(ValueError, match="out of range"):
        explain(tiny_model, images, "grad_rollout", target=10)


def test_unknown_method_raises(tiny_model, images) -> None:
    with pytest.raises(ValueError, match="method must be one of"):
        explain(tiny_model, images, "saliency")


def test_model_batch_equals_per_image(tiny_model, images) -> None:
    # A batch and a single image may take GEMM kernels that round differently, so maps are
    # compared without discarding, and the discard step with the tie-aware check below.
    for method in ("rollout", "grad_rollout"):
        batched = explain(tiny_model, images, method)
        singles = torch.cat([explain(tiny_model, images[i : i + 1], method) for i in range(3)])
        torch.testing.assert_close(batched, singles, atol=1e-5, rtol=1e-4)
    batched = capture_attention(tiny_model, images).attentions
    singles = [capture_attention(tiny_model, images[i : i + 1]).attentions for i in range(3)]
    for layer, attention in enumerate(batched):
        alone = torch.cat([single[layer] for single in singles])
        kept_entries_agree_away_from_the_cut(fuse_heads(attention), fuse_heads(alone), discard_ratio=0.5)


@pytest.mark.parametrize("precision", ["bf16_weights", "bf16_autocast"])
def test_bfloat16_models_give_float32_maps_close_to_float32(tiny_model, images, precision: str) -> None:
    reference = explain(tiny_model, images, "rollout")
    if precision == "bf16_weights":
        maps = explain(tiny_model.to(torch.bfloat16), images, "rollout")
        grads = explain(tiny_model, images, "grad_rollout")
    else:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            maps = explain(tiny_model, images, "rollout")
            grads = explain(tiny_model, images, "grad_rollout")
    assert maps.dtype == grads.dtype == torch.float32
    assert not grads.isnan().any()
    torch.testing.assert_close(maps, reference, atol=0.05, rtol=0)


def timm_attention_and_grads(model: torch.nn.Module, images: torch.Tensor, target: int):
    """timm's own attention weights (unfused path, captured at ``attn_drop``) and their grads."""
    captured: list[torch.Tensor] = []
    hooks = []
    for block in model.blocks:
        block.attn.fused_attn = False
        hooks.append(block.attn.attn_drop.register_forward_hook(lambda mod, inp, out: captured.append(out)))
    logits = model(images)
    for weights in captured:
        weights.retain_grad()
    logits[:, target].sum().backward()
    for hook in hooks:
        hook.remove()
    return [w.detach() for w in captured], [w.grad for w in captured]


def kept_entries_agree_away_from_the_cut(ours: torch.Tensor, theirs: torch.Tensor, discard_ratio: float) -> None:
    """Tie-aware check of :func:`discard_smallest` on two near-equal ``[B, N, N]`` inputs.

    Entries whose values in either input lie within float error of that input's cut (the
    ``k``-th smallest value) may fall on either side of it; every other entry must be kept by
    both or dropped by both. Kernels of different CPUs round differently, so near-tied entries
    are exactly where an exact comparison of thresholded maps would depend on the CPU.
    """
    batch, n, _ = ours.shape
    k = int(n * n * discard_ratio)
    near = torch.zeros(batch, n * n, dtype=torch.bool)
    kept = []
    for fused in (ours, theirs):
        flat = fused.reshape(batch, n * n)
        cut = flat.sort(dim=-1).values[:, k - 1 : k]
        near |= (flat - cut).abs() <= 1e-6 * cut.abs().clamp_min(1e-6) + 1e-7
        kept.append(discard_smallest(fused, discard_ratio, keep_cls_self=True).reshape(batch, n * n) != 0)
    disagree = kept[0] ^ kept[1]
    assert not (disagree & ~near).any(), "entries away from the cut were kept by one input only"
    assert near.float().mean() < 0.01, "the tolerance band around the cut holds too many entries to test anything"


def test_maps_from_timm_converted_model_equal_maps_from_timm_attention(seed: int) -> None:
    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10).eval()
    model = vitkit.from_timm(reference).eval()
    images = torch.randn(2, 3, 224, 224)
    attentions, gradients = timm_attention_and_grads(reference, images, target=3)
    capture = capture_attention(model, images, target=3, with_gradients=True)
    for ours, theirs in zip(capture.attentions, attentions):
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-4)
    grid = (14, 14)
    # Without discarding, the maps are continuous in the weights: a tight tolerance holds on every CPU.
    expected_rollout = to_image_grid(attention_rollout(attentions, discard_ratio=0.0), grid, (224, 224))
    expected_grad = to_image_grid(grad_rollout(attentions, gradients), grid, (224, 224))
    ours = maps_from_capture(capture, "rollout", discard_ratio=0.0)
    torch.testing.assert_close(ours, expected_rollout, atol=1e-4, rtol=1e-3)
    torch.testing.assert_close(maps_from_capture(capture, "grad_rollout"), expected_grad, atol=1e-4, rtol=1e-3)
    # With discarding, which near-tied entries fall below the cut depends on the last bit.
    for ours_layer, theirs_layer in zip(capture.attentions, attentions):
        kept_entries_agree_away_from_the_cut(fuse_heads(ours_layer), fuse_heads(theirs_layer), discard_ratio=0.9)


def test_tie_aware_check_catches_a_wrong_cut() -> None:
    """The check above must fail when the kept sets differ away from the cut."""
    fused = torch.rand(1, 10, 10, generator=torch.Generator().manual_seed(0))
    shifted = fused.clone()
    shifted.view(-1)[fused.view(-1).argmax()] = -1.0  # the largest entry becomes the smallest
    with pytest.raises(AssertionError, match="away from the cut"):
        kept_entries_agree_away_from_the_cut(fused, shifted, discard_ratio=0.5)


def test_a_near_uniform_map_is_labelled_flat_and_a_peaked_one_is_not() -> None:
    from vitkit.explain.render import flat_note

    flat = torch.full((4, 4), 0.5)
    flat[0, 0] = 0.52  # scaled to its own maximum this would paint the whole image hot
    assert flat_note(flat) == " (flat: min 0.96 of max)"
    peaked = torch.zeros(4, 4)
    peaked[1, 2] = 1.0
    assert flat_note(peaked) == "" and flat_note(torch.zeros(4, 4)) == " (flat: min 1.00 of max)"


def test_the_defaults_are_rollout_with_mean_fusion_nothing_discarded_and_the_last_blocks_heads(tiny_model,
                                                                                               images) -> None:
    """What the signatures promise, each against the rollout functions called with every option."""
    capture = capture_attention(tiny_model, images)
    rollout = attention_rollout(capture.attentions, "mean", 0.0, 1, "token")
    image = to_image_grid(rollout, (8, 12), (32, 48))
    torch.testing.assert_close(patch_maps(capture), rollout)
    torch.testing.assert_close(maps_from_capture(capture), image)
    torch.testing.assert_close(explain(tiny_model, images), image)
    heads = per_head_maps(capture.attentions, 2, 1, "token")  # block 2 of 3: the last
    torch.testing.assert_close(patch_maps(capture, "heads"), heads)
    torch.testing.assert_close(maps_from_capture(capture, "heads"), to_image_grid(heads, (8, 12), (32, 48)))
    torch.testing.assert_close(explain(tiny_model, images, "heads"), to_image_grid(heads, (8, 12), (32, 48)))


@pytest.mark.parametrize("option", [{"head_fusion": "max"}, {"discard_ratio": 0.5}, {"pooling": "avg"}, {"layer": 0}])
def test_each_option_of_explain_reaches_its_maps(tiny_model, images, option: dict) -> None:
    """Each option changes the maps, to what the rollout functions give with it."""
    capture = capture_attention(tiny_model, images)
    if "layer" in option:
        method, expected = "heads", per_head_maps(capture.attentions, 0, 1, "token")
        default = per_head_maps(capture.attentions, -1, 1, "token")
    else:
        rollout = {"head_fusion": "mean", "discard_ratio": 0.0, "pooling": "token", **option}
        method, expected = "rollout", attention_rollout(capture.attentions, rollout["head_fusion"],
                                                        rollout["discard_ratio"], 1, rollout["pooling"])
        default = attention_rollout(capture.attentions, "mean", 0.0, 1, "token")
    assert not torch.allclose(expected, default)
    torch.testing.assert_close(patch_maps(capture, method, **option), expected)
    image = to_image_grid(expected, (8, 12), (32, 48))
    torch.testing.assert_close(maps_from_capture(capture, method, **option), image)
    torch.testing.assert_close(explain(tiny_model, images, method, **option), image)
