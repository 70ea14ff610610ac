"""Token merging (ToMe) against the reference: ToMe's functions and its timm patch, written out in
``tests/helpers/tome_reference.py`` from facebookresearch/ToMe, and the invariants of merging
(protected tokens, sizes, sources, undo, save/load)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import timm
import torch
from tome_reference import (
    tome_apply_patch,
    tome_bipartite_soft_matching,
    tome_merge_source,
    tome_merge_wavg,
    tome_parse_r,
)
from torch.utils.flop_counter import FlopCounterMode

import vitkit
from vitkit import VisionTransformer, ViTConfig
from vitkit.layers.positions import TokenPositions
from vitkit.layers.token_merging import MergeState, bipartite_soft_matching, merge_schedule
from vitkit.models import vit_flops
from vitkit.prune import prune_heads
from vitkit.schema import ConfigError
from vitkit.timing import OpClock

# ------------------------------------------------------------------------------- the functions

PROTECTED = {"none": (0, False, False), "class": (1, True, False), "class_and_distillation": (2, True, True)}


@pytest.mark.parametrize("protected", PROTECTED)
@pytest.mark.parametrize("tokens", [197, 198, 65])
def test_matching_merges_sizes_and_sources_equal_tomes(protected: str, tokens: int) -> None:
    count, class_token, distill_token = PROTECTED[protected]
    generator = torch.Generator().manual_seed(tokens)
    x = torch.randn(3, tokens, 24, generator=generator)
    positions = TokenPositions(torch.zeros(1, tokens - count, 2), count)
    state = MergeState(positions, count, trace_source=True)
    size = source = None
    for r in (16, 9, 40, 200):  # the last is clamped to half the mergeable tokens, as ToMe does
        metric = torch.randn(3, x.shape[1], 8, generator=generator)
        reference, _ = tome_bipartite_soft_matching(metric, r, class_token, distill_token)
        ours = bipartite_soft_matching(metric, r, count)
        for mode in ("sum", "mean", "amax"):
            assert torch.equal(ours(x, mode), reference(x, mode))
        source = tome_merge_source(reference, x, source)
        expected, size = tome_merge_wavg(reference, x, size)
        x, state = state.merged(x, metric, r)
        assert torch.equal(x, expected)
        assert torch.equal(state.size, size)
        assert torch.equal(state.source, source)


def test_schedules_are_tomes() -> None:
    assert merge_schedule(8, 12) == tome_parse_r(12, 8)
    assert merge_schedule(8, 12, "decreasing") == tome_parse_r(12, (8, -1.0))
    assert merge_schedule([1, 2, 3], 3) == [1, 2, 3]


def test_a_merged_tokens_position_is_the_size_weighted_centroid_of_its_parts() -> None:
    """Token 0 (1 patch at (0, 0)) merges into token 3 (3 patches around (2, 2)): RoPE rotates the
    merged token by (1 * (0, 0) + 3 * (2, 2)) / 4 = (1.5, 1.5), the centroid of its 4 patches."""
    metric = torch.tensor([[[1.0, 0, 0], [0, 1, 0], [0, 0, 1], [1, 0, 0]]])  # A = tokens 0, 2; B = 1, 3
    xy = torch.tensor([[[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]])
    state = MergeState(TokenPositions(xy), 0, size=torch.tensor([[[1.0], [1.0], [1.0], [3.0]]]))
    _, merged = state.merged(torch.randn(1, 4, 8), metric, 1)
    # ToMe's order: the unmerged A token (2), then the B tokens (1, and 3 holding 0)
    assert merged.size.flatten().tolist() == [1.0, 1.0, 4.0]
    assert merged.positions.xy.tolist() == [[[0.0, 1.0], [1.0, 0.0], [1.5, 1.5]]]


def test_the_proportional_bias_is_log_size_per_key_built_once_per_merge() -> None:
    """The bias is ``log(size)`` of each key, ``[B, 1, 1, N]``; merging in the first block only, the
    three blocks after it attend with that one merge's bias: one ``log``, not one per block."""
    state = MergeState(None, 0, size=torch.tensor([[[1.0], [3.0], [2.0]]]))
    bias = state.attn_bias()
    assert torch.equal(bias, torch.tensor([1.0, 3.0, 2.0]).log().view(1, 1, 1, 3))
    assert state.attn_bias() is bias
    model = vitkit.merge_tokens(tiny(), [10, 0, 0, 0])
    timer = OpClock()
    with torch.no_grad(), timer:
        model(images())
    assert timer.calls["aten.log"] == 1


@pytest.mark.parametrize("batch", [1, 2])
def test_a_single_images_merge_computes_no_row_offsets(batch: int) -> None:
    """At batch 1 the A and B tokens are views of the input rows: matching and merging run no
    ``arange`` and no index arithmetic; a batch of two offsets each image's rows (one ``arange``)."""
    metric, x = torch.randn(batch, 17, 8), torch.randn(batch, 17, 6)
    timer = OpClock()
    with timer:
        bipartite_soft_matching(metric, 4, 1)(x, "sum")
    assert timer.calls["aten.arange"] == batch - 1
    assert timer.calls["aten.add"] == 3 * (batch - 1)


