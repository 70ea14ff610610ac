"""Maps of a model that merges tokens (ToMe): every method goes back to the patches through the
source matrix, the maps stay on the full patch grid, the put-back attention keeps each row's
mass and each group of patches its merged weight, a two-patch merge's attention and gradients are
put back as worked out by hand, and the faithfulness report and the explorer run on a merged model."""

from __future__ import annotations

import pytest
import torch

import vitkit
from vitkit.explain import (
    METHODS,
    capture_attention,
    chefer_relevance,
    explain,
    explorer_html,
    faithfulness,
    grad_rollout,
    model_head_stats,
    patch_maps,
)
from vitkit.layers.token_merging import unmerge_attention, unmerge_gradient

VARIANTS = {"class": {}, "registers_avg": {"reg_tokens": 2, "global_pool": "avg"}, "distilled": {"distilled": True}}


def tiny(**overrides) -> vitkit.VisionTransformer:
    torch.manual_seed(0)
    config = dict(img_size=32, patch_size=4, num_classes=4, embed_dim=32, depth=3, num_heads=2, mlp_ratio=2.0,
                  attn_impl="explicit")
    model = vitkit.VisionTransformer(**{**config, **overrides}).eval()
    with torch.no_grad():
        model.pos_embed.normal_(0, 1)
    return model


def images(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("method", METHODS)
def test_maps_of_a_merged_model_are_on_the_full_grid(variant: str, method: str) -> None:
    plain = explain(tiny(**VARIANTS[variant]), images(), method)
    merged = explain(vitkit.merge_tokens(tiny(**VARIANTS[variant]), 12), images(), method)
    assert merged.shape == plain.shape and torch.isfinite(merged).all()
    assert not torch.allclose(merged, plain)


@pytest.mark.parametrize("variant", VARIANTS)
def test_put_back_attention_rows_sum_as_unmerged_ones_and_groups_keep_their_weight(variant: str) -> None:
    model = vitkit.merge_tokens(tiny(**VARIANTS[variant]), 12)
    tokens = model.config.num_tokens
    capture = capture_attention(model, images(), with_gradients=True)
    for attention in capture.attentions:
        assert attention.shape[-2:] == (tokens, tokens)
        torch.testing.assert_close(attention.sum(-1), torch.ones_like(attention.sum(-1)))
    with torch.no_grad():
        run = model.forward_intermediates(images(), return_attention=True)
    for merged, source in zip(run.attentions[1:], run.sources[1:]):  # blocks after a merge
        holder = source.argmax(dim=1)[:, None, :, None].expand(-1, merged.shape[1], -1, merged.shape[-1])
        groups = source.transpose(1, 2)[:, None]  # [B, 1, N0, N]: which merged token holds each patch
        # the weight an original token puts on a group of patches is its holder's on the merged token
        back = unmerge_attention(merged, source)
        torch.testing.assert_close(back @ groups, merged.gather(2, holder), atol=1e-6, rtol=0)
        # attention x gradient over a group is the merged token's (what the gradient methods weigh)
        gradient = torch.randn_like(merged)
        product = back * unmerge_gradient(gradient, source)
        torch.testing.assert_close(product @ groups, (merged * gradient).gather(2, holder), atol=1e-6, rtol=1e-5)


def on_patches(merged: torch.Tensor, holder: torch.Tensor) -> torch.Tensor:
    """``[B, H, N, N]`` entries over merged tokens to ``[B, H, N0, N0]``: entry ``(i, j)`` is that of
    the tokens holding patches ``i`` and ``j`` (``holder`` ``[B, N0]``)."""
    heads, tokens, patches = merged.shape[1], merged.shape[-1], holder.shape[1]
    rows = merged.gather(2, holder[:, None, :, None].expand(-1, heads, -1, tokens))
    return rows.gather(3, holder[:, None, None, :].expand(-1, heads, patches, -1))


def test_gradient_maps_of_a_two_patch_merge_copy_the_gradient_and_halve_the_attention() -> None:
    """One pair merged in the first block: in the later blocks a patch's attention row is its
    holder's with the merged key's weight halved between its two patches, its gradient row the
    holder's with the merged key's entry copied to both, so that A * G over the pair is the merged
    token's; the gradient maps are those of these hand-made tensors."""
    model = vitkit.merge_tokens(tiny(), [1, 0, 0])
    capture = capture_attention(model, images(), with_gradients=True)
    run = model.forward_intermediates(images().requires_grad_(True), output_fmt="NLC", return_attention=True)
    assert [int(source.sum(dim=-1).max()) for source in run.sources] == [1, 2, 2]
    selected = model.forward_head(run.features).gather(1, capture.targets[:, None]).sum()
    attentions, gradients = [], []
    for attention, gradient, source in zip(run.attentions, torch.autograd.grad(selected, run.attentions), run.sources):
        holder = source.argmax(dim=1)
        size = source.sum(dim=-1).gather(1, holder)  # [B, N0]: patches in each patch's holder
        attentions.append(on_patches(attention.detach(), holder) / size[:, None, None, :])
        gradients.append(on_patches(gradient, holder))
    for got, expected in zip(capture.attentions + capture.gradients, attentions + gradients):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)
    prefix = model.num_prefix_tokens
    torch.testing.assert_close(patch_maps(capture, "grad_rollout"), grad_rollout(attentions, gradients, 0.0, prefix, "token"))
    torch.testing.assert_close(patch_maps(capture, "chefer"), chefer_relevance(attentions, gradients, prefix, "token"))


def test_faithfulness_and_head_statistics_run_on_a_merged_model() -> None:
    model = vitkit.merge_tokens(tiny(), 12)
    methods = ("rollout", "chefer", "lrp", "random")
    report = faithfulness(model, images(2), methods=methods, steps=4, batch_size=2, sanity=False)
    assert [r.name for r in report.results] == list(methods)
    assert all(torch.isfinite(r.scores["deletion"]).all() for r in report.results)
    stats = model_head_stats(model, [images()])
    assert stats.entropy.shape[0] == 3


def test_the_explorer_runs_on_a_merged_model() -> None:
    page = explorer_html(vitkit.merge_tokens(tiny(), 12), images(1))
    assert "vitkit attention explorer" in str(page)
