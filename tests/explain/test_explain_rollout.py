"""Attention rollout, gradient rollout and per-head maps on hand-built attention stacks."""

from __future__ import annotations

import pytest
import torch

from vitkit.explain import attention_rollout, grad_rollout, per_head_maps
from vitkit.explain.rollout import discard_smallest


def random_attention(batch: int, heads: int, tokens: int, generator: torch.Generator) -> torch.Tensor:
    """Row-stochastic ``[B, H, N, N]`` weights with well-separated (tie-free) entries."""
    return torch.randn(batch, heads, tokens, tokens, generator=generator).mul(2).softmax(dim=-1)


def reference_rollout(layers: list[torch.Tensor]) -> torch.Tensor:
    """Abnar & Zuidema for one image: fused ``[N, N]`` per layer -> ``[N - 1]`` map, written out."""
    joint = torch.eye(layers[0].shape[0], dtype=torch.float64)
    for fused in layers:
        mixed = (fused.double() + torch.eye(fused.shape[0], dtype=torch.float64)) / 2
        mixed = mixed / mixed.sum(dim=1, keepdim=True)
        joint = mixed @ joint
    patches = joint[0, 1:]
    return (patches / patches.max()).float()


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def test_uniform_attention_gives_uniform_map() -> None:
    uniform = torch.full((2, 3, 5, 5), 1 / 5)
    maps = attention_rollout([uniform] * 4)
    assert maps.shape == (2, 4)
    torch.testing.assert_close(maps, torch.ones(2, 4))


def test_identity_attention_gives_uniform_zero_map_without_nan() -> None:
    identity = torch.eye(5).expand(2, 3, 5, 5)
    maps = attention_rollout([identity] * 3)
    assert not maps.isnan().any()
    torch.testing.assert_close(maps, torch.zeros(2, 4))


def test_attention_concentrated_on_one_patch_picks_that_patch() -> None:
    tokens, patch = 6, 3
    focused = torch.zeros(1, 2, tokens, tokens)
    focused[..., 1 + patch] = 1.0
    maps = attention_rollout([focused] * 3)
    torch.testing.assert_close(maps[0], torch.nn.functional.one_hot(torch.tensor(patch), tokens - 1).float())


def test_rollout_matches_reference_and_multiplies_layers_first_to_last(generator: torch.Generator) -> None:
    attentions = [random_attention(1, 2, 4, generator) for _ in range(3)]
    fused = [a[0].mean(dim=0) for a in attentions]
    maps = attention_rollout(attentions)
    torch.testing.assert_close(maps[0], reference_rollout(fused))
    reversed_order = reference_rollout(fused[::-1])
    assert not torch.allclose(maps[0], reversed_order, atol=1e-3), "test stack too symmetric to check the order"


@pytest.mark.parametrize(
    "fusion, reduce",
    [("mean", lambda a: a.mean(dim=0)), ("max", lambda a: a.amax(dim=0)), ("min", lambda a: a.amin(dim=0))],
)
def test_each_head_fusion_reduces_over_heads(fusion: str, reduce, generator: torch.Generator) -> None:
    attentions = [random_attention(1, 3, 5, generator) for _ in range(2)]
    maps = attention_rollout(attentions, head_fusion=fusion)
    torch.testing.assert_close(maps[0], reference_rollout([reduce(a[0]) for a in attentions]))


def test_head_fusions_give_different_maps(generator: torch.Generator) -> None:
    attentions = [random_attention(1, 3, 5, generator) for _ in range(2)]
    mean, high, low = (attention_rollout(attentions, head_fusion=f) for f in ("mean", "max", "min"))
    assert not torch.allclose(mean, high) and not torch.allclose(mean, low)


def test_unknown_head_fusion_raises_clear_error() -> None:
    with pytest.raises(ValueError, match="head_fusion must be one of .*'median'"):
        attention_rollout([torch.full((1, 1, 3, 3), 1 / 3)], head_fusion="median")


def test_discard_zeroes_the_k_smallest_entries() -> None:
    fused = torch.arange(1.0, 17.0).reshape(1, 4, 4)  # [0, 0] = 1 is the smallest
    out = discard_smallest(fused, 0.25, keep_cls_self=False)  # k = 4
    expected = fused.clone().reshape(-1)
    expected[:4] = 0
    torch.testing.assert_close(out, expected.reshape(1, 4, 4))


def test_discard_keeps_class_token_self_attention_and_zeroes_only_k_minus_one() -> None:
    fused = torch.arange(1.0, 17.0).reshape(1, 4, 4)
    out = discard_smallest(fused, 0.25, keep_cls_self=True)
    expected = fused.clone().reshape(-1)
    expected[1:4] = 0
    torch.testing.assert_close(out, expected.reshape(1, 4, 4))
    assert (out == 0).sum() == 3


def test_discard_when_class_token_entry_is_not_among_the_smallest_zeroes_k() -> None:
    fused = torch.arange(16.0, 0.0, -1.0).reshape(1, 4, 4)  # [0, 0] is the largest
    out = discard_smallest(fused, 0.25, keep_cls_self=True)
    assert (out == 0).sum() == 4 and out[0, 0, 0] == 16