# ----------------------------------------------------------------------- the model, against timm

TIMM_MODELS = {
    "vit_small_patch16_224": ({}, 13),
    "test_vit": ({}, 8),
    "deit_tiny_distilled_patch16_224": ({"depth": 3}, 20),
    "vit_tiny_patch16_224.avg": ({"depth": 3, "global_pool": "avg", "class_token": False, "fc_norm": False}, 24),
}


@pytest.mark.parametrize("name", TIMM_MODELS)
def test_timm_import_with_tome_matches_tome_on_the_timm_model(name: str) -> None:
    kwargs, r = TIMM_MODELS[name]
    source = timm.create_model(name.split(".")[0], pretrained=False, **kwargs).eval()
    with torch.no_grad():  # prefix tokens and positions away from their near-zero init
        for token in ("cls_token", "dist_token", "pos_embed"):
            if getattr(source, token, None) is not None:
                getattr(source, token).normal_(0, 0.5)
    model = vitkit.merge_tokens(vitkit.from_timm(source).eval(), r)
    size = source.patch_embed.img_size
    images = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = source(images)
        reference = tome_apply_patch(source, r)(images)
        ours = model(images)
    assert (plain - reference).abs().max() > 1e-3  # merging changed the logits
    torch.testing.assert_close(ours, reference, rtol=0, atol=1e-4)
    with torch.no_grad():
        traced = model.forward_intermediates(images, indices=1, return_attention=True)
    assert traced.sources[0].shape[1] == traced.attentions[0].shape[-1]


def test_decreasing_schedule_matches_tome() -> None:
    source = timm.create_model("test_vit", pretrained=False).eval()
    model = vitkit.merge_tokens(vitkit.from_timm(source).eval(), 8, "decreasing")
    images = torch.randn(2, 3, 160, 160)
    with torch.no_grad():
        torch.testing.assert_close(model(images), tome_apply_patch(source, (8, -1.0))(images), rtol=0, atol=1e-4)


def test_prop_attn_off_matches_tomes_prop_attn_false_and_changes_the_logits() -> None:
    """ToMe's ``apply_patch(model, prop_attn=False)``: no ``log(size)`` bias in the attention, the
    merged tokens still size-weighted averages."""
    source = timm.create_model("test_vit", pretrained=False).eval()
    with torch.no_grad():
        source.pos_embed.normal_(0, 0.5)
    images = torch.randn(2, 3, 160, 160, generator=torch.Generator().manual_seed(1))
    model = vitkit.merge_tokens(vitkit.from_timm(source).eval(), 8, prop_attn=False)
    assert model.config.merge_prop_attn is False
    with torch.no_grad():
        reference_off = tome_apply_patch(copy.deepcopy(source), 8, prop_attn=False)(images)
        reference_on = tome_apply_patch(copy.deepcopy(source), 8)(images)
        ours = model(images)
    assert (reference_on - reference_off).abs().max() > 1e-3  # the bias matters on these weights
    torch.testing.assert_close(ours, reference_off, rtol=0, atol=1e-4)


def test_prop_attn_is_recorded_kept_by_a_new_r_and_switched_back_on(tmp_path) -> None:
    model = vitkit.merge_tokens(tiny(), 4, prop_attn=False)
    with torch.no_grad():
        off = model(images())
    loaded = vitkit.load_model(vitkit.save_model(model, tmp_path / "merged")).eval()
    assert loaded.config.merge_prop_attn is False
    vitkit.merge_tokens(loaded, [4, 4, 4, 4])  # a new r keeps the model's prop_attn
    with torch.no_grad():
        torch.testing.assert_close(loaded(images()), off)
        on = vitkit.merge_tokens(loaded, 4, prop_attn=True)(images())
    assert (on - off).abs().max() > 1e-4


# ----------------------------------------------------------------------------------- invariants

TINY: dict[str, Any] = dict(img_size=32, patch_size=4, num_classes=5, embed_dim=32, depth=4, num_heads=4, mlp_ratio=2.0)
VARIANTS = {
    "class": {},
    "registers": {"reg_tokens": 3},
    "distilled": {"distilled": True},
    "avg_no_class": {"class_token": False, "global_pool": "avg"},
    "rope_registers": {"rope": "axial", "reg_tokens": 2},
}


