"""Head diagnostics: entropy, diagonal share, class-token share, head similarity, warnings."""

from __future__ import annotations

import math

import pytest
import torch

import vitkit
from vitkit.explain import HeadThresholds, attention_statistics, head_warnings, model_head_stats

TOKENS = 5


def focused_on(column: int, heads: int = 1) -> torch.Tensor:
    """``[1, heads, N, N]`` attention where every query attends only to token ``column``."""
    attention = torch.zeros(1, heads, TOKENS, TOKENS)
    attention[..., column] = 1.0
    return attention


def test_uniform_attention_has_full_entropy_and_flat_shares() -> None:
    stats = attention_statistics([torch.full((2, 2, TOKENS, TOKENS), 1 / TOKENS)])
    torch.testing.assert_close(stats.entropy, torch.ones(1, 2))
    torch.testing.assert_close(stats.diagonal, torch.full((1, 2), 1 / TOKENS))
    torch.testing.assert_close(stats.cls_share, torch.full((1, 2), 1 / TOKENS))
    assert any("near-uniform" in w and "layer 0 heads [0, 1]" in w for w in head_warnings(stats))


def test_identity_attention_is_flagged_as_bright_diagonal() -> None:
    stats = attention_statistics([torch.eye(TOKENS).expand(1, 1, TOKENS, TOKENS)])
    torch.testing.assert_close(stats.entropy, torch.zeros(1, 1))
    torch.testing.assert_close(stats.diagonal, torch.ones(1, 1))
    warnings = head_warnings(stats)
    assert len(warnings) == 1 and "attend mostly to themselves" in warnings[0] and "layer 0 heads [0]" in warnings[0]


def test_class_token_sink_names_its_layer_and_head() -> None:
    sink = torch.cat([focused_on(2), focused_on(0)], dim=1)  # head 1 sends everything to the class token
    stats = attention_statistics([focused_on(3, heads=2), sink])
    torch.testing.assert_close(stats.cls_share, torch.tensor([[0.0, 0.0], [0.0, 1.0]]))
    sinks = [w for w in head_warnings(stats) if "class token" in w]
    assert len(sinks) == 1 and sinks[0].startswith("layer 1 heads [1]:")


def test_no_class_token_share_without_prefix_tokens() -> None:
    stats = attention_statistics([focused_on(0)], num_prefix_tokens=0)
    assert stats.cls_share.isnan().all()
    assert not any("class token" in w for w in head_warnings(stats))


def test_identical_heads_are_reported_as_collapsed_and_distinct_heads_are_not() -> None:
    generator = torch.Generator().manual_seed(0)
    pattern = torch.randn(2, 1, TOKENS, TOKENS, generator=generator).mul(4).softmax(-1)
    other = torch.randn(2, 1, TOKENS, TOKENS, generator=generator).mul(4).softmax(-1)
    stats = attention_statistics([torch.cat([pattern, other, pattern], dim=1)])
    assert stats.similarity[0, 0, 2].item() == pytest.approx(1.0, abs=1e-5)
    assert stats.similarity[0, 0, 1] < 0.9
    _, partner = stats.most_similar()
    assert partner[0, 0] == 2 and partner[0, 2] == 0
    collapse = [w for w in head_warnings(stats) if "collapse" in w]
    assert len(collapse) == 1 and collapse[0].startswith("layer 0, heads [0, 2]:")


def test_js_similarity_of_disjoint_heads_is_zero() -> None:
    stats = attention_statistics([torch.cat([focused_on(1), focused_on(2)], dim=1)])
    assert stats.similarity[0, 0, 1].item() == pytest.approx(0.0, abs=1e-6)


def test_near_uniform_heads_are_not_double_reported_as_collapsed() -> None:
    stats = attention_statistics([torch.full((1, 3, TOKENS, TOKENS), 1 / TOKENS)])
    assert not any("collapse" in w for w in head_warnings(stats))


def test_thresholds_are_configurable() -> None:
    stats = attention_statistics([torch.full((1, 1, TOKENS, TOKENS), 1 / TOKENS)])
    assert head_warnings(stats, HeadThresholds(uniform_entropy=1.01, self_attention=0.9, cls_sink=0.9)) == []


def test_merge_is_an_image_weighted_average() -> None:
    uniform = attention_statistics([torch.full((3, 1, TOKENS, TOKENS), 1 / TOKENS)])
    identity = attention_statistics([torch.eye(TOKENS).expand(1, 1, TOKENS, TOKENS)])
    merged = uniform.merge(identity)
    assert merged.num_images == 4
    assert merged.entropy.item() == pytest.approx(0.75)


def test_layers_with_fewer_heads_are_nan_padded_and_rows_list_real_heads() -> None:
    stats = attention_statistics([torch.full((1, 3, TOKENS, TOKENS), 1 / TOKENS), focused_on(1, heads=1)])
    assert stats.heads_per_layer == [3, 1]
    assert stats.entropy[1, 1:].isnan().all()
    rows = stats.rows()
    assert [(r["layer"], r["head"]) for r in rows] == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert math.isnan(rows[-1]["max_similarity"]) and rows[-1]["most_similar_head"] == -1


def test_model_head_stats_limits_images_and_covers_every_head(seed: int) -> None:
    model = vitkit.create_model("vit_cifar_tiny", depth=2).eval()
    batches = [torch.randn(3, 3, 32, 32) for _ in range(3)]
    stats = model_head_stats(model, batches, max_images=5)
    assert stats.num_images == 5
    assert stats.entropy.shape == (2, 3) and not stats.entropy.isnan().any()
    assert ((stats.entropy > 0) & (stats.entropy <= 1)).all()