def test_rollout_with_discard_matches_reference(generator: torch.Generator) -> None:
    attentions = [random_attention(1, 2, 5, generator) for _ in range(2)]
    fused = []
    for attention in attentions:
        matrix = attention[0].mean(dim=0).clone()
        flat = matrix.reshape(-1)
        smallest = flat.argsort()[: int(25 * 0.4)]
        keep = flat[0].clone()
        flat[smallest] = 0
        flat[0] = keep
        fused.append(matrix)
    torch.testing.assert_close(attention_rollout(attentions, discard_ratio=0.4)[0], reference_rollout(fused))


def test_discard_ratio_out_of_range_raises() -> None:
    with pytest.raises(ValueError, match="discard_ratio"):
        attention_rollout([torch.full((1, 1, 3, 3), 1 / 3)], discard_ratio=1.0)


@pytest.mark.parametrize("discard_ratio", [0.0, 0.5])
def test_batch_results_equal_per_image_results(discard_ratio: float, generator: torch.Generator) -> None:
    attentions = [random_attention(3, 2, 7, generator) for _ in range(3)]
    gradients = [torch.randn(a.shape, generator=generator) for a in attentions]
    batched = attention_rollout(attentions, discard_ratio=discard_ratio)
    batched_grad = grad_rollout(attentions, gradients, discard_ratio=discard_ratio)
    for i in range(3):
        single = [a[i : i + 1] for a in attentions]
        single_grad = [g[i : i + 1] for g in gradients]
        torch.testing.assert_close(batched[i : i + 1], attention_rollout(single, discard_ratio=discard_ratio))
        expected = grad_rollout(single, single_grad, discard_ratio=discard_ratio)
        torch.testing.assert_close(batched_grad[i : i + 1], expected)


def test_grad_rollout_pairs_each_gradient_with_its_own_block(generator: torch.Generator) -> None:
    attentions = [random_attention(1, 2, 5, generator) for _ in range(3)]
    gradient = torch.rand(1, 2, 5, 5, generator=generator)
    for layer in range(3):
        gradients = [gradient if index == layer else torch.zeros_like(gradient) for index in range(3)]
        # Zero gradients make the other layers the identity, so only block `layer` counts.
        expected = grad_rollout([attentions[layer]], [gradient])
        torch.testing.assert_close(grad_rollout(attentions, gradients), expected)
    first = grad_rollout(attentions, [gradient, torch.zeros_like(gradient), torch.zeros_like(gradient)])
    last = grad_rollout(attentions, [torch.zeros_like(gradient), torch.zeros_like(gradient), gradient])
    assert not torch.allclose(first, last)


def test_grad_rollout_matches_reference_with_negatives_clipped(generator: torch.Generator) -> None:
    attentions = [random_attention(1, 2, 5, generator) for _ in range(2)]
    gradients = [torch.randn(a.shape, generator=generator) for a in attentions]
    fused = [(a[0] * g[0]).mean(dim=0).clamp_min(0) for a, g in zip(attentions, gradients)]
    torch.testing.assert_close(grad_rollout(attentions, gradients)[0], reference_rollout(fused))


def test_grad_rollout_with_only_negative_evidence_gives_zero_map_without_nan() -> None:
    attention = torch.full((1, 2, 4, 4), 0.25)
    maps = grad_rollout([attention], [-torch.ones_like(attention)])
    assert not maps.isnan().any()
    torch.testing.assert_close(maps, torch.zeros(1, 3))


def test_grad_rollout_rejects_mismatched_gradients() -> None:
    attention = torch.full((1, 2, 4, 4), 0.25)
    with pytest.raises(ValueError, match="one gradient per attention"):
        grad_rollout([attention, attention], [attention])
    with pytest.raises(ValueError, match=r"gradients\[0\] has shape"):
        grad_rollout([attention], [torch.zeros(1, 3, 4, 4)])


def test_inputs_are_not_modified(generator: torch.Generator) -> None:
    attentions = [random_attention(2, 2, 5, generator) for _ in range(2)]
    gradients = [torch.randn(a.shape, generator=generator) for a in attentions]
    before = [t.clone() for t in attentions + gradients]
    attention_rollout(attentions, head_fusion="max", discard_ratio=0.5)
    grad_rollout(attentions, gradients, discard_ratio=0.5)
    per_head_maps(attentions, layer=0)
    for original, now in zip(before, attentions + gradients):
        assert torch.equal(original, now)


def test_bfloat16_attention_is_rolled_out_in_float32(generator: torch.Generator) -> None:
    attentions = [random_attention(2, 2, 9, generator) for _ in range(4)]
    reduced = [a.bfloat16() for a in attentions]
    maps = attention_rollout(reduced)
    assert maps.dtype == torch.float32
    torch.testing.assert_close(maps, attention_rollout([a.float() for a in reduced]))
    torch.testing.assert_close(maps, attention_rollout(attentions), atol=2e-2, rtol=0)


def test_per_head_maps_are_each_heads_class_token_row(generator: torch.Generator) -> None:
    attentions = [random_attention(2, 3, 5, generator) for _ in range(2)]
    maps = per_head_maps(attentions, layer=-1)
    assert maps.shape == (2, 3, 4)
    torch.testing.assert_close(maps, attentions[1][:, :, 0, 1:])
    with pytest.raises(ValueError, match="out of range"):
        per_head_maps(attentions, layer=2)


def test_without_class_token_the_map_averages_all_query_rows() -> None:
    focused = torch.zeros(1, 1, 4, 4)
    focused[..., 2] = 1.0
    maps = attention_rollout([focused], num_prefix_tokens=0)
    assert maps.shape == (1, 4) and maps[0].argmax() == 2