def tiny(**overrides: Any) -> VisionTransformer:
    model = VisionTransformer(ViTConfig(**{**TINY, **overrides})).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name in ("cls_token", "reg_token", "dist_token", "pos_embed"):
                parameter.normal_(0, 1)
    return model


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("variant", VARIANTS)
def test_protected_tokens_are_kept_sizes_sum_to_patches_and_sources_partition(variant: str) -> None:
    model = vitkit.merge_tokens(tiny(**VARIANTS[variant]), 10)
    prefix, patches = model.num_prefix_tokens, model.config.num_patches
    with torch.no_grad():
        run = model.forward_intermediates(images(), return_attention=True, output_fmt="NLC")
    assert [s.shape[1] for s in run.sources] == [prefix + patches - 10 * i for i in range(4)]
    for source in run.sources:
        # the prefix tokens hold themselves alone, and nothing else holds them
        assert torch.equal(source[:, :prefix, :prefix], torch.eye(prefix).expand(2, -1, -1))
        assert source[:, prefix:, :prefix].sum() == 0 and source[:, :prefix, prefix:].sum() == 0
        # every patch is held by exactly one token, and the sizes add up to the patch count
        assert torch.equal(source.sum(dim=1), torch.ones(2, prefix + patches))
        assert torch.equal(source[:, prefix:].sum(dim=(1, 2)), torch.full((2,), float(patches)))
    assert run.features.shape[1] == prefix + patches - 40
    assert all(y.shape == (2, patches, 32) for y in run.intermediates)  # back on the full grid


@pytest.mark.parametrize("variant", VARIANTS)
def test_r_zero_is_the_plain_model_and_undoes_merging(variant: str) -> None:
    model = tiny(**VARIANTS[variant])
    with torch.no_grad():
        plain = model(images())
        merged = vitkit.merge_tokens(model, 6)(images())
        undone = vitkit.merge_tokens(model, 0)(images())
    assert not torch.allclose(plain, merged, atol=1e-4)
    assert torch.equal(plain, undone)
    assert model.config.merge_tokens == 0 and model.merge_schedule == []


def test_merged_forward_features_equals_the_intermediates_features() -> None:
    model = vitkit.merge_tokens(tiny(reg_tokens=1), [4, 0, 8, 2])
    with torch.no_grad():
        torch.testing.assert_close(model.forward_features(images()), model.forward_intermediates(images()).features)


def test_merging_is_recorded_in_the_model_file_not_in_the_weights(tmp_path) -> None:
    model = tiny()
    with torch.no_grad():
        plain = model(images())
    path = vitkit.save_model(vitkit.merge_tokens(model, 5, "decreasing"), tmp_path / "merged")
    loaded = vitkit.load_model(path).eval()
    assert loaded.merge_schedule == model.merge_schedule == [10, 6, 3, 0]
    assert set(loaded.state_dict()) == set(tiny().state_dict())
    with torch.no_grad():
        torch.testing.assert_close(loaded(images()), model(images()))
        torch.testing.assert_close(vitkit.load_model(path, merge_tokens=0)(images()), plain)


@pytest.mark.parametrize(
    ("r", "message"),
    [
        (40, r"^merge_tokens in the arguments asks the first block to merge 40 tokens, but at most 32 of its 65"),
        (-1, r"^merge_tokens in the arguments is out of range"),
        ([1, 2], r"^merge_tokens in the arguments lists 2 blocks, but the model has 4"),
    ],
)
def test_bad_r_is_refused_in_one_line(r: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        vitkit.merge_tokens(tiny(), r)
    assert "\n" not in str(refused.value)


def test_an_attention_bias_for_a_merging_model_is_refused_not_ignored() -> None:
    model = tiny()
    bias = torch.zeros(65, 65)
    with torch.no_grad():
        model.forward_features(images(), attn_bias=bias)  # the plain model takes it
        vitkit.merge_tokens(model, 4)
        for forward in (model.forward_features, model.forward_intermediates):
            with pytest.raises(ValueError, match=r"^attn_bias covers the tokens before merging: .*merge_tokens\(model, 0\)"):
                forward(images(), attn_bias=bias)


def test_timm_export_of_a_merged_model_is_refused_in_one_line() -> None:
    model = vitkit.merge_tokens(tiny(), 4)
    with pytest.raises(vitkit.VitkitError, match="token merging") as refused:
        vitkit.to_timm_state_dict(model)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("r", [6, [12, 0, 8, 3]])
def test_flops_of_a_merged_model_count_each_block_on_its_tokens(r: Any) -> None:
    model = vitkit.merge_tokens(tiny(reg_tokens=1, attn_impl="explicit"), r)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(images(1))
    assert vit_flops(model.config) == counter.get_total_flops()
    assert vit_flops(model.config) < vit_flops(model.config.replace(merge_tokens=0))


def test_a_pruned_model_with_a_layer_without_heads_merges() -> None:
    model = tiny()
    prune_heads(model, {0: [0, 1], 1: [0, 1, 2, 3]})
    vitkit.merge_tokens(model, 8)
    with torch.no_grad():
        run = model.forward_intermediates(images(), return_attention=True)
    assert run.attentions[1].shape[1] == 0 and run.features.shape[1] == 65 - 32
    assert torch.isfinite(model.forward_head(run.features)).all()
